//! The mixed workload that `ci/sim-run` and the chaos sweeps run: a producer (which may duplicate requests, and
//! delays some messages by a day), a durable consumer and two work-queue workers that ack, nack or ignore, a
//! transactional producer that aborts one transaction on purpose and is replaced midway, its old instance going on as
//! a zombie, a feed held full by a slow registered mirror, and a consumer group whose member joins again while its
//! earlier incarnation goes on acking; faults from a schedule meanwhile; then heal, drain and converge.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use cellog_check::{Duties, Evidence, NodeState, Stored, check_all};
use cellog_client::proto as v1;
use cellog_client::token;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use cellog_check::record::by_id;

use crate::cluster::{Cluster, SimNodeId};
use crate::fault::Step;
use crate::seeds::Concern;
use crate::workload::{Behaviour, Caller, Consumer, GroupWorker, Mirror, Producer, TxnProducer};

/// The stream every message of the producer goes to.
pub const STREAM: &str = "orders";
/// Its partitions.
pub const PARTITIONS: u32 = 2;
/// A work-queue stream: a message is gone once a worker acks it.
pub const JOBS: &str = "jobs";
/// The durable consumer of [`STREAM`].
pub const AUDIT: &str = "audit";
/// The work-queue consumer of [`JOBS`], with two members.
pub const WORKERS: &str = "workers";
/// Transactions attempted, of [`TXN_SIZE`] messages each.
pub const TXNS: usize = 5;
/// Messages per transaction.
pub const TXN_SIZE: usize = 4;
/// Before this transaction, the transactional producer is replaced, and the old instance goes on as a zombie.
pub const ZOMBIE_ROUND: usize = 2;
/// This transaction is staged and then aborted on purpose: nothing of it may ever be shown.
pub const ABORT_ROUND: usize = 3;
/// A stream kept at [`FEED_LIMIT`] messages (discarding the oldest), copied by the registered peer [`MIRROR`]:
/// retention may only remove what the mirror has received, so a publish that would need more is refused.
pub const FEED: &str = "feed";
/// Most messages [`FEED`] keeps.
pub const FEED_LIMIT: u64 = 6;
/// The registered peer of [`FEED`].
pub const MIRROR: &str = "mirror";
/// A stream of [`TASKS_PARTITIONS`] partitions consumed by the consumer group [`CREW`].
pub const TASKS: &str = "tasks";
/// Its partitions.
pub const TASKS_PARTITIONS: u32 = 4;
/// The consumer group of [`TASKS`]: two members, the second of which joins again midway ([`CREW_REJOIN_ROUND`])
/// while its earlier incarnation, a zombie, acks what it still held: every such ack must be refused.
pub const CREW: &str = "crew";
/// The round at which the second member of [`CREW`] joins again; it stops acking [`CREW_HOLD_ROUNDS`] rounds before,
/// so that its earlier incarnation holds deliveries to ack once fenced.
pub const CREW_REJOIN_ROUND: usize = 25;
/// See [`CREW_REJOIN_ROUND`].
pub const CREW_HOLD_ROUNDS: usize = 5;
/// A process that runs as a principal of its own, which may publish to [`INTRUDER_GRANTS`] only, and tries
/// [`INTRUDER_PUBLISHES`] publishes: outside them, or inside them as the node ([`INTRUDER_FORGERIES`]); every one
/// must be refused.
pub const INTRUDER: &str = "intruder";
/// The subject filters [`INTRUDER`]'s principal may publish to.
pub const INTRUDER_GRANTS: &[&str] = &["jobs.intruder"];
/// How many publishes [`INTRUDER`] tries.
pub const INTRUDER_PUBLISHES: usize = 10;
/// How many of them are inside its grants but carry a forged `cellog-sender: root` header (every other one, ids
/// [`forged_id`]): each must be refused, since that header is the node's.
pub const INTRUDER_FORGERIES: usize = INTRUDER_PUBLISHES / 2;

/// The message id of the intruder's `n`th forged publish.
pub fn forged_id(n: usize) -> String {
    format!("forged-{n}")
}
/// [`INTRUDER`]'s token (fixed: the run is a function of its seed).
const INTRUDER_TOKEN: &str = "cellog_intruder-of-the-mixed-workload-000000000000000";

/// How long a delayed message of the producer waits before its first delivery: longer than any run, clock jumps
/// included, so a delivery of one is always early.
pub const DELAY_MS: u64 = 24 * 60 * 60 * 1000;

