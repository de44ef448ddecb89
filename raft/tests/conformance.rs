//! The storage conformance suite, run against every `Storage` implementation, plus openraft's own storage suite
//! over the log and state-machine stores built on each.

use bytes::Bytes;
use cellog_raft::storage::{Batch, DiskFaults, MAX_RECORD_BYTES, SimDisk, Space, Storage, StorageError, Write, frame};
use cellog_raft::types::{NodeId, TypeConfig};
use cellog_raft::{LogStore, StateMachineStore, open_stores, stored_snapshot};
use openraft::testing::{StoreBuilder, Suite};

/// Checks the behaviour every implementation must have; `reopen` closes the store and opens it again on the same
/// data after everything was synced.
fn conformance<S: Storage>(store: S, reopen: impl FnOnce(S) -> S) {
    // Writes are visible at once, in key order, per space.
    let mut batch = Batch::new();
    for key in [5u64, 1, 3, 2, 4] {
        batch.put(Space::Log, key, format!("log-{key}").as_bytes());
    }
    batch.put(Space::Meta, 1, b"vote");
    store.write(batch).unwrap();
    assert_eq!(store.get(Space::Log, 3).unwrap(), Some(b"log-3".to_vec()));
    assert_eq!(store.get(Space::Log, 9).unwrap(), None);
    assert_eq!(store.get(Space::State, 1).unwrap(), None, "spaces are separate");
    let keys: Vec<u64> = store.scan(Space::Log, 2..5, 100).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![2, 3, 4]);
    assert_eq!(store.scan(Space::Log, 0..u64::MAX, 2).unwrap().len(), 2, "scan honours its limit");
    assert_eq!(store.scan(Space::Log, 4..4, 10).unwrap(), vec![]);
    assert_eq!(store.key_bounds(Space::Log).unwrap(), Some((1, 5)));
    assert_eq!(store.key_bounds(Space::Bodies).unwrap(), None);
    // A batched read answers each key in the order asked, found or not.
    let many = store.get_many(Space::Log, &[4, 9, 1, 4]);
    let expected = [
        Some(Bytes::from_static(b"log-4")),
        None,
        Some(Bytes::from_static(b"log-1")),
        Some(Bytes::from_static(b"log-4")),
    ];
    assert_eq!(many, expected.map(Ok).to_vec());
    assert_eq!(store.get_many(Space::Log, &[]), vec![]);

    // Overwrite and range delete.
    let mut batch = Batch::new();
    batch.put(Space::Log, 5, b"log-5-again");
    batch.delete_range(Space::Log, 1..3);
    store.write(batch).unwrap();
    assert_eq!(store.get(Space::Log, 5).unwrap(), Some(b"log-5-again".to_vec()));
    assert_eq!(store.key_bounds(Space::Log).unwrap(), Some((3, 5)));
    let mut batch = Batch::new();
    batch.delete_range(Space::Log, 4..u64::MAX);
    store.write(batch).unwrap();
    assert_eq!(store.key_bounds(Space::Log).unwrap(), Some((3, 3)));

    // A damaged record or one under the wrong key is a typed corruption, never wrong data.
    let mut flipped = frame(Space::State, 7, b"state");
    flipped[9] ^= 0x10;
    let misdirected = frame(Space::State, 7, b"misdirected");
    let torn = frame(Space::State, 7, b"torn record")[..10].to_vec();
    store
        .write(Batch {
            writes: vec![
                Write::Put { space: Space::State, key: 7, framed: flipped },
                Write::Put { space: Space::State, key: 8, framed: misdirected },
                Write::Put { space: Space::State, key: 9, framed: torn },
            ],
        })
        .unwrap();
    for key in [7, 8, 9] {
        assert!(
            matches!(store.get(Space::State, key), Err(StorageError::Corrupt { space: Space::State, key: k, .. }) if k == key),
            "record {key} must not verify"
        );
    }
    // In a batched read, each damaged record fails alone.
    let many = store.get_many(Space::State, &[7, 10, 9]);
    assert!(matches!(many[0], Err(StorageError::Corrupt { key: 7, .. })), "{many:?}");
    assert_eq!(many[1], Ok(None));
    assert!(matches!(many[2], Err(StorageError::Corrupt { key: 9, .. })), "{many:?}");
    assert!(matches!(store.scan(Space::State, 0..100, 10), Err(StorageError::Corrupt { .. })));
    // Keys close together, as a fetch's bodies are, answer the same: each in its place, a gap as absent, a damaged
    // record failing alone, and records between the keys asked left out.
    let mut flipped = frame(Space::Bodies, 104, b"body-104");
    flipped[9] ^= 0x10;
    let mut writes: Vec<Write> = (100..=110)
        .filter(|key| ![103, 104].contains(key))
        .map(|key| Write::Put {
            space: Space::Bodies,
            key,
            framed: frame(Space::Bodies, key, format!("body-{key}").as_bytes()),
        })
        .collect();
    writes.push(Write::Put { space: Space::Bodies, key: 104, framed: flipped });
    store.write(Batch { writes }).unwrap();
    let many = store.get_many(Space::Bodies, &[100, 102, 103, 104, 105, 110, 111]);
    let body = |key: u64| Ok(Some(Bytes::from(format!("body-{key}"))));
    assert_eq!(many[..3], [body(100), body(102), Ok(None)], "{many:?}");
    assert!(matches!(many[3], Err(StorageError::Corrupt { key: 104, .. })), "{many:?}");
    assert_eq!(many[4..], [body(105), body(110), Ok(None)], "{many:?}");
    let mut batch = Batch::new();
    batch.delete_range(Space::Bodies, 0..u64::MAX);
    store.write(batch).unwrap();
    let mut batch = Batch::new();
    batch.delete_range(Space::State, 0..u64::MAX);
    store.write(batch).unwrap();

    // A point delete (a range of one key) takes that key alone.
    let mut batch = Batch::new();
    batch.put(Space::Bodies, 41, b"a").put(Space::Bodies, 42, b"b").put(Space::Bodies, 43, b"c");
    batch.delete_range(Space::Bodies, 42..43);
    store.write(batch).unwrap();
    let keys: Vec<u64> = store.scan(Space::Bodies, 0..u64::MAX, 10).unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, vec![41, 43]);
    let mut batch = Batch::new();
    batch.delete_range(Space::Bodies, 0..u64::MAX);
    store.write(batch).unwrap();

    // A record too large to hold refuses its whole batch with a typed error; nothing of it is written, and the store
    // goes on. (The payload is never read: its pages are not even touched.)
    let huge = vec![0u8; MAX_RECORD_BYTES + 1];
    let mut batch = Batch::new();
    batch.put(Space::Bodies, 50, b"small");
    batch.put(Space::State, 0, &huge);
    assert_eq!(
        store.write(batch),
        Err(StorageError::TooLarge { space: Space::State, key: 0, size: MAX_RECORD_BYTES + 1, max: MAX_RECORD_BYTES })
    );
    drop(huge);
    assert_eq!(store.get(Space::Bodies, 50).unwrap(), None, "nothing of a refused batch is written");
    let mut batch = Batch::new();
    batch.put(Space::Bodies, 50, b"small");
    store.write(batch).unwrap();
    assert_eq!(store.get(Space::Bodies, 50).unwrap(), Some(b"small".to_vec()), "the store goes on");
    let mut batch = Batch::new();
    batch.delete_range(Space::Bodies, 50..51);
    store.write(batch).unwrap();

    // Unlogged writes are read like any other, in the order of all writes; they only put.
    let mut batch = Batch::new();
    batch.put(Space::Bodies, 60, b"sixty").put(Space::Bodies, 61, b"sixty-one").put(Space::Bodies, 62, b"gone");
    store.write_unlogged(batch).unwrap();
    assert_eq!(store.get(Space::Bodies, 61).unwrap(), Some(b"sixty-one".to_vec()));
    assert_eq!(store.key_bounds(Space::Bodies).unwrap(), Some((60, 62)));
    let mut batch = Batch::new();
    batch.put(Space::Bodies, 63, b"never");
    batch.delete_range(Space::Bodies, 60..61);
    assert!(
        matches!(store.write_unlogged(batch), Err(StorageError::Unsupported { .. })),
        "an unlogged batch only puts"
    );
    assert_eq!(store.get(Space::Bodies, 63).unwrap(), None, "nothing of a refused unlogged batch is written");
    assert_eq!(store.get(Space::Bodies, 60).unwrap(), Some(b"sixty".to_vec()));
    let mut batch = Batch::new();
    batch.delete_range(Space::Bodies, 62..63);
    store.write(batch).unwrap();
    assert_eq!(store.get(Space::Bodies, 62).unwrap(), None, "a logged delete after an unlogged put removes it");

    // A snapshot stored in chunks (here of 999 bytes) comes back whole after a reopen.
    let snapshot: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    let mut batch = Batch::new();
    stored_snapshot::put(&mut batch, &snapshot, 999);
    store.write(batch).unwrap();

    // What was synced survives closing and opening again, checkpointed or not, and so does what was persisted.
    store.sync().unwrap();
    store.persist().unwrap();
    store.checkpoint().unwrap();
    assert_eq!(store.get(Space::Log, 3).unwrap(), Some(b"log-3".to_vec()), "a checkpoint changes nothing reads see");
    let store = reopen(store);
    assert_eq!(store.get(Space::Log, 3).unwrap(), Some(b"log-3".to_vec()));
    assert_eq!(store.get(Space::Meta, 1).unwrap(), Some(b"vote".to_vec()));
    assert_eq!(store.key_bounds(Space::Log).unwrap(), Some((3, 3)));
    assert_eq!(stored_snapshot::get(&store).unwrap(), Some(snapshot));
    assert_eq!(store.key_bounds(Space::State).unwrap(), Some((0, 11)), "a header and 11 chunks");
    assert_eq!(store.get(Space::Bodies, 60).unwrap(), Some(b"sixty".to_vec()), "a persisted unlogged write");
    assert_eq!(store.get(Space::Bodies, 61).unwrap(), Some(b"sixty-one".to_vec()));
    assert_eq!(store.get(Space::Bodies, 62).unwrap(), None, "its logged delete stays");

    // A shorter snapshot replaces it without leaving a chunk behind.
    let mut batch = Batch::new();
    stored_snapshot::put(&mut batch, b"short", 999);
    store.write(batch).unwrap();
    assert_eq!(stored_snapshot::get(&store).unwrap(), Some(b"short".to_vec()));
    assert_eq!(store.key_bounds(Space::State).unwrap(), Some((0, 1)));
}

