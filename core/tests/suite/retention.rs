//! Retention: max age, stream and subject limits, interest and work-queue retention, and registered peers holding
//! removals back until they have received what would be removed.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    AckKind, Command, ConsumerConfig, DeliverPolicy, DiscardPolicy, Millis, NameKind, Outcome, PeerInfo,
    PublishRequest, Quota, Rejection, RemovalReason, RetentionPolicy, StreamConfig, Transition,
};

/// The retained sequences of a partition.
fn retained(h: &Harness, stream: &str, partition: u32) -> Vec<u64> {
    h.cell.read_from(stream, partition, 0, 1_000).unwrap().iter().map(|r| r.seq).collect()
}

fn register(h: &mut Harness, stream: &str, peer: &str) -> Result<Outcome, Rejection> {
    h.apply(Command::RegisterPeer { stream: stream.to_string(), peer: peer.to_string() })
}

fn progress(
    h: &mut Harness,
    stream: &str,
    peer: &str,
    partition: u32,
    received_seq: u64,
) -> Result<Outcome, Rejection> {
    h.apply(Command::PeerProgress { stream: stream.to_string(), peer: peer.to_string(), partition, received_seq })
}

fn unregister(h: &mut Harness, stream: &str, peer: &str) -> Result<Outcome, Rejection> {
    h.apply(Command::UnregisterPeer { stream: stream.to_string(), peer: peer.to_string() })
}

fn interest_stream(h: &mut Harness, name: &str) {
    let subject = format!("{name}.>");
    h.create_stream(name, StreamConfig { retention: RetentionPolicy::Interest, ..config(&[&subject]) });
}

fn work_queue(h: &mut Harness, name: &str) {
    let subject = format!("{name}.>");
    h.create_stream(name, StreamConfig { retention: RetentionPolicy::WorkQueue, ..config(&[&subject]) });
}

fn filtered(filter: &str) -> ConsumerConfig {
    ConsumerConfig { filter_subject: Some(filter.to_string()), ..ConsumerConfig::default() }
}

/// Fetches and acknowledges (as applied) everything the consumer has, returning the acknowledged sequences.
fn consume_all(h: &mut Harness, stream: &str, consumer: &str) -> Vec<(u32, u64)> {
    let deliveries = h.fetch(stream, consumer, 100);
    let positions: Vec<(u32, u64)> = deliveries.iter().map(|d| (d.record.partition, d.record.seq)).collect();
    for &(partition, seq) in &positions {
        h.ack(stream, consumer, partition, seq, AckKind::Applied).unwrap();
    }
    positions
}

// ----- max age -----

#[test]
fn max_age_removes_a_message_on_the_tick_at_its_age() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    h.publish("s.a", "x").unwrap();
    assert_eq!(h.cell.next_deadline(), Some(Millis(2_000)));
    h.take_effects();
    h.advance(999);
    h.tick();
    assert!(h.take_effects().is_empty());
    assert_eq!(n_messages(&h, "s"), 1);
    h.advance(1);
    h.tick();
    assert_eq!(
        h.take_effects(),
        vec![Transition::Removed { stream: "s".into(), partition: 0, seq: 1, reason: RemovalReason::Age }]
    );
    let p = &h.cell.stream_info("s").unwrap().partitions[0];
    assert_eq!((p.low_watermark, p.high_watermark, p.n_messages), (2, 1, 0));
    assert_eq!(h.cell.next_deadline(), None);
}

#[test]
fn max_age_removes_each_message_at_its_own_time() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    h.publish("s.a", "1").unwrap();
    h.advance(300);
    h.publish("s.a", "2").unwrap();
    h.advance(300);
    h.publish("s.a", "3").unwrap();
    h.take_effects();
    h.advance(400);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Age)]);
    assert_eq!(h.cell.next_deadline(), Some(Millis(2_300)));
    h.advance(600);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::Age), (0, 3, RemovalReason::Age)]);
    assert_eq!(n_messages(&h, "s"), 0);
}

#[test]
fn max_age_applies_to_every_partition() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 3, max_age_ms: Some(1_000), ..config(&["s.>"]) });
    for partition in [2, 0, 1] {
        h.publish_request(keyed("s.a", &key_for(partition, 3), "x")).unwrap();
        h.advance(100);
    }
    h.take_effects();
    h.advance(1_000);
    h.tick();
    // A sweep visits the partitions in order, whatever order the messages arrived in.
    assert_eq!(
        removals(&mut h),
        vec![(0, 1, RemovalReason::Age), (1, 1, RemovalReason::Age), (2, 1, RemovalReason::Age)]
    );
}

#[test]
fn max_age_keeps_working_after_the_stream_emptied() {
    let mut h = Harness::new();
    // A remembered message id keeps a sweep pending long after its message is gone; a new message still ages on
    // time.
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    h.publish_id("s.a", "x", "id-1").unwrap();
    h.advance(1_000);
    h.tick();
    h.take_effects();
    h.advance(1_000);
    h.publish("s.a", "y").unwrap();
    assert_eq!(h.cell.next_deadline(), Some(Millis(4_000)));
    h.take_effects();
    h.advance(1_000);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::Age)]);
}

