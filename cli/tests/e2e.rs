//! End to end over real loopback with three node processes: publish with ids, `kill -9` the leader mid-stream, keep
//! publishing through the client, restart the killed node; then every acknowledged message is stored exactly once at
//! one sequence on every node, and a consumer sees each at least once and, once acknowledged, never again.

// The node binary runs on RocksDB.
#![cfg(feature = "node")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use cellog_client::proto as v1;
use common::{cell, wait_converged, wait_for_leader};

const STREAM: &str = "E2E";
const N_MESSAGES: usize = 10_000;
const CHUNK: usize = 250;

fn message(index: usize) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: format!("e2e.k{}", index % 7),
        payload: Bytes::from(format!("payload-{index}")),
        msg_id: Some(format!("msg-{index}")),
        ..v1::PublishRequest::default()
    }
}

/// Every message on a node, read from its own replica: msg id → (partition, seq, payload).
async fn stored(node: &common::NodeProcess, partitions: u32) -> BTreeMap<String, Vec<(u32, u64, Bytes)>> {
    let client = node.client();
    let mut stored: BTreeMap<String, Vec<(u32, u64, Bytes)>> = BTreeMap::new();
    for partition in 0..partitions {
        let mut from = 1;
        loop {
            let response = client.read(STREAM, partition, from, 5_000, true).await.expect("a local read");
            let Some(last) = response.messages.last().map(|message| message.seq) else { break };
            for message in response.messages {
                let id = message.msg_id.clone().expect("every message has an id");
                stored.entry(id).or_default().push((message.partition, message.seq, message.payload));
            }
            from = last + 1;
        }
    }
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_publishes_survive_a_killed_leader_exactly_once() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut nodes = cell(dir.path(), "e2e", 3);
    for node in &mut nodes {
        node.start();
    }
    wait_for_leader(&nodes).await;
    let addrs: Vec<String> = nodes.iter().map(|node| node.client_addr.clone()).collect();
    let client = cellog_client::Client::new(addrs, common::quick()).expect("a client");
    let config = v1::StreamConfig { subjects: vec!["e2e.>".to_string()], partitions: 3, ..Default::default() };
    client.create_stream(STREAM, config).await.expect("stream created");
    let consumer = v1::ConsumerConfig { ack_wait_ms: Some(5_000), ..Default::default() };
    client.create_consumer(STREAM, "audit", consumer).await.expect("consumer created");

    // Publish from a task while the leader is killed a third of the way through, with batches in flight.
    let progress = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let (client, progress) = (client.clone(), progress.clone());
        tokio::spawn(async move {
            let mut acked: BTreeMap<String, (u32, u64)> = BTreeMap::new();
            let mut duplicates = 0;
            for start in (0..N_MESSAGES).step_by(CHUNK) {
                let requests: Vec<_> = (start..start + CHUNK).map(message).collect();
                for (offset, result) in client.publish_batch(requests, 64).await.into_iter().enumerate() {
                    let index = start + offset;
                    let ack = result.result.unwrap_or_else(|error| panic!("message {index} failed: {error}"));
                    duplicates += usize::from(ack.duplicate);
                    let previous = acked.insert(format!("msg-{index}"), (ack.partition, ack.seq));
                    assert!(previous.is_none(), "message {index} acknowledged twice");
                    progress.fetch_add(1, Ordering::Relaxed);
                }
            }
            (acked, duplicates)
        })
    };
    while progress.load(Ordering::Relaxed) < N_MESSAGES / 3 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let leader = wait_for_leader(&nodes).await;
    let killed = nodes.iter().position(|node| node.id == leader).expect("the leader is ours");
    nodes[killed].kill();
    let killed_at = progress.load(Ordering::Relaxed);
    let (acked, duplicates) = publisher.await.expect("the publisher finished");
    eprintln!("killed leader {leader} after {killed_at} acks; {duplicates} retried messages deduplicated");
    assert_eq!(acked.len(), N_MESSAGES);
    let positions: BTreeSet<(u32, u64)> = acked.values().copied().collect();
    assert_eq!(positions.len(), N_MESSAGES, "two acknowledged messages share a (partition, sequence)");

    // The killed node comes back on its data and catches up.
    nodes[killed].start();
    let (applied, digest) = wait_converged(&nodes).await;
    eprintln!("converged at index {applied} with digest {digest}");

    for node in &nodes {
        let stored = stored(node, 3).await;
        assert_eq!(stored.len(), N_MESSAGES, "node {} holds {} distinct ids", node.id, stored.len());
        for (id, (partition, seq)) in &acked {
            let copies = &stored[id];
            assert_eq!(copies.len(), 1, "node {}: {id} stored {} times: {copies:?}", node.id, copies.len());
            let (stored_partition, stored_seq, payload) = &copies[0];
            assert_eq!((stored_partition, stored_seq), (partition, seq), "node {}: {id} moved", node.id);
            let index: usize = id.trim_start_matches("msg-").parse().expect("an index");
            assert_eq!(payload, &message(index).payload, "node {}: {id} has the wrong body", node.id);
        }
    }

    // A consumer sees every message at least once, and never again once its ack was recorded.
    let mut seen: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut done: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut rounds = 0;
    while done.len() < N_MESSAGES {
        rounds += 1;
        assert!(rounds < 1_000, "the consumer stalled with {} of {N_MESSAGES} done", done.len());
        let deliveries = client.fetch(STREAM, "audit", "auditor", 500).await.expect("a fetch");
        let mut acks = Vec::new();
        for delivery in deliveries {
            let message = delivery.message.expect("a message");
            let at = (message.partition, message.seq);
            assert!(!done.contains(&at), "{at:?} was delivered again after its ack");
            seen.insert(at);
            acks.push(v1::AckItem { partition: at.0, seq: at.1, ..Default::default() });
        }
        let answered: Vec<(u32, u64)> = acks.iter().map(|ack| (ack.partition, ack.seq)).collect();
        let results = client.ack(STREAM, "audit", acks).await.expect("acks");
        for (at, result) in answered.into_iter().zip(results) {
            match result.result {
                Some(v1::ack_result::Result::State(_)) => {
                    done.insert(at);
                }
                other => panic!("ack of {at:?} failed: {other:?}"),
            }
        }
    }
    assert_eq!(seen, positions, "the consumer saw exactly the acknowledged messages");

    // A graceful stop exits 0, and the node keeps its data.
    let last = nodes.len() - 1;
    assert!(nodes[last].terminate(), "SIGTERM exits 0:\n{}", nodes[last].log_text());
    nodes[last].start();
    wait_converged(&nodes).await;
    assert_eq!(stored(&nodes[last], 3).await.len(), N_MESSAGES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cellog_dev_runs_a_cell_and_comes_back_with_its_data() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let base_port = common::free_base_port();
    let (mut child, lines) = common::dev(dir.path(), base_port);
    assert_eq!(lines.iter().filter(|line| line.trim_start().starts_with("node ")).count(), 3, "{lines:?}");
    let addrs: Vec<String> = (1..=3).map(|i| format!("127.0.0.1:{}", base_port + i)).collect();
    // The dev cell made its root token in its data directory; a call without it is refused.
    let token = std::fs::read_to_string(dir.path().join("root.token")).expect("the dev cell's root token");
    let anonymous = cellog_client::Client::new(
        addrs.clone(),
        cellog_client::ClientOptions {
            tls: Some(cellog_client::ClientTls {
                ca_pem: std::fs::read(dir.path().join("certs").join("ca.pem")).expect("the dev cell's CA"),
                identity: None,
            }),
            ..common::quick()
        },
    )
    .expect("a client");
    let refused = anonymous.list_streams().await.expect_err("no credential");
    assert_eq!(refused.reason(), Some("UNAUTHENTICATED"), "{refused}");
    // ... and it serves over TLS under the CA it made.
    let ca_pem = std::fs::read(dir.path().join("certs").join("ca.pem")).expect("the dev cell's CA");
    let tls = cellog_client::ClientTls { ca_pem, identity: None };
    let plaintext = cellog_client::ClientOptions { token: Some(token.trim().to_string()), ..common::quick() };
    let options = cellog_client::ClientOptions { tls: Some(tls), ..plaintext.clone() };
    let brief = cellog_client::ClientOptions { retry_for: std::time::Duration::from_millis(300), ..plaintext };
    let probe = cellog_client::Client::new(addrs.clone(), brief).expect("a client");
    assert!(probe.list_streams().await.is_err(), "plaintext to a TLS port gets nowhere");
    let client = cellog_client::Client::new(addrs.clone(), options.clone()).expect("a client");
    client
        .create_stream("kept", v1::StreamConfig { subjects: vec!["kept.>".into()], ..Default::default() })
        .await
        .expect("created");
    let ack = client.publish(message(1)).await;
    assert!(ack.is_err(), "e2e.> belongs to no stream here");
    let ack = client
        .publish(v1::PublishRequest {
            subject: "kept.1".into(),
            payload: Bytes::from_static(b"kept"),
            ..Default::default()
        })
        .await
        .expect("published");
    assert!(common::terminate(&mut child).success(), "Ctrl-C/SIGTERM exits 0");

    let (mut child, _) = common::dev(dir.path(), base_port);
    let client = cellog_client::Client::new(addrs, options).expect("a client");
    let messages = client.read("kept", ack.partition, ack.seq, 1, false).await.expect("read").messages;
    assert_eq!(messages[0].payload, Bytes::from_static(b"kept"), "the message survived the restart");
    assert!(common::terminate(&mut child).success());
}

