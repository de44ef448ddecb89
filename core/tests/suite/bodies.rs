//! Message bodies leave the cell as effects and come back only by reference: a publish asks the host to store its
//! body, each removal releases it, a dead letter copies it, records carry references the host verifies, and
//! snapshots carry bodies only when the host hands them over.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use cellog_core::{
    AckKind, Body, BodyOp, BodyRef, Cell, Command, ConsumerConfig, MemoryBodies, Millis, PublishRequest, SnapshotError,
    StreamConfig,
};
use common::Harness;

/// The body work of one command, as data.
fn body_work(h: &mut Harness, command: Command) -> Vec<BodyOp> {
    let outcome = h.cell.apply(h.now, command);
    outcome.unwrap_or_else(|rejection| panic!("{rejection}"));
    h.cell.drain_transitions().for_each(drop);
    let work: Vec<BodyOp> = h.cell.drain_work().collect();
    work.iter().for_each(|work| h.bodies.apply(work));
    work
}

#[test]
fn a_publish_hands_its_body_to_the_host_and_keeps_a_reference() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let work = body_work(&mut h, Command::Publish(PublishRequest::new("orders.a", "hello")));
    let hello = Bytes::from_static(b"hello");
    assert_eq!(work, vec![BodyOp::BodyStored { body: BodyRef::of(1, &hello), bytes: hello }]);
    let record = h.cell.read("orders", 0, 1).unwrap();
    let Body::Stored(body) = record.body else { panic!("expected a stored body, found {:?}", record.body) };
    assert_eq!((body.key, body.len, body.crc), (1, 5, crc32c::crc32c(b"hello")));
}

#[test]
fn bodies_are_kept_outside_the_state() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let big = "x".repeat(10_000);
    for _ in 0..100 {
        h.publish("orders.a", &big).unwrap();
    }
    assert_eq!(h.bodies.len(), 100);
    // A million bytes of payload, and the state without them is a few kilobytes.
    let state = h.cell.snapshot();
    assert!(state.len() < 20_000, "state-only snapshot is {} bytes", state.len());
    let bodies: Vec<(u64, Bytes)> = h.bodies.iter().map(|(key, body)| (key, body.clone())).collect();
    let whole = h.cell.snapshot_whole(bodies).unwrap();
    assert!(whole.len() > 1_000_000, "whole snapshot is {} bytes", whole.len());
    assert_eq!(h.payload(&h.cell.read("orders", 0, 7).unwrap()), big.as_bytes());
}

#[test]
fn every_way_a_message_goes_releases_its_body() {
    let mut h = Harness::new();
    h.create_stream("dlq", StreamConfig::with_subjects(["dlq.>"]));
    h.create_stream(
        "orders",
        StreamConfig {
            max_messages: Some(3),
            dead_letter_stream: Some("dlq".to_string()),
            ..StreamConfig::with_subjects(["orders.>"])
        },
    );
    for i in 1..=3 {
        h.publish("orders.a", &format!("m{i}")).unwrap();
    }
    // The limit makes room: the oldest body is released before the new one is stored.
    let work = body_work(&mut h, Command::Publish(PublishRequest::new("orders.a", "m4")));
    assert_eq!(
        work,
        vec![BodyOp::BodyReleased { key: 1 }, BodyOp::BodyStored { body: BodyRef::of(4, b"m4"), bytes: "m4".into() }]
    );
    h.publish("orders.a", "m5").unwrap();
    assert_eq!((h.bodies.len(), h.cell.body_refs().len()), (3, 3));

    // A recall releases the body, keeping the tombstone.
    let work = body_work(&mut h, Command::Recall { stream: "orders".to_string(), partition: 0, seq: 5 });
    assert_eq!(work, vec![BodyOp::BodyReleased { key: 5 }]);
    assert!(matches!(h.cell.read("orders", 0, 5).unwrap().body, Body::Tombstone { .. }));

    // A dead letter copies its body under a new key: the copy reads back the original's bytes.
    h.create_consumer("orders", "c", ConsumerConfig { max_deliver: Some(1), ..ConsumerConfig::default() });
    let delivered = h.fetch("orders", "c", 1);
    let seq = delivered[0].record.seq;
    assert_eq!(seq, 3);
    let work = body_work(
        &mut h,
        Command::Ack { stream: "orders".into(), consumer: "c".into(), partition: 0, seq, kind: AckKind::Failed },
    );
    assert_eq!(work, vec![BodyOp::BodyCopied { from: 3, to: 6 }]);
    let copies = h.cell.read_from("dlq", 0, 1, 10).unwrap();
    assert_eq!(h.payload(&copies[0]), h.payload(&delivered[0].record));
    assert_eq!(h.bodies.len(), 3);

    // Deleting a stream releases every body it held; the copy stays.
    let work = body_work(&mut h, Command::DeleteStream { name: "orders".to_string() });
    assert_eq!(work, vec![BodyOp::BodyReleased { key: 3 }, BodyOp::BodyReleased { key: 4 }]);
    assert_eq!(h.bodies.len(), 1);
    assert_eq!(h.cell.body_refs().len(), 1);
    assert_eq!(h.payload(&h.cell.read("dlq", 0, 1).unwrap()), "m3");

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
    assert_eq!(h.payload(&h.cell.read("dlq", 0, 2).unwrap()), b"".as_slice());
    assert_eq!(h.bodies.len(), 2);
}