#[test]
fn an_aged_message_is_gone_before_the_next_command_is_applied() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    h.publish("s.a", "x").unwrap();
    h.advance(5_000);
    // No tick in between: the publish itself fires the due timers first.
    h.publish("s.a", "y").unwrap();
    assert_eq!(retained(&h, "s", 0), vec![2]);
}

// ----- stream and subject limits -----

#[test]
fn max_messages_evicts_the_oldest_across_partitions() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 3, max_messages: Some(3), ..config(&["s.>"]) });
    let (k0, k1, k2) = (key_for(0, 3), key_for(1, 3), key_for(2, 3));
    // Arrival order: partition 2, then 0, then 1.
    h.publish_request(keyed("s.a", &k2, "first")).unwrap();
    h.publish_request(keyed("s.a", &k0, "second")).unwrap();
    h.publish_request(keyed("s.a", &k1, "third")).unwrap();
    h.take_effects();
    h.publish_request(keyed("s.a", &k0, "fourth")).unwrap();
    assert_eq!(removals(&mut h), vec![(2, 1, RemovalReason::StreamLimit)]);
    h.publish_request(keyed("s.a", &k2, "fifth")).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::StreamLimit)]);
    h.publish_request(keyed("s.a", &k2, "sixth")).unwrap();
    assert_eq!(removals(&mut h), vec![(1, 1, RemovalReason::StreamLimit)]);
    assert_eq!((retained(&h, "s", 0), retained(&h, "s", 1), retained(&h, "s", 2)), (vec![2], vec![], vec![2, 3]));
}

#[test]
fn max_bytes_evicts_the_oldest_across_partitions_until_the_new_message_fits() {
    let mut h = Harness::new();
    // Every message takes 3 bytes of subject plus its payload.
    h.create_stream("s", StreamConfig { partitions: 2, max_bytes: Some(20), ..config(&["s.>"]) });
    let (k0, k1) = (key_for(0, 2), key_for(1, 2));
    let k = |key: &str| key.len() as u64;
    // Keys count too; keep the arithmetic honest by measuring them.
    assert_eq!((k(&k0), k(&k1)), (2, 2), "the keys found are two bytes long");
    h.publish_request(keyed("s.a", &k1, "")).unwrap(); // 5 bytes
    h.publish_request(keyed("s.a", &k0, "")).unwrap(); // 5 bytes
    h.publish_request(keyed("s.a", &k1, "")).unwrap(); // 5 bytes
    h.publish_request(keyed("s.a", &k0, "")).unwrap(); // 5 bytes: 20 in all
    h.take_effects();
    h.publish_request(keyed("s.a", &k0, "123456")).unwrap(); // 11 bytes: three must go
    assert_eq!(
        removals(&mut h),
        vec![
            (1, 1, RemovalReason::StreamLimit),
            (0, 1, RemovalReason::StreamLimit),
            (1, 2, RemovalReason::StreamLimit)
        ]
    );
    assert_eq!(h.cell.stream_info("s").unwrap().n_bytes, 16);
}

#[test]
fn a_subject_limit_removes_the_subjects_oldest_not_the_streams() {
    let mut h = Harness::new();
    h.create_stream(
        "s",
        StreamConfig { max_messages_per_subject: Some(2), max_messages: Some(10), ..config(&["s.>"]) },
    );
    h.publish("s.other", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    h.publish("s.a", "3").unwrap();
    h.take_effects();
    h.publish("s.a", "4").unwrap();
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::SubjectLimit)]);
    assert_eq!(retained(&h, "s", 0), vec![1, 3, 4]);
}

#[test]
fn a_subject_removal_also_makes_room_under_the_stream_limits() {
    // Every message here takes 3 bytes of subject and 1 of payload: two fit under either limit.
    for limits in [
        StreamConfig { max_messages: Some(2), ..config(&["s.>"]) },
        StreamConfig { max_bytes: Some(8), ..config(&["s.>"]) },
    ] {
        let mut h = Harness::new();
        h.create_stream("s", StreamConfig { max_messages_per_subject: Some(1), ..limits.clone() });
        h.publish("s.a", "1").unwrap();
        h.publish("s.b", "2").unwrap();
        h.take_effects();
        // Replacing s.a's value frees a slot and its bytes, so the stream limit needs no second removal.
        h.publish("s.a", "3").unwrap();
        assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::SubjectLimit)], "{limits:?}");
        assert_eq!(retained(&h, "s", 0), vec![2, 3], "{limits:?}");
    }
}

