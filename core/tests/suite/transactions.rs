//! Transactional producers: epochs and fencing, staging, commit and abort, retried ends, prepare, timeouts,
//! commit-time limits, message ids and conditional appends inside a transaction.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    AbortReason, Body, Command, ConsumerConfig, DiscardPolicy, MAX_PAYLOAD_LIMIT, MAX_TRANSACTION_BYTES,
    MAX_TRANSACTION_MESSAGES, Millis, Outcome, ProducerRef, PublishAck, PublishRequest, Quota, Rejection, StreamConfig,
    Transition, subject::partition_for_key,
};

// ----- shorthands -----

/// A request staged into `r`'s transaction.
fn staged(subject: &str, payload: &str, r: ProducerRef) -> PublishRequest {
    PublishRequest { transaction: Some(r), ..PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes())) }
}

fn stage(h: &mut Harness, subject: &str, payload: &str, r: ProducerRef) -> Result<Outcome, Rejection> {
    h.apply(Command::Publish(staged(subject, payload, r)))
}

fn begin(h: &mut Harness, r: ProducerRef) -> Result<Outcome, Rejection> {
    h.apply(Command::BeginTransaction(r))
}

fn commit(h: &mut Harness, r: ProducerRef) -> Result<Outcome, Rejection> {
    h.apply(Command::CommitTransaction(r))
}

fn abort(h: &mut Harness, r: ProducerRef) -> Result<Outcome, Rejection> {
    h.apply(Command::AbortTransaction(r))
}

fn prepare(h: &mut Harness, r: ProducerRef) -> Result<Outcome, Rejection> {
    h.apply(Command::PrepareTransaction(r))
}

/// Commits and returns the acks and the next producer reference.
fn committed(h: &mut Harness, r: ProducerRef) -> (Vec<PublishAck>, ProducerRef) {
    match commit(h, r) {
        Ok(Outcome::TransactionCommitted { messages, next }) => (messages, next),
        other => panic!("commit answered {other:?}"),
    }
}

fn init_with_timeout(h: &mut Harness, transactional_id: &str, timeout_ms: u64) -> ProducerRef {
    match h.ok(Command::InitProducer {
        transactional_id: transactional_id.to_string(),
        transaction_timeout_ms: timeout_ms,
    }) {
        Outcome::ProducerInitialized(r) => r,
        other => panic!("init answered {other:?}"),
    }
}

fn epoch(r: ProducerRef, epoch: u32) -> ProducerRef {
    ProducerRef { epoch, ..r }
}

/// Payloads of a partition's retained messages, as text.
fn payloads(h: &Harness, stream: &str, partition: u32) -> Vec<String> {
    h.cell
        .read_from(stream, partition, 1, 1_000)
        .unwrap()
        .iter()
        .map(|record| {
            assert!(matches!(record.body, Body::Stored(_)), "unexpected tombstone");
            String::from_utf8_lossy(&h.payload(record)).into_owned()
        })
        .collect()
}

fn aborted_effects(effects: &[Transition]) -> Vec<(u64, u32, AbortReason)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Transition::TransactionAborted { producer_id, epoch, reason } => Some((*producer_id, *epoch, *reason)),
            _ => None,
        })
        .collect()
}

fn appended(effects: &[Transition]) -> Vec<(String, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Transition::Appended { stream, seq, .. } => Some((stream.to_string(), *seq)),
            _ => None,
        })
        .collect()
}

/// Streams `orders` (`orders.>`) and `audit` (`audit.>`) and a producer `tx` with an open transaction.
fn open() -> (Harness, ProducerRef) {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.simple_stream("audit");
    let r = h.init_producer("tx");
    assert_eq!(begin(&mut h, r).unwrap(), Outcome::TransactionBegun);
    h.take_effects();
    (h, r)
}

// ----- producers and epochs -----

#[test]
fn init_producer_returns_an_id_and_epoch_zero() {
    let mut h = Harness::new();
    let r = h.init_producer("tx");
    assert_eq!(r.epoch, 0);
    let info = h.cell.producer_info(r.producer_id).unwrap();
    assert_eq!(info.producer_id, r.producer_id);
    assert_eq!(info.transactional_id.as_ref(), "tx");
    assert_eq!(info.epoch, 0);
    assert_eq!(info.open_transaction, None);
    assert!(!info.prepared);
}

#[test]
fn distinct_transactional_ids_get_distinct_producers() {
    let mut h = Harness::new();
    let a = h.init_producer("a");
    let b = h.init_producer("b");
    assert_ne!(a.producer_id, b.producer_id);
    assert_eq!(b.epoch, 0);
}

#[test]
fn second_init_bumps_the_epoch_and_fences_the_old_instance() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let old = h.init_producer("tx");
    let new = h.init_producer("tx");
    assert_eq!(new.producer_id, old.producer_id);
    assert!(new.epoch > old.epoch, "{new:?} after {old:?}");
    assert_eq!(begin(&mut h, old).unwrap_err(), Rejection::Fenced { current_epoch: new.epoch });
    assert_eq!(stage(&mut h, "orders.a", "x", old).unwrap_err(), Rejection::Fenced { current_epoch: new.epoch });
    assert_eq!(begin(&mut h, new).unwrap(), Outcome::TransactionBegun);
}

