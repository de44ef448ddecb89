//! Durable consumers: creation, deliver policies, filters, fetch, every ack kind, expiry and redelivery,
//! dead-lettering, lag, cursor commits, work queues and delayed delivery.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    AckKind, AckState, Command, ConsumerConfig, DeliverPolicy, Delivery, DeliveryPhase, MAX_PAYLOAD_LIMIT,
    MAX_RESPONSE_BYTES, Millis, Outcome, PublishRequest, Rejection, RemovalReason, RetentionPolicy, StreamConfig,
    Transition, subject::partition_for_key,
};

// ----- shorthands -----

fn seqs(deliveries: &[Delivery]) -> Vec<u64> {
    deliveries.iter().map(|d| d.record.seq).collect()
}

fn texts(h: &Harness, deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(|delivery| h.text(delivery)).collect()
}

/// Fetches for `consumer` and reads the payloads as text.
fn fetch_texts(h: &mut Harness, stream: &str, consumer: &str, max: u32) -> Vec<String> {
    let deliveries = h.fetch(stream, consumer, max);
    texts(h, &deliveries)
}

fn counts(deliveries: &[Delivery]) -> Vec<u32> {
    deliveries.iter().map(|d| d.delivery_count).collect()
}

/// Publishes `n` messages `m1..=mn` to `subject`.
fn publish_n(h: &mut Harness, subject: &str, n: usize) {
    for i in 1..=n {
        h.publish(subject, &format!("m{i}")).unwrap();
    }
}

/// A stream `orders` claiming `orders.>` and a consumer `c` on it with `config`.
fn orders_with(config: ConsumerConfig) -> Harness {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.create_consumer("orders", "c", config);
    h
}

fn orders() -> Harness {
    orders_with(ConsumerConfig::default())
}

fn ack0(h: &mut Harness, seq: u64, kind: AckKind) -> Result<Outcome, Rejection> {
    h.ack("orders", "c", 0, seq, kind)
}

fn done(state: AckState) -> Outcome {
    Outcome::Acked { state, already_done: false }
}

fn already_done() -> Outcome {
    Outcome::Acked { state: AckState::Applied, already_done: true }
}

/// The `(seq, delivery_count)` of every `DeliveryExpired` effect in `effects`.
fn expired(effects: &[Transition]) -> Vec<(u64, u32)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Transition::DeliveryExpired { seq, delivery_count, .. } => Some((*seq, *delivery_count)),
            _ => None,
        })
        .collect()
}

/// The `DeadLettered` effects in `effects`.
fn dead_lettered(effects: &[Transition]) -> Vec<Transition> {
    effects.iter().filter(|e| matches!(e, Transition::DeadLettered { .. })).cloned().collect()
}

/// A key that lands in `partition` of a stream with `n_partitions`.
fn key_for(partition: u32, n_partitions: u32) -> Bytes {
    (0..10_000)
        .map(|i| Bytes::from(format!("key-{i}")))
        .find(|key| partition_for_key(key, n_partitions) == partition)
        .expect("some small key lands in every partition")
}

fn publish_keyed(h: &mut Harness, subject: &str, key: &Bytes, payload: &str) -> u64 {
    let request = PublishRequest {
        key: Some(key.clone()),
        ..PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes()))
    };
    h.publish_request(request).unwrap().seq
}

/// `orders` with a dead-letter stream `dlq` (claiming `dlq.>`), and consumer `c` with `config`.
fn orders_with_dead_letters(config: ConsumerConfig) -> Harness {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    h.create_stream(
        "orders",
        StreamConfig { dead_letter_stream: Some("dlq".to_string()), ..StreamConfig::with_subjects(["orders.>"]) },
    );
    h.create_consumer("orders", "c", config);
    h
}

fn header<'a>(record: &'a cellog_core::Record, name: &str) -> Option<&'a str> {
    record.headers.get(name).map(String::as_str)
}

// ----- creation -----

#[test]
fn creating_a_consumer_reports_created() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let outcome =
        h.ok(Command::CreateConsumer { stream: "orders".into(), name: "c".into(), config: ConsumerConfig::default() });
    assert_eq!(outcome, Outcome::ConsumerCreated { created: true });
    assert_eq!(h.cell.stream_info("orders").unwrap().consumers, vec!["c".into()]);
}

#[test]
fn identical_re_create_is_not_created_again() {
    let config = ConsumerConfig { ack_wait_ms: 5_000, max_deliver: Some(3), ..ConsumerConfig::default() };
    let mut h = orders_with(config.clone());
    publish_n(&mut h, "orders.a", 2);
    assert_eq!(seqs(&h.fetch("orders", "c", 1)), vec![1]);
    let outcome = h.ok(Command::CreateConsumer { stream: "orders".into(), name: "c".into(), config });
    assert_eq!(outcome, Outcome::ConsumerCreated { created: false });
    // The re-create kept the consumer's position: the next fetch continues after the first delivery.
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![2]);
}

#[test]
fn re_create_with_a_different_config_is_a_conflict() {
    let mut h = orders();
    let different = ConsumerConfig { ack_wait_ms: 1_234, ..ConsumerConfig::default() };
    let rejection =
        h.apply(Command::CreateConsumer { stream: "orders".into(), name: "c".into(), config: different }).unwrap_err();
    assert_eq!(rejection, Rejection::Conflict { what: "consumer".into(), name: "c".into() });
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().config, ConsumerConfig::default());
}

#[test]
fn consumer_on_a_missing_stream_is_stream_not_found() {
    let mut h = Harness::new();
    let rejection = h
        .apply(Command::CreateConsumer { stream: "nope".into(), name: "c".into(), config: ConsumerConfig::default() })
        .unwrap_err();
    assert_eq!(rejection, Rejection::StreamNotFound { stream: "nope".into() });
}

#[test]
fn fetch_from_a_missing_consumer_is_consumer_not_found() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let rejection = h
        .apply(Command::Fetch { stream: "orders".into(), consumer: "ghost".into(), member: "m1".into(), max: 1 })
        .unwrap_err();
    assert_eq!(rejection, Rejection::ConsumerNotFound { stream: "orders".into(), consumer: "ghost".into() });
}

#[test]
fn fetch_of_zero_messages_is_invalid() {
    let mut h = orders();
    let rejection = h
        .apply(Command::Fetch { stream: "orders".into(), consumer: "c".into(), member: "m1".into(), max: 0 })
        .unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
}

// ----- where a consumer starts -----

#[test]
fn consumer_created_later_starts_from_the_beginning() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    publish_n(&mut h, "orders.a", 3);
    h.advance(10_000);
    h.create_consumer("orders", "late", ConsumerConfig::default());
    assert_eq!(ConsumerConfig::default().deliver_policy, DeliverPolicy::All);
    let deliveries = h.fetch("orders", "late", 10);
    assert_eq!(texts(&h, &deliveries), vec!["m1", "m2", "m3"]);
    assert_eq!(seqs(&deliveries), vec![1, 2, 3]);
}