#[test]
fn a_lowered_per_subject_limit_applies_at_once() {
    let mut h = Harness::new();
    h.simple_stream("s");
    for subject in ["s.a", "s.b", "s.a", "s.a", "s.b"] {
        h.publish(subject, "x").unwrap();
    }
    h.take_effects();
    let c = StreamConfig { max_messages_per_subject: Some(1), ..config(&["s.>"]) };
    h.ok(Command::UpdateStream { name: "s".to_string(), config: c });
    assert_eq!(
        removals(&mut h),
        vec![
            (0, 1, RemovalReason::SubjectLimit),
            (0, 3, RemovalReason::SubjectLimit),
            (0, 2, RemovalReason::SubjectLimit)
        ]
    );
    assert_eq!(retained(&h, "s", 0), vec![4, 5]);
}

#[test]
fn a_recalled_payload_no_longer_counts_against_max_bytes() {
    let mut h = Harness::new();
    // Each message takes 3 bytes of subject plus 5 of payload.
    h.create_stream("s", StreamConfig { max_bytes: Some(19), ..config(&["s.>"]) });
    h.publish("s.a", "12345").unwrap();
    h.publish("s.a", "12345").unwrap();
    // Without the recall a third message would need 24 bytes and evict the first.
    h.ok(Command::Recall { stream: "s".to_string(), partition: 0, seq: 1 });
    h.take_effects();
    h.publish("s.a", "12345").unwrap();
    assert!(removals(&mut h).is_empty(), "3 + 8 + 8 bytes fit in 19 once the first payload is gone");
    assert_eq!(h.cell.stream_info("s").unwrap().n_bytes, 19);
}

#[test]
fn limits_apply_to_interest_streams_too() {
    let mut h = Harness::new();
    h.create_stream(
        "s",
        StreamConfig { retention: RetentionPolicy::Interest, max_messages: Some(2), ..config(&["s.>"]) },
    );
    h.create_consumer("s", "c", ConsumerConfig::default());
    for i in 1..=3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::StreamLimit)]);
}

// ----- interest retention -----

#[test]
fn interest_keeps_messages_while_there_is_no_consumer() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    for i in 0..3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.advance(1_000_000);
    h.tick();
    assert_eq!(retained(&h, "s", 0), vec![1, 2, 3]);
    assert!(removals(&mut h).is_empty());
}

#[test]
fn interest_removes_a_message_once_its_only_consumer_acks_it() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "c", ConsumerConfig::default());
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    let deliveries = h.fetch("s", "c", 10);
    assert_eq!(deliveries.len(), 2);
    h.take_effects();
    assert!(removals(&mut h).is_empty(), "delivery alone removes nothing");
    h.ack("s", "c", 0, 1, AckKind::Applied).unwrap();
    assert_eq!(
        h.take_effects(),
        vec![Transition::Removed { stream: "s".into(), partition: 0, seq: 1, reason: RemovalReason::Interest }]
    );
    assert_eq!(retained(&h, "s", 0), vec![2]);
}

#[test]
fn interest_waits_for_every_consumer() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "a", ConsumerConfig::default());
    h.create_consumer("s", "b", ConsumerConfig::default());
    h.publish("s.x", "1").unwrap();
    h.take_effects();
    consume_all(&mut h, "s", "a");
    assert!(removals(&mut h).is_empty());
    assert_eq!(n_messages(&h, "s"), 1);
    consume_all(&mut h, "s", "b");
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
}

#[test]
fn interest_removals_out_of_order_move_the_low_watermark_past_holes() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "c", ConsumerConfig::default());
    for i in 1..=3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.fetch("s", "c", 10);
    h.ack("s", "c", 0, 2, AckKind::Applied).unwrap();
    assert_eq!(retained(&h, "s", 0), vec![1, 3]);
    assert_eq!(h.cell.stream_info("s").unwrap().partitions[0].low_watermark, 1);
    h.ack("s", "c", 0, 1, AckKind::Applied).unwrap();
    let p = &h.cell.stream_info("s").unwrap().partitions[0];
    assert_eq!((p.low_watermark, p.high_watermark, p.n_messages), (3, 3, 1));
}

#[test]
fn a_consumer_filtering_a_subject_out_does_not_hold_it() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "only-a", filtered("s.a"));
    h.create_consumer("s", "all", ConsumerConfig::default());
    h.publish("s.b", "1").unwrap();
    h.take_effects();
    consume_all(&mut h, "s", "all");
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
}

#[test]
fn a_nack_keeps_the_message_and_term_releases_it() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "c", ConsumerConfig::default());
    h.publish("s.a", "1").unwrap();
    h.fetch("s", "c", 10);
    h.take_effects();
    h.ack("s", "c", 0, 1, AckKind::Nack { delay_ms: 0 }).unwrap();
    assert!(removals(&mut h).is_empty());
    assert_eq!(n_messages(&h, "s"), 1);
    let again = h.fetch("s", "c", 10);
    assert_eq!(again.len(), 1);
    h.ack("s", "c", 0, 1, AckKind::Term).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
}

