//! Runs one seed of a simulated cell under a mixed workload and seeded faults, checks it, and prints `trace_hash=<hex>`
//! as its last line. The same seed prints the same hash; `ci/sim-run --seed 7` wraps it.
//!
//! ```sh
//! RUSTFLAGS="--cfg madsim" cargo run -p cellog-sim --bin sim-run -- --seed 7 [--trace FILE] [--history FILE]
//! ```
//!
//! Everything comes from the seed: madsim's own scheduling and network draws, and the run's streams for faults,
//! workload and network rates. The run: three nodes; a producer, a durable consumer that acks, nacks or ignores, and a
//! transactional producer; a fault phase of seeded faults; then heal, convergence and the checks (no acknowledged
//! publish lost or duplicated, replicas equal, every transaction whole).

#[cfg(madsim)]
mod run {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use bytes::Bytes;
    use cellog_net::proto as v1;
    use cellog_raft::storage::DiskFaults;
    use cellog_sim::seeds::Concern;
    use cellog_sim::trace::simulated_elapsed;
    use cellog_sim::workload::{Behaviour, Consumer, Producer, TxnProducer};
    use cellog_sim::{Cluster, NetworkFaults, SimNodeId};
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const STREAM: &str = "orders";
    const PARTITIONS: u32 = 2;
    /// A work-queue stream: a message is gone once a worker acks it.
    const JOBS: &str = "jobs";
    /// Faults per run.
    const FAULTS: usize = 6;

    fn message(prefix: &str, index: usize) -> v1::PublishRequest {
        v1::PublishRequest {
            subject: format!("orders.{}", index % 3),
            payload: Bytes::from(format!("{prefix}-{index}")),
            msg_id: Some(format!("{prefix}-{index}")),
            ..v1::PublishRequest::default()
        }
    }

    /// One fault, held for a while and then undone.
    #[derive(Clone, Debug)]
    enum Fault {
        Crash(SimNodeId),
        PowerOff(SimNodeId),
        Pause(SimNodeId),
        IsolateLeader,
        OneWay(SimNodeId, SimNodeId),
        Lossy(NetworkFaults),
        ClockJump(SimNodeId, i64),
        DiskFaults(SimNodeId, DiskFaults),
        PowerFail,
    }

    /// The fault schedule: (start in ms after the workload starts, fault, how long it lasts in ms).
    fn schedule(rng: &mut ChaCha8Rng, network: &mut ChaCha8Rng, nodes: &[SimNodeId]) -> Vec<(u64, Fault, u64)> {
        let mut at = 500;
        let mut steps = Vec::new();
        for _ in 0..FAULTS {
            let node = *nodes.choose(rng).expect("nodes");
            let other = *nodes.iter().filter(|&&id| id != node).collect::<Vec<_>>().choose(rng).expect("two nodes");
            let fault = match rng.gen_range(0..9) {
                0 => Fault::Crash(node),
                1 => Fault::PowerOff(node),
                2 => Fault::Pause(node),
                3 => Fault::IsolateLeader,
                4 => Fault::OneWay(node, *other),
                5 => Fault::Lossy(NetworkFaults {
                    loss_rate: network.gen_range(0.0..0.2),
                    latency: Duration::from_millis(1)..Duration::from_millis(network.gen_range(2..80)),
                }),
                6 => Fault::ClockJump(node, rng.gen_range(-600_000..3_600_000)),
                // Read errors and flipped bits at sync on one node: it stops or repairs, the others carry on.
                7 => Fault::DiskFaults(node, DiskFaults { bit_flip_ppm: 20_000, ..DiskFaults::default() }),
                _ => Fault::PowerFail,
            };
            let hold = rng.gen_range(300..3_000);
            steps.push((at, fault, hold));
            at += hold + rng.gen_range(200..1_500);
        }
        steps
    }

