//! Snapshots and digests: a snapshot restores to an equal cell that carries on identically, the digest compares
//! replicas, damaged snapshots are typed errors, and the same commands give the same effects everywhere.

use crate::common;
use common::*;

use bytes::Bytes;
use cellog_core::{
    AckKind, Actor, Body, Cell, Command, ConsumerConfig, DeliverPolicy, Grants, IdKey, MemoryBodies, Millis, Outcome,
    ProducerRef, PublishRequest, RateLimit, Record, Rejection, RetentionPolicy, SNAPSHOT_VERSION, SnapshotError,
    StreamConfig, TokenHash, Transition, subject::partition_for_key,
};

// ----- a scripted history -----

/// One command and the time it is stamped with.
#[derive(Clone, Debug)]
struct Step {
    at: u64,
    command: Command,
}

/// What one step produced.
type Answer = (Result<Outcome, Rejection>, Vec<Transition>);

fn step(at: u64, command: Command) -> Step {
    Step { at, command }
}

/// A key that lands in `partition` of a stream with `n_partitions`.
fn key_for(partition: u32, n_partitions: u32) -> Bytes {
    (0..10_000)
        .map(|i| Bytes::from(format!("key-{i}")))
        .find(|key| partition_for_key(key, n_partitions) == partition)
        .expect("some small key lands in every partition")
}

fn publish(subject: &str, payload: &str) -> Command {
    Command::Publish(PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes())))
}

fn publish_with(subject: &str, payload: &str, edit: impl FnOnce(&mut PublishRequest)) -> Command {
    let mut request = PublishRequest::new(subject, Bytes::copy_from_slice(payload.as_bytes()));
    edit(&mut request);
    Command::Publish(request)
}

fn fetch(stream: &str, consumer: &str, member: &str, max: u32) -> Command {
    Command::Fetch { stream: stream.into(), consumer: consumer.into(), member: member.into(), max }
}

fn ack(stream: &str, consumer: &str, partition: u32, seq: u64, kind: AckKind) -> Command {
    Command::Ack { stream: stream.into(), consumer: consumer.into(), partition, seq, kind }
}

fn producer(producer_id: u64, epoch: u32) -> ProducerRef {
    ProducerRef { producer_id, epoch }
}

fn stage(subject: &str, payload: &str, r: ProducerRef) -> Command {
    publish_with(subject, payload, |request| request.transaction = Some(r))
}

/// Producers are numbered from 1 in the order their transactional ids are first initialized.
const P_OPEN: u64 = 1;
const P_PREPARED: u64 = 2;
const P_COMMITTED: u64 = 3;

/// A history that leaves the cell with something of everything: several streams (partitions, max age, dedup ids,
/// TTLs, a dead-letter stream, interest retention, a rate limit, per-subject limits, a recalled message), consumers
/// with deliveries pending, expired, nacked with a delay and held back by a delivery delay, producers with an open,
/// a prepared and a committed-then-reopened transaction, a registered peer with progress, and timers of every kind.
fn busy_history() -> Vec<Step> {
    let k: Vec<Bytes> = (0..3).map(|p| key_for(p, 3)).collect();
    let keyed = |subject: &str, payload: &str, partition: usize| {
        let key = k[partition].clone();
        publish_with(subject, payload, move |request| request.key = Some(key))
    };
    vec![
        step(1_000, Command::CreateStream { name: "dlq".into(), config: StreamConfig::with_subjects(["dlq.>"]) }),
        step(
            1_000,
            Command::CreateStream {
                name: "orders".into(),
                config: StreamConfig {
                    partitions: 3,
                    max_age_ms: Some(600_000),
                    duplicate_window_ms: 60_000,
                    dead_letter_stream: Some("dlq".into()),
                    ..StreamConfig::with_subjects(["orders.>"])
                },
            },
        ),
        step(
            1_000,
            Command::CreateStream {
                name: "jobs".into(),
                config: StreamConfig {
                    retention: RetentionPolicy::Interest,
                    ..StreamConfig::with_subjects(["jobs.>"])
                },
            },
        ),
        step(
            1_000,
            Command::CreateStream {
                name: "kv".into(),
                config: StreamConfig {
                    max_messages_per_subject: Some(1),
                    rate_limit: Some(RateLimit { messages_per_second: 10, burst: 100 }),
                    ..StreamConfig::with_subjects(["kv.>"])
                },
            },
        ),
        step(
            1_000,
            Command::CreateConsumer {
                stream: "orders".into(),
                name: "c".into(),
                config: ConsumerConfig { ack_wait_ms: 10_000, max_deliver: Some(3), ..ConsumerConfig::default() },
            },
        ),
        step(
            1_000,
            Command::CreateConsumer {
                stream: "orders".into(),
                name: "slow".into(),
                config: ConsumerConfig { ack_wait_ms: 100_000, ..ConsumerConfig::default() },
            },
        ),
        step(
            1_000,
            Command::CreateConsumer {
                stream: "orders".into(),
                name: "eu".into(),
                config: ConsumerConfig {
                    filter_subject: Some("orders.eu.>".into()),
                    deliver_policy: DeliverPolicy::New,
                    ..ConsumerConfig::default()
                },
            },
        ),
        step(
            1_000,
            Command::CreateConsumer { stream: "jobs".into(), name: "w".into(), config: ConsumerConfig::default() },
        ),
        step(1_000, Command::RegisterPeer { stream: "orders".into(), peer: "mirror".into() }),
        step(1_100, keyed("orders.eu.1", "o1", 0)),
        step(1_100, keyed("orders.us.2", "o2", 1)),
        step(1_200, keyed("orders.eu.3", "o3", 2)),
        step(
            1_200,
            publish_with("orders.eu.4", "o4", |r| {
                r.key = Some(key_for(0, 3));
                r.msg_id = Some("id-4".into());
                r.headers.insert("trace".into(), "t4".into());
            }),
        ),
        step(
            1_300,
            publish_with("orders.us.5", "o5", |r| {
                r.key = Some(key_for(1, 3));
                r.ttl_ms = Some(50_000);
            }),
        ),
        step(
            1_300,
            publish_with("orders.eu.6", "o6", |r| {
                r.key = Some(key_for(2, 3));
                r.deliver_after_ms = Some(20_000);
                r.msg_id = Some("id-6".into());
            }),
        ),
        step(1_400, publish("jobs.a", "j1")),
        step(1_400, publish("jobs.a", "j2")),
        step(1_400, publish("jobs.b", "j3")),
        step(1_500, publish("kv.a", "v1")),
        step(1_500, publish("kv.a", "v2")),
        step(1_500, publish("kv.b", "w1")),
        step(1_600, Command::Recall { stream: "kv".into(), partition: 0, seq: 3 }),
        step(
            1_700,
            Command::PeerProgress { stream: "orders".into(), peer: "mirror".into(), partition: 0, received_seq: 1 },
        ),
        step(
            1_700,
            Command::PeerProgress { stream: "orders".into(), peer: "mirror".into(), partition: 1, received_seq: 2 },
        ),
        // Deliveries: `c` takes everything it may (the delayed message waits), `slow` takes two, `w` one job.
        step(2_000, fetch("orders", "c", "m1", 100)),
        step(2_000, fetch("orders", "slow", "m1", 2)),
        step(2_000, fetch("jobs", "w", "m1", 2)),
        step(2_100, ack("orders", "c", 0, 1, AckKind::Applied)),
        step(2_100, ack("orders", "c", 1, 1, AckKind::Nack { delay_ms: 50_000 })),
        step(2_100, ack("orders", "c", 2, 1, AckKind::InProgress)),
        step(2_100, ack("jobs", "w", 0, 1, AckKind::Applied)),
        step(2_200, publish("orders.eu.7", "o7")),
        step(2_200, fetch("orders", "eu", "m1", 10)),
        // Producers: one open, one prepared, one committed and then reopened.
        step(3_000, Command::InitProducer { transactional_id: "open".into(), transaction_timeout_ms: 60_000 }),
        step(3_000, Command::BeginTransaction(producer(P_OPEN, 0))),
        step(3_000, stage("orders.eu.8", "t1", producer(P_OPEN, 0))),
        step(3_000, stage("kv.c", "t2", producer(P_OPEN, 0))),
        step(3_000, Command::InitProducer { transactional_id: "prepared".into(), transaction_timeout_ms: 30_000 }),
        step(3_000, Command::BeginTransaction(producer(P_PREPARED, 0))),
        step(3_000, stage("jobs.c", "t3", producer(P_PREPARED, 0))),
        step(3_000, Command::PrepareTransaction(producer(P_PREPARED, 0))),
        step(3_000, Command::InitProducer { transactional_id: "committed".into(), transaction_timeout_ms: 90_000 }),
        step(3_000, Command::BeginTransaction(producer(P_COMMITTED, 0))),
        step(3_000, stage("orders.us.9", "t4", producer(P_COMMITTED, 0))),
        step(3_000, Command::CommitTransaction(producer(P_COMMITTED, 0))),
        step(3_100, Command::BeginTransaction(producer(P_COMMITTED, 1))),
        step(3_100, stage("kv.d", "t5", producer(P_COMMITTED, 1))),
        // A refused command is part of the history too.
        step(3_200, publish("nowhere.x", "lost")),
        // `c`'s remaining deliveries pass their deadline and become redelivery candidates.
        step(12_200, Command::Tick),
    ]
}

