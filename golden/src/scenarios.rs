//! The named scenarios. Each runs a small workload on a three-node cell at a fixed seed and returns the run's trace;
//! `golden/tests/golden.rs` keeps each trace as an insta snapshot.

use std::time::Duration;

use bytes::Bytes;
use cellog_client::proto as v1;
use cellog_client::token;
use cellog_net::RaftTiming;
use cellog_sim::workload::{Behaviour, Consumer, Producer, TxnProducer};
use cellog_sim::{Cluster, SIM_SNAPSHOT_EVERY};

/// A named scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// The leader crashes while a batch is being published; the batch lands whole, once, at the new leader.
    LeaderFailoverDuringBatchPublish,
    /// A transactional producer is replaced; the old instance's publish and commit are fenced.
    ZombieProducerFenced,
    /// A transaction across two subjects commits while a follower is down; the follower catches up.
    TransactionAcrossSubjectsWhileAFollowerRestarts,
    /// A message refused twice goes to the dead-letter stream.
    DeadLetterAfterMaxDeliver,
    /// A follower down while the leader snapshots and purges catches up by snapshot.
    SnapshotCatchUp,
    /// Every node loses power; acknowledged messages survive.
    PowerFailure,
    /// A node joins, and another leaves.
    MembershipChange,
    /// A stream at its limit cannot drop what a registered peer has not received: publishes are refused until the
    /// peer reports progress, and then the messages it has go.
    RetentionBlockedByALaggingPeer,
    /// Two cells, alpha and bravo, cut apart: alpha's sealed mail waits in its outbox and is retried; after the heal
    /// it is delivered, verified and stored once, and each recipient's result is recorded.
    SealedMailAcrossAHealingPartition,
    /// Principals with grants and tokens: a publish outside its principal's grants and an ack of another principal's
    /// consumer are refused and change nothing; a forged sender is overwritten; a revoked token stops working.
    GrantsAndTokens,
    /// A cooperative-sticky consumer group of two members over four partitions takes a third: only the partition that
    /// moves is revoked, released by its owner and granted to the newcomer a generation later; the others keep
    /// fetching throughout, and a stale generation's ack is refused.
    CooperativeRebalance,
    /// A directory and two cells, east and west: a stream placed on east moves to west between two runs of
    /// publishes. West receives it, east is fenced and answers where its log ends, the messages are copied at their
    /// positions, west accepts, and the directory records the move done; a client whose route is stale is refused
    /// by east with MOVED and sent on to west, where its ids still deduplicate.
    StreamMovedBetweenCells,
}

/// Every scenario.
pub const ALL: [Scenario; 12] = [
    Scenario::LeaderFailoverDuringBatchPublish,
    Scenario::ZombieProducerFenced,
    Scenario::TransactionAcrossSubjectsWhileAFollowerRestarts,
    Scenario::DeadLetterAfterMaxDeliver,
    Scenario::SnapshotCatchUp,
    Scenario::PowerFailure,
    Scenario::MembershipChange,
    Scenario::RetentionBlockedByALaggingPeer,
    Scenario::SealedMailAcrossAHealingPartition,
    Scenario::GrantsAndTokens,
    Scenario::CooperativeRebalance,
    Scenario::StreamMovedBetweenCells,
];

/// The seed every scenario runs at.
pub const SEED: u64 = 1;
const STREAM: &str = "orders";

