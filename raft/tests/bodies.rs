//! Message bodies in a node's storage, on both stores: written by apply, out of the stored snapshot, deleted once a
//! snapshot no longer refers to them, streamed to a follower with the snapshot, and never served when they do not
//! verify.

use bytes::Bytes;
use cellog_core::{Command, Millis, PublishRequest, Record, StreamConfig};
use cellog_raft::snapshot_transfer::{SnapshotData, TRANSFER_BATCH_BYTES};
use cellog_raft::storage::{MetaKey, SimDisk, Space, Storage};
use cellog_raft::{BodyError, Entry, Request, StateMachineStore, TypeConfig, open_stores};
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder, Snapshot};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

const BODY_BYTES: usize = 1_000;

fn entry(index: u64, command: Command) -> Entry {
    Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Request::new(Millis(index), vec![command])),
    }
}

fn body(i: u64) -> Bytes {
    Bytes::from(format!("{i:0>width$}", width = BODY_BYTES))
}

/// A stream keeping 5 messages, and 10 published to it (so 5 removed): entries 1 to 11.
fn entries() -> Vec<Entry> {
    let config = StreamConfig { max_messages: Some(5), ..StreamConfig::with_subjects(["orders.>"]) };
    let mut entries = vec![entry(1, Command::CreateStream { name: "orders".to_string(), config })];
    for i in 1..=10 {
        entries.push(entry(i + 1, Command::Publish(PublishRequest::new("orders.a", body(i)))));
    }
    entries
}

/// Applies [`entries`] one apply each (a body put and removed within one apply is never written at all).
async fn fill<S: Storage + Clone>(state_machine: &mut StateMachineStore<S>) {
    for entry in entries() {
        state_machine.apply(vec![entry]).await.expect("applies");
    }
}

/// The bodies [`entries`] leaves retained.
fn retained() -> Vec<Bytes> {
    (6..=10).map(body).collect()
}

/// A simulated disk after [`fill`] and a stored snapshot.
async fn snapshotted(seed: u64) -> (SimDisk, StateMachineStore<SimDisk>) {
    let disk = SimDisk::new(seed);
    let (_, mut state_machine, _) = open_stores(disk.clone()).expect("opens");
    fill(&mut state_machine).await;
    state_machine.build_snapshot().await.expect("snapshot");
    (disk, state_machine)
}

fn records<S: Storage + Clone>(state_machine: &StateMachineStore<S>) -> Vec<Record> {
    state_machine.replica().lock().unwrap().cell.read_from("orders", 0, 0, 100).expect("the stream is there")
}

/// Each retained message's payload as the answering node reads it, or why it is not served.
fn read<S: Storage + Clone>(state_machine: &StateMachineStore<S>) -> Vec<Result<Bytes, BodyError>> {
    let (bodies, replica) = (state_machine.bodies(), state_machine.replica());
    records(state_machine)
        .iter()
        .map(|record| cellog_raft::state_machine::payload(&bodies, &replica, "orders", record))
        .collect()
}

fn payloads<S: Storage + Clone>(state_machine: &StateMachineStore<S>) -> Vec<Bytes> {
    read(state_machine).into_iter().map(|payload| payload.unwrap_or_else(|error| panic!("{error}"))).collect()
}

/// Copies `snapshot`'s stream into `data` in chunks of `chunk` bytes, as openraft's chunked transport does, from
/// where it stands until at least `up_to` bytes went (or to its end): the bytes copied.
async fn forward(
    snapshot: &mut Snapshot<TypeConfig>,
    data: &mut SnapshotData,
    chunk: usize,
    up_to: Option<u64>,
) -> std::io::Result<u64> {
    let mut buf = vec![0; chunk];
    let mut sent = 0u64;
    while up_to.is_none_or(|up_to| sent < up_to) {
        let n = snapshot.snapshot.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        data.write_all(&buf[..n]).await?;
        sent += n as u64;
    }
    Ok(sent)
}