#[test]
fn committing_a_cursor_releases_everything_below_it() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "c", ConsumerConfig::default());
    for i in 1..=4 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.take_effects();
    let committed =
        h.ok(Command::CommitCursor { stream: "s".to_string(), consumer: "c".to_string(), partition: 0, next_seq: 4 });
    assert_eq!(committed, Outcome::CursorCommitted { next_seq: 4 });
    assert_eq!(
        removals(&mut h),
        vec![(0, 1, RemovalReason::Interest), (0, 2, RemovalReason::Interest), (0, 3, RemovalReason::Interest)]
    );
    assert_eq!(retained(&h, "s", 0), vec![4]);
}

#[test]
fn deleting_the_consumer_still_holding_a_message_releases_it() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "fast", ConsumerConfig::default());
    h.create_consumer("s", "slow", ConsumerConfig::default());
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    consume_all(&mut h, "s", "fast");
    h.take_effects();
    h.ok(Command::DeleteConsumer { stream: "s".to_string(), name: "slow".to_string() });
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest), (0, 2, RemovalReason::Interest)]);
}

#[test]
fn deleting_the_last_consumer_keeps_what_it_had_not_acked() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "c", ConsumerConfig::default());
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    h.fetch("s", "c", 1);
    h.ack("s", "c", 0, 1, AckKind::Applied).unwrap();
    h.take_effects();
    h.ok(Command::DeleteConsumer { stream: "s".to_string(), name: "c".to_string() });
    assert!(removals(&mut h).is_empty(), "with no consumer left, messages wait");
    assert_eq!(retained(&h, "s", 0), vec![2]);
}

#[test]
fn a_consumer_created_later_starts_holding_the_waiting_messages() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.publish("s.a", "1").unwrap();
    h.create_consumer("s", "c", ConsumerConfig { deliver_policy: DeliverPolicy::All, ..ConsumerConfig::default() });
    let acked = consume_all(&mut h, "s", "c");
    assert_eq!(acked, vec![(0, 1)]);
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
}

#[test]
fn a_consumer_starting_past_old_messages_lets_interest_retention_remove_them_at_once() {
    let mut h = Harness::new();
    let c = StreamConfig { retention: RetentionPolicy::Interest, ..config(&["s.>"]) };
    h.create_stream("s", c.clone());
    h.publish("s.a", "published before any consumer").unwrap();
    h.take_effects();
    // The only consumer declares it does not want what came before it, so nothing is interested in seq 1 any more:
    // it goes when the consumer is created, not at whatever command next sweeps.
    h.create_consumer("s", "c", ConsumerConfig { deliver_policy: DeliverPolicy::New, ..ConsumerConfig::default() });
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
    h.ok(Command::UpdateStream { name: "s".to_string(), config: c });
    assert_eq!(removals(&mut h), vec![]);
}

// ----- work-queue retention -----

#[test]
fn work_queue_keeps_messages_while_there_is_no_consumer() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.publish("wq.job", "1").unwrap();
    h.advance(1_000_000);
    h.tick();
    assert_eq!(n_messages(&h, "wq"), 1);
}

#[test]
fn work_queue_removes_a_message_on_ack() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "workers", ConsumerConfig::default());
    h.publish("wq.job", "1").unwrap();
    h.publish("wq.job", "2").unwrap();
    let deliveries = h.fetch_as("wq", "workers", "w1", 1);
    assert_eq!(deliveries.len(), 1);
    h.take_effects();
    h.ack("wq", "workers", 0, 1, AckKind::Applied).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
    assert_eq!(retained(&h, "wq", 0), vec![2]);
}

#[test]
fn work_queue_consumers_with_disjoint_filters_each_remove_their_own() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "emails", filtered("wq.email"));
    h.create_consumer("wq", "sms", filtered("wq.sms"));
    h.publish("wq.email", "1").unwrap();
    h.publish("wq.sms", "2").unwrap();
    h.take_effects();
    assert_eq!(consume_all(&mut h, "wq", "sms"), vec![(0, 2)]);
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::Interest)]);
    assert_eq!(consume_all(&mut h, "wq", "emails"), vec![(0, 1)]);
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
}

#[test]
fn a_work_queue_job_waits_for_a_consumer_that_wants_it() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "emails", filtered("wq.email"));
    h.publish("wq.sms", "job").unwrap();
    assert!(h.fetch("wq", "emails", 10).is_empty());
    // The job's consumer does not exist yet; it is created once the job is queued.
    h.create_consumer("wq", "sms", filtered("wq.sms"));
    let delivered = h.fetch("wq", "sms", 10);
    assert_eq!(delivered.len(), 1);
}

