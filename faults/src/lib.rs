//! A fault test of real `cellog node` processes. Three nodes run on hosts of their own (network namespaces on a
//! bridge); a producer publishes messages with ids, a durable consumer fetches and acks, nacks or ignores, and a
//! transactional producer commits (and aborts one transaction in four on purpose), all recording a history, while a
//! seeded schedule kills nodes with SIGKILL, pauses them with SIGSTOP, cuts one off from the others with iptables,
//! and restarts the whole cell. Then everything heals, the consumer drains, the nodes must converge, and
//! `cellog-check`'s checkers look at the history and at what every node holds, as in simulation.
//!
//! `cli/tests/faults.rs` runs it on this build's `cellog` (as root: namespaces and iptables need it).
#![allow(clippy::disallowed_methods, reason = "a test of real processes runs on the real clock")]

pub mod hosts;
pub mod nodes;
pub mod schedule;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellog_check::history::{Op, Operation};
use cellog_check::record::{History, by_id};
use cellog_check::{Duties, Evidence, NodeState, check_all};
use cellog_client::proto as v1;
use cellog_client::{Client, ClientOptions};
use cellog_sim::workload::{Behaviour, Caller, Consumer, Producer, TxnProducer};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::hosts::{Host, Hosts};
use crate::nodes::Node;
use crate::schedule::{Fault, Step};

const STREAM: &str = "orders";
const PARTITIONS: u32 = 2;
const CONSUMER: &str = "audit";
/// The process that publishes outside transactions, whose acknowledgements time a failover.
const PRODUCER: &str = "producer";
const NODES: u64 = 3;

/// How to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The `cellog` binary the nodes run.
    pub cellog: PathBuf,
    /// How long faults go on.
    pub duration_secs: u64,
    /// The seed of the fault schedule and of the consumer's answers.
    pub seed: u64,
    /// Where the nodes keep their data and logs.
    pub work: PathBuf,
}

/// What a run did and found.
#[derive(Clone, Debug)]
pub struct Report {
    /// How long it took, setup and checks included.
    pub seconds: f64,
    /// Client operations in the history.
    pub operations: usize,
    /// Publishes acknowledged.
    pub acknowledged: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// For each kill, pause or partition of the node that led when it began: how long the producer then went without
    /// an acknowledged publish, at the longest, until the fault ended.
    pub failovers: Vec<Failover>,
    /// Properties violated, with what was found.
    pub violations: Vec<String>,
    /// Why the nodes did not converge at the end, if they did not.
    pub liveness: Option<String>,
    /// Where the node data, logs and history are.
    pub work: PathBuf,
}

/// How a client saw one of its leader's faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failover {
    /// The fault's kind.
    pub kind: &'static str,
    /// The longest the producer went without an acknowledged publish from the fault's start until it ended.
    pub longest_ms: u64,
    /// Whether no publish was acknowledged before the fault ended: `longest_ms` is then the fault's whole hold, and
    /// the client's failover took at least that.
    pub unfinished: bool,
}

/// From a fault of the leader at `at_ms` held for `hold_ms`, the longest wait for an acknowledged publish by
/// `process` in the history until the fault ends.
fn failover(operations: &[Operation], process: &str, kind: &'static str, at_ms: u64, hold_ms: u64) -> Failover {
    let end_ms = at_ms + hold_ms;
    let mut acked: Vec<u64> = operations
        .iter()
        .filter(|operation| operation.process == process && matches!(operation.op, Op::Publish { .. }))
        .filter(|operation| operation.ok().is_some())
        .filter_map(|operation| operation.completed.as_ref().map(|(at, _)| *at))
        .filter(|done| (at_ms..=end_ms).contains(done))
        .collect();
    acked.sort_unstable();
    let unfinished = acked.is_empty();
    acked.insert(0, at_ms);
    if unfinished {
        acked.push(end_ms);
    }
    let longest_ms = acked.windows(2).map(|pair| pair[1] - pair[0]).max().unwrap_or_default();
    Failover { kind, longest_ms, unfinished }
}

