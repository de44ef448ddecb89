//! Whole cells in deterministic simulation: each scenario runs the production node code under faults and checks that
//! no acknowledged publish is lost or duplicated and that the replicas end equal.
//! Run with `RUSTFLAGS="--cfg madsim" cargo test -p cellog-sim`; a failure prints its seed (`MADSIM_TEST_SEED`).

#![cfg(madsim)]

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use cellog_net::Client;
use cellog_net::proto as v1;
use cellog_sim::Cluster;

const STREAM: &str = "orders";
const PARTITIONS: u32 = 2;

fn message(prefix: &str, index: usize) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: format!("orders.{}", index % 5),
        payload: Bytes::from(format!("{prefix}-{index}")),
        msg_id: Some(format!("{prefix}-{index}")),
        ..v1::PublishRequest::default()
    }
}

/// Where each acknowledged message landed: msg id → (partition, seq).
type Acked = BTreeMap<String, (u32, u64)>;

async fn setup(cluster: &Cluster) {
    cluster.wait_leader().await;
    let client = cluster.client();
    cluster
        .on_client(async move {
            let config = v1::StreamConfig {
                subjects: vec!["orders.>".to_string()],
                partitions: PARTITIONS,
                ..v1::StreamConfig::default()
            };
            client.create_stream(STREAM, config).await.expect("stream created");
        })
        .await;
}

/// Publishes `n` messages with ids in batches; every one must be acknowledged (the client retries through faults).
async fn publish(client: Client, prefix: &'static str, n: usize) -> Acked {
    let mut acked = Acked::new();
    for start in (0..n).step_by(50) {
        let requests: Vec<_> = (start..(start + 50).min(n)).map(|index| message(prefix, index)).collect();
        for (offset, result) in client.publish_batch(requests, 16).await.into_iter().enumerate() {
            let id = format!("{prefix}-{}", start + offset);
            let ack = result.result.unwrap_or_else(|error| panic!("{id} not acknowledged: {error}"));
            assert!(acked.insert(id.clone(), (ack.partition, ack.seq)).is_none(), "{id} acknowledged twice");
        }
    }
    acked
}

/// Every running node holds every acknowledged message exactly once, where it was acknowledged, with its body.
async fn check(cluster: &Cluster, acked: &Acked) {
    cluster.converge().await;
    for id in cluster.running() {
        let client = cluster.client_of(id);
        let stored: BTreeMap<String, Vec<(u32, u64, Bytes)>> = cluster
            .on_client(async move {
                let mut stored: BTreeMap<String, Vec<(u32, u64, Bytes)>> = BTreeMap::new();
                for partition in 0..PARTITIONS {
                    let mut from = 1;
                    loop {
                        let response = client.read(STREAM, partition, from, 1000, true).await.expect("a local read");
                        let Some(last) = response.messages.last().map(|message| message.seq) else { break };
                        for message in response.messages {
                            let key = message.msg_id.clone().expect("an id");
                            stored.entry(key).or_default().push((message.partition, message.seq, message.payload));
                        }
                        from = last + 1;
                    }
                }
                stored
            })
            .await;
        for (msg_id, &(partition, seq)) in acked {
            let copies = stored.get(msg_id).unwrap_or_else(|| panic!("node {id} lost acknowledged {msg_id}"));
            assert_eq!(copies.len(), 1, "node {id} holds {msg_id} {} times", copies.len());
            assert_eq!((copies[0].0, copies[0].1), (partition, seq), "node {id} holds {msg_id} elsewhere");
            assert_eq!(copies[0].2, Bytes::from(msg_id.clone()), "node {id} holds {msg_id} with another body");
        }
        // Unacknowledged ids may exist (their acks were lost) but never twice.
        for (msg_id, copies) in &stored {
            assert_eq!(copies.len(), 1, "node {id} holds {msg_id} {} times", copies.len());
        }
    }
}

#[madsim::test]
async fn isolated_leader_is_replaced_and_catches_up_after_the_heal() {
    let mut cluster = Cluster::new(3, 1);
    setup(&cluster).await;
    let mut acked = cluster.on_client(publish(cluster.client(), "before", 100)).await;
    let old = cluster.wait_leader().await;
    cluster.isolate(old);
    acked.extend(cluster.on_client(publish(cluster.client(), "during", 100)).await);
    let new = cluster.wait_leader().await;
    assert_ne!(old, new, "a new leader was elected");
    cluster.heal();
    acked.extend(cluster.on_client(publish(cluster.client(), "after", 50)).await);
    check(&cluster, &acked).await;
    let _ = &mut cluster;
}

