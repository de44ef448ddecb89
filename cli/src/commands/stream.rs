//! `cellog stream`: create, list, inspect and delete streams.

use cellog_client::proto as v1;
use clap::{Subcommand, ValueEnum};

use crate::Connect;
use crate::commands::client;
use crate::table::Table;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Retention {
    /// Keep messages until a limit removes them.
    Limits,
    /// Keep messages until every consumer is done with them.
    Interest,
    /// Each message is done once one consumer is done with it.
    WorkQueue,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Discard {
    /// At a limit, remove the oldest.
    Old,
    /// At a limit, refuse the new message.
    New,
}

#[derive(Subcommand)]
pub enum StreamCommand {
    /// Create a stream.
    Add {
        /// The stream's name.
        name: String,
        /// Subjects the stream claims (wildcards `*` and `>`), comma-separated.
        #[arg(long, required = true, value_delimiter = ',')]
        subjects: Vec<String>,
        /// Partitions.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        #[arg(long, value_enum, default_value = "limits")]
        retention: Retention,
        #[arg(long, value_enum, default_value = "old")]
        discard: Discard,
        /// Remove messages older than this many milliseconds.
        #[arg(long)]
        max_age_ms: Option<u64>,
        /// Keep at most this many messages.
        #[arg(long)]
        max_msgs: Option<u64>,
        /// Keep at most this many bytes.
        #[arg(long)]
        max_bytes: Option<u64>,
        /// Keep at most this many messages per subject.
        #[arg(long)]
        max_msgs_per_subject: Option<u64>,
        /// Largest payload accepted.
        #[arg(long)]
        max_payload: Option<u32>,
        /// Deduplicate message ids over this many milliseconds (at least).
        #[arg(long)]
        duplicate_window_ms: Option<u64>,
        /// Where messages go after exhausting their deliveries.
        #[arg(long)]
        dead_letter: Option<String>,
        #[command(flatten)]
        connect: Connect,
    },
    /// List streams.
    Ls {
        #[command(flatten)]
        connect: Connect,
    },
    /// Show a stream.
    Info {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Delete a stream and everything in it.
    Rm {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
}

pub async fn run(command: StreamCommand) -> anyhow::Result<()> {
    match command {
        StreamCommand::Add {
            name,
            subjects,
            partitions,
            retention,
            discard,
            max_age_ms,
            max_msgs,
            max_bytes,
            max_msgs_per_subject,
            max_payload,
            duplicate_window_ms,
            dead_letter,
            connect,
        } => {
            let config = v1::StreamConfig {
                subjects,
                partitions,
                retention: match retention {
                    Retention::Limits => v1::RetentionPolicy::RetentionLimits,
                    Retention::Interest => v1::RetentionPolicy::RetentionInterest,
                    Retention::WorkQueue => v1::RetentionPolicy::RetentionWorkQueue,
                } as i32,
                discard: match discard {
                    Discard::Old => v1::DiscardPolicy::DiscardOld,
                    Discard::New => v1::DiscardPolicy::DiscardNew,
                } as i32,
                max_age_ms,
                max_messages: max_msgs,
                max_bytes,
                max_messages_per_subject: max_msgs_per_subject,
                max_bytes_per_subject: None,
                max_payload_bytes: max_payload,
                duplicate_window_ms,
                rate_limit: None,
                dead_letter_stream: dead_letter,
            };
            let created = client(&connect)?.create_stream(&name, config).await?;
            println!("stream {name} {}", if created { "created" } else { "already exists with this config" });
        }
        StreamCommand::Ls { connect } => {
            let streams = client(&connect)?.list_streams().await?;
            let mut table = Table::new(["stream", "messages", "bytes", "consumers", "subjects"]).right([1, 2, 3]);
            for stream in streams {
                let subjects = stream.config.map(|config| config.subjects.join(",")).unwrap_or_default();
                let counts = [stream.messages, stream.bytes, stream.consumers.len() as u64].map(|n| n.to_string());
                let [messages, bytes, consumers] = counts;
                table.row([stream.name, messages, bytes, consumers, subjects]);
            }
            table.print(0);
        }
        StreamCommand::Info { name, connect } => {
            let info = client(&connect)?.stream_info(&name).await?;
            print_stream(&info);
        }
        StreamCommand::Rm { name, connect } => {
            client(&connect)?.delete_stream(&name).await?;
            println!("stream {name} deleted");
        }
    }
    Ok(())
}

fn print_stream(info: &v1::StreamInfo) {
    println!("stream {}", info.name);
    if let Some(config) = &info.config {
        println!("  subjects     {}", config.subjects.join(", "));
        println!("  partitions   {}", config.partitions);
        println!("  retention    {:?}", v1::RetentionPolicy::try_from(config.retention).ok());
        println!("  discard      {:?}", v1::DiscardPolicy::try_from(config.discard).ok());
        let limit = |value: Option<u64>| value.map_or("none".to_string(), |value| value.to_string());
        println!("  max age ms   {}", limit(config.max_age_ms));
        println!("  max msgs     {}", limit(config.max_messages));
        println!("  max bytes    {}", limit(config.max_bytes));
        println!("  max payload  {}", config.max_payload_bytes.unwrap_or_default());
        if let Some(dead_letter) = &config.dead_letter_stream {
            println!("  dead letter  {dead_letter}");
        }
    }
    println!("  messages     {}", info.messages);
    println!("  bytes        {}", info.bytes);
    println!("  subjects     {} distinct", info.subjects);
    println!("  consumers    {}", info.consumers.join(", "));
    for partition in &info.partitions {
        println!(
            "  partition {:<3} seq {}..={} ({} messages, {} bytes)",
            partition.partition, partition.low_watermark, partition.high_watermark, partition.messages, partition.bytes
        );
    }
    for peer in &info.peers {
        println!("  peer {} received {:?}", peer.name, peer.received);
    }
}
