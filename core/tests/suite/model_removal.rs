//! Model-based test of the code that removes and keeps messages: interest and work-queue retention, consumers created
//! and deleted (one starting at the end of its stream), dead letters copied to a dead-letter stream with a message
//! limit, pins (a message of one stream keeping a message of another, released when its pinning message goes), and
//! recall. A small reference model and the real `Cell` run the same random commands with time moving forward and must
//! agree on every answer and on every stream's contents and every consumer's positions after every step.
//!
//! The model is declarative where the cell is incremental: after every command it removes every message that
//! retention allows (every consumer that wants it is done, nothing pins it; a dead-letter stream over its limit loses
//! its oldest until a pinned one), where the cell re-checks only what the command touched. A removal the cell forgets
//! to trigger, or one it makes too early, shows up as a difference.

use std::collections::BTreeMap;

use bytes::Bytes;
use cellog_core::{
    AckKind, AckState, Cell, Command, ConsumerConfig, DeliverPolicy, MemoryBodies, Millis, Outcome, PIN_HEADER,
    PublishRequest, Rejection, RetentionPolicy, StreamConfig,
};
use proptest::prelude::*;

use crate::common;

/// A work-queue stream (each message has one consumer, removed once it is done).
const WORK: usize = 0;
/// An interest stream (removed once every consumer that matches it is done).
const INTEREST: usize = 1;
/// The dead-letter stream of both, with a message limit.
const DEAD: usize = 2;
/// A stream whose messages pin messages of the others, with a message limit that removes them (and their pins).
const PINS: usize = 3;
const STREAMS: [&str; 4] = ["work", "interest", "dead", "pins"];
/// The subjects published to, per stream (the dead-letter stream gets copies only).
const SUBJECTS: [&[&str]; 4] = [&["w.a", "w.b"], &["i.a", "i.b"], &[], &["p.x"]];
const DEAD_MAX_MESSAGES: usize = 2;
const PINS_MAX_MESSAGES: usize = 2;
const ACK_WAIT_MS: u64 = 1_000;
const MAX_DELIVER: u32 = 2;
const MAX_IN_FLIGHT: usize = 3;
const STEP_MS: u64 = 250;

/// A consumer: its name, stream, filter and whether it starts at the end of the stream.
struct ConsumerSpec {
    name: &'static str,
    stream: usize,
    filter: Option<&'static str>,
    from_end: bool,
}

const CONSUMERS: [ConsumerSpec; 3] = [
    ConsumerSpec { name: "worker", stream: WORK, filter: None, from_end: false },
    ConsumerSpec { name: "only-a", stream: INTEREST, filter: Some("i.a"), from_end: false },
    ConsumerSpec { name: "from-end", stream: INTEREST, filter: None, from_end: true },
];

