//! Model-based test: a small, obviously-correct reference model of one cell and the real `Cell` are driven by the
//! same random sequence of commands with time moving forward, and must agree on every outcome and on the visible
//! state after every step. Invariants of the real cell are asserted after every step as well. The model covers
//! publishing (ids, keys, a time to live, a delay before the first delivery), limits retention (count and age) held
//! back by a registered peer until it has received what would go (a publish that would need more is refused; a
//! commit goes over the limit until the peer catches up), consumers (fetch, ack, nack with and without delay, in-progress, term, max deliver, max in flight) and
//! transactions.
//!
//! The model keeps everything in plain vectors and evaluates every timer lazily ("is it due at the time of this
//! command?"), while the cell keeps indexes and a timer queue; agreement between the two is the point.

use std::collections::BTreeMap;

use bytes::Bytes;
use cellog_core::subject::partition_for_key;
use cellog_core::{
    AckAnswer, AckItem, AckKind, AckState, Cell, Command, ConsumerConfig, ConsumerInfo, MemoryBodies, Millis, Outcome,
    ProducerRef, PublishRequest, Rejection, StreamConfig, Work,
};
use proptest::prelude::*;

use crate::common;

const STREAM: &str = "s";
const SUBJECTS: [&str; 3] = ["s.a", "s.b", "s.c"];
const N_PARTITIONS: u32 = 2;
const MAX_MESSAGES: usize = 6;
const MAX_AGE_MS: u64 = 5_000;
const DUPLICATE_WINDOW_MS: u64 = 2_000;
const ACK_WAIT_MS: u64 = 1_000;
const MAX_DELIVER: u32 = 3;
const MAX_IN_FLIGHT: usize = 4;
const TRANSACTION_TIMEOUT_MS: u64 = 3_000;
/// Consumer names and their filters.
const CONSUMERS: [(&str, Option<&str>); 2] = [("all", None), ("only-a", Some("s.a"))];
const PRODUCERS: [&str; 2] = ["tx-0", "tx-1"];
/// The stream's registered peer: retention keeps what it has not received.
const PEER: &str = "mirror";
/// The unit of time moves; every duration above is a multiple of it.
const STEP_MS: u64 = 250;

/// One step of a run.
#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Publish {
        subject: usize,
        key: Option<u8>,
        id: Option<u8>,
        /// Time to live, in steps.
        ttl: Option<u64>,
        /// Delay before the first delivery, in steps.
        delay: Option<u64>,
    },
    Fetch {
        consumer: usize,
        max: u32,
    },
    /// Acknowledge the `pick`-th outstanding delivery of a consumer (or a random position when there is none).
    Ack {
        consumer: usize,
        pick: usize,
        kind: AckKind,
    },
    /// Acknowledge several deliveries of a consumer in one command, each picked as `Ack` picks one (before any of
    /// them is applied, so that a batch may name one delivery twice).
    Acks {
        consumer: usize,
        picks: Vec<(usize, AckKind)>,
    },
    Init {
        producer: usize,
    },
    Begin {
        producer: usize,
        stale: bool,
    },
    Stage {
        producer: usize,
        stale: bool,
        subject: usize,
        id: Option<u8>,
    },
    Commit {
        producer: usize,
        stale: bool,
    },
    /// The peer reports it has received a partition up to a sequence (`pick` modulo what the partition holds).
    PeerProgress {
        partition: u32,
        pick: u64,
    },
    Abort {
        producer: usize,
        stale: bool,
    },
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        4 => Just(AckKind::Applied),
        1 => Just(AckKind::InProgress),
        2 => Just(AckKind::Nack { delay_ms: 0 }),
        1 => (1u64..6).prop_map(|n| AckKind::Nack { delay_ms: n * STEP_MS }),
        1 => Just(AckKind::Term),
    ];
    prop_oneof![
        // Time moves in steps that line up with every timer, so deadlines are hit exactly as often as passed.
        3 => (0u64..6).prop_map(|n| Op::Advance(n * STEP_MS)),
        6 => (
            0..SUBJECTS.len(),
            proptest::option::of(0u8..4),
            proptest::option::weighted(0.5, 0u8..6),
            proptest::option::weighted(0.2, 1u64..12),
            proptest::option::weighted(0.2, 1u64..8),
        )
            .prop_map(|(subject, key, id, ttl, delay)| Op::Publish { subject, key, id, ttl, delay }),
        3 => (0..CONSUMERS.len(), 1u32..4).prop_map(|(consumer, max)| Op::Fetch { consumer, max }),
        4 => (0..CONSUMERS.len(), 0usize..8, kind.clone()).prop_map(|(consumer, pick, kind)| Op::Ack { consumer, pick, kind }),
        2 => (0..CONSUMERS.len(), proptest::collection::vec((0usize..8, kind), 1..6))
            .prop_map(|(consumer, picks)| Op::Acks { consumer, picks }),
        1 => (0..PRODUCERS.len()).prop_map(|producer| Op::Init { producer }),
        1 => (0..PRODUCERS.len(), proptest::bool::weighted(0.15)).prop_map(|(producer, stale)| Op::Begin { producer, stale }),
        2 => (0..PRODUCERS.len(), proptest::bool::weighted(0.1), 0..SUBJECTS.len(), proptest::option::weighted(0.3, 0u8..6))
            .prop_map(|(producer, stale, subject, id)| Op::Stage { producer, stale, subject, id }),
        1 => (0..PRODUCERS.len(), proptest::bool::weighted(0.2)).prop_map(|(producer, stale)| Op::Commit { producer, stale }),
        1 => (0..PRODUCERS.len(), proptest::bool::weighted(0.2)).prop_map(|(producer, stale)| Op::Abort { producer, stale }),
        1 => Just(Op::Tick),
        2 => (0..N_PARTITIONS, 0u64..64).prop_map(|(partition, pick)| Op::PeerProgress { partition, pick }),
    ]
}

