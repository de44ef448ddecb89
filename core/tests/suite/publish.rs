//! Publishing: sequences and partitions, deduplication, conditional appends, quotas, the rate limit, TTLs, recall
//! and the validation of what is published.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::subject::partition_for_key;
use cellog_core::{
    Body, Command, DiscardPolicy, MAX_DURATION_MS, MAX_HEADER_BYTES, MAX_ID_BYTES, Millis, NameKind, Outcome,
    PublishAck, PublishRequest, Quota, RateLimit, Record, Rejection, RemovalReason, StreamConfig, SubjectError,
    Transition,
};

fn request(subject: &str, payload: &str) -> PublishRequest {
    PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes()))
}

/// A stored record's payload as the host reads it (panics on a tombstone).
fn payload(h: &Harness, record: &Record) -> Vec<u8> {
    assert!(matches!(record.body, Body::Stored(_)), "expected a payload, found {:?}", record.body);
    h.payload(record).to_vec()
}

fn seqs(h: &Harness, stream: &str) -> Vec<u64> {
    h.cell.read_from(stream, 0, 0, 1_000).unwrap().iter().map(|r| r.seq).collect()
}

fn recall(h: &mut Harness, stream: &str, partition: u32, seq: u64) -> Result<Outcome, Rejection> {
    h.apply(Command::Recall { stream: stream.to_string(), partition, seq })
}

fn limited(rate: u32, burst: u32) -> StreamConfig {
    StreamConfig { rate_limit: Some(RateLimit { messages_per_second: rate, burst }), ..config(&["s.>"]) }
}

// ----- sequences, watermarks, partitions -----

#[test]
fn the_first_publish_gets_sequence_one() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let ack = h.publish("orders.eu", "hello").unwrap();
    assert_eq!(ack, PublishAck { stream: "orders".into(), partition: 0, seq: 1, duplicate: false, original: None });
    assert_eq!(h.take_effects(), vec![Transition::Appended { stream: "orders".into(), partition: 0, seq: 1 }]);
}

#[test]
fn an_empty_partition_has_low_watermark_one_above_high() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let info = h.cell.stream_info("orders").unwrap();
    assert_eq!((info.partitions[0].low_watermark, info.partitions[0].high_watermark), (1, 0));
    assert_eq!((info.n_messages, info.n_bytes, info.n_subjects), (0, 0, 0));
}

#[test]
fn sequences_are_consecutive_and_move_the_watermarks() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let got: Vec<u64> = (0..5).map(|i| h.publish("orders.eu", &format!("m{i}")).unwrap().seq).collect();
    assert_eq!(got, vec![1, 2, 3, 4, 5]);
    let info = h.cell.stream_info("orders").unwrap();
    let p = &info.partitions[0];
    assert_eq!((p.low_watermark, p.high_watermark, p.n_messages), (1, 5, 5));
    assert_eq!(info.n_messages, 5);
}

#[test]
fn each_partition_numbers_its_own_sequences() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 4, ..config(&["s.>"]) });
    let (k0, k3) = (key_for(0, 4), key_for(3, 4));
    let a = h.publish_request(keyed("s.a", &k0, "1")).unwrap();
    let b = h.publish_request(keyed("s.a", &k3, "2")).unwrap();
    let c = h.publish_request(keyed("s.a", &k0, "3")).unwrap();
    let d = h.publish_request(keyed("s.a", &k3, "4")).unwrap();
    assert_eq!(
        [(a.partition, a.seq), (b.partition, b.seq), (c.partition, c.seq), (d.partition, d.seq)],
        [(0, 1), (3, 1), (0, 2), (3, 2)]
    );
    let info = h.cell.stream_info("s").unwrap();
    let marks: Vec<(u64, u64, u64)> =
        info.partitions.iter().map(|p| (p.low_watermark, p.high_watermark, p.n_messages)).collect();
    assert_eq!(marks, vec![(1, 2, 2), (1, 0, 0), (1, 0, 0), (1, 2, 2)]);
    assert_eq!(info.n_messages, 4);
}

#[test]
fn the_stored_record_reads_back_as_published() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.advance(234);
    let mut r = keyed("orders.eu", "customer-7", "body");
    r.msg_id = Some("id-1".to_string());
    r.headers.insert("trace".to_string(), "abc".to_string());
    let ack = h.publish_request(r).unwrap();
    let record = h.cell.read("orders", ack.partition, ack.seq).unwrap();
    assert_eq!(&*record.subject, "orders.eu");
    assert_eq!(record.key.as_deref(), Some(&b"customer-7"[..]));
    assert_eq!(record.msg_id.as_deref(), Some("id-1"));
    assert_eq!(record.headers.get("trace").map(String::as_str), Some("abc"));
    assert_eq!(payload(&h, &record), b"body");
    assert_eq!(record.stored_at, Millis(1_234));
    assert_eq!((record.partition, record.seq), (0, 1));
}

#[test]
fn bytes_count_subject_key_headers_and_payload() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let mut r = keyed("orders.eu", "key", "12345");
    r.headers.insert("h".to_string(), "vv".to_string());
    h.publish_request(r).unwrap();
    // 9 (subject) + 3 (key) + 1 + 2 (header) + 5 (payload).
    let info = h.cell.stream_info("orders").unwrap();
    assert_eq!((info.n_bytes, info.partitions[0].n_bytes), (20, 20));
}

#[test]
fn the_same_key_always_lands_in_the_same_partition() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 8, ..config(&["s.>"]) });
    for key in ["alice", "bob", "carol", ""] {
        let expected = partition_for_key(key.as_bytes(), 8);
        for subject in ["s.a", "s.b", "s.c.d"] {
            let ack = h.publish_request(keyed(subject, key, "x")).unwrap();
            assert_eq!(ack.partition, expected, "key {key:?} on {subject:?}");
        }
    }
}

#[test]
fn without_a_key_the_subject_picks_the_partition() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 8, ..config(&["s.>"]) });
    for subject in ["s.a", "s.b", "s.c", "s.d.e"] {
        let expected = partition_for_key(subject.as_bytes(), 8);
        let first = h.publish(subject, "1").unwrap();
        let second = h.publish(subject, "2").unwrap();
        let with_subject_as_key = h.publish_request(keyed(subject, subject, "3")).unwrap();
        assert_eq!(
            (first.partition, second.partition, with_subject_as_key.partition),
            (expected, expected, expected),
            "subject {subject:?}"
        );
    }
}