#[test]
fn second_init_aborts_the_open_transaction_of_the_old_instance() {
    let (mut h, old) = open();
    stage(&mut h, "orders.a", "lost", old).unwrap();
    let new = h.init_producer("tx");
    assert_eq!(aborted_effects(&h.take_effects()), vec![(old.producer_id, old.epoch, AbortReason::Fenced)]);
    let current = Rejection::Fenced { current_epoch: new.epoch };
    assert_eq!(commit(&mut h, old).unwrap_err(), current);
    assert_eq!(abort(&mut h, old).unwrap_err(), current);
    assert_eq!(prepare(&mut h, old).unwrap_err(), current);
    assert!(payloads(&h, "orders", 0).is_empty());
    assert_eq!(h.cell.producer_info(new.producer_id).unwrap().open_transaction, None);
    // The new instance starts clean.
    begin(&mut h, new).unwrap();
    let (messages, _) = committed(&mut h, new);
    assert!(messages.is_empty());
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn init_producer_refuses_a_bad_id_or_timeout() {
    let mut h = Harness::new();
    let rejection =
        h.apply(Command::InitProducer { transactional_id: String::new(), transaction_timeout_ms: 1_000 }).unwrap_err();
    assert!(matches!(rejection, Rejection::InvalidName { .. }), "{rejection:?}");
    let rejection =
        h.apply(Command::InitProducer { transactional_id: "tx".into(), transaction_timeout_ms: 0 }).unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
}

#[test]
fn an_unknown_producer_is_producer_not_found() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let ghost = ProducerRef { producer_id: 42, epoch: 0 };
    assert_eq!(begin(&mut h, ghost).unwrap_err(), Rejection::ProducerNotFound { producer_id: 42 });
    assert_eq!(commit(&mut h, ghost).unwrap_err(), Rejection::ProducerNotFound { producer_id: 42 });
    assert_eq!(abort(&mut h, ghost).unwrap_err(), Rejection::ProducerNotFound { producer_id: 42 });
    assert_eq!(stage(&mut h, "orders.a", "x", ghost).unwrap_err(), Rejection::ProducerNotFound { producer_id: 42 });
}

#[test]
fn a_future_epoch_is_fenced() {
    let (mut h, r) = open();
    let future = epoch(r, r.epoch + 5);
    assert_eq!(commit(&mut h, future).unwrap_err(), Rejection::Fenced { current_epoch: r.epoch });
    assert_eq!(abort(&mut h, future).unwrap_err(), Rejection::Fenced { current_epoch: r.epoch });
    assert_eq!(stage(&mut h, "orders.a", "x", future).unwrap_err(), Rejection::Fenced { current_epoch: r.epoch });
}

// ----- begin and staging -----

#[test]
fn begin_twice_is_a_state_error() {
    let (mut h, r) = open();
    assert!(matches!(begin(&mut h, r).unwrap_err(), Rejection::TransactionState { .. }));
}

#[test]
fn staging_without_an_open_transaction_is_a_state_error() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let r = h.init_producer("tx");
    assert!(matches!(stage(&mut h, "orders.a", "x", r).unwrap_err(), Rejection::TransactionState { .. }));
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn staged_messages_are_numbered_in_order() {
    let (mut h, r) = open();
    for (index, payload) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(
            stage(&mut h, "orders.x", payload, r).unwrap(),
            Outcome::Staged { index: index as u32, duplicate: false }
        );
    }
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(3));
}

#[test]
fn staged_messages_are_invisible_to_readers_and_consumers() {
    let (mut h, r) = open();
    h.create_consumer("orders", "c", ConsumerConfig::default());
    stage(&mut h, "orders.a", "one", r).unwrap();
    stage(&mut h, "orders.b", "two", r).unwrap();
    assert!(h.take_effects().is_empty());
    assert!(payloads(&h, "orders", 0).is_empty());
    assert!(h.cell.read("orders", 0, 1).is_err());
    assert!(h.cell.last_for_subject("orders", "orders.a").is_err());
    let info = h.cell.stream_info("orders").unwrap();
    assert_eq!(info.n_messages, 0);
    assert_eq!(info.partitions[0].high_watermark, 0);
    assert!(h.fetch("orders", "c", 10).is_empty());
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().lag_total, 0);
}

/// How a transaction ends, for the table below.
#[derive(Clone, Copy, Debug)]
enum End {
    Commit,
    Abort,
    Timeout,
    FencedByANewInstance,
    CommitRefused,
}

#[test]
fn a_staged_payload_is_a_stored_body_from_staging_until_its_transaction_ends() {
    let payload = "x".repeat(256 * 1024);
    for end in [End::Commit, End::Abort, End::Timeout, End::FencedByANewInstance, End::CommitRefused] {
        let mut h = Harness::new();
        h.simple_stream("orders");
        h.create_stream(
            "new",
            StreamConfig {
                max_messages: Some(1),
                discard: DiscardPolicy::New,
                ..StreamConfig::with_subjects(["new.>"])
            },
        );
        let r = init_with_timeout(&mut h, "tx", 10_000);
        begin(&mut h, r).unwrap();
        let empty = h.cell.snapshot().len();
        for subject in ["orders.a", "orders.b", "new.a"] {
            stage(&mut h, subject, &payload, r).unwrap();
        }
        // The bytes went to the host's store; the state holds a reference to each.
        assert_eq!((h.bodies.len(), h.cell.body_refs().len()), (3, 3), "{end:?}");
        assert!(h.cell.snapshot().len() < empty + 1024, "{end:?}: the state grew with the staged payloads");
        let retained = match end {
            End::Commit => {
                committed(&mut h, r);
                3
            }
            End::Abort => {
                abort(&mut h, r).unwrap();
                0
            }
            End::Timeout => {
                h.advance(10_000);
                h.tick();
                0
            }
            End::FencedByANewInstance => {
                init_with_timeout(&mut h, "tx", 10_000);
                0
            }
            End::CommitRefused => {
                h.publish("new.z", "fills the stream").unwrap();
                assert!(matches!(commit(&mut h, r), Err(Rejection::TransactionAborted { .. })), "{end:?}");
                1
            }
        };
        // Whatever ended it, the host holds exactly the bodies of the retained messages.
        assert_eq!((h.bodies.len(), h.cell.body_refs().len()), (retained, retained), "{end:?}");
        if let End::Commit = end {
            assert_eq!(payloads(&h, "orders", 0), [payload.clone(), payload.clone()]);
        }
    }
}