#[test]
fn work_queue_refuses_overlapping_consumers() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "emails", filtered("wq.email.*"));
    let cases: [(Option<&str>, &str); 4] =
        [(None, ">"), (Some("wq.>"), "wq.>"), (Some("wq.email.eu"), "wq.email.eu"), (Some("*.email.*"), "*.email.*")];
    for (filter, mine) in cases {
        let config = ConsumerConfig { filter_subject: filter.map(str::to_string), ..ConsumerConfig::default() };
        match h.apply(Command::CreateConsumer { stream: "wq".to_string(), name: "other".to_string(), config }) {
            Err(Rejection::SubjectOverlap { subject, other, owner }) => {
                assert_eq!((subject.as_str(), other.as_str()), (mine, "wq.email.*"));
                assert!(owner.contains("emails"), "{owner:?} names the consumer holding the filter");
            }
            other => panic!("filter {filter:?}: expected SubjectOverlap, got {other:?}"),
        }
    }
    assert_eq!(h.cell.stream_info("wq").unwrap().consumers, vec!["emails".into()]);
}

#[test]
fn work_queue_accepts_the_same_consumer_again_and_disjoint_ones() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "emails", filtered("wq.email.*"));
    let again = h.ok(Command::CreateConsumer {
        stream: "wq".to_string(),
        name: "emails".to_string(),
        config: filtered("wq.email.*"),
    });
    assert_eq!(again, Outcome::ConsumerCreated { created: false });
    h.create_consumer("wq", "sms", filtered("wq.sms.>"));
    h.create_consumer("wq", "email-root", filtered("wq.email"));
    assert_eq!(h.cell.stream_info("wq").unwrap().consumers.len(), 3);
}

#[test]
fn an_interest_stream_allows_overlapping_consumers() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    h.create_consumer("s", "a", ConsumerConfig::default());
    h.create_consumer("s", "b", ConsumerConfig::default());
    assert_eq!(h.cell.stream_info("s").unwrap().consumers.len(), 2);
}

// ----- registered peers -----

#[test]
fn a_registered_peer_starts_having_received_nothing() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 3, ..config(&["s.>"]) });
    assert_eq!(register(&mut h, "s", "mirror"), Ok(Outcome::PeerRegistered));
    assert_eq!(register(&mut h, "s", "mirror"), Ok(Outcome::PeerRegistered), "registering again is a success");
    assert_eq!(
        h.cell.stream_info("s").unwrap().peers,
        vec![PeerInfo { name: "mirror".to_string(), received: vec![0, 0, 0] }]
    );
}

#[test]
fn peer_names_and_streams_are_checked() {
    let mut h = Harness::new();
    h.simple_stream("s");
    for peer in ["", "has space", "a.b"] {
        assert!(
            matches!(register(&mut h, "s", peer), Err(Rejection::InvalidName { kind: NameKind::Peer, .. })),
            "peer {peer:?}"
        );
    }
    assert_eq!(register(&mut h, "nope", "mirror"), Err(Rejection::StreamNotFound { stream: "nope".to_string() }));
    assert!(h.cell.stream_info("s").unwrap().peers.is_empty());
}

#[test]
fn a_stream_has_at_most_64_peers() {
    let mut h = Harness::new();
    h.simple_stream("s");
    for i in 0..64 {
        register(&mut h, "s", &format!("peer-{i}")).unwrap();
    }
    assert!(matches!(register(&mut h, "s", "one-too-many"), Err(Rejection::Invalid { .. })));
    assert_eq!(register(&mut h, "s", "peer-0"), Ok(Outcome::PeerRegistered), "a registered peer is still welcome");
    assert_eq!(h.cell.stream_info("s").unwrap().peers.len(), 64);
}

#[test]
fn peer_progress_is_checked() {
    let mut h = Harness::new();
    h.simple_stream("s");
    register(&mut h, "s", "mirror").unwrap();
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    assert_eq!(
        progress(&mut h, "s", "ghost", 0, 1),
        Err(Rejection::PeerNotFound { stream: "s".to_string(), peer: "ghost".to_string() })
    );
    assert!(matches!(progress(&mut h, "s", "mirror", 0, 3), Err(Rejection::Invalid { .. })), "beyond the end");
    assert!(matches!(progress(&mut h, "s", "mirror", 1, 0), Err(Rejection::Invalid { .. })), "no such partition");
    assert_eq!(progress(&mut h, "nope", "mirror", 0, 1), Err(Rejection::StreamNotFound { stream: "nope".to_string() }));
    assert_eq!(progress(&mut h, "s", "mirror", 0, 2), Ok(Outcome::PeerProgressed));
    assert_eq!(h.cell.stream_info("s").unwrap().peers[0].received, vec![2]);
}

#[test]
fn peer_progress_never_moves_back() {
    let mut h = Harness::new();
    h.simple_stream("s");
    register(&mut h, "s", "mirror").unwrap();
    for _ in 0..3 {
        h.publish("s.a", "x").unwrap();
    }
    progress(&mut h, "s", "mirror", 0, 3).unwrap();
    assert_eq!(progress(&mut h, "s", "mirror", 0, 1), Ok(Outcome::PeerProgressed));
    assert_eq!(h.cell.stream_info("s").unwrap().peers[0].received, vec![3]);
}