#[test]
fn keys_spread_over_the_partitions() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 4, ..config(&["s.>"]) });
    let mut used = [false; 4];
    for i in 0..64 {
        used[h.publish_request(keyed("s.a", &format!("user-{i}"), "x")).unwrap().partition as usize] = true;
    }
    assert_eq!(used, [true; 4]);
}

#[test]
fn the_partition_of_a_key_does_not_depend_on_the_stream() {
    let mut h = Harness::new();
    h.create_stream("a", StreamConfig { partitions: 16, ..config(&["a.>"]) });
    h.create_stream("b", StreamConfig { partitions: 16, ..config(&["b.>"]) });
    for key in ["x", "y", "z"] {
        let in_a = h.publish_request(keyed("a.1", key, "")).unwrap().partition;
        let in_b = h.publish_request(keyed("b.2", key, "")).unwrap().partition;
        assert_eq!(in_a, in_b, "key {key:?}");
    }
}

#[test]
fn a_subject_no_stream_claims_is_refused() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    for subject in ["refunds.eu", "orders", "ordersx.eu"] {
        assert_eq!(
            h.publish(subject, "x"),
            Err(Rejection::NoStreamForSubject { subject: subject.to_string() }),
            "subject {subject:?}"
        );
    }
    assert_eq!(n_messages(&h, "orders"), 0);
}

#[test]
fn the_payload_limit_is_inclusive() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_payload_bytes: 4, ..config(&["s.>"]) });
    h.publish("s.a", "four").unwrap();
    h.take_effects();
    assert_eq!(h.publish("s.a", "fives"), Err(Rejection::PayloadTooLarge { size: 5, max: 4 }));
    assert!(h.take_effects().is_empty());
    // A refused publish does not use up a sequence.
    assert_eq!(h.publish("s.a", "").unwrap().seq, 2);
}

// ----- deduplication -----

#[test]
fn a_repeated_message_id_returns_the_original() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let first = h.publish_id("orders.eu", "original", "id-1").unwrap();
    h.publish("orders.eu", "other").unwrap();
    h.take_effects();
    let again = h.publish_id("orders.eu", "changed", "id-1").unwrap();
    assert_eq!((again.seq, again.partition, again.duplicate), (first.seq, first.partition, true));
    let original = again.original.expect("the original is still retained");
    assert_eq!((original.seq, payload(&h, &original)), (1, b"original".to_vec()));
    assert_eq!(original.msg_id.as_deref(), Some("id-1"));
    assert!(h.take_effects().is_empty(), "a duplicate appends nothing");
    assert_eq!(n_messages(&h, "orders"), 2);
}

#[test]
fn a_duplicate_ignores_a_different_subject_in_the_same_stream() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.publish_id("orders.eu", "x", "id-1").unwrap();
    let again = h.publish_id("orders.us", "y", "id-1").unwrap();
    assert!(again.duplicate);
    assert_eq!(&*again.original.unwrap().subject, "orders.eu");
    assert_eq!(n_messages(&h, "orders"), 1);
}

#[test]
fn message_ids_are_remembered_per_stream() {
    let mut h = Harness::new();
    h.simple_stream("a");
    h.simple_stream("b");
    assert!(!h.publish_id("a.x", "1", "same").unwrap().duplicate);
    assert!(!h.publish_id("b.x", "2", "same").unwrap().duplicate);
    assert_eq!((n_messages(&h, "a"), n_messages(&h, "b")), (1, 1));
}

#[test]
fn a_retained_message_stays_a_duplicate_after_the_window() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { duplicate_window_ms: 1_000, ..config(&["s.>"]) });
    h.publish_id("s.a", "x", "id-1").unwrap();
    h.advance(10_000);
    h.tick();
    let again = h.publish_id("s.a", "x", "id-1").unwrap();
    assert_eq!((again.seq, again.duplicate), (1, true));
    assert!(again.original.is_some());
    assert_eq!(h.cell.stream_info("s").unwrap().n_dedup_ids, 1);
}

#[test]
fn an_id_is_forgotten_once_both_the_window_and_the_message_are_gone() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { duplicate_window_ms: 1_000, ..config(&["s.>"]) });
    h.publish_request(PublishRequest { ttl_ms: Some(3_000), ..request("s.a", "x").with_id("id-1") }).unwrap();
    h.advance(2_000);
    assert!(h.publish_id("s.a", "x", "id-1").unwrap().duplicate, "the window passed but the message is retained");
    h.advance(1_000);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Ttl)]);
    assert_eq!(h.cell.stream_info("s").unwrap().n_dedup_ids, 0);
    let again = h.publish_id("s.a", "x", "id-1").unwrap();
    assert_eq!((again.seq, again.duplicate), (2, false));
}

#[test]
fn an_id_outlives_its_message_until_the_window_ends() {
    let mut h = Harness::new();
    let c = StreamConfig { duplicate_window_ms: 1_000, max_messages: Some(1), ..config(&["s.>"]) };
    h.create_stream("s", c);
    h.publish_id("s.a", "first", "id-1").unwrap();
    h.advance(100);
    h.publish("s.a", "second").unwrap();
    assert_eq!(
        h.cell.read("s", 0, 1),
        Err(Rejection::MessageNotFound { stream: "s".to_string(), partition: 0, seq: 1 })
    );
    h.advance(100);
    let within = h.publish_id("s.a", "first", "id-1").unwrap();
    assert_eq!((within.seq, within.duplicate, within.original), (1, true, None));
    h.advance(800);
    let after = h.publish_id("s.a", "first", "id-1").unwrap();
    assert_eq!((after.seq, after.duplicate), (3, false));
}

#[test]
fn an_id_is_forgotten_at_the_end_of_its_window_even_when_a_later_ttl_is_pending() {
    let mut h = Harness::new();
    let c = StreamConfig { duplicate_window_ms: 1_000, max_messages_per_subject: Some(1), ..config(&["s.>"]) };
    h.create_stream("s", c);
    // A message with a long TTL, published first, gives the stream a far sweep deadline.
    h.publish_request(PublishRequest { ttl_ms: Some(60_000), ..request("s.long", "x") }).unwrap();
    h.publish_id("s.kv", "v1", "id-1").unwrap();
    // The id's window ends at 2000: that is a deadline of its own.
    assert_eq!(h.cell.next_deadline(), Some(Millis(2_000)));
    h.advance(100);
    h.publish("s.kv", "v2").unwrap();
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::SubjectLimit)]);
    h.advance(2_000);
    h.tick();
    let after = h.publish_id("s.kv", "v3", "id-1").unwrap();
    assert_eq!((after.seq, after.duplicate), (4, false));
}