/// What both sides answer, reduced to what a client can observe and compare.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Published { partition: u32, seq: u64, duplicate: bool },
    Staged { index: u32, duplicate: bool },
    Fetched(Vec<(u32, u64, u32, u64)>),
    Acked { state: AckState, already_done: bool },
    AckedEach(Vec<Answer>),
    Initialized { producer_id: u64, epoch: u32 },
    Begun,
    Committed { messages: Vec<(u32, u64, bool)>, next_epoch: u32 },
    Aborted { next_epoch: u32 },
    Ticked,
    Fenced { current_epoch: u32 },
    ProducerNotFound,
    TransactionState,
    TransactionAborted,
    NotDelivered,
    DeliveryExpired,
    StorageFull { partition: u32, received: u64 },
    PeerProgressed,
    Other(String),
}

fn answer_of(result: Result<Outcome, Rejection>) -> Answer {
    match result {
        Ok(Outcome::Published(ack)) => {
            Answer::Published { partition: ack.partition, seq: ack.seq, duplicate: ack.duplicate }
        }
        Ok(Outcome::Staged { index, duplicate }) => Answer::Staged { index, duplicate },
        Ok(Outcome::Fetched(deliveries)) => Answer::Fetched(
            deliveries.iter().map(|d| (d.record.partition, d.record.seq, d.delivery_count, d.ack_deadline.0)).collect(),
        ),
        Ok(Outcome::Acked { state, already_done }) => Answer::Acked { state, already_done },
        Ok(Outcome::AckedEach(answers)) => Answer::AckedEach(
            answers
                .into_iter()
                .map(|answer| {
                    answer_of(answer.map(|AckAnswer { state, already_done }| Outcome::Acked { state, already_done }))
                })
                .collect(),
        ),
        Ok(Outcome::ProducerInitialized(r)) => Answer::Initialized { producer_id: r.producer_id, epoch: r.epoch },
        Ok(Outcome::TransactionBegun) => Answer::Begun,
        Ok(Outcome::TransactionCommitted { messages, next }) => Answer::Committed {
            messages: messages.iter().map(|a| (a.partition, a.seq, a.duplicate)).collect(),
            next_epoch: next.epoch,
        },
        Ok(Outcome::TransactionAborted { next }) => Answer::Aborted { next_epoch: next.epoch },
        Ok(Outcome::Ticked) => Answer::Ticked,
        Err(Rejection::Fenced { current_epoch }) => Answer::Fenced { current_epoch },
        Err(Rejection::ProducerNotFound { .. }) => Answer::ProducerNotFound,
        Err(Rejection::TransactionState { .. }) => Answer::TransactionState,
        Err(Rejection::TransactionAborted { .. }) => Answer::TransactionAborted,
        Err(Rejection::NotDelivered { .. }) => Answer::NotDelivered,
        Err(Rejection::DeliveryExpired { .. }) => Answer::DeliveryExpired,
        Err(Rejection::StorageFull { partition, received, .. }) => Answer::StorageFull { partition, received },
        Ok(Outcome::PeerProgressed) => Answer::PeerProgressed,
        other => Answer::Other(format!("{other:?}")),
    }
}

// ----- the model -----