#[test]
fn messages_published_with_no_consumer_wait_on_an_interest_stream() {
    let mut h = Harness::new();
    h.create_stream(
        "jobs",
        StreamConfig { retention: RetentionPolicy::Interest, ..StreamConfig::with_subjects(["jobs.>"]) },
    );
    publish_n(&mut h, "jobs.a", 2);
    h.advance(60_000);
    h.tick();
    assert_eq!(h.cell.stream_info("jobs").unwrap().n_messages, 2);
    assert!(!h.take_effects().iter().any(|e| matches!(e, Transition::Removed { .. })));

    h.create_consumer("jobs", "worker", ConsumerConfig::default());
    let deliveries = h.fetch("jobs", "worker", 10);
    assert_eq!(texts(&h, &deliveries), vec!["m1", "m2"]);
    for seq in [1, 2] {
        h.ack("jobs", "worker", 0, seq, AckKind::Applied).unwrap();
    }
    // Once the only consumer is done, interest retention removes the messages.
    let removed: Vec<_> = h
        .take_effects()
        .into_iter()
        .filter_map(|e| match e {
            Transition::Removed { seq, reason, .. } => Some((seq, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(removed, vec![(1, RemovalReason::Interest), (2, RemovalReason::Interest)]);
    assert_eq!(h.cell.stream_info("jobs").unwrap().n_messages, 0);
}

#[test]
fn deliver_policy_new_skips_what_was_already_published() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    publish_n(&mut h, "orders.a", 3);
    h.create_consumer("orders", "c", ConsumerConfig { deliver_policy: DeliverPolicy::New, ..Default::default() });
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.publish("orders.a", "fresh").unwrap();
    let deliveries = h.fetch("orders", "c", 10);
    assert_eq!(texts(&h, &deliveries), vec!["fresh"]);
    assert_eq!(seqs(&deliveries), vec![4]);
}

#[test]
fn deliver_policy_from_sequence_starts_there() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    publish_n(&mut h, "orders.a", 5);
    h.create_consumer(
        "orders",
        "c",
        ConsumerConfig { deliver_policy: DeliverPolicy::FromSequence(3), ..Default::default() },
    );
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![3, 4, 5]);
}

#[test]
fn deliver_policy_from_sequence_before_the_oldest_starts_at_the_oldest() {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { max_messages: Some(2), ..StreamConfig::with_subjects(["orders.>"]) });
    publish_n(&mut h, "orders.a", 5);
    h.create_consumer(
        "orders",
        "c",
        ConsumerConfig { deliver_policy: DeliverPolicy::FromSequence(1), ..Default::default() },
    );
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![4, 5]);
}

#[test]
fn deliver_policy_from_sequence_beyond_the_end_waits_for_that_sequence() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    publish_n(&mut h, "orders.a", 2);
    h.create_consumer(
        "orders",
        "c",
        ConsumerConfig { deliver_policy: DeliverPolicy::FromSequence(4), ..Default::default() },
    );
    h.publish("orders.a", "m3").unwrap();
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.publish("orders.a", "m4").unwrap();
    assert_eq!(fetch_texts(&mut h, "orders", "c", 10), vec!["m4"]);
}

#[test]
fn deliver_policy_from_time_starts_at_the_first_message_stored_then() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    // Three messages stored at 1000, 2000 and 3000.
    h.publish("orders.a", "early").unwrap();
    h.advance(1_000);
    h.publish("orders.a", "exact").unwrap();
    h.advance(1_000);
    h.publish("orders.a", "late").unwrap();
    h.create_consumer(
        "orders",
        "exact",
        ConsumerConfig { deliver_policy: DeliverPolicy::FromTime(Millis(2_000)), ..Default::default() },
    );
    h.create_consumer(
        "orders",
        "between",
        ConsumerConfig { deliver_policy: DeliverPolicy::FromTime(Millis(2_001)), ..Default::default() },
    );
    h.create_consumer(
        "orders",
        "future",
        ConsumerConfig { deliver_policy: DeliverPolicy::FromTime(Millis(99_000)), ..Default::default() },
    );
    // A reader starting from a time (a live tail) begins where such a consumer does: one past the last when nothing
    // was stored then.
    let reader_from = |h: &Harness, time| h.cell.first_seq_at_or_after("orders", 0, Millis(time));
    assert_eq!([2_000, 2_001, 99_000].map(|time| reader_from(&h, time)), [Ok(2), Ok(3), Ok(4)]);
    assert!(matches!(h.cell.first_seq_at_or_after("orders", 1, Millis(0)), Err(Rejection::Invalid { .. })));
    assert_eq!(fetch_texts(&mut h, "orders", "exact", 10), vec!["exact", "late"]);
    assert_eq!(fetch_texts(&mut h, "orders", "between", 10), vec!["late"]);
    assert!(h.fetch("orders", "future", 10).is_empty());
    h.publish("orders.a", "next").unwrap();
    assert_eq!(fetch_texts(&mut h, "orders", "future", 10), vec!["next"]);
}

// ----- filters -----

/// One fetch looks at a bounded stretch of the log (65 536 slots) for messages its filter matches; the cursor keeps
/// its place, so the next fetch goes on past the stretch rather than starting over.
#[test]
fn a_fetch_over_a_long_filtered_out_stretch_stops_and_the_next_goes_on() {
    const SCAN_LIMIT: usize = 65_536;
    let mut h = orders_with(ConsumerConfig { filter_subject: Some("orders.b".into()), ..Default::default() });
    publish_n(&mut h, "orders.a", SCAN_LIMIT);
    h.publish("orders.b", "wanted").unwrap();
    assert!(h.fetch("orders", "c", 10).is_empty(), "the first fetch looked at the stretch only");
    assert_eq!(fetch_texts(&mut h, "orders", "c", 10), vec!["wanted"]);
}

#[test]
fn filter_subject_skips_non_matching_messages() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.create_consumer(
        "orders",
        "eu",
        ConsumerConfig { filter_subject: Some("orders.eu.*".into()), ..Default::default() },
    );
    h.publish("orders.eu.created", "a").unwrap();
    h.publish("orders.us.created", "b").unwrap();
    h.publish("orders.eu.paid", "c").unwrap();
    h.publish("orders.eu.paid.late", "d").unwrap();
    let deliveries = h.fetch("orders", "eu", 10);
    assert_eq!(texts(&h, &deliveries), vec!["a", "c"]);
    assert_eq!(seqs(&deliveries), vec![1, 3]);
    assert!(deliveries.iter().all(|d| d.record.subject.starts_with("orders.eu.")));
}

#[test]
fn filter_subject_takes_up_no_fetch_budget() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.create_consumer("orders", "b", ConsumerConfig { filter_subject: Some("orders.b".into()), ..Default::default() });
    for i in 0..5 {
        h.publish("orders.a", &format!("skip{i}")).unwrap();
    }
    h.publish("orders.b", "wanted").unwrap();
    assert_eq!(fetch_texts(&mut h, "orders", "b", 1), vec!["wanted"]);
}

#[test]
fn filter_matching_none_of_the_stream_subjects_is_invalid_config() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let rejection = h
        .apply(Command::CreateConsumer {
            stream: "orders".into(),
            name: "c".into(),
            config: ConsumerConfig { filter_subject: Some("billing.>".into()), ..Default::default() },
        })
        .unwrap_err();
    assert!(matches!(rejection, Rejection::InvalidConfig { .. }), "{rejection:?}");
}

#[test]
fn acking_a_filtered_out_message_is_already_done() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.create_consumer("orders", "b", ConsumerConfig { filter_subject: Some("orders.b".into()), ..Default::default() });
    h.publish("orders.a", "skip").unwrap();
    h.publish("orders.b", "wanted").unwrap();
    h.fetch("orders", "b", 10);
    assert_eq!(h.ack("orders", "b", 0, 1, AckKind::Applied).unwrap(), already_done());
}