#[test]
fn a_staged_message_already_stored_under_its_id_releases_its_body_at_commit() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "staged first", r).unwrap();
    let mut request = staged("orders.b", "staged second", r);
    request.msg_id = Some("once".into());
    h.ok(Command::Publish(request));
    h.ok(Command::Publish(PublishRequest::new("orders.c", "published meanwhile").with_id("once")));
    let (acks, _) = committed(&mut h, r);
    assert!(acks[1].duplicate, "{acks:?}");
    assert_eq!(payloads(&h, "orders", 0), ["published meanwhile", "staged first"]);
    assert_eq!((h.bodies.len(), h.cell.body_refs().len()), (2, 2));
}

/// A staged message whose id was stored meanwhile is answered as that duplicate at commit, so it takes no room under
/// a discard-new limit and cannot refuse the commit.
#[test]
fn a_staged_duplicate_takes_no_room_under_a_discard_new_limit() {
    let mut h = Harness::new();
    let limited = StreamConfig {
        discard: DiscardPolicy::New,
        max_messages: Some(2),
        ..StreamConfig::with_subjects(["orders.>"])
    };
    h.create_stream("orders", limited);
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    stage(&mut h, "orders.a", "staged", r).unwrap();
    h.ok(Command::Publish(staged("orders.b", "staged under an id", r).with_id("once")));
    h.ok(Command::Publish(PublishRequest::new("orders.c", "published meanwhile").with_id("once")));
    let (acks, _) = committed(&mut h, r);
    assert!(!acks[0].duplicate && acks[1].duplicate, "{acks:?}");
    assert_eq!(payloads(&h, "orders", 0), ["published meanwhile", "staged"]);
}

#[test]
fn staging_to_a_subject_no_stream_claims_is_refused() {
    let (mut h, r) = open();
    assert_eq!(
        stage(&mut h, "nowhere.a", "x", r).unwrap_err(),
        Rejection::NoStreamForSubject { subject: "nowhere.a".into() }
    );
}

#[test]
fn staging_a_payload_over_the_stream_limit_is_refused() {
    let mut h = Harness::new();
    h.create_stream("small", StreamConfig { max_payload_bytes: 4, ..StreamConfig::with_subjects(["small.>"]) });
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    assert_eq!(stage(&mut h, "small.a", "12345", r).unwrap_err(), Rejection::PayloadTooLarge { size: 5, max: 4 });
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(0));
}

// ----- commit -----

#[test]
fn commit_makes_every_staged_message_visible_at_once_in_order() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "o1", r).unwrap();
    stage(&mut h, "audit.x", "a1", r).unwrap();
    stage(&mut h, "orders.b", "o2", r).unwrap();
    stage(&mut h, "orders.a", "o3", r).unwrap();
    h.advance(500);
    let (messages, next) = committed(&mut h, r);
    let landed: Vec<(String, u64)> = messages.iter().map(|ack| (ack.stream.to_string(), ack.seq)).collect();
    assert_eq!(landed, vec![("orders".into(), 1), ("audit".into(), 1), ("orders".into(), 2), ("orders".into(), 3)]);
    assert!(messages.iter().all(|ack| !ack.duplicate && ack.original.is_none()));
    assert_eq!(next, epoch(r, r.epoch + 1));
    assert_eq!(payloads(&h, "orders", 0), vec!["o1", "o2", "o3"]);
    assert_eq!(payloads(&h, "audit", 0), vec!["a1"]);
    // Every message is stamped with the commit time.
    let records = h.cell.read_from("orders", 0, 1, 10).unwrap();
    assert!(records.iter().all(|record| record.stored_at == Millis(1_500)));

    let effects = h.take_effects();
    assert_eq!(
        appended(&effects),
        vec![("orders".into(), 1), ("audit".into(), 1), ("orders".into(), 2), ("orders".into(), 3)]
    );
    assert_eq!(
        effects.last(),
        Some(&Transition::TransactionCommitted { producer_id: r.producer_id, epoch: r.epoch, n_messages: 4 })
    );
}

#[test]
fn committed_messages_reach_consumers_in_order() {
    let (mut h, r) = open();
    h.create_consumer("orders", "c", ConsumerConfig::default());
    h.publish("orders.a", "before").unwrap();
    stage(&mut h, "orders.a", "t1", r).unwrap();
    h.publish("orders.a", "during").unwrap();
    stage(&mut h, "orders.a", "t2", r).unwrap();
    let fetched = h.fetch("orders", "c", 10);
    assert_eq!(fetched.iter().map(|d| h.text(d)).collect::<Vec<_>>(), vec!["before", "during"]);
    committed(&mut h, r);
    // The transaction's messages land together at commit, after what was published meanwhile.
    let fetched = h.fetch("orders", "c", 10);
    assert_eq!(fetched.iter().map(|d| h.text(d)).collect::<Vec<_>>(), vec!["t1", "t2"]);
    assert_eq!(payloads(&h, "orders", 0), vec!["before", "during", "t1", "t2"]);
}