/// What happens next: redeliveries, acks, the delayed message coming due, transaction ends and timeouts, dead
/// letters, TTL, age and dedup expiry.
fn continuation() -> Vec<Step> {
    vec![
        step(13_000, fetch("orders", "c", "m2", 2)),
        step(13_000, ack("orders", "c", 2, 1, AckKind::Failed)),
        step(14_000, publish("orders.eu.10", "o10")),
        step(14_000, fetch("orders", "eu", "m1", 10)),
        step(15_000, Command::CommitTransaction(producer(P_PREPARED, 0))),
        step(15_000, Command::CommitTransaction(producer(P_PREPARED, 0))),
        step(16_000, fetch("jobs", "w", "m1", 10)),
        step(16_000, ack("jobs", "w", 0, 2, AckKind::Applied)),
        step(21_300, fetch("orders", "c", "m1", 10)),
        step(25_000, Command::Tick),
        step(40_000, fetch("orders", "slow", "m1", 100)),
        step(52_100, fetch("orders", "c", "m1", 10)),
        step(55_000, Command::Tick),
        step(63_000, Command::Tick),
        step(63_000, Command::CommitTransaction(producer(P_OPEN, 0))),
        step(63_100, Command::BeginTransaction(producer(P_OPEN, 1))),
        step(63_100, stage("orders.eu.11", "t6", producer(P_OPEN, 1))),
        step(63_200, Command::CommitTransaction(producer(P_OPEN, 1))),
        step(64_000, publish_with("orders.eu.12", "dup", |r| r.msg_id = Some("id-4".into()))),
        step(
            70_000,
            Command::PeerProgress { stream: "orders".into(), peer: "mirror".into(), partition: 1, received_seq: 3 },
        ),
        step(100_000, Command::Tick),
        step(100_000, publish_with("orders.eu.13", "again", |r| r.msg_id = Some("id-4".into()))),
        step(101_000, Command::UnregisterPeer { stream: "orders".into(), peer: "mirror".into() }),
        step(
            101_000,
            Command::CommitCursor { stream: "orders".into(), consumer: "slow".into(), partition: 0, next_seq: 2 },
        ),
        step(700_000, Command::Tick),
        step(700_000, fetch("orders", "c", "m1", 10)),
        step(700_000, Command::DeleteConsumer { stream: "orders".into(), name: "eu".into() }),
        step(700_100, publish("kv.a", "v3")),
    ]
}

/// Applies `steps` and returns what each produced.
fn run(h: &mut Harness, steps: &[Step]) -> Vec<Answer> {
    steps
        .iter()
        .map(|s| {
            h.now = Millis(s.at);
            let outcome = h.apply(s.command.clone());
            (outcome, h.take_effects())
        })
        .collect()
}

fn busy() -> Harness {
    let mut h = Harness::new();
    run(&mut h, &busy_history());
    h
}

/// A harness around a cell restored from `h`'s snapshot, at the same time.
fn restored(h: &Harness) -> Harness {
    Harness {
        cell: Cell::restore(&h.cell.snapshot()).expect("a fresh snapshot restores"),
        now: h.now,
        effects: vec![],
        bodies: h.bodies.clone(),
        traced: h.traced,
    }
}

fn rechecksum(bytes: &mut [u8]) {
    let crc = crc32c::crc32c(&bytes[16..]);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
}

// ----- the history is what it claims to be -----

#[test]
fn the_busy_history_leaves_something_of_everything() {
    let h = busy();
    assert_eq!(h.cell.stream_names().len(), 4);
    let c = h.cell.consumer_info("orders", "c", h.now).unwrap();
    assert!(c.n_ready > 0, "{c:?}");
    assert!(c.partitions.iter().map(|p| p.n_outstanding).sum::<u64>() > c.n_ready + u64::from(c.n_pending));
    assert!(h.cell.consumer_info("orders", "slow", h.now).unwrap().n_pending > 0);
    assert_eq!(h.cell.producer_info(P_OPEN).unwrap().open_transaction, Some(2));
    assert!(h.cell.producer_info(P_PREPARED).unwrap().prepared);
    let committed = h.cell.producer_info(P_COMMITTED).unwrap();
    assert_eq!((committed.epoch, committed.open_transaction), (1, Some(1)));
    assert_eq!(h.cell.stream_info("orders").unwrap().peers[0].received, vec![1, 2, 0]);
    assert!(h.cell.next_deadline().is_some());
    assert!(matches!(h.cell.read("kv", 0, 3).unwrap().body, cellog_core::Body::Tombstone { .. }));
}

// ----- round trip -----

#[test]
fn restore_of_a_snapshot_equals_the_cell() {
    let h = busy();
    assert_eq!(Cell::restore(&h.cell.snapshot()).unwrap(), h.cell);
}

#[test]
fn restore_of_an_empty_cell_equals_it() {
    let cell = Cell::new();
    assert_eq!(Cell::restore(&cell.snapshot()).unwrap(), cell);
}

#[test]
fn every_prefix_of_the_history_round_trips() {
    let mut h = Harness::new();
    for s in busy_history().into_iter().chain(continuation()) {
        run(&mut h, std::slice::from_ref(&s));
        let back = Cell::restore(&h.cell.snapshot()).unwrap_or_else(|e| panic!("after {s:?}: {e}"));
        assert!(back == h.cell, "restore differs after {s:?}");
    }
}

#[test]
fn a_restored_cell_snapshots_to_the_same_bytes_and_digest() {
    let h = busy();
    let bytes = h.cell.snapshot();
    let back = Cell::restore(&bytes).unwrap();
    assert_eq!(back.snapshot(), bytes);
    assert_eq!(back.digest(), h.cell.digest());
}

/// Every command applied counts, accepted or refused, and a snapshot keeps the count.
#[test]
fn every_command_applied_counts_accepted_or_refused_and_a_snapshot_keeps_the_count() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    let before = h.cell.n_applied();
    h.publish("orders.a", "x").unwrap();
    h.publish("nowhere.a", "x").unwrap_err();
    assert_eq!(h.cell.n_applied(), before + 2);
    assert_eq!(restored(&h).cell.n_applied(), before + 2);
}

