//! Message bodies live in the body store, not in the cell's state: each removal lets go of its body, a dead letter
//! copies its body, a damaged body is never served, and snapshots carry bodies only when asked to.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use cellog_core::{
    AckKind, Bodies, Body, BodyStore, Cell, Command, ConsumerConfig, MemoryBodies, Millis, PublishRequest,
    SnapshotError, StreamConfig,
};
use common::Harness;

/// A harness whose cell keeps its bodies in `store`.
fn harness_over(store: Arc<dyn BodyStore>) -> Harness {
    Harness { cell: Cell::with_bodies(store), ..Harness::new() }
}

fn payload(body: &Body) -> &[u8] {
    match body {
        Body::Payload(bytes) => bytes,
        other => panic!("expected a payload, found {other:?}"),
    }
}

#[test]
fn bodies_are_stored_outside_the_state() {
    let store = Arc::new(MemoryBodies::default());
    let mut h = harness_over(store.clone());
    h.simple_stream("orders");
    let big = "x".repeat(10_000);
    for _ in 0..100 {
        h.publish("orders.a", &big).unwrap();
    }
    assert_eq!(store.len(), 100);
    // A million bytes of payload, and the state without them is a few kilobytes.
    let state = h.cell.snapshot_state();
    assert!(state.len() < 20_000, "state-only snapshot is {} bytes", state.len());
    let whole = h.cell.snapshot().unwrap();
    assert!(whole.len() > 1_000_000, "whole snapshot is {} bytes", whole.len());
    assert_eq!(payload(&h.cell.read("orders", 0, 7).unwrap().body), big.as_bytes());
}

#[test]
fn every_way_a_message_goes_lets_go_of_its_body() {
    let store = Arc::new(MemoryBodies::default());
    let mut h = harness_over(store.clone());
    h.create_stream("dlq", StreamConfig::with_subjects(["dlq.>"]));
    h.create_stream(
        "orders",
        StreamConfig {
            max_messages: Some(3),
            dead_letter_stream: Some("dlq".to_string()),
            ..StreamConfig::with_subjects(["orders.>"])
        },
    );
    for i in 1..=5 {
        h.publish("orders.a", &format!("m{i}")).unwrap();
    }
    // The limit removed two.
    assert_eq!((store.len(), h.cell.body_refs().len()), (3, 3));

    // A recall drops the body, keeping the tombstone.
    h.ok(Command::Recall { stream: "orders".to_string(), partition: 0, seq: 5 });
    assert_eq!(store.len(), 2);
    assert!(matches!(h.cell.read("orders", 0, 5).unwrap().body, Body::Tombstone { .. }));

    // A dead letter copies its body: the copy reads back the original's bytes.
    h.create_consumer("orders", "c", ConsumerConfig { max_deliver: Some(1), ..ConsumerConfig::default() });
    let delivered = h.fetch("orders", "c", 1);
    let seq = delivered[0].record.seq;
    assert_eq!(seq, 3);
    h.ack("orders", "c", 0, seq, AckKind::Failed).unwrap();
    let copies = h.cell.read_from("dlq", 0, 1, 10).unwrap();
    assert_eq!(payload(&copies[0].body), payload(&delivered[0].record.body));
    assert_eq!(store.len(), 3);

    // Deleting a stream drops every body it held; the copy stays.
    h.ok(Command::DeleteStream { name: "orders".to_string() });
    assert_eq!(store.len(), 1);
    assert_eq!(h.cell.body_refs().len(), 1);
    assert_eq!(payload(&h.cell.read("dlq", 0, 1).unwrap().body), payload(&delivered[0].record.body));

    // A recalled message dead-lettered: its copy has an empty body.
    h.create_stream(
        "tasks",
        StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..StreamConfig::with_subjects(["tasks.>"]) },
    );
    h.publish("tasks.a", "secret").unwrap();
    h.ok(Command::Recall { stream: "tasks".to_string(), partition: 0, seq: 1 });
    h.create_consumer("tasks", "c", ConsumerConfig { max_deliver: Some(1), ..ConsumerConfig::default() });
    h.fetch("tasks", "c", 1);
    h.ack("tasks", "c", 0, 1, AckKind::Failed).unwrap();
    assert_eq!(payload(&h.cell.read("dlq", 0, 2).unwrap().body), b"");
    assert_eq!(store.len(), 2);
}

/// A store that answers with whatever a test put in its place.
#[derive(Default)]
struct Tampered {
    bodies: Mutex<BTreeMap<u64, Bytes>>,
}

impl Tampered {
    fn replace(&self, key: u64, bytes: &'static [u8]) {
        self.bodies.lock().unwrap().insert(key, Bytes::from_static(bytes));
    }

    fn lose(&self, key: u64) {
        self.bodies.lock().unwrap().remove(&key);
    }
}