#[test]
fn an_id_published_after_the_window_was_shortened_is_forgotten_at_its_own_window_end() {
    let mut h = Harness::new();
    let long = StreamConfig { duplicate_window_ms: 10_000, max_messages_per_subject: Some(1), ..config(&["s.>"]) };
    h.create_stream("s", long);
    h.publish_id("s.old", "x", "old-id").unwrap();
    let short = StreamConfig { duplicate_window_ms: 1_000, max_messages_per_subject: Some(1), ..config(&["s.>"]) };
    h.ok(Command::UpdateStream { name: "s".to_string(), config: short });
    h.publish_id("s.kv", "v1", "new-id").unwrap();
    h.advance(100);
    h.publish("s.kv", "v2").unwrap();
    // The new id's message is gone and its one-second window ends at 2000.
    h.advance(2_000);
    h.tick();
    let after = h.publish_id("s.kv", "v3", "new-id").unwrap();
    assert_eq!((after.seq, after.duplicate), (4, false));
}

#[test]
fn with_no_window_an_id_lives_exactly_as_long_as_its_message() {
    let mut h = Harness::new();
    let c = StreamConfig { duplicate_window_ms: 0, max_messages: Some(1), ..config(&["s.>"]) };
    h.create_stream("s", c);
    h.publish_id("s.a", "x", "id-1").unwrap();
    assert!(h.publish_id("s.a", "x", "id-1").unwrap().duplicate);
    h.publish("s.a", "evicts the first").unwrap();
    let again = h.publish_id("s.a", "x", "id-1").unwrap();
    assert_eq!((again.seq, again.duplicate), (3, false));
}

#[test]
fn a_duplicate_is_recognised_before_the_conditions_are_checked() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let r = PublishRequest { expected_last_seq: Some(0), ..request("s.a", "x").with_id("id-1") };
    h.publish_request(r.clone()).unwrap();
    // The retry of a conditional publish whose response was lost: the condition no longer holds, the id tells.
    let again = h.publish_request(r).unwrap();
    assert_eq!((again.seq, again.duplicate), (1, true));
}

// ----- conditional append -----

#[test]
fn expected_last_sequence_must_match_the_partition() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let at = |seq: u64| PublishRequest { expected_last_seq: Some(seq), ..request("s.a", "x") };
    assert_eq!(h.publish_request(at(1)), Err(Rejection::WrongLastSequence { last: 0 }));
    assert_eq!(h.publish_request(at(0)).unwrap().seq, 1);
    assert_eq!(h.publish_request(at(0)), Err(Rejection::WrongLastSequence { last: 1 }));
    assert_eq!(h.publish_request(at(1)).unwrap().seq, 2);
    assert_eq!(h.publish_request(at(5)), Err(Rejection::WrongLastSequence { last: 2 }));
    assert_eq!(n_messages(&h, "s"), 2);
}

#[test]
fn expected_last_sequence_is_the_last_assigned_even_when_removed() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages: Some(1), ..config(&["s.>"]) });
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    h.publish("s.a", "3").unwrap();
    let r = PublishRequest { expected_last_seq: Some(0), ..request("s.a", "x") };
    assert_eq!(h.publish_request(r), Err(Rejection::WrongLastSequence { last: 3 }));
}

#[test]
fn expected_last_sequence_looks_at_the_messages_own_partition() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 2, ..config(&["s.>"]) });
    let (k0, k1) = (key_for(0, 2), key_for(1, 2));
    h.publish_request(keyed("s.a", &k0, "1")).unwrap();
    h.publish_request(keyed("s.a", &k0, "2")).unwrap();
    let into = |key: &str, seq: u64| PublishRequest { expected_last_seq: Some(seq), ..keyed("s.a", key, "x") };
    assert_eq!(h.publish_request(into(&k1, 2)), Err(Rejection::WrongLastSequence { last: 0 }));
    assert_eq!(h.publish_request(into(&k1, 0)).unwrap().seq, 1);
    assert_eq!(h.publish_request(into(&k0, 2)).unwrap().seq, 3);
}

#[test]
fn expected_last_subject_sequence_must_match_the_subject() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let on = |subject: &str, seq: u64| PublishRequest { expected_last_subject_seq: Some(seq), ..request(subject, "x") };
    assert_eq!(h.publish_request(on("s.a", 0)).unwrap().seq, 1);
    assert_eq!(h.publish_request(on("s.b", 0)).unwrap().seq, 2);
    assert_eq!(h.publish_request(on("s.a", 0)), Err(Rejection::WrongLastSubjectSequence { last: 1 }));
    assert_eq!(h.publish_request(on("s.a", 2)), Err(Rejection::WrongLastSubjectSequence { last: 1 }));
    assert_eq!(h.publish_request(on("s.a", 1)).unwrap().seq, 3);
    assert_eq!(h.publish_request(on("s.b", 3)), Err(Rejection::WrongLastSubjectSequence { last: 2 }));
    assert_eq!(h.publish_request(on("s.c", 1)), Err(Rejection::WrongLastSubjectSequence { last: 0 }));
    assert_eq!(n_messages(&h, "s"), 3);
}

#[test]
fn expected_last_subject_sequence_is_zero_once_the_subject_is_empty() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    h.publish("s.a", "x").unwrap();
    h.advance(1_000);
    h.tick();
    assert_eq!(n_messages(&h, "s"), 0);
    let r = PublishRequest { expected_last_subject_seq: Some(0), ..request("s.a", "x") };
    assert_eq!(h.publish_request(r).unwrap().seq, 2);
}

#[test]
fn both_conditions_must_hold() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish("s.a", "1").unwrap();
    h.publish("s.b", "2").unwrap();
    let both = |last: u64, subject_last: u64| PublishRequest {
        expected_last_seq: Some(last),
        expected_last_subject_seq: Some(subject_last),
        ..request("s.a", "x")
    };
    assert_eq!(h.publish_request(both(1, 1)), Err(Rejection::WrongLastSequence { last: 2 }));
    assert_eq!(h.publish_request(both(2, 2)), Err(Rejection::WrongLastSubjectSequence { last: 1 }));
    assert_eq!(h.publish_request(both(2, 1)).unwrap().seq, 3);
}