#[derive(Clone, Debug)]
struct Msg {
    partition: u32,
    seq: u64,
    arrival: u64,
    subject: &'static str,
    payload: Vec<u8>,
    stored_at: u64,
    /// When its time to live ends, if it has one.
    expires_at: Option<u64>,
    /// When it may first be delivered, if it is delayed.
    deliver_at: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Status {
    Pending { deadline: u64, count: u32 },
    Ready { count: u32 },
    Waiting { until: u64, count: u32 },
}

#[derive(Clone, Debug, Default)]
struct ModelConsumer {
    /// Next sequence to look at, per partition.
    cursor: [u64; N_PARTITIONS as usize],
    /// Messages delivered and not done; anything below the cursor and absent here is done.
    outstanding: BTreeMap<(u32, u64), Status>,
    next_partition: u32,
}

#[derive(Clone, Debug)]
enum End {
    Committed { epoch: u32, answer: Answer },
    Aborted { epoch: u32, fenced: bool },
}

/// A message to publish (or staged in a transaction): its time to live and delay in ms, when given.
#[derive(Clone, Debug)]
struct NewMsg {
    subject: &'static str,
    key: Option<u8>,
    id: Option<String>,
    payload: Vec<u8>,
    ttl: Option<u64>,
    delay: Option<u64>,
}

#[derive(Clone, Debug)]
struct ModelTxn {
    deadline: u64,
    staged: Vec<NewMsg>,
}

#[derive(Clone, Debug)]
struct ModelProducer {
    id: u64,
    epoch: u32,
    txn: Option<ModelTxn>,
    last_end: Option<End>,
}

#[derive(Clone, Debug, Default)]
struct Model {
    now: u64,
    messages: Vec<Msg>,
    next_seq: [u64; N_PARTITIONS as usize],
    arrivals: u64,
    /// Every id ever appended: (id, partition, seq, stored_at), newest last.
    ids: Vec<(String, u32, u64, u64)>,
    consumers: Vec<ModelConsumer>,
    producers: BTreeMap<usize, ModelProducer>,
    next_producer_id: u64,
    /// What the peer has received, per partition.
    peer: [u64; N_PARTITIONS as usize],
}

fn partition_of(subject: &str, key: Option<u8>) -> u32 {
    match key {
        Some(key) => partition_for_key(&[key], N_PARTITIONS),
        None => partition_for_key(subject.as_bytes(), N_PARTITIONS),
    }
}

fn matches(filter: Option<&str>, subject: &str) -> bool {
    filter.is_none_or(|filter| filter == subject)
}

impl Model {
    fn new() -> Self {
        Model {
            next_seq: [1; N_PARTITIONS as usize],
            consumers: vec![
                ModelConsumer { cursor: [1; N_PARTITIONS as usize], ..ModelConsumer::default() };
                CONSUMERS.len()
            ],
            next_producer_id: 1,
            ..Model::default()
        }
    }

    /// Whether retention must keep a message for the peer.
    fn held(&self, partition: u32, seq: u64) -> bool {
        self.peer[partition as usize] < seq
    }

    fn retained(&self, partition: u32, seq: u64) -> bool {
        self.messages.iter().any(|m| m.partition == partition && m.seq == seq)
    }

    /// Everything due by `now`, in any order: none of these interact.
    fn expire(&mut self) {
        let now = self.now;
        // Age and time to live remove a message once the peer has received it, not before.
        let peer = self.peer;
        self.messages.retain(|m| {
            let expired = m.stored_at + MAX_AGE_MS <= now || m.expires_at.is_some_and(|at| at <= now);
            !expired || peer[m.partition as usize] < m.seq
        });
        for consumer in &mut self.consumers {
            for status in consumer.outstanding.values_mut() {
                match *status {
                    Status::Pending { deadline, count } if deadline <= now => *status = Status::Ready { count },
                    Status::Waiting { until, count } if until <= now => *status = Status::Ready { count },
                    _ => {}
                }
            }
            // An expired delivery that used up its deliveries is dead-lettered (no dead-letter stream here).
            consumer
                .outstanding
                .retain(|_, status| !matches!(status, Status::Ready { count } if *count >= MAX_DELIVER));
        }
        for producer in self.producers.values_mut() {
            if producer.txn.as_ref().is_some_and(|t| t.deadline <= now) {
                producer.txn = None;
                producer.last_end = Some(End::Aborted { epoch: producer.epoch, fenced: false });
                producer.epoch += 1;
            }
        }
    }

    /// The earlier publish of `id`, if it is still remembered.
    fn duplicate(&self, id: &str) -> Option<(u32, u64)> {
        let &(_, partition, seq, stored_at) = self.ids.iter().rev().find(|(i, ..)| i == id)?;
        (self.retained(partition, seq) || self.now < stored_at + DUPLICATE_WINDOW_MS).then_some((partition, seq))
    }

    /// The messages limits retention takes to make room for one more, oldest first.
    fn room_plan(&self) -> Vec<(u32, u64)> {
        let mut by_arrival: Vec<&Msg> = self.messages.iter().collect();
        by_arrival.sort_by_key(|m| m.arrival);
        let over = (self.messages.len() + 1).saturating_sub(MAX_MESSAGES);
        by_arrival.iter().take(over).map(|m| (m.partition, m.seq)).collect()
    }

    /// A transaction's message at its commit: room is made only from what the peer has received, so the stream may
    /// go over its limit for a while.
    fn append_lenient(&mut self, message: NewMsg) -> Answer {
        if let Some((partition, seq)) = message.id.as_deref().and_then(|id| self.duplicate(id)) {
            return Answer::Published { partition, seq, duplicate: true };
        }
        for (partition, seq) in self.room_plan() {
            if !self.held(partition, seq) {
                self.messages.retain(|m| (m.partition, m.seq) != (partition, seq));
            }
        }
        self.push(message)
    }