/// What a run leaves to check, besides the cluster's history.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The transactions (by round) whose commit was acknowledged.
    pub committed: Vec<usize>,
    /// What each running node holds in [`STREAM`] and in [`FEED`], read locally after convergence (or after the
    /// cell failed to converge: what could be read).
    pub held: BTreeMap<String, BTreeMap<SimNodeId, Stored>>,
    /// Why the cell did not finish well, if it did not: it did not converge (and where its replicas differ), a node
    /// could not be read, or damaged bodies outlasted the repairs.
    pub liveness: Option<String>,
    /// Each running node's applied index and the digests of its state's parts, once the cell converged (or failed
    /// to).
    pub states: BTreeMap<SimNodeId, NodeState>,
    /// The same, read from the nodes while the workload ran.
    pub samples: Vec<(SimNodeId, NodeState)>,
}

/// What the workload promises besides its history: [`AUDIT`] and [`WORKERS`] are handed every acknowledged message
/// of their streams and go on until they have acked each, and [`MIRROR`] is [`FEED`]'s registered peer (which
/// retention trims behind it).
pub fn duties() -> Duties {
    Duties {
        consumers: BTreeMap::from([(STREAM.to_string(), AUDIT.to_string()), (JOBS.to_string(), WORKERS.to_string())]),
        drained: BTreeSet::from([AUDIT.to_string(), WORKERS.to_string()]),
        peers: BTreeMap::from([(FEED.to_string(), MIRROR.to_string())]),
        trimmed: BTreeSet::from([FEED.to_string()]),
        publishers: BTreeMap::from([(
            INTRUDER.to_string(),
            INTRUDER_GRANTS.iter().map(|filter| filter.to_string()).collect(),
        )]),
        mirrors: BTreeMap::new(),
        forged: (0..INTRUDER_FORGERIES).map(forged_id).collect(),
    }
}

/// The run's evidence: `cluster`'s history, what `outcome` found on the nodes, and the workload's [`duties`].
pub fn evidence(cluster: &Cluster, outcome: &Outcome) -> Evidence {
    Evidence {
        operations: cluster.history().operations(),
        held: outcome.held.clone(),
        states: outcome.states.clone(),
        samples: outcome.samples.clone(),
        duties: duties(),
    }
}

/// The id (and body) of message `index` of the producer: one in ten is delayed by [`DELAY_MS`].
pub fn message_id(index: usize) -> String {
    if index % 10 == 9 { format!("d-{index}") } else { format!("m-{index}") }
}

/// Whether the producer's message `msg_id` is delayed by [`DELAY_MS`] (so never due within a run).
pub fn is_delayed(msg_id: &str) -> bool {
    msg_id.starts_with("d-")
}

/// The id (and body) of message `index` of transaction `round`.
pub fn txn_message_id(round: usize, index: usize) -> String {
    format!("t{round}-{index}")
}

/// The bytes of a larger body, that the node keeps in the log it was written to (at least
/// `cellog_raft::in_log::IN_LOG_MIN_BYTES`) until a snapshot copies it out.
pub const LARGE_BODY_BYTES: usize = 6_000;

/// The body of message `msg_id`: its id, padded to [`LARGE_BODY_BYTES`] for about one message in ten (those whose id
/// ends in 3), so that bodies kept in the log meet every fault too.
pub fn body_of(msg_id: &str) -> Bytes {
    if msg_id.ends_with('3') {
        Bytes::from(format!("{msg_id:.<LARGE_BODY_BYTES$}"))
    } else {
        Bytes::from(msg_id.to_string())
    }
}

fn request(subject: String, msg_id: String) -> v1::PublishRequest {
    v1::PublishRequest {
        subject,
        payload: body_of(&msg_id),
        deliver_after_ms: is_delayed(&msg_id).then_some(DELAY_MS),
        msg_id: Some(msg_id),
        ..v1::PublishRequest::default()
    }
}