// ----- per-subject quotas -----

#[test]
fn discard_new_refuses_past_the_per_subject_message_limit() {
    let mut h = Harness::new();
    let c = StreamConfig { discard: DiscardPolicy::New, max_messages_per_subject: Some(2), ..config(&["s.>"]) };
    h.create_stream("s", c);
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    h.take_effects();
    assert_eq!(h.publish("s.a", "3"), Err(Rejection::QuotaExceeded { quota: Quota::SubjectMessages, limit: 2 }));
    assert!(h.take_effects().is_empty());
    h.publish("s.b", "other subject").unwrap();
    assert_eq!(seqs(&h, "s"), vec![1, 2, 3]);
}

#[test]
fn discard_new_refuses_past_the_per_subject_byte_limit() {
    let mut h = Harness::new();
    // Each message below takes 3 (subject) + 5 (payload) bytes.
    let c = StreamConfig { discard: DiscardPolicy::New, max_bytes_per_subject: Some(20), ..config(&["s.>"]) };
    h.create_stream("s", c);
    h.publish("s.a", "12345").unwrap();
    h.publish("s.a", "12345").unwrap();
    assert_eq!(h.publish("s.a", "12345"), Err(Rejection::QuotaExceeded { quota: Quota::SubjectBytes, limit: 20 }));
    // 3 + 1 bytes still fit exactly.
    h.publish("s.a", "1").unwrap();
    h.publish("s.b", "12345").unwrap();
    assert_eq!(n_messages(&h, "s"), 4);
}

#[test]
fn newest_wins_keeps_only_the_last_value_of_each_subject() {
    let mut h = Harness::new();
    let c = StreamConfig { max_messages_per_subject: Some(1), ..config(&["kv.>"]) };
    h.create_stream("kv", c);
    h.publish("kv.a", "a1").unwrap();
    h.publish("kv.b", "b1").unwrap();
    h.take_effects();
    h.publish("kv.a", "a2").unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::SubjectLimit)]);
    h.publish("kv.a", "a3").unwrap();
    assert_eq!(removals(&mut h), vec![(0, 3, RemovalReason::SubjectLimit)]);
    let a = h.cell.last_for_subject("kv", "kv.a").unwrap();
    assert_eq!((a.seq, payload(&h, &a)), (4, b"a3".to_vec()));
    let b = h.cell.last_for_subject("kv", "kv.b").unwrap();
    assert_eq!((b.seq, payload(&h, &b)), (2, b"b1".to_vec()));
    let info = h.cell.stream_info("kv").unwrap();
    assert_eq!((info.n_messages, info.n_subjects), (2, 2));
}

#[test]
fn a_per_subject_limit_of_two_keeps_the_two_newest() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages_per_subject: Some(2), ..config(&["s.>"]) });
    for i in 1..=5 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    assert_eq!(seqs(&h, "s"), vec![4, 5]);
}

#[test]
fn discard_old_per_subject_bytes_removes_as_many_as_needed() {
    let mut h = Harness::new();
    // Each small message takes 3 + 2 bytes; the big one 3 + 12.
    h.create_stream("s", StreamConfig { max_bytes_per_subject: Some(20), ..config(&["s.>"]) });
    for _ in 0..4 {
        h.publish("s.a", "xx").unwrap();
    }
    h.publish("s.b", "xx").unwrap();
    h.take_effects();
    h.publish("s.a", "123456789012").unwrap();
    assert_eq!(
        removals(&mut h),
        vec![
            (0, 1, RemovalReason::SubjectLimit),
            (0, 2, RemovalReason::SubjectLimit),
            (0, 3, RemovalReason::SubjectLimit)
        ]
    );
    assert_eq!(seqs(&h, "s"), vec![4, 5, 6]);
}

#[test]
fn a_message_larger_than_the_per_subject_byte_limit_never_fits() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_bytes_per_subject: Some(10), ..config(&["s.>"]) });
    h.publish("s.a", "x").unwrap();
    h.take_effects();
    assert_eq!(
        h.publish("s.a", "12345678"),
        Err(Rejection::QuotaExceeded { quota: Quota::SubjectBytes, limit: 10 }),
        "3 + 8 bytes cannot fit, whatever is removed"
    );
    assert!(h.take_effects().is_empty());
    assert_eq!(n_messages(&h, "s"), 1);
}

#[test]
fn last_for_subject_without_a_message_is_not_found() {
    let mut h = Harness::new();
    h.simple_stream("kv");
    h.publish("kv.a", "x").unwrap();
    assert!(matches!(h.cell.last_for_subject("kv", "kv.b"), Err(Rejection::MessageNotFound { .. })));
    assert_eq!(h.cell.last_for_subject("nope", "kv.a"), Err(Rejection::StreamNotFound { stream: "nope".to_string() }));
}

#[test]
fn last_for_subject_follows_the_newest_across_partitions() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 2, ..config(&["s.>"]) });
    let (k0, k1) = (key_for(0, 2), key_for(1, 2));
    h.publish_request(keyed("s.a", &k0, "first")).unwrap();
    h.publish_request(keyed("s.a", &k1, "second")).unwrap();
    let last = h.cell.last_for_subject("s", "s.a").unwrap();
    assert_eq!((last.partition, payload(&h, &last)), (1, b"second".to_vec()));
}

// ----- stream limits -----

#[test]
fn discard_old_max_messages_removes_the_oldest() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages: Some(3), ..config(&["s.>"]) });
    for i in 1..=3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.take_effects();
    assert_eq!(h.publish("s.b", "4").unwrap().seq, 4);
    assert_eq!(
        h.take_effects(),
        vec![
            Transition::Removed { stream: "s".into(), partition: 0, seq: 1, reason: RemovalReason::StreamLimit },
            Transition::Appended { stream: "s".into(), partition: 0, seq: 4 },
        ]
    );
    h.publish("s.b", "5").unwrap();
    assert_eq!(seqs(&h, "s"), vec![3, 4, 5]);
    let p = &h.cell.stream_info("s").unwrap().partitions[0];
    assert_eq!((p.low_watermark, p.high_watermark, p.n_messages), (3, 5, 3));
}