    async fn inject(cluster: &mut Cluster, fault: &Fault, hold: Duration) {
        match fault.clone() {
            Fault::Crash(node) => {
                cluster.node(node).crash();
                tokio::time::sleep(hold).await;
                cluster.node(node).restart();
            }
            Fault::PowerOff(node) => {
                cluster.node(node).power_off();
                tokio::time::sleep(hold).await;
                cluster.node(node).restart();
            }
            Fault::Pause(node) => {
                cluster.node(node).pause();
                tokio::time::sleep(hold).await;
                cluster.node(node).resume();
            }
            Fault::IsolateLeader => {
                let leader = cluster.wait_leader().await;
                cluster.isolate(leader);
                tokio::time::sleep(hold).await;
                cluster.heal();
            }
            Fault::OneWay(from, to) => {
                cluster.clog_link(from, to);
                tokio::time::sleep(hold).await;
                cluster.unclog_link(from, to);
            }
            Fault::Lossy(network) => {
                cluster.set_network(&network);
                tokio::time::sleep(hold).await;
                cluster.set_network(&NetworkFaults::default());
            }
            Fault::ClockJump(node, by_ms) => {
                cluster.node(node).jump_clock(by_ms);
                tokio::time::sleep(hold).await;
            }
            Fault::DiskFaults(node, faults) => {
                cluster.node(node).disk_faults(faults);
                tokio::time::sleep(hold).await;
                cluster.node(node).disk_faults(DiskFaults::default());
                // A node that stopped on a fault it found comes back through recovery.
                cluster.node(node).crash();
                cluster.node(node).restart();
            }
            Fault::PowerFail => {
                cluster.power_fail();
                tokio::time::sleep(hold).await;
                for node in cluster.ids() {
                    cluster.node(node).restart();
                }
            }
        }
    }