#[test]
fn committed_messages_keep_their_ids_keys_and_headers() {
    let (mut h, r) = open();
    let mut request = staged("orders.a", "body", r).with_id("id-1");
    request.key = Some(Bytes::from_static(b"k"));
    request.headers.insert("h".into(), "v".into());
    h.apply(Command::Publish(request)).unwrap();
    committed(&mut h, r);
    let record = h.cell.read("orders", 0, 1).unwrap();
    assert_eq!(record.msg_id.as_deref(), Some("id-1"));
    assert_eq!(record.key, Some(Bytes::from_static(b"k")));
    assert_eq!(record.headers.get("h").map(String::as_str), Some("v"));
    // The id is remembered like any published id.
    let again = h.publish_id("orders.a", "body", "id-1").unwrap();
    assert!(again.duplicate);
    assert_eq!(again.seq, 1);
}

#[test]
fn an_empty_transaction_commits_and_bumps_the_epoch() {
    let (mut h, r) = open();
    let (messages, next) = committed(&mut h, r);
    assert!(messages.is_empty());
    assert_eq!(next.epoch, r.epoch + 1);
    assert_eq!(
        h.take_effects(),
        vec![Transition::TransactionCommitted { producer_id: r.producer_id, epoch: r.epoch, n_messages: 0 }]
    );
}

#[test]
fn the_epoch_moves_forward_at_every_transaction_end() {
    let (mut h, r0) = open();
    let (_, r1) = committed(&mut h, r0);
    assert_eq!(r1.epoch, r0.epoch + 1);
    begin(&mut h, r1).unwrap();
    let r2 = match abort(&mut h, r1).unwrap() {
        Outcome::TransactionAborted { next } => next,
        other => panic!("{other:?}"),
    };
    assert_eq!(r2.epoch, r1.epoch + 1);
    begin(&mut h, r2).unwrap();
    let (_, r3) = committed(&mut h, r2);
    assert_eq!(r3.epoch, r2.epoch + 1);
    assert_eq!(h.cell.producer_info(r0.producer_id).unwrap().epoch, r3.epoch);
}

#[test]
fn commit_without_an_open_transaction_is_a_state_error() {
    let mut h = Harness::new();
    let r = h.init_producer("tx");
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionState { .. }));
    assert!(matches!(abort(&mut h, r).unwrap_err(), Rejection::TransactionState { .. }));
    assert!(matches!(prepare(&mut h, r).unwrap_err(), Rejection::TransactionState { .. }));
}

#[test]
fn the_old_epoch_is_fenced_for_begin_after_commit() {
    let (mut h, r) = open();
    let (_, next) = committed(&mut h, r);
    assert_eq!(begin(&mut h, r).unwrap_err(), Rejection::Fenced { current_epoch: next.epoch });
    assert_eq!(stage(&mut h, "orders.a", "x", r).unwrap_err(), Rejection::Fenced { current_epoch: next.epoch });
    assert_eq!(begin(&mut h, next).unwrap(), Outcome::TransactionBegun);
}

#[test]
fn a_retried_commit_with_the_just_ended_epoch_gets_the_same_outcome() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    let first = commit(&mut h, r).unwrap();
    h.take_effects();
    assert_eq!(commit(&mut h, r).unwrap(), first);
    // The retry appended nothing and announced nothing.
    assert!(h.take_effects().is_empty());
    assert_eq!(payloads(&h, "orders", 0), vec!["x"]);

    // It still gets the same answer while the next transaction is open...
    let Outcome::TransactionCommitted { next, .. } = first.clone() else { panic!("{first:?}") };
    begin(&mut h, next).unwrap();
    stage(&mut h, "orders.a", "y", next).unwrap();
    assert_eq!(commit(&mut h, r).unwrap(), first);
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(1));
    // ...but not once that one ended too.
    let (_, after) = committed(&mut h, next);
    assert_eq!(commit(&mut h, r).unwrap_err(), Rejection::Fenced { current_epoch: after.epoch });
    assert_eq!(payloads(&h, "orders", 0), vec!["x", "y"]);
}

#[test]
fn an_abort_after_commit_is_refused() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    committed(&mut h, r);
    assert!(matches!(abort(&mut h, r).unwrap_err(), Rejection::TransactionState { .. }));
    assert_eq!(payloads(&h, "orders", 0), vec!["x"]);
}

// ----- abort -----

#[test]
fn abort_drops_everything_and_bumps_the_epoch() {
    let (mut h, r) = open();
    h.create_consumer("orders", "c", ConsumerConfig::default());
    stage(&mut h, "orders.a", "x", r).unwrap();
    stage(&mut h, "audit.a", "y", r).unwrap();
    let outcome = abort(&mut h, r).unwrap();
    assert_eq!(outcome, Outcome::TransactionAborted { next: epoch(r, r.epoch + 1) });
    assert_eq!(
        h.take_effects(),
        vec![Transition::TransactionAborted {
            producer_id: r.producer_id,
            epoch: r.epoch,
            reason: AbortReason::Requested
        }]
    );
    assert!(payloads(&h, "orders", 0).is_empty());
    assert!(payloads(&h, "audit", 0).is_empty());
    assert!(h.fetch("orders", "c", 10).is_empty());
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, None);
    assert_eq!(begin(&mut h, r).unwrap_err(), Rejection::Fenced { current_epoch: r.epoch + 1 });
}

