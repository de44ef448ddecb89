//! The client commands: streams, consumers, publish, subscribe, transactions, cluster.

use std::io::Read;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use cellog_net::proto as v1;
use cellog_net::{Client, ClientOptions};
use clap::{Subcommand, ValueEnum};

use crate::Connect;

/// A client for `connect`.
pub fn client(connect: &Connect) -> anyhow::Result<Client> {
    let options = ClientOptions { retry_for: Duration::from_secs(connect.timeout), ..ClientOptions::default() };
    Ok(Client::new(connect.server.clone(), options)?)
}

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

pub async fn stream(command: StreamCommand) -> anyhow::Result<()> {
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
            println!("{:<24} {:>10} {:>12} {:>10}  subjects", "stream", "messages", "bytes", "consumers");
            for stream in streams {
                let subjects = stream.config.map(|config| config.subjects.join(",")).unwrap_or_default();
                println!(
                    "{:<24} {:>10} {:>12} {:>10}  {subjects}",
                    stream.name,
                    stream.messages,
                    stream.bytes,
                    stream.consumers.len()
                );
            }
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

#[derive(Subcommand)]
pub enum ConsumerCommand {
    /// Create a durable consumer.
    Add {
        stream: String,
        name: String,
        /// Only subjects matching this filter.
        #[arg(long)]
        filter: Option<String>,
        /// Where to start: all, new, seq:N, or time:MILLIS_SINCE_EPOCH.
        #[arg(long, default_value = "all")]
        deliver: String,
        /// Redeliver a message not acknowledged within this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        ack_wait_ms: u64,
        /// Dead-letter a message after this many deliveries.
        #[arg(long)]
        max_deliver: Option<u32>,
        /// Most deliveries unacknowledged at once.
        #[arg(long, default_value_t = 1000)]
        max_in_flight: u32,
        #[command(flatten)]
        connect: Connect,
    },
    /// Change a consumer's ack wait, max deliver or max in flight (the others stay as they are).
    Update {
        stream: String,
        name: String,
        /// Redeliver a message not acknowledged within this many milliseconds.
        #[arg(long)]
        ack_wait_ms: Option<u64>,
        /// Dead-letter a message after this many deliveries.
        #[arg(long)]
        max_deliver: Option<u32>,
        /// Most deliveries unacknowledged at once.
        #[arg(long)]
        max_in_flight: Option<u32>,
        #[command(flatten)]
        connect: Connect,
    },
    /// List a stream's consumers.
    Ls {
        stream: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Show a consumer.
    Info {
        stream: String,
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Delete a consumer.
    Rm {
        stream: String,
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
}

fn deliver_policy(text: &str) -> anyhow::Result<(v1::DeliverPolicy, u64)> {
    Ok(match text.split_once(':') {
        None if text == "all" => (v1::DeliverPolicy::DeliverAll, 0),
        None if text == "new" => (v1::DeliverPolicy::DeliverNew, 0),
        Some(("seq", seq)) => (v1::DeliverPolicy::DeliverFromSequence, seq.parse().context("--deliver seq:N")?),
        Some(("time", at)) => (v1::DeliverPolicy::DeliverFromTime, at.parse().context("--deliver time:MILLIS")?),
        _ => bail!("--deliver must be all, new, seq:N or time:MILLIS, not {text:?}"),
    })
}

pub async fn consumer(command: ConsumerCommand) -> anyhow::Result<()> {
    match command {
        ConsumerCommand::Add { stream, name, filter, deliver, ack_wait_ms, max_deliver, max_in_flight, connect } => {
            let (policy, deliver_from) = deliver_policy(&deliver)?;
            let config = v1::ConsumerConfig {
                filter_subject: filter,
                deliver_policy: policy as i32,
                deliver_from,
                ack_wait_ms: Some(ack_wait_ms),
                max_deliver,
                max_in_flight: Some(max_in_flight),
            };
            let created = client(&connect)?.create_consumer(&stream, &name, config).await?;
            println!("consumer {name} on {stream} {}", if created { "created" } else { "already exists" });
        }
        ConsumerCommand::Update { stream, name, ack_wait_ms, max_deliver, max_in_flight, connect } => {
            let client = client(&connect)?;
            let mut config = client.consumer_info(&stream, &name).await?.config.unwrap_or_default();
            config.ack_wait_ms = ack_wait_ms.or(config.ack_wait_ms);
            config.max_deliver = max_deliver.or(config.max_deliver);
            config.max_in_flight = max_in_flight.or(config.max_in_flight);
            client.update_consumer(&stream, &name, config).await?;
            println!("consumer {name} on {stream} updated");
        }
        ConsumerCommand::Ls { stream, connect } => {
            let consumers = client(&connect)?.list_consumers(&stream).await?;
            println!("{:<24} {:>10} {:>10} {:>10} {:>14}", "consumer", "lag", "pending", "acked", "oldest unacked");
            for consumer in consumers {
                println!(
                    "{:<24} {:>10} {:>10} {:>10} {:>12}ms",
                    consumer.name, consumer.lag_total, consumer.pending, consumer.acked, consumer.oldest_unacked_age_ms
                );
            }
        }
        ConsumerCommand::Info { stream, name, connect } => {
            let info = client(&connect)?.consumer_info(&stream, &name).await?;
            println!("consumer {} on {}", info.name, info.stream);
            if let Some(config) = &info.config {
                println!("  filter          {}", config.filter_subject.as_deref().unwrap_or("(all)"));
                println!("  ack wait ms     {}", config.ack_wait_ms.unwrap_or_default());
                println!("  max deliver     {:?}", config.max_deliver);
                println!("  max in flight   {}", config.max_in_flight.unwrap_or_default());
            }
            println!("  lag             {} (max {} in one partition)", info.lag_total, info.lag_max);
            println!("  pending         {}", info.pending);
            println!("  delivered       {} ({} redelivered)", info.delivered, info.redelivered);
            println!("  acked           {}", info.acked);
            println!("  dead-lettered   {}", info.dead_lettered);
            println!("  oldest unacked  {} ms", info.oldest_unacked_age_ms);
            for partition in &info.partitions {
                println!(
                    "  partition {:<3} cursor {} ack floor {} lag {} outstanding {}",
                    partition.partition, partition.cursor, partition.ack_floor, partition.lag, partition.outstanding
                );
            }
        }
        ConsumerCommand::Rm { stream, name, connect } => {
            client(&connect)?.delete_consumer(&stream, &name).await?;
            println!("consumer {name} on {stream} deleted");
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum PeerCommand {
    /// Register a peer (a mirror, another cell) of a stream: retention keeps every message it has not received.
    Add {
        stream: String,
        peer: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Record that a peer has received a partition up to a sequence.
    Progress {
        stream: String,
        peer: String,
        partition: u32,
        received_seq: u64,
        #[command(flatten)]
        connect: Connect,
    },
    /// Unregister a peer: retention no longer waits for it.
    Rm {
        stream: String,
        peer: String,
        #[command(flatten)]
        connect: Connect,
    },
}

pub async fn peer(command: PeerCommand) -> anyhow::Result<()> {
    match command {
        PeerCommand::Add { stream, peer, connect } => {
            client(&connect)?.register_peer(&stream, &peer).await?;
            println!("peer {peer} of {stream} registered");
        }
        PeerCommand::Progress { stream, peer, partition, received_seq, connect } => {
            client(&connect)?.peer_progress(&stream, &peer, partition, received_seq).await?;
            println!("peer {peer} of {stream} has partition {partition} up to {received_seq}");
        }
        PeerCommand::Rm { stream, peer, connect } => {
            client(&connect)?.unregister_peer(&stream, &peer).await?;
            println!("peer {peer} of {stream} unregistered");
        }
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum MailCommand {
    /// Seal a payload for other cells (signed by this cell, encrypted for each recipient) and queue it for
    /// delivery; prints the envelope id to ask `cellog mail status` about.
    Send {
        /// Recipient cells, comma-separated.
        #[arg(long = "to", value_delimiter = ',', required = true)]
        to: Vec<String>,
        /// The payload; read from standard input when absent.
        payload: Option<String>,
        /// The envelope id (makes a retry safe: one id is sent once); the node picks one when absent.
        #[arg(long)]
        id: Option<String>,
        /// Wait until every recipient has a final result, printing it.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// One line per recipient of an envelope this cell sent: delivered, denied, no home, failed or pending.
    Status {
        id: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// This cell's inbox, opened: sender, envelope id and payload of each message.
    Read {
        /// The first inbox sequence.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        max: u32,
        #[command(flatten)]
        connect: Connect,
    },
}

fn result_name(result: i32) -> &'static str {
    match v1::DeliveryResult::try_from(result).unwrap_or(v1::DeliveryResult::Unspecified) {
        v1::DeliveryResult::Delivered => "delivered",
        v1::DeliveryResult::Denied => "denied",
        v1::DeliveryResult::NoHome => "no home",
        v1::DeliveryResult::Failed => "failed",
        v1::DeliveryResult::Pending | v1::DeliveryResult::Unspecified => "pending",
    }
}

fn print_delivery(status: &v1::DeliveryStatusResponse) {
    let total = status.recipients.len();
    println!(
        "envelope {}: {} of {total} delivered, {} denied, {} no home, {} failed, {} pending",
        status.envelope_id, status.delivered, status.denied, status.no_home, status.failed, status.pending
    );
    for recipient in &status.recipients {
        let detail = if recipient.detail.is_empty() { String::new() } else { format!(" ({})", recipient.detail) };
        println!(
            "  {:<20} {:<9} attempts={}{detail}",
            recipient.cell,
            result_name(recipient.result),
            recipient.attempts
        );
    }
}

pub async fn mail(command: MailCommand) -> anyhow::Result<()> {
    match command {
        MailCommand::Send { to, payload, id, wait, connect } => {
            let payload = match payload {
                Some(text) => Bytes::from(text),
                None => {
                    let mut body = Vec::new();
                    std::io::stdin().read_to_end(&mut body).context("reading the payload from standard input")?;
                    Bytes::from(body)
                }
            };
            let client = client(&connect)?;
            let sent = client.send_sealed(&to, payload, id.as_deref()).await?;
            let again = if sent.duplicate { " (already sent under this id)" } else { "" };
            println!(
                "envelope {} ({} bytes) queued for {}{again}",
                sent.envelope_id,
                sent.envelope_bytes,
                to.join(", ")
            );
            if wait {
                loop {
                    let status = client.delivery_status(&sent.envelope_id).await?;
                    if status.pending == 0 {
                        print_delivery(&status);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        MailCommand::Status { id, connect } => print_delivery(&client(&connect)?.delivery_status(&id).await?),
        MailCommand::Read { from, max, connect } => {
            for mail in client(&connect)?.read_mail(from, max).await? {
                println!(
                    "#{} from {} ({}) envelope {}: {}",
                    mail.seq,
                    mail.sender,
                    mail.sender_fingerprint,
                    mail.envelope_id,
                    String::from_utf8_lossy(&mail.payload)
                );
            }
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct PubArgs {
    /// The subject.
    subject: String,
    /// The body; read from standard input when absent.
    body: Option<String>,
    /// Message id (deduplicates retries); with --count, a suffix -N is added.
    #[arg(long)]
    id: Option<String>,
    /// Partitioning key.
    #[arg(long)]
    key: Option<String>,
    /// A header KEY=VALUE (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// Publish the body this many times.
    #[arg(long, default_value_t = 1)]
    count: u32,
    #[command(flatten)]
    connect: Connect,
}

pub async fn publish(args: PubArgs) -> anyhow::Result<()> {
    let body = match args.body {
        Some(body) => Bytes::from(body),
        None => {
            let mut body = Vec::new();
            std::io::stdin().read_to_end(&mut body).context("reading the body from standard input")?;
            Bytes::from(body)
        }
    };
    let mut headers = std::collections::BTreeMap::new();
    for header in &args.headers {
        let (key, value) = header.split_once('=').with_context(|| format!("header {header:?} is not KEY=VALUE"))?;
        headers.insert(key.to_string(), value.to_string());
    }
    let client = client(&args.connect)?;
    for n in 1..=args.count {
        let msg_id = args.id.as_ref().map(|id| if args.count > 1 { format!("{id}-{n}") } else { id.clone() });
        let request = v1::PublishRequest {
            subject: args.subject.clone(),
            payload: body.clone(),
            key: args.key.clone().map(Bytes::from),
            msg_id,
            headers: headers.clone(),
            ..v1::PublishRequest::default()
        };
        let ack = client.publish(request).await?;
        println!(
            "published to {} partition {} seq {}{}",
            ack.stream,
            ack.partition,
            ack.seq,
            if ack.duplicate { " (duplicate of an earlier message id)" } else { "" }
        );
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct SubArgs {
    stream: String,
    consumer: String,
    /// Stop after this many messages (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Member name (work queues).
    #[arg(long, default_value = "")]
    member: String,
    /// Most messages unacknowledged at once.
    #[arg(long, default_value_t = 256)]
    window: u32,
    /// Do not acknowledge (messages come back after the ack wait).
    #[arg(long)]
    no_ack: bool,
    #[command(flatten)]
    connect: Connect,
}

pub async fn subscribe(args: SubArgs) -> anyhow::Result<()> {
    let client = client(&args.connect)?;
    let mut deliveries = client.subscribe(&args.stream, &args.consumer, &args.member, args.window).await?;
    let mut seen = 0u64;
    while let Some(delivery) = deliveries.message().await? {
        let Some(message) = delivery.message else { continue };
        let body = String::from_utf8_lossy(&message.payload);
        println!("[{} p{} #{} x{}] {}", message.subject, message.partition, message.seq, delivery.delivery_count, body);
        if !args.no_ack {
            let ack = v1::AckItem { partition: message.partition, seq: message.seq, ..v1::AckItem::default() };
            client.ack(&args.stream, &args.consumer, vec![ack]).await?;
        }
        seen += 1;
        if args.count > 0 && seen >= args.count {
            break;
        }
    }
    Ok(())
}

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

pub async fn txn(command: TxnCommand) -> anyhow::Result<()> {
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

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// The cell as the first reachable node sees it.
    Status {
        #[command(flatten)]
        connect: Connect,
    },
    /// Add a node as a learner (it catches up, then can be promoted).
    Add {
        node_id: u64,
        raft_addr: String,
        client_addr: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Make a learner a voter.
    Promote {
        node_id: u64,
        #[command(flatten)]
        connect: Connect,
    },
    /// Remove a node from the cell.
    Remove {
        node_id: u64,
        #[command(flatten)]
        connect: Connect,
    },
}

fn print_status(status: &v1::ClusterStatusResponse) {
    println!(
        "node {} is {} in term {}; leader {}{}",
        status.node_id,
        status.state,
        status.term,
        status.leader_id.map_or("unknown".to_string(), |id| format!("node {id} at {}", status.leader_addr)),
        if status.repairing { " (repairing: catching up lost entries)" } else { "" }
    );
    println!(
        "  log index {:?}, applied {:?}, state digest {}",
        status.last_log_index, status.applied_index, status.state_digest
    );
    println!("  {:<6} {:<8} {:<22} {:<22} {:>8}", "id", "role", "client", "raft", "matched");
    for node in &status.nodes {
        println!(
            "  {:<6} {:<8} {:<22} {:<22} {:>8}",
            node.id,
            if node.voter { "voter" } else { "learner" },
            node.client_addr,
            node.raft_addr,
            node.matched_index.map_or("-".to_string(), |index| index.to_string())
        );
    }
}

pub async fn cluster(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Status { connect } => {
            // Status is about one node, so ask each in turn until one answers.
            let mut last_error = anyhow::anyhow!("no node address given");
            for server in &connect.server {
                let one = Connect { server: vec![server.clone()], timeout: connect.timeout };
                match client(&one)?.cluster_status().await {
                    Ok(status) => {
                        print_status(&status);
                        return Ok(());
                    }
                    Err(error) => last_error = anyhow::Error::from(error).context(format!("asking {server}")),
                }
            }
            return Err(last_error);
        }
        ClusterCommand::Add { node_id, raft_addr, client_addr, connect } => {
            print_status(&client(&connect)?.add_learner(node_id, &raft_addr, &client_addr).await?);
        }
        ClusterCommand::Promote { node_id, connect } => {
            print_status(&client(&connect)?.promote(node_id).await?);
        }
        ClusterCommand::Remove { node_id, connect } => {
            print_status(&client(&connect)?.remove_node(node_id).await?);
        }
    }
    Ok(())
}

/// Where `cellog keys` looks: the node's data directory.
#[derive(clap::Args)]
pub struct KeysDir {
    /// The node's data directory.
    #[arg(long, env = "CELLOG_DATA_DIR", default_value = "cellog-data")]
    data_dir: std::path::PathBuf,
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Print this cell's fingerprint and public key (to import on other cells).
    Show {
        #[command(flatten)]
        dir: KeysDir,
    },
    /// Add another cell's public key (armored or binary) to the keyring.
    Import {
        /// The key file.
        file: std::path::PathBuf,
        #[command(flatten)]
        dir: KeysDir,
    },
    /// List the keyring: each known cell and its key's fingerprint.
    List {
        #[command(flatten)]
        dir: KeysDir,
    },
}

pub fn keys(command: KeysCommand) -> anyhow::Result<()> {
    use cellog_envelope::{CellKey, Keyring};
    let own = |dir: &KeysDir| -> anyhow::Result<CellKey> {
        CellKey::load(&dir.data_dir)?.with_context(|| {
            format!(
                "no cell key in {} yet; a node makes it when it first starts there",
                dir.data_dir.join("keys").display()
            )
        })
    };
    match command {
        KeysCommand::Show { dir } => {
            let key = own(&dir)?;
            println!("cell {} fingerprint {}", key.cell(), key.fingerprint());
            print!("{}", key.public_armored());
        }
        KeysCommand::Import { file, dir } => {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let own = CellKey::load(&dir.data_dir)?;
            let mut keyring = Keyring::open(&dir.data_dir)?;
            let peer = keyring.import(&bytes, own.as_ref())?;
            println!("imported cell {} fingerprint {}", peer.cell, peer.fingerprint);
        }
        KeysCommand::List { dir } => {
            let keyring = Keyring::open(&dir.data_dir)?;
            for peer in keyring.list() {
                println!("{:<24} {}", peer.cell, peer.fingerprint);
            }
        }
    }
    Ok(())
}