/// A node whose identity says it was a voter but whose store is gone lost its disk: it must not vote or lead on an
/// empty log (here, alone, it would "win" at once and serve an empty cell); it waits to repair from a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_that_lost_its_disk_does_not_lead_an_empty_cell() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut nodes = cell(dir.path(), "lost", 1);
    let node = &mut nodes[0];
    node.start();
    wait_for_leader(std::slice::from_ref(node)).await;
    let client = node.client();
    let config = v1::StreamConfig { subjects: vec!["lost.>".to_string()], ..Default::default() };
    client.create_stream("LOST", config).await.expect("a stream");
    let identity = dir.path().join("node-1").join("IDENTITY");
    for _ in 0..200 {
        if std::fs::read_to_string(&identity).unwrap_or_default().contains("member=yes") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let recorded = std::fs::read_to_string(&identity).expect("an identity");
    assert!(recorded.contains("member=yes"), "membership recorded: {recorded}");
    let cell_id = recorded.lines().find_map(|line| line.strip_prefix("cell_id=")).expect("the cell's id recorded");
    assert!(cell_id.len() == 32 && cell_id.chars().all(|c| c.is_ascii_hexdigit()), "{cell_id}");

    node.kill();
    std::fs::remove_dir_all(dir.path().join("node-1").join("store")).expect("the disk is lost");
    node.start();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let status = node.client().cluster_status().await.expect("the node answers");
    assert!(status.repairing, "{status:?}");
    assert_ne!(status.state, "Leader", "{status:?}");
    assert!(node.log_text().contains("lost disk"), "{}", node.log_text());
    assert!(std::fs::read_to_string(&identity).expect("an identity").contains(cell_id), "the cell's id is kept");
}