#[madsim::test]
async fn a_follower_and_then_the_leader_crash_and_restart_mid_load() {
    let mut cluster = Cluster::new(3, 2);
    setup(&cluster).await;
    let load = cluster.client();
    let publisher = cluster.spawn_on_client(async move { publish(load, "load", 600).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = cluster.wait_leader().await;
    let follower = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
    cluster.crash(follower);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart(follower);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = cluster.wait_leader().await;
    cluster.crash(leader);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart(leader);
    let acked = publisher.await.expect("the publisher finished");
    check(&cluster, &acked).await;
}

#[madsim::test]
async fn acknowledged_publishes_survive_a_whole_cell_power_failure() {
    let mut cluster = Cluster::new(3, 3);
    setup(&cluster).await;
    let acked = cluster.on_client(publish(cluster.client(), "durable", 300)).await;
    // More publishes in flight when the power goes: they may vanish, but never half-appear.
    let load = cluster.client();
    let in_flight = cluster.spawn_on_client(async move {
        let requests: Vec<_> = (0..100).map(|index| message("in-flight", index)).collect();
        load.publish_batch(requests, 16).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    cluster.power_fail();
    in_flight.abort();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for id in cluster.ids() {
        cluster.restart(id);
    }
    cluster.wait_leader().await;
    check(&cluster, &acked).await;
}

/// Publishes `n` messages one at a time, so each is its own log entry.
async fn publish_one_by_one(client: Client, prefix: &'static str, n: usize) -> Acked {
    let mut acked = Acked::new();
    for index in 0..n {
        let id = format!("{prefix}-{index}");
        let ack = client.publish(message(prefix, index)).await.unwrap_or_else(|error| panic!("{id}: {error}"));
        acked.insert(id, (ack.partition, ack.seq));
    }
    acked
}

#[madsim::test]
async fn a_node_far_behind_catches_up_by_snapshot_and_one_close_behind_by_the_log() {
    use cellog_raft::storage::Space;
    let mut cluster = Cluster::new(3, 4);
    setup(&cluster).await;
    let leader = cluster.wait_leader().await;
    let followers: Vec<_> = cluster.ids().into_iter().filter(|&id| id != leader).collect();
    let (far, close) = (followers[0], followers[1]);

    cluster.crash(far);
    let far_last = cluster.disk(far).keys(Space::Log).last().copied().unwrap_or_default();
    let mut acked = cluster.on_client(publish_one_by_one(cluster.client(), "gap", 1800)).await;
    let leader_first = cluster.disk(leader).keys(Space::Log).first().copied().unwrap_or_default();
    assert!(leader_first > far_last + 1, "the leader purged its log past the far node ({leader_first} > {far_last})");
    cluster.restart(far);
    check(&cluster, &acked).await;

    cluster.crash(close);
    acked.extend(cluster.on_client(publish_one_by_one(cluster.client(), "small-gap", 20)).await);
    cluster.restart(close);
    check(&cluster, &acked).await;
}

#[madsim::test]
async fn a_flipped_bit_in_a_stored_entry_is_detected_and_repaired() {
    use cellog_raft::storage::Space;
    let mut cluster = Cluster::new(3, 5);
    setup(&cluster).await;
    let acked = cluster.on_client(publish(cluster.client(), "flip", 200)).await;
    let leader = cluster.wait_leader().await;
    let victim = cluster.ids().into_iter().find(|&id| id != leader).expect("a follower");
    cluster.crash(victim);
    let keys = cluster.disk(victim).keys(Space::Log);
    let key = keys[keys.len() / 2];
    assert!(cluster.disk(victim).flip_bit(Space::Log, key, 77), "entry {key} exists");
    cluster.restart(victim);
    // The victim cuts its log at the damaged entry, refuses to vote until it has it back, and gets it from the leader.
    check(&cluster, &acked).await;
    // It votes again once a leader has brought its log past its old end, idle cell or not.
    let victim_client = cluster.client_of(victim);
    cluster
        .on_client(async move {
            for _ in 0..100 {
                let status = victim_client.cluster_status().await.expect("status");
                if !status.repairing {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the victim is still repairing after 10 s");
        })
        .await;
}