fn consumer_config(spec: &ConsumerSpec) -> ConsumerConfig {
    ConsumerConfig {
        filter_subject: spec.filter.map(str::to_string),
        deliver_policy: if spec.from_end { DeliverPolicy::New } else { DeliverPolicy::All },
        ack_wait_ms: ACK_WAIT_MS,
        max_deliver: Some(MAX_DELIVER),
        max_in_flight: MAX_IN_FLIGHT as u32,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Publish {
        stream: usize,
        subject: usize,
    },
    /// Publish to the pins stream a message pinning `pick` (a sequence, modulo one past the end) of `target`.
    Pin {
        target: usize,
        pick: u64,
    },
    Recall {
        stream: usize,
        pick: u64,
    },
    CreateConsumer {
        consumer: usize,
    },
    DeleteConsumer {
        consumer: usize,
    },
    Fetch {
        consumer: usize,
        max: u32,
    },
    Ack {
        consumer: usize,
        pick: usize,
        kind: AckKind,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        4 => Just(AckKind::Applied),
        1 => Just(AckKind::InProgress),
        2 => Just(AckKind::Nack { delay_ms: 0 }),
        1 => (1u64..5).prop_map(|n| AckKind::Nack { delay_ms: n * STEP_MS }),
        1 => Just(AckKind::Term),
        3 => Just(AckKind::Failed),
    ];
    prop_oneof![
        3 => (0u64..6).prop_map(|n| Op::Advance(n * STEP_MS)),
        5 => (prop_oneof![Just(WORK), Just(INTEREST)], 0usize..2).prop_map(|(stream, subject)| Op::Publish { stream, subject }),
        3 => (prop_oneof![1 => Just(WORK), 1 => Just(INTEREST), 2 => Just(DEAD)], 0u64..8).prop_map(|(target, pick)| Op::Pin { target, pick }),
        1 => (0..STREAMS.len(), 0u64..16).prop_map(|(stream, pick)| Op::Recall { stream, pick }),
        1 => (0..CONSUMERS.len()).prop_map(|consumer| Op::CreateConsumer { consumer }),
        1 => (0..CONSUMERS.len()).prop_map(|consumer| Op::DeleteConsumer { consumer }),
        4 => (0..CONSUMERS.len(), 1u32..4).prop_map(|(consumer, max)| Op::Fetch { consumer, max }),
        5 => (0..CONSUMERS.len(), 0usize..6, kind).prop_map(|(consumer, pick, kind)| Op::Ack { consumer, pick, kind }),
    ]
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Published { seq: u64 },
    Recalled,
    ConsumerCreated { created: bool },
    ConsumerDeleted,
    Fetched(Vec<(u64, u32, u64)>),
    Acked { state: AckState, already_done: bool },
    ConsumerNotFound,
    MessageNotFound,
    Pinned { stream: String, seq: u64 },
    NotDelivered,
    DeliveryExpired,
    Other(String),
}

fn answer_of(result: Result<Outcome, Rejection>) -> Answer {
    match result {
        Ok(Outcome::Published(ack)) => Answer::Published { seq: ack.seq },
        Ok(Outcome::Recalled) => Answer::Recalled,
        Ok(Outcome::ConsumerCreated { created }) => Answer::ConsumerCreated { created },
        Ok(Outcome::ConsumerDeleted) => Answer::ConsumerDeleted,
        Ok(Outcome::Fetched(deliveries)) => {
            Answer::Fetched(deliveries.iter().map(|d| (d.record.seq, d.delivery_count, d.ack_deadline.0)).collect())
        }
        Ok(Outcome::Acked { state, already_done }) => Answer::Acked { state, already_done },
        Err(Rejection::ConsumerNotFound { .. }) => Answer::ConsumerNotFound,
        Err(Rejection::MessageNotFound { .. }) => Answer::MessageNotFound,
        Err(Rejection::Pinned { stream, seq, .. }) => Answer::Pinned { stream, seq },
        Err(Rejection::NotDelivered { .. }) => Answer::NotDelivered,
        Err(Rejection::DeliveryExpired { .. }) => Answer::DeliveryExpired,
        other => Answer::Other(format!("{other:?}")),
    }
}

// ----- the model -----

/// Where a dead letter came from, as its headers say.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Origin {
    stream: String,
    consumer: String,
    seq: u64,
    deliveries: u32,
    reason: String,
}

#[derive(Clone, Debug)]
struct Msg {
    seq: u64,
    subject: &'static str,
    /// `None` once recalled.
    payload: Option<Vec<u8>>,
    origin: Option<Origin>,
}

#[derive(Clone, Debug)]
struct Log {
    messages: Vec<Msg>,
    next_seq: u64,
}

impl Log {
    fn first_seq(&self) -> u64 {
        self.messages.first().map_or(self.next_seq, |m| m.seq)
    }

    fn get(&self, seq: u64) -> Option<&Msg> {
        self.messages.iter().find(|m| m.seq == seq)
    }

    fn append(&mut self, subject: &'static str, payload: Vec<u8>, origin: Option<Origin>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.messages.push(Msg { seq, subject, payload: Some(payload), origin });
        seq
    }
}

/// An outstanding delivery.
#[derive(Clone, Copy, Debug)]
enum Status {
    Pending { deadline: u64, count: u32 },
    Ready { count: u32 },
    Waiting { until: u64, count: u32 },
}

impl Status {
    fn count(self) -> u32 {
        match self {
            Status::Pending { count, .. } | Status::Ready { count } | Status::Waiting { count, .. } => count,
        }
    }
}