// ----- fetch -----

#[test]
fn fetch_returns_up_to_max_in_order() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 5);
    assert_eq!(seqs(&h.fetch("orders", "c", 3)), vec![1, 2, 3]);
    assert_eq!(seqs(&h.fetch("orders", "c", 3)), vec![4, 5]);
    assert!(h.fetch("orders", "c", 3).is_empty());
}

#[test]
fn fetch_on_an_empty_stream_returns_nothing() {
    let mut h = orders();
    assert!(h.fetch("orders", "c", 10).is_empty());
}

#[test]
fn delivery_carries_the_record_the_count_and_the_ack_deadline() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 5_000, ..Default::default() });
    let mut request = PublishRequest::new("orders.a", "body").with_id("id-1");
    request.headers.insert("trace".into(), "t-1".into());
    h.publish_request(request).unwrap();
    h.advance(500);
    let deliveries = h.fetch("orders", "c", 10);
    assert_eq!(deliveries.len(), 1);
    let delivery = &deliveries[0];
    assert_eq!(delivery.delivery_count, 1);
    assert_eq!(delivery.ack_deadline, Millis(1_500 + 5_000));
    assert_eq!(delivery.record.partition, 0);
    assert_eq!(delivery.record.seq, 1);
    assert_eq!(&*delivery.record.subject, "orders.a");
    assert_eq!(delivery.record.msg_id.as_deref(), Some("id-1"));
    assert_eq!(header(&delivery.record, "trace"), Some("t-1"));
    assert_eq!(h.payload(&delivery.record), Bytes::from_static(b"body"));
    assert_eq!(delivery.record.stored_at, Millis(1_000));
    assert_eq!(h.cell.next_deadline(), Some(Millis(6_500)));
}

#[test]
fn fetch_reads_every_partition() {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions: 3, ..StreamConfig::with_subjects(["orders.>"]) });
    h.create_consumer("orders", "c", ConsumerConfig::default());
    for partition in 0..3 {
        let key = key_for(partition, 3);
        publish_keyed(&mut h, "orders.a", &key, &format!("p{partition}"));
    }
    let deliveries = h.fetch("orders", "c", 10);
    let mut seen: Vec<(u32, String)> = deliveries.iter().map(|d| (d.record.partition, h.text(d))).collect();
    seen.sort();
    assert_eq!(seen, vec![(0, "p0".into()), (1, "p1".into()), (2, "p2".into())]);
}

#[test]
fn max_in_flight_caps_outstanding_deliveries() {
    let mut h = orders_with(ConsumerConfig { max_in_flight: 2, ..Default::default() });
    publish_n(&mut h, "orders.a", 5);
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![1, 2]);
    assert!(h.fetch("orders", "c", 10).is_empty());
    assert!(h.fetch_as("orders", "c", "m2", 10).is_empty());
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().n_pending, 2);

    // An ack frees exactly one slot.
    ack0(&mut h, 1, AckKind::Applied).unwrap();
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![3]);
    assert!(h.fetch("orders", "c", 10).is_empty());
}

#[test]
fn in_progress_keeps_its_slot_in_flight() {
    let mut h = orders_with(ConsumerConfig { max_in_flight: 1, ..Default::default() });
    publish_n(&mut h, "orders.a", 2);
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![1]);
    ack0(&mut h, 1, AckKind::InProgress).unwrap();
    assert!(h.fetch("orders", "c", 10).is_empty());
}

// ----- acks -----

#[test]
fn applied_is_done_and_acking_again_is_already_done() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), done(AckState::Applied));
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), already_done());
    assert_eq!(ack0(&mut h, 1, AckKind::Nack { delay_ms: 0 }).unwrap(), already_done());
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().n_acked, 1);
}

#[test]
fn replicated_is_done_and_acking_again_is_already_done() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    assert_eq!(ack0(&mut h, 1, AckKind::Replicated).unwrap(), done(AckState::Replicated));
    let again = ack0(&mut h, 1, AckKind::Replicated).unwrap();
    assert!(matches!(again, Outcome::Acked { already_done: true, .. }), "{again:?}");
}

#[test]
fn a_done_message_is_never_redelivered() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 2);
    h.fetch("orders", "c", 2);
    ack0(&mut h, 1, AckKind::Applied).unwrap();
    ack0(&mut h, 2, AckKind::Replicated).unwrap();
    h.take_effects();
    h.advance(10_000);
    h.tick();
    assert!(expired(&h.take_effects()).is_empty());
    assert!(h.fetch("orders", "c", 10).is_empty());
}

#[test]
fn applied_frees_the_message_out_of_order() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 3);
    h.fetch("orders", "c", 3);
    ack0(&mut h, 2, AckKind::Applied).unwrap();
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.n_pending, 2);
    assert_eq!(info.partitions[0].ack_floor, 1);
    ack0(&mut h, 1, AckKind::Applied).unwrap();
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().partitions[0].ack_floor, 3);
}

#[test]
fn received_extends_the_deadline() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    let first = h.fetch("orders", "c", 1);
    assert_eq!(first[0].ack_deadline, Millis(11_000));
    h.now = Millis(7_000);
    assert_eq!(ack0(&mut h, 1, AckKind::Received).unwrap(), done(AckState::Received));
    h.take_effects();

    // The old deadline passes without an expiry or a redelivery.
    h.now = Millis(11_000);
    h.tick();
    assert!(expired(&h.take_effects()).is_empty());
    assert!(h.fetch("orders", "c", 10).is_empty());

    // The new deadline is the ack time plus ack_wait.
    h.now = Millis(16_999);
    h.tick();
    assert!(expired(&h.take_effects()).is_empty());
    h.now = Millis(17_000);
    h.tick();
    assert_eq!(expired(&h.take_effects()), vec![(1, 1)]);
}

#[test]
fn in_progress_extends_the_deadline() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.now = Millis(10_000);
    assert_eq!(ack0(&mut h, 1, AckKind::InProgress).unwrap(), done(AckState::Received));
    h.now = Millis(19_000);
    assert_eq!(ack0(&mut h, 1, AckKind::InProgress).unwrap(), done(AckState::Received));
    h.take_effects();

    for at in [11_000, 20_000, 28_999] {
        h.now = Millis(at);
        h.tick();
        assert!(expired(&h.take_effects()).is_empty(), "expired at {at}");
        assert!(h.fetch("orders", "c", 10).is_empty(), "redelivered at {at}");
    }
    h.now = Millis(29_000);
    let redelivered = h.fetch("orders", "c", 10);
    assert_eq!(expired(&h.take_effects()), vec![(1, 1)]);
    assert_eq!(seqs(&redelivered), vec![1]);
    assert_eq!(counts(&redelivered), vec![2]);
}

#[test]
fn nack_without_delay_is_redelivered_on_the_next_fetch() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 3);
    h.fetch("orders", "c", 2);
    assert_eq!(ack0(&mut h, 1, AckKind::Nack { delay_ms: 0 }).unwrap(), done(AckState::Nack));
    let next = h.fetch("orders", "c", 10);
    // The redelivery comes first, then the new message.
    assert_eq!(seqs(&next), vec![1, 3]);
    assert_eq!(counts(&next), vec![2, 1]);
    assert_eq!(h.text(&next[0]), "m1");
}