    /// The peer received `partition` up to `received`: what retention held back for it goes now.
    fn progress(&mut self, partition: u32, received: u64) -> Answer {
        let mark = &mut self.peer[partition as usize];
        *mark = (*mark).max(received);
        self.expire();
        while self.messages.len() > MAX_MESSAGES {
            let oldest = self.messages.iter().min_by_key(|m| m.arrival).map(|m| (m.partition, m.seq)).unwrap();
            if self.held(oldest.0, oldest.1) {
                break;
            }
            self.messages.retain(|m| (m.partition, m.seq) != oldest);
        }
        Answer::PeerProgressed
    }

    /// A publish outside a transaction: room is made from what the peer has received, or the publish is refused.
    fn append(&mut self, message: NewMsg) -> Answer {
        if let Some((partition, seq)) = message.id.as_deref().and_then(|id| self.duplicate(id)) {
            return Answer::Published { partition, seq, duplicate: true };
        }
        let plan = self.room_plan();
        if let Some(&(partition, _)) = plan.iter().find(|(partition, seq)| self.held(*partition, *seq)) {
            return Answer::StorageFull { partition, received: self.peer[partition as usize] };
        }
        self.messages.retain(|m| !plan.contains(&(m.partition, m.seq)));
        self.push(message)
    }

    fn push(&mut self, message: NewMsg) -> Answer {
        let NewMsg { subject, key, id, payload, ttl, delay } = message;
        let partition = partition_of(subject, key);
        let seq = self.next_seq[partition as usize];
        self.next_seq[partition as usize] += 1;
        self.arrivals += 1;
        let (expires_at, deliver_at) = (ttl.map(|ttl| self.now + ttl), delay.map(|delay| self.now + delay));
        let stored_at = self.now;
        self.messages.push(Msg {
            partition,
            seq,
            arrival: self.arrivals,
            subject,
            payload,
            stored_at,
            expires_at,
            deliver_at,
        });
        if let Some(id) = id {
            self.ids.push((id, partition, seq, self.now));
        }
        Answer::Published { partition, seq, duplicate: false }
    }

    fn fetch(&mut self, index: usize, max: u32) -> Answer {
        let (_, filter) = CONSUMERS[index];
        let now = self.now;
        let pending =
            self.consumers[index].outstanding.values().filter(|s| matches!(s, Status::Pending { .. })).count();
        let mut budget = (max as usize).min(MAX_IN_FLIGHT.saturating_sub(pending));
        let mut delivered = Vec::new();
        let ready: Vec<((u32, u64), u32)> = self.consumers[index]
            .outstanding
            .iter()
            .filter_map(|(&key, status)| match status {
                Status::Ready { count } => Some((key, *count)),
                _ => None,
            })
            .collect();
        for ((partition, seq), count) in ready {
            if budget == 0 {
                break;
            }
            if !self.retained(partition, seq) {
                self.consumers[index].outstanding.remove(&(partition, seq));
                continue;
            }
            let deadline = now + ACK_WAIT_MS;
            self.consumers[index].outstanding.insert((partition, seq), Status::Pending { deadline, count: count + 1 });
            delivered.push((partition, seq, count + 1, deadline));
            budget -= 1;
        }
        let start = self.consumers[index].next_partition;
        for offset in 0..N_PARTITIONS {
            let partition = (start + offset) % N_PARTITIONS;
            // Messages removed before they were looked at are skipped: the cursor starts at the low watermark.
            let low = self
                .messages
                .iter()
                .filter(|m| m.partition == partition)
                .map(|m| m.seq)
                .min()
                .unwrap_or(self.next_seq[partition as usize]);
            let cursor = &mut self.consumers[index].cursor[partition as usize];
            *cursor = (*cursor).max(low);
            while budget > 0 && self.consumers[index].cursor[partition as usize] < self.next_seq[partition as usize] {
                let seq = self.consumers[index].cursor[partition as usize];
                self.consumers[index].cursor[partition as usize] += 1;
                let Some(message) = self.messages.iter().find(|m| m.partition == partition && m.seq == seq) else {
                    continue;
                };
                if !matches(filter, message.subject) {
                    continue;
                }
                // A delayed message waits, delivered as soon as its delay ends; it takes no room meanwhile.
                if let Some(until) = message.deliver_at.filter(|until| *until > now) {
                    self.consumers[index].outstanding.insert((partition, seq), Status::Waiting { until, count: 0 });
                    continue;
                }
                let deadline = now + ACK_WAIT_MS;
                self.consumers[index].outstanding.insert((partition, seq), Status::Pending { deadline, count: 1 });
                delivered.push((partition, seq, 1, deadline));
                budget -= 1;
            }
        }
        self.consumers[index].next_partition = (start + 1) % N_PARTITIONS;
        Answer::Fetched(delivered)
    }

    /// The (partition, seq) an `Ack` op targets: an outstanding delivery when there is one, else a guess.
    fn ack_target(&self, index: usize, pick: usize) -> (u32, u64) {
        let outstanding: Vec<(u32, u64)> = self.consumers[index].outstanding.keys().copied().collect();
        if outstanding.is_empty() {
            ((pick % 2) as u32, pick as u64 / 2 + 1)
        } else {
            outstanding[pick % outstanding.len()]
        }
    }