async fn setup(cluster: &Cluster) {
    cluster.wait_leader().await;
    let admin = cluster.client();
    cluster
        .on_client(async move {
            let config = v1::StreamConfig {
                subjects: vec!["orders.>".to_string()],
                partitions: PARTITIONS,
                ..v1::StreamConfig::default()
            };
            admin.create_stream(STREAM, config).await.expect("stream created");
            let consumer = v1::ConsumerConfig { ack_wait_ms: Some(1_000), ..v1::ConsumerConfig::default() };
            admin.create_consumer(STREAM, AUDIT, consumer.clone()).await.expect("consumer created");
            let jobs = v1::StreamConfig {
                subjects: vec!["jobs.>".to_string()],
                retention: v1::RetentionPolicy::RetentionWorkQueue.into(),
                ..v1::StreamConfig::default()
            };
            admin.create_stream(JOBS, jobs).await.expect("stream created");
            admin.create_consumer(JOBS, WORKERS, consumer).await.expect("consumer created");
            let feed = v1::StreamConfig {
                subjects: vec!["feed.>".to_string()],
                max_messages: Some(FEED_LIMIT),
                ..v1::StreamConfig::default()
            };
            admin.create_stream(FEED, feed).await.expect("stream created");
            admin.register_peer(FEED, MIRROR).await.expect("peer registered");
            let tasks = v1::StreamConfig {
                subjects: vec!["tasks.>".to_string()],
                partitions: TASKS_PARTITIONS,
                ..v1::StreamConfig::default()
            };
            admin.create_stream(TASKS, tasks).await.expect("stream created");
            let grants = v1::Grants {
                publish: INTRUDER_GRANTS.iter().map(|filter| filter.to_string()).collect(),
                ..v1::Grants::default()
            };
            admin.put_principal(INTRUDER, grants).await.expect("principal made");
            admin.add_token(INTRUDER, token::hash(INTRUDER_TOKEN)).await.expect("token added");
        })
        .await;
}

/// A generator of its own for one client, drawn from `rng`.
fn fork(rng: &mut ChaCha8Rng) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(rng.r#gen())
}

/// How often the nodes' states are read while the workload runs (see [`Cluster::sample_states`]).
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Restarts of damaged nodes before the final reads give up.
const MAX_REPAIR_ROUNDS: usize = 4;