#[test]
fn nack_with_delay_is_redelivered_after_the_delay_not_before() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.now = Millis(1_100);
    assert_eq!(ack0(&mut h, 1, AckKind::Nack { delay_ms: 5_000 }).unwrap(), done(AckState::Nack));
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.now = Millis(6_099);
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.now = Millis(6_100);
    let again = h.fetch("orders", "c", 10);
    assert_eq!(seqs(&again), vec![1]);
    assert_eq!(counts(&again), vec![2]);
    assert_eq!(again[0].ack_deadline, Millis(6_100 + 30_000));
}

#[test]
fn nack_with_delay_does_not_hold_back_other_messages() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    ack0(&mut h, 1, AckKind::Nack { delay_ms: 5_000 }).unwrap();
    h.publish("orders.a", "m2").unwrap();
    assert_eq!(fetch_texts(&mut h, "orders", "c", 10), vec!["m2"]);
}

#[test]
fn failed_is_dead_lettered_at_once() {
    let mut h = orders_with_dead_letters(ConsumerConfig { max_deliver: Some(5), ..Default::default() });
    h.publish_request(keyed("orders.a", "k1", "m1")).unwrap();
    h.fetch("orders", "c", 1);
    h.take_effects();
    assert_eq!(ack0(&mut h, 1, AckKind::Failed).unwrap(), done(AckState::Failed));
    let letters = dead_lettered(&h.take_effects());
    assert_eq!(
        letters,
        vec![Transition::DeadLettered {
            stream: "orders".into(),
            consumer: "c".into(),
            partition: 0,
            seq: 1,
            delivery_count: 1,
            copy: Some(("dlq".into(), 0, 1)),
        }]
    );
    let copies = h.cell.read_from("dlq", 0, 1, 10).unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!((&*copies[0].subject, copies[0].key.as_deref()), ("orders.a", Some(&b"k1"[..])), "subject and key kept");
    assert_eq!(header(&copies[0], "cellog-dead-letter-reason"), Some("failed"));
    assert_eq!(header(&copies[0], "cellog-dead-letter-deliveries"), Some("1"));

    // It is gone for this consumer: no redelivery, and further acks find it done.
    h.advance(60_000);
    assert!(h.fetch("orders", "c", 10).is_empty());
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), already_done());
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().n_dead_lettered, 1);
}

#[test]
fn failed_without_a_dead_letter_stream_still_leaves_the_consumer() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.take_effects();
    ack0(&mut h, 1, AckKind::Failed).unwrap();
    let letters = dead_lettered(&h.take_effects());
    assert!(
        matches!(&letters[..], [Transition::DeadLettered { seq: 1, delivery_count: 1, copy: None, .. }]),
        "{letters:?}"
    );
    h.advance(60_000);
    assert!(h.fetch("orders", "c", 10).is_empty());
}

#[test]
fn term_is_never_redelivered_and_not_dead_lettered() {
    let mut h = orders_with_dead_letters(ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.take_effects();
    assert_eq!(ack0(&mut h, 1, AckKind::Term).unwrap(), done(AckState::Failed));
    for _ in 0..5 {
        h.advance(5_000);
        assert!(h.fetch("orders", "c", 10).is_empty());
    }
    let effects = h.take_effects();
    assert!(expired(&effects).is_empty());
    assert!(dead_lettered(&effects).is_empty());
    assert!(h.cell.read_from("dlq", 0, 1, 10).unwrap().is_empty());
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), already_done());
}

#[test]
fn ack_of_an_undelivered_sequence_is_not_delivered() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 3);
    h.fetch("orders", "c", 1);
    for kind in [AckKind::Applied, AckKind::InProgress, AckKind::Nack { delay_ms: 0 }, AckKind::Term] {
        assert_eq!(ack0(&mut h, 2, kind).unwrap_err(), Rejection::NotDelivered { partition: 0, seq: 2 });
    }
    assert_eq!(ack0(&mut h, 99, AckKind::Applied).unwrap_err(), Rejection::NotDelivered { partition: 0, seq: 99 });
    // The refused acks changed nothing: 2 and 3 are still delivered in order.
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![2, 3]);
}

#[test]
fn ack_on_a_missing_partition_or_consumer_is_refused() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    let rejection = h.ack("orders", "c", 1, 1, AckKind::Applied).unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
    let rejection = h.ack("orders", "ghost", 0, 1, AckKind::Applied).unwrap_err();
    assert_eq!(rejection, Rejection::ConsumerNotFound { stream: "orders".into(), consumer: "ghost".into() });
    let rejection = h.ack("nope", "c", 0, 1, AckKind::Applied).unwrap_err();
    assert_eq!(rejection, Rejection::StreamNotFound { stream: "nope".into() });
}

// ----- expiry and redelivery -----

#[test]
fn nothing_expires_before_ack_wait() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.take_effects();
    h.now = Millis(10_999);
    h.tick();
    assert!(expired(&h.take_effects()).is_empty());
    assert!(h.fetch("orders", "c", 10).is_empty());
}

#[test]
fn expiry_after_ack_wait_is_reported_by_a_tick() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.take_effects();
    assert_eq!(h.cell.next_deadline(), Some(Millis(11_000)));
    h.now = Millis(11_000);
    h.tick();
    assert_eq!(
        h.take_effects(),
        vec![Transition::DeliveryExpired {
            stream: "orders".into(),
            consumer: "c".into(),
            partition: 0,
            seq: 1,
            delivery_count: 1,
        }]
    );
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.n_pending, 0);
    assert_eq!(info.n_ready, 1);
}

#[test]
fn an_expired_message_is_redelivered_first_with_count_two() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 2);
    assert_eq!(seqs(&h.fetch("orders", "c", 1)), vec![1]);
    h.now = Millis(11_000);
    h.tick();
    h.publish("orders.a", "m3").unwrap();
    let next = h.fetch("orders", "c", 10);
    assert_eq!(seqs(&next), vec![1, 2, 3]);
    assert_eq!(counts(&next), vec![2, 1, 1]);
    assert!(next.iter().all(|d| d.ack_deadline == Millis(21_000)));
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.n_delivered, 4);
    assert_eq!(info.n_redelivered, 1);
}

#[test]
fn an_expired_message_is_redelivered_even_without_a_tick() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.take_effects();
    h.now = Millis(12_000);
    let again = h.fetch("orders", "c", 10);
    assert_eq!(counts(&again), vec![2]);
    assert_eq!(expired(&h.take_effects()), vec![(1, 1)]);
}

#[test]
fn an_expired_message_can_still_be_acked() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 10_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.now = Millis(11_000);
    h.tick();
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), done(AckState::Applied));
    assert!(h.fetch("orders", "c", 10).is_empty());
}