#[test]
fn unregistering_an_unknown_peer_is_not_found() {
    let mut h = Harness::new();
    h.simple_stream("s");
    assert_eq!(
        unregister(&mut h, "s", "ghost"),
        Err(Rejection::PeerNotFound { stream: "s".to_string(), peer: "ghost".to_string() })
    );
    register(&mut h, "s", "mirror").unwrap();
    assert_eq!(unregister(&mut h, "s", "mirror"), Ok(Outcome::PeerUnregistered));
    assert!(h.cell.stream_info("s").unwrap().peers.is_empty());
}

#[test]
fn age_removal_waits_for_the_peer() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    for i in 1..=3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    progress(&mut h, "s", "mirror", 0, 1).unwrap();
    h.take_effects();
    h.advance(5_000);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Age)]);
    assert_eq!(retained(&h, "s", 0), vec![2, 3]);
    assert_eq!(h.cell.next_deadline(), None, "a removal held back by a peer is not a deadline");
    h.advance(5_000);
    h.tick();
    assert!(removals(&mut h).is_empty());
    progress(&mut h, "s", "mirror", 0, 3).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 2, RemovalReason::Age), (0, 3, RemovalReason::Age)]);
}

#[test]
fn a_peer_that_catches_up_early_lets_age_run_on_time() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    h.publish("s.a", "1").unwrap();
    h.advance(100);
    progress(&mut h, "s", "mirror", 0, 1).unwrap();
    assert_eq!(h.cell.next_deadline(), Some(Millis(2_000)));
    h.take_effects();
    h.advance(900);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Age)]);
}

#[test]
fn ttl_removal_waits_for_the_peer() {
    let mut h = Harness::new();
    h.simple_stream("s");
    register(&mut h, "s", "mirror").unwrap();
    let r = PublishRequest { ttl_ms: Some(100), ..PublishRequest::new("s.a", Bytes::from_static(b"x")) };
    h.publish_request(r).unwrap();
    h.take_effects();
    h.advance(1_000);
    h.tick();
    assert!(removals(&mut h).is_empty());
    assert_eq!(h.cell.next_deadline(), None, "a removal held back by a peer is not a deadline");
    progress(&mut h, "s", "mirror", 0, 1).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Ttl)]);
}

#[test]
fn a_ttl_the_peer_has_received_fires_behind_many_it_holds_back() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 2, ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    let (k0, k1) = (key_for(0, 2), key_for(1, 2));
    // Many messages in partition 0, which the peer has not received, expire before the one in partition 1.
    for _ in 0..1_100 {
        let r = PublishRequest { ttl_ms: Some(1_000), ..keyed("s.a", &k0, "held") };
        h.publish_request(r).unwrap();
    }
    let r = PublishRequest { ttl_ms: Some(2_000), ..keyed("s.a", &k1, "free") };
    h.publish_request(r).unwrap();
    progress(&mut h, "s", "mirror", 1, 1).unwrap();
    let deadline = h.cell.next_deadline();
    h.take_effects();
    h.advance(2_000);
    h.tick();
    let removed = removals(&mut h);
    // The first deadline is partition 0's TTLs: the sweep at that time finds them held back and sets them aside,
    // so they never stand in front of partition 1's.
    assert_eq!(deadline, Some(Millis(2_000)));
    assert_eq!(removed, vec![(1, 1, RemovalReason::Ttl)]);
    // Held-back TTLs are no deadline: the peer's progress releases them.
    assert_eq!(h.cell.next_deadline(), None);
    progress(&mut h, "s", "mirror", 0, 1_100).unwrap();
    assert_eq!(removals(&mut h).len(), 1_100);
}

#[test]
fn a_peer_holds_back_only_the_partitions_it_lags_in() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 2, max_age_ms: Some(1_000), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    h.publish_request(keyed("s.a", &key_for(0, 2), "x")).unwrap();
    h.publish_request(keyed("s.a", &key_for(1, 2), "x")).unwrap();
    progress(&mut h, "s", "mirror", 0, 1).unwrap();
    h.take_effects();
    h.advance(1_000);
    h.tick();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Age)]);
    assert_eq!(retained(&h, "s", 1), vec![1]);
}

#[test]
fn a_publish_that_needs_a_removal_the_peer_holds_back_is_storage_full() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages: Some(2), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    h.publish("s.a", "1").unwrap();
    h.publish("s.a", "2").unwrap();
    h.take_effects();
    let before = h.cell.stream_info("s").unwrap();
    assert_eq!(
        h.publish("s.a", "3"),
        Err(Rejection::StorageFull { lagging_peer: "mirror".to_string(), partition: 0, received: 0 })
    );
    assert!(h.take_effects().is_empty());
    assert_eq!(h.cell.stream_info("s").unwrap(), before, "a refused publish changes nothing");
    progress(&mut h, "s", "mirror", 0, 1).unwrap();
    assert!(removals(&mut h).is_empty(), "the stream is within its limit: nothing was held back");
    assert_eq!(h.publish("s.a", "3").unwrap().seq, 3);
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::StreamLimit)]);
    assert_eq!(
        h.publish("s.a", "4"),
        Err(Rejection::StorageFull { lagging_peer: "mirror".to_string(), partition: 0, received: 1 })
    );
}

