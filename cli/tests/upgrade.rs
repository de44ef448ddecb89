//! A node comes up over a data directory written by an earlier build, with everything in it: a snapshot, the log
//! after it, the bodies, a consumer's acknowledgements and the dedup index.
//!
//! The fixture under `tests/fixtures/data-format-0/` was written by the build before storage formats were recorded
//! (format 0: the layout of format 1, unmarked), with this file's `write_fixture`:
//!
//! ```text
//! CELLOG_WRITER_BIN=/path/to/that/cellog cargo test -p cellog-cli --test upgrade -- --ignored write_fixture
//! ```
//!
//! It stays as it was written: a later build must keep opening it, migrating it to the current format.

// The node binary runs on RocksDB.
#![cfg(feature = "node")]

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use cellog_client::proto as v1;
use common::{NodeProcess, free_port, wait_for_leader};

const CELL: &str = "upgrade";
const STREAM: &str = "UP";
const CONSUMER: &str = "C";
const N_MESSAGES: u64 = 60;
const N_ACKED: usize = 20;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data-format-0")
}

fn node(binary: &str, data_dir: &Path, log: PathBuf) -> NodeProcess {
    let (client_addr, raft_addr) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    NodeProcess {
        id: 1,
        args: vec![
            "node".to_string(),
            "--id=1".to_string(),
            format!("--cell={CELL}"),
            format!("--data-dir={}", data_dir.display()),
            format!("--client-addr={client_addr}"),
            format!("--raft-addr={raft_addr}"),
            "--metrics-addr=off".to_string(),
            "--insecure".to_string(),
            "--snapshot-every=25".to_string(),
        ],
        client_addr,
        raft_addr,
        log,
        child: None,
        binary: binary.to_string(),
    }
}

fn message(index: u64) -> v1::PublishRequest {
    v1::PublishRequest {
        subject: format!("up.k{}", index % 5),
        payload: Bytes::from(format!("payload-{index}")),
        msg_id: Some(format!("m-{index}")),
        ..v1::PublishRequest::default()
    }
}

/// Every message of the stream: (msg id, payload), in (partition, seq) order.
async fn every_message(node: &NodeProcess) -> Vec<(String, Bytes)> {
    let client = node.client();
    let mut found = Vec::new();
    for partition in 0..2 {
        let response = client.read(STREAM, partition, 1, 1_000, false).await.expect("a read");
        found.extend(response.messages.into_iter().map(|m| (m.msg_id.expect("an id"), m.payload)));
    }
    found
}

/// Writes the fixture with an earlier build's binary (see the module doc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture; run by hand with CELLOG_WRITER_BIN"]
async fn write_fixture() {
    let binary = std::env::var("CELLOG_WRITER_BIN").expect("CELLOG_WRITER_BIN names the writing build's cellog");
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = dir.path().join("node-1");
    let mut writer = node(&binary, &data, dir.path().join("node-1.log"));
    writer.start();
    wait_for_leader(std::slice::from_ref(&writer)).await;
    let client = writer.client();
    let config = v1::StreamConfig { subjects: vec!["up.>".to_string()], partitions: 2, ..Default::default() };
    client.create_stream(STREAM, config).await.expect("a stream");
    client.create_consumer(STREAM, CONSUMER, v1::ConsumerConfig::default()).await.expect("a consumer");
    for index in 0..N_MESSAGES {
        client.publish(message(index)).await.expect("a publish");
    }
    let deliveries = client.fetch(STREAM, CONSUMER, "w", N_ACKED as u32).await.expect("a fetch");
    assert_eq!(deliveries.len(), N_ACKED);
    let acks = deliveries
        .iter()
        .map(|d| {
            let m = d.message.as_ref().expect("a message");
            v1::AckItem { partition: m.partition, seq: m.seq, ..Default::default() }
        })
        .collect();
    client.ack(STREAM, CONSUMER, acks).await.expect("acks");
    assert!(writer.terminate(), "the writer stops cleanly");
    let target = fixture();
    let _ = std::fs::remove_dir_all(&target);
    copy_dir(&data, &target);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a directory");
    for entry in std::fs::read_dir(from).expect("a readable directory") {
        let entry = entry.expect("an entry");
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(&path, to.join(entry.file_name())).expect("a copy");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_comes_up_over_an_earlier_builds_data() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let data = dir.path().join("node-1");
    copy_dir(&fixture(), &data);
    let mut upgraded = node(env!("CARGO_BIN_EXE_cellog"), &data, dir.path().join("node-1.log"));
    upgraded.start();
    wait_for_leader(std::slice::from_ref(&upgraded)).await;
    assert!(
        upgraded.log_text().contains(&format!("storage format 0 migrated to {}", cellog_raft::STORE_FORMAT)),
        "the node says it migrated: {}",
        upgraded.log_text()
    );

    let mut expected: Vec<(String, Bytes)> =
        (0..N_MESSAGES).map(|i| (format!("m-{i}"), Bytes::from(format!("payload-{i}")))).collect();
    let mut found = every_message(&upgraded).await;
    found.sort();
    expected.sort();
    assert_eq!(found, expected, "every message and body written by the earlier build is there");

    let client = upgraded.client();
    let again = client.publish(message(7)).await.expect("a publish");
    assert!(again.duplicate, "the dedup index survived: {again:?}");
    let info = client.consumer_info(STREAM, CONSUMER).await.expect("the consumer");
    assert_eq!(info.acked, N_ACKED as u64, "the consumer's acknowledgements survived");
    let rest = client.fetch(STREAM, CONSUMER, "u", 1_000).await.expect("a fetch");
    assert_eq!(rest.len(), N_MESSAGES as usize - N_ACKED, "what was not acknowledged is delivered, and only that");
    let fresh = client.publish(message(N_MESSAGES)).await.expect("a new publish");
    assert!(!fresh.duplicate);

    // Written by this build now: it opens again without another migration.
    assert!(upgraded.terminate(), "the node stops cleanly");
    upgraded.start();
    wait_for_leader(std::slice::from_ref(&upgraded)).await;
    assert_eq!(upgraded.log_text().matches("migrated to").count(), 1, "migrated once");
    assert_eq!(every_message(&upgraded).await.len(), N_MESSAGES as usize + 1);
}