#[derive(Clone, Debug)]
struct ModelConsumer {
    /// Which creation of the consumer this is: a timer set for an earlier one does nothing.
    id: u64,
    cursor: u64,
    outstanding: BTreeMap<u64, Status>,
}

impl ModelConsumer {
    fn is_done(&self, seq: u64) -> bool {
        seq < self.cursor && !self.outstanding.contains_key(&seq)
    }
}

#[derive(Clone, Debug)]
struct Model {
    now: u64,
    logs: Vec<Log>,
    consumers: Vec<Option<ModelConsumer>>,
    /// (stream, seq) → how many messages pin it.
    pins: BTreeMap<(usize, u64), u32>,
    /// A pins-stream sequence → the message it pins.
    pinned_by: BTreeMap<u64, (usize, u64)>,
    /// Delivery timers as the cell sets them: (due, order set) → (consumer, its id, sequence). Several may be set for
    /// one delivery; one fires only while the delivery's deadline (or delay) is still its due time, so of several due
    /// at the same time the first set fires, and timers due together fire in the order they were set.
    timers: BTreeMap<(u64, u64), (usize, u64, u64)>,
    timer_number: u64,
    next_consumer_id: u64,
}

fn matches(filter: Option<&str>, subject: &str) -> bool {
    filter.is_none_or(|filter| filter == subject)
}

impl Model {
    fn new() -> Self {
        Model {
            now: 0,
            logs: vec![Log { messages: Vec::new(), next_seq: 1 }; STREAMS.len()],
            consumers: vec![None; CONSUMERS.len()],
            pins: BTreeMap::new(),
            pinned_by: BTreeMap::new(),
            timers: BTreeMap::new(),
            timer_number: 0,
            next_consumer_id: 1,
        }
    }

    fn set_timer(&mut self, due: u64, index: usize, seq: u64) {
        let id = self.consumers[index].as_ref().expect("a timer of an existing consumer").id;
        self.timer_number += 1;
        self.timers.insert((due, self.timer_number), (index, id, seq));
    }

    fn pinned(&self, stream: usize, seq: u64) -> bool {
        self.pins.contains_key(&(stream, seq))
    }

    /// Removes a message; a pinning message lets go of what it pinned.
    fn remove(&mut self, stream: usize, seq: u64) {
        self.logs[stream].messages.retain(|m| m.seq != seq);
        if stream == PINS
            && let Some(target) = self.pinned_by.remove(&seq)
        {
            let count = self.pins.get_mut(&target).expect("a pin is counted");
            *count -= 1;
            if *count == 0 {
                self.pins.remove(&target);
            }
        }
    }

    /// Everything retention allows now, to a fixed point: interest and work-queue messages every matching consumer
    /// is done with, and the dead-letter stream's oldest while it is over its limit (stopping at a pinned one).
    fn settle(&mut self) {
        loop {
            let mut removable = Vec::new();
            for stream in [WORK, INTEREST] {
                for m in &self.logs[stream].messages {
                    let mut interested = CONSUMERS
                        .iter()
                        .zip(&self.consumers)
                        .filter_map(|(spec, c)| c.as_ref().map(|c| (spec, c)))
                        .filter(|(spec, _)| spec.stream == stream && matches(spec.filter, m.subject))
                        .peekable();
                    let wanted = interested.peek().is_some();
                    if wanted && interested.all(|(_, c)| c.is_done(m.seq)) && !self.pinned(stream, m.seq) {
                        removable.push((stream, m.seq));
                    }
                }
            }
            if self.logs[DEAD].messages.len() > DEAD_MAX_MESSAGES {
                let oldest = self.logs[DEAD].messages[0].seq;
                if !self.pinned(DEAD, oldest) {
                    removable.push((DEAD, oldest));
                }
            }
            if removable.is_empty() {
                return;
            }
            for (stream, seq) in removable {
                self.remove(stream, seq);
            }
        }
    }