#[test]
fn a_restored_cell_answers_queries_like_the_original() {
    let h = busy();
    let back = restored(&h).cell;
    assert_eq!(back.next_deadline(), h.cell.next_deadline());
    assert_eq!(back.last_at(), h.cell.last_at());
    assert_eq!(back.n_applied(), h.cell.n_applied());
    assert_eq!(back.stream_names(), h.cell.stream_names());
    for stream in h.cell.stream_names() {
        assert_eq!(back.stream_info(&stream), h.cell.stream_info(&stream));
        for partition in 0..h.cell.stream_info(&stream).unwrap().partitions.len() as u32 {
            assert_eq!(back.read_from(&stream, partition, 0, 1_000), h.cell.read_from(&stream, partition, 0, 1_000));
        }
        for consumer in h.cell.stream_info(&stream).unwrap().consumers {
            assert_eq!(back.consumer_info(&stream, &consumer, h.now), h.cell.consumer_info(&stream, &consumer, h.now));
        }
    }
    for id in [P_OPEN, P_PREPARED, P_COMMITTED] {
        assert_eq!(back.producer_info(id), h.cell.producer_info(id));
    }
}

#[test]
fn pending_effects_are_not_part_of_the_state() {
    let mut drained = Harness::new();
    run(&mut drained, &busy_history());
    // Each apply's effects are drained before the next, but the last apply's are left queued.
    let mut undrained = Cell::new();
    for s in busy_history() {
        undrained.drain_work().for_each(drop);
        let _ = undrained.apply(Millis(s.at), s.command);
    }
    undrained.drain_work().for_each(drop);
    undrained.apply(Millis(1_000_000), publish("dlq.last", "last")).unwrap_or_else(|rejection| panic!("{rejection}"));
    drained.now = Millis(1_000_000);
    drained.apply(publish("dlq.last", "last")).unwrap();
    assert_eq!(undrained.snapshot(), drained.cell.snapshot());
    assert_eq!(undrained.digest(), drained.cell.digest());
    // The restored cell has nothing pending.
    assert_eq!(Cell::restore(&undrained.snapshot()).unwrap().drain_work().count(), 0);
    assert!(undrained.drain_work().count() > 0);
}

#[test]
#[should_panic(expected = "the host must drain the work and transitions of every apply before the next")]
fn an_apply_over_undrained_work_is_refused() {
    // A host that forgot the body work of one apply would lose its bodies: the next apply stops it.
    let mut cell = Cell::new();
    cell.apply(Millis(1), Command::CreateStream { name: "s".into(), config: StreamConfig::with_subjects(["s.>"]) })
        .unwrap();
    cell.apply(Millis(2), publish("s.a", "x")).unwrap();
    let _ = cell.apply(Millis(3), publish("s.a", "y"));
}

// ----- carrying on after a restore -----

#[test]
fn a_restored_cell_continues_identically() {
    let mut original = busy();
    let mut copy = restored(&original);
    for s in continuation() {
        let a = run(&mut original, std::slice::from_ref(&s));
        let b = run(&mut copy, std::slice::from_ref(&s));
        assert_eq!(a, b, "answers differ at {s:?}");
        assert_eq!(original.cell.digest(), copy.cell.digest(), "digests differ after {s:?}");
        assert_eq!(original.cell.next_deadline(), copy.cell.next_deadline());
    }
    assert_eq!(original.cell, copy.cell);
}

#[test]
fn the_continuation_exercises_timers_and_transaction_ends() {
    let mut h = busy();
    let answers = run(&mut h, &continuation());
    let effects: Vec<&Transition> = answers.iter().flat_map(|(_, effects)| effects).collect();
    assert!(effects.iter().any(|e| matches!(e, Transition::DeliveryExpired { .. })));
    assert!(effects.iter().any(|e| matches!(e, Transition::DeadLettered { copy: Some(_), .. })));
    assert!(effects.iter().any(|e| matches!(e, Transition::TransactionCommitted { .. })));
    assert!(effects.iter().any(|e| matches!(e, Transition::TransactionAborted { .. })));
    assert!(effects.iter().any(|e| matches!(e, Transition::Removed { .. })));
    assert!(answers.iter().any(|(outcome, _)| matches!(outcome, Ok(Outcome::Fetched(d)) if !d.is_empty())));
}

#[test]
fn a_cell_restored_at_any_point_ends_in_the_same_state() {
    let steps: Vec<Step> = busy_history().into_iter().chain(continuation()).collect();
    let mut reference = Harness::new();
    let answers = run(&mut reference, &steps);
    let final_digest = reference.cell.digest();

    let mut h = Harness::new();
    for (index, s) in steps.iter().enumerate() {
        let mut copy = restored(&h);
        let rest = run(&mut copy, &steps[index..]);
        assert_eq!(rest, answers[index..], "answers differ when restored before step {index}");
        assert_eq!(copy.cell.digest(), final_digest, "restored before step {index}");
        run(&mut h, std::slice::from_ref(s));
    }
}

// ----- digests -----

#[test]
fn the_same_commands_at_the_same_times_give_the_same_digest() {
    let a = busy();
    let b = busy();
    assert_eq!(a.cell.digest(), b.cell.digest());
    assert_eq!(a.cell.snapshot(), b.cell.snapshot());
    assert_eq!(a.cell.digest().to_string().len(), 64);
}

/// The busy history, then publishes with ids that are new, repeated within the window and repeated after it.
fn history_with_ids() -> Vec<Step> {
    let mut steps = busy_history();
    steps.extend(continuation());
    for n in 0..300u64 {
        // Ids repeat every 100 publishes; a tenth of a second apart, so the window (60 s) is open for the repeats of
        // the first round and the tick at the end lets it pass for all.
        let id = format!("keyed-{}", n % 100);
        steps.push(step(800_000 + n * 100, publish_with("orders.eu.20", "k", |r| r.msg_id = Some(id))));
    }
    steps.push(step(900_000, Command::Tick));
    steps.push(step(900_000, publish_with("orders.eu.20", "late", |r| r.msg_id = Some("keyed-7".into()))));
    steps
}

#[test]
fn the_key_of_the_id_indexes_changes_no_answer_no_snapshot_and_no_digest() {
    let steps = history_with_ids();
    let mut plain = Harness::new();
    let answers = run(&mut plain, &steps);
    assert!(answers.iter().any(|(outcome, _)| matches!(outcome, Ok(Outcome::Published(ack)) if ack.duplicate)));

    let mut keyed = Harness::new();
    keyed.cell.key_ids(IdKey::new(1, 2));
    let (half, rest) = steps.split_at(steps.len() / 2);
    let mut keyed_answers = run(&mut keyed, half);
    // Restored, and keyed again with another key, halfway through; and restored already keyed with a third.
    let mut rekeyed = restored(&keyed);
    rekeyed.cell.key_ids(IdKey::new(u64::MAX, 7));
    let mut restored_keyed = restored(&keyed);
    restored_keyed.cell = Cell::restore_keyed(&keyed.cell.snapshot(), IdKey::new(3, 4)).expect("it restores");
    let mut keyed = rekeyed;
    keyed_answers.extend(run(&mut keyed, rest));
    let mut restored_keyed_answers = keyed_answers[..half.len()].to_vec();
    restored_keyed_answers.extend(run(&mut restored_keyed, rest));

    assert_eq!(keyed_answers, answers);
    assert_eq!(restored_keyed_answers, answers);
    assert_eq!(restored_keyed.cell, plain.cell);
    assert_eq!(keyed.cell, plain.cell);
    assert_eq!(keyed.cell.snapshot(), plain.cell.snapshot());
    assert_eq!(keyed.cell.digest(), plain.cell.digest());
}

/// The digest after the busy history with step `index` replaced by `replacement`.
fn digest_with(index: usize, replacement: Step) -> cellog_core::StateDigest {
    let mut steps = busy_history();
    steps[index] = replacement;
    let mut h = Harness::new();
    run(&mut h, &steps);
    h.cell.digest()
}