#[test]
fn a_retried_abort_gets_the_same_outcome_and_a_commit_after_abort_is_refused() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    let first = abort(&mut h, r).unwrap();
    h.take_effects();
    assert_eq!(abort(&mut h, r).unwrap(), first);
    assert!(h.take_effects().is_empty());
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn aborted_message_ids_can_be_published_again() {
    let (mut h, r) = open();
    h.apply(Command::Publish(staged("orders.a", "x", r).with_id("id-1"))).unwrap();
    abort(&mut h, r).unwrap();
    let ack = h.publish_id("orders.a", "x", "id-1").unwrap();
    assert!(!ack.duplicate);
    assert_eq!(ack.seq, 1);
}

// ----- prepare -----

#[test]
fn prepare_then_commit() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    assert_eq!(prepare(&mut h, r).unwrap(), Outcome::TransactionPrepared);
    let info = h.cell.producer_info(r.producer_id).unwrap();
    assert!(info.prepared);
    assert_eq!(info.open_transaction, Some(1));
    assert!(payloads(&h, "orders", 0).is_empty());
    // Preparing again is harmless.
    assert_eq!(prepare(&mut h, r).unwrap(), Outcome::TransactionPrepared);
    let (messages, next) = committed(&mut h, r);
    assert_eq!(messages.len(), 1);
    assert_eq!(next.epoch, r.epoch + 1);
    assert_eq!(payloads(&h, "orders", 0), vec!["x"]);
}

#[test]
fn staging_after_prepare_is_refused() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    prepare(&mut h, r).unwrap();
    assert!(matches!(stage(&mut h, "orders.a", "y", r).unwrap_err(), Rejection::TransactionState { .. }));
    let (messages, _) = committed(&mut h, r);
    assert_eq!(messages.len(), 1);
    assert_eq!(payloads(&h, "orders", 0), vec!["x"]);
}

#[test]
fn a_prepared_transaction_can_be_aborted() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    prepare(&mut h, r).unwrap();
    assert_eq!(abort(&mut h, r).unwrap(), Outcome::TransactionAborted { next: epoch(r, r.epoch + 1) });
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn prepare_refuses_a_batch_over_a_discard_new_limit_and_keeps_it_open() {
    let mut h = Harness::new();
    h.create_stream(
        "capped",
        StreamConfig {
            discard: DiscardPolicy::New,
            max_messages: Some(2),
            ..StreamConfig::with_subjects(["capped.>"])
        },
    );
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    for payload in ["1", "2", "3"] {
        stage(&mut h, "capped.a", payload, r).unwrap();
    }
    assert_eq!(prepare(&mut h, r).unwrap_err(), Rejection::QuotaExceeded { quota: Quota::StreamMessages, limit: 2 });
    let info = h.cell.producer_info(r.producer_id).unwrap();
    assert!(!info.prepared);
    assert_eq!(info.open_transaction, Some(3));
    assert_eq!(abort(&mut h, r).unwrap(), Outcome::TransactionAborted { next: epoch(r, r.epoch + 1) });
}

// ----- timeouts -----

#[test]
fn an_open_transaction_past_its_timeout_is_aborted_by_a_tick() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let r = init_with_timeout(&mut h, "tx", 10_000);
    // Begun at 1000, so it times out at 11_000.
    begin(&mut h, r).unwrap();
    stage(&mut h, "orders.a", "x", r).unwrap();
    h.take_effects();
    assert_eq!(h.cell.next_deadline(), Some(Millis(11_000)));

    h.now = Millis(10_999);
    h.tick();
    assert!(h.take_effects().is_empty());
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(1));

    h.now = Millis(11_000);
    h.tick();
    assert_eq!(aborted_effects(&h.take_effects()), vec![(r.producer_id, r.epoch, AbortReason::Timeout)]);
    let info = h.cell.producer_info(r.producer_id).unwrap();
    assert_eq!(info.open_transaction, None);
    assert_eq!(info.epoch, r.epoch + 1);
    assert!(payloads(&h, "orders", 0).is_empty());

    // The old epoch is fenced; its commit learns that the transaction was aborted.
    assert_eq!(begin(&mut h, r).unwrap_err(), Rejection::Fenced { current_epoch: r.epoch + 1 });
    assert_eq!(stage(&mut h, "orders.a", "y", r).unwrap_err(), Rejection::Fenced { current_epoch: r.epoch + 1 });
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert!(payloads(&h, "orders", 0).is_empty());

    // The producer carries on with the next epoch.
    let next = epoch(r, r.epoch + 1);
    begin(&mut h, next).unwrap();
    stage(&mut h, "orders.a", "z", next).unwrap();
    committed(&mut h, next);
    assert_eq!(payloads(&h, "orders", 0), vec!["z"]);
}