#[test]
fn max_deliver_sends_the_message_to_the_dead_letter_stream() {
    let mut h =
        orders_with_dead_letters(ConsumerConfig { ack_wait_ms: 1_000, max_deliver: Some(2), ..Default::default() });
    let mut request = PublishRequest::new("orders.eu", "poison");
    request.headers.insert("origin".into(), "shop".into());
    h.publish_request(request).unwrap();

    assert_eq!(counts(&h.fetch("orders", "c", 1)), vec![1]);
    h.advance(1_000);
    assert_eq!(counts(&h.fetch("orders", "c", 1)), vec![2]);
    h.take_effects();
    h.advance(1_000);
    h.tick();
    let effects = h.take_effects();
    assert_eq!(expired(&effects), vec![(1, 2)]);
    assert_eq!(
        dead_lettered(&effects),
        vec![Transition::DeadLettered {
            stream: "orders".into(),
            consumer: "c".into(),
            partition: 0,
            seq: 1,
            delivery_count: 2,
            copy: Some(("dlq".into(), 0, 1)),
        }]
    );
    assert!(effects.contains(&Transition::Appended { stream: "dlq".into(), partition: 0, seq: 1 }));

    // No third delivery.
    h.advance(10_000);
    assert!(h.fetch("orders", "c", 10).is_empty());

    // The copy is a real message in the dead-letter stream, with its origin in headers.
    let copies = h.cell.read_from("dlq", 0, 1, 10).unwrap();
    assert_eq!(copies.len(), 1);
    let copy = &copies[0];
    assert_eq!(h.payload(copy), Bytes::from_static(b"poison"));
    assert_eq!(&*copy.subject, "orders.eu");
    assert_eq!(header(copy, "origin"), Some("shop"));
    assert_eq!(header(copy, "cellog-dead-letter-stream"), Some("orders"));
    assert_eq!(header(copy, "cellog-dead-letter-consumer"), Some("c"));
    assert_eq!(header(copy, "cellog-dead-letter-partition"), Some("0"));
    assert_eq!(header(copy, "cellog-dead-letter-seq"), Some("1"));
    assert_eq!(header(copy, "cellog-dead-letter-deliveries"), Some("2"));
    assert_eq!(header(copy, "cellog-dead-letter-reason"), Some("max_deliver"));
    assert_eq!(h.cell.stream_info("dlq").unwrap().n_messages, 1);
    // The original stays in a limits stream.
    assert_eq!(h.payload(&h.cell.read("orders", 0, 1).unwrap()), Bytes::from_static(b"poison"));
}

#[test]
fn the_dead_letter_stream_can_be_consumed() {
    let mut h =
        orders_with_dead_letters(ConsumerConfig { ack_wait_ms: 1_000, max_deliver: Some(1), ..Default::default() });
    publish_n(&mut h, "orders.a", 2);
    h.fetch("orders", "c", 2);
    h.advance(1_000);
    h.tick();
    h.create_consumer("dlq", "inspector", ConsumerConfig::default());
    let deliveries = h.fetch("dlq", "inspector", 10);
    assert_eq!(texts(&h, &deliveries), vec!["m1", "m2"]);
    let origin: Vec<_> =
        deliveries.iter().map(|d| header(&d.record, "cellog-dead-letter-seq").unwrap().to_string()).collect();
    assert_eq!(origin, vec!["1", "2"]);
    assert_eq!(h.ack("dlq", "inspector", 0, 1, AckKind::Applied).unwrap(), done(AckState::Applied));
}

#[test]
fn nack_at_max_deliver_dead_letters() {
    let mut h = orders_with_dead_letters(ConsumerConfig { max_deliver: Some(2), ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    ack0(&mut h, 1, AckKind::Nack { delay_ms: 0 }).unwrap();
    assert_eq!(counts(&h.fetch("orders", "c", 1)), vec![2]);
    h.take_effects();
    ack0(&mut h, 1, AckKind::Nack { delay_ms: 0 }).unwrap();
    let letters = dead_lettered(&h.take_effects());
    assert!(matches!(&letters[..], [Transition::DeadLettered { seq: 1, delivery_count: 2, copy: Some(_), .. }]));
    assert!(h.fetch("orders", "c", 10).is_empty());
    let copies = h.cell.read_from("dlq", 0, 1, 10).unwrap();
    assert_eq!(header(&copies[0], "cellog-dead-letter-reason"), Some("max_deliver"));
}

#[test]
fn dead_letters_on_an_interest_stream_release_the_original() {
    let mut h = Harness::new();
    h.simple_stream("dlq");
    h.create_stream(
        "jobs",
        StreamConfig {
            retention: RetentionPolicy::Interest,
            dead_letter_stream: Some("dlq".into()),
            ..StreamConfig::with_subjects(["jobs.>"])
        },
    );
    h.create_consumer("jobs", "w", ConsumerConfig::default());
    h.publish("jobs.a", "x").unwrap();
    h.fetch("jobs", "w", 1);
    h.take_effects();
    h.ack("jobs", "w", 0, 1, AckKind::Failed).unwrap();
    let effects = h.take_effects();
    assert!(effects.contains(&Transition::Removed {
        stream: "jobs".into(),
        partition: 0,
        seq: 1,
        reason: RemovalReason::Interest
    }));
    assert_eq!(h.cell.stream_info("jobs").unwrap().n_messages, 0);
    assert_eq!(h.cell.stream_info("dlq").unwrap().n_messages, 1);
}

// ----- lag and age -----

#[test]
fn lag_per_partition_and_total() {
    let mut h = Harness::new();
    h.create_stream("orders", StreamConfig { partitions: 2, ..StreamConfig::with_subjects(["orders.>"]) });
    h.create_consumer("orders", "c", ConsumerConfig::default());
    let (k0, k1) = (key_for(0, 2), key_for(1, 2));
    for i in 0..3 {
        publish_keyed(&mut h, "orders.a", &k0, &format!("a{i}"));
    }
    for i in 0..5 {
        publish_keyed(&mut h, "orders.a", &k1, &format!("b{i}"));
    }
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.partitions.iter().map(|p| p.lag).collect::<Vec<_>>(), vec![3, 5]);
    assert_eq!(info.lag_total, 8);
    assert_eq!(info.lag_max, 5);

    // Delivery alone does not reduce lag; acks do.
    h.fetch("orders", "c", 100);
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.lag_total, 8);
    assert_eq!(info.partitions.iter().map(|p| p.n_outstanding).collect::<Vec<_>>(), vec![3, 5]);
    for seq in 1..=3 {
        h.ack("orders", "c", 0, seq, AckKind::Applied).unwrap();
    }
    for seq in 1..=2 {
        h.ack("orders", "c", 1, seq, AckKind::Applied).unwrap();
    }
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.partitions.iter().map(|p| p.lag).collect::<Vec<_>>(), vec![0, 3]);
    assert_eq!(info.partitions.iter().map(|p| p.ack_floor).collect::<Vec<_>>(), vec![4, 3]);
    assert_eq!(info.lag_total, 3);
    assert_eq!(info.lag_max, 3);
}

#[test]
fn lag_counts_from_the_oldest_unacked_not_from_the_cursor() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 4);
    h.fetch("orders", "c", 4);
    ack0(&mut h, 2, AckKind::Applied).unwrap();
    ack0(&mut h, 3, AckKind::Applied).unwrap();
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.partitions[0].ack_floor, 1);
    assert_eq!(info.partitions[0].cursor, 5);
    assert_eq!(info.partitions[0].lag, 4);
}

#[test]
fn oldest_unacked_age_follows_the_oldest_message_not_done() {
    let mut h = orders();
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().oldest_unacked_age_ms, 0);
    // Two messages stored at 1000 and 3000, looked at from 6000.
    h.publish("orders.a", "first").unwrap();
    h.advance(2_000);
    h.publish("orders.a", "second").unwrap();
    h.advance(3_000);
    let age = |h: &Harness| h.cell.consumer_info("orders", "c", h.now).unwrap().oldest_unacked_age_ms;
    assert_eq!(age(&h), 5_000);
    // Delivered but not acked is still unacked.
    h.fetch("orders", "c", 10);
    assert_eq!(age(&h), 5_000);
    // The age is computed as of the time asked about.
    assert_eq!(h.cell.consumer_info("orders", "c", Millis(7_000)).unwrap().oldest_unacked_age_ms, 6_000);
    ack0(&mut h, 1, AckKind::Applied).unwrap();
    assert_eq!(age(&h), 3_000);
    ack0(&mut h, 2, AckKind::Applied).unwrap();
    assert_eq!(age(&h), 0);
}