/// Runs the workload on `cluster` with the faults of `schedule`, then heals everything, lets the consumers drain, and
/// waits for the replicas to converge (a liveness check: [`Outcome::liveness`] says why they did not).
pub async fn run(cluster: &mut Cluster, schedule: &[Step]) -> Outcome {
    let mut workload = cluster.seeds().rng(Concern::Workload);
    let mut network = cluster.seeds().rng(Concern::Network);
    // Membership changes may replace every node of the cell within seconds; clients must keep up with them.
    cluster.set_discover_every(Duration::from_secs(1));
    setup(cluster).await;
    let sampling = cluster.sample_states(SAMPLE_EVERY);

    let duplicate_percent = network.gen_range(0..10);
    let mut producer = Producer::new(&*cluster, "producer").with_duplicates(duplicate_percent, fork(&mut network));
    let batches: Vec<usize> = (0..40).map(|_| workload.gen_range(1..20)).collect();
    let publishing = cluster.spawn_on_client(async move {
        let mut next = 0;
        for (round, size) in batches.into_iter().enumerate() {
            let requests = (next..next + size).map(|i| request(format!("orders.{}", i % 3), message_id(i))).collect();
            producer.publish(requests, 8).await;
            next += size;
            if round % 4 == 0 {
                let jobs = (round * 5..round * 5 + 5).map(|i| request("jobs.build".to_string(), format!("j-{i}")));
                producer.publish(jobs.collect(), 8).await;
            }
            let tasks = (round * 3..round * 3 + 3).map(|i| {
                let mut task = request(format!("tasks.{}", i % 5), format!("k-{i}"));
                task.key = Some(Bytes::from(format!("customer-{}", i % 7)));
                task
            });
            producer.publish(tasks.collect(), 8).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut consumers = vec![
        Consumer::new(&*cluster, AUDIT, (STREAM, AUDIT), Behaviour::default(), fork(&mut workload)),
        Consumer::new(&*cluster, "worker-1", (JOBS, WORKERS), Behaviour::default(), fork(&mut workload)),
        Consumer::new(&*cluster, "worker-2", (JOBS, WORKERS), Behaviour::default(), fork(&mut workload)),
    ];
    let consuming = cluster.spawn_on_client(async move {
        for _ in 0..150 {
            let mut got = 0;
            for consumer in &mut consumers {
                got += consumer.round(16).await;
            }
            if got == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        consumers
    });
    // The feeder takes a full feed's refusal as final (no retry), so that a refused publish stays refused in the
    // history and must never be seen.
    let feeder_client = cluster.client_with(|options| options.retry_backpressure = false);
    let feeder = Producer::new(Caller { client: feeder_client, history: cluster.history().clone() }, "feeder");
    let fed = Arc::new(AtomicBool::new(false));
    let feeding = cluster.spawn_on_client({
        let fed = fed.clone();
        async move {
            for index in 0..60 {
                let _ = feeder.publish_one(request("feed.a".to_string(), format!("f-{index}"))).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            fed.store(true, Ordering::Release);
        }
    });
    // The simulated nodes serve callers without a credential as root; the intruder carries a token of its own.
    let intruder_client = cluster.client_with(|options| options.token = Some(INTRUDER_TOKEN.to_string()));
    let intruder = Producer::new(Caller { client: intruder_client, history: cluster.history().clone() }, INTRUDER);
    let intruding = cluster.spawn_on_client(async move {
        for index in 0..INTRUDER_PUBLISHES {
            let attempt = match index % 2 {
                0 => request(format!("orders.{}", index % 3), format!("x-{index}")),
                _ => {
                    let mut forged = request(INTRUDER_GRANTS[0].to_string(), forged_id(index / 2));
                    forged.headers.insert("cellog-sender".to_string(), "root".to_string());
                    forged
                }
            };
            let _ = intruder.publish_one(attempt).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let mut mirror = Mirror::new(&*cluster, MIRROR, FEED, 1);
    let mirroring = cluster.spawn_on_client(async move {
        // Slower than the feeder: the feed fills, and retention must wait for the mirror.
        while !fed.load(Ordering::Acquire) {
            mirror.round(2).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        mirror
    });
    let mut crew = GroupWorker::new(&*cluster, "crew-1", (TASKS, CREW), "crew-1");
    let mut zombie = GroupWorker::new(&*cluster, "crew-2", (TASKS, CREW), "crew-2");
    let mut successor = GroupWorker::new(&*cluster, "crew-2-again", (TASKS, CREW), "crew-2");
    let grouping = cluster.spawn_on_client(async move {
        let mut held = Vec::new();
        for round in 0..60 {
            crew.round(8).await;
            if round < CREW_REJOIN_ROUND - CREW_HOLD_ROUNDS {
                zombie.round(8).await;
            } else if round < CREW_REJOIN_ROUND {
                // It stops acking: what it is handed now, it still holds when it is fenced.
                if zombie.generation == 0 {
                    zombie.join().await;
                }
                held.extend(zombie.fetch(8).await);
            } else if round == CREW_REJOIN_ROUND {
                // The successor is handed work at once, while what the earlier incarnation held may still await its
                // ack (it must come first); then the earlier incarnation acks what it held.
                successor.join().await;
                successor.round(8).await;
                for position in std::mem::take(&mut held) {
                    zombie.ack(zombie.generation, position).await;
                }
            } else {
                successor.round(8).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (crew, successor)
    });
    let mut txn = TxnProducer::new(&*cluster, "txn", "orders-txn");
    let mut zombie = TxnProducer::new(&*cluster, "zombie", "orders-txn");
    let transacting = cluster.spawn_on_client(async move {
        let mut committed = Vec::new();
        for round in 0..TXNS {
            if round == ZOMBIE_ROUND {
                // A new instance takes over the transactional id; the old one carries on as a zombie, which must be
                // fenced: nothing it stages may ever become visible.
                zombie.producer = txn.producer;
                txn.producer = None;
            }
            if txn.producer.is_none() && txn.init().await.is_err() {
                continue;
            }
            if round == ZOMBIE_ROUND && zombie.producer.is_some() {
                let _ = zombie.begin().await;
                let _ = zombie.publish(request("orders.0".to_string(), "zombie-0".to_string())).await;
                let _ = zombie.prepare().await;
                let _ = zombie.commit().await;
            }
            let mut staged = txn.begin().await.is_ok();
            for index in 0..TXN_SIZE {
                let message = request(format!("orders.{}", index % 2), txn_message_id(round, index));
                staged = staged && txn.publish(message).await.is_ok();
            }
            if round == ABORT_ROUND {
                let _ = txn.abort().await;
                txn.producer = None;
            } else if staged && txn.prepare().await.is_ok() && txn.commit().await.is_ok() {
                committed.push(round);
            } else {
                // Whatever is open is dropped; a fresh instance fences it if the abort does not land.
                let _ = txn.abort().await;
                txn.producer = None;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        committed
    });

    cluster.run_schedule(schedule).await;
    cluster.heal_all();

    let (mut mirror, mut consumers, committed, (mut crew, mut successor)) = cluster
        .finish_workload("the workload", async {
            publishing.await.expect("the producer finished");
            feeding.await.expect("the feeder finished");
            intruding.await.expect("the intruder finished");
            let mirror = mirroring.await.expect("the mirror finished");
            let consumers = consuming.await.expect("the consumers finished");
            let committed = transacting.await.expect("the transactions finished");
            (mirror, consumers, committed, grouping.await.expect("the group finished"))
        })
        .await;
    // The consumers go on until nothing comes for two seconds (or for at most a minute: a cell that keeps handing
    // out messages must not keep the run going forever).
    cluster
        .on_client(async move {
            let mut idle = 0;
            for _ in 0..600 {
                if idle >= 20 {
                    break;
                }
                let mut got = 0;
                for consumer in &mut consumers {
                    got += consumer.round(64).await;
                }
                got += mirror.round(64).await;
                got += crew.round(64).await;
                got += successor.round(64).await;
                idle = if got == 0 { idle + 1 } else { 0 };
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
    // Once the replicas agree, their states are compared as read (with those read while the workload ran); then the
    // whole cell restarts (its processes, not its power): every node replays its log from its disk, with whatever the
    // disk faults did to it, and the final reads below see what a restarted node serves.
    let _ = cluster.try_converge().await;
    let mut samples = sampling.finish().await;
    samples.extend(cluster.states().await);
    let nodes = cluster.running();
    for &id in &nodes {
        cluster.node(id).crash();
    }
    for &id in &nodes {
        cluster.node(id).restart();
    }
    // A node that found a damaged body, before or while it is read here, is restarted (see `restart_damaged`) and
    // read again once it has repaired. A cell that does not converge, or a node that cannot be read, is a liveness
    // failure; the checkers still get what could be read, so that a safety violation is named for what it is.
    for round in 1..=MAX_REPAIR_ROUNDS {
        cluster.restart_damaged();
        let converged = cluster.try_converge().await;
        let states = cluster.states().await;
        let (mut stored, mut feed) = (BTreeMap::new(), BTreeMap::new());
        let (mut damaged, mut unread) = (Vec::new(), Vec::new());
        for node in cluster.running() {
            // One read of each stream per node: what it holds by id, with the cell time each message was stored at.
            let read = match cluster.try_messages_on(node, STREAM, PARTITIONS).await {
                Ok(messages) => cluster.try_messages_on(node, FEED, 1).await.map(|feed| (messages, feed)),
                Err(error) => Err(error),
            };
            match read {
                Ok((messages, feed_messages)) => {
                    stored.insert(node, by_id(messages));
                    feed.insert(node, by_id(feed_messages));
                }
                Err(error) if error.reason() == Some("BODY_UNREADABLE") => damaged.push(node),
                Err(error) => unread.push(format!("node {node} could not be read: {error}")),
            }
        }
        if damaged.is_empty() || round == MAX_REPAIR_ROUNDS {
            let mut liveness: Vec<String> = converged.err().into_iter().chain(unread).collect();
            liveness.extend(cluster.node_panics().into_iter().map(|line| format!("a node panicked: {line}")));
            if !damaged.is_empty() {
                liveness
                    .push(format!("nodes {damaged:?} still hold damaged bodies after {MAX_REPAIR_ROUNDS} restarts"));
            }
            let held = BTreeMap::from([(STREAM.to_string(), stored), (FEED.to_string(), feed)]);
            let liveness = (!liveness.is_empty()).then(|| liveness.join("; "));
            return Outcome { committed, held, liveness, states, samples };
        }
    }
    unreachable!("the last round returns")
}

/// The checks `ci/sim-run` makes: every checker of `cellog-check` over the run's [`evidence`], and liveness.
///
/// # Panics
/// On any violation, naming each.
pub fn check(cluster: &Cluster, outcome: &Outcome) {
    let violations = check_all(&evidence(cluster, outcome));
    let mut found: Vec<String> = violations.iter().map(|v| format!("{}: {}", v.property, v.found)).collect();
    found.extend(outcome.liveness.iter().map(|why| format!("liveness: {why}")));
    assert!(found.is_empty(), "violated:\n{}", found.join("\n"));
}