    /// Copies a message a consumer gave up on into the dead-letter stream, making room there from what is not pinned.
    fn bury(&mut self, consumer: usize, seq: u64, deliveries: u32, reason: &str) {
        let spec = &CONSUMERS[consumer];
        let Some(original) = self.logs[spec.stream].get(seq).cloned() else { return };
        let over = (self.logs[DEAD].messages.len() + 1).saturating_sub(DEAD_MAX_MESSAGES);
        let oldest: Vec<u64> = self.logs[DEAD].messages.iter().take(over).map(|m| m.seq).collect();
        for seq in oldest {
            if !self.pinned(DEAD, seq) {
                self.remove(DEAD, seq);
            }
        }
        let origin = Origin {
            stream: STREAMS[spec.stream].to_string(),
            consumer: spec.name.to_string(),
            seq,
            deliveries,
            reason: reason.to_string(),
        };
        self.logs[DEAD].append(original.subject, original.payload.unwrap_or_default(), Some(origin));
    }

    /// Fires every delivery timer due by now, in the order the cell's queue holds them.
    fn expire(&mut self) {
        while let Some(entry) = self.timers.first_entry() {
            let (due, _) = *entry.key();
            if due > self.now {
                break;
            }
            let (index, id, seq) = entry.remove();
            let Some(consumer) = self.consumers[index].as_mut().filter(|c| c.id == id) else { continue };
            match consumer.outstanding.get(&seq).copied() {
                Some(Status::Pending { deadline, count }) if deadline == due => {
                    if count >= MAX_DELIVER {
                        consumer.outstanding.remove(&seq);
                        self.bury(index, seq, count, "max_deliver");
                    } else {
                        consumer.outstanding.insert(seq, Status::Ready { count });
                    }
                }
                Some(Status::Waiting { until, count }) if until == due => {
                    consumer.outstanding.insert(seq, Status::Ready { count });
                }
                _ => {}
            }
        }
        self.settle();
    }

    fn publish(&mut self, stream: usize, subject: &'static str, payload: Vec<u8>) -> Answer {
        Answer::Published { seq: self.logs[stream].append(subject, payload, None) }
    }

    fn pin(&mut self, target: usize, seq: u64, payload: Vec<u8>) -> Answer {
        if self.logs[target].get(seq).is_none() {
            return Answer::MessageNotFound;
        }
        // The pins stream's own messages are never pinned, so room is always made.
        let over = (self.logs[PINS].messages.len() + 1).saturating_sub(PINS_MAX_MESSAGES);
        let oldest: Vec<u64> = self.logs[PINS].messages.iter().take(over).map(|m| m.seq).collect();
        let seq_here = self.logs[PINS].append("p.x", payload, None);
        *self.pins.entry((target, seq)).or_default() += 1;
        self.pinned_by.insert(seq_here, (target, seq));
        for old in oldest {
            self.remove(PINS, old);
        }
        Answer::Published { seq: seq_here }
    }

    fn recall(&mut self, stream: usize, seq: u64) -> Answer {
        if self.pinned(stream, seq) {
            return Answer::Pinned { stream: STREAMS[stream].to_string(), seq };
        }
        let Some(message) = self.logs[stream].messages.iter_mut().find(|m| m.seq == seq) else {
            return Answer::MessageNotFound;
        };
        message.payload = None;
        Answer::Recalled
    }

    fn create(&mut self, index: usize) -> Answer {
        if self.consumers[index].is_some() {
            return Answer::ConsumerCreated { created: false };
        }
        let spec = &CONSUMERS[index];
        let log = &self.logs[spec.stream];
        let cursor = if spec.from_end { log.next_seq } else { log.first_seq() };
        let id = self.next_consumer_id;
        self.next_consumer_id += 1;
        self.consumers[index] = Some(ModelConsumer { id, cursor, outstanding: BTreeMap::new() });
        Answer::ConsumerCreated { created: true }
    }

    fn delete(&mut self, index: usize) -> Answer {
        match self.consumers[index].take() {
            Some(_) => Answer::ConsumerDeleted,
            None => Answer::ConsumerNotFound,
        }
    }