impl Report {
    /// Violations, and a failure to converge.
    pub fn anomalies(&self) -> usize {
        self.violations.len() + usize::from(self.liveness.is_some())
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let faults: Vec<String> = self.faults.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        writeln!(
            f,
            "faults: {:.0} s, {} operations, {} publishes acknowledged",
            self.seconds, self.operations, self.acknowledged
        )?;
        writeln!(f, "faults injected: {}", faults.join(", "))?;
        if !self.failovers.is_empty() {
            let mut longest: Vec<u64> = self.failovers.iter().map(|failover| failover.longest_ms).collect();
            longest.sort_unstable();
            let each: Vec<String> = self
                .failovers
                .iter()
                .map(|failover| {
                    let over = if failover.unfinished { "at least " } else { "" };
                    format!("{} {over}{} ms", failover.kind, failover.longest_ms)
                })
                .collect();
            writeln!(
                f,
                "failover (the producer's longest wait for an ack after a fault of the leader): {} faults, median {} \
                 ms, longest {} ms; {}",
                longest.len(),
                longest[longest.len() / 2],
                longest[longest.len() - 1],
                each.join(", ")
            )?;
        }
        for violation in &self.violations {
            writeln!(f, "VIOLATED {violation}")?;
        }
        if let Some(why) = &self.liveness {
            writeln!(f, "LIVENESS {why}")?;
        }
        write!(f, "anomalies={} (node data, logs and history in {})", self.anomalies(), self.work.display())
    }
}

fn message(msg_id: String) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: format!("{STREAM}.{}", msg_id.len() % 3),
        payload: Bytes::from(msg_id.clone()),
        msg_id: Some(msg_id),
        ..v1::PublishRequest::default()
    }
}