    fn ack(&mut self, index: usize, partition: u32, seq: u64, kind: AckKind) -> Answer {
        let now = self.now;
        let consumer = &mut self.consumers[index];
        if seq >= consumer.cursor[partition as usize] {
            return Answer::NotDelivered;
        }
        let Some(&status) = consumer.outstanding.get(&(partition, seq)) else {
            return Answer::Acked { state: AckState::Applied, already_done: true };
        };
        let count = match status {
            Status::Pending { count, .. } | Status::Ready { count } | Status::Waiting { count, .. } => count,
        };
        if count == 0 {
            return Answer::NotDelivered;
        }
        let state = match kind {
            AckKind::Applied => {
                consumer.outstanding.remove(&(partition, seq));
                AckState::Applied
            }
            AckKind::InProgress => {
                if !matches!(status, Status::Pending { .. }) {
                    return Answer::DeliveryExpired;
                }
                consumer.outstanding.insert((partition, seq), Status::Pending { deadline: now + ACK_WAIT_MS, count });
                AckState::Received
            }
            AckKind::Nack { delay_ms } => {
                if count >= MAX_DELIVER {
                    consumer.outstanding.remove(&(partition, seq));
                } else if delay_ms > 0 {
                    consumer.outstanding.insert((partition, seq), Status::Waiting { until: now + delay_ms, count });
                } else {
                    consumer.outstanding.insert((partition, seq), Status::Ready { count });
                }
                AckState::Nack
            }
            AckKind::Term => {
                consumer.outstanding.remove(&(partition, seq));
                AckState::Failed
            }
            other => unreachable!("not generated: {other:?}"),
        };
        Answer::Acked { state, already_done: false }
    }

    fn producer_ref(&self, index: usize, stale: bool) -> ProducerRef {
        match self.producers.get(&index) {
            Some(p) => {
                ProducerRef { producer_id: p.id, epoch: if stale { p.epoch.saturating_sub(1) } else { p.epoch } }
            }
            None => ProducerRef { producer_id: 1_000 + index as u64, epoch: 0 },
        }
    }

    /// The producer if `r` names its current epoch, else the rejection.
    fn current(&mut self, index: usize, r: ProducerRef) -> Result<&mut ModelProducer, Answer> {
        let producer = self.producers.get_mut(&index).ok_or(Answer::ProducerNotFound)?;
        if producer.epoch != r.epoch {
            return Err(Answer::Fenced { current_epoch: producer.epoch });
        }
        Ok(producer)
    }

    fn init(&mut self, index: usize) -> Answer {
        match self.producers.get_mut(&index) {
            Some(p) => {
                if p.txn.take().is_some() {
                    p.last_end = Some(End::Aborted { epoch: p.epoch, fenced: true });
                    p.epoch += 1;
                }
                p.epoch += 1;
                Answer::Initialized { producer_id: p.id, epoch: p.epoch }
            }
            None => {
                let id = self.next_producer_id;
                self.next_producer_id += 1;
                self.producers.insert(index, ModelProducer { id, epoch: 0, txn: None, last_end: None });
                Answer::Initialized { producer_id: id, epoch: 0 }
            }
        }
    }

    fn begin(&mut self, index: usize, r: ProducerRef) -> Answer {
        let deadline = self.now + TRANSACTION_TIMEOUT_MS;
        match self.current(index, r) {
            Err(answer) => answer,
            Ok(p) if p.txn.is_some() => Answer::TransactionState,
            Ok(p) => {
                p.txn = Some(ModelTxn { deadline, staged: Vec::new() });
                Answer::Begun
            }
        }
    }

    fn stage(&mut self, index: usize, r: ProducerRef, message: NewMsg) -> Answer {
        let duplicate = message.id.as_deref().and_then(|id| self.duplicate(id));
        let p = match self.current(index, r) {
            Err(answer) => return answer,
            Ok(p) => p,
        };
        let Some(txn) = p.txn.as_mut() else { return Answer::TransactionState };
        if let Some((partition, seq)) = duplicate {
            return Answer::Published { partition, seq, duplicate: true };
        }
        if let Some(position) = txn.staged.iter().position(|s| s.id.is_some() && s.id == message.id) {
            return Answer::Staged { index: position as u32, duplicate: true };
        }
        txn.staged.push(message);
        Answer::Staged { index: txn.staged.len() as u32 - 1, duplicate: false }
    }

    fn replay(&self, index: usize, r: ProducerRef, commit: bool) -> Answer {
        let p = &self.producers[&index];
        let fenced = Answer::Fenced { current_epoch: p.epoch };
        if r.epoch + 1 != p.epoch {
            return fenced;
        }
        match (&p.last_end, commit) {
            (Some(End::Committed { epoch, answer }), true) if *epoch == r.epoch => answer.clone(),
            (Some(End::Committed { epoch, .. }), false) if *epoch == r.epoch => Answer::TransactionState,
            (Some(End::Aborted { epoch, fenced: false }), false) if *epoch == r.epoch => {
                Answer::Aborted { next_epoch: p.epoch }
            }
            (Some(End::Aborted { epoch, fenced: false }), true) if *epoch == r.epoch => Answer::TransactionAborted,
            _ => fenced,
        }
    }