    fn fetch(&mut self, index: usize, max: u32) -> Answer {
        let spec = &CONSUMERS[index];
        let now = self.now;
        let Some(mut consumer) = self.consumers[index].take() else { return Answer::ConsumerNotFound };
        let log = &self.logs[spec.stream];
        let pending = consumer.outstanding.values().filter(|s| matches!(s, Status::Pending { .. })).count();
        let mut budget = (max as usize).min(MAX_IN_FLIGHT.saturating_sub(pending));
        let deadline = now + ACK_WAIT_MS;
        let mut delivered = Vec::new();
        let ready: Vec<(u64, u32)> = consumer
            .outstanding
            .iter()
            .filter_map(|(&seq, status)| matches!(status, Status::Ready { .. }).then_some((seq, status.count())))
            .collect();
        for (seq, count) in ready {
            if budget == 0 {
                break;
            }
            if log.get(seq).is_none() {
                consumer.outstanding.remove(&seq);
                continue;
            }
            consumer.outstanding.insert(seq, Status::Pending { deadline, count: count + 1 });
            delivered.push((seq, count + 1, deadline));
            budget -= 1;
        }
        consumer.cursor = consumer.cursor.max(log.first_seq());
        while budget > 0 && consumer.cursor < log.next_seq {
            let seq = consumer.cursor;
            consumer.cursor += 1;
            let Some(message) = log.get(seq) else { continue };
            if !matches(spec.filter, message.subject) {
                continue;
            }
            consumer.outstanding.insert(seq, Status::Pending { deadline, count: 1 });
            delivered.push((seq, 1, deadline));
            budget -= 1;
        }
        self.consumers[index] = Some(consumer);
        // The cell sets one timer per delivery, in the order delivered.
        for &(seq, _, deadline) in &delivered {
            self.set_timer(deadline, index, seq);
        }
        Answer::Fetched(delivered)
    }

    /// The sequence an `Ack` op targets: an outstanding delivery when there is one, else a guess.
    fn ack_target(&self, index: usize, pick: usize) -> u64 {
        let outstanding: Vec<u64> =
            self.consumers[index].as_ref().map(|c| c.outstanding.keys().copied().collect()).unwrap_or_default();
        if outstanding.is_empty() { pick as u64 + 1 } else { outstanding[pick % outstanding.len()] }
    }

    fn ack(&mut self, index: usize, seq: u64, kind: AckKind) -> Answer {
        let now = self.now;
        let Some(consumer) = self.consumers[index].as_mut() else { return Answer::ConsumerNotFound };
        if seq >= consumer.cursor {
            return Answer::NotDelivered;
        }
        let Some(&status) = consumer.outstanding.get(&seq) else {
            return Answer::Acked { state: AckState::Applied, already_done: true };
        };
        let count = status.count();
        let state = match kind {
            AckKind::Applied => {
                consumer.outstanding.remove(&seq);
                AckState::Applied
            }
            AckKind::InProgress => {
                if !matches!(status, Status::Pending { .. }) {
                    return Answer::DeliveryExpired;
                }
                consumer.outstanding.insert(seq, Status::Pending { deadline: now + ACK_WAIT_MS, count });
                self.set_timer(now + ACK_WAIT_MS, index, seq);
                AckState::Received
            }
            AckKind::Nack { delay_ms } => {
                if count >= MAX_DELIVER {
                    consumer.outstanding.remove(&seq);
                    self.bury(index, seq, count, "max_deliver");
                } else if delay_ms > 0 {
                    consumer.outstanding.insert(seq, Status::Waiting { until: now + delay_ms, count });
                    self.set_timer(now + delay_ms, index, seq);
                } else {
                    consumer.outstanding.insert(seq, Status::Ready { count });
                }
                AckState::Nack
            }
            AckKind::Failed => {
                consumer.outstanding.remove(&seq);
                self.bury(index, seq, count, "failed");
                AckState::Failed
            }
            AckKind::Term => {
                consumer.outstanding.remove(&seq);
                AckState::Failed
            }
            other => unreachable!("not generated: {other:?}"),
        };
        Answer::Acked { state, already_done: false }
    }
}

// ----- driving both -----