fn index_of(steps: &[Step], wanted: &Command) -> usize {
    steps.iter().position(|s| &s.command == wanted).expect("the step is in the history")
}

#[test]
fn a_different_payload_gives_a_different_digest() {
    let steps = busy_history();
    // The third job is still retained at the end of the history (the first is acked and removed by interest).
    let index = index_of(&steps, &publish("jobs.b", "j3"));
    let base = digest_with(index, steps[index].clone());
    assert_eq!(base, busy().cell.digest());
    assert_ne!(digest_with(index, step(steps[index].at, publish("jobs.b", "J3"))), base);
}

#[test]
fn a_different_time_gives_a_different_digest() {
    let steps = busy_history();
    let index = index_of(&steps, &publish("jobs.a", "j1"));
    let base = busy().cell.digest();
    assert_ne!(digest_with(index, step(steps[index].at + 1, steps[index].command.clone())), base);
}

#[test]
fn a_different_subject_gives_a_different_digest() {
    let steps = busy_history();
    let index = index_of(&steps, &publish("jobs.b", "j3"));
    assert_ne!(digest_with(index, step(steps[index].at, publish("jobs.z", "j3"))), busy().cell.digest());
}

#[test]
fn a_different_ack_gives_a_different_digest() {
    let steps = busy_history();
    let index = index_of(&steps, &ack("orders", "c", 0, 1, AckKind::Applied));
    let base = busy().cell.digest();
    let nack = step(steps[index].at, ack("orders", "c", 0, 1, AckKind::Nack { delay_ms: 0 }));
    assert_ne!(digest_with(index, nack), base);
    let term = step(steps[index].at, ack("orders", "c", 0, 1, AckKind::Term));
    assert_ne!(digest_with(index, term), base);
}

#[test]
fn one_more_command_gives_a_different_digest() {
    let base = busy();
    for extra in [publish("orders.eu.x", "extra"), publish("nowhere.x", "refused"), Command::Tick] {
        let mut h = busy();
        h.now = base.now;
        let _ = h.apply(extra.clone());
        assert_ne!(h.cell.digest(), base.cell.digest(), "{extra:?} left the digest unchanged");
    }
}

#[test]
fn an_empty_cell_has_one_digest() {
    assert_eq!(Cell::new().digest(), Cell::new().digest());
    assert_ne!(Cell::new().digest(), busy().cell.digest());
}

// ----- determinism -----

#[test]
fn the_same_commands_in_two_cells_give_identical_answers_and_effects() {
    let steps: Vec<Step> = busy_history().into_iter().chain(continuation()).collect();
    let mut a = Harness::new();
    let mut b = Harness::new();
    let answers_a = run(&mut a, &steps);
    let answers_b = run(&mut b, &steps);
    for (index, (x, y)) in answers_a.iter().zip(&answers_b).enumerate() {
        assert_eq!(x, y, "step {index}: {:?}", steps[index]);
    }
    assert!(answers_a.iter().map(|(_, effects)| effects.len()).sum::<usize>() > 20);
    assert_eq!(a.cell, b.cell);
}

#[test]
fn a_cell_clamps_time_that_goes_backwards() {
    // A replica applies what the leader stamped; a stamp earlier than the last one is treated as the last one, so
    // the state matches a cell that saw the clamped stamp.
    let mut backwards = Cell::new();
    let mut clamped = Cell::new();
    for (cell, second_at) in [(&mut backwards, 500), (&mut clamped, 2_000)] {
        cell.apply(
            Millis(2_000),
            Command::CreateStream { name: "s".into(), config: StreamConfig::with_subjects(["s.>"]) },
        )
        .unwrap();
        cell.drain_work().for_each(drop);
        cell.apply(Millis(second_at), publish("s.a", "x")).unwrap();
    }
    assert_eq!(backwards.digest(), clamped.digest());
    assert_eq!(backwards.read("s", 0, 1).unwrap().stored_at, Millis(2_000));
}

// ----- damaged snapshots -----

#[test]
fn a_flipped_byte_in_the_body_is_a_checksum_mismatch() {
    let bytes = busy().cell.snapshot();
    let stored = u32::from_le_bytes(bytes[12..16].try_into().unwrap());
    for position in 16..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x5a;
        let computed = crc32c::crc32c(&damaged[16..]);
        assert_eq!(
            Cell::restore(&damaged),
            Err(SnapshotError::ChecksumMismatch { stored, computed }),
            "byte {position}"
        );
    }
}

#[test]
fn a_flipped_byte_in_the_checksum_is_a_checksum_mismatch() {
    let bytes = busy().cell.snapshot();
    for position in 12..16 {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x01;
        assert!(matches!(Cell::restore(&damaged), Err(SnapshotError::ChecksumMismatch { .. })), "byte {position}");
    }
}

#[test]
fn a_wrong_magic_is_not_a_snapshot() {
    let bytes = busy().cell.snapshot();
    for position in 0..8 {
        let mut damaged = bytes.clone();
        damaged[position] ^= 0x20;
        assert_eq!(Cell::restore(&damaged), Err(SnapshotError::NotASnapshot), "byte {position}");
    }
    let mut prefixed = b"junk".to_vec();
    prefixed.extend_from_slice(&bytes);
    assert_eq!(Cell::restore(&prefixed), Err(SnapshotError::NotASnapshot));
    assert_eq!(Cell::restore(b"{\"streams\": {}}"), Err(SnapshotError::NotASnapshot));
}

#[test]
fn an_unknown_version_is_unsupported() {
    let bytes = busy().cell.snapshot();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), SNAPSHOT_VERSION);
    for version in [0, SNAPSHOT_VERSION + 1, 0x0100_0000, u32::MAX] {
        let mut damaged = bytes.clone();
        damaged[8..12].copy_from_slice(&version.to_le_bytes());
        assert_eq!(Cell::restore(&damaged), Err(SnapshotError::UnsupportedVersion { version }));
    }
}

#[test]
fn a_truncated_snapshot_is_a_typed_error() {
    let bytes = busy().cell.snapshot();
    for len in 0..bytes.len() {
        let result = Cell::restore(&bytes[..len]);
        if len < 16 {
            assert_eq!(result, Err(SnapshotError::NotASnapshot), "length {len}");
        } else {
            assert!(matches!(result, Err(SnapshotError::ChecksumMismatch { .. })), "length {len}: {result:?}");
        }
    }
}

#[test]
fn a_truncated_body_with_a_matching_checksum_is_malformed() {
    let bytes = busy().cell.snapshot();
    for len in 16..bytes.len() {
        let mut damaged = bytes[..len].to_vec();
        rechecksum(&mut damaged);
        let result = Cell::restore(&damaged);
        assert!(matches!(result, Err(SnapshotError::Malformed { .. })), "length {len}: {result:?}");
    }
}

#[test]
fn a_header_alone_is_malformed() {
    let mut bytes = Cell::new().snapshot()[..16].to_vec();
    rechecksum(&mut bytes);
    assert!(matches!(Cell::restore(&bytes), Err(SnapshotError::Malformed { .. })));
}

#[test]
fn altered_bodies_with_matching_checksums_never_panic() {
    let bytes = busy().cell.snapshot();
    for position in 16..bytes.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut damaged = bytes.clone();
            damaged[position] ^= mask;
            rechecksum(&mut damaged);
            // Decoding may succeed (a different but well-formed state) or fail; it must not panic.
            let _ = Cell::restore(&damaged);
        }
    }
}