/// The operator's commands for bounds, against a dev cell: a stream's limits and rate changed from the command line,
/// a tenant's quotas set and listed, and every certificate the CA issued to a principal revoked by name. And the
/// status an operator polls, which hashes the whole state only when asked to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sets_limits_quotas_and_revokes_certificates_from_the_command_line() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let base_port = common::free_base_port();
    let (mut child, _) = common::dev(dir.path(), base_port);
    let certs = dir.path().join("certs");
    let server = format!("127.0.0.1:{}", base_port + 1);
    let cellog = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_cellog"))
            .args(args)
            .args(["--server", &server, "--ca", &certs.join("ca.pem").display().to_string()])
            .args(["--token-file", &dir.path().join("root.token").display().to_string()])
            .output()
            .expect("cellog runs");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "cellog {args:?}: {text}{}", String::from_utf8_lossy(&output.stderr));
        text
    };
    cellog(&["stream", "add", "logs", "--subjects", "logs.>"]);
    let updated = cellog(&["stream", "update", "logs", "--max-msgs", "10", "--rate", "100", "--burst", "200"]);
    assert!(updated.contains("rate         100/s, burst 200"), "{updated}");
    let info = cellog(&["stream", "info", "logs"]);
    assert!(info.contains("max msgs     10"), "{info}");
    let cleared = cellog(&["stream", "update", "logs", "--clear", "rate,msgs"]);
    assert!(cleared.contains("rate         none") && cleared.contains("max msgs     none"), "{cleared}");

    let set = cellog(&["quota", "set", "--tenant", "acme", "--max-msgs", "3", "--max-streams", "2"]);
    assert!(set.contains("quotas of tenant acme set: max streams 2, max msgs 3"), "{set}");
    let listed = cellog(&["quota", "ls"]);
    assert!(
        listed.lines().any(|line| line.trim_start().starts_with("acme") && line.contains("max msgs 3")),
        "{listed}"
    );

    let certs_dir = certs.display().to_string();
    for _ in 0..2 {
        let issued = std::process::Command::new(env!("CARGO_BIN_EXE_cellog"))
            .args(["certs", "issue", "client", "--principal", "acme/ops", "--dir", &certs_dir, "--days", "7"])
            .output()
            .expect("cellog runs");
        assert!(issued.status.success(), "{}", String::from_utf8_lossy(&issued.stderr));
        std::fs::remove_file(certs.join("acme.ops.pem")).expect("issued");
        std::fs::remove_file(certs.join("acme.ops.key")).expect("issued");
    }
    let revoked = cellog(&["certs", "revoke", "--principal", "acme/ops", "--dir", &certs_dir]);
    assert_eq!(revoked.lines().filter(|line| line.ends_with(") revoked")).count(), 2, "{revoked}");
    let remembered = cellog(&["certs", "revoked"]);
    assert_eq!(remembered.lines().filter(|line| line.contains("principal/acme/ops")).count(), 2, "{remembered}");

    let status = cellog(&["cluster", "status"]);
    assert!(status.contains("leader node") && !status.contains("state digest"), "{status}");
    let compared = cellog(&["cluster", "status", "--digest"]);
    assert!(compared.contains("state digest "), "{compared}");
    assert!(common::terminate(&mut child).success());
}