#[test]
fn sim_disk_conforms() {
    conformance(SimDisk::new(1), |disk| {
        disk.crash();
        disk
    });
}

#[test]
fn sim_disk_crash_drops_exactly_what_was_not_synced() {
    let disk = SimDisk::new(2);
    let mut batch = Batch::new();
    batch.put(Space::Log, 1, b"synced");
    disk.write(batch).unwrap();
    disk.sync().unwrap();
    let mut batch = Batch::new();
    batch.put(Space::Log, 2, b"not synced");
    batch.delete_range(Space::Log, 1..2);
    disk.write(batch).unwrap();
    assert_eq!(disk.keys(Space::Log), vec![2]);
    disk.crash();
    assert_eq!(disk.get(Space::Log, 1).unwrap(), Some(b"synced".to_vec()));
    assert_eq!(disk.get(Space::Log, 2).unwrap(), None);
    // A restart without power loss keeps what the page cache held.
    let mut batch = Batch::new();
    batch.put(Space::Log, 3, b"cached");
    disk.write(batch).unwrap();
    disk.reopen();
    assert_eq!(disk.get(Space::Log, 3).unwrap(), Some(b"cached".to_vec()));
}

#[test]
fn sim_disk_keeps_unlogged_writes_only_once_persisted() {
    let disk = SimDisk::new(3);
    let put = |key: u64, logged: bool| {
        let mut batch = Batch::new();
        batch.put(Space::Bodies, key, &key.to_le_bytes());
        if logged { disk.write(batch) } else { disk.write_unlogged(batch) }.unwrap();
    };
    put(1, false);
    put(2, true);
    disk.sync().unwrap();
    assert_eq!(disk.keys(Space::Bodies), vec![1, 2], "reads see both");
    disk.crash();
    assert_eq!(disk.keys(Space::Bodies), vec![2], "a sync does not make an unlogged write durable");

    // A restart of the process loses the unlogged writes and keeps the logged ones, synced or not.
    put(3, false);
    put(4, true);
    disk.reopen();
    assert_eq!(disk.keys(Space::Bodies), vec![2, 4]);

    // A persist makes every write durable, the unlogged ones in their order among the rest.
    put(5, false);
    put(6, false);
    let mut batch = Batch::new();
    batch.delete_range(Space::Bodies, 5..6);
    disk.write(batch).unwrap();
    // Synced before the persist, the delete is durable first, and the put it replaced must not land after it.
    disk.sync().unwrap();
    put(7, false);
    disk.persist().unwrap();
    disk.crash();
    assert_eq!(disk.keys(Space::Bodies), vec![2, 4, 6, 7]);
}