fn setup(cell: &mut Cell) {
    let stream = |subjects: &str, retention, max_messages: Option<usize>, dead: bool| StreamConfig {
        retention,
        max_messages: max_messages.map(|n| n as u64),
        dead_letter_stream: dead.then(|| STREAMS[DEAD].to_string()),
        ..StreamConfig::with_subjects([subjects])
    };
    let configs = [
        stream("w.>", RetentionPolicy::WorkQueue, None, true),
        stream("i.>", RetentionPolicy::Interest, None, true),
        stream("dead.>", RetentionPolicy::Limits, Some(DEAD_MAX_MESSAGES), false),
        stream("p.>", RetentionPolicy::Limits, Some(PINS_MAX_MESSAGES), false),
    ];
    // The dead-letter stream first: the others name it.
    for index in [DEAD, PINS, WORK, INTEREST] {
        let command = Command::CreateStream { name: STREAMS[index].to_string(), config: configs[index].clone() };
        cell.apply(Millis(0), command).unwrap();
        cell.drain_work().for_each(drop);
    }
}

fn publish(subject: &str, payload: Vec<u8>) -> PublishRequest {
    PublishRequest::new(subject, Bytes::from(payload))
}

fn step(cell: &mut Cell, model: &mut Model, op: &Op, counter: &mut u64) -> (Answer, Answer) {
    if let Op::Advance(ms) = op {
        model.now += ms;
        return (Answer::Published { seq: 0 }, Answer::Published { seq: 0 });
    }
    model.expire();
    let at = Millis(model.now);
    *counter += 1;
    let payload = counter.to_le_bytes().to_vec();
    let (actual, expected) = match *op {
        Op::Advance(_) => unreachable!(),
        Op::Publish { stream, subject } => {
            let subject = SUBJECTS[stream][subject];
            let actual = cell.apply(at, Command::Publish(publish(subject, payload.clone())));
            (actual, model.publish(stream, subject, payload))
        }
        Op::Pin { target, pick } => {
            let seq = pick % (model.logs[target].next_seq + 1);
            let mut request = publish("p.x", payload.clone());
            request.headers.insert(PIN_HEADER.to_string(), format!("{}/0/{seq}", STREAMS[target]));
            (cell.apply(at, Command::Publish(request)), model.pin(target, seq, payload))
        }
        Op::Recall { stream, pick } => {
            let seq = pick % (model.logs[stream].next_seq + 1);
            let command = Command::Recall { stream: STREAMS[stream].to_string(), partition: 0, seq };
            (cell.apply(at, command), model.recall(stream, seq))
        }
        Op::CreateConsumer { consumer } => {
            let spec = &CONSUMERS[consumer];
            let command = Command::CreateConsumer {
                stream: STREAMS[spec.stream].to_string(),
                name: spec.name.to_string(),
                config: consumer_config(spec),
            };
            (cell.apply(at, command), model.create(consumer))
        }
        Op::DeleteConsumer { consumer } => {
            let spec = &CONSUMERS[consumer];
            let command =
                Command::DeleteConsumer { stream: STREAMS[spec.stream].to_string(), name: spec.name.to_string() };
            (cell.apply(at, command), model.delete(consumer))
        }
        Op::Fetch { consumer, max } => {
            let spec = &CONSUMERS[consumer];
            let command = Command::Fetch {
                stream: STREAMS[spec.stream].to_string(),
                consumer: spec.name.to_string(),
                member: "m".to_string(),
                max,
            };
            (cell.apply(at, command), model.fetch(consumer, max))
        }
        Op::Ack { consumer, pick, kind } => {
            let spec = &CONSUMERS[consumer];
            let seq = model.ack_target(consumer, pick);
            let command = Command::Ack {
                stream: STREAMS[spec.stream].to_string(),
                consumer: spec.name.to_string(),
                partition: 0,
                seq,
                kind,
            };
            (cell.apply(at, command), model.ack(consumer, seq, kind))
        }
    };
    model.settle();
    (answer_of(actual), expected)
}

/// What a stored message looks like to a reader: sequence, subject, payload (empty once recalled), whether it was
/// recalled, and for a dead letter where it came from.
type Seen = (u64, String, Vec<u8>, bool, Option<Origin>);

