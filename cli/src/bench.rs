//! `cellog bench`: the anchor workloads (pipelined publish, synchronous publish, consume with ack) and push latency,
//! with a progress bar, a result table, and one machine-readable line at the end.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use cellog_client::proto as v1;
use clap::Subcommand;
use tokio::time::Instant;

use crate::bench_kit::{Report, Workload, progress, recreate, report_error, request};
use crate::commands::client;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Pipelined publish with message ids, WINDOW unacknowledged at once [default count: 200000].
    Pub {
        #[command(flatten)]
        workload: Workload,
        /// Messages in flight.
        #[arg(long, default_value_t = 256)]
        window: usize,
    },
    /// One publish at a time, each waiting for its ack [default count: 5000].
    Sync {
        #[command(flatten)]
        workload: Workload,
    },
    /// Consume the stream through a new durable consumer: fetch FETCH at a time, ack each [default count: 200000].
    /// The acks of a fetch go without waiting for their answers before the next fetch (up to 3 fetches' acks
    /// unanswered, the consumer allowing that many deliveries in flight); every answer is checked before the end.
    Consume {
        #[command(flatten)]
        workload: Workload,
        /// Messages per fetch.
        #[arg(long, default_value_t = 256)]
        fetch: u32,
    },
    /// Publish-to-delivery latency of a subscription, one message at a time, beside SUBSCRIPTIONS idle ones (whose
    /// filter matches nothing published); first, the log entries a second the cell writes while they idle
    /// [default count: 2000].
    Latency {
        #[command(flatten)]
        workload: Workload,
        /// Idle subscriptions open meanwhile, each on a consumer of its own.
        #[arg(long, default_value_t = 1000)]
        subscriptions: usize,
        /// Seconds to count the cell's log entries while the subscriptions idle.
        #[arg(long, default_value_t = 10)]
        idle_seconds: u64,
        /// Other messages published a second meanwhile (pipelined, to another subject): 0 measures an idle cell.
        #[arg(long, default_value_t = 0)]
        busy_rate: u64,
    },
    /// Live tails over HTTP (server-sent events): the node's memory per tail with TAILS held open, then the latency
    /// from publishing a message to its event on a tail, one message at a time [default count: 2000].
    Tail(crate::tail_bench::TailArgs),
    /// A consumer group of MEMBERS consuming a stream of PARTITIONS takes one more member: the time until it is
    /// settled again and how much consumption paused, for an eager strategy (range) and for cooperative sticky.
    Rebalance(crate::rebalance::RebalanceArgs),
    /// An R3 cell of node processes of this program on loopback, soaked: a steady load at 80% of its measured maximum
    /// while a node is killed and restarted every minute (the leader every third), then every acknowledged message
    /// checked; throughput, each node's memory, and errors by kind over the run.
    Soak(crate::soak::SoakArgs),
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    let report = match command {
        BenchCommand::Pub { workload, window } => publish(workload, window).await?,
        BenchCommand::Sync { workload } => sync(workload).await?,
        BenchCommand::Consume { workload, fetch } => consume(workload, fetch).await?,
        BenchCommand::Latency { workload, subscriptions, idle_seconds, busy_rate } => {
            latency(workload, subscriptions, idle_seconds, busy_rate).await?
        }
        BenchCommand::Tail(args) => crate::tail_bench::run(args).await?,
        BenchCommand::Soak(args) => return crate::soak::run(args).await,
        BenchCommand::Rebalance(args) => return crate::rebalance::run(args).await,
    };
    let errors = report.errors;
    report.print();
    if errors > 0 {
        bail!("{errors} messages failed");
    }
    Ok(())
}