#[test]
fn discard_new_max_messages_refuses() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { discard: DiscardPolicy::New, max_messages: Some(2), ..config(&["s.>"]) });
    h.publish("s.a", "1").unwrap();
    h.publish("s.b", "2").unwrap();
    h.take_effects();
    assert_eq!(h.publish("s.c", "3"), Err(Rejection::QuotaExceeded { quota: Quota::StreamMessages, limit: 2 }));
    assert!(h.take_effects().is_empty());
    assert_eq!(seqs(&h, "s"), vec![1, 2]);
}

#[test]
fn discard_old_max_bytes_removes_as_many_as_needed() {
    let mut h = Harness::new();
    // Small messages take 3 + 1 bytes; the big one 3 + 9.
    h.create_stream("s", StreamConfig { max_bytes: Some(16), ..config(&["s.>"]) });
    for _ in 0..4 {
        h.publish("s.a", "x").unwrap();
    }
    h.take_effects();
    h.publish("s.a", "123456789").unwrap();
    assert_eq!(
        removals(&mut h),
        vec![
            (0, 1, RemovalReason::StreamLimit),
            (0, 2, RemovalReason::StreamLimit),
            (0, 3, RemovalReason::StreamLimit)
        ]
    );
    let info = h.cell.stream_info("s").unwrap();
    assert_eq!((info.n_messages, info.n_bytes), (2, 16));
}

#[test]
fn discard_new_max_bytes_refuses() {
    let mut h = Harness::new();
    // Messages take 3 bytes of subject plus their payload.
    h.create_stream("s", StreamConfig { discard: DiscardPolicy::New, max_bytes: Some(12), ..config(&["s.>"]) });
    h.publish("s.a", "12345").unwrap();
    assert_eq!(h.publish("s.a", "123"), Err(Rejection::QuotaExceeded { quota: Quota::StreamBytes, limit: 12 }));
    h.publish("s.a", "1").unwrap();
    assert_eq!(h.cell.stream_info("s").unwrap().n_bytes, 12);
}

#[test]
fn a_message_larger_than_max_bytes_never_fits() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_bytes: Some(10), ..config(&["s.>"]) });
    h.publish("s.a", "x").unwrap();
    h.take_effects();
    assert_eq!(h.publish("s.a", "12345678"), Err(Rejection::QuotaExceeded { quota: Quota::StreamBytes, limit: 10 }));
    assert!(h.take_effects().is_empty(), "nothing is removed for a message that cannot fit");
    assert_eq!(n_messages(&h, "s"), 1);
}

// ----- rate limit -----

#[test]
fn the_bucket_starts_full_and_then_refuses_with_the_wait() {
    let mut h = Harness::new();
    h.create_stream("s", limited(10, 2));
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    assert_eq!(h.publish("s.a", "3"), Err(Rejection::RateLimited { retry_after_ms: 100 }));
    assert_eq!(n_messages(&h, "s"), 2);
}

#[test]
fn the_bucket_refills_with_time() {
    let mut h = Harness::new();
    h.create_stream("s", limited(10, 2));
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    h.advance(50);
    assert_eq!(h.publish("s.a", "3"), Err(Rejection::RateLimited { retry_after_ms: 50 }));
    h.advance(49);
    assert_eq!(h.publish("s.a", "3"), Err(Rejection::RateLimited { retry_after_ms: 1 }));
    h.advance(1);
    h.publish("s.a", "3").unwrap();
    assert_eq!(h.publish("s.a", "4"), Err(Rejection::RateLimited { retry_after_ms: 100 }));
}

#[test]
fn the_bucket_never_holds_more_than_the_burst() {
    let mut h = Harness::new();
    h.create_stream("s", limited(10, 2));
    h.advance(3_600_000);
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    assert_eq!(h.publish("s.a", "3"), Err(Rejection::RateLimited { retry_after_ms: 100 }));
}

#[test]
fn the_wait_rounds_up_for_rates_that_do_not_divide_a_second() {
    let mut h = Harness::new();
    h.create_stream("s", limited(3, 1));
    h.publish("s.a", "1").unwrap();
    assert_eq!(h.publish("s.a", "2"), Err(Rejection::RateLimited { retry_after_ms: 334 }));
    h.advance(333);
    assert_eq!(h.publish("s.a", "2"), Err(Rejection::RateLimited { retry_after_ms: 1 }));
    h.advance(1);
    h.publish("s.a", "2").unwrap();
}

#[test]
fn a_refused_publish_costs_no_token() {
    let mut h = Harness::new();
    let c = StreamConfig {
        discard: DiscardPolicy::New,
        max_messages_per_subject: Some(1),
        max_payload_bytes: 4,
        ..limited(1, 2)
    };
    h.create_stream("s", c);
    h.publish("s.full", "x").unwrap();
    assert!(matches!(h.publish("s.a", "too large"), Err(Rejection::PayloadTooLarge { .. })));
    let wrong = PublishRequest { expected_last_seq: Some(7), ..request("s.a", "x") };
    assert!(matches!(h.publish_request(wrong), Err(Rejection::WrongLastSequence { .. })));
    let wrong_subject = PublishRequest { expected_last_subject_seq: Some(7), ..request("s.a", "x") };
    assert!(matches!(h.publish_request(wrong_subject), Err(Rejection::WrongLastSubjectSequence { .. })));
    assert!(matches!(h.publish("s.full", "x"), Err(Rejection::QuotaExceeded { .. })));
    // One token is left for this one.
    h.publish("s.a", "x").unwrap();
    assert_eq!(h.publish("s.b", "x"), Err(Rejection::RateLimited { retry_after_ms: 1_000 }));
}

#[test]
fn a_duplicate_costs_no_token_and_is_answered_when_the_bucket_is_empty() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1, 1));
    h.publish_id("s.a", "x", "id-1").unwrap();
    let again = h.publish_id("s.a", "x", "id-1").unwrap();
    assert_eq!((again.seq, again.duplicate), (1, true));
    assert_eq!(h.publish("s.a", "y"), Err(Rejection::RateLimited { retry_after_ms: 1_000 }));
}

#[test]
fn a_rate_limit_refusal_does_not_use_up_a_sequence() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1, 1));
    h.publish("s.a", "1").unwrap();
    assert!(h.publish("s.a", "2").is_err());
    h.advance(1_000);
    assert_eq!(h.publish("s.a", "2").unwrap().seq, 2);
}