#[test]
fn sim_disk_faults_are_detected_and_replay_from_the_seed() {
    let run = |seed: u64| {
        let disk = SimDisk::new(seed);
        disk.set_faults(DiskFaults {
            misdirected_write_ppm: 100_000,
            bit_flip_ppm: 100_000,
            torn_write_ppm: 1_000_000,
            read_error_ppm: 0,
        });
        for key in 0..200u64 {
            let mut batch = Batch::new();
            batch.put(Space::Log, key, format!("entry-{key}").as_bytes());
            disk.write(batch).unwrap();
            if key % 10 == 9 {
                disk.sync().unwrap();
            }
        }
        disk.crash();
        let mut outcomes = Vec::new();
        for key in 0..200u64 {
            outcomes.push(match disk.get(Space::Log, key) {
                Ok(Some(bytes)) => {
                    assert_eq!(bytes, format!("entry-{key}").into_bytes(), "a verified record is the right record");
                    'o'
                }
                Ok(None) => '-',
                Err(StorageError::Corrupt { .. }) => 'x',
                Err(other) => panic!("{other}"),
            });
        }
        outcomes.into_iter().collect::<String>()
    };
    let first = run(7);
    assert!(first.contains('x'), "faults at these rates damage some records: {first}");
    assert_eq!(first, run(7), "the same seed gives the same faults");
    assert_ne!(first, run(8), "another seed gives other faults");
}

