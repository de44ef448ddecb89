//! `cellog bench`: the anchor workloads (pipelined publish, synchronous publish, consume with ack), with a progress
//! bar, a result table, and one machine-readable line at the end.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use crate::Connect;
use crate::commands::client;

#[derive(clap::Args, Clone, Debug)]
pub struct Workload {
    /// Messages.
    #[arg(long)]
    count: Option<u64>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Stream to use (publish benchmarks re-create it).
    #[arg(long, default_value = "BENCH")]
    stream: String,
    /// Subject to publish to.
    #[arg(long, default_value = "bench.a")]
    subject: String,
    #[command(flatten)]
    connect: Connect,
}

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
    Consume {
        #[command(flatten)]
        workload: Workload,
        /// Messages per fetch.
        #[arg(long, default_value_t = 256)]
        fetch: u32,
    },
}

fn progress(count: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(count);
    let style = ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

async fn recreate(client: &Client, workload: &Workload) -> anyhow::Result<()> {
    match client.delete_stream(&workload.stream).await {
        Ok(()) => {}
        Err(error) if error.reason() == Some("STREAM_NOT_FOUND") => {}
        Err(error) => return Err(error).context("deleting the benchmark stream"),
    }
    let filter = match workload.subject.split_once('.') {
        Some((head, _)) => format!("{head}.>"),
        None => workload.subject.clone(),
    };
    let config = v1::StreamConfig {
        subjects: vec![filter],
        max_payload_bytes: Some(u32::try_from(workload.size.max(1024 * 1024)).unwrap_or(u32::MAX)),
        ..v1::StreamConfig::default()
    };
    client.create_stream(&workload.stream, config).await.context("creating the benchmark stream")?;
    Ok(())
}

/// Figures of one run.
struct Report {
    what: &'static str,
    messages: u64,
    bytes: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    errors: u64,
}

impl Report {
    fn print(mut self) {
        self.latencies.sort();
        let quantile = |q: f64| {
            if self.latencies.is_empty() {
                return 0.0;
            }
            let rank = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
            self.latencies[rank].as_secs_f64() * 1e6
        };
        let seconds = self.elapsed.as_secs_f64().max(f64::EPSILON);
        let msgs_per_s = self.messages as f64 / seconds;
        let mb_per_s = self.bytes as f64 / seconds / 1e6;
        let (p50, p99) = (quantile(0.50), quantile(0.99));
        println!();
        println!(
            "{:<10} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10} {:>8}",
            "workload", "messages", "seconds", "msgs/s", "MB/s", "p50 us", "p99 us", "errors"
        );
        println!(
            "{:<10} {:>10} {:>10.3} {:>12.0} {:>10.2} {:>10.0} {:>10.0} {:>8}",
            self.what, self.messages, seconds, msgs_per_s, mb_per_s, p50, p99, self.errors
        );
        println!("msgs_per_s={msgs_per_s:.0} MB_per_s={mb_per_s:.2} p50_us={p50:.0} p99_us={p99:.0}");
    }
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    let report = match command {
        BenchCommand::Pub { workload, window } => publish(workload, window).await?,
        BenchCommand::Sync { workload } => sync(workload).await?,
        BenchCommand::Consume { workload, fetch } => consume(workload, fetch).await?,
    };
    let errors = report.errors;
    report.print();
    if errors > 0 {
        bail!("{errors} messages failed");
    }
    Ok(())
}

fn request(workload: &Workload, payload: &Bytes, index: u64) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: workload.subject.clone(),
        payload: payload.clone(),
        msg_id: Some(format!("m{index}")),
        ..v1::PublishRequest::default()
    }
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

fn report_error(error: Option<ClientError>) {
    if let Some(error) = error {
        eprintln!("first error: {error}");
    }
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
    let config = v1::ConsumerConfig { max_in_flight: Some(fetch.max(1)), ..v1::ConsumerConfig::default() };
    client.create_consumer(&workload.stream, consumer, config).await?;
    let bar = progress(count, "consume");
    let (mut latencies, mut received, mut bytes, mut errors) = (Vec::new(), 0u64, 0u64, 0u64);
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
        for result in client.ack(&workload.stream, consumer, acks).await? {
            if matches!(result.result, Some(v1::ack_result::Result::Error(_))) {
                errors += 1;
            }
        }
        let per_message = round.elapsed();
        latencies.extend(std::iter::repeat_n(per_message, n as usize));
        received += n;
        bar.set_position(received.min(count));
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    Ok(Report { what: "consume", messages: received, bytes, elapsed, latencies, errors })
}