async fn publish(workload: Workload, window: usize) -> anyhow::Result<Report> {
    let count = workload.count.unwrap_or(200_000);
    let client = client(&workload.connect)?;
    recreate(&client, &workload).await?;
    let payload = Bytes::from(vec![b'x'; workload.size]);
    let bar = progress(count, "pub");
    let (mut latencies, mut errors, mut first_error) = (Vec::with_capacity(count as usize), 0, None);
    let started = Instant::now();
    let chunk = 20_000u64;
    let mut next = 0u64;
    while next < count {
        let end = (next + chunk).min(count);
        let requests = (next..end).map(|index| request(&workload, &payload, index)).collect();
        for result in client.publish_batch(requests, window).await {
            latencies.push(result.latency);
            if let Err(error) = result.result {
                errors += 1;
                first_error.get_or_insert(error);
            }
        }
        bar.set_position(end);
        next = end;
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    report_error(first_error);
    Ok(Report { what: "pub", messages: count, bytes: count * workload.size as u64, elapsed, latencies, errors })
}

async fn sync(workload: Workload) -> anyhow::Result<Report> {
    let count = workload.count.unwrap_or(5_000);
    let client = client(&workload.connect)?;
    recreate(&client, &workload).await?;
    let payload = Bytes::from(vec![b'x'; workload.size]);
    let bar = progress(count, "sync");
    let (mut latencies, mut errors, mut first_error) = (Vec::with_capacity(count as usize), 0, None);
    let started = Instant::now();
    for index in 0..count {
        let sent = Instant::now();
        if let Err(error) = client.publish(request(&workload, &payload, index)).await {
            errors += 1;
            first_error.get_or_insert(error);
        }
        latencies.push(sent.elapsed());
        bar.inc(1);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    report_error(first_error);
    Ok(Report { what: "sync", messages: count, bytes: count * workload.size as u64, elapsed, latencies, errors })
}

async fn consume(workload: Workload, fetch: u32) -> anyhow::Result<Report> {
    let client = client(&workload.connect)?;
    let info = client.stream_info(&workload.stream).await.context("the stream to consume (run `bench pub` first)")?;
    let count = workload.count.unwrap_or(200_000).min(info.messages);
    if count == 0 {
        bail!("stream {} is empty; run `cellog bench pub` first", workload.stream);
    }
    let consumer = "bench-consumer";
    match client.delete_consumer(&workload.stream, consumer).await {
        Ok(()) => {}
        Err(error) if error.reason() == Some("CONSUMER_NOT_FOUND") => {}
        Err(error) => return Err(error).context("deleting the benchmark consumer"),
    }
    let fetch = fetch.max(1);
    let max_in_flight = fetch.saturating_mul(ACK_CALLS_AHEAD as u32 + 1);
    let config = v1::ConsumerConfig { max_in_flight: Some(max_in_flight), ..v1::ConsumerConfig::default() };
    client.create_consumer(&workload.stream, consumer, config).await?;
    let bar = progress(count, "consume");
    let (mut latencies, mut received, mut bytes, mut errors) = (Vec::new(), 0u64, 0u64, 0u64);
    let mut unanswered = std::collections::VecDeque::new();
    let started = Instant::now();
    while received < count {
        let round = Instant::now();
        let deliveries = client.fetch(&workload.stream, consumer, "bench", fetch).await?;
        if deliveries.is_empty() {
            bail!("the consumer ran dry after {received} of {count} messages");
        }
        let acks: Vec<v1::AckItem> = deliveries
            .iter()
            .filter_map(|delivery| delivery.message.as_ref())
            .map(|message| {
                bytes += message.payload.len() as u64;
                v1::AckItem { partition: message.partition, seq: message.seq, ..v1::AckItem::default() }
            })
            .collect();
        let n = acks.len() as u64;
        let (acker, stream) = (client.clone(), workload.stream.clone());
        unanswered.push_back(tokio::spawn(async move { acker.ack(&stream, consumer, acks).await }));
        let per_message = round.elapsed();
        latencies.extend(std::iter::repeat_n(per_message, n as usize));
        received += n;
        bar.set_position(received.min(count));
        while unanswered.len() > ACK_CALLS_AHEAD || (received >= count && !unanswered.is_empty()) {
            let answered = unanswered.pop_front().expect("an ack call is unanswered");
            errors += failed_acks(answered.await.context("an ack call")??);
        }
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    Ok(Report { what: "consume", messages: received, bytes, elapsed, latencies, errors })
}

/// Ack calls a consumer leaves unanswered while it fetches on, as a client that acks without waiting does.
const ACK_CALLS_AHEAD: usize = 3;

/// How many of an ack call's items failed.
fn failed_acks(results: Vec<v1::AckResult>) -> u64 {
    results.iter().filter(|result| matches!(result.result, Some(v1::ack_result::Result::Error(_)))).count() as u64
}

/// Most subscriptions one client (one connection to each node) opens: a node serves 256 calls at once on a connection.
const SUBSCRIPTIONS_PER_CLIENT: usize = 200;

async fn latency(workload: Workload, idle: usize, idle_seconds: u64, busy_rate: u64) -> anyhow::Result<Report> {
    let count = workload.count.unwrap_or(2_000);
    let client = client(&workload.connect)?;
    recreate(&client, &workload).await?;
    let head = workload.subject.split_once('.').map_or(workload.subject.as_str(), |(head, _)| head).to_string();

    // The idle subscriptions, each on a consumer of its own whose filter nothing published matches.
    let bar = progress(idle as u64, "idle");
    let mut held = Vec::with_capacity(idle);
    let mut clients = Vec::new();
    for index in 0..idle {
        if index % SUBSCRIPTIONS_PER_CLIENT == 0 {
            clients.push(crate::commands::client(&workload.connect)?);
        }
        let subscriber = clients.last().expect("a client per SUBSCRIPTIONS_PER_CLIENT");
        let name = format!("bench-idle-{index}");
        let config =
            v1::ConsumerConfig { filter_subject: Some(format!("{head}.idle")), ..v1::ConsumerConfig::default() };
        client.create_consumer(&workload.stream, &name, config).await.context("an idle consumer")?;
        held.push(subscriber.subscribe(&workload.stream, &name, "idle", 16).await.context("an idle subscription")?);
        bar.inc(1);
    }
    bar.finish_and_clear();

    // What the cell writes while they idle (the leader's idle tick is one entry every two seconds).
    let applied =
        async || -> anyhow::Result<u64> { Ok(client.cluster_status().await?.applied_index.unwrap_or_default()) };
    let before = applied().await?;
    tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
    let entries = applied().await? - before;
    println!(
        "idle: {idle} subscriptions, {entries} log entries in {idle_seconds} s (idle_entries_per_s={:.2})",
        entries as f64 / idle_seconds.max(1) as f64
    );

    // Background load, if asked for: pipelined publishes to another subject, paced to the rate.
    let busy = (busy_rate > 0).then(|| {
        let (busy_client, subject) = (client.clone(), format!("{head}.busy"));
        let payload = Bytes::from(vec![b'x'; workload.size]);
        tokio::spawn(async move {
            let per_tick = busy_rate.div_ceil(100).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                let requests = (0..per_tick)
                    .map(|_| v1::PublishRequest {
                        subject: subject.clone(),
                        payload: payload.clone(),
                        ..v1::PublishRequest::default()
                    })
                    .collect();
                for result in busy_client.publish_batch(requests, 256).await {
                    let _ = result.result;
                }
            }
        })
    });

    // One message at a time: published, then timed until its subscription hands it over, then acknowledged.
    let consumer = "bench-latency";
    let config = v1::ConsumerConfig { filter_subject: Some(workload.subject.clone()), ..v1::ConsumerConfig::default() };
    client.create_consumer(&workload.stream, consumer, config).await.context("the measured consumer")?;
    let mut subscription = client.subscribe(&workload.stream, consumer, "bench", 16).await?;
    let payload = Bytes::from(vec![b'x'; workload.size]);
    let bar = progress(count, "latency");
    let (mut latencies, mut errors, mut first_error) = (Vec::with_capacity(count as usize), 0, None);
    let started = Instant::now();
    for index in 0..count {
        let sent = Instant::now();
        if let Err(error) = client.publish(request(&workload, &payload, index)).await {
            errors += 1;
            first_error.get_or_insert(error);
            continue;
        }
        let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.message())
            .await
            .context("no delivery within 10 s")??
            .context("the subscription ended")?;
        latencies.push(sent.elapsed());
        let message = delivery.message.context("a delivery without its message")?;
        let ack = v1::AckItem { partition: message.partition, seq: message.seq, ..v1::AckItem::default() };
        client.ack(&workload.stream, consumer, vec![ack]).await?;
        bar.inc(1);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    if let Some(busy) = busy {
        busy.abort();
    }
    drop(held);
    report_error(first_error);
    Ok(Report { what: "latency", messages: count, bytes: count * workload.size as u64, elapsed, latencies, errors })
}