#[test]
fn a_publish_that_needs_no_removal_ignores_a_lagging_peer() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages: Some(3), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    for i in 1..=3 {
        assert_eq!(h.publish("s.a", "x").unwrap().seq, i);
    }
}

#[test]
fn newest_wins_is_storage_full_while_the_peer_lags() {
    let mut h = Harness::new();
    h.create_stream("kv", StreamConfig { max_messages_per_subject: Some(1), ..config(&["kv.>"]) });
    register(&mut h, "kv", "mirror").unwrap();
    h.publish("kv.a", "v1").unwrap();
    h.publish("kv.b", "v1").unwrap();
    assert_eq!(
        h.publish("kv.a", "v2"),
        Err(Rejection::StorageFull { lagging_peer: "mirror".to_string(), partition: 0, received: 0 })
    );
    progress(&mut h, "kv", "mirror", 0, 1).unwrap();
    h.take_effects();
    h.publish("kv.a", "v2").unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::SubjectLimit)]);
}

#[test]
fn storage_full_names_the_peer_that_lags() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages: Some(1), ..config(&["s.>"]) });
    register(&mut h, "s", "alpha").unwrap();
    register(&mut h, "s", "beta").unwrap();
    h.publish("s.a", "1").unwrap();
    progress(&mut h, "s", "alpha", 0, 1).unwrap();
    assert_eq!(
        h.publish("s.a", "2"),
        Err(Rejection::StorageFull { lagging_peer: "beta".to_string(), partition: 0, received: 0 })
    );
    progress(&mut h, "s", "beta", 0, 1).unwrap();
    h.publish("s.a", "2").unwrap();
}

#[test]
fn storage_full_reports_the_partition_of_the_held_message() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { partitions: 2, max_messages: Some(1), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    let (k0, k1) = (key_for(0, 2), key_for(1, 2));
    h.publish_request(keyed("s.a", &k1, "oldest")).unwrap();
    assert_eq!(
        h.publish_request(keyed("s.a", &k0, "new")),
        Err(Rejection::StorageFull { lagging_peer: "mirror".to_string(), partition: 1, received: 0 })
    );
}

#[test]
fn discard_new_is_not_affected_by_a_lagging_peer() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { discard: DiscardPolicy::New, max_messages: Some(1), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    h.publish("s.a", "1").unwrap();
    assert_eq!(h.publish("s.a", "2"), Err(Rejection::QuotaExceeded { quota: Quota::StreamMessages, limit: 1 }));
}

#[test]
fn a_lowered_limit_waits_for_the_peer_and_then_applies() {
    let mut h = Harness::new();
    h.simple_stream("s");
    register(&mut h, "s", "mirror").unwrap();
    for i in 1..=4 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.take_effects();
    h.ok(Command::UpdateStream {
        name: "s".to_string(),
        config: StreamConfig { max_messages: Some(1), ..config(&["s.>"]) },
    });
    assert!(removals(&mut h).is_empty());
    progress(&mut h, "s", "mirror", 0, 2).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::StreamLimit), (0, 2, RemovalReason::StreamLimit)]);
    progress(&mut h, "s", "mirror", 0, 4).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 3, RemovalReason::StreamLimit)]);
    assert_eq!(retained(&h, "s", 0), vec![4]);
}

#[test]
fn a_committed_transaction_overshoots_the_limit_until_the_peer_catches_up() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_messages: Some(1), ..config(&["s.>"]) });
    register(&mut h, "s", "mirror").unwrap();
    h.publish("s.a", "plain").unwrap();
    let producer = h.init_producer("tx");
    h.ok(Command::BeginTransaction(producer));
    let staged = PublishRequest {
        transaction: Some(producer),
        ..PublishRequest::new("s.a", Bytes::from_static(b"transactional"))
    };
    h.ok(Command::Publish(staged));
    h.take_effects();
    assert!(matches!(h.ok(Command::CommitTransaction(producer)), Outcome::TransactionCommitted { .. }));
    assert!(removals(&mut h).is_empty(), "a commit is never refused, nor does it remove what the peer lacks");
    assert_eq!(retained(&h, "s", 0), vec![1, 2]);
    progress(&mut h, "s", "mirror", 0, 2).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::StreamLimit)]);
    assert_eq!(retained(&h, "s", 0), vec![2]);
}