/// Sends `snapshot` to `receiver` whole: copied in chunks of `chunk` bytes into the data the receiver began, which
/// is shut down at the end. What the receiver then installs, or the first error.
async fn send<S: Storage + Clone>(
    snapshot: &mut Snapshot<TypeConfig>,
    receiver: &mut StateMachineStore<S>,
    chunk: usize,
) -> std::io::Result<Box<SnapshotData>> {
    let mut data = receiver.begin_receiving_snapshot().await.expect("begins");
    forward(snapshot, &mut data, chunk, None).await?;
    data.shutdown().await?;
    Ok(data)
}

fn stream_len(snapshot: &Snapshot<TypeConfig>) -> u64 {
    match &*snapshot.snapshot {
        SnapshotData::Outgoing(out) => out.len(),
        other => panic!("not a stream being sent: {other:?}"),
    }
}

fn n_bodies<S: Storage>(store: &S) -> usize {
    store.scan(Space::Bodies, 0..u64::MAX, usize::MAX).expect("bodies verify").len()
}

async fn bodies_live_in_storage<S: Storage + Clone>(store: S, reopen: impl FnOnce(S) -> S) {
    let (_, mut state_machine, _) = open_stores(store.clone()).expect("opens");
    fill(&mut state_machine).await;
    let retained = retained();
    assert_eq!(payloads(&state_machine), retained);
    // Removed bodies stay until a snapshot no longer refers to them: the stored snapshot may still be sent.
    assert_eq!(n_bodies(&store), 10);

    state_machine.build_snapshot().await.expect("snapshot");
    assert_eq!(n_bodies(&store), 5, "the snapshot took the removed bodies with it");
    let state = store.get(Space::State, 0).unwrap().expect("stored");
    assert!(state.len() < BODY_BYTES, "the stored snapshot is the state alone: {} bytes", state.len());

    // A restart reads the bodies from storage.
    store.sync().unwrap();
    drop(state_machine);
    let store = reopen(store);
    let (_, mut restarted, recovery) = open_stores(store.clone()).expect("reopens");
    assert!(!recovery.snapshot_dropped && !recovery.bodies_damaged);
    assert_eq!(payloads(&restarted), retained);

    // Starting, openraft re-applies the committed log, then asks for the snapshot's meta: it gets the stored one's,
    // and no data, so the start reads no body.
    let next = Command::Publish(PublishRequest::new("orders.a", body(11)));
    restarted.apply(vec![entry(12, next)]).await.unwrap();
    let meta_only = restarted.get_current_snapshot().await.unwrap().expect("there is one");
    assert!(matches!(*meta_only.snapshot, SnapshotData::Empty));
    assert_eq!(meta_only.meta.last_log_id.map(|id| id.index), Some(11), "the stored snapshot's, not the replica's");
    // The snapshot a follower gets brings every body, and installing it replaces the follower's bodies.
    let mut snapshot = restarted.get_current_snapshot().await.unwrap().expect("there is one");
    assert_eq!(snapshot.meta, meta_only.meta);
    assert!(stream_len(&snapshot) > 5 * BODY_BYTES as u64);
    let follower = SimDisk::new(7);
    let (_, mut other, _) = open_stores(follower.clone()).expect("opens");
    other
        .apply(vec![entry(
            1,
            Command::CreateStream { name: "stale".to_string(), config: StreamConfig::with_subjects(["stale.>"]) },
        )])
        .await
        .unwrap();
    other.apply(vec![entry(2, Command::Publish(PublishRequest::new("stale.a", "old body")))]).await.unwrap();
    let received = send(&mut snapshot, &mut other, 777).await.expect("the whole stream is received");
    other.install_snapshot(&snapshot.meta, received).await.expect("installs");
    assert_eq!(payloads(&other), retained);
    assert_eq!(n_bodies(&follower), 5, "the follower's old body went");
    follower.crash();
    let (_, other, _) = open_stores(follower).expect("reopens");
    assert_eq!(payloads(&other), retained, "installed durably");
}

#[tokio::test]
async fn bodies_live_in_storage_on_sim_disk() {
    bodies_live_in_storage(SimDisk::new(3), |disk| {
        disk.crash();
        disk
    })
    .await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test]
async fn bodies_live_in_storage_on_rocksdb() {
    use std::sync::Arc;

    use cellog_raft::storage::RocksStorage;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    bodies_live_in_storage(Arc::new(RocksStorage::open(&path).unwrap()), |store| {
        drop(store);
        Arc::new(RocksStorage::open(&path).unwrap())
    })
    .await;
}