#[test]
fn counters_track_deliveries_acks_and_dead_letters() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 1_000, max_deliver: Some(2), ..Default::default() });
    publish_n(&mut h, "orders.a", 3);
    h.fetch("orders", "c", 3);
    ack0(&mut h, 1, AckKind::Applied).unwrap();
    ack0(&mut h, 2, AckKind::Nack { delay_ms: 0 }).unwrap();
    // This fetch redelivers sequence 2.
    h.fetch("orders", "c", 3);
    ack0(&mut h, 2, AckKind::Failed).unwrap();
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.n_delivered, 4);
    assert_eq!(info.n_redelivered, 1);
    assert_eq!(info.n_acked, 1);
    assert_eq!(info.n_dead_lettered, 1);
    assert_eq!(info.n_pending, 1);
    assert_eq!(info.name.as_ref(), "c");
}

// ----- cursor commits -----

#[test]
fn commit_cursor_moves_forward() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 5);
    let commit = |h: &mut Harness, next_seq| {
        h.apply(Command::CommitCursor { stream: "orders".into(), consumer: "c".into(), partition: 0, next_seq })
    };
    assert_eq!(commit(&mut h, 3).unwrap(), Outcome::CursorCommitted { next_seq: 3 });
    // Committing the same position again is not a regression.
    assert_eq!(commit(&mut h, 3).unwrap(), Outcome::CursorCommitted { next_seq: 3 });
    assert_eq!(commit(&mut h, 2).unwrap_err(), Rejection::CursorRegression { current: 3 });
    // Everything below the committed position is done: delivery continues from there.
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![3, 4, 5]);
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), already_done());
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.partitions[0].ack_floor, 3);
}

#[test]
fn commit_cursor_settles_outstanding_deliveries_below_it() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 4);
    h.fetch("orders", "c", 4);
    let outcome = h
        .apply(Command::CommitCursor { stream: "orders".into(), consumer: "c".into(), partition: 0, next_seq: 3 })
        .unwrap();
    assert_eq!(outcome, Outcome::CursorCommitted { next_seq: 3 });
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().n_acked, 2, "the two it settled count as acked");
    assert_eq!(ack0(&mut h, 2, AckKind::Applied).unwrap(), already_done());
    h.take_effects();
    h.advance(1_000);
    h.tick();
    assert_eq!(expired(&h.take_effects()), vec![(3, 1), (4, 1)]);
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![3, 4]);
    let rejection = h
        .apply(Command::CommitCursor { stream: "orders".into(), consumer: "c".into(), partition: 0, next_seq: 1 })
        .unwrap_err();
    assert_eq!(rejection, Rejection::CursorRegression { current: 3 });
}

#[test]
fn commit_cursor_below_an_ack_floor_raised_by_acks_is_a_regression() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 3);
    h.fetch("orders", "c", 3);
    for seq in 1..=3 {
        ack0(&mut h, seq, AckKind::Applied).unwrap();
    }
    let rejection = h
        .apply(Command::CommitCursor { stream: "orders".into(), consumer: "c".into(), partition: 0, next_seq: 2 })
        .unwrap_err();
    assert_eq!(rejection, Rejection::CursorRegression { current: 4 });
}

#[test]
fn commit_cursor_past_the_end_is_invalid() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 2);
    let rejection = h
        .apply(Command::CommitCursor { stream: "orders".into(), consumer: "c".into(), partition: 0, next_seq: 10 })
        .unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
    // The end itself (the next sequence) is fine.
    let outcome = h
        .apply(Command::CommitCursor { stream: "orders".into(), consumer: "c".into(), partition: 0, next_seq: 3 })
        .unwrap();
    assert_eq!(outcome, Outcome::CursorCommitted { next_seq: 3 });
    assert!(h.fetch("orders", "c", 10).is_empty());
}

// ----- work queues -----

#[test]
fn two_members_never_get_the_same_outstanding_message() {
    let mut h = Harness::new();
    h.create_stream(
        "jobs",
        StreamConfig { retention: RetentionPolicy::WorkQueue, ..StreamConfig::with_subjects(["jobs.>"]) },
    );
    h.create_consumer("jobs", "workers", ConsumerConfig::default());
    publish_n(&mut h, "jobs.a", 6);
    let a = h.fetch_as("jobs", "workers", "alice", 2);
    let b = h.fetch_as("jobs", "workers", "bob", 10);
    let a2 = h.fetch_as("jobs", "workers", "alice", 10);
    assert_eq!(seqs(&a), vec![1, 2]);
    assert_eq!(seqs(&b), vec![3, 4, 5, 6]);
    assert!(a2.is_empty());

    // Acked messages leave the work queue; the others stay with their member.
    h.ack("jobs", "workers", 0, 1, AckKind::Applied).unwrap();
    h.publish("jobs.a", "m7").unwrap();
    assert_eq!(seqs(&h.fetch_as("jobs", "workers", "bob", 10)), vec![7]);
    assert!(h.fetch_as("jobs", "workers", "alice", 10).is_empty());
    assert!(h.cell.read("jobs", 0, 1).is_err());
}

#[test]
fn an_expired_message_goes_to_whichever_member_fetches_next() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 2);
    assert_eq!(seqs(&h.fetch_as("orders", "c", "alice", 1)), vec![1]);
    h.advance(1_000);
    let bob = h.fetch_as("orders", "c", "bob", 10);
    assert_eq!(seqs(&bob), vec![1, 2]);
    assert_eq!(counts(&bob), vec![2, 1]);
    // Alice lost it to the redelivery: a fetch of hers now finds nothing.
    assert!(h.fetch_as("orders", "c", "alice", 10).is_empty());
}

#[test]
fn a_work_queue_refuses_overlapping_consumers() {
    let mut h = Harness::new();
    h.create_stream(
        "jobs",
        StreamConfig { retention: RetentionPolicy::WorkQueue, ..StreamConfig::with_subjects(["jobs.>"]) },
    );
    h.create_consumer("jobs", "a", ConsumerConfig { filter_subject: Some("jobs.a".into()), ..Default::default() });
    let rejection = h
        .apply(Command::CreateConsumer { stream: "jobs".into(), name: "all".into(), config: ConsumerConfig::default() })
        .unwrap_err();
    assert!(matches!(rejection, Rejection::SubjectOverlap { .. }), "{rejection:?}");
    h.create_consumer("jobs", "b", ConsumerConfig { filter_subject: Some("jobs.b".into()), ..Default::default() });
}

// ----- delayed delivery -----

fn publish_delayed(h: &mut Harness, subject: &str, payload: &str, delay_ms: u64) -> u64 {
    let request = PublishRequest {
        deliver_after_ms: Some(delay_ms),
        ..PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes()))
    };
    h.publish_request(request).unwrap().seq
}