    pub fn main() {
        let mut args = std::env::args().skip(1);
        let (mut seed, mut trace_file, mut history_file) = (None, None, None);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--seed" => seed = args.next().and_then(|value| value.parse::<u64>().ok()),
                "--trace" => trace_file = args.next(),
                "--history" => history_file = args.next(),
                _ => {
                    eprintln!("usage: sim-run --seed N [--trace FILE] [--history FILE]");
                    std::process::exit(2);
                }
            }
        }
        let Some(seed) = seed else {
            eprintln!("usage: sim-run --seed N [--trace FILE] [--history FILE]");
            std::process::exit(2);
        };
        let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
        let (trace, history, summary) = runtime.block_on(run(seed));
        if let Some(path) = trace_file {
            std::fs::write(&path, &trace).unwrap_or_else(|error| panic!("writing {path}: {error}"));
        }
        if let Some(path) = history_file {
            std::fs::write(&path, &history).unwrap_or_else(|error| panic!("writing {path}: {error}"));
        }
        println!("{summary}");
        println!("trace_lines={}", trace.lines().count());
        println!("trace_hash={}", cellog_sim::trace::hash(&trace));
    }

    async fn run(seed: u64) -> (String, String, String) {
        let mut cluster = Cluster::new(3);
        cluster.set_replay(format!("ci/sim-run --seed {seed}"));
        let mut faults_rng = cluster.seeds().rng(Concern::Faults);
        let mut workload_rng = cluster.seeds().rng(Concern::Workload);
        let mut network_rng = cluster.seeds().rng(Concern::Network);
        let plan = schedule(&mut faults_rng, &mut network_rng, &cluster.ids());
        let duplicate_percent = network_rng.gen_range(0..10);

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
                admin.create_consumer(STREAM, "audit", consumer.clone()).await.expect("consumer created");
                let jobs = v1::StreamConfig {
                    subjects: vec!["jobs.>".to_string()],
                    retention: v1::RetentionPolicy::RetentionWorkQueue.into(),
                    ..v1::StreamConfig::default()
                };
                admin.create_stream(JOBS, jobs).await.expect("stream created");
                admin.create_consumer(JOBS, "workers", consumer).await.expect("consumer created");
            })
            .await;

        // The workload: batches of messages, a consumer, and transactions, each on its own client.
        let duplicates = ChaCha8Rng::seed_from_u64(network_rng.r#gen());
        let mut producer = Producer::new(&cluster, "producer").with_duplicates(duplicate_percent, duplicates);
        let batches: Vec<usize> = (0..40).map(|_| workload_rng.gen_range(1..20)).collect();
        let publishing = cluster.spawn_on_client(async move {
            let mut next = 0;
            for (round, size) in batches.into_iter().enumerate() {
                let requests = (next..next + size).map(|index| message("m", index)).collect();
                producer.publish(requests, 8).await;
                next += size;
                if round % 4 == 0 {
                    let jobs = (round * 5..round * 5 + 5).map(job).collect();
                    producer.publish(jobs, 8).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let mut consumers = vec![
            Consumer::new(&cluster, "audit", (STREAM, "audit"), Behaviour::default(), fork(&mut workload_rng)),
            Consumer::new(&cluster, "worker-1", (JOBS, "workers"), Behaviour::default(), fork(&mut workload_rng)),
            Consumer::new(&cluster, "worker-2", (JOBS, "workers"), Behaviour::default(), fork(&mut workload_rng)),
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
        let mut txn = TxnProducer::new(&cluster, "txn", "orders-txn");
        let transacting = cluster.spawn_on_client(async move {
            let mut committed = Vec::new();
            for round in 0..5 {
                if txn.producer.is_none() && txn.init().await.is_err() {
                    continue;
                }
                let staged =
                    txn.begin().await.is_ok() && stage_round(&mut txn, round).await && txn.prepare().await.is_ok();
                if staged && txn.commit().await.is_ok() {
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

        // Faults while the workload runs.
        let started = simulated_elapsed();
        for (at, fault, hold) in &plan {
            let due = started + Duration::from_millis(*at);
            tokio::time::sleep(due.saturating_sub(simulated_elapsed())).await;
            inject(&mut cluster, fault, Duration::from_millis(*hold)).await;
        }
        cluster.heal();
        cluster.set_network(&NetworkFaults::default());
        for node in cluster.ids() {
            if !cluster.running().contains(&node) {
                cluster.node(node).restart();
            }
        }

        publishing.await.expect("the producer finished");
        let mut consumers = consuming.await.expect("the consumers finished");
        let committed = transacting.await.expect("the transactions finished");
        // Heal-and-drain: the consumers go on until nothing comes for two seconds.
        cluster
            .on_client(async move {
                let mut idle = 0;
                while idle < 20 {
                    let mut got = 0;
                    for consumer in &mut consumers {
                        got += consumer.round(64).await;
                    }
                    idle = if got == 0 { idle + 1 } else { 0 };
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
        let stored = cluster.check_acknowledged(STREAM, PARTITIONS, |msg_id| Bytes::from(msg_id.to_string())).await;
        // Transactions are visible whole or not at all.
        let txn_ids: BTreeSet<&String> = stored.keys().filter(|id| id.starts_with("t")).collect();
        for round in 0..5 {
            let n = (0..4).filter(|index| txn_ids.contains(&format!("t{round}-{index}"))).count();
            assert!(n == 0 || n == 4, "transaction {round} is partly visible: {n} of 4 messages");
            assert!(n == 4 || !committed.contains(&round), "committed transaction {round} is not visible");
        }

        // At least once to the durable consumer, with nothing handed out again after its ack; every acknowledged job
        // handed to a worker.
        let history = cluster.history();
        let acknowledged = history.acknowledged();
        let (audited, worked) = (history.delivered("audit"), history.delivered("workers"));
        for msg_id in acknowledged.keys() {
            let delivered = if msg_id.starts_with("j-") { &worked } else { &audited };
            assert!(delivered.contains(msg_id), "acknowledged {msg_id} was never delivered");
        }
        assert_eq!(history.redelivered_after_ack("audit"), None, "a message came back after its ack");
        let acked = acknowledged.len();
        let schedule: Vec<String> =
            plan.iter().map(|(at, fault, hold)| format!("{at}ms {fault:?} for {hold}ms")).collect();
        let summary = format!(
            "seed={seed}\nschedule:\n  {}\nacknowledged={acked} stored={} transactions_committed={committed:?}",
            schedule.join("\n  "),
            stored.len()
        );
        (cluster.trace().render(), cluster.history().render(), summary)
    }

    fn job(index: usize) -> v1::PublishRequest {
        v1::PublishRequest {
            subject: "jobs.build".to_string(),
            payload: Bytes::from(format!("j-{index}")),
            msg_id: Some(format!("j-{index}")),
            ..v1::PublishRequest::default()
        }
    }

    /// A generator of its own for one client, drawn from the workload's stream.
    fn fork(rng: &mut ChaCha8Rng) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(rng.r#gen())
    }

    /// Stages round `round`'s four messages; whether all were staged.
    async fn stage_round(txn: &mut TxnProducer, round: usize) -> bool {
        for index in 0..4 {
            if txn.publish(message(&format!("t{round}"), index)).await.is_err() {
                return false;
            }
        }
        true
    }
}

#[cfg(madsim)]
fn main() {
    run::main();
}

#[cfg(not(madsim))]
fn main() {
    eprintln!("sim-run runs only in the simulation build: RUSTFLAGS=\"--cfg madsim\" (or use ci/sim-run)");
    std::process::exit(2);
}