#[test]
fn a_damaged_or_missing_body_does_not_verify() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish("orders.a", "first").unwrap();
    h.publish("orders.a", "second").unwrap();
    h.publish("orders.a", "third").unwrap();
    let keys: Vec<u64> = h.cell.body_refs().iter().map(|body| body.key).collect();
    let read = |h: &Harness, seq: u64| h.bodies.payload(&h.cell.read("orders", 0, seq).unwrap());

    // Same length, other bytes: the crc32c in the reference catches it.
    h.bodies.insert(keys[0], Bytes::from_static(b"FIRST"));
    let reason = read(&h, 1).unwrap_err();
    assert!(reason.contains("crc32c"), "{reason}");
    // Another length.
    h.bodies.insert(keys[1], Bytes::from_static(b"sec"));
    let reason = read(&h, 2).unwrap_err();
    assert!(reason.contains("bytes long"), "{reason}");
    // Gone.
    h.bodies.remove(keys[2]);
    assert!(read(&h, 3).is_err());

    // A whole snapshot cannot be made of bodies that do not verify.
    let bodies: Vec<(u64, Bytes)> = h.bodies.iter().map(|(key, body)| (key, body.clone())).collect();
    assert!(matches!(h.cell.snapshot_whole(bodies), Err(SnapshotError::Malformed { .. })));
    let mut bodies: Vec<(u64, Bytes)> = h.bodies.iter().map(|(key, body)| (key, body.clone())).collect();
    bodies.push((keys[2], Bytes::from_static(b"third")));
    assert!(matches!(h.cell.snapshot_whole(bodies), Err(SnapshotError::Body { key, .. }) if key == keys[0]));
}

#[test]
fn a_whole_snapshot_carries_the_bodies_a_state_only_one_does_not() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish("orders.a", "kept").unwrap();
    let state = h.cell.snapshot();
    assert_eq!(Cell::restore_whole(&state), Err(SnapshotError::NoBodies));

    // A state-only snapshot restores over the store that holds the bodies.
    let restored = Cell::restore(&state).unwrap();
    assert_eq!(restored, h.cell);
    assert_eq!(restored.digest(), h.cell.digest());
    assert_eq!(h.bodies.payload(&restored.read("orders", 0, 1).unwrap()).unwrap(), "kept");

    // A whole snapshot fills an empty store.
    let whole = h.cell.snapshot_whole(vec![(1, Bytes::from_static(b"kept"))]).unwrap();
    let (restored, bodies) = Cell::restore_whole(&whole).unwrap();
    assert_eq!(bodies, vec![(1, Bytes::from_static(b"kept"))]);
    let mut empty = MemoryBodies::default();
    assert!(empty.is_empty());
    bodies.into_iter().for_each(|(key, body)| empty.insert(key, body));
    assert!(!empty.is_empty());
    assert_eq!(empty.payload(&restored.read("orders", 0, 1).unwrap()).unwrap(), "kept");
    // And it restores as a state too, its bodies checked and left out.
    assert_eq!(Cell::restore(&whole).unwrap(), h.cell);
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
    let mut restored = Cell::restore(&h.cell.snapshot()).unwrap();
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
    let restored = Cell::restore(&h.cell.snapshot()).unwrap();
    let records = restored.read_from("orders", 0, 0, 10).unwrap();
    assert!(records.windows(2).all(|pair| Arc::ptr_eq(&pair[0].subject, &pair[1].subject)));
}
