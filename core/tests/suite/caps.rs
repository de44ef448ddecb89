//! Caps on what clients grow in the replicated state: each is hit, refused as `CapReached` naming it, and the refusal
//! changes nothing; room opens again when the state shrinks.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    Cap, Cell, Command, MAX_DEDUP_IDS, MAX_KEY_BYTES, MAX_OPEN_TRANSACTIONS, MAX_PRODUCERS, Outcome, PRODUCER_IDLE_MS,
    ProducerRef, PublishRequest, Rejection, StreamConfig, Transition,
};

fn capped(result: Result<Outcome, Rejection>) -> Option<Cap> {
    match result {
        Err(Rejection::CapReached { cap, .. }) => Some(cap),
        _ => None,
    }
}

#[test]
fn a_key_over_its_cap_is_refused_before_anything() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let mut request = PublishRequest::new("orders.1", Bytes::from_static(b"x"));
    request.key = Some(Bytes::from(vec![b'k'; MAX_KEY_BYTES]));
    h.publish_request(request.clone()).expect("a key at the cap");
    request.key = Some(Bytes::from(vec![b'k'; MAX_KEY_BYTES + 1]));
    let command = Command::Publish(request);
    assert_eq!(command.check(), Err(Rejection::CapReached { cap: Cap::KeyBytes, limit: MAX_KEY_BYTES as u64 }));
    let before = state_parts(&h.cell);
    assert_eq!(capped(h.apply(command)), Some(Cap::KeyBytes));
    assert_eq!(state_parts(&h.cell), before);
}

#[test]
fn producers_and_open_transactions_have_caps() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let mut producers = Vec::new();
    for n in 0..MAX_PRODUCERS {
        producers.push(h.init_producer(&format!("p{n}")));
    }
    let before = state_parts(&h.cell);
    let one_more = Command::InitProducer { transactional_id: "one-more".into(), transaction_timeout_ms: 60_000 };
    assert_eq!(capped(h.apply(one_more.clone())), Some(Cap::Producers));
    assert_eq!(state_parts(&h.cell), before);
    // An existing id is initialized again (fencing its older instance) at the cap.
    h.ok(Command::InitProducer { transactional_id: "p0".into(), transaction_timeout_ms: 60_000 });
    let p0 = h.init_producer("p0");
    producers[0] = p0;

    for r in &producers[..MAX_OPEN_TRANSACTIONS] {
        h.ok(Command::BeginTransaction(*r));
    }
    let before = state_parts(&h.cell);
    let next = producers[MAX_OPEN_TRANSACTIONS];
    assert_eq!(capped(h.apply(Command::BeginTransaction(next))), Some(Cap::OpenTransactions));
    assert_eq!(state_parts(&h.cell), before);
    // Ending one makes room for another.
    h.ok(Command::AbortTransaction(producers[0]));
    h.ok(Command::BeginTransaction(next));
}

#[test]
fn a_stream_s_dedup_index_has_a_cap_as_well_as_a_window() {
    let mut h = Harness::new();
    h.create_stream("ids", StreamConfig { duplicate_window_ms: 60_000, ..StreamConfig::with_subjects(["ids.>"]) });
    for n in 0..MAX_DEDUP_IDS {
        h.publish_id("ids.x", "", &format!("m{n}")).expect("under the cap");
    }
    let before = state_parts(&h.cell);
    let refused = h.publish_id("ids.x", "", "one-more");
    assert_eq!(refused, Err(Rejection::CapReached { cap: Cap::DedupIds, limit: MAX_DEDUP_IDS as u64 }));
    assert_eq!(state_parts(&h.cell), before);
    // A repeat of a remembered id is still answered as the duplicate it is, and a message without an id goes in.
    assert!(h.publish_id("ids.x", "", "m7").expect("a duplicate").duplicate);
    h.publish("ids.x", "").expect("no id, no dedup entry");
    // Once the window lets the old ids go, new ones are taken again.
    h.advance(60_001);
    h.tick();
    assert!(!h.publish_id("ids.x", "", "one-more").expect("room again").duplicate);
}