#[test]
fn rate_limits_are_per_stream() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1, 1));
    h.simple_stream("free");
    h.publish("s.a", "1").unwrap();
    assert!(h.publish("s.a", "2").is_err());
    for _ in 0..10 {
        h.publish("free.a", "x").unwrap();
    }
}

#[test]
fn adding_a_rate_limit_by_update_starts_with_a_full_bucket() {
    let mut h = Harness::new();
    h.simple_stream("s");
    for _ in 0..5 {
        h.publish("s.a", "x").unwrap();
    }
    h.ok(Command::UpdateStream { name: "s".to_string(), config: limited(1, 2) });
    h.publish("s.a", "x").unwrap();
    h.publish("s.a", "x").unwrap();
    assert!(matches!(h.publish("s.a", "x"), Err(Rejection::RateLimited { .. })));
}

#[test]
fn an_update_keeping_the_rate_limit_keeps_the_bucket_level() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1, 2));
    h.publish("s.a", "x").unwrap();
    h.publish("s.a", "x").unwrap();
    h.ok(Command::UpdateStream {
        name: "s".to_string(),
        config: StreamConfig { max_messages: Some(100), ..limited(1, 2) },
    });
    assert_eq!(h.publish("s.a", "x"), Err(Rejection::RateLimited { retry_after_ms: 1_000 }));
}

#[test]
fn an_update_changing_the_rate_keeps_what_was_earned_at_the_old_rate() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1_000, 1));
    h.publish("s.a", "x").unwrap();
    // At 1000 tokens a second the bucket is full again after one millisecond.
    h.advance(500);
    h.ok(Command::UpdateStream { name: "s".to_string(), config: limited(1, 1) });
    let result = h.publish("s.a", "y");
    assert_eq!(result.map(|ack| ack.seq), Ok(2));
}

#[test]
fn an_update_raising_the_rate_does_not_apply_it_to_the_time_before() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1, 1));
    h.publish("s.a", "x").unwrap();
    h.advance(500);
    // Half a token was earned at the old rate; at the new rate the other half takes half a millisecond.
    h.ok(Command::UpdateStream { name: "s".to_string(), config: limited(1_000, 1) });
    let result = h.publish("s.a", "y");
    assert_eq!(result, Err(Rejection::RateLimited { retry_after_ms: 1 }));
}

#[test]
fn removing_the_rate_limit_by_update_lifts_it() {
    let mut h = Harness::new();
    h.create_stream("s", limited(1, 1));
    h.publish("s.a", "x").unwrap();
    h.ok(Command::UpdateStream { name: "s".to_string(), config: config(&["s.>"]) });
    h.publish("s.a", "x").unwrap();
}

// ----- TTL -----

#[test]
fn a_ttl_sets_the_next_deadline_and_a_tick_then_removes_the_message() {
    let mut h = Harness::new();
    h.simple_stream("s");
    assert_eq!(h.cell.next_deadline(), None);
    h.publish("s.keep", "x").unwrap();
    let ack = h.publish_request(PublishRequest { ttl_ms: Some(500), ..request("s.a", "x") }).unwrap();
    assert_eq!(h.cell.next_deadline(), Some(Millis(1_500)));
    h.take_effects();
    h.advance(499);
    h.tick();
    assert!(h.take_effects().is_empty());
    assert!(h.cell.read("s", 0, ack.seq).is_ok());
    h.advance(1);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, ack.seq, RemovalReason::Ttl)]);
    assert!(matches!(h.cell.read("s", 0, ack.seq), Err(Rejection::MessageNotFound { .. })));
    assert_eq!(seqs(&h, "s"), vec![1]);
    assert_eq!(h.cell.next_deadline(), None);
}

#[test]
fn ttls_expire_in_their_own_order() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish_request(PublishRequest { ttl_ms: Some(1_000), ..request("s.a", "long") }).unwrap();
    h.publish_request(PublishRequest { ttl_ms: Some(200), ..request("s.a", "short") }).unwrap();
    assert_eq!(h.cell.next_deadline(), Some(Millis(1_200)));
    h.take_effects();
    h.advance(200);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::Ttl)]);
    assert_eq!(h.cell.next_deadline(), Some(Millis(2_000)));
    h.advance(800);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Ttl)]);
    assert_eq!(n_messages(&h, "s"), 0);
}

#[test]
fn any_command_after_the_ttl_removes_the_message_first() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish_request(PublishRequest { ttl_ms: Some(100), ..request("s.a", "x") }).unwrap();
    h.advance(100);
    let r = PublishRequest { expected_last_subject_seq: Some(0), ..request("s.a", "y") };
    assert_eq!(h.publish_request(r).unwrap().seq, 2, "the expired message is gone before the condition is checked");
}

#[test]
fn ttl_bounds_are_checked() {
    let mut h = Harness::new();
    h.simple_stream("s");
    for ttl_ms in [0, MAX_DURATION_MS + 1] {
        let r = PublishRequest { ttl_ms: Some(ttl_ms), ..request("s.a", "x") };
        assert!(matches!(h.publish_request(r), Err(Rejection::Invalid { .. })), "ttl_ms {ttl_ms}");
    }
    let r = PublishRequest { ttl_ms: Some(MAX_DURATION_MS), ..request("s.a", "x") };
    h.publish_request(r).unwrap();
}

#[test]
fn deliver_after_bounds_are_checked() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let r = PublishRequest { deliver_after_ms: Some(MAX_DURATION_MS + 1), ..request("s.a", "x") };
    assert!(matches!(h.publish_request(r), Err(Rejection::Invalid { .. })));
    let r = PublishRequest { deliver_after_ms: Some(MAX_DURATION_MS), ..request("s.a", "x") };
    h.publish_request(r).unwrap();
}

// ----- recall -----

#[test]
fn recall_replaces_the_payload_with_a_tombstone() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish("s.a", "secret").unwrap();
    h.take_effects();
    h.advance(42);
    assert_eq!(recall(&mut h, "s", 0, 1), Ok(Outcome::Recalled));
    assert_eq!(h.take_effects(), vec![Transition::Recalled { stream: "s".into(), partition: 0, seq: 1 }]);
    let record = h.cell.read("s", 0, 1).unwrap();
    assert_eq!(record.body, Body::Tombstone { recalled_at: Millis(1_042) });
    assert_eq!(&*record.subject, "s.a");
    let info = h.cell.stream_info("s").unwrap();
    assert_eq!((info.n_messages, info.n_bytes), (1, 3), "the payload's bytes are freed; the subject's remain");
}

