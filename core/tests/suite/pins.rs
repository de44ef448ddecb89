//! Pins: a message carrying `Cellog-Pin: STREAM/PARTITION/SEQ` keeps that message from retention, recall and stream
//! deletion until every message pinning it is gone. Provenance rows pin the envelopes they describe this way.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    Cell, Command, DiscardPolicy, Millis, PIN_HEADER, PublishAck, PublishRequest, Rejection, RemovalReason, Transition,
};

fn retained(h: &Harness, stream: &str) -> Vec<u64> {
    h.cell.read_from(stream, 0, 0, 1_000).unwrap().iter().map(|r| r.seq).collect()
}

fn pin_request(subject: &str, target: &str) -> PublishRequest {
    let mut request = PublishRequest::new(subject, Bytes::from_static(b"row"));
    request.headers.insert(PIN_HEADER.to_string(), target.to_string());
    request
}

fn pin(h: &mut Harness, subject: &str, target: &str) -> Result<PublishAck, Rejection> {
    h.publish_request(pin_request(subject, target))
}

/// `material` (messages age out after 1 s, at most `max` kept) and `rows` (the pinning messages, default limits).
fn setup(max: Option<u64>, discard: DiscardPolicy) -> Harness {
    let mut h = Harness::new();
    let mut material = config(&["material.>"]);
    material.max_age_ms = Some(1_000);
    material.max_messages = max;
    material.discard = discard;
    h.create_stream("material", material);
    h.create_stream("rows", config(&["rows.>"]));
    h
}

/// Three messages, the second pinned, aged past their max age; then the pinning message removed by its own stream's
/// limit while a second row pins the same message, and that row removed too. Returns the transitions of the first
/// half (up to the age removal).
fn pinned_until_its_pins_go(h: &mut Harness) -> Vec<Transition> {
    for body in ["a", "b", "c"] {
        h.publish("material.x", body).unwrap();
    }
    pin(h, "rows.x", "material/0/2").unwrap();
    h.advance(5_000);
    h.tick();
    // Age removal goes oldest first and stops at a pinned message, as it does at a peer's watermark.
    assert_eq!(retained(h, "material"), vec![2, 3], "1 aged out; 2 is pinned, and 3 waits behind it");

    // The pinning message goes (its own stream's limit removes it), and the pinned one follows at once.
    let first_half = h.take_effects();
    let mut one_row = config(&["rows.>"]);
    one_row.max_messages = Some(1);
    h.ok(Command::UpdateStream { name: "rows".to_string(), config: one_row });
    pin(h, "rows.y", "material/0/2").unwrap();
    assert_eq!(retained(h, "material"), vec![2, 3], "still pinned by the second row");
    h.publish("rows.z", "a row pinning nothing").unwrap();
    assert_eq!(retained(h, "material"), Vec::<u64>::new(), "the last pin went with the second row");
    first_half
}