#[test]
fn a_prepared_transaction_past_its_timeout_is_aborted_too() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let r = init_with_timeout(&mut h, "tx", 5_000);
    begin(&mut h, r).unwrap();
    stage(&mut h, "orders.a", "x", r).unwrap();
    prepare(&mut h, r).unwrap();
    h.take_effects();
    h.advance(5_000);
    h.tick();
    assert_eq!(aborted_effects(&h.take_effects()), vec![(r.producer_id, r.epoch, AbortReason::Timeout)]);
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn a_commit_arriving_after_the_timeout_is_refused_even_without_a_tick() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let r = init_with_timeout(&mut h, "tx", 5_000);
    begin(&mut h, r).unwrap();
    stage(&mut h, "orders.a", "x", r).unwrap();
    h.take_effects();
    h.advance(6_000);
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert_eq!(aborted_effects(&h.take_effects()), vec![(r.producer_id, r.epoch, AbortReason::Timeout)]);
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn the_timeout_of_an_ended_transaction_does_not_touch_the_next_one() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let r = init_with_timeout(&mut h, "tx", 5_000);
    // The first transaction would time out at 6000, the second at 9000.
    begin(&mut h, r).unwrap();
    let (_, next) = committed(&mut h, r);
    h.now = Millis(4_000);
    begin(&mut h, next).unwrap();
    stage(&mut h, "orders.a", "x", next).unwrap();
    h.take_effects();
    h.now = Millis(6_000);
    h.tick();
    assert!(h.take_effects().is_empty());
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(1));
    let (messages, _) = committed(&mut h, next);
    assert_eq!(messages.len(), 1);
}

#[test]
fn a_new_init_uses_its_own_timeout() {
    let mut h = Harness::new();
    let first = init_with_timeout(&mut h, "tx", 1_000);
    let second = init_with_timeout(&mut h, "tx", 50_000);
    assert!(begin(&mut h, first).is_err());
    begin(&mut h, second).unwrap();
    h.take_effects();
    h.advance(10_000);
    h.tick();
    assert!(h.take_effects().is_empty());
    assert_eq!(h.cell.producer_info(second.producer_id).unwrap().open_transaction, Some(0));
}

#[test]
fn staged_messages_are_out_of_reach_of_retention() {
    let mut h = Harness::new();
    h.create_stream("aging", StreamConfig { max_age_ms: Some(1_000), ..StreamConfig::with_subjects(["aging.>"]) });
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    stage(&mut h, "aging.a", "kept", r).unwrap();
    h.advance(30_000);
    h.tick();
    committed(&mut h, r);
    assert_eq!(payloads(&h, "aging", 0), vec!["kept"]);
    assert_eq!(h.cell.read("aging", 0, 1).unwrap().stored_at, Millis(31_000));
}

// ----- commit-time limits -----

fn capped(max_messages: u64) -> Harness {
    let mut h = Harness::new();
    h.create_stream(
        "capped",
        StreamConfig {
            discard: DiscardPolicy::New,
            max_messages: Some(max_messages),
            ..StreamConfig::with_subjects(["capped.>"])
        },
    );
    h.simple_stream("other");
    h
}

#[test]
fn a_commit_over_a_discard_new_limit_is_refused_as_a_whole() {
    let mut h = capped(3);
    h.publish("capped.a", "existing").unwrap();
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    stage(&mut h, "other.a", "elsewhere", r).unwrap();
    for payload in ["1", "2", "3"] {
        stage(&mut h, "capped.a", payload, r).unwrap();
    }
    h.take_effects();
    let rejection = commit(&mut h, r).unwrap_err();
    assert!(matches!(rejection, Rejection::TransactionAborted { .. }), "{rejection:?}");
    let effects = h.take_effects();
    assert!(appended(&effects).is_empty(), "{effects:?}");
    assert_eq!(aborted_effects(&effects), vec![(r.producer_id, r.epoch, AbortReason::CommitRefused)]);
    // Nothing of the batch landed, not even in the stream that had room.
    assert_eq!(payloads(&h, "capped", 0), vec!["existing"]);
    assert!(payloads(&h, "other", 0).is_empty());
    let info = h.cell.producer_info(r.producer_id).unwrap();
    assert_eq!(info.open_transaction, None);
    assert_eq!(info.epoch, r.epoch + 1);
    // A retry learns the same thing.
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
}

#[test]
fn a_commit_exactly_at_a_discard_new_limit_succeeds() {
    let mut h = capped(3);
    h.publish("capped.a", "existing").unwrap();
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    for payload in ["1", "2"] {
        stage(&mut h, "capped.a", payload, r).unwrap();
    }
    let (messages, _) = committed(&mut h, r);
    assert_eq!(messages.len(), 2);
    assert_eq!(payloads(&h, "capped", 0), vec!["existing", "1", "2"]);
}

/// A commit counts its whole batch's bytes against a discard-new byte limit: three messages where two fit.
#[test]
fn a_commit_counts_its_batch_bytes_against_a_discard_new_byte_limit() {
    let mut h = Harness::new();
    let config =
        StreamConfig { discard: DiscardPolicy::New, max_bytes: Some(2_500), ..StreamConfig::with_subjects(["big.>"]) };
    h.create_stream("big", config);
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    for subject in ["big.a", "big.b", "big.c"] {
        stage(&mut h, subject, &"x".repeat(1_000), r).unwrap();
    }
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert!(payloads(&h, "big", 0).is_empty());
}

/// A commit counts its whole batch against per-subject limits: two messages to one subject where one fits.
#[test]
fn a_commit_counts_its_batch_against_per_subject_limits() {
    let by_count = StreamConfig { max_messages_per_subject: Some(1), ..StreamConfig::with_subjects(["kv.>"]) };
    let by_bytes = StreamConfig { max_bytes_per_subject: Some(2_000), ..StreamConfig::with_subjects(["kv.>"]) };
    for (limit, payload) in [(by_count, "1".to_string()), (by_bytes, "x".repeat(1_200))] {
        let mut h = Harness::new();
        h.create_stream("kv", StreamConfig { discard: DiscardPolicy::New, ..limit });
        let r = h.init_producer("tx");
        begin(&mut h, r).unwrap();
        for subject in ["kv.a", "kv.b", "kv.a"] {
            stage(&mut h, subject, &payload, r).unwrap();
        }
        assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
        assert!(payloads(&h, "kv", 0).is_empty());
    }
}