#[tokio::test]
async fn unsynced_bodies_come_back_from_the_log() {
    // Bodies written by apply are not synced on their own; a crash before any sync loses them, and the state goes
    // with them (the snapshot is synced after its bodies), so nothing refers to a lost body.
    let (disk, mut state_machine) = snapshotted(5).await;
    state_machine.apply(vec![entry(12, Command::Publish(PublishRequest::new("orders.a", body(11))))]).await.unwrap();
    disk.crash();
    let (_, state_machine, _) = open_stores(disk.clone()).expect("reopens");
    assert_eq!(payloads(&state_machine), retained(), "the state the snapshot holds");
}

#[tokio::test]
async fn a_replayed_log_leaves_no_body_behind() {
    // Bodies written, then a crash before any snapshot: the restart replays the whole log, and its puts and removals
    // land in one apply. The bodies the first run wrote and the replay removed must go too.
    let disk = SimDisk::new(11);
    let (_, mut state_machine, _) = open_stores(disk.clone()).expect("opens");
    fill(&mut state_machine).await;
    disk.sync().unwrap();
    drop(state_machine);
    disk.crash();
    let (_, mut state_machine, _) = open_stores(disk.clone()).expect("reopens");
    state_machine.apply(entries()).await.expect("replays");
    state_machine.build_snapshot().await.expect("snapshot");
    assert_eq!(n_bodies(&disk), 5, "only the retained bodies are left");
    assert_eq!(payloads(&state_machine), retained());
}

#[tokio::test]
async fn a_damaged_body_is_not_served_and_the_next_start_drops_the_state() {
    let (disk, mut state_machine) = snapshotted(9).await;
    let damaged = disk.keys(Space::Bodies)[2];
    assert!(disk.flip_bit(Space::Bodies, damaged, 4242));

    let read = read(&state_machine);
    let unreadable = read.iter().filter(|payload| matches!(payload, Err(BodyError::Unreadable { .. }))).count();
    assert_eq!(unreadable, 1, "exactly the damaged body is refused: {read:?}");
    assert_eq!(state_machine.bodies().n_unreadable(), 1);
    assert!(disk.get(Space::Meta, MetaKey::BodiesDamaged as u64).unwrap().is_some(), "the damage is recorded");
    // Nor is it sent to a follower: the stream fails when it reaches the body.
    let mut snapshot = state_machine.get_current_snapshot().await.unwrap().expect("there is one");
    let mut follower = open_stores(SimDisk::new(10)).expect("opens").1;
    let error = send(&mut snapshot, &mut follower, 4096).await.expect_err("a damaged body is not sent");
    assert!(error.to_string().contains(&format!("body {damaged}")), "{error}");

    disk.crash();
    let (_, state_machine, recovery) = open_stores(disk.clone()).expect("reopens");
    assert!(recovery.bodies_damaged && recovery.snapshot_dropped);
    assert!(disk.keys(Space::Bodies).is_empty(), "every body goes with the state");
    assert!(disk.get(Space::Meta, MetaKey::BodiesDamaged as u64).unwrap().is_none());
    assert!(state_machine.replica().lock().unwrap().cell.stream_info("orders").is_err(), "the state went");
}

/// A stream holding more than one receiver batch of bodies, with a snapshot of it stored: 6 000 bodies of 1 000 bytes.
async fn large(seed: u64) -> (SimDisk, StateMachineStore<SimDisk>) {
    let disk = SimDisk::new(seed);
    let (_, mut state_machine, _) = open_stores(disk.clone()).expect("opens");
    let config = StreamConfig::with_subjects(["orders.>"]);
    state_machine.apply(vec![entry(1, Command::CreateStream { name: "orders".to_string(), config })]).await.unwrap();
    let publishes = (1..=6_000).map(|i| entry(i + 1, Command::Publish(PublishRequest::new("orders.a", body(i)))));
    state_machine.apply(publishes.collect::<Vec<_>>()).await.unwrap();
    state_machine.build_snapshot().await.expect("snapshot");
    (disk, state_machine)
}