/// Runs three node processes of `config.cellog` under a seeded schedule of faults for `config.duration_secs`, then
/// heals, drains, and checks. `Err` when the test itself could not run (no namespaces, no binary).
pub async fn run(config: &Config) -> Result<Report, String> {
    let started = Instant::now();
    let work = config.work.clone();
    std::fs::create_dir_all(&work).map_err(|error| format!("{}: {error}", work.display()))?;
    let hosts = Hosts::create(NODES)?;
    let mut nodes: Vec<Node> =
        hosts.hosts.iter().map(|host| Node::new(host, &hosts.hosts, &config.cellog, &work)).collect();
    for node in &mut nodes {
        node.start()?;
    }
    let addrs: Vec<String> = nodes.iter().map(Node::client_addr).collect();
    let options = ClientOptions {
        retry_for: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let client = Client::new(addrs, options).map_err(|error| error.to_string())?;
    setup(&client).await?;

    let clock_start = Instant::now();
    let history = History::new(Arc::new(move || clock_start.elapsed()));
    let caller = Caller { client: client.clone(), history: history.clone() };
    let stop = Arc::new(AtomicBool::new(false));
    let workload = spawn_workload(&caller, &stop, config.seed);

    let steps = schedule::draw(config.seed, NODES, config.duration_secs * 1000);
    let mut faults = BTreeMap::new();
    // The faults of the leader: their kind, when they began and how long they were held.
    let mut of_leader = Vec::new();
    for step in &steps {
        let due = clock_start + Duration::from_millis(step.at_ms);
        tokio::time::sleep(due.saturating_duration_since(Instant::now())).await;
        eprintln!("{step}");
        let target = match step.fault {
            Fault::Kill(id) | Fault::Pause(id) | Fault::Isolate(id) => Some(id),
            Fault::RestartAll => None,
        };
        if let Some(id) = target
            && leader_of(&nodes).await == Some(id)
        {
            let at_ms = u64::try_from(clock_start.elapsed().as_millis()).unwrap_or(u64::MAX);
            of_leader.push((step.fault.kind(), at_ms, step.hold_ms));
        }
        inject(step, &hosts, &mut nodes).await?;
        *faults.entry(step.fault.kind()).or_insert(0) += 1;
    }
    let end = clock_start + Duration::from_secs(config.duration_secs);
    tokio::time::sleep(end.saturating_duration_since(Instant::now())).await;

    // Heal everything, let the producers finish, the consumer drain, and the nodes converge.
    hosts.heal_all()?;
    for node in &mut nodes {
        node.resume()?;
        node.start()?;
    }
    stop.store(true, Ordering::Release);
    let mut consumer = workload.await.map_err(|error| format!("the workload: {error}"))?;
    let mut idle = 0;
    let drain_until = Instant::now() + Duration::from_secs(90);
    while idle < 30 && Instant::now() < drain_until {
        idle = if consumer.round(64).await == 0 { idle + 1 } else { 0 };
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let liveness = converge(&nodes).await.err();
    let mut held = BTreeMap::new();
    let mut states = BTreeMap::new();
    for node in &nodes {
        let local = node.local_client();
        if let Ok(messages) = read_all(&local).await {
            held.insert(node.host.id, by_id(messages));
        }
        if let Ok(status) = local.cluster_status_with_parts().await {
            let parts = status.digest_parts.into_iter().map(|part| (part.part, part.digest)).collect();
            states.insert(node.host.id, NodeState { applied_index: status.applied_index.unwrap_or_default(), parts });
        }
    }
    let duties = Duties {
        consumers: BTreeMap::from([(STREAM.to_string(), CONSUMER.to_string())]),
        drained: [CONSUMER.to_string()].into(),
        ..Duties::default()
    };
    let operations = history.operations();
    let failovers = of_leader
        .iter()
        .map(|(kind, at_ms, hold_ms)| failover(&operations, PRODUCER, kind, *at_ms, *hold_ms))
        .collect();
    let evidence = Evidence {
        operations,
        held: BTreeMap::from([(STREAM.to_string(), held)]),
        states,
        samples: Vec::new(),
        duties,
    };
    std::fs::write(work.join("history.txt"), history.render()).map_err(|error| error.to_string())?;
    let violations: Vec<String> =
        check_all(&evidence).into_iter().map(|v| format!("{}: {}", v.property, v.found)).collect();
    if !violations.is_empty() || liveness.is_some() {
        for node in &nodes {
            eprintln!("--- node {} log (end):\n{}", node.host.id, node.log_tail(40));
        }
    }
    Ok(Report {
        seconds: started.elapsed().as_secs_f64(),
        operations: evidence.operations.len(),
        acknowledged: history.acknowledged_in(STREAM).len(),
        faults,
        failovers,
        violations,
        liveness,
        work,
    })
}

/// Waits for a leader, then makes the stream and the durable consumer.
async fn setup(client: &Client) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let config = v1::StreamConfig {
            subjects: vec![format!("{STREAM}.>")],
            partitions: PARTITIONS,
            ..v1::StreamConfig::default()
        };
        match client.create_stream(STREAM, config).await {
            Ok(_) => break,
            Err(error) if Instant::now() > deadline => return Err(format!("no cell within a minute: {error}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let consumer = v1::ConsumerConfig { ack_wait_ms: Some(1_000), ..v1::ConsumerConfig::default() };
    client.create_consumer(STREAM, CONSUMER, consumer).await.map_err(|error| error.to_string())?;
    Ok(())
}

/// The producer, the consumer and the transactional producer, until `stop`; returns the consumer to drain.
fn spawn_workload(caller: &Caller, stop: &Arc<AtomicBool>, seed: u64) -> tokio::task::JoinHandle<Consumer> {
    let mut producer = Producer::new(caller.clone(), PRODUCER);
    let producing = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut next = 0;
            while !stop.load(Ordering::Acquire) {
                let batch = (next..next + 10).map(|i| message(format!("m-{i}"))).collect();
                producer.publish(batch, 8).await;
                next += 10;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let mut txn = TxnProducer::new(caller.clone(), "txn", "faults-txn");
    let transacting = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut round = 0;
            while !stop.load(Ordering::Acquire) {
                round += 1;
                if txn.producer.is_none() && txn.init().await.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                let mut staged = txn.begin().await.is_ok();
                for index in 0..3 {
                    staged = staged && txn.publish(message(format!("t{round}-{index}"))).await.is_ok();
                }
                let committed = round % 4 != 0 && staged && txn.prepare().await.is_ok() && txn.commit().await.is_ok();
                if !committed {
                    // Aborted on purpose, or something failed: a fresh instance fences whatever is left open.
                    let _ = txn.abort().await;
                    txn.producer = None;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let rng = ChaCha8Rng::seed_from_u64(seed);
    let mut consumer = Consumer::new(caller.clone(), CONSUMER, (STREAM, CONSUMER), Behaviour::default(), rng);
    let stop = stop.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::Acquire) {
            if consumer.round(16).await == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let _ = producing.await;
        let _ = transacting.await;
        consumer
    })
}

/// Injects one step's fault, holds it, and undoes it.
async fn inject(step: &Step, hosts: &Hosts, nodes: &mut [Node]) -> Result<(), String> {
    let hold = Duration::from_millis(step.hold_ms);
    let index = |id: u64| (id - 1) as usize;
    match step.fault {
        Fault::Kill(id) => {
            nodes[index(id)].kill()?;
            tokio::time::sleep(hold).await;
            nodes[index(id)].start()?;
        }
        Fault::Pause(id) => {
            nodes[index(id)].pause()?;
            tokio::time::sleep(hold).await;
            nodes[index(id)].resume()?;
        }
        Fault::Isolate(id) => {
            let host = &hosts.hosts[index(id)];
            let others: Vec<&Host> = hosts.hosts.iter().filter(|other| other.id != id).collect();
            host.cut_from(&others)?;
            for other in &others {
                other.cut_from(&[host])?;
            }
            tokio::time::sleep(hold).await;
            hosts.heal_all()?;
        }
        Fault::RestartAll => {
            for node in nodes.iter_mut() {
                node.kill()?;
            }
            tokio::time::sleep(hold).await;
            for node in nodes.iter_mut() {
                node.start()?;
            }
        }
    }
    Ok(())
}

/// The node that leads, as the first node to answer within a second names it.
async fn leader_of(nodes: &[Node]) -> Option<u64> {
    for node in nodes {
        let status = tokio::time::timeout(Duration::from_secs(1), node.local_client().cluster_status()).await;
        if let Ok(Ok(status)) = status
            && status.leader_id.is_some()
        {
            return status.leader_id;
        }
    }
    None
}

/// Waits until every node applied the same index with the same state digest, at most two minutes.
async fn converge(nodes: &[Node]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = Vec::new();
    while Instant::now() < deadline {
        let mut seen = Vec::new();
        for node in nodes {
            if let Ok(status) = node.local_client().cluster_status_with_digest().await {
                seen.push((node.host.id, status.applied_index.unwrap_or_default(), status.state_digest));
            }
        }
        let agree = seen.windows(2).all(|pair| (pair[0].1, &pair[0].2) == (pair[1].1, &pair[1].2));
        if seen.len() == nodes.len() && agree {
            return Ok(());
        }
        last = seen;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("the nodes did not converge within two minutes: {last:?}"))
}

/// Every message a node holds in the stream, read locally.
async fn read_all(client: &Client) -> Result<Vec<v1::Message>, cellog_client::ClientError> {
    let mut messages = Vec::new();
    for partition in 0..PARTITIONS {
        let mut from = 1;
        loop {
            let response = client.read(STREAM, partition, from, 1000, true).await?;
            let Some(last) = response.messages.last().map(|message| message.seq) else { break };
            messages.extend(response.messages);
            from = last + 1;
        }
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use cellog_check::history::{Completion, Fingerprint, Value};

    use super::*;

    fn publish(process: &str, completed: Option<(u64, bool)>) -> Operation {
        let value = Value::Published { stream: STREAM.to_string(), partition: 0, seq: 1, duplicate: false };
        Operation {
            process: process.to_string(),
            op: Op::Publish {
                msg_id: "m".to_string(),
                subject: "orders.0".to_string(),
                txn: None,
                delay_ms: None,
                payload: Fingerprint(0),
            },
            invoked_ms: 0,
            completed: completed.map(|(at, ok)| {
                (at, if ok { Completion::Ok(value.clone()) } else { Completion::Unknown("timeout".to_string()) })
            }),
        }
    }

    #[test]
    fn a_failover_is_the_longest_wait_for_the_producers_acks_while_the_fault_lasts() {
        let operations = [
            publish(PRODUCER, Some((950, true))),
            publish(PRODUCER, Some((1_020, true))),
            publish(PRODUCER, Some((1_900, false))),
            publish("txn", Some((1_500, true))),
            publish(PRODUCER, Some((2_300, true))),
            publish(PRODUCER, Some((2_350, true))),
            publish(PRODUCER, Some((4_000, true))),
            publish(PRODUCER, None),
        ];
        // Held from 1 000 to 3 000 ms: acks at 1 020, 2 300 and 2 350; the transactional one and the unknown one do
        // not count, nor do those outside the hold.
        let seen = failover(&operations, PRODUCER, "pause", 1_000, 2_000);
        assert_eq!(seen, Failover { kind: "pause", longest_ms: 1_280, unfinished: false });
        // Held from 2 400 to 3 000 ms: no ack until it ended.
        let seen = failover(&operations, PRODUCER, "kill -9", 2_400, 600);
        assert_eq!(seen, Failover { kind: "kill -9", longest_ms: 600, unfinished: true });
    }
}