/// Staging a publish is activity too: a producer whose transaction ended by its timeout has been idle since its
/// last staged publish, not since the transaction began.
#[test]
fn a_staged_publish_keeps_its_producer_active() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let p = h.init_producer("p");
    h.ok(Command::BeginTransaction(p));
    h.advance(50_000);
    h.ok(Command::Publish(PublishRequest { transaction: Some(p), ..PublishRequest::new("orders.a", "x") }));
    // The transaction's timeout (60 s) ends it; its producer stays until PRODUCER_IDLE_MS after the staged publish.
    h.advance(PRODUCER_IDLE_MS - 1);
    h.tick();
    assert!(h.cell.producer_info(p.producer_id).is_some(), "idle for less than PRODUCER_IDLE_MS");
    h.advance(1);
    h.tick();
    assert!(h.cell.producer_info(p.producer_id).is_none(), "idle for PRODUCER_IDLE_MS");
}

/// A transactional producer that does nothing for [`PRODUCER_IDLE_MS`] is forgotten, freeing its place under the
/// cap: its old instance is refused from then on, and its transactional id starts a new producer. One with a
/// transaction open waits for it to end, and any successful command of it starts its idle time again.
#[test]
fn an_idle_producer_expires_and_frees_its_place() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let idle = h.init_producer("idle");
    let busy = h.init_producer("busy");
    let open = h.init_producer("open");
    h.ok(Command::BeginTransaction(open));
    h.advance(PRODUCER_IDLE_MS - 10);
    // The busy one acts just before its time is up; the others do not.
    h.ok(Command::BeginTransaction(busy));
    h.ok(Command::AbortTransaction(busy));
    let busy = ProducerRef { epoch: busy.epoch + 1, ..busy };
    h.advance(10);
    h.take_effects();
    h.tick();
    let expired: Vec<u64> = h
        .take_effects()
        .into_iter()
        .filter_map(|effect| match effect {
            Transition::ProducerExpired { producer_id, .. } => Some(producer_id),
            _ => None,
        })
        .collect();
    // The open transaction's producer was aborted by its timeout long ago (60 s), and had been idle since it began.
    assert_eq!(expired, [idle.producer_id, open.producer_id]);
    assert!(h.cell.producer_info(idle.producer_id).is_none());
    assert_eq!(
        h.apply(Command::BeginTransaction(idle)),
        Err(Rejection::ProducerNotFound { producer_id: idle.producer_id })
    );
    // Its transactional id starts afresh: a new producer, at epoch 0.
    let again = h.init_producer("idle");
    assert_ne!(again.producer_id, idle.producer_id);
    assert_eq!(again.epoch, 0);
    h.ok(Command::BeginTransaction(busy));

    // At the cap, an idle producer's expiry makes room for a new one.
    let mut h = Harness::new();
    for n in 0..MAX_PRODUCERS - 1 {
        h.init_producer(&format!("p{n}"));
    }
    h.advance(PRODUCER_IDLE_MS / 2);
    let late = h.init_producer("late");
    let one_more = || Command::InitProducer { transactional_id: "one-more".into(), transaction_timeout_ms: 60_000 };
    assert_eq!(capped(h.apply(one_more())), Some(Cap::Producers));
    h.advance(PRODUCER_IDLE_MS / 2);
    assert!(matches!(h.apply(one_more()), Ok(Outcome::ProducerInitialized(_))), "the idle ones expired");
    assert!(h.cell.producer_info(late.producer_id).is_some(), "the later one has time left");
}

/// A producer's idle time is state: a replica restored from a snapshot expires the same producers at the same time as
/// the one that took it.
#[test]
fn producer_expiry_is_the_same_after_a_restore() {
    let mut h = Harness::new();
    let first = h.init_producer("first");
    h.advance(1_000);
    let second = h.init_producer("second");
    let mut restored = Harness { cell: Cell::restore(&h.cell.snapshot()).expect("restores"), ..Harness::new() };
    restored.now = h.now;
    restored.bodies = h.bodies.clone();
    for replica in [&mut h, &mut restored] {
        replica.advance(PRODUCER_IDLE_MS - 500);
        replica.tick();
        assert!(replica.cell.producer_info(first.producer_id).is_none());
        assert!(replica.cell.producer_info(second.producer_id).is_some());
        replica.advance(500);
        replica.tick();
        assert!(replica.cell.producer_info(second.producer_id).is_none());
    }
    assert_eq!(h.cell.digest(), restored.cell.digest());
}