#[test]
fn sim_disk_read_errors_are_io_errors() {
    let disk = SimDisk::new(3);
    disk.set_faults(DiskFaults { read_error_ppm: 1_000_000, ..DiskFaults::default() });
    assert!(matches!(disk.get(Space::Log, 1), Err(StorageError::Io { .. })));
}

#[test]
fn a_failed_write_poisons_the_store_until_it_is_reopened() {
    let disk = SimDisk::new(4);
    disk.fail_next_io();
    let mut batch = Batch::new();
    batch.put(Space::Log, 1, b"x");
    assert!(matches!(disk.write(batch.clone()), Err(StorageError::Io { .. })));
    assert_eq!(disk.write(batch.clone()), Err(StorageError::Poisoned));
    assert_eq!(disk.sync(), Err(StorageError::Poisoned));
    disk.crash();
    disk.write(batch).unwrap();
}

/// Appends are reported flushed only after a sync that follows their write, and appends that wait together share
/// one sync (group commit): eight concurrent appends on a disk whose sync takes 20 ms take far fewer than eight syncs,
/// none returns before a sync, and each survives a crash once it has returned.
#[cfg(not(madsim))]
#[test]
#[allow(clippy::disallowed_methods, reason = "the test measures that an append waits for a sync, in real time")]
fn appends_waiting_together_share_one_sync_and_are_durable_once_reported_flushed() {
    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let disk = SimDisk::new(3);
    let (log_store, _, _) = open_stores(disk.clone()).expect("an empty disk opens");
    let delay = std::time::Duration::from_millis(20);
    disk.set_sync_delay(delay);
    let syncs_before = disk.n_syncs();
    let started = std::time::Instant::now();
    runtime.block_on(async {
        let appends: Vec<_> = (1..=8u64)
            .map(|index| {
                let mut store = log_store.clone();
                tokio::spawn(async move {
                    let entry = cellog_raft::Entry {
                        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                        payload: EntryPayload::Blank,
                    };
                    store.blocking_append([entry]).await.expect("appended");
                })
            })
            .collect();
        for append in appends {
            append.await.unwrap();
        }
    });
    assert!(started.elapsed() >= delay, "an append was reported flushed before any sync ended");
    let syncs = disk.n_syncs() - syncs_before;
    assert!((1..=3).contains(&syncs), "8 appends waiting together took {syncs} syncs");
    disk.crash();
    disk.reopen();
    assert_eq!(disk.keys(Space::Log), (1..=8).collect::<Vec<u64>>(), "a reported append was lost in a crash");
}

/// The commit index Raft saves costs no write of its own: the next append writes it in its batch. This node reads it
/// back at once; after a crash it finds the one the last append wrote, at most one append behind.
#[cfg(not(madsim))]
#[test]
fn the_saved_commit_index_is_written_with_the_next_append() {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let disk = SimDisk::new(5);
    let (mut log_store, _, _) = open_stores(disk.clone()).expect("an empty disk opens");
    let log_id = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
    let entry = |index| cellog_raft::Entry { log_id: log_id(index), payload: EntryPayload::Blank };
    runtime.block_on(async {
        log_store.save_vote(&openraft::Vote::new_committed(1, 1)).await.expect("voted");
        log_store.blocking_append([entry(0), entry(1)]).await.expect("appended");
        log_store.save_committed(Some(log_id(1))).await.expect("saved");
        assert_eq!(log_store.read_committed().await.unwrap(), Some(log_id(1)));
        log_store.blocking_append([entry(2)]).await.expect("appended");
        log_store.save_committed(Some(log_id(2))).await.expect("saved");
        assert_eq!(log_store.read_committed().await.unwrap(), Some(log_id(2)), "the last saved, as yet unwritten");
    });
    disk.crash();
    disk.reopen();
    let (mut log_store, _, _) = open_stores(disk.clone()).expect("reopens");
    runtime.block_on(async {
        assert_eq!(log_store.read_committed().await.unwrap(), Some(log_id(1)), "the one the last append wrote");
    });
}