#[test]
fn delayed_delivery_is_not_delivered_before_its_time() {
    let mut h = orders();
    // Published at 1000, so due at 6000.
    publish_delayed(&mut h, "orders.a", "later", 5_000);
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.now = Millis(5_999);
    assert!(h.fetch("orders", "c", 10).is_empty());
    h.now = Millis(6_000);
    let deliveries = h.fetch("orders", "c", 10);
    assert_eq!(texts(&h, &deliveries), vec!["later"]);
    assert_eq!(counts(&deliveries), vec![1]);
    assert_eq!(deliveries[0].ack_deadline, Millis(36_000));
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.n_redelivered, 0);
}

#[test]
fn a_delayed_message_not_yet_looked_at_is_delivered_once_due() {
    let mut h = orders();
    publish_delayed(&mut h, "orders.a", "later", 5_000);
    h.now = Millis(7_000);
    assert_eq!(fetch_texts(&mut h, "orders", "c", 10), vec!["later"]);
}

#[test]
fn a_delayed_message_does_not_hold_back_later_ones() {
    let mut h = orders();
    publish_delayed(&mut h, "orders.a", "later", 5_000);
    h.publish("orders.a", "now").unwrap();
    assert_eq!(fetch_texts(&mut h, "orders", "c", 10), vec!["now"]);
    h.now = Millis(6_000);
    assert_eq!(fetch_texts(&mut h, "orders", "c", 10), vec!["later"]);
}

#[test]
fn ack_of_a_delayed_message_before_its_delivery_is_not_delivered() {
    let mut h = orders();
    let seq = publish_delayed(&mut h, "orders.a", "later", 5_000);
    h.publish("orders.a", "now").unwrap();
    h.fetch("orders", "c", 10);
    assert_eq!(ack0(&mut h, seq, AckKind::Applied).unwrap_err(), Rejection::NotDelivered { partition: 0, seq });
}

#[test]
fn a_delayed_message_counts_as_unacked_for_lag() {
    let mut h = orders();
    publish_delayed(&mut h, "orders.a", "later", 5_000);
    h.publish("orders.a", "now").unwrap();
    h.fetch("orders", "c", 10);
    ack0(&mut h, 2, AckKind::Applied).unwrap();
    let info = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert_eq!(info.partitions[0].ack_floor, 1);
    assert_eq!(info.lag_total, 2);
}

// ----- deletion -----

#[test]
fn deleting_a_consumer_forgets_its_position() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 2);
    h.fetch("orders", "c", 10);
    assert_eq!(h.ok(Command::DeleteConsumer { stream: "orders".into(), name: "c".into() }), Outcome::ConsumerDeleted);
    assert!(matches!(h.cell.consumer_info("orders", "c", h.now), Err(Rejection::ConsumerNotFound { .. })));
    h.create_consumer("orders", "c", ConsumerConfig::default());
    assert_eq!(counts(&h.fetch("orders", "c", 10)), vec![1, 1]);
}

#[test]
fn timers_of_a_deleted_consumer_do_not_touch_its_successor() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    // The first consumer's delivery is due at 2000, the second one's at 2500.
    h.fetch("orders", "c", 1);
    h.ok(Command::DeleteConsumer { stream: "orders".into(), name: "c".into() });
    h.advance(500);
    h.create_consumer("orders", "c", ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    h.fetch("orders", "c", 1);
    h.take_effects();
    h.now = Millis(2_000);
    h.tick();
    assert!(expired(&h.take_effects()).is_empty());
    h.now = Millis(2_500);
    h.tick();
    assert_eq!(expired(&h.take_effects()), vec![(1, 1)]);
}

// ----- config validation -----

#[test]
fn consumer_configs_that_cannot_work_are_refused() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    for config in [
        ConsumerConfig { ack_wait_ms: 0, ..Default::default() },
        ConsumerConfig { max_deliver: Some(0), ..Default::default() },
        ConsumerConfig { max_in_flight: 0, ..Default::default() },
    ] {
        let rejection = h
            .apply(Command::CreateConsumer { stream: "orders".into(), name: "c".into(), config: config.clone() })
            .unwrap_err();
        assert!(matches!(rejection, Rejection::InvalidConfig { .. }), "{config:?} gave {rejection:?}");
    }
    let rejection = h
        .apply(Command::CreateConsumer {
            stream: "orders".into(),
            name: "bad name".into(),
            config: ConsumerConfig::default(),
        })
        .unwrap_err();
    assert!(matches!(rejection, Rejection::InvalidName { .. }), "{rejection:?}");
    assert!(h.cell.stream_info("orders").unwrap().consumers.is_empty());
}

#[test]
fn a_nack_delay_beyond_the_longest_duration_is_invalid() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    let rejection = ack0(&mut h, 1, AckKind::Nack { delay_ms: cellog_core::MAX_DURATION_MS + 1 }).unwrap_err();
    assert!(matches!(rejection, Rejection::Invalid { .. }), "{rejection:?}");
    assert_eq!(ack0(&mut h, 1, AckKind::Applied).unwrap(), done(AckState::Applied));
}

#[test]
fn in_progress_cannot_revive_an_expired_delivery() {
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 1_000, ..Default::default() });
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    h.advance(1_000);
    h.tick();
    for kind in [AckKind::InProgress, AckKind::Received] {
        assert_eq!(ack0(&mut h, 1, kind).unwrap_err(), Rejection::DeliveryExpired { partition: 0, seq: 1 });
    }
    // It stays a redelivery candidate.
    assert_eq!(counts(&h.fetch("orders", "c", 10)), vec![2]);
}

#[test]
fn in_progress_cannot_cut_a_nack_delay_short() {
    let mut h = orders();
    publish_n(&mut h, "orders.a", 1);
    h.fetch("orders", "c", 1);
    ack0(&mut h, 1, AckKind::Nack { delay_ms: 5_000 }).unwrap();
    assert_eq!(ack0(&mut h, 1, AckKind::InProgress).unwrap_err(), Rejection::DeliveryExpired { partition: 0, seq: 1 });
    h.advance(5_000);
    assert_eq!(counts(&h.fetch("orders", "c", 10)), vec![2]);
}

#[test]
fn identical_re_create_on_a_work_queue_is_not_an_overlap() {
    let mut h = Harness::new();
    h.create_stream(
        "jobs",
        StreamConfig { retention: RetentionPolicy::WorkQueue, ..StreamConfig::with_subjects(["jobs.>"]) },
    );
    h.create_consumer("jobs", "workers", ConsumerConfig::default());
    let outcome = h.ok(Command::CreateConsumer {
        stream: "jobs".into(),
        name: "workers".into(),
        config: ConsumerConfig::default(),
    });
    assert_eq!(outcome, Outcome::ConsumerCreated { created: false });
}

#[test]
fn every_outstanding_delivery_records_its_state_member_and_phase() {
    let mut h = Harness::new();
    h.simple_stream("s");
    h.create_consumer("s", "c", ConsumerConfig { ack_wait_ms: 1_000, ..ConsumerConfig::default() });
    for i in 0..3 {
        h.publish("s.a", &format!("{i}")).unwrap();
    }
    h.fetch_as("s", "c", "alice", 2);
    h.fetch_as("s", "c", "bob", 1);
    h.ack("s", "c", 0, 1, AckKind::Received).unwrap();
    h.ack("s", "c", 0, 2, AckKind::Nack { delay_ms: 500 }).unwrap();
    let deliveries = h.cell.deliveries("s", "c", 10).unwrap();
    let summary: Vec<_> = deliveries
        .iter()
        .map(|d| (d.seq, d.delivery_count, d.state, d.member.as_deref().map(str::to_string), d.phase))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                1,
                1,
                AckState::Received,
                Some("alice".to_string()),
                DeliveryPhase::Pending { ack_deadline: Millis(2_000) }
            ),
            (2, 1, AckState::Nack, Some("alice".to_string()), DeliveryPhase::Waiting { until: Millis(1_500) }),
            (3, 1, AckState::Received, Some("bob".to_string()), DeliveryPhase::Pending { ack_deadline: Millis(2_000) }),
        ]
    );
    h.ack("s", "c", 0, 1, AckKind::Applied).unwrap();
    assert_eq!(h.cell.deliveries("s", "c", 10).unwrap().len(), 2);
}