#[test]
fn recalling_twice_changes_nothing_more() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish("s.a", "secret").unwrap();
    recall(&mut h, "s", 0, 1).unwrap();
    h.take_effects();
    h.advance(10);
    assert_eq!(recall(&mut h, "s", 0, 1), Ok(Outcome::Recalled));
    assert!(h.take_effects().is_empty());
    assert_eq!(h.cell.read("s", 0, 1).unwrap().body, Body::Tombstone { recalled_at: Millis(1_000) });
}

/// Messages with equal headers share them in memory; recalling one of them leaves its neighbours whole, and a message
/// published after the newest was recalled is no tombstone. The same holds after a snapshot.
#[test]
fn recalling_one_of_many_messages_with_equal_headers_leaves_the_others_whole() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let with_headers = |payload: &str| {
        let mut r = request("s.a", payload);
        r.headers.insert("trace".to_string(), "same".to_string());
        r
    };
    for payload in ["one", "two", "three"] {
        h.publish_request(with_headers(payload)).unwrap();
    }
    recall(&mut h, "s", 0, 2).unwrap();
    recall(&mut h, "s", 0, 3).unwrap();
    h.publish_request(with_headers("four")).unwrap();
    let check = |cell: &cellog_core::Cell| {
        let bodies: Vec<bool> =
            (1..=4).map(|seq| matches!(cell.read("s", 0, seq).unwrap().body, Body::Stored(_))).collect();
        assert_eq!(bodies, [true, false, false, true], "only the recalled messages are tombstones");
        for seq in 1..=4 {
            assert_eq!(cell.read("s", 0, seq).unwrap().headers.get("trace").map(String::as_str), Some("same"));
        }
    };
    check(&h.cell);
    let restored = cellog_core::Cell::restore(&h.cell.snapshot()).unwrap();
    check(&restored);
    assert_eq!(restored.digest(), h.cell.digest());
}

#[test]
fn recall_of_a_missing_message_is_not_found() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish("s.a", "x").unwrap();
    for (partition, seq) in [(0, 0), (0, 2), (1, 1), (u32::MAX, u64::MAX)] {
        assert_eq!(
            recall(&mut h, "s", partition, seq),
            Err(Rejection::MessageNotFound { stream: "s".to_string(), partition, seq })
        );
    }
    assert_eq!(recall(&mut h, "nope", 0, 1), Err(Rejection::StreamNotFound { stream: "nope".to_string() }));
}

#[test]
fn a_retry_of_a_recalled_message_stays_a_duplicate() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.publish_id("s.a", "secret", "id-1").unwrap();
    recall(&mut h, "s", 0, 1).unwrap();
    let again = h.publish_id("s.a", "secret", "id-1").unwrap();
    assert_eq!((again.seq, again.duplicate), (1, true));
    assert!(matches!(again.original.unwrap().body, Body::Tombstone { .. }));
    assert_eq!(n_messages(&h, "s"), 1);
}

#[test]
fn a_recalled_last_value_reads_as_a_tombstone() {
    let mut h = Harness::new();
    h.create_stream("kv", StreamConfig { max_messages_per_subject: Some(1), ..config(&["kv.>"]) });
    h.publish("kv.a", "v1").unwrap();
    recall(&mut h, "kv", 0, 1).unwrap();
    assert!(matches!(h.cell.last_for_subject("kv", "kv.a").unwrap().body, Body::Tombstone { .. }));
    h.publish("kv.a", "v2").unwrap();
    assert_eq!(payload(&h, &h.cell.last_for_subject("kv", "kv.a").unwrap()), b"v2");
}

// ----- validation of what is published -----

#[test]
fn invalid_published_subjects_are_refused() {
    let mut h = Harness::new();
    h.create_stream("all", config(&[">"]));
    let cases = [
        ("", SubjectError::Empty),
        ("a..b", SubjectError::EmptyToken { position: 1 }),
        ("a.", SubjectError::EmptyToken { position: 1 }),
        ("a b", SubjectError::InvalidChar { ch: ' ', position: 1 }),
        ("a.*", SubjectError::WildcardInPublish),
        ("a.>", SubjectError::WildcardInPublish),
    ];
    for (subject, reason) in cases {
        assert_eq!(
            h.publish(subject, "x"),
            Err(Rejection::InvalidSubject { subject: subject.to_string(), reason }),
            "subject {subject:?}"
        );
    }
    let long = "x".repeat(256);
    assert!(matches!(
        h.publish(&long, "x"),
        Err(Rejection::InvalidSubject { reason: SubjectError::TooLong { .. }, .. })
    ));
    assert_eq!(n_messages(&h, "all"), 0);
}

#[test]
fn invalid_message_ids_are_refused() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let too_long = "i".repeat(MAX_ID_BYTES + 1);
    for msg_id in ["", "a\nb", "tab\t", "\u{7f}", too_long.as_str()] {
        match h.publish_id("s.a", "x", msg_id) {
            Err(Rejection::InvalidName { kind: NameKind::MessageId, name, .. }) => assert_eq!(name, msg_id),
            other => panic!("msg id {msg_id:?}: expected InvalidName, got {other:?}"),
        }
    }
    assert_eq!(n_messages(&h, "s"), 0);
}

#[test]
fn message_ids_within_the_rules_are_accepted() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let longest = "i".repeat(MAX_ID_BYTES);
    for msg_id in ["a", "with space", "ünïcødé", "a.b:c/d", longest.as_str()] {
        assert!(!h.publish_id("s.a", "x", msg_id).unwrap().duplicate, "msg id {msg_id:?}");
    }
    assert_eq!(n_messages(&h, "s"), 5);
}

#[test]
fn invalid_header_names_are_refused() {
    let mut h = Harness::new();
    h.simple_stream("s");
    for name in ["", "has space", "colon:", "tab\t", "new\nline", "\u{0}"] {
        let mut r = request("s.a", "x");
        r.headers.insert(name.to_string(), "value".to_string());
        match h.publish_request(r) {
            Err(Rejection::InvalidName { kind: NameKind::Header, name: rejected, .. }) => assert_eq!(rejected, name),
            other => panic!("header {name:?}: expected InvalidName, got {other:?}"),
        }
    }
    assert_eq!(n_messages(&h, "s"), 0);
}