#[test]
fn a_pinned_message_outlives_its_max_age_until_its_pin_is_removed() {
    let mut h = setup(None, DiscardPolicy::Old);
    pinned_until_its_pins_go(&mut h);
    let removed: Vec<(String, u64, RemovalReason)> = h
        .take_effects()
        .into_iter()
        .filter_map(|effect| match effect {
            Transition::Removed { stream, seq, reason, .. } => Some((stream.to_string(), seq, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        removed,
        vec![
            ("rows".to_string(), 1, RemovalReason::StreamLimit),
            ("rows".to_string(), 2, RemovalReason::StreamLimit),
            ("material".to_string(), 2, RemovalReason::Age),
            ("material".to_string(), 3, RemovalReason::Age),
        ]
    );
}

/// Pins are released by the removals a cell follows itself, so they hold as well in a cell that builds no transitions
/// (a node that traces nothing).
#[test]
fn pins_hold_and_release_in_a_cell_that_traces_nothing() {
    let mut h = setup(None, DiscardPolicy::Old);
    h.traced = false;
    let first_half = pinned_until_its_pins_go(&mut h);
    assert_eq!((first_half, h.take_effects()), (Vec::new(), Vec::new()), "nothing was built for a trace");
}

#[test]
fn making_room_past_a_pinned_message_is_refused_and_nothing_is_lost() {
    let mut h = setup(Some(2), DiscardPolicy::Old);
    h.publish("material.x", "a").unwrap();
    h.publish("material.x", "b").unwrap();
    pin(&mut h, "rows.x", "material/0/1").unwrap();
    let refused = h.publish("material.x", "c").unwrap_err();
    assert_eq!(refused, Rejection::Pinned { stream: "material".to_string(), partition: 0, seq: 1 });
    assert!(refused.to_string().contains("pinned"), "{refused}");
    assert_eq!(retained(&h, "material"), vec![1, 2]);
}

#[test]
fn a_pinned_message_cannot_be_recalled_and_its_stream_cannot_be_deleted() {
    let mut h = setup(None, DiscardPolicy::Old);
    h.publish("material.x", "a").unwrap();
    pin(&mut h, "rows.x", "material/0/1").unwrap();
    let recall = h.apply(Command::Recall { stream: "material".to_string(), partition: 0, seq: 1 });
    assert_eq!(recall, Err(Rejection::Pinned { stream: "material".to_string(), partition: 0, seq: 1 }));
    let delete = h.apply(Command::DeleteStream { name: "material".to_string() }).unwrap_err();
    assert!(matches!(&delete, Rejection::InUse { by, .. } if by.contains("\"rows\" 0/1")), "{delete}");

    // Deleting the pinning stream releases the pin; retention takes the aged message at once.
    h.advance(5_000);
    h.ok(Command::DeleteStream { name: "rows".to_string() });
    assert_eq!(retained(&h, "material"), Vec::<u64>::new());
    h.ok(Command::DeleteStream { name: "material".to_string() });
}

#[test]
fn two_pins_on_one_message_hold_it_until_both_are_gone() {
    let mut h = setup(None, DiscardPolicy::Old);
    let mut short_rows = config(&["rows.>"]);
    short_rows.max_age_ms = Some(10_000);
    h.ok(Command::UpdateStream { name: "rows".to_string(), config: short_rows });
    h.publish("material.x", "a").unwrap();
    pin(&mut h, "rows.x", "material/0/1").unwrap();
    h.advance(6_000);
    pin(&mut h, "rows.y", "material/0/1").unwrap();
    h.advance(5_000);
    h.tick();
    assert_eq!(retained(&h, "rows"), vec![2], "the first row aged out");
    assert_eq!(retained(&h, "material"), vec![1], "the second row still pins it");
    h.advance(6_000);
    h.tick();
    assert_eq!(retained(&h, "material"), Vec::<u64>::new());
}

#[test]
fn a_duplicate_pinning_publish_pins_once() {
    let mut h = setup(None, DiscardPolicy::Old);
    h.publish("material.x", "a").unwrap();
    let mut request = pin_request("rows.x", "material/0/1");
    request.msg_id = Some("row-1".to_string());
    h.publish_request(request.clone()).unwrap();
    assert!(h.publish_request(request).unwrap().duplicate);
    h.advance(5_000);
    h.ok(Command::Recall { stream: "rows".to_string(), partition: 0, seq: 1 });
    // Recalling the row keeps it (a tombstone); deleting the stream removes the one pin.
    h.ok(Command::DeleteStream { name: "rows".to_string() });
    assert_eq!(retained(&h, "material"), Vec::<u64>::new());
}

#[test]
fn bad_pins_are_refused_with_typed_errors() {
    let mut h = setup(None, DiscardPolicy::Old);
    h.publish("material.x", "a").unwrap();
    for value in ["material", "material/0", "material/x/1", "a/b/c/0/1", "", "material/-1/1", "mat.erial/0/1"] {
        let refused = pin(&mut h, "rows.x", value).unwrap_err();
        assert!(matches!(refused, Rejection::Invalid { .. }), "{value:?}: {refused}");
    }
    assert_eq!(
        pin(&mut h, "rows.x", "nowhere/0/1").unwrap_err(),
        Rejection::StreamNotFound { stream: "nowhere".to_string() }
    );
    // A tenant's stream is named TENANT/NAME: the pin is read from the right.
    assert_eq!(
        pin(&mut h, "rows.x", "material/0/1/2").unwrap_err(),
        Rejection::StreamNotFound { stream: "material/0".to_string() }
    );
    assert_eq!(
        pin(&mut h, "rows.x", "material/0/7").unwrap_err(),
        Rejection::MessageNotFound { stream: "material".to_string(), partition: 0, seq: 7 }
    );
    assert!(matches!(pin(&mut h, "rows.x", "rows/0/1").unwrap_err(), Rejection::MessageNotFound { .. }));
    h.publish("rows.x", "plain").unwrap();
    assert!(matches!(pin(&mut h, "rows.x", "rows/0/1").unwrap_err(), Rejection::Invalid { .. }), "own stream");
    let producer = h.init_producer("t");
    h.ok(Command::BeginTransaction(producer));
    let mut staged = pin_request("rows.x", "material/0/1");
    staged.transaction = Some(producer);
    assert!(matches!(h.publish_request(staged).unwrap_err(), Rejection::Invalid { .. }), "in a transaction");
    h.advance(5_000);
    h.tick();
    assert_eq!(retained(&h, "material"), Vec::<u64>::new(), "no refused publish left a pin behind");
}

#[test]
fn pins_survive_a_snapshot() {
    let mut h = setup(None, DiscardPolicy::Old);
    h.publish("material.x", "a").unwrap();
    pin(&mut h, "rows.x", "material/0/1").unwrap();
    let mut restored = Cell::restore(&h.cell.snapshot()).unwrap();
    assert_eq!(restored.digest(), h.cell.digest());
    restored.apply(Millis(100_000), Command::Tick).unwrap();
    restored.drain_work().for_each(drop);
    assert_eq!(restored.read_from("material", 0, 0, 10).unwrap().len(), 1, "still pinned after the restore");
    restored.apply(Millis(100_001), Command::DeleteStream { name: "rows".to_string() }).unwrap();
    assert_eq!(restored.read_from("material", 0, 0, 10).unwrap().len(), 0);
}

#[test]
fn a_stream_limit_lowered_past_a_pin_stops_at_it() {
    let mut h = setup(None, DiscardPolicy::Old);
    for body in ["a", "b", "c"] {
        h.publish("material.x", body).unwrap();
    }
    pin(&mut h, "rows.x", "material/0/1").unwrap();
    let mut lowered = config(&["material.>"]);
    lowered.max_messages = Some(1);
    h.ok(Command::UpdateStream { name: "material".to_string(), config: lowered });
    assert_eq!(retained(&h, "material"), vec![1, 2, 3], "oldest-first removal stops at the pinned message");
}
