//! Caps on what clients grow in the replicated state: each is hit, refused as `CapReached` naming it, and the refusal
//! changes nothing; room opens again when the state shrinks.

mod common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    Cap, Command, MAX_DEDUP_IDS, MAX_KEY_BYTES, MAX_OPEN_TRANSACTIONS, MAX_PRODUCERS, Outcome, PublishRequest,
    Rejection, StreamConfig,
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