fn origin_of(headers: &BTreeMap<String, String>) -> Option<Origin> {
    let header = |name: &str| headers.get(&format!("cellog-dead-letter-{name}")).cloned();
    Some(Origin {
        stream: header("stream")?,
        consumer: header("consumer")?,
        seq: header("seq")?.parse().ok()?,
        deliveries: header("deliveries")?.parse().ok()?,
        reason: header("reason")?,
    })
}

fn compare_state(cell: &Cell, bodies: &MemoryBodies, model: &Model) -> Result<(), TestCaseError> {
    for (index, name) in STREAMS.iter().enumerate() {
        let stored: Vec<Seen> = cell
            .read_from(name, 0, 0, 1_000)
            .unwrap()
            .into_iter()
            .map(|r| {
                let payload =
                    bodies.payload(&r).map_or_else(|e| format!("unreadable: {e}").into_bytes(), |b| b.to_vec());
                let recalled = matches!(r.body, cellog_core::Body::Tombstone { .. });
                let headers: BTreeMap<String, String> =
                    r.headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                (r.seq, r.subject.to_string(), payload, recalled, origin_of(&headers))
            })
            .collect();
        let expected: Vec<Seen> = model.logs[index]
            .messages
            .iter()
            .map(|m| {
                let payload = m.payload.clone().unwrap_or_default();
                (m.seq, m.subject.to_string(), payload, m.payload.is_none(), m.origin.clone())
            })
            .collect();
        prop_assert_eq!(stored, expected, "stream {} contents", name);
        let info = cell.stream_info(name).unwrap();
        prop_assert_eq!(info.partitions[0].high_watermark, model.logs[index].next_seq - 1, "stream {}", name);
    }
    for (index, spec) in CONSUMERS.iter().enumerate() {
        let info = cell.consumer_info(STREAMS[spec.stream], spec.name, Millis(model.now));
        let Some(consumer) = &model.consumers[index] else {
            prop_assert!(info.is_err(), "consumer {} exists in the cell only", spec.name);
            continue;
        };
        let info = info.unwrap();
        let pending = consumer.outstanding.values().filter(|s| matches!(s, Status::Pending { .. })).count();
        prop_assert_eq!(info.n_pending as usize, pending, "consumer {} pending", spec.name);
        let lag = &info.partitions[0];
        prop_assert_eq!(lag.cursor, consumer.cursor, "consumer {} cursor", spec.name);
        let floor = consumer.outstanding.keys().next().copied().unwrap_or(consumer.cursor);
        prop_assert_eq!(lag.ack_floor, floor, "consumer {} ack floor", spec.name);
        prop_assert_eq!(lag.n_outstanding as usize, consumer.outstanding.len(), "consumer {} outstanding", spec.name);
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<Cell, TestCaseError> {
    let mut bodies = MemoryBodies::default();
    let mut cell = Cell::new();
    setup(&mut cell);
    let mut model = Model::new();
    let mut counter = 0;
    for (index, op) in ops.iter().enumerate() {
        let (actual, expected) = step(&mut cell, &mut model, op, &mut counter);
        cell.drain_work().for_each(|work| bodies.apply(&work));
        prop_assert_eq!(actual, expected, "step {} {:?} at {}ms", index, op, model.now);
        compare_state(&cell, &bodies, &model)?;
        common::stored_state_holds(&cell, &bodies).map_err(TestCaseError::fail)?;
    }
    Ok(cell)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn removals_agree_with_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(&ops)?;
    }
}

/// Deliveries that run out of deliveries at the same tick are dead-lettered in sequence order, also when one of
/// them was acked in progress before (which moved its deadline, not its place).
#[test]
fn deliveries_dead_lettered_together_keep_their_order_after_an_in_progress_ack() {
    let publish = || Op::Publish { stream: WORK, subject: 0 };
    let ops = [
        publish(),
        Op::CreateConsumer { consumer: 0 },
        publish(),
        Op::Fetch { consumer: 0, max: 2 },
        Op::Advance(ACK_WAIT_MS),
        publish(),
        Op::Fetch { consumer: 0, max: 3 },
        Op::Ack { consumer: 0, pick: 3, kind: AckKind::InProgress },
        Op::Advance(ACK_WAIT_MS),
        publish(),
    ];
    run(&ops).unwrap();
}
