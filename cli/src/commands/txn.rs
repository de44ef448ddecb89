//! `cellog txn`: publish several messages atomically.

use anyhow::Context;
use bytes::Bytes;
use cellog_client::proto as v1;
use clap::Subcommand;

use crate::Connect;
use crate::commands::client;

#[derive(Subcommand)]
pub enum TxnCommand {
    /// Publish SUBJECT=BODY pairs atomically as transactional producer ID: init, begin, publish, commit.
    Run {
        /// The transactional id (initializing it fences older instances).
        transactional_id: String,
        /// Messages as SUBJECT=BODY.
        #[arg(required = true)]
        messages: Vec<String>,
        /// Abort instead of committing (to see that nothing becomes visible).
        #[arg(long)]
        abort: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Register a transactional producer; prints its id and epoch.
    Init {
        transactional_id: String,
        /// Abort transactions left open longer than this.
        #[arg(long, default_value_t = 60_000)]
        timeout_ms: u64,
        #[command(flatten)]
        connect: Connect,
    },
    /// Open a transaction.
    Begin {
        producer_id: u64,
        epoch: u32,
        #[command(flatten)]
        connect: Connect,
    },
    /// Stage a message into the open transaction.
    Pub {
        producer_id: u64,
        epoch: u32,
        subject: String,
        body: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Validate the open transaction.
    Prepare {
        producer_id: u64,
        epoch: u32,
        #[command(flatten)]
        connect: Connect,
    },
    /// Make the staged messages visible.
    Commit {
        producer_id: u64,
        epoch: u32,
        #[command(flatten)]
        connect: Connect,
    },
    /// Drop the staged messages.
    Abort {
        producer_id: u64,
        epoch: u32,
        #[command(flatten)]
        connect: Connect,
    },
}

fn print_end(response: &v1::TransactionResponse, what: &str) {
    for ack in &response.messages {
        println!("  {} partition {} seq {}", ack.stream, ack.partition, ack.seq);
    }
    if let Some(next) = &response.next {
        println!("{what}; next transaction uses producer {} epoch {}", next.producer_id, next.epoch);
    }
}

pub async fn run(command: TxnCommand) -> anyhow::Result<()> {
    let producer = |producer_id, epoch| v1::ProducerRef { producer_id, epoch };
    match command {
        TxnCommand::Run { transactional_id, messages, abort, connect } => {
            let client = client(&connect)?;
            let producer = client.init_producer(&transactional_id, 0).await?;
            client.begin(producer).await?;
            for message in &messages {
                let (subject, body) =
                    message.split_once('=').with_context(|| format!("{message:?} is not SUBJECT=BODY"))?;
                let request = v1::PublishRequest {
                    subject: subject.to_string(),
                    payload: Bytes::from(body.to_string()),
                    transaction: Some(producer),
                    ..v1::PublishRequest::default()
                };
                client.publish(request).await?;
            }
            if abort {
                print_end(&client.abort(producer).await?, "aborted");
            } else {
                client.prepare(producer).await?;
                print_end(&client.commit(producer).await?, "committed");
            }
        }
        TxnCommand::Init { transactional_id, timeout_ms, connect } => {
            let producer = client(&connect)?.init_producer(&transactional_id, timeout_ms).await?;
            println!("producer {} epoch {}", producer.producer_id, producer.epoch);
        }
        TxnCommand::Begin { producer_id, epoch, connect } => {
            client(&connect)?.begin(producer(producer_id, epoch)).await?;
            println!("transaction open");
        }
        TxnCommand::Pub { producer_id, epoch, subject, body, connect } => {
            let request = v1::PublishRequest {
                subject,
                payload: Bytes::from(body),
                transaction: Some(producer(producer_id, epoch)),
                ..v1::PublishRequest::default()
            };
            let ack = client(&connect)?.publish(request).await?;
            println!("staged as message {}", ack.staged_index.unwrap_or_default());
        }
        TxnCommand::Prepare { producer_id, epoch, connect } => {
            client(&connect)?.prepare(producer(producer_id, epoch)).await?;
            println!("prepared");
        }
        TxnCommand::Commit { producer_id, epoch, connect } => {
            print_end(&client(&connect)?.commit(producer(producer_id, epoch)).await?, "committed");
        }
        TxnCommand::Abort { producer_id, epoch, connect } => {
            print_end(&client(&connect)?.abort(producer(producer_id, epoch)).await?, "aborted");
        }
    }
    Ok(())
}