#[test]
fn interest_removal_waits_for_the_peer() {
    let mut h = Harness::new();
    interest_stream(&mut h, "s");
    register(&mut h, "s", "mirror").unwrap();
    h.create_consumer("s", "c", ConsumerConfig::default());
    for i in 1..=3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.take_effects();
    consume_all(&mut h, "s", "c");
    assert!(removals(&mut h).is_empty());
    progress(&mut h, "s", "mirror", 0, 2).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest), (0, 2, RemovalReason::Interest)]);
    progress(&mut h, "s", "mirror", 0, 3).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 3, RemovalReason::Interest)]);
}

#[test]
fn work_queue_removal_waits_for_the_peer() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    register(&mut h, "wq", "mirror").unwrap();
    h.create_consumer("wq", "workers", ConsumerConfig::default());
    h.publish("wq.job", "1").unwrap();
    h.take_effects();
    consume_all(&mut h, "wq", "workers");
    assert!(removals(&mut h).is_empty());
    progress(&mut h, "wq", "mirror", 0, 1).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Interest)]);
}

#[test]
fn unregistering_the_peer_releases_everything_it_held() {
    let mut h = Harness::new();
    h.create_stream(
        "s",
        StreamConfig { retention: RetentionPolicy::Interest, max_age_ms: Some(10_000), ..config(&["s.>"]) },
    );
    register(&mut h, "s", "mirror").unwrap();
    h.create_consumer("s", "c", ConsumerConfig::default());
    h.publish("s.a", "old").unwrap();
    h.advance(5_000);
    h.publish("s.a", "acked").unwrap();
    h.publish("s.a", "pending").unwrap();
    let deliveries = h.fetch("s", "c", 10);
    assert_eq!(deliveries.len(), 3);
    h.ack("s", "c", 0, 2, AckKind::Applied).unwrap();
    h.advance(5_000);
    h.tick();
    h.take_effects();
    assert_eq!(retained(&h, "s", 0), vec![1, 2, 3]);
    assert_eq!(unregister(&mut h, "s", "mirror"), Ok(Outcome::PeerUnregistered));
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Age), (0, 2, RemovalReason::Interest)]);
    assert_eq!(retained(&h, "s", 0), vec![3]);
}

#[test]
fn every_peer_must_have_received_a_message_before_it_goes() {
    let mut h = Harness::new();
    h.create_stream("s", StreamConfig { max_age_ms: Some(1_000), ..config(&["s.>"]) });
    register(&mut h, "s", "alpha").unwrap();
    register(&mut h, "s", "beta").unwrap();
    h.publish("s.a", "x").unwrap();
    h.advance(2_000);
    progress(&mut h, "s", "alpha", 0, 1).unwrap();
    h.tick();
    assert_eq!(n_messages(&h, "s"), 1);
    h.take_effects();
    progress(&mut h, "s", "beta", 0, 1).unwrap();
    assert_eq!(removals(&mut h), vec![(0, 1, RemovalReason::Age)]);
}

#[test]
fn a_work_queue_job_acked_and_removed_is_still_a_duplicate_within_the_window() {
    // A retried publish that arrives after its job was done must not queue the job again.
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "workers", ConsumerConfig::default());
    let first = h.publish_id("wq.job", "1", "job-1").unwrap();
    assert_eq!(consume_all(&mut h, "wq", "workers"), vec![(0, first.seq)]);
    assert_eq!(n_messages(&h, "wq"), 0, "the job is gone once acked");
    h.advance(1_000);
    let again = h.publish_id("wq.job", "1", "job-1").unwrap();
    assert!(again.duplicate, "a repeat within the duplicate window is a duplicate");
    assert_eq!(again.seq, first.seq);
    assert_eq!(n_messages(&h, "wq"), 0);
}

#[test]
fn work_queue_ids_are_remembered_through_out_of_order_acks() {
    let mut h = Harness::new();
    work_queue(&mut h, "wq");
    h.create_consumer("wq", "workers", ConsumerConfig::default());
    for round in [0usize, 4, 8, 12] {
        let mut seqs = Vec::new();
        for index in round..round + 5 {
            let ack = h.publish_id("wq.job", "x", &format!("j-{index}")).unwrap();
            assert_eq!(ack.duplicate, index == round && round > 0, "j-{index} in round {round}");
            seqs.push(ack.seq);
        }
        let deliveries = h.fetch_as("wq", "workers", "w2", 16);
        let mut positions: Vec<u64> = deliveries.iter().map(|d| d.record.seq).collect();
        positions.sort_unstable();
        // Ack all but the second, then the second.
        for (i, &seq) in positions.iter().enumerate() {
            if i != 1 {
                h.ack("wq", "workers", 0, seq, AckKind::Applied).unwrap();
            }
        }
        h.advance(100);
        if let Some(&seq) = positions.get(1) {
            h.ack("wq", "workers", 0, seq, AckKind::Applied).unwrap();
        }
        h.advance(1_000);
        h.tick();
    }
}