#[test]
fn a_commit_whose_stream_vanished_is_refused_as_a_whole() {
    let (mut h, r) = open();
    stage(&mut h, "audit.a", "x", r).unwrap();
    stage(&mut h, "orders.a", "y", r).unwrap();
    h.ok(Command::DeleteStream { name: "orders".into() });
    h.take_effects();
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert_eq!(aborted_effects(&h.take_effects()), vec![(r.producer_id, r.epoch, AbortReason::CommitRefused)]);
    assert!(payloads(&h, "audit", 0).is_empty());
}

#[test]
fn a_discard_old_limit_makes_room_at_commit() {
    let mut h = Harness::new();
    h.create_stream("ring", StreamConfig { max_messages: Some(2), ..StreamConfig::with_subjects(["ring.>"]) });
    h.publish("ring.a", "old").unwrap();
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    for payload in ["1", "2", "3"] {
        stage(&mut h, "ring.a", payload, r).unwrap();
    }
    let (messages, _) = committed(&mut h, r);
    assert_eq!(messages.iter().map(|ack| ack.seq).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(payloads(&h, "ring", 0), vec!["2", "3"]);
}

// ----- message ids -----

#[test]
fn a_repeated_msg_id_inside_a_transaction_is_staged_once() {
    let (mut h, r) = open();
    let first = h.apply(Command::Publish(staged("orders.a", "x", r).with_id("id-1"))).unwrap();
    assert_eq!(first, Outcome::Staged { index: 0, duplicate: false });
    stage(&mut h, "orders.a", "other", r).unwrap();
    let repeat = h.apply(Command::Publish(staged("orders.a", "x", r).with_id("id-1"))).unwrap();
    assert_eq!(repeat, Outcome::Staged { index: 0, duplicate: true });
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(2));
    let (messages, _) = committed(&mut h, r);
    assert_eq!(messages.len(), 2);
    assert_eq!(payloads(&h, "orders", 0), vec!["x", "other"]);
}

#[test]
fn the_same_msg_id_in_two_streams_is_two_messages() {
    let (mut h, r) = open();
    h.apply(Command::Publish(staged("orders.a", "x", r).with_id("id-1"))).unwrap();
    let other = h.apply(Command::Publish(staged("audit.a", "y", r).with_id("id-1"))).unwrap();
    assert_eq!(other, Outcome::Staged { index: 1, duplicate: false });
    committed(&mut h, r);
    assert_eq!(payloads(&h, "orders", 0), vec!["x"]);
    assert_eq!(payloads(&h, "audit", 0), vec!["y"]);
}

#[test]
fn staging_an_id_already_in_the_stream_answers_with_the_original() {
    let (mut h, r) = open();
    h.publish_id("orders.a", "original", "id-1").unwrap();
    let outcome = h.apply(Command::Publish(staged("orders.a", "copy", r).with_id("id-1"))).unwrap();
    match outcome {
        Outcome::Published(ack) => {
            assert!(ack.duplicate);
            assert_eq!(ack.seq, 1);
            assert_eq!(ack.original.map(|record| h.payload(&record)), Some(Bytes::from_static(b"original")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(0));
    committed(&mut h, r);
    assert_eq!(payloads(&h, "orders", 0), vec!["original"]);
}

#[test]
fn an_id_published_while_staged_is_not_appended_twice_at_commit() {
    let (mut h, r) = open();
    h.apply(Command::Publish(staged("orders.a", "staged", r).with_id("id-1"))).unwrap();
    stage(&mut h, "orders.a", "plain", r).unwrap();
    h.publish_id("orders.a", "outside", "id-1").unwrap();
    h.take_effects();
    let (messages, _) = committed(&mut h, r);
    assert_eq!(messages.len(), 2);
    assert!(messages[0].duplicate);
    assert_eq!(messages[0].seq, 1);
    assert!(!messages[1].duplicate);
    assert_eq!(messages[1].seq, 2);
    assert_eq!(payloads(&h, "orders", 0), vec!["outside", "plain"]);
    let effects = h.take_effects();
    assert_eq!(appended(&effects), vec![("orders".into(), 2)]);
    // Only the message that was appended became visible; the duplicate did not.
    assert!(effects.contains(&Transition::TransactionCommitted {
        producer_id: r.producer_id,
        epoch: r.epoch,
        n_messages: 1
    }));
}

// ----- conditional append -----

#[test]
fn conditional_append_inside_a_transaction_is_refused() {
    let (mut h, r) = open();
    let on_partition = PublishRequest { expected_last_seq: Some(0), ..staged("orders.a", "x", r) };
    let rejection = h.apply(Command::Publish(on_partition)).unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
    let on_subject = PublishRequest { expected_last_subject_seq: Some(0), ..staged("orders.a", "x", r) };
    let rejection = h.apply(Command::Publish(on_subject)).unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(0));
}

#[test]
fn a_commit_into_a_stream_recreated_with_fewer_partitions_is_refused_without_a_panic() {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions: 4, ..StreamConfig::with_subjects(["orders.>"]) });
    let key = (0..1_000)
        .map(|i| Bytes::from(format!("k{i}")))
        .find(|key| partition_for_key(key, 4) == 3)
        .expect("some small key lands in partition 3");
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    let request = PublishRequest { key: Some(key), ..staged("orders.a", "x", r) };
    assert_eq!(h.apply(Command::Publish(request)).unwrap(), Outcome::Staged { index: 0, duplicate: false });
    h.ok(Command::DeleteStream { name: "orders".into() });
    h.simple_stream("orders");
    assert_eq!(h.cell.stream_info("orders").unwrap().partitions.len(), 1);
    // The stream it was staged for vanished: the commit is refused as a whole.
    assert!(matches!(commit(&mut h, r), Err(Rejection::TransactionAborted { .. })));
    assert!(payloads(&h, "orders", 0).is_empty());
}