struct SimBuilder;

impl StoreBuilder<TypeConfig, LogStore<SimDisk>, StateMachineStore<SimDisk>, ()> for SimBuilder {
    async fn build(
        &self,
    ) -> Result<((), LogStore<SimDisk>, StateMachineStore<SimDisk>), openraft::StorageError<NodeId>> {
        let (log_store, state_machine, _) = open_stores(SimDisk::new(9)).expect("an empty disk opens");
        Ok(((), log_store, state_machine))
    }
}

#[test]
fn openraft_storage_suite_on_sim_disk() {
    Suite::test_all(SimBuilder).expect("openraft's storage suite passes");
}

#[cfg(feature = "rocksdb")]
mod rocks {
    use std::sync::Arc;

    use cellog_raft::storage::RocksStorage;

    use super::*;

    #[test]
    fn rocksdb_conforms() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        conformance(RocksStorage::open(&path).unwrap(), |store| {
            drop(store);
            RocksStorage::open(&path).unwrap()
        });
    }

    const CHILD: &str = "CELLOG_ROCKSDB_CHILD_DIR";

    /// In a child process: writes 2000 records through the WAL and 2000 without it, persists after the first 1000 of
    /// each, syncs at the end, and dies without closing anything. In the parent: runs that child, then opens the
    /// database and finds every synced record, and the unlogged ones up to the persist.
    #[test]
    fn rocksdb_keeps_synced_records_across_a_killed_process() {
        if let Ok(dir) = std::env::var(CHILD) {
            let store = RocksStorage::open(std::path::Path::new(&dir)).unwrap();
            for key in 0..2000u64 {
                let mut batch = Batch::new();
                batch.put(Space::Log, key, &key.to_le_bytes());
                store.write(batch).unwrap();
                let mut batch = Batch::new();
                batch.put(Space::Bodies, key, &key.to_le_bytes());
                store.write_unlogged(batch).unwrap();
                if key == 999 {
                    store.persist().unwrap();
                }
            }
            store.sync().unwrap();
            std::process::abort();
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "rocks::rocksdb_keeps_synced_records_across_a_killed_process", "--nocapture"])
            .env(CHILD, dir.path())
            .status()
            .unwrap();
        assert!(!status.success(), "the child dies by abort");
        let store = RocksStorage::open(dir.path()).unwrap();
        for key in 0..1000u64 {
            assert_eq!(store.get(Space::Log, key).unwrap(), Some(key.to_le_bytes().to_vec()), "synced record {key}");
            let body = store.get(Space::Bodies, key).unwrap();
            assert_eq!(body, Some(key.to_le_bytes().to_vec()), "persisted unlogged record {key}");
        }
        // The unlogged records written after the persist were in the process's memory alone: the sync did not keep
        // them, and the log they stand for is what a node replays.
        assert_eq!(store.key_bounds(Space::Bodies).unwrap(), Some((0, 999)));
        for key in 1000..2000u64 {
            assert_eq!(store.get(Space::Log, key).unwrap(), Some(key.to_le_bytes().to_vec()), "synced record {key}");
        }
    }

    struct RocksBuilder;

    impl StoreBuilder<TypeConfig, LogStore<Arc<RocksStorage>>, StateMachineStore<Arc<RocksStorage>>, tempfile::TempDir>
        for RocksBuilder
    {
        async fn build(
            &self,
        ) -> Result<
            (tempfile::TempDir, LogStore<Arc<RocksStorage>>, StateMachineStore<Arc<RocksStorage>>),
            openraft::StorageError<NodeId>,
        > {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(RocksStorage::open(dir.path()).unwrap());
            let (log_store, state_machine, _) = open_stores(store).expect("an empty database opens");
            Ok((dir, log_store, state_machine))
        }
    }

    #[test]
    fn openraft_storage_suite_on_rocksdb() {
        Suite::test_all(RocksBuilder).expect("openraft's storage suite passes");
    }
}
