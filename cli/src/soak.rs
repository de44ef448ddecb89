//! `cellog bench soak`: an R3 cell of `cellog node` processes on loopback under a steady publish load (about 80% of
//! what it was measured to take at the start), a follower killed (`SIGKILL`) and restarted every minute and the
//! leader every third minute, while the client side keeps every acknowledgement. At the end every acknowledged
//! message must be readable where it was acknowledged, and no message id stored twice. Reported: throughput and each
//! node's resident memory over time, and errors by kind (a non-retryable one fails the run).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::{Client, ClientError, ClientOptions};
use tokio::time::Instant;

/// What a soak run is told.
#[derive(clap::Args, Clone, Debug)]
pub struct SoakArgs {
    /// How long to run under load.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    size: usize,
    /// Messages a second to publish [default: 80% of the rate measured at the start].
    #[arg(long)]
    rate: Option<u64>,
    /// The first of the ports the nodes listen on (client ports from it, Raft ports from it + 100).
    #[arg(long, default_value_t = 19401)]
    base_port: u16,
    /// Where the nodes keep their data and logs [default: a new temporary directory, removed after a clean run].
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// How long a message id is remembered: longer than any retry of it takes, short enough that the ids of the load stay
/// under the cap of one stream's dedup index.
const DEDUP_WINDOW_MS: u64 = 20_000;
/// Messages the soak stream keeps (the oldest go first), so that the cell's state, and so its memory, stops growing
/// once it holds them: what a flat memory line after warm-up needs.
const RETAINED: u64 = 200_000;
/// How often throughput and memory are sampled.
const SAMPLE: Duration = Duration::from_secs(10);
/// Publishes of one pacing tick go out together, pipelined.
const TICK: Duration = Duration::from_millis(100);

/// One `cellog node` process of the soak cell.
struct NodeProcess {
    id: u64,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl NodeProcess {
    fn new(id: u64, base_port: u16, dir: &Path) -> NodeProcess {
        let (client, raft) = (|n: u64| base_port + n as u16, |n: u64| base_port + 100 + n as u16);
        let mut args = vec![
            "node".to_string(),
            format!("--id={id}"),
            "--cell=soak".to_string(),
            format!("--data-dir={}", dir.join(format!("n{id}")).display()),
            format!("--client-addr=127.0.0.1:{}", client(id)),
            format!("--raft-addr=127.0.0.1:{}", raft(id)),
            "--metrics-addr=off".to_string(),
            "--insecure".to_string(),
        ];
        for peer in (1..=3).filter(|&peer| peer != id) {
            args.push(format!("--peer={peer}=127.0.0.1:{}/127.0.0.1:{}", raft(peer), client(peer)));
        }
        NodeProcess { id, args, log: dir.join(format!("n{id}.log")), child: None }
    }

    fn client_addr(&self) -> String {
        self.args[4].trim_start_matches("--client-addr=").to_string()
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let binary = std::env::current_exe().context("this program's path, to run its nodes")?;
        let child = Command::new(binary)
            .args(&self.args)
            .env("CELLOG_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting node {}", self.id))?;
        self.child = Some(child);
        Ok(())
    }

