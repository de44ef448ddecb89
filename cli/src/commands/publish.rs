//! `cellog pub` and `cellog sub`: publish messages, and receive them through a durable consumer.

use std::io::Read;

use anyhow::Context;
use bytes::Bytes;
use cellog_client::ClientError;
use cellog_client::proto as v1;

use crate::Connect;
use crate::commands::route::Route;

#[derive(clap::Args)]
pub struct PubArgs {
    /// The subject.
    subject: String,
    /// The body; read from standard input when absent.
    body: Option<String>,
    /// Message id (deduplicates retries); with --count, a suffix -N is added.
    #[arg(long)]
    id: Option<String>,
    /// Partitioning key: messages with the same key go to the same partition (`--key` is the client certificate's
    /// key).
    #[arg(long)]
    partition_key: Option<String>,
    /// A header KEY=VALUE (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// Publish the body this many times.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// The stream that claims the subject: the publish goes to the cell the directory places it on.
    #[arg(long)]
    stream: Option<String>,
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
    let route = Route::new(&args.connect, args.stream.as_deref()).await?;
    for n in 1..=args.count {
        let msg_id = args.id.as_ref().map(|id| if args.count > 1 { format!("{id}-{n}") } else { id.clone() });
        let request = v1::PublishRequest {
            subject: args.subject.clone(),
            payload: body.clone(),
            key: args.partition_key.clone().map(Bytes::from),
            msg_id,
            headers: headers.clone(),
            ..v1::PublishRequest::default()
        };
        let ack = route
            .call(|client| {
                let request = request.clone();
                async move { client.publish(request).await }
            })
            .await
            .map_err(|error| {
                let reason = error.downcast_ref::<ClientError>().and_then(ClientError::reason);
                match (&args.stream, &args.connect.to_cell) {
                    (None, None) if reason == Some("NO_STREAM_FOR_SUBJECT") => anyhow::anyhow!(
                        "{error}\na stream placed on another cell is reached with --stream STREAM (or --cell CELL)"
                    ),
                    _ => error,
                }
            })?;
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
    // A subscription is one call, kept open: the cell the stream is on when it starts serves it.
    let route = Route::new(&args.connect, Some(&args.stream)).await?;
    let client = route.client().await?;
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
