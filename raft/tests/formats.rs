//! Frozen formats: a stored log entry and a Raft message as this version writes them, committed as fixtures. Every
//! later version must keep decoding them (through a migration if the encoding changes); while this encoding is the
//! one written, it is written byte for byte as committed. `CELLOG_WRITE_FIXTURES=1` writes a missing fixture.

#![cfg(not(madsim))]

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use cellog_core::{Command, Millis, PublishRequest, StreamConfig};
use cellog_raft::log_store::decode_entry;
use cellog_raft::network::{CellIdentity, Frame, frame_message, unframe_message};
use cellog_raft::storage::{Space, frame, unframe};
use cellog_raft::{Entry, NodeId, Request, TypeConfig};
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The committed bytes of `name`, written from `now` first when missing and asked for.
fn committed(name: &str, now: &[u8]) -> Vec<u8> {
    let path = fixture(name);
    if std::env::var_os("CELLOG_WRITE_FIXTURES").is_some() && !path.exists() {
        std::fs::write(&path, now).expect("the fixture is written");
    }
    std::fs::read(&path).expect("the fixture is committed (CELLOG_WRITE_FIXTURES=1 writes a missing one)")
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// An entry with a stream created, a publish carrying everything a publish may carry, and a tick.
fn entry() -> Entry {
    let mut headers = BTreeMap::new();
    headers.insert("Region".to_string(), "eu".to_string());
    let publish = PublishRequest {
        key: Some(Bytes::from_static(b"customer-7")),
        msg_id: Some("order-1".to_string()),
        headers,
        ttl_ms: Some(60_000),
        ..PublishRequest::new("orders.eu.1", Bytes::from_static(b"hello"))
    };
    let commands = vec![
        Command::CreateStream {
            name: "orders".to_string(),
            config: StreamConfig { partitions: 4, ..StreamConfig::with_subjects(["orders.>"]) },
        },
        Command::Publish(publish),
        Command::Tick,
    ];
    Entry { log_id: log_id(3, 7), payload: EntryPayload::Normal(Request::new(Millis(1_700_000_000_000), commands)) }
}

#[test]
fn the_committed_log_entry_still_decodes() {
    let stored = frame(Space::Log, 7, &postcard::to_allocvec(&entry()).expect("an entry encodes"));
    let committed = committed("log-entry-v1.bin", &stored);
    let payload = unframe(Space::Log, 7, &committed).expect("the committed record verifies");
    let decoded = decode_entry(7, payload).expect("the committed entry decodes");
    assert_eq!(decoded, entry());
    assert!(stored == committed, "the log entry encoding changed: version it and migrate");
}

#[test]
fn the_committed_raft_message_still_decodes() {
    let request: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(3, 6)),
        entries: vec![entry()],
        leader_commit: Some(log_id(3, 6)),
    };
    // A frame from a node that does not know its cell's id sums as frames did before cell ids.
    let prod = CellIdentity::new("prod");
    let framed = frame_message(&prod, &request).expect("a request encodes");
    let committed = committed("append-entries-v1.bin", &framed.payload);
    let frame = Frame {
        cell: "prod".to_string(),
        cell_id: None,
        crc32c: crc32c::crc32c(&committed),
        payload: committed.into(),
    };
    let decoded: AppendEntriesRequest<TypeConfig> =
        unframe_message(&prod, &frame).expect("the committed message decodes");
    assert_eq!(
        (decoded.vote, decoded.prev_log_id, decoded.leader_commit),
        (request.vote, request.prev_log_id, request.leader_commit)
    );
    assert_eq!(decoded.entries, request.entries);
    assert!(framed == frame, "the Raft message encoding changed: version it and migrate");
}