#[test]
fn random_bodies_with_matching_checksums_are_refused_without_a_panic() {
    // A fixed xorshift sequence, so that the test is the same on every run.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..500 {
        let len = (next() % 512) as usize;
        let mut bytes = Cell::new().snapshot()[..16].to_vec();
        bytes.extend((0..len).map(|_| next() as u8));
        rechecksum(&mut bytes);
        let result = Cell::restore(&bytes);
        assert!(matches!(result, Err(SnapshotError::Malformed { .. })), "round {round}: {result:?}");
    }
}

#[test]
fn trailing_bytes_after_the_body_are_refused() {
    let bytes = busy().cell.snapshot();
    let mut longer = bytes.clone();
    longer.extend_from_slice(b"trailing");
    assert!(matches!(Cell::restore(&longer), Err(SnapshotError::ChecksumMismatch { .. })));
    rechecksum(&mut longer);
    assert!(matches!(Cell::restore(&longer), Err(SnapshotError::Malformed { .. })));
}

#[test]
fn snapshot_errors_describe_themselves() {
    let errors = [
        SnapshotError::NotASnapshot,
        SnapshotError::UnsupportedVersion { version: 7 },
        SnapshotError::ChecksumMismatch { stored: 1, computed: 2 },
        SnapshotError::Malformed { reason: "short".into() },
    ];
    for error in errors {
        assert!(!error.to_string().is_empty());
    }
}

#[test]
fn a_restored_cell_routes_each_subject_to_its_stream() {
    let mut h = Harness::new();
    h.create_stream("orders", config(&["orders.>"]));
    h.create_stream("eu", config(&["region.eu.*"]));
    let mut r = restored(&h);
    assert_eq!(&*r.publish("orders.a.b", "m").unwrap().stream, "orders");
    assert_eq!(&*r.publish("region.eu.1", "m").unwrap().stream, "eu");
    assert!(matches!(r.publish("region.us.1", "m"), Err(Rejection::NoStreamForSubject { .. })));
}

// ----- frozen formats -----

/// What this build writes is what the frozen types of [`SNAPSHOT_VERSION`] read and write: a difference means an
/// in-memory change altered the encoding, which needs a new version and a migration.
fn assert_written_as_frozen(bytes: &[u8], context: &dyn std::fmt::Debug) {
    let again = Cell::reencode_snapshot(bytes).unwrap_or_else(|e| panic!("after {context:?}: {e}"));
    assert!(
        again == bytes,
        "the encoding no longer matches the frozen version {SNAPSHOT_VERSION} types after {context:?}: add a version"
    );
}

#[test]
fn every_snapshot_of_the_history_is_the_frozen_encoding() {
    let mut h = Harness::new();
    assert_written_as_frozen(&h.cell.snapshot(), &"nothing");
    for s in busy_history().into_iter().chain(continuation()) {
        run(&mut h, std::slice::from_ref(&s));
        assert_written_as_frozen(&h.cell.snapshot(), &s);
        let bodies: Vec<(u64, Bytes)> = h.bodies.iter().map(|(key, body)| (key, body.clone())).collect();
        assert_written_as_frozen(&h.cell.snapshot_whole(bodies).expect("every body is there"), &s);
    }
}

#[test]
fn an_unknown_version_is_not_reencoded() {
    let mut bytes = busy().cell.snapshot();
    bytes[8..12].copy_from_slice(&(SNAPSHOT_VERSION + 1).to_le_bytes());
    assert_eq!(
        Cell::reencode_snapshot(&bytes),
        Err(SnapshotError::UnsupportedVersion { version: SNAPSHOT_VERSION + 1 })
    );
}

/// The bytes of a committed fixture, written first when `CELLOG_WRITE_FIXTURES` is set and it is missing.
fn fixture(path: &str, whole: &[u8]) -> Vec<u8> {
    let path = std::path::Path::new(path);
    if std::env::var_os("CELLOG_WRITE_FIXTURES").is_some() && !path.exists() {
        std::fs::write(path, whole).expect("the fixture is written");
    }
    std::fs::read(path).expect("the fixture is committed (CELLOG_WRITE_FIXTURES=1 writes a missing one)")
}

fn whole_snapshot(h: &Harness) -> (Vec<u8>, Vec<(u64, Bytes)>) {
    let bodies: Vec<(u64, Bytes)> = h.bodies.iter().map(|(key, body)| (key, body.clone())).collect();
    (h.cell.snapshot_whole(bodies.clone()).expect("the history's bodies are all there"), bodies)
}

/// A harness around a cell restored from whole snapshot bytes, holding the bodies it came with, at `now`.
fn restored_whole(bytes: &[u8], now: Millis) -> Harness {
    let (cell, section) = Cell::restore_whole(bytes).expect("the snapshot restores");
    let mut bodies = MemoryBodies::default();
    for (key, body) in section {
        bodies.insert(key, body);
    }
    Harness { cell, now, effects: vec![], bodies, traced: true }
}

/// What a client can read of a cell: every stream's view and each retained record with its body's bytes, every
/// consumer's view, the principals and the producers. Two states that keep the same messages, but their bodies under
/// other keys, read the same.
fn readable(h: &Harness) -> Vec<String> {
    let mut seen = Vec::new();
    for name in h.cell.stream_names() {
        let info = h.cell.stream_info(&name).expect("a listed stream");
        seen.push(format!("{info:?}"));
        for partition in &info.partitions {
            for seq in 1..=partition.high_watermark {
                let Ok(record) = h.cell.read(&name, partition.partition, seq) else { continue };
                let body = match &record.body {
                    Body::Stored(body) => format!("{:?}", h.bodies.read(body).expect("every body is stored")),
                    tombstone => format!("{tombstone:?}"),
                };
                let Record { partition, seq, subject, key, msg_id, headers, stored_at, .. } = record;
                seen.push(format!(
                    "{name} {partition}/{seq} {subject} {key:?} {msg_id:?} {headers:?} {stored_at:?} {body}"
                ));
            }
        }
        for consumer in &info.consumers {
            seen.push(format!("{:?}", h.cell.consumer_info(&name, consumer, h.now).expect("a listed consumer")));
        }
    }
    seen.push(format!("{:?}", h.cell.principals()));
    seen.extend((0..64).filter_map(|id| h.cell.producer_info(id)).map(|producer| format!("{producer:?}")));
    seen
}

/// Commits every open transaction, in producer order.
fn commit_open_transactions(h: &mut Harness) {
    for id in 0..64 {
        let Some(producer) = h.cell.producer_info(id) else { continue };
        if producer.open_transaction.is_some() {
            h.ok(Command::CommitTransaction(ProducerRef { producer_id: id, epoch: producer.epoch }));
        }
    }
}

/// A state restored from a snapshot an earlier version wrote is the state that wrote it, as far as a client can read
/// it: the same messages with the same bodies, consumers, principals and producers (which keys its bodies are stored
/// under, and when a producer was last active before version 5 kept it, may differ). Its open transactions commit the
/// messages they staged, with their payloads, as a cell of this version commits them.
fn assert_migrated(mut restored: Harness, mut wrote: Harness) {
    assert_eq!(readable(&restored), readable(&wrote));
    assert!(!(0..64).all(|id| wrote.cell.producer_info(id).is_none()), "the history has producers to migrate");
    let consumers = |h: &Harness| -> Vec<(String, cellog_core::StateDigest)> {
        h.cell.digest_parts().into_iter().filter(|(part, _)| part.contains(" consumer ")).collect()
    };
    assert_eq!(consumers(&restored), consumers(&wrote));
    commit_open_transactions(&mut restored);
    commit_open_transactions(&mut wrote);
    assert_eq!(readable(&restored), readable(&wrote));
}

/// The whole snapshot (bodies included) of the busy history, as version 3 writes it. Committed: every later version
/// must keep restoring it, through a migration if the encoding changes.
const VERSION_3_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v3-busy.bin");