    /// `kill -9`, and waits for the process to end.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its resident memory in MiB, from `/proc`.
    fn rss_mib(&self) -> Option<f64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the publisher saw.
#[derive(Default)]
struct Tally {
    /// Every acknowledged message id, and where it landed.
    acked: BTreeMap<u64, (u32, u64)>,
    /// Errors by kind (the reason, or the status code), and whether each kind may be retried.
    errors: BTreeMap<String, (u64, bool)>,
    /// An acknowledgement of an id at another place than its first.
    moved: Vec<String>,
}

impl Tally {
    fn error(&mut self, error: &ClientError) {
        let kind = error.reason().map(str::to_string).unwrap_or_else(|| format!("{:?}", error.code()));
        let retryable = retryable(error);
        let entry = self.errors.entry(kind).or_insert((0, retryable));
        entry.0 += 1;
    }
}

/// Whether a publish that failed with `error` may be sent again: its outcome is unknown (the id makes a repeat
/// harmless), or the cell refused it for now (no leader, too fast, full) rather than for good.
fn retryable(error: &ClientError) -> bool {
    error.outcome_unknown()
        || error.code() == Some(tonic::Code::Unavailable)
        || matches!(error.reason(), Some("RATE_LIMITED" | "STORAGE_FULL" | "NOT_LEADER" | "LEADER_CHANGED"))
}

async fn leader_of(nodes: &[NodeProcess]) -> Option<u64> {
    for node in nodes {
        let client = Client::new([node.client_addr()], quick()).ok()?;
        if let Ok(status) = client.cluster_status().await
            && let Some(leader) = status.leader_id
            && status.applied_index.is_some()
        {
            return Some(leader);
        }
    }
    None
}

fn quick() -> ClientOptions {
    ClientOptions { retry_for: Duration::ZERO, discover: false, ..ClientOptions::default() }
}

async fn wait_for_leader(nodes: &[NodeProcess]) -> anyhow::Result<u64> {
    for _ in 0..300 {
        if let Some(leader) = leader_of(nodes).await {
            return Ok(leader);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the soak cell elected no leader in 30 s")
}

fn request(payload: &Bytes, n: u64) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: "soak.a".to_string(),
        payload: payload.clone(),
        msg_id: Some(format!("s{n}")),
        ..v1::PublishRequest::default()
    }
}

/// Publishes `ids` pipelined; records what was acknowledged; returns the ids to send again (their outcome unknown,
/// or refused for a reason that passes).
async fn publish(client: &Client, payload: &Bytes, ids: Vec<u64>, tally: &mut Tally) -> Vec<u64> {
    let requests = ids.iter().map(|&n| request(payload, n)).collect();
    let mut again = Vec::new();
    for (n, result) in ids.into_iter().zip(client.publish_batch(requests, 256).await) {
        match result.result {
            Ok(ack) => {
                let here = (ack.partition, ack.seq);
                if let Some(first) = tally.acked.insert(n, here)
                    && first != here
                {
                    tally.moved.push(format!("s{n} acknowledged at {first:?} and at {here:?}"));
                }
            }
            Err(error) => {
                tally.error(&error);
                if retryable(&error) {
                    again.push(n);
                }
            }
        }
    }
    again
}

/// Publishes as fast as the cell takes it for `seconds`; returns messages a second.
async fn measure(client: &Client, payload: &Bytes, seconds: u64) -> f64 {
    let started = Instant::now();
    let (mut next, mut tally) = (0u64, Tally::default());
    while started.elapsed() < Duration::from_secs(seconds) {
        let _ = publish(client, payload, (next..next + 5_000).collect(), &mut tally).await;
        next += 5_000;
    }
    tally.acked.len() as f64 / started.elapsed().as_secs_f64()
}

pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    let temporary = match &args.dir {
        Some(_) => None,
        None => Some(std::env::temp_dir().join(format!("cellog-soak-{}", std::process::id()))),
    };
    let dir = args.dir.clone().or_else(|| temporary.clone()).expect("one of them");
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let mut nodes: Vec<NodeProcess> = (1..=3).map(|id| NodeProcess::new(id, args.base_port, &dir)).collect();
    for node in &mut nodes {
        node.start()?;
    }
    wait_for_leader(&nodes).await?;
    let addrs: Vec<String> = nodes.iter().map(NodeProcess::client_addr).collect();
    let client = Client::new(addrs, ClientOptions::default())?;
    let config = v1::StreamConfig {
        subjects: vec!["soak.>".to_string()],
        duplicate_window_ms: Some(DEDUP_WINDOW_MS),
        max_age_ms: Some(3_600_000),
        ..v1::StreamConfig::default()
    };
    client.create_stream("SOAK", config).await.context("creating the soak stream")?;
    let payload = Bytes::from(vec![b'x'; args.size]);

    let rate = match args.rate {
        Some(rate) => rate,
        None => {
            let max = measure(&client, &payload, 15).await;
            println!("measured maximum: {max:.0} msgs/s; soaking at 80%");
            (max * 0.8) as u64
        }
    };
    client.delete_stream("SOAK").await?;
    let config = v1::StreamConfig {
        subjects: vec!["soak.>".to_string()],
        duplicate_window_ms: Some(DEDUP_WINDOW_MS),
        max_messages: Some(RETAINED),
        ..v1::StreamConfig::default()
    };
    client.create_stream("SOAK", config).await.context("creating the soak stream again")?;

