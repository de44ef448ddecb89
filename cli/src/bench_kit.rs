//! What the `cellog bench` workloads share: the workload's flags, the benchmark stream, the progress bar, the report
//! of one run and its first error.

use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError};
use indicatif::{ProgressBar, ProgressStyle};

use crate::Connect;

#[derive(clap::Args, Clone, Debug)]
pub struct Workload {
    /// Messages.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    pub(crate) size: usize,
    /// Stream to use (publish benchmarks re-create it).
    #[arg(long, default_value = "BENCH")]
    pub(crate) stream: String,
    /// Subject to publish to.
    #[arg(long, default_value = "bench.a")]
    pub(crate) subject: String,
    #[command(flatten)]
    pub(crate) connect: Connect,
}

pub(crate) fn progress(count: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(count);
    let style = ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

pub(crate) async fn recreate(client: &Client, workload: &Workload) -> anyhow::Result<()> {
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
pub(crate) struct Report {
    pub(crate) what: &'static str,
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) errors: u64,
}

impl Report {
    pub(crate) fn print(mut self) {
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

pub(crate) fn request(workload: &Workload, payload: &Bytes, index: u64) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: workload.subject.clone(),
        payload: payload.clone(),
        msg_id: Some(format!("m{index}")),
        ..v1::PublishRequest::default()
    }
}

pub(crate) fn report_error(error: Option<ClientError>) {
    if let Some(error) = error {
        eprintln!("first error: {error}");
    }
}