impl BodyStore for Tampered {
    fn put(&self, key: u64, body: Bytes) {
        self.bodies.lock().unwrap().insert(key, body);
    }
    fn copy(&self, from: u64, to: u64) {
        let body = self.bodies.lock().unwrap().get(&from).cloned();
        if let Some(body) = body {
            self.put(to, body);
        }
    }
    fn delete(&self, key: u64) {
        self.bodies.lock().unwrap().remove(&key);
    }
    fn get(&self, key: u64) -> Result<Bytes, String> {
        self.bodies.lock().unwrap().get(&key).cloned().ok_or_else(|| format!("no body {key}"))
    }
}

#[test]
fn a_damaged_or_missing_body_is_never_served() {
    let store = Arc::new(Tampered::default());
    let mut h = harness_over(store.clone());
    h.simple_stream("orders");
    h.publish("orders.a", "first").unwrap();
    h.publish("orders.a", "second").unwrap();
    h.publish("orders.a", "third").unwrap();
    let keys: Vec<u64> = h.cell.body_refs().iter().map(|body| body.key).collect();

    // Same length, other bytes: the crc32c in the state catches it.
    store.replace(keys[0], b"FIRST");
    let Body::Unreadable { reason } = h.cell.read("orders", 0, 1).unwrap().body else {
        panic!("served a changed body")
    };
    assert!(reason.contains("crc32c"), "{reason}");
    // Another length.
    store.replace(keys[1], b"sec");
    let Body::Unreadable { reason } = h.cell.read("orders", 0, 2).unwrap().body else { panic!("served a cut body") };
    assert!(reason.contains("bytes long"), "{reason}");
    // Gone.
    store.lose(keys[2]);
    assert!(matches!(h.cell.read("orders", 0, 3).unwrap().body, Body::Unreadable { .. }));

    // A consumer is not handed the damaged bytes either, and a whole snapshot cannot be made.
    h.create_consumer("orders", "c", ConsumerConfig::default());
    let delivered = h.fetch("orders", "c", 3);
    assert!(delivered.iter().all(|d| matches!(d.record.body, Body::Unreadable { .. })));
    assert!(matches!(h.cell.snapshot(), Err(SnapshotError::Body { key, .. }) if key == keys[0]));
}

#[test]
fn a_state_only_snapshot_restores_over_the_store_that_holds_the_bodies() {
    let store = Arc::new(MemoryBodies::default());
    let mut h = harness_over(store.clone());
    h.simple_stream("orders");
    h.publish("orders.a", "kept").unwrap();
    let state = h.cell.snapshot_state();
    assert_eq!(Cell::restore(&state), Err(SnapshotError::NoBodies));

    let restored = Cell::restore_with(&state, Bodies::new(store.clone())).unwrap();
    assert_eq!(restored, h.cell);
    assert_eq!(restored.digest(), h.cell.digest());
    assert_eq!(payload(&restored.read("orders", 0, 1).unwrap().body), b"kept");

    // A whole snapshot fills an empty store.
    let empty = Arc::new(MemoryBodies::default());
    let restored = Cell::restore_with(&h.cell.snapshot().unwrap(), Bodies::new(empty.clone())).unwrap();
    assert_eq!(empty.len(), 1);
    assert_eq!(payload(&restored.read("orders", 0, 1).unwrap().body), b"kept");
}

#[test]
fn the_digest_covers_each_bodys_bytes() {
    let digest_of = |text: &str| {
        let mut h = Harness::new();
        h.simple_stream("orders");
        h.publish("orders.a", text).unwrap();
        h.cell.digest()
    };
    assert_eq!(digest_of("abc"), digest_of("abc"));
    assert_ne!(digest_of("abc"), digest_of("abd"));
}

#[test]
fn body_keys_are_part_of_the_state_and_never_reused() {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { max_messages: Some(1), ..StreamConfig::with_subjects(["orders.>"]) });
    let mut keys = Vec::new();
    for i in 0..5 {
        h.publish("orders.a", &format!("m{i}")).unwrap();
        keys.extend(h.cell.body_refs().iter().map(|body| body.key));
    }
    assert_eq!(keys, vec![1, 2, 3, 4, 5]);
    // A restored cell goes on counting where the original was.
    let mut restored = Cell::restore(&h.cell.snapshot().unwrap()).unwrap();
    restored.apply(Millis(10_000), Command::Publish(PublishRequest::new("orders.a", "next"))).unwrap();
    assert_eq!(restored.body_refs().iter().map(|body| body.key).collect::<Vec<_>>(), vec![6]);
}

#[test]
fn a_restored_cell_shares_each_subject_among_its_messages() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    for i in 0..3 {
        h.publish("orders.a", &format!("m{i}")).unwrap();
    }
    let restored = Cell::restore(&h.cell.snapshot().unwrap()).unwrap();
    let records = restored.read_from("orders", 0, 0, 10).unwrap();
    assert!(records.windows(2).all(|pair| Arc::ptr_eq(&pair[0].subject, &pair[1].subject)));
}