#[test]
fn the_committed_version_3_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy();
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_3_FIXTURE, &whole);
    assert_migrated(restored_whole(&committed, h.now), h);
    // Read into the frozen version 3 types and written from them, it is the same bytes, in every later version too.
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    // While version 3 is the one written, it is written byte for byte as committed: an encoding change needs a new
    // version, a migration from this one, and this fixture still restoring.
    if SNAPSHOT_VERSION == 3 {
        assert!(whole == committed, "the version 3 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// The busy history, then principals: one with grants of every kind and two tokens, one whose token was revoked, one
/// deleted, and a transactional producer a principal registered.
fn busy_with_principals() -> Harness {
    let mut h = busy();
    let token = |n: u8| TokenHash([n; 32]);
    let root = |command: Command| Command::As { actor: Actor::Token(token(9)), command: Box::new(command) };
    let grants = Grants {
        publish: vec!["orders.>".into()],
        subscribe: vec!["orders.*.created".into(), "jobs.>".into()],
        consume: vec!["orders/c".into(), "jobs/*".into()],
        admin: true,
        cluster_admin: false,
    };
    h.ok(Command::AddToken { principal: cellog_core::ROOT.into(), token: token(9) });
    for command in [
        Command::PutPrincipal { name: "alice".into(), grants },
        Command::AddToken { principal: "alice".into(), token: token(1) },
        Command::AddToken { principal: "alice".into(), token: token(2) },
        Command::PutPrincipal { name: "bob".into(), grants: Grants::default() },
        Command::AddToken { principal: "bob".into(), token: token(3) },
        Command::RevokeToken { token: token(3) },
        Command::PutPrincipal { name: "carol".into(), grants: Grants::default() },
        Command::DeletePrincipal { name: "carol".into() },
    ] {
        h.ok(root(command));
    }
    h.ok(Command::ReserveSubjects { filter: "jobs.>".into() });
    let init = Command::InitProducer { transactional_id: "alice-tx".into(), transaction_timeout_ms: 60_000 };
    h.ok(Command::As { actor: Actor::Token(token(1)), command: Box::new(init) });
    h
}

/// The whole snapshot of [`busy_with_principals`] as version 4 writes it. Committed: every later version must keep
/// restoring it.
const VERSION_4_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v4-busy.bin");

#[test]
fn the_committed_version_4_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_principals();
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_4_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    assert_eq!(restored.cell.authenticate(&Actor::Token(TokenHash([2; 32]))).as_deref(), Ok("alice"));
    assert!(restored.cell.authenticate(&Actor::Token(TokenHash([3; 32]))).is_err(), "a revoked token stays revoked");
    assert_migrated(restored, h);
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 4 {
        assert!(whole == committed, "the version 4 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// [`busy_with_principals`], then a producer active later than the others.
fn busy_with_a_later_producer() -> (Harness, ProducerRef) {
    let mut h = busy_with_principals();
    h.advance(5_000);
    let later = h.init_producer("later-tx");
    h.advance(1_000);
    h.tick();
    (h, later)
}

/// Each producer's idle time came along: the earlier ones expire first.
fn assert_idle_times_kept(mut h: Harness, later: ProducerRef) {
    h.advance(cellog_core::PRODUCER_IDLE_MS - 5_500);
    h.tick();
    let expired: Vec<u64> = h
        .take_effects()
        .into_iter()
        .filter_map(|effect| match effect {
            Transition::ProducerExpired { producer_id, .. } => Some(producer_id),
            _ => None,
        })
        .collect();
    assert!(!expired.is_empty() && !expired.contains(&later.producer_id), "{expired:?}");
    assert!(h.cell.producer_info(later.producer_id).is_some());
}

/// The whole snapshot of [`busy_with_a_later_producer`] as version 5 writes it (each producer with when it was last
/// active; staged payloads in the state). Committed: every later version must keep restoring it.
const VERSION_5_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v5-busy.bin");

#[test]
fn the_committed_version_5_snapshot_restores_to_the_state_that_wrote_it() {
    let (h, later) = busy_with_a_later_producer();
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_5_FIXTURE, &whole);
    assert_idle_times_kept(restored_whole(&committed, h.now), later);
    assert_migrated(restored_whole(&committed, h.now), h);
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 5 {
        assert!(whole == committed, "the version 5 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// Taking out the timers that would fire as no-ops leaves the live ones: a cell with deliveries in flight and
/// nothing stale is left as it is.
#[test]
fn taking_out_stale_timers_leaves_live_ones() {
    let mut h = Harness::new();
    h.simple_stream("orders");
    h.create_consumer("orders", "billing", ConsumerConfig::default());
    h.publish("orders.a", "one").unwrap();
    h.publish("orders.a", "two").unwrap();
    assert_eq!(h.fetch("orders", "billing", 10).len(), 2);
    assert_eq!(h.cell.without_stale_timers(), h.cell);
}

/// The whole snapshot of [`busy_with_a_later_producer`] as version 6 writes it: staged messages' payloads among the
/// bodies. Committed: every later version must keep restoring it.
const VERSION_6_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v6-busy.bin");

#[test]
fn the_committed_version_6_snapshot_restores_to_the_state_that_wrote_it() {
    let (h, later) = busy_with_a_later_producer();
    let (whole, bodies) = whole_snapshot(&h);
    let committed = fixture(VERSION_6_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    // Timers that would fire as no-ops are taken out earlier now than when the fixture was written.
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert_eq!(restored.bodies.iter().map(|(key, body)| (key, body.clone())).collect::<Vec<_>>(), bodies);
    // The open transactions' staged payloads are among the bodies, not in the state.
    let retained: u64 = h.cell.stream_names().iter().map(|name| h.cell.stream_info(name).unwrap().n_messages).sum();
    assert!(bodies.len() as u64 > retained, "{} bodies, {retained} retained messages", bodies.len());
    assert_idle_times_kept(restored, later);
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 6 {
        assert!(whole == committed, "the version 6 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// The stream with the most partitions (the first of them).
fn widest_stream(h: &Harness) -> String {
    let names = h.cell.stream_names();
    let partitions = |name: &str| h.cell.stream_info(name).unwrap().partitions.len();
    names.iter().max_by_key(|name| (partitions(name), std::cmp::Reverse(name.to_string()))).unwrap().to_string()
}

/// [`busy_with_a_later_producer`] with consumer groups on its first stream: a cooperative one mid-rebalance (a
/// partition being revoked, one pending, deliveries outstanding) and an eager one settled.
fn busy_with_groups() -> Harness {
    let (mut h, _) = busy_with_a_later_producer();
    let stream = widest_stream(&h);
    let join = |member: &str, group: &str, strategy: cellog_core::Strategy| Command::JoinGroup {
        stream: stream.clone(),
        group: group.into(),
        member: member.into(),
        strategy,
        session_timeout_ms: 60_000,
        config: ConsumerConfig { deliver_policy: DeliverPolicy::All, ..ConsumerConfig::default() },
    };
    h.ok(join("a", "coop", cellog_core::Strategy::CooperativeSticky));
    h.ok(join("x", "eager", cellog_core::Strategy::Range));
    let Outcome::GroupAssignment(a) = h.ok(join("a", "coop", cellog_core::Strategy::CooperativeSticky)) else {
        panic!("an assignment")
    };
    h.ok(Command::MemberFetch {
        stream: stream.clone(),
        group: "coop".into(),
        member: "a".into(),
        generation: a.generation,
        max: 5,
    });
    h.ok(join("b", "coop", cellog_core::Strategy::CooperativeSticky));
    h.tick();
    h
}

/// The whole snapshot of [`busy_with_groups`] as version 7 writes it: consumer groups in the state. Committed: every
/// later version must keep restoring it.
const VERSION_7_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v7-busy.bin");

#[test]
fn the_committed_version_7_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_groups();
    let stream = widest_stream(&h);
    let info = h.cell.group_info(&stream, "coop", h.now).expect("the group");
    assert!(info.rebalancing && info.members.len() == 2, "{info:?}");
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_7_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    // Timers that would fire as no-ops are taken out earlier now than when the fixture was written.
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert_eq!(restored.cell.group_info(&stream, "coop", h.now), Ok(info));
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 7 {
        // The fixture's state, restored and written again, is the same bytes (the history itself now leaves fewer
        // timers behind, so its own snapshot differs in content, not in encoding).
        let (again, _) = whole_snapshot(&restored_whole(&committed, h.now));
        assert!(again == committed, "the version 7 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// [`busy_with_groups`] as a directory that also moved streams: cells and placements recorded (one move under way),
/// its widest stream fenced (moved to another cell) and a stream it receives.
fn busy_with_moves() -> Harness {
    let mut h = busy_with_groups();
    let stream = widest_stream(&h);
    for cell in ["east", "west"] {
        h.ok(Command::PutCell {
            cell: cell.into(),
            addresses: vec![format!("{cell}-1:7400"), format!("{cell}-2:7400")],
        });
    }
    h.ok(Command::PlaceStream { stream: stream.clone(), cell: "east".into() });
    h.ok(Command::PlaceStream { stream: "elsewhere".into(), cell: "west".into() });
    h.ok(Command::MoveStream { stream: stream.clone(), to: "west".into(), epoch: 1 });
    h.ok(Command::FenceStream { stream, epoch: 2, to: "west".into() });
    h.ok(Command::ReceiveStream { stream: "incoming".into(), epoch: 4, from: "west".into(), config: None });
    h
}

/// The whole snapshot of [`busy_with_moves`] as version 8 writes it: the directory and ownership in the state.
/// Committed: every later version must keep restoring it.
const VERSION_8_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v8-busy.bin");

#[test]
fn the_committed_version_8_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_moves();
    let stream = widest_stream(&h);
    assert!(matches!(h.cell.ownership(&stream), cellog_core::placement::Ownership::Moved { epoch: 2, .. }));
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_8_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert_eq!(restored.cell.directory(), h.cell.directory());
    assert_eq!(restored.cell.ownership("incoming"), h.cell.ownership("incoming"));
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 8 {
        let (again, _) = whole_snapshot(&restored_whole(&committed, h.now));
        assert!(again == committed, "the version 8 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// [`busy_with_moves`] with mirrors on both sides: its widest stream mirrored elsewhere (registered mirrors, a recall
/// one of them has not applied) and a mirror of another cell's stream holding copied messages.
fn busy_with_mirrors() -> Harness {
    let mut h = busy_with_moves();
    let stream = "mirrored";
    h.create_stream(stream, StreamConfig::with_subjects(["mirrored.>"]));
    for peer in ["mirror-a", "mirror-b"] {
        h.ok(Command::RegisterMirror { stream: stream.into(), peer: peer.into() });
    }
    for n in 0..3 {
        h.publish(&format!("mirrored.{n}"), "kept").unwrap();
    }
    h.ok(Command::Recall { stream: stream.into(), partition: 0, seq: 2 });
    h.ok(Command::MirrorProgress {
        stream: stream.into(),
        peer: "mirror-a".into(),
        received: vec![3],
        recalls_applied: 1,
    });
    let source = cellog_core::mirror::MirrorSource {
        cell: "east".into(),
        stream: "payments".into(),
        addresses: vec!["east-1:7400".into()],
    };
    let config = StreamConfig::with_subjects(["copied.>"]);
    h.ok(Command::CreateMirror { name: "copied".into(), config, source });
    let messages = (1..=2)
        .map(|seq| cellog_core::IngestMessage {
            partition: 0,
            seq: seq * 2,
            request: cellog_core::PublishRequest {
                msg_id: Some(format!("p-{seq}")),
                ..cellog_core::PublishRequest::new("copied.x", bytes::Bytes::from_static(b"copied"))
            },
        })
        .collect();
    let recalls = vec![cellog_core::mirror::LoggedRecall { number: 0, partition: 0, seq: 2 }];
    h.ok(Command::MirrorIngest { stream: "copied".into(), messages, through: vec![5], recalls, recalls_through: 1 });
    h
}

/// The whole snapshot of [`busy_with_mirrors`] as version 9 writes it. Committed: every later version must keep
/// restoring it.
const VERSION_9_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v9-busy.bin");

#[test]
fn the_committed_version_9_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_mirrors();
    assert_eq!(h.cell.recall_log("mirrored").map(|log| log.pending.len()), Some(1));
    assert_eq!(h.cell.mirror("copied").map(|mirror| mirror.recalls_applied), Some(1));
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_9_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert_eq!(restored.cell.recall_log("mirrored"), h.cell.recall_log("mirrored"));
    assert_eq!(restored.cell.mirror("copied"), h.cell.mirror("copied"));
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 9 {
        let (again, _) = whole_snapshot(&restored_whole(&committed, h.now));
        assert!(again == committed, "the version 9 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// [`busy_with_mirrors`] with quotas (the cell's and a tenant's) and a revoked certificate.
fn busy_with_bounds() -> Harness {
    let mut h = busy_with_mirrors();
    let quotas = cellog_core::quota::Quotas {
        max_streams: Some(100),
        max_messages: None,
        max_bytes: Some(1 << 30),
        ..Default::default()
    };
    h.ok(Command::SetQuotas { tenant: None, quotas });
    let tenant = cellog_core::quota::Quotas { max_messages: Some(1_000), ..Default::default() };
    h.ok(Command::SetQuotas { tenant: Some("acme".into()), quotas: tenant });
    let until_ms = h.now.0 + 86_400_000;
    let subject = "cellog://prod/principal/alice".to_string();
    h.ok(Command::RevokeCertificate { serial: vec![0x4c, 0x01, 0x99], subject, until_ms });
    h
}

/// The whole snapshot of [`busy_with_bounds`] as version 10 writes it. Committed: every later version must keep
/// restoring it.
const VERSION_10_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v10-busy.bin");

#[test]
fn the_committed_version_10_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_bounds();
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_10_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert_eq!(restored.cell.quotas(), h.cell.quotas());
    assert!(restored.cell.is_revoked(&[0x4c, 0x01, 0x99]));
    assert_eq!(restored.cell.held(None), h.cell.held(None));
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 10 {
        let (again, _) = whole_snapshot(&restored_whole(&committed, h.now));
        assert!(again == committed, "the version 10 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// [`busy_with_bounds`] with a principal holding a mirror grant.
fn busy_with_mirror_grants() -> Harness {
    let mut h = busy_with_bounds();
    h.ok(Command::PutPrincipal { name: "east".into(), grants: Grants::default() });
    h.ok(Command::GrantMirror { principal: "east".into(), streams: vec!["orders".into(), "audit".into()] });
    h
}

/// The whole snapshot of [`busy_with_mirror_grants`] as version 11 writes it. Committed: every later version must
/// keep restoring it.
const VERSION_11_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v11-busy.bin");

#[test]
fn the_committed_version_11_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_mirror_grants();
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_11_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert!(restored.cell.authorize_mirror("east", "audit").is_ok());
    assert!(restored.cell.authorize_mirror("east", "clicks").is_err());
    assert!(restored.cell.is_revoked(&[0x4c, 0x01, 0x99]));
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 11 {
        let (again, _) = whole_snapshot(&restored_whole(&committed, h.now));
        assert!(again == committed, "the version 11 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// [`busy_with_mirror_grants`] with caps on deliveries awaiting an ack: the cell's and a tenant's.
fn busy_with_delivery_caps() -> Harness {
    let mut h = busy_with_mirror_grants();
    let cell = cellog_core::quota::Quotas {
        max_streams: Some(100),
        max_bytes: Some(1 << 30),
        max_in_flight: Some(50_000),
        ..Default::default()
    };
    h.ok(Command::SetQuotas { tenant: None, quotas: cell });
    let tenant = cellog_core::quota::Quotas {
        max_messages: Some(1_000),
        max_in_flight: Some(500),
        max_in_flight_per_subject: Some(3),
        ..Default::default()
    };
    h.ok(Command::SetQuotas { tenant: Some("acme".into()), quotas: tenant });
    h
}

/// The whole snapshot of [`busy_with_delivery_caps`] as version 12 writes it. Committed: every later version must
/// keep restoring it.
const VERSION_12_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/snapshot-v12-busy.bin");

#[test]
fn the_committed_version_12_snapshot_restores_to_the_state_that_wrote_it() {
    let h = busy_with_delivery_caps();
    let (whole, _) = whole_snapshot(&h);
    let committed = fixture(VERSION_12_FIXTURE, &whole);
    let restored = restored_whole(&committed, h.now);
    assert_eq!(restored.cell.without_stale_timers(), h.cell.without_stale_timers());
    assert_eq!(restored.cell.quotas(), h.cell.quotas());
    assert_eq!(restored.cell.quotas().of("acme").max_in_flight_per_subject, Some(3));
    assert_eq!(restored.cell.held(None), h.cell.held(None));
    assert!(Cell::reencode_snapshot(&committed).expect("the fixture decodes") == committed);
    if SNAPSHOT_VERSION == 12 {
        let (again, _) = whole_snapshot(&restored_whole(&committed, h.now));
        assert!(again == committed, "the version 12 encoding changed; bump SNAPSHOT_VERSION and migrate");
    }
}

/// A version 11 state knew no caps on deliveries: its holders' quotas keep their other limits and cap none.
#[test]
fn a_version_11_snapshot_caps_no_deliveries() {
    let committed = std::fs::read(VERSION_11_FIXTURE).expect("the fixture is committed");
    let cell = Cell::restore(&committed).expect("a version 11 snapshot restores");
    assert_eq!(cell.quotas().cell.max_streams, Some(100));
    assert_eq!(cell.quotas().of("acme").max_messages, Some(1_000));
    for quotas in std::iter::once(&cell.quotas().cell).chain(cell.quotas().tenants.values()) {
        assert_eq!((quotas.max_in_flight, quotas.max_in_flight_per_subject), (None, None));
    }
}

/// A version 10 state knew no mirror grants: its principals mirror nothing but as cluster admins.
#[test]
fn a_version_10_snapshot_grants_no_mirror() {
    let committed = std::fs::read(VERSION_10_FIXTURE).expect("the fixture is committed");
    let cell = Cell::restore(&committed).expect("a version 10 snapshot restores");
    for (principal, _, _) in cell.principals() {
        assert!(cell.mirror_grants(&principal).is_some_and(|streams| streams.is_empty()), "{principal}");
    }
    assert!(cell.authorize_mirror("root", "orders").is_ok(), "root is a cluster admin");
}

/// A version 9 state knew no quotas and no revoked certificates.
#[test]
fn a_version_9_snapshot_has_no_quotas_and_revokes_nothing() {
    let committed = std::fs::read(VERSION_9_FIXTURE).expect("the fixture is committed");
    let cell = Cell::restore(&committed).expect("a version 9 snapshot restores");
    assert_eq!(cell.quotas(), &cellog_core::quota::QuotaBook::default());
    assert!(cell.revoked_certificates().is_empty());
    assert!(cell.ledger_agrees());
}

/// A version 8 state knew no mirrors.
#[test]
fn a_version_8_snapshot_has_no_mirrors() {
    let committed = std::fs::read(VERSION_8_FIXTURE).expect("the fixture is committed");
    let cell = Cell::restore(&committed).expect("a version 8 snapshot restores");
    assert_eq!(cell.mirrors().count(), 0);
    assert!(cell.stream_names().iter().all(|name| cell.recall_log(name).is_none()));
}

/// A version 7 state knew no directory and no moves: it owns every stream at epoch 0.
#[test]
fn a_version_7_snapshot_owns_every_stream_and_places_none() {
    let committed = std::fs::read(VERSION_7_FIXTURE).expect("the fixture is committed");
    let cell = Cell::restore(&committed).expect("a version 7 snapshot restores");
    assert!(cell.directory().is_empty());
    for name in cell.stream_names() {
        assert_eq!(cell.ownership(&name), &cellog_core::placement::Ownership::Owned { epoch: 0 });
    }
}

/// A version 4 state kept no time of activity: its producers count as active at the state's time, so an upgrade
/// gives each its whole idle time and expires none at once.
#[test]
fn a_version_4_snapshot_s_producers_are_active_as_of_its_time() {
    let committed = std::fs::read(VERSION_4_FIXTURE).expect("the fixture is committed");
    let mut cell = Cell::restore(&committed).expect("a version 4 snapshot restores");
    let h = busy_with_principals();
    let producers: Vec<u64> = (1..100).filter(|&id| cell.producer_info(id).is_some()).collect();
    assert!(!producers.is_empty());
    cell.apply(h.now.plus(cellog_core::PRODUCER_IDLE_MS - 1), Command::Tick).expect("a tick");
    assert!(producers.iter().all(|&id| cell.producer_info(id).is_some()), "none expired before its whole idle time");
    cell.drain_work().for_each(drop);
    cell.apply(h.now.plus(cellog_core::PRODUCER_IDLE_MS), Command::Tick).expect("a tick");
    assert!(producers.iter().all(|&id| cell.producer_info(id).is_none()), "all expired after it");
}

#[test]
fn a_version_3_snapshot_migrates_to_the_root_principal_alone() {
    let committed = std::fs::read(VERSION_3_FIXTURE).expect("the fixture is committed");
    let cell = Cell::restore(&committed).expect("a version 3 snapshot restores");
    let principals = cell.principals();
    assert_eq!(principals.len(), 1);
    assert_eq!((&*principals[0].0, &principals[0].1, principals[0].2), (cellog_core::ROOT, &Grants::all(), 0));
}

/// The parts whose digests differ between two harnesses' cells.
fn differing_parts(a: &Harness, b: &Harness) -> Vec<String> {
    let theirs: std::collections::BTreeMap<String, _> = b.cell.digest_parts().into_iter().collect();
    let mut differ: Vec<String> = a
        .cell
        .digest_parts()
        .into_iter()
        .filter(|(part, digest)| theirs.get(part) != Some(digest))
        .map(|(part, _)| part)
        .collect();
    differ.extend(theirs.keys().filter(|part| !a.cell.digest_parts().iter().any(|(p, _)| p == *part)).cloned());
    differ
}

#[test]
fn the_digest_parts_name_where_two_states_differ() {
    let mut replicas = [Harness::new(), Harness::new()];
    for h in &mut replicas {
        h.create_stream("orders", StreamConfig { partitions: 2, ..config(&["orders.>"]) });
        h.create_stream("audit", config(&["audit.>"]));
        h.create_consumer("orders", "billing", ConsumerConfig::default());
        h.publish("orders.a", "one").unwrap();
        h.publish("audit.a", "two").unwrap();
    }
    assert_eq!(differing_parts(&replicas[0], &replicas[1]), Vec::<String>::new());
    assert_eq!(replicas[0].cell.digest(), replicas[1].cell.digest());

    // One replica's consumer was handed a message the other's was not: the consumer differs, and so its stream as a
    // whole, and the cell's counters; no partition and no other stream does.
    replicas[0].fetch("orders", "billing", 1);
    replicas[1].apply(Command::Tick).unwrap();
    let differ = differing_parts(&replicas[0], &replicas[1]);
    assert!(differ.contains(&"stream orders consumer billing".to_string()), "{differ:?}");
    assert!(!differ.iter().any(|part| part.contains("partition") || part.contains("audit")), "{differ:?}");
}