#[test]
fn headers_are_stored_and_read_back() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let mut r = request("s.a", "x");
    r.headers.insert("Content-Type".to_string(), "text/plain; charset=utf-8".to_string());
    r.headers.insert("x-empty".to_string(), String::new());
    let expected = r.headers.clone();
    h.publish_request(r).unwrap();
    assert_eq!(h.cell.read("s", 0, 1).unwrap().headers, expected);
}

#[test]
fn headers_are_limited_in_total_size() {
    let mut h = Harness::new();
    h.simple_stream("s");
    let mut at_limit = request("s.a", "x");
    at_limit.headers.insert("a".to_string(), "v".repeat(MAX_HEADER_BYTES - 1));
    h.publish_request(at_limit).unwrap();
    let mut over = request("s.a", "x");
    over.headers.insert("a".to_string(), "v".repeat(MAX_HEADER_BYTES / 2));
    over.headers.insert("b".to_string(), "v".repeat(MAX_HEADER_BYTES / 2));
    assert!(matches!(h.publish_request(over), Err(Rejection::Invalid { .. })));
    assert_eq!(n_messages(&h, "s"), 1);
}

#[test]
fn a_rejected_publish_leaves_no_trace() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_payload_bytes: 1, ..config(&["s.>"]) });
    h.take_effects();
    let before = h.cell.stream_info("s").unwrap();
    let _ = h.publish("s.a", "too large");
    let _ = h.publish_id("s.a", "x", "");
    let _ = h.publish_request(PublishRequest { expected_last_seq: Some(3), ..request("s.a", "x").with_id("id-1") });
    assert!(h.take_effects().is_empty());
    assert_eq!(h.cell.stream_info("s").unwrap(), before);
    // The id of a refused publish was not remembered.
    assert!(!h.publish_id("s.a", "x", "id-1").unwrap().duplicate);
}

// ----- checked before proposing -----

/// What a host checks before proposing is what `apply` refuses first, with the same rejection: a command `check`
/// refuses would have been refused on every replica anyway.
#[test]
fn what_check_refuses_apply_refuses_alike() {
    let long_id = "x".repeat(MAX_ID_BYTES + 1);
    let refused = [
        Command::Publish(request("s.a b", "bad subject")),
        Command::Publish(PublishRequest { msg_id: Some(long_id.clone()), ..request("s.a", "long id") }),
        Command::Publish(PublishRequest { ttl_ms: Some(0), ..request("s.a", "zero ttl") }),
        Command::CreateStream { name: "bad name".to_string(), config: config(&["t.>"]) },
        Command::CreateConsumer {
            stream: "S".to_string(),
            name: "bad.name".to_string(),
            config: cellog_core::ConsumerConfig::default(),
        },
        Command::Fetch { stream: "S".to_string(), consumer: "c".to_string(), member: "m".to_string(), max: 0 },
        Command::Ack {
            stream: "S".to_string(),
            consumer: "c".to_string(),
            partition: 0,
            seq: 1,
            kind: cellog_core::AckKind::Nack { delay_ms: MAX_DURATION_MS + 1 },
        },
        Command::InitProducer { transactional_id: long_id, transaction_timeout_ms: 1_000 },
        Command::InitProducer { transactional_id: "p".to_string(), transaction_timeout_ms: 0 },
        Command::InitProducer { transactional_id: "p".to_string(), transaction_timeout_ms: MAX_DURATION_MS + 1 },
        Command::RegisterPeer { stream: "S".to_string(), peer: String::new() },
        Command::ReserveSubjects { filter: "s..a".to_string() },
        Command::MemberAck {
            stream: "S".to_string(),
            group: "g".to_string(),
            member: "bad member".to_string(),
            generation: 1,
            partition: 0,
            seq: 1,
            kind: cellog_core::AckKind::Applied,
        },
    ];
    for command in refused {
        let mut h = Harness::new();
        h.create_stream("S", config(&["s.>"]));
        let checked = command.check().expect_err(&format!("{command:?} is refused by check"));
        let applied = h.apply(command.clone()).expect_err("and by apply");
        assert_eq!(applied, checked, "{command:?}");
    }
    let mut h = Harness::new();
    h.create_stream("S", config(&["s.>"]));
    let fine = Command::Publish(request("s.a", "fine"));
    assert_eq!(fine.check(), Ok(()));
    assert!(h.apply(fine).is_ok());
    assert_eq!(Command::Tick.check(), Ok(()));
    let longest = Command::InitProducer { transactional_id: "p".to_string(), transaction_timeout_ms: MAX_DURATION_MS };
    assert_eq!(longest.check(), Ok(()));
    assert!(h.apply(longest).is_ok());
}

#[test]
fn a_command_is_bounded_by_its_whole_encoded_size() {
    let small = Command::Publish(request("s.a", "x"));
    let size = small.check_size().expect("a small command fits");
    assert!(size > 3 && size < 64, "{size}");
    let payload = Bytes::from(vec![0u8; cellog_core::MAX_PAYLOAD_LIMIT as usize]);
    let key = Bytes::from(vec![1u8; 2 * 1024 * 1024]);
    let big_key = Command::Publish(PublishRequest { key: Some(key), ..PublishRequest::new("s.a", payload.clone()) });
    let key_cap = Rejection::CapReached { cap: cellog_core::Cap::KeyBytes, limit: cellog_core::MAX_KEY_BYTES as u64 };
    assert_eq!(big_key.check(), Err(key_cap), "the key is over its own cap");
    assert!(
        matches!(big_key.check_size(), Err(Rejection::Invalid { reason }) if reason.contains("bytes encoded")),
        "and the whole, counted on its own, over the command's"
    );
    let largest = PublishRequest {
        msg_id: Some("an-id".into()),
        key: Some(Bytes::from_static(b"a key")),
        ..PublishRequest::new("s.a.longer.subject", payload.clone())
    };
    let size = Command::Publish(largest).check_size().expect("the largest payload fits with room for the rest");
    assert!(size > payload.len() + 16, "{size}");
    let too_big = Command::Publish(PublishRequest::new("s.a", Bytes::from(vec![0u8; payload.len() + 1])));
    assert_eq!(
        too_big.check(),
        Err(Rejection::PayloadTooLarge {
            size: payload.len() as u64 + 1,
            max: u64::from(cellog_core::MAX_PAYLOAD_LIMIT)
        })
    );
}