#[test]
fn update_changes_limits_from_now_on_and_keeps_position_and_deliveries() {
    let config = ConsumerConfig { ack_wait_ms: 5_000, max_in_flight: 2, ..ConsumerConfig::default() };
    let mut h = orders_with(config.clone());
    publish_n(&mut h, "orders.a", 5);
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![1, 2], "max_in_flight 2");
    let wider = ConsumerConfig { ack_wait_ms: 60_000, max_in_flight: 10, max_deliver: Some(2), ..config.clone() };
    let update = |config| Command::UpdateConsumer { stream: "orders".into(), name: "c".into(), config };
    assert_eq!(h.ok(update(wider.clone())), Outcome::ConsumerUpdated);
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().config, wider);
    // The cursor and the two outstanding deliveries stay; the wider window lets the rest through.
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![3, 4, 5]);
    // Deliveries made before the update keep their 5 s deadline; those after get 60 s.
    h.advance(5_001);
    h.tick();
    assert_eq!(seqs(&h.fetch("orders", "c", 10)), vec![1, 2], "the early deliveries expired under the old wait");
}

#[test]
fn update_refuses_a_new_filter_or_deliver_policy_and_unknown_consumers() {
    let mut h = orders();
    let update = |name: &str, config| Command::UpdateConsumer { stream: "orders".into(), name: name.into(), config };
    let filtered = ConsumerConfig { filter_subject: Some("orders.a".into()), ..ConsumerConfig::default() };
    assert!(matches!(h.apply(update("c", filtered)), Err(Rejection::InvalidConfig { .. })));
    let new_only = ConsumerConfig { deliver_policy: DeliverPolicy::New, ..ConsumerConfig::default() };
    assert!(matches!(h.apply(update("c", new_only)), Err(Rejection::InvalidConfig { .. })));
    let invalid = ConsumerConfig { ack_wait_ms: 0, ..ConsumerConfig::default() };
    assert!(matches!(h.apply(update("c", invalid)), Err(Rejection::InvalidConfig { .. })));
    assert!(matches!(h.apply(update("nobody", ConsumerConfig::default())), Err(Rejection::ConsumerNotFound { .. })));
    assert_eq!(h.cell.consumer_info("orders", "c", h.now).unwrap().config, ConsumerConfig::default());
}

#[test]
fn a_fetch_and_a_read_answer_a_bounded_number_of_bytes_and_leave_the_rest_undelivered() {
    let mut h = Harness::new();
    let big = StreamConfig { max_payload_bytes: MAX_PAYLOAD_LIMIT, ..StreamConfig::with_subjects(["big.>"]) };
    h.create_stream("big", big);
    h.create_consumer("big", "c", ConsumerConfig::default());
    let mib = 1024 * 1024;
    // Five of 3 MiB, then one of the largest size a stream takes.
    for n in 0..5 {
        let payload = Bytes::from(vec![b'a' + n as u8; 3 * mib]);
        h.publish_request(PublishRequest::new("big.x", payload)).unwrap();
    }
    h.publish_request(PublishRequest::new("big.x", Bytes::from(vec![b'z'; MAX_PAYLOAD_LIMIT as usize]))).unwrap();
    let bytes = |deliveries: &[Delivery]| deliveries.iter().map(|d| d.record.size()).sum::<u64>();
    // Two of 3 MiB fit the budget; the third is left, neither delivered nor counted.
    let first = h.fetch("big", "c", 100);
    assert_eq!((seqs(&first), counts(&first)), (vec![1, 2], vec![1, 1]));
    assert!(bytes(&first) <= MAX_RESPONSE_BYTES);
    let info = h.cell.consumer_info("big", "c", h.now).unwrap();
    assert_eq!((info.n_pending, info.n_delivered), (2, 2));
    assert_eq!(seqs(&h.fetch("big", "c", 100)), vec![3, 4]);
    assert_eq!(seqs(&h.fetch("big", "c", 100)), vec![5]);
    // A record over the budget on its own is answered alone.
    let last = h.fetch("big", "c", 100);
    assert_eq!(seqs(&last), vec![6]);
    assert!(bytes(&last) > MAX_RESPONSE_BYTES);
    // A redelivery is budgeted the same way: nack everything, and they come again two by two.
    for seq in 1..=6 {
        h.ack("big", "c", 0, seq, AckKind::Nack { delay_ms: 0 }).unwrap();
    }
    let again = h.fetch("big", "c", 100);
    assert_eq!((seqs(&again), counts(&again)), (vec![1, 2], vec![2, 2]));
    // A read stops at the budget too, and goes on from where it stopped.
    let read = h.cell.read_from("big", 0, 1, 100).unwrap();
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
    let read = h.cell.read_from("big", 0, 6, 100).unwrap();
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![6]);
}

/// A delivery that is gone takes its ack deadline with it: left behind, the deadline would make the leader propose a
/// tick (a log entry) for nothing when it came due on an idle cell.
#[test]
fn a_delivery_that_is_gone_leaves_no_deadline_behind() {
    type Gone = fn(&mut Harness);
    let cases: [(&str, Gone); 5] = [
        ("acked", |h| assert!(ack0(h, 1, AckKind::Applied).is_ok())),
        ("terminated", |h| assert!(ack0(h, 1, AckKind::Term).is_ok())),
        ("acked after a progress report", |h| {
            assert!(ack0(h, 1, AckKind::InProgress).is_ok());
            assert!(ack0(h, 1, AckKind::Applied).is_ok());
        }),
        ("its consumer deleted", |h| {
            h.ok(Command::DeleteConsumer { stream: "orders".into(), name: "c".into() });
        }),
        ("its stream deleted", |h| {
            h.ok(Command::DeleteStream { name: "orders".into() });
        }),
    ];
    for (what, gone) in cases {
        let mut h = orders_with(ConsumerConfig { ack_wait_ms: 5_000, ..Default::default() });
        h.publish("orders.a", "body").unwrap();
        assert_eq!(h.fetch("orders", "c", 10).len(), 1);
        assert_eq!(h.cell.next_deadline(), Some(Millis(6_000)), "{what}");
        h.advance(100);
        gone(&mut h);
        assert_eq!(h.cell.next_deadline(), None, "{what}");
    }
    // A nack with a delay keeps one deadline: the delay's end.
    let mut h = orders_with(ConsumerConfig { ack_wait_ms: 5_000, ..Default::default() });
    h.publish("orders.a", "body").unwrap();
    h.fetch("orders", "c", 10);
    assert!(ack0(&mut h, 1, AckKind::Nack { delay_ms: 300 }).is_ok());
    assert_eq!(h.cell.next_deadline(), Some(Millis(1_300)));
}