#[tokio::test]
async fn a_snapshot_streams_into_the_follower_store_as_it_arrives() {
    let (_, mut leader) = large(21).await;
    let mut snapshot = leader.get_current_snapshot().await.unwrap().expect("there is one");
    let len = stream_len(&snapshot);
    let follower = SimDisk::new(22);
    let (_, mut other, _) = open_stores(follower.clone()).expect("opens");
    let mut data = other.begin_receiving_snapshot().await.unwrap();

    // Nine tenths of the stream in, in chunks of 64 KiB: the bodies so far are in the follower's store already,
    // written in batches, and the store is marked until they are installed.
    let sent = forward(&mut snapshot, &mut data, 64 * 1024, Some(len * 9 / 10)).await.unwrap();
    let written = n_bodies(&follower);
    assert!((TRANSFER_BATCH_BYTES / BODY_BYTES..6_000).contains(&written), "{written} bodies written so far");
    assert!(follower.get(Space::Meta, MetaKey::BodiesUnswept as u64).unwrap().is_some());

    // A chunk sent again after a lost answer: both sides go back to its offset, and the receiver takes it once.
    let resend = sent - 1000;
    snapshot.snapshot.seek(std::io::SeekFrom::Start(resend)).await.unwrap();
    data.seek(std::io::SeekFrom::Start(resend)).await.unwrap();
    forward(&mut snapshot, &mut data, 64 * 1024, None).await.unwrap();
    data.shutdown().await.expect("whole");
    other.install_snapshot(&snapshot.meta, data).await.expect("installs");
    assert_eq!(n_bodies(&follower), 6_000);
    follower.crash();
    let (_, other, _) = open_stores(follower.clone()).expect("reopens");
    let last = other.replica().lock().unwrap().cell.read("orders", 0, 6_000).expect("the last message is there");
    let payload = cellog_raft::state_machine::payload(&other.bodies(), &other.replica(), "orders", &last);
    assert_eq!(payload, Ok(body(6_000)), "installed durably");
}

#[tokio::test]
async fn a_snapshot_received_half_way_leaves_nothing_behind() {
    let (_, mut leader) = large(23).await;
    let mut snapshot = leader.get_current_snapshot().await.unwrap().expect("there is one");
    let len = stream_len(&snapshot);
    // The follower holds a state of its own, with one body.
    let follower = SimDisk::new(24);
    let (_, mut other, _) = open_stores(follower.clone()).expect("opens");
    other.apply(entries()[..2].to_vec()).await.unwrap();
    other.build_snapshot().await.unwrap();
    follower.sync().unwrap();
    assert_eq!(n_bodies(&follower), 1);
    let mut data = other.begin_receiving_snapshot().await.unwrap();
    forward(&mut snapshot, &mut data, 64 * 1024, Some(len * 9 / 10)).await.unwrap();
    assert!(n_bodies(&follower) > 1);
    follower.sync().unwrap();
    drop((data, other));
    follower.crash();
    // The next start deletes every body its stored state does not refer to.
    let (_, other, _) = open_stores(follower.clone()).expect("reopens");
    assert_eq!(n_bodies(&follower), 1);
    assert!(follower.get(Space::Meta, MetaKey::BodiesUnswept as u64).unwrap().is_none());
    assert_eq!(payloads(&other), vec![body(1)]);
}

#[tokio::test]
async fn a_damaged_or_short_stream_is_never_installed() {
    let (_, mut leader) = large(25).await;
    let mut whole = Vec::new();
    let mut snapshot = leader.get_current_snapshot().await.unwrap().expect("there is one");
    snapshot.snapshot.read_to_end(&mut whole).await.unwrap();
    let cases: [(&str, Vec<u8>); 4] = [
        ("cut short", whole[..whole.len() - 10].to_vec()),
        ("a flipped bit in a body", {
            let mut bytes = whole.clone();
            let at = bytes.len() - 500;
            bytes[at] ^= 1;
            bytes
        }),
        ("bytes past the end", [whole.as_slice(), b"more"].concat()),
        ("not a snapshot stream", b"hello, world".repeat(100)),
    ];
    for (case, bytes) in cases {
        let follower = SimDisk::new(26);
        let (_, mut other, _) = open_stores(follower.clone()).expect("opens");
        let mut data = other.begin_receiving_snapshot().await.unwrap();
        let written = async {
            for chunk in bytes.chunks(100_000) {
                data.write_all(chunk).await?;
            }
            data.shutdown().await
        };
        assert!(written.await.is_err(), "{case}: refused");
        assert!(follower.get(Space::State, 0).unwrap().is_none(), "{case}: no state stored");
    }
}