    fn commit(&mut self, index: usize, r: ProducerRef) -> Answer {
        let Some(p) = self.producers.get(&index) else { return Answer::ProducerNotFound };
        if p.epoch != r.epoch {
            return self.replay(index, r, true);
        }
        let Some(txn) = self.producers.get_mut(&index).unwrap().txn.take() else { return Answer::TransactionState };
        let mut messages = Vec::new();
        for s in txn.staged {
            match self.append_lenient(s) {
                Answer::Published { partition, seq, duplicate } => messages.push((partition, seq, duplicate)),
                other => unreachable!("{other:?}"),
            }
        }
        let p = self.producers.get_mut(&index).unwrap();
        p.epoch += 1;
        let answer = Answer::Committed { messages, next_epoch: p.epoch };
        p.last_end = Some(End::Committed { epoch: r.epoch, answer: answer.clone() });
        answer
    }

    fn abort(&mut self, index: usize, r: ProducerRef) -> Answer {
        let Some(p) = self.producers.get(&index) else { return Answer::ProducerNotFound };
        if p.epoch != r.epoch {
            return self.replay(index, r, false);
        }
        let p = self.producers.get_mut(&index).unwrap();
        if p.txn.take().is_none() {
            return Answer::TransactionState;
        }
        p.last_end = Some(End::Aborted { epoch: p.epoch, fenced: false });
        p.epoch += 1;
        Answer::Aborted { next_epoch: p.epoch }
    }
}

// ----- driving both -----

fn setup(cell: &mut Cell) {
    // A cell quota no history reaches: the cell keeps its ledger of what it holds, which every step's snapshot check
    // (`stored_state_holds`) compares with one rebuilt from the streams.
    let quotas = cellog_core::quota::Quotas { max_bytes: Some(u64::MAX), ..Default::default() };
    cell.apply(Millis(0), Command::SetQuotas { tenant: None, quotas }).unwrap();
    let config = StreamConfig {
        partitions: N_PARTITIONS,
        max_messages: Some(MAX_MESSAGES as u64),
        max_age_ms: Some(MAX_AGE_MS),
        duplicate_window_ms: DUPLICATE_WINDOW_MS,
        ..StreamConfig::with_subjects(["s.>"])
    };
    cell.apply(Millis(0), Command::CreateStream { name: STREAM.to_string(), config }).unwrap();
    cell.drain_work().for_each(drop);
    cell.apply(Millis(0), Command::RegisterPeer { stream: STREAM.to_string(), peer: PEER.to_string() }).unwrap();
    cell.drain_work().for_each(drop);
    for (name, filter) in CONSUMERS {
        let config = ConsumerConfig {
            filter_subject: filter.map(str::to_string),
            ack_wait_ms: ACK_WAIT_MS,
            max_deliver: Some(MAX_DELIVER),
            max_in_flight: MAX_IN_FLIGHT as u32,
            ..ConsumerConfig::default()
        };
        cell.apply(Millis(0), Command::CreateConsumer { stream: STREAM.to_string(), name: name.to_string(), config })
            .unwrap();
        cell.drain_work().for_each(drop);
    }
}

fn publish_request(subject: &str, key: Option<u8>, id: Option<String>, payload: &[u8]) -> PublishRequest {
    PublishRequest {
        key: key.map(|k| Bytes::copy_from_slice(&[k])),
        msg_id: id,
        ..PublishRequest::new(subject, Bytes::copy_from_slice(payload))
    }
}

/// Runs one step on both sides and returns (cell's answer, model's answer).
fn step(cell: &mut Cell, model: &mut Model, op: &Op, counter: &mut u64) -> (Answer, Answer) {
    if let Op::Advance(ms) = op {
        model.now += ms;
        return (Answer::Ticked, Answer::Ticked);
    }
    model.expire();
    let at = Millis(model.now);
    *counter += 1;
    let payload = counter.to_le_bytes().to_vec();
    match *op {
        Op::Advance(_) => unreachable!(),
        Op::Tick => (answer_of(cell.apply(at, Command::Tick)), Answer::Ticked),
        Op::Publish { subject, key, id, ttl, delay } => {
            let id = id.map(|i| format!("id-{i}"));
            let (ttl, delay) = (ttl.map(|n| n * STEP_MS), delay.map(|n| n * STEP_MS));
            let request = PublishRequest {
                ttl_ms: ttl,
                deliver_after_ms: delay,
                ..publish_request(SUBJECTS[subject], key, id.clone(), &payload)
            };
            let expected = model.append(NewMsg { subject: SUBJECTS[subject], key, id, payload, ttl, delay });
            (answer_of(cell.apply(at, Command::Publish(request))), expected)
        }
        Op::Fetch { consumer, max } => {
            let command = Command::Fetch {
                stream: STREAM.to_string(),
                consumer: CONSUMERS[consumer].0.to_string(),
                member: "m".to_string(),
                max,
            };
            let answer = answer_of(cell.apply(at, command));
            (answer, model.fetch(consumer, max))
        }
        Op::Ack { consumer, pick, kind } => {
            let (partition, seq) = model.ack_target(consumer, pick);
            let command = Command::Ack {
                stream: STREAM.to_string(),
                consumer: CONSUMERS[consumer].0.to_string(),
                partition,
                seq,
                kind,
            };
            (answer_of(cell.apply(at, command)), model.ack(consumer, partition, seq, kind))
        }
        Op::Acks { consumer, ref picks } => {
            let items: Vec<AckItem> = picks
                .iter()
                .map(|&(pick, kind)| {
                    let (partition, seq) = model.ack_target(consumer, pick);
                    AckItem { partition, seq, kind }
                })
                .collect();
            let expected = items.iter().map(|item| model.ack(consumer, item.partition, item.seq, item.kind)).collect();
            let command = Command::Acks {
                stream: STREAM.to_string(),
                consumer: CONSUMERS[consumer].0.to_string(),
                member: None,
                items,
            };
            (answer_of(cell.apply(at, command)), Answer::AckedEach(expected))
        }
        Op::Init { producer } => {
            let command = Command::InitProducer {
                transactional_id: PRODUCERS[producer].to_string(),
                transaction_timeout_ms: TRANSACTION_TIMEOUT_MS,
            };
            (answer_of(cell.apply(at, command)), model.init(producer))
        }
        Op::Begin { producer, stale } => {
            let r = model.producer_ref(producer, stale);
            (answer_of(cell.apply(at, Command::BeginTransaction(r))), model.begin(producer, r))
        }
        Op::Stage { producer, stale, subject, id } => {
            let r = model.producer_ref(producer, stale);
            let id = id.map(|i| format!("id-{i}"));
            let request = PublishRequest {
                transaction: Some(r),
                ..publish_request(SUBJECTS[subject], None, id.clone(), &payload)
            };
            let staged = NewMsg { subject: SUBJECTS[subject], key: None, id, payload, ttl: None, delay: None };
            (answer_of(cell.apply(at, Command::Publish(request))), model.stage(producer, r, staged))
        }
        Op::Commit { producer, stale } => {
            let r = model.producer_ref(producer, stale);
            (answer_of(cell.apply(at, Command::CommitTransaction(r))), model.commit(producer, r))
        }
        Op::Abort { producer, stale } => {
            let r = model.producer_ref(producer, stale);
            (answer_of(cell.apply(at, Command::AbortTransaction(r))), model.abort(producer, r))
        }
        Op::PeerProgress { partition, pick } => {
            let received = pick % model.next_seq[partition as usize];
            let command = Command::PeerProgress {
                stream: STREAM.to_string(),
                peer: PEER.to_string(),
                partition,
                received_seq: received,
            };
            (answer_of(cell.apply(at, command)), model.progress(partition, received))
        }
    }
}

/// The visible state of both sides must agree.
fn compare_state(cell: &Cell, bodies: &MemoryBodies, model: &Model) -> Result<(), TestCaseError> {
    for partition in 0..N_PARTITIONS {
        let stored: Vec<(u64, Vec<u8>)> = cell
            .read_from(STREAM, partition, 0, 1_000)
            .unwrap()
            .into_iter()
            .map(|r| match bodies.payload(&r) {
                Ok(bytes) => (r.seq, bytes.to_vec()),
                Err(reason) => (r.seq, format!("unreadable: {reason}").into_bytes()),
            })
            .collect();
        let mut expected: Vec<(u64, Vec<u8>)> =
            model.messages.iter().filter(|m| m.partition == partition).map(|m| (m.seq, m.payload.clone())).collect();
        expected.sort();
        prop_assert_eq!(stored, expected, "partition {} contents", partition);
        let info = cell.stream_info(STREAM).unwrap();
        prop_assert_eq!(info.partitions[partition as usize].high_watermark, model.next_seq[partition as usize] - 1);
    }
    for (index, (name, _)) in CONSUMERS.iter().enumerate() {
        let info = cell.consumer_info(STREAM, name, Millis(model.now)).unwrap();
        let consumer = &model.consumers[index];
        let pending = consumer.outstanding.values().filter(|s| matches!(s, Status::Pending { .. })).count();
        prop_assert_eq!(info.n_pending as usize, pending, "consumer {} pending", name);
        for partition in 0..N_PARTITIONS {
            let floor = consumer
                .outstanding
                .keys()
                .find(|(p, _)| *p == partition)
                .map_or(consumer.cursor[partition as usize], |(_, seq)| *seq);
            let lag = &info.partitions[partition as usize];
            prop_assert_eq!(lag.ack_floor, floor, "consumer {} partition {} ack floor", name, partition);
            prop_assert_eq!(lag.cursor, consumer.cursor[partition as usize], "consumer {} cursor", name);
            prop_assert_eq!(
                lag.n_outstanding as usize,
                consumer.outstanding.keys().filter(|(p, _)| *p == partition).count()
            );
        }
    }
    for (index, producer) in &model.producers {
        let info = cell.producer_info(producer.id).unwrap();
        prop_assert_eq!(info.epoch, producer.epoch, "producer {} epoch", index);
        prop_assert_eq!(info.open_transaction, producer.txn.as_ref().map(|t| t.staged.len() as u64));
    }
    Ok(())
}

/// Invariants of the cell on its own.
///
/// Limits and ages are the model's to compare: a lagging peer may hold the stream over them for a while.
fn check_invariants(cell: &Cell, now: u64) -> Result<(), TestCaseError> {
    let info = cell.stream_info(STREAM).unwrap();
    prop_assert_eq!(info.n_messages, info.partitions.iter().map(|p| p.n_messages).sum::<u64>());
    prop_assert_eq!(info.n_bytes, info.partitions.iter().map(|p| p.n_bytes).sum::<u64>());
    let mut seen_ids = std::collections::BTreeSet::new();
    for p in &info.partitions {
        prop_assert!(p.low_watermark <= p.high_watermark + 1);
        for record in cell.read_from(STREAM, p.partition, 0, 1_000).unwrap() {
            if let Some(id) = &record.msg_id {
                prop_assert!(seen_ids.insert(id.clone()), "message id {} stored twice", id);
            }
        }
    }
    for (name, _) in CONSUMERS {
        let consumer = cell.consumer_info(STREAM, name, Millis(now)).unwrap();
        prop_assert!(consumer.n_pending as usize <= MAX_IN_FLIGHT, "max_in_flight exceeded");
    }
    Ok(())
}

/// What the cell said a fetch would do, and the consumer before it.
struct Asked {
    name: &'static str,
    at: Millis,
    work: Work,
    before: ConsumerInfo,
}

/// Asks the cell what a fetch from the consumer would do at `now`, after the timers due by then fired (as the
/// leader's tick makes them in a node).
fn ask_work(cell: &mut Cell, bodies: &mut MemoryBodies, name: &'static str, now: u64) -> Asked {
    let at = Millis(now);
    cell.apply(at, Command::Tick).expect("a tick");
    cell.drain_work().for_each(|work| bodies.apply(&work));
    let (work, n_pending) = cell.consumer_work(STREAM, name).expect("the consumer exists");
    assert_eq!(n_pending, cell.consumer_info(STREAM, name, at).expect("the consumer exists").n_pending);
    Asked { name, at, work, before: cell.consumer_info(STREAM, name, at).expect("the consumer exists") }
}

impl Asked {
    /// A subscription proposes a fetch only as the cell says one would do something: a fetch it calls idle changes
    /// nothing (a cursor behind the first retained message may catch up with it, its lag the same), one that would
    /// only skip moves nothing but the cursors, and one that would deliver changes more.
    fn check(self, cell: &Cell, answer: &Answer) {
        let after = cell.consumer_info(STREAM, self.name, self.at).expect("the consumer exists");
        let without_positions = |info: &ConsumerInfo| {
            let mut info = info.clone();
            info.partitions.iter_mut().for_each(|p| (p.cursor, p.ack_floor) = (0, 0));
            info
        };
        let without_cursors = |info: &ConsumerInfo| {
            let mut info = without_positions(info);
            info.partitions.iter_mut().for_each(|p| p.lag = 0);
            (info.lag_total, info.lag_max) = (0, 0);
            info
        };
        let (work, before) = (self.work, &self.before);
        let what = format!("{work:?}, and the fetch answered {answer:?}: {before:?} -> {after:?}");
        match work {
            Work::None => assert_eq!(without_positions(before), without_positions(&after), "{what}"),
            Work::Skip => assert!(*before != after && without_cursors(before) == without_cursors(&after), "{what}"),
            Work::Deliver => assert!(without_cursors(before) != without_cursors(&after), "{what}"),
        }
    }
}

fn run(ops: &[Op]) -> Result<Cell, TestCaseError> {
    let mut bodies = MemoryBodies::default();
    let mut cell = Cell::new();
    setup(&mut cell);
    let mut model = Model::new();
    let mut counter = 0;
    for (index, op) in ops.iter().enumerate() {
        let asked = match op {
            Op::Fetch { consumer, .. } => Some(ask_work(&mut cell, &mut bodies, CONSUMERS[*consumer].0, model.now)),
            _ => None,
        };
        let (actual, expected) = step(&mut cell, &mut model, op, &mut counter);
        cell.drain_work().for_each(|work| bodies.apply(&work));
        if let Some(asked) = asked {
            asked.check(&cell, &actual);
        }
        prop_assert_eq!(actual, expected, "step {} {:?} at {}ms", index, op, model.now);
        compare_state(&cell, &bodies, &model)?;
        check_invariants(&cell, cell.last_at().0)?;
        common::stored_state_holds(&cell, &bodies).map_err(TestCaseError::fail)?;
    }
    Ok(cell)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn cell_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let first = run(&ops)?;
        // The same commands at the same times give the same state in a second cell.
        let second = run(&ops)?;
        prop_assert_eq!(first.digest(), second.digest());
    }
}
