//! Measures a node's restart: time from opening its storage to a replica ready to serve, and resident memory, for a
//! cell holding N retained messages of B bytes (default 1 000 000 x 256).
//!
//! `cargo run --release -p cellog-raft --no-default-features --example restart -- [N] [B]` measures on the simulated
//! disk, in one process (the disk itself is in memory, so the figure to read is the growth from opening).
//! `cargo run --release -p cellog-raft --example restart -- [N] [B] --rocksdb` fills a RocksDB database, closes it,
//! and opens it again in a fresh process, whose whole resident memory is the figure.
#![allow(clippy::disallowed_methods, reason = "a measurement reads the wall clock")]

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cellog_core::{Command, Millis, PublishRequest, StreamConfig};
use cellog_raft::storage::{SimDisk, Storage};
use cellog_raft::{Entry, Request, open_stores};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder};

fn resident_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn fill<S: Storage + Clone>(storage: S, n_messages: u64, body_bytes: usize) {
    let (_, mut state_machine, _) = open_stores(storage.clone()).expect("opens");
    let body = Bytes::from(vec![b'x'; body_bytes]);
    let config = StreamConfig::with_subjects(["bench.>"]);
    let mut entries = vec![entry(1, Command::CreateStream { name: "bench".to_string(), config })];
    for i in 0..n_messages {
        entries.push(entry(i + 2, Command::Publish(PublishRequest::new("bench.orders", body.clone()))));
        if entries.len() == 10_000 {
            state_machine.apply(std::mem::take(&mut entries)).await.expect("applies");
        }
    }
    state_machine.apply(entries).await.expect("applies");
    let started = Instant::now();
    state_machine.build_snapshot().await.expect("snapshot");
    storage.sync().expect("syncs");
    println!("snapshot written in {:.3} s", started.elapsed().as_secs_f64());
}

/// Opens the stores and reports how long it took, and the memory.
fn open<S: Storage + Clone>(storage: S, started: Instant, before: f64) {
    let (_, state_machine, recovery) = open_stores(storage).expect("opens");
    let elapsed = started.elapsed();
    let replica = state_machine.replica();
    let n = replica.lock().unwrap().cell.stream_info("bench").unwrap().n_messages;
    println!(
        "restart_s={:.3} rss_mb={:.0} rss_before_open_mb={before:.0} messages={n} entries_verified={}",
        elapsed.as_secs_f64(),
        resident_mb(),
        recovery.n_entries_verified
    );
}

fn entry(index: u64, command: Command) -> Entry {
    Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::new(Millis(index), vec![command])),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    #[cfg(feature = "rocksdb")]
    if std::env::args().any(|a| a == "--open") {
        let before = resident_mb();
        let started = Instant::now();
        let storage =
            Arc::new(cellog_raft::storage::RocksStorage::open(std::path::Path::new(&args[0])).expect("opens"));
        println!("database_open_s={:.3}", started.elapsed().as_secs_f64());
        open(storage, started, before);
        return;
    }
    let n_messages = args.first().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let body_bytes = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    #[cfg(feature = "rocksdb")]
    if std::env::args().any(|a| a == "--rocksdb") {
        let dir = std::env::temp_dir().join(format!("cellog-restart-{}", std::process::id()));
        fill(Arc::new(cellog_raft::storage::RocksStorage::open(&dir).expect("opens")), n_messages, body_bytes).await;
        let status = std::process::Command::new(std::env::current_exe().expect("this program"))
            .arg("--open")
            .arg(&dir)
            .status()
            .expect("the measuring process runs");
        let _ = std::fs::remove_dir_all(dir);
        assert!(status.success());
        return;
    }
    let disk = Arc::new(SimDisk::new(0));
    fill(disk.clone(), n_messages, body_bytes).await;
    let before = resident_mb();
    open(disk, Instant::now(), before);
}