#[tokio::test]
async fn bodies_being_sent_stay_while_newer_snapshots_are_stored() {
    let (disk, mut leader) = snapshotted(27).await;
    let mut sending = leader.get_current_snapshot().await.unwrap().expect("there is one");
    // More publishes remove the sent snapshot's bodies from the state, and a newer snapshot is stored meanwhile.
    let publishes = (11..=15).map(|i| entry(i + 1, Command::Publish(PublishRequest::new("orders.a", body(i)))));
    leader.apply(publishes.collect::<Vec<_>>()).await.unwrap();
    leader.build_snapshot().await.unwrap();
    assert_eq!(n_bodies(&disk), 10, "the deletes wait for the send");
    assert!(disk.get(Space::Meta, MetaKey::BodiesUnswept as u64).unwrap().is_some());
    let mut follower = open_stores(SimDisk::new(28)).expect("opens").1;
    let received = send(&mut sending, &mut follower, 1000).await.expect("every body is still there");
    follower.install_snapshot(&sending.meta, received).await.unwrap();
    assert_eq!(payloads(&follower), retained());
    drop(sending);
    // The next snapshot after the send deletes them.
    leader.apply(vec![entry(17, Command::Publish(PublishRequest::new("orders.a", body(16))))]).await.unwrap();
    leader.build_snapshot().await.unwrap();
    assert_eq!(n_bodies(&disk), 5);
}

#[tokio::test]
async fn a_start_that_finds_damage_verifies_every_body() {
    // A body damaged unseen, and the restart that follows: with nothing else damaged, the restart reads no body, and
    // the body is found when it is read. Beside damage the start finds elsewhere (the commit record, or a synced log
    // entry), the start verifies every body the kept state refers to, and drops the state for one that fails.
    type Damage = fn(&SimDisk, u64);
    let flipped: Damage = |disk, key| assert!(disk.flip_bit(Space::Bodies, key, 999));
    let missing: Damage = |disk, key| {
        let mut batch = cellog_raft::storage::Batch::new();
        batch.delete_range(Space::Bodies, key..key + 1);
        disk.write(batch).unwrap();
    };
    let committed = Some((Space::Meta, MetaKey::Committed as u64));
    let log = Some((Space::Log, 0));
    let cases = [
        ("a flipped body alone", flipped, None),
        ("a flipped body and the commit record", flipped, committed),
        ("a missing body and the commit record", missing, committed),
        ("a flipped body and a log entry", flipped, log),
    ];
    for (case, damage, elsewhere) in cases {
        let (disk, state_machine) = snapshotted(31).await;
        drop(state_machine);
        let key = disk.keys(Space::Bodies)[3];
        damage(&disk, key);
        if let Some((space, key)) = elsewhere {
            let mut batch = cellog_raft::storage::Batch::new();
            batch.put(space, key, b"a record the disk damages");
            disk.write(batch).unwrap();
            disk.sync().unwrap();
            assert!(disk.flip_bit(space, key, 3));
        }
        disk.sync().unwrap();
        disk.crash();
        let (_, state_machine, recovery) = open_stores(disk.clone()).expect("reopens");
        let found_elsewhere = elsewhere.is_some();
        assert_eq!(recovery.bodies_damaged, found_elsewhere, "{case}: {recovery:?}");
        assert_eq!(recovery.snapshot_dropped, found_elsewhere, "{case}: {recovery:?}");
        if found_elsewhere {
            assert!(disk.keys(Space::Bodies).is_empty(), "{case}: every body goes with the state");
            assert!(state_machine.replica().lock().unwrap().cell.stream_info("orders").is_err(), "{case}");
        } else {
            let unreadable = read(&state_machine).iter().filter(|payload| payload.is_err()).count();
            assert_eq!(unreadable, 1, "{case}: found when read");
        }
    }
}