    println!("{:>6} {:>10} {:>9} {:>9} {:>9}  event", "t (s)", "msgs/s", "n1 MiB", "n2 MiB", "n3 MiB");
    let per_tick = (rate as f64 * TICK.as_secs_f64()).ceil() as u64;
    let (started, end) = (Instant::now(), Instant::now() + Duration::from_secs(args.minutes * 60));
    let (mut tally, mut retry, mut next) = (Tally::default(), Vec::new(), 0u64);
    let (mut next_sample, mut acked_at_sample) = (started + SAMPLE, 0usize);
    let mut next_fault = started + Duration::from_secs(60);
    let (mut faults, mut event) = (0u32, String::new());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < end {
        tick.tick().await;
        let mut ids: Vec<u64> = std::mem::take(&mut retry);
        ids.extend(next..next + per_tick);
        next += per_tick;
        retry = publish(&client, &payload, ids, &mut tally).await;
        let now = Instant::now();
        if now >= next_fault {
            next_fault += Duration::from_secs(60);
            faults += 1;
            let leader = leader_of(&nodes).await;
            // Every third fault takes the leader; the others a follower, in turn.
            let victim = match leader {
                Some(leader) if faults % 3 == 0 => leader,
                Some(leader) => (1..=3).filter(|&id| id != leader).nth((faults % 2) as usize).unwrap_or(1),
                None => 1 + u64::from(faults % 3),
            };
            let node = &mut nodes[(victim - 1) as usize];
            node.kill();
            tokio::time::sleep(Duration::from_secs(1)).await;
            node.start()?;
            let role = if Some(victim) == leader { "leader" } else { "follower" };
            event = format!("{event} killed and restarted {role} n{victim};");
        }
        if now >= next_sample {
            let rss: Vec<String> =
                nodes.iter().map(|node| node.rss_mib().map_or("-".to_string(), |mib| format!("{mib:.0}"))).collect();
            let rate = (tally.acked.len() - acked_at_sample) as f64 / SAMPLE.as_secs_f64();
            println!(
                "{:>6.0} {:>10.0} {:>9} {:>9} {:>9} {}",
                now.duration_since(started).as_secs_f64(),
                rate,
                rss[0],
                rss[1],
                rss[2],
                event.trim()
            );
            (acked_at_sample, event) = (tally.acked.len(), String::new());
            next_sample += SAMPLE;
        }
    }
    // What is still unknown is settled: sent again until answered (the dedup window is longer than this takes).
    for _ in 0..50 {
        if retry.is_empty() {
            break;
        }
        retry = publish(&client, &payload, std::mem::take(&mut retry), &mut tally).await;
    }
    let elapsed = started.elapsed();
    wait_for_leader(&nodes).await?;
    let (violations, trimmed) = check(&client, &tally).await?;

    println!();
    println!(
        "soak: {} minutes, {} messages acknowledged ({:.0} msgs/s, target {rate}), {faults} nodes killed and restarted; \
         {} read back where they were acknowledged, {trimmed} older ones removed by the stream's limit of {RETAINED}",
        args.minutes,
        tally.acked.len(),
        tally.acked.len() as f64 / elapsed.as_secs_f64(),
        tally.acked.len() as u64 - trimmed,
    );
    let mut fatal = 0;
    for (kind, (count, retryable)) in &tally.errors {
        println!("errors: {kind}: {count} ({})", if *retryable { "retried" } else { "NOT RETRYABLE" });
        if !retryable {
            fatal += count;
        }
    }
    if tally.errors.is_empty() {
        println!("errors: none");
    }
    for violation in violations.iter().chain(&tally.moved).take(20) {
        println!("VIOLATION: {violation}");
    }
    let n_violations = violations.len() + tally.moved.len();
    println!("soak_acked={} soak_violations={n_violations} soak_fatal_errors={fatal}", tally.acked.len());
    drop(nodes);
    if n_violations > 0 || fatal > 0 {
        bail!("the soak failed; node logs are in {}", dir.display());
    }
    if let Some(dir) = temporary {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

/// Reads the whole stream back: every acknowledged message the stream's limit has not removed is where it was
/// acknowledged, and no message id is there twice. Returns the violations and how many acknowledged messages the limit
/// removed (those below a partition's low watermark).
async fn check(client: &Client, tally: &Tally) -> anyhow::Result<(Vec<String>, u64)> {
    let mut seen: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    let mut violations = Vec::new();
    let info = client.stream_info("SOAK").await?;
    let low: BTreeMap<u32, u64> =
        info.partitions.iter().map(|partition| (partition.partition, partition.low_watermark)).collect();
    let partitions = info.config.map_or(1, |config| config.partitions);
    for partition in 0..partitions.max(1) {
        let mut from = low.get(&partition).copied().unwrap_or(1).max(1);
        loop {
            let response = client.read("SOAK", partition, from, 10_000, false).await?;
            let Some(last) = response.messages.last().map(|message| message.seq) else { break };
            for message in &response.messages {
                let Some(n) = message.msg_id.as_deref().and_then(|id| id.strip_prefix('s')?.parse().ok()) else {
                    violations.push(format!("{partition}/{} has no soak message id", message.seq));
                    continue;
                };
                if let Some(first) = seen.insert(n, (partition, message.seq)) {
                    violations.push(format!("s{n} stored twice: at {first:?} and {partition}/{}", message.seq));
                }
            }
            from = last + 1;
        }
    }
    let mut trimmed = 0;
    for (n, at) in &tally.acked {
        if at.1 < low.get(&at.0).copied().unwrap_or(1) {
            trimmed += 1;
            continue;
        }
        match seen.get(n) {
            None => violations.push(format!("s{n} acknowledged at {at:?} is not in the stream")),
            Some(stored) if stored != at => {
                violations.push(format!("s{n} acknowledged at {at:?} is stored at {stored:?}"))
            }
            Some(_) => {}
        }
    }
    Ok((violations, trimmed))
}