impl Scenario {
    /// Its name, as its snapshot is named.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::LeaderFailoverDuringBatchPublish => "leader_failover_during_batch_publish",
            Scenario::ZombieProducerFenced => "zombie_producer_fenced",
            Scenario::TransactionAcrossSubjectsWhileAFollowerRestarts => {
                "transaction_across_subjects_while_a_follower_restarts"
            }
            Scenario::DeadLetterAfterMaxDeliver => "dead_letter_after_max_deliver",
            Scenario::SnapshotCatchUp => "snapshot_catch_up",
            Scenario::PowerFailure => "power_failure",
            Scenario::MembershipChange => "membership_change",
            Scenario::RetentionBlockedByALaggingPeer => "retention_blocked_by_a_lagging_peer",
            Scenario::SealedMailAcrossAHealingPartition => "sealed_mail_across_a_healing_partition",
            Scenario::GrantsAndTokens => "grants_and_tokens",
            Scenario::CooperativeRebalance => "cooperative_rebalance",
            Scenario::StreamMovedBetweenCells => "stream_moved_between_cells",
        }
    }

    /// Runs it at [`SEED`] and returns the rendered trace.
    ///
    /// Each run gets a thread of its own: OpenSSL keeps a random generator per thread, made on the thread's first
    /// use, and making it draws on the simulation's randomness. On a fresh thread every run draws the same.
    pub fn trace(self) -> String {
        cellog_sim::seed_openssl_outside_the_simulation();
        std::thread::spawn(move || self.run()).join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    fn run(self) -> String {
        let runtime = madsim::runtime::Runtime::with_seed_and_config(SEED, madsim::Config::default());
        runtime.block_on(async move {
            let replay = format!(
                "RUSTFLAGS=\"--cfg madsim\" cargo test --profile sim -p cellog-golden --test golden -- {}",
                self.name()
            );
            if self == Scenario::SealedMailAcrossAHealingPartition {
                let timing = RaftTiming { snapshot_every: SIM_SNAPSHOT_EVERY, ..RaftTiming::default() };
                let mut cluster = Cluster::with_cells(&[("alpha", 3), ("bravo", 3)], timing, true);
                cluster.set_replay(replay);
                sealed_mail(&cluster).await;
                cluster.converge_in("alpha").await;
                cluster.converge_in("bravo").await;
                return cluster.trace().render();
            }
            if self == Scenario::StreamMovedBetweenCells {
                let timing = RaftTiming { snapshot_every: SIM_SNAPSHOT_EVERY, ..RaftTiming::default() };
                let mut cluster = Cluster::with_cells(&[("directory", 3), ("east", 3), ("west", 3)], timing, false);
                cluster.set_replay(replay);
                stream_moved_between_cells(&cluster).await;
                for cell in ["directory", "east", "west"] {
                    cluster.converge_in(cell).await;
                }
                return cluster.trace().render();
            }
            let snapshot_every = if self == Scenario::SnapshotCatchUp { 20 } else { SIM_SNAPSHOT_EVERY };
            let mut cluster = Cluster::with_snapshot_every(3, snapshot_every);
            cluster.set_replay(replay);
            setup(&cluster, self == Scenario::DeadLetterAfterMaxDeliver).await;
            self.play(&mut cluster).await;
            cluster.converge().await;
            cluster.trace().render()
        })
    }

    async fn play(self, cluster: &mut Cluster) {
        match self {
            Scenario::LeaderFailoverDuringBatchPublish => {
                let mut producer = Producer::new(&*cluster, "producer");
                let batch = cluster.spawn_on_client(async move {
                    producer.publish((0..40).map(|index| message("orders.created", "m", index)).collect(), 8).await
                });
                tokio::time::sleep(Duration::from_millis(30)).await;
                let leader = cluster.wait_leader().await;
                cluster.node(leader).crash();
                let acked = batch.await.expect("the batch finished");
                assert_eq!(acked.len(), 40, "every message of the batch is acknowledged");
                cluster.node(leader).restart();
                check(cluster).await;
            }
            Scenario::ZombieProducerFenced => {
                let mut zombie = TxnProducer::new(&*cluster, "zombie", "worker");
                let mut successor = TxnProducer::new(&*cluster, "successor", "worker");
                cluster
                    .on_client(async move {
                        zombie.init().await.expect("the first instance");
                        zombie.begin().await.expect("begun");
                        zombie.publish(message("orders.created", "zombie", 0)).await.expect("staged");
                        successor.init().await.expect("the successor fences it");
                        successor.begin().await.expect("begun");
                        successor.publish(message("orders.created", "successor", 0)).await.expect("staged");
                        successor.commit().await.expect("committed");
                        let fenced = zombie.commit().await.expect_err("the zombie is fenced");
                        assert_eq!(fenced.reason(), Some("FENCED"));
                    })
                    .await;
            }
            Scenario::TransactionAcrossSubjectsWhileAFollowerRestarts => {
                let leader = cluster.wait_leader().await;
                let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
                let mut txn = TxnProducer::new(&*cluster, "txn", "orders-txn");
                let mut txn = cluster
                    .on_client(async move {
                        txn.init().await.expect("a producer");
                        txn.begin().await.expect("begun");
                        txn
                    })
                    .await;
                cluster.node(follower).crash();
                let committed = cluster
                    .on_client(async move {
                        for (index, subject) in ["orders.created", "orders.paid"].into_iter().enumerate() {
                            txn.publish(message(subject, "t", index)).await.expect("staged");
                        }
                        txn.prepare().await.expect("prepared");
                        txn.commit().await.expect("committed")
                    })
                    .await;
                assert_eq!(committed.messages.len(), 2);
                cluster.node(follower).restart();
            }
            Scenario::DeadLetterAfterMaxDeliver => {
                let producer = Producer::new(&*cluster, "producer");
                cluster
                    .on_client(async move { producer.publish_one(message("orders.created", "m", 0)).await })
                    .await
                    .expect("published");
                let refuse = Behaviour { ack_percent: 0, nack_percent: 100 };
                let rng = cluster.seeds().rng(cellog_sim::seeds::Concern::Workload);
                let mut consumer = Consumer::new(&*cluster, "consumer", (STREAM, "billing"), refuse, rng);
                cluster
                    .on_client(async move {
                        for _ in 0..10 {
                            consumer.round(1).await;
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                    })
                    .await;
                let client = cluster.client();
                let dead =
                    cluster.on_client(async move { client.read("dead", 0, 1, 10, false).await.expect("a read") }).await;
                assert_eq!(dead.messages.len(), 1, "the message went to the dead-letter stream");
            }
            Scenario::SnapshotCatchUp => {
                let leader = cluster.wait_leader().await;
                let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
                cluster.node(follower).crash();
                let producer = Producer::new(&*cluster, "producer");
                cluster
                    .on_client(async move {
                        for index in 0..50 {
                            producer.publish_one(message("orders.created", "m", index)).await.expect("published");
                        }
                    })
                    .await;
                cluster.node(follower).restart();
                check(cluster).await;
            }
            Scenario::PowerFailure => {
                let mut producer = Producer::new(&*cluster, "producer");
                cluster
                    .on_client(async move {
                        producer.publish((0..10).map(|index| message("orders.created", "m", index)).collect(), 4).await
                    })
                    .await;
                cluster.power_fail();
                tokio::time::sleep(Duration::from_millis(500)).await;
                for node in cluster.ids() {
                    cluster.node(node).restart();
                }
                cluster.wait_leader().await;
                check(cluster).await;
            }
            Scenario::MembershipChange => {
                let joined = cluster.add_node().await;
                let leader = cluster.wait_leader().await;
                let leaving = cluster.ids().into_iter().find(|&id| id != leader && id != joined).expect("a node");
                cluster.remove_node(leaving).await;
                let producer = Producer::new(&*cluster, "producer");
                cluster
                    .on_client(async move { producer.publish_one(message("orders.created", "m", 0)).await })
                    .await
                    .expect("published");
            }
            Scenario::SealedMailAcrossAHealingPartition => unreachable!("played by `sealed_mail`"),
            Scenario::StreamMovedBetweenCells => unreachable!("played by `stream_moved_between_cells`"),
            Scenario::GrantsAndTokens => grants_and_tokens(cluster).await,
            Scenario::CooperativeRebalance => cooperative_rebalance(cluster).await,
            Scenario::RetentionBlockedByALaggingPeer => {
                let client = cluster.client();
                let producer = Producer::new(&*cluster, "producer");
                let kept = cluster
                    .on_client(async move {
                        let feed = v1::StreamConfig {
                            subjects: vec!["feed.>".to_string()],
                            max_messages: Some(3),
                            ..v1::StreamConfig::default()
                        };
                        client.create_stream("feed", feed).await.expect("the feed");
                        client.register_peer("feed", "mirror").await.expect("the mirror registered");
                        for index in 0..3 {
                            producer.publish_one(message("feed.a", "f", index)).await.expect("published");
                        }
                        // Full, and the oldest message is one the mirror lacks: the next publish is refused with
                        // STORAGE_FULL naming the mirror, and the client tries again after the advised second.
                        let blocked = tokio::spawn({
                            let producer = producer.clone();
                            async move { producer.publish_one(message("feed.a", "f", 3)).await }
                        });
                        tokio::time::sleep(Duration::from_millis(1_500)).await;
                        client.peer_progress("feed", "mirror", 0, 2).await.expect("the mirror has 1 and 2");
                        blocked.await.expect("joined").expect("published once the mirror caught up");
                        let read = client.read("feed", 0, 1, 10, false).await.expect("a read");
                        read.messages.iter().map(|m| m.seq).collect::<Vec<u64>>()
                    })
                    .await;
                assert_eq!(kept, vec![2, 3, 4], "only the oldest message the mirror has is gone");
            }
        }
    }
}

/// Alpha sends two envelopes to bravo while the cells are cut apart, and the heal lets them through.
async fn sealed_mail(cluster: &Cluster) {
    cluster.wait_leader_in("alpha").await;
    cluster.wait_leader_in("bravo").await;
    let (alpha_ids, bravo_ids) = (cluster.ids_in("alpha"), cluster.ids_in("bravo"));
    cluster.partition(&alpha_ids, &bravo_ids);
    let alpha = cluster.client_in("alpha");
    let client = alpha.clone();
    cluster
        .on_client(async move {
            for index in 0..2 {
                let payload = Bytes::from(format!("note {index}"));
                client
                    .send_sealed(&["bravo".to_string()], payload, Some(&format!("note-{index}")))
                    .await
                    .expect("sent");
            }
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.heal();
    let delivered = cluster
        .on_client(async move {
            for _ in 0..300 {
                let mut delivered = 0;
                for index in 0..2 {
                    delivered += alpha.delivery_status(&format!("note-{index}")).await.expect("a status").delivered;
                }
                if delivered == 2 {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            false
        })
        .await;
    assert!(delivered, "both envelopes are delivered after the heal");
}

/// The principals' tokens: fixed, so that the trace names the same token hashes every run.
const ALICE_TOKEN: &str = "cellog_alice-of-the-grants-scenario-0000000000000000";
const BOB_TOKEN: &str = "cellog_bob-of-the-grants-scenario-11111111111111111111";

async fn grants_and_tokens(cluster: &Cluster) {
    // The simulated nodes serve callers without a credential as root: the harness is root.
    let root = cluster.client();
    let alice = cluster.client_with(|options| options.token = Some(ALICE_TOKEN.to_string()));
    let bob = cluster.client_with(|options| options.token = Some(BOB_TOKEN.to_string()));
    cluster
        .on_client(async move {
            let consumer = v1::ConsumerConfig { ack_wait_ms: Some(60_000), ..v1::ConsumerConfig::default() };
            root.create_consumer(STREAM, "billing", consumer).await.expect("the consumer");
            let grants = |publish: &str, consume: &[&str]| v1::Grants {
                publish: vec![publish.to_string()],
                subscribe: vec!["orders.>".to_string()],
                consume: consume.iter().map(|c| c.to_string()).collect(),
                ..v1::Grants::default()
            };
            root.put_principal("alice", grants("orders.eu.*", &["orders/billing"])).await.expect("alice");
            root.add_token("alice", token::hash(ALICE_TOKEN)).await.expect("alice's token");
            root.put_principal("bob", grants("orders.us.*", &[])).await.expect("bob");
            root.add_token("bob", token::hash(BOB_TOKEN)).await.expect("bob's token");

            // A header named like the node's, in any case, is refused: the sender is the cell's to stamp.
            let mut forged = message("orders.eu.1", "alice", 0);
            forged.headers.insert("cellog-sender".to_string(), "root".to_string());
            let refused = alice.publish(forged).await.expect_err("a forged sender");
            assert_eq!(refused.reason(), Some("PERMISSION_DENIED"));
            let ack = alice.publish(message("orders.eu.1", "alice", 0)).await.expect("inside alice's grants");
            let refused = bob.publish(message("orders.eu.2", "bob", 0)).await.expect_err("outside bob's grants");
            assert_eq!(refused.reason(), Some("PERMISSION_DENIED"));
            let read = root.read(STREAM, ack.partition, ack.seq, 1, false).await.expect("read");
            let sender = read.messages[0].headers.get("Cellog-Sender").cloned().unwrap_or_default();
            cellog_sim::trace::harness(None, "read", &format!("orders/{}:{} sender={sender}", ack.partition, ack.seq));

            let delivered = alice.fetch(STREAM, "billing", "m", 1).await.expect("alice fetches");
            let first = delivered[0].message.as_ref().expect("a message");
            let item = v1::AckItem { partition: first.partition, seq: first.seq, ..v1::AckItem::default() };
            let bobs = bob.ack(STREAM, "billing", vec![item]).await.expect("an answer");
            assert!(matches!(bobs[0].result, Some(v1::ack_result::Result::Error(_))), "bob may not ack: {bobs:?}");
            let alices = alice.ack(STREAM, "billing", vec![item]).await.expect("an answer");
            assert!(matches!(alices[0].result, Some(v1::ack_result::Result::State(_))), "{alices:?}");

            root.revoke_token(token::hash(BOB_TOKEN)).await.expect("revoked");
            let refused = bob.publish(message("orders.us.1", "bob", 1)).await.expect_err("a revoked token");
            assert_eq!(refused.reason(), Some("UNAUTHENTICATED"));
        })
        .await;
}

/// Publishes keyed messages to a four-partition stream, then: members a and b share it, c joins, and only what moves
/// to c pauses.
async fn cooperative_rebalance(cluster: &Cluster) {
    use cellog_client::group::{GroupMember, MemberOptions, Quiet};
    let client = cluster.client();
    let (a_client, b_client, c_client) = (cluster.client(), cluster.client(), cluster.client());
    cluster
        .on_client(async move {
            let jobs = v1::StreamConfig { subjects: vec!["jobs.>".to_string()], partitions: 4, ..Default::default() };
            client.create_stream("jobs", jobs).await.expect("the stream");
            for index in 0..8 {
                let mut request = message(&format!("jobs.{index}"), "j", index);
                request.key = Some(Bytes::from(format!("customer-{index}")));
                client.publish(request).await.expect("published");
            }
            let options = MemberOptions { session_timeout: Duration::from_secs(10), ..MemberOptions::default() };
            let join = |client, name: &'static str| {
                let options = options.clone();
                async move { GroupMember::join(client, "jobs", "workers", name, options, &mut Quiet).await }
            };
            let mut a = join(a_client, "a").await.expect("a joins");
            let mut b = join(b_client, "b").await.expect("b joins");
            for _ in 0..3 {
                a.heartbeat(&mut Quiet).await.expect("a's heartbeat");
                b.heartbeat(&mut Quiet).await.expect("b's heartbeat");
            }
            let owned = |m: &GroupMember| m.partitions().iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            cellog_sim::trace::harness(None, "group", &format!("settled a={} b={}", owned(&a), owned(&b)));
            let (a_before, generation_before) = (a.partitions().clone(), a.generation().min(b.generation()));
            let mut c = join(c_client, "c").await.expect("c joins");
            // a and b still fetch at their generations: what did not move keeps flowing.
            let fetched = a.fetch(8, &mut Quiet).await.expect("a fetches").len()
                + b.fetch(8, &mut Quiet).await.expect("b fetches").len();
            cellog_sim::trace::harness(None, "group", &format!("fetched {fetched} while c waited"));
            for _ in 0..3 {
                a.heartbeat(&mut Quiet).await.expect("a's heartbeat");
                b.heartbeat(&mut Quiet).await.expect("b's heartbeat");
                c.heartbeat(&mut Quiet).await.expect("c's heartbeat");
            }
            cellog_sim::trace::harness(None, "group", &format!("a={} b={} c={}", owned(&a), owned(&b), owned(&c)));
            // An ack at a generation from before c joined, for a partition now c's, is refused.
            let moved = *c.partitions().iter().next().expect("c owns a partition");
            let stale_owner = if a_before.contains(&moved) { "a" } else { "b" };
            let item = v1::AckItem { partition: moved, seq: 1, ..v1::AckItem::default() };
            let refused = client
                .member_ack("jobs", "workers", stale_owner, generation_before, vec![item])
                .await
                .expect("an answer");
            let reason = match &refused[0].result {
                Some(v1::ack_result::Result::Error(error)) => error.detail.clone().unwrap_or_default().reason,
                other => format!("{other:?}"),
            };
            cellog_sim::trace::harness(None, "group", &format!("stale ack of partition {moved}: {reason}"));
        })
        .await;
}

async fn stream_moved_between_cells(cluster: &Cluster) {
    for cell in ["directory", "east", "west"] {
        cluster.wait_leader_in(cell).await;
    }
    let (directory, east) = (cluster.client_in("directory"), cluster.client_in("east"));
    let addresses: Vec<(&str, Vec<String>)> =
        ["east", "west"].into_iter().map(|cell| (cell, cluster.addresses_in(cell))).collect();
    let cells = cellog_client::Cells::new(directory.clone(), cellog_client::ClientOptions::default());
    let mover = cellog_client::Cells::new(directory.clone(), cellog_client::ClientOptions::default());
    cluster
        .on_client(async move {
            for (cell, addresses) in addresses {
                directory.put_cell(cell, addresses).await.expect("cell recorded");
            }
            let config = v1::StreamConfig { subjects: vec!["orders.>".to_string()], ..v1::StreamConfig::default() };
            east.create_stream(STREAM, config).await.expect("the stream");
            directory.place_stream(STREAM, "east").await.expect("placed on east");
            for index in 0..6 {
                cells.publish(STREAM, message("orders.created", "m", index)).await.expect("published on east");
            }
            let moved = mover.move_stream(STREAM, "west").await.expect("moved");
            let note = format!("{STREAM} epoch={} copied={} through={:?}", moved.epoch, moved.copied, moved.through);
            cellog_sim::trace::harness(None, "moved", &note);
            // The first client still routes to east: refused there with MOVED, sent on to west.
            for index in 6..9 {
                cells.publish(STREAM, message("orders.created", "m", index)).await.expect("published on west");
            }
            let again = cells.publish(STREAM, message("orders.created", "m", 2)).await.expect("a repeat");
            assert!(again.duplicate, "an id published on east is known on west: {again:?}");
        })
        .await;
}

fn message(subject: &str, prefix: &str, index: usize) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: subject.to_string(),
        payload: Bytes::from(format!("{prefix}-{index}")),
        msg_id: Some(format!("{prefix}-{index}")),
        ..v1::PublishRequest::default()
    }
}

async fn setup(cluster: &Cluster, with_dead_letters: bool) {
    cluster.wait_leader().await;
    let client = cluster.client();
    cluster
        .on_client(async move {
            let mut config = v1::StreamConfig { subjects: vec!["orders.>".to_string()], ..v1::StreamConfig::default() };
            if with_dead_letters {
                let dead = v1::StreamConfig { subjects: vec!["dead.>".to_string()], ..v1::StreamConfig::default() };
                client.create_stream("dead", dead).await.expect("the dead-letter stream");
                config.dead_letter_stream = Some("dead".to_string());
            }
            client.create_stream(STREAM, config).await.expect("the stream");
            if with_dead_letters {
                let consumer = v1::ConsumerConfig {
                    ack_wait_ms: Some(500),
                    max_deliver: Some(2),
                    ..v1::ConsumerConfig::default()
                };
                client.create_consumer(STREAM, "billing", consumer).await.expect("the consumer");
            }
        })
        .await;
}

async fn check(cluster: &Cluster) {
    cluster.check_acknowledged(STREAM, 1, |msg_id| Bytes::from(msg_id.to_string())).await;
}