#[test]
fn a_transaction_stages_at_most_max_transaction_messages() {
    let (mut h, r) = open();
    for _ in 0..MAX_TRANSACTION_MESSAGES {
        stage(&mut h, "orders.a", "x", r).unwrap();
    }
    assert_eq!(
        stage(&mut h, "orders.a", "x", r).unwrap_err(),
        Rejection::QuotaExceeded { quota: Quota::TransactionMessages, limit: MAX_TRANSACTION_MESSAGES }
    );
    let info = h.cell.producer_info(r.producer_id).unwrap();
    assert_eq!(info.open_transaction, Some(MAX_TRANSACTION_MESSAGES));
}

#[test]
fn a_transaction_stages_at_most_max_transaction_bytes() {
    let mut h = Harness::new();
    h.create_stream(
        "big",
        StreamConfig { max_payload_bytes: MAX_PAYLOAD_LIMIT, ..StreamConfig::with_subjects(["big.>"]) },
    );
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    let payload = Bytes::from(vec![0u8; MAX_PAYLOAD_LIMIT as usize]);
    let per_message = MAX_PAYLOAD_LIMIT as u64 + "big.a".len() as u64;
    let fitting = MAX_TRANSACTION_BYTES / per_message;
    for _ in 0..fitting {
        let request = PublishRequest { transaction: Some(r), ..PublishRequest::new("big.a", payload.clone()) };
        h.apply(Command::Publish(request)).unwrap();
    }
    let request = PublishRequest { transaction: Some(r), ..PublishRequest::new("big.a", payload.clone()) };
    assert_eq!(
        h.apply(Command::Publish(request)).unwrap_err(),
        Rejection::QuotaExceeded { quota: Quota::TransactionBytes, limit: MAX_TRANSACTION_BYTES }
    );
    assert_eq!(h.cell.producer_info(r.producer_id).unwrap().open_transaction, Some(fitting));
}

#[test]
fn prepare_reserves_no_room_under_a_discard_new_limit() {
    let mut h = capped(2);
    let r = h.init_producer("tx");
    begin(&mut h, r).unwrap();
    stage(&mut h, "capped.a", "t1", r).unwrap();
    stage(&mut h, "capped.a", "t2", r).unwrap();
    prepare(&mut h, r).unwrap();
    // The limits are checked again at commit: a plain publish in between takes the room.
    h.publish("capped.a", "plain").unwrap();
    assert!(matches!(commit(&mut h, r).unwrap_err(), Rejection::TransactionAborted { .. }));
    assert_eq!(payloads(&h, "capped", 0), vec!["plain"]);
}

#[test]
fn a_committed_ttl_counts_from_the_commit() {
    let (mut h, r) = open();
    let request = PublishRequest { ttl_ms: Some(5_000), ..staged("orders.a", "short-lived", r) };
    h.apply(Command::Publish(request)).unwrap();
    // The commit comes after the TTL would have passed, had it counted from staging.
    h.now = Millis(11_000);
    committed(&mut h, r);
    h.take_effects();
    assert_eq!(h.cell.next_deadline(), Some(Millis(16_000)));
    h.now = Millis(15_999);
    h.tick();
    assert_eq!(payloads(&h, "orders", 0), vec!["short-lived"]);
    h.now = Millis(16_000);
    h.tick();
    assert!(payloads(&h, "orders", 0).is_empty());
    assert!(
        h.take_effects()
            .iter()
            .any(|e| matches!(e, Transition::Removed { seq: 1, reason: cellog_core::RemovalReason::Ttl, .. }))
    );
}

#[test]
fn a_committed_delivery_delay_counts_from_the_commit() {
    let (mut h, r) = open();
    h.create_consumer("orders", "c", ConsumerConfig::default());
    let request = PublishRequest { deliver_after_ms: Some(5_000), ..staged("orders.a", "later", r) };
    h.apply(Command::Publish(request)).unwrap();
    h.now = Millis(11_000);
    committed(&mut h, r);
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.now = Millis(16_000);
    let fetched = h.fetch("orders", "c", 10);
    assert_eq!(fetched.iter().map(|d| h.text(d)).collect::<Vec<_>>(), vec!["later"]);
}

#[test]
fn an_instance_fenced_after_its_abort_is_told_it_is_fenced_not_that_its_transaction_aborted() {
    let (mut h, r) = open();
    stage(&mut h, "orders.a", "x", r).unwrap();
    let Outcome::TransactionAborted { next } = abort(&mut h, r).unwrap() else { panic!("an abort") };
    // A newer instance starts while the old one holds no open transaction; the old one then commits at the epoch
    // its abort handed it: that epoch never ended a transaction, so nothing is replayed.
    let new = h.init_producer("tx");
    assert_eq!(new.epoch, next.epoch + 1);
    assert_eq!(commit(&mut h, next).unwrap_err(), Rejection::Fenced { current_epoch: new.epoch });
    assert_eq!(abort(&mut h, next).unwrap_err(), Rejection::Fenced { current_epoch: new.epoch });
}
