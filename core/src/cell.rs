//! The cell: every stream, consumer and producer of one Raft group, and the single entry point that changes them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::body::BodyRef;
use crate::command::{
    AbortReason, AckKind, AckState, Command, Effect, Outcome, ProducerRef, PublishAck, PublishRequest, Record,
};
use crate::config::{ConsumerConfig, DeliverPolicy, MAX_DURATION_MS, RetentionPolicy, StreamConfig};
use crate::consumer::{Consumer, DeadLetter, Phase};
use crate::error::{NameKind, Quota, Rejection};
use crate::info::{
    ConsumerInfo, DeliveryInfo, DeliveryPhase, PartitionInfo, PartitionLag, PeerInfo, ProducerInfo, StreamInfo,
};
use crate::partition::Message;
use crate::route::Router;
use crate::stream::{Append, Incoming, RoomMode, Stream, Tally};
use crate::subject::{filters_overlap, validate_filter, validate_name, validate_subject};
use crate::time::Millis;
use crate::transaction::{
    MAX_TRANSACTION_BYTES, MAX_TRANSACTION_MESSAGES, Producer, Staged, Transaction, TransactionEnd, TransactionState,
};

/// The header that makes a message pin another: `STREAM/PARTITION/SEQ` of a stored message in another stream.
/// Retention, recall and stream deletion keep a pinned message until every message pinning it is gone (removed by
/// its own stream's retention, or its stream deleted). Removals by age and by limits go oldest first and stop at a
/// pinned message, as they stop at a registered peer's watermark. Provenance rows pin the envelopes they describe.
pub const PIN_HEADER: &str = "Cellog-Pin";

/// A stored message: (stream, partition, seq).
type MessageRef = (Arc<str>, u32, u64);

/// Most streams in a cell.
pub const MAX_STREAMS: usize = 10_000;
/// Most consumers on one stream.
pub const MAX_CONSUMERS_PER_STREAM: usize = 1024;
/// Most registered peers on one stream.
pub const MAX_PEERS_PER_STREAM: usize = 64;
/// Most messages one fetch may ask for.
pub const MAX_FETCH: u32 = 10_000;
/// Longest message id or transactional id, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Most header bytes (names plus values) on one message.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most records one read returns.
pub const MAX_READ: usize = 10_000;

/// A timer in the cell's queue. Each is checked against current state when it fires, so a timer whose reason went
/// away (an ack, a commit, a deleted stream) fires as a no-op instead of being searched for and removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Timer {
    /// The stream's dedup window, TTLs and max age.
    Sweep { stream_id: u64 },
    /// An ack deadline or the end of a delay for one outstanding message.
    Delivery { stream_id: u64, consumer_id: u64, partition: u32, seq: u64 },
    /// A transaction's timeout.
    Transaction { producer_id: u64, number: u64 },
}

/// The timer queue: ordered by due time, ties by the order they were set in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Timers {
    queue: BTreeMap<(Millis, u64), Timer>,
    next_number: u64,
}

impl Timers {
    fn set(&mut self, due: Millis, timer: Timer) {
        self.queue.insert((due, self.next_number), timer);
        self.next_number += 1;
    }
}

/// Sets a stream's sweep timer to its next deadline, if that changed. Every sweep at `at` handles everything due by
/// then, so the next deadline is later; the clamp only guards that.
fn reschedule_sweep(stream: &mut Stream, timers: &mut Timers, at: Millis) {
    let next = stream.next_sweep().map(|due| due.max(at.plus(1)));
    if next != stream.sweep_at {
        stream.sweep_at = next;
        if let Some(due) = next {
            timers.set(due, Timer::Sweep { stream_id: stream.id });
        }
    }
}

/// Gives a new body the cell's next body key, and asks the host to store it.
fn store_body(effects: &mut Vec<Effect>, next_body: &mut u64, payload: Bytes) -> BodyRef {
    let body = BodyRef::of(*next_body, &payload);
    *next_body += 1;
    effects.push(Effect::BodyStored { key: body.key, body: payload });
    body
}

/// Appends a message whose body is stored (`request.payload` is not looked at), and keeps the stream's sweep timer
/// right: after an append the next sweep can only move earlier through the new message itself (its TTL, its dedup
/// window, or its age when it is the first of its partition).
fn append_message(
    stream: &mut Stream,
    timers: &mut Timers,
    effects: &mut Vec<Effect>,
    partition: u32,
    request: PublishRequest,
    body: BodyRef,
    at: Millis,
) -> u64 {
    let was_empty = stream.partitions[partition as usize].n_messages == 0;
    let window = stream.config.duplicate_window_ms;
    let mut candidate = request.ttl_ms.map(|ttl| at.plus(ttl));
    if request.msg_id.is_some() && window > 0 {
        candidate = Some(candidate.map_or(at.plus(window), |c| c.min(at.plus(window))));
    }
    if let Some(age) = stream.config.max_age_ms.filter(|_| was_empty) {
        candidate = Some(candidate.map_or(at.plus(age), |c| c.min(at.plus(age))));
    }
    let message = Append {
        partition,
        subject: &request.subject,
        body,
        key: request.key,
        msg_id: request.msg_id.as_deref(),
        headers: request.headers,
        ttl_ms: request.ttl_ms,
        deliver_after_ms: request.deliver_after_ms,
    };
    let seq = stream.append(message, at, effects);
    if let Some(candidate) = candidate {
        match stream.sweep_at {
            None => reschedule_sweep(stream, timers, at),
            Some(current) if candidate < current => {
                stream.sweep_at = Some(candidate);
                timers.set(candidate, Timer::Sweep { stream_id: stream.id });
            }
            Some(_) => {}
        }
    }
    seq
}

/// The replicated state machine of one cell.
///
/// # Driving it
/// The host (the Raft state-machine adapter, a test, a simulation) owns a `Cell` and:
/// 1. applies every committed command in log order with [`Cell::apply`], passing the time the leader stamped on it
///    (`max(previous stamp, leader clock)`); the outcome goes back to whoever proposed the command;
/// 2. drains [`Cell::drain_effects`] after each apply (before the next: `apply` asserts it), stores, copies and
///    releases bodies as the body effects say, in the same storage batch as the entry, and traces the rest;
/// 3. watches [`Cell::next_deadline`]: once the leader's clock passes it, the leader proposes [`Command::Tick`].
///
/// Every command first fires the timers due at its time, so the state is a pure function of the sequence of
/// `(at, command)` pairs: replicas that apply the same log hold the same state ([`Cell::digest`] compares them).
///
/// The cell reads no clock, spawns nothing, draws no random numbers and does no IO; it holds no body bytes once
/// `apply` returns (see [`crate::body`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    last_at: Millis,
    n_applied: u64,
    streams: BTreeMap<Arc<str>, Stream>,
    stream_names: BTreeMap<u64, Arc<str>>,
    next_stream_id: u64,
    producers: BTreeMap<u64, Producer>,
    transactional_ids: BTreeMap<Arc<str>, u64>,
    next_producer_id: u64,
    timers: Timers,
    /// Pinning messages and the message each pins. See [`PIN_HEADER`].
    pinned_by: BTreeMap<MessageRef, MessageRef>,
    /// The key the next stored body gets (see [`crate::body`]).
    next_body: u64,
    /// Which stream claims a subject: derived from the streams' configs, not encoded, rebuilt on decode.
    #[serde(skip)]
    router: Router,
    /// Transient: not part of the state, not in snapshots, not compared.
    #[serde(skip)]
    effects: Vec<Effect>,
}

impl Default for Cell {
    fn default() -> Self {
        Cell::new()
    }
}

fn invalid(reason: impl Into<String>) -> Rejection {
    Rejection::Invalid { reason: reason.into() }
}

fn check_name(kind: NameKind, name: &str) -> Result<(), Rejection> {
    validate_name(name).map_err(|reason| Rejection::InvalidName { kind, name: name.to_string(), reason })
}

fn check_id(kind: NameKind, id: &str) -> Result<(), Rejection> {
    let reason = if id.is_empty() {
        Some("is empty".to_string())
    } else if id.len() > MAX_ID_BYTES {
        Some(format!("is {} bytes long; the limit is {MAX_ID_BYTES}", id.len()))
    } else {
        id.chars().find(|c| c.is_control()).map(|c| format!("contains the control character {c:?}"))
    };
    match reason {
        Some(reason) => Err(Rejection::InvalidName { kind, name: id.to_string(), reason }),
        None => Ok(()),
    }
}

fn check_duration(what: &str, value: u64) -> Result<(), Rejection> {
    if value > MAX_DURATION_MS {
        return Err(invalid(format!("{what} of {value} ms exceeds the limit of {MAX_DURATION_MS} ms")));
    }
    Ok(())
}

/// Checks everything about a publish that needs no state.
fn check_request(request: &PublishRequest) -> Result<(), Rejection> {
    validate_subject(&request.subject)
        .map_err(|reason| Rejection::InvalidSubject { subject: request.subject.clone(), reason })?;
    if let Some(msg_id) = &request.msg_id {
        check_id(NameKind::MessageId, msg_id)?;
    }
    let mut header_bytes = 0usize;
    for (name, value) in &request.headers {
        if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace() || c == ':') {
            return Err(Rejection::InvalidName {
                kind: NameKind::Header,
                name: name.clone(),
                reason: "must be non-empty, without whitespace, control characters or ':'".to_string(),
            });
        }
        header_bytes += name.len() + value.len();
    }
    if header_bytes > MAX_HEADER_BYTES {
        return Err(invalid(format!("headers take {header_bytes} bytes; the limit is {MAX_HEADER_BYTES}")));
    }
    if request.ttl_ms == Some(0) {
        return Err(invalid("ttl_ms must be at least 1 when set"));
    }
    check_duration("ttl_ms", request.ttl_ms.unwrap_or(0))?;
    check_duration("deliver_after_ms", request.deliver_after_ms.unwrap_or(0))?;
    Ok(())
}

fn stream_in<'a>(streams: &'a mut BTreeMap<Arc<str>, Stream>, name: &str) -> Result<&'a mut Stream, Rejection> {
    streams.get_mut(name).ok_or_else(|| Rejection::StreamNotFound { stream: name.to_string() })
}

/// Takes one pin off `target`; when it was the last, names the target's stream in `released` (retention may now take
/// the message).
fn unpin(streams: &mut BTreeMap<Arc<str>, Stream>, target: MessageRef, released: &mut BTreeSet<Arc<str>>) {
    let (stream, partition, seq) = target;
    if let Some(target_stream) = streams.get_mut(&stream)
        && let Some(count) = target_stream.pins.get_mut(&(partition, seq))
    {
        *count -= 1;
        if *count == 0 {
            target_stream.pins.remove(&(partition, seq));
            released.insert(stream);
        }
    }
}

/// Looks up a producer and checks its epoch.
fn current_producer(producers: &mut BTreeMap<u64, Producer>, r: ProducerRef) -> Result<&mut Producer, Rejection> {
    let producer =
        producers.get_mut(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
    #[cfg(madsim)]
    if cellog_planted::active(cellog_planted::Mutant::EpochOffByOne) && r.epoch.checked_add(1) == Some(producer.epoch) {
        return Ok(producer);
    }
    if producer.epoch != r.epoch || producer.epoch == u32::MAX {
        return Err(Rejection::Fenced { current_epoch: producer.epoch });
    }
    Ok(producer)
}

/// Ends the producer's open transaction as aborted and moves it to its next epoch.
fn abort_transaction(
    producer_id: u64,
    producer: &mut Producer,
    reason: AbortReason,
    detail: String,
    effects: &mut Vec<Effect>,
) {
    if producer.transaction.take().is_some() {
        effects.push(Effect::TransactionAborted { producer_id, epoch: producer.epoch, reason });
        producer.last_end = Some(TransactionEnd::Aborted { epoch: producer.epoch, reason, detail });
        producer.epoch = producer.epoch.saturating_add(1);
    }
}

impl Cell {
    /// An empty cell.
    pub fn new() -> Self {
        Cell {
            last_at: Millis::ZERO,
            n_applied: 0,
            streams: BTreeMap::new(),
            stream_names: BTreeMap::new(),
            next_stream_id: 1,
            producers: BTreeMap::new(),
            transactional_ids: BTreeMap::new(),
            next_producer_id: 1,
            timers: Timers::default(),
            pinned_by: BTreeMap::new(),
            next_body: 1,
            router: Router::default(),
            effects: Vec::new(),
        }
    }

    /// Rebuilds what is derived from the state and not encoded (the subject router), after decoding.
    pub(crate) fn rebuild_derived(&mut self) {
        let mut router = Router::default();
        for (name, stream) in &self.streams {
            for filter in &stream.config.subjects {
                router.insert(filter, name);
            }
        }
        self.router = router;
    }

    /// Every stored body the state refers to, in key order (recalled messages have none).
    pub fn body_refs(&self) -> Vec<BodyRef> {
        let mut refs: Vec<BodyRef> = self
            .streams
            .values()
            .flat_map(|stream| stream.partitions.iter())
            .flat_map(|partition| partition.slots.iter().flatten())
            .filter(|message| message.recalled_at().is_none())
            .map(|message| message.body)
            .collect();
        refs.sort_by_key(|body| body.key);
        refs
    }

    // ----- getters -----

    /// The time of the last applied command.
    pub fn last_at(&self) -> Millis {
        self.last_at
    }

    /// How many commands have been applied (accepted or refused).
    pub fn n_applied(&self) -> u64 {
        self.n_applied
    }

    /// When the next timer is due; the leader proposes a `Tick` once its clock passes it.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.timers.queue.keys().next().map(|(due, _)| *due)
    }

    /// Names of all streams, in order.
    pub fn stream_names(&self) -> Vec<Arc<str>> {
        self.streams.keys().cloned().collect()
    }

    fn stream(&self, name: &str) -> Result<&Stream, Rejection> {
        self.streams.get(name).ok_or_else(|| Rejection::StreamNotFound { stream: name.to_string() })
    }

    /// A stream's config, watermarks and sizes.
    pub fn stream_info(&self, name: &str) -> Result<StreamInfo, Rejection> {
        let stream = self.stream(name)?;
        Ok(StreamInfo {
            name: stream.name.clone(),
            config: stream.config.clone(),
            created_at: stream.created_at,
            n_messages: stream.n_messages,
            n_bytes: stream.n_bytes,
            n_subjects: stream.subjects.len() as u64,
            n_dedup_ids: stream.dedup.len() as u64,
            partitions: stream
                .partitions
                .iter()
                .enumerate()
                .map(|(index, partition)| PartitionInfo {
                    partition: index as u32,
                    low_watermark: partition.first_seq,
                    high_watermark: partition.last_seq(),
                    n_messages: partition.n_messages,
                    n_bytes: partition.n_bytes,
                })
                .collect(),
            consumers: stream.consumers.keys().cloned().collect(),
            peers: stream
                .peers
                .iter()
                .map(|(name, received)| PeerInfo { name: name.clone(), received: received.clone() })
                .collect(),
        })
    }

    /// A consumer's positions, lag and oldest unacknowledged age as of `now`.
    pub fn consumer_info(&self, stream: &str, consumer: &str, now: Millis) -> Result<ConsumerInfo, Rejection> {
        let stream = self.stream(stream)?;
        let c = stream.consumers.get(consumer).ok_or_else(|| Rejection::ConsumerNotFound {
            stream: stream.name.to_string(),
            consumer: consumer.to_string(),
        })?;
        let mut partitions = Vec::with_capacity(stream.partitions.len());
        let mut oldest: Option<Millis> = None;
        for (index, log) in stream.partitions.iter().enumerate() {
            let partition = index as u32;
            let ack_floor = c.ack_floor(partition);
            let from = ack_floor.max(log.first_seq);
            let lag = log.next_seq().saturating_sub(from);
            let n_outstanding = c.outstanding.range((partition, 0)..=(partition, u64::MAX)).count() as u64;
            // The oldest message not yet done: the first retained, matching message at or after the ack floor.
            let oldest_here = (from..log.next_seq())
                .take(crate::consumer::FETCH_SCAN_LIMIT)
                .filter_map(|seq| log.get(seq).map(|message| (seq, message)))
                .find(|(seq, message)| c.matches(&message.subject) && !c.is_done(partition, *seq))
                .map(|(_, message)| message.stored_at);
            oldest = match (oldest, oldest_here) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            partitions.push(PartitionLag { partition, cursor: c.cursors[index], ack_floor, lag, n_outstanding });
        }
        Ok(ConsumerInfo {
            name: c.name.clone(),
            config: c.config.clone(),
            created_at: c.created_at,
            lag_total: partitions.iter().map(|p| p.lag).sum(),
            lag_max: partitions.iter().map(|p| p.lag).max().unwrap_or(0),
            partitions,
            n_pending: c.n_pending,
            n_ready: c.ready.len() as u64,
            oldest_unacked_age_ms: oldest.map_or(0, |stored_at| now.since(stored_at)),
            n_delivered: c.n_delivered,
            n_redelivered: c.n_redelivered,
            n_acked: c.n_acked,
            n_dead_lettered: c.n_dead_lettered,
        })
    }

    /// A consumer's outstanding deliveries, in (partition, sequence) order, at most `max`.
    pub fn deliveries(&self, stream: &str, consumer: &str, max: usize) -> Result<Vec<DeliveryInfo>, Rejection> {
        let s = self.stream(stream)?;
        let c = s.consumers.get(consumer).ok_or_else(|| Rejection::ConsumerNotFound {
            stream: stream.to_string(),
            consumer: consumer.to_string(),
        })?;
        Ok(c.outstanding
            .iter()
            .take(max.min(MAX_READ))
            .map(|(&(partition, seq), entry)| DeliveryInfo {
                partition,
                seq,
                delivery_count: entry.delivery_count,
                state: entry.state,
                member: entry.member.clone(),
                phase: match entry.phase {
                    Phase::Pending { deadline } => DeliveryPhase::Pending { ack_deadline: deadline },
                    Phase::Ready => DeliveryPhase::Ready,
                    Phase::Waiting { until } => DeliveryPhase::Waiting { until },
                },
            })
            .collect())
    }

    /// One retained message (a recalled one reads as its tombstone).
    pub fn read(&self, stream: &str, partition: u32, seq: u64) -> Result<Record, Rejection> {
        let s = self.stream(stream)?;
        s.record(partition, seq).ok_or_else(|| Rejection::MessageNotFound {
            stream: stream.to_string(),
            partition,
            seq,
        })
    }

    /// Up to `max` retained messages of a partition from sequence `from` on, skipping removed ones.
    pub fn read_from(&self, stream: &str, partition: u32, from: u64, max: usize) -> Result<Vec<Record>, Rejection> {
        let s = self.stream(stream)?;
        let log = s
            .partitions
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?;
        Ok((from.max(log.first_seq)..log.next_seq())
            .filter_map(|seq| log.get(seq).map(|message| message.record(partition, seq)))
            .take(max.min(MAX_READ))
            .collect())
    }

    /// The newest retained message on a subject (for newest-wins, key-value use).
    pub fn last_for_subject(&self, stream: &str, subject: &str) -> Result<Record, Rejection> {
        let s = self.stream(stream)?;
        let not_found = || Rejection::MessageNotFound { stream: stream.to_string(), partition: 0, seq: 0 };
        let &(partition, seq) = s.subjects.get(subject).and_then(|state| state.order.back()).ok_or_else(not_found)?;
        s.record(partition, seq).ok_or_else(not_found)
    }

    /// A transactional producer.
    pub fn producer_info(&self, producer_id: u64) -> Option<ProducerInfo> {
        self.producers.get(&producer_id).map(|p| ProducerInfo {
            producer_id,
            transactional_id: p.transactional_id.clone(),
            epoch: p.epoch,
            open_transaction: p.transaction.as_ref().map(|t| t.staged.len() as u64),
            prepared: p.transaction.as_ref().is_some_and(|t| t.state == TransactionState::Prepared),
        })
    }

    /// Takes the effects queued by the commands applied so far.
    pub fn drain_effects(&mut self) -> std::vec::Drain<'_, Effect> {
        self.effects.drain(..)
    }

    // ----- the one way in -----

    /// This cell without its dedup indexes (a planted bug's snapshot).
    #[cfg(madsim)]
    pub(crate) fn without_dedup(&self) -> Cell {
        let mut cell = self.clone();
        for stream in cell.streams.values_mut() {
            stream.dedup.clear();
            stream.dedup_expiry.clear();
        }
        cell
    }

    /// Drops every consumer (a planted bug's snapshot install).
    #[cfg(madsim)]
    pub fn forget_consumers(&mut self) {
        for stream in self.streams.values_mut() {
            stream.consumers.clear();
        }
    }

    /// Applies one command at the leader-stamped time `at`. Timers due at `at` fire first. A rejection changes
    /// nothing the command asked for, with one exception: a refused commit aborts the transaction and moves the
    /// producer to its next epoch (the refusal says so). Timers that fired stay fired: they depend on time alone.
    ///
    /// # Panics
    /// If the effects of an earlier apply were not drained: a host that forgets them loses body writes.
    pub fn apply(&mut self, at: Millis, command: Command) -> Result<Outcome, Rejection> {
        assert!(
            self.effects.is_empty(),
            "the host must drain the effects of every apply before the next; {} are queued",
            self.effects.len()
        );
        // The leader stamps monotonic times; a replica clamps rather than trusting that, so state never sees time
        // go backwards.
        #[cfg(madsim)]
        let at = if cellog_planted::active(cellog_planted::Mutant::LeaderTimeNotMonotonic) {
            at
        } else {
            at.max(self.last_at)
        };
        #[cfg(not(madsim))]
        let at = at.max(self.last_at);
        self.last_at = at;
        self.n_applied += 1;
        self.fire_timers(at);
        let result = match command {
            Command::CreateStream { name, config } => self.create_stream(at, name, config),
            Command::UpdateStream { name, config } => self.update_stream(at, &name, config),
            Command::DeleteStream { name } => self.delete_stream(at, &name),
            Command::Publish(request) => self.publish(at, request),
            Command::Recall { stream, partition, seq } => self.recall(at, &stream, partition, seq),
            Command::CreateConsumer { stream, name, config } => self.create_consumer(at, &stream, name, config),
            Command::DeleteConsumer { stream, name } => self.delete_consumer(&stream, &name),
            Command::Fetch { stream, consumer, member, max } => self.fetch(at, &stream, &consumer, &member, max),
            Command::Ack { stream, consumer, partition, seq, kind } => {
                self.ack(at, &stream, &consumer, partition, seq, kind)
            }
            Command::CommitCursor { stream, consumer, partition, next_seq } => {
                self.commit_cursor(&stream, &consumer, partition, next_seq)
            }
            Command::InitProducer { transactional_id, transaction_timeout_ms } => {
                self.init_producer(transactional_id, transaction_timeout_ms)
            }
            Command::BeginTransaction(r) => self.begin_transaction(at, r),
            Command::PrepareTransaction(r) => self.prepare_transaction(r),
            Command::CommitTransaction(r) => self.commit_transaction(at, r),
            Command::AbortTransaction(r) => self.abort_transaction(r),
            Command::RegisterPeer { stream, peer } => self.register_peer(&stream, peer),
            Command::PeerProgress { stream, peer, partition, received_seq } => {
                self.peer_progress(at, &stream, &peer, partition, received_seq)
            }
            Command::UnregisterPeer { stream, peer } => self.unregister_peer(at, &stream, &peer),
            Command::Tick => Ok(Outcome::Ticked),
            Command::UpdateConsumer { stream, name, config } => self.update_consumer(&stream, &name, config),
        };
        if !self.pinned_by.is_empty() {
            self.release_pins(at, 0);
        }
        result
    }

    // ----- pins -----

    /// The message a publish pins, checked: its header names a stored message of another stream.
    fn check_pin(&self, request: &PublishRequest) -> Result<Option<MessageRef>, Rejection> {
        let Some(value) = request.headers.get(PIN_HEADER) else { return Ok(None) };
        let bad = || invalid(format!("{PIN_HEADER} {value:?}: expected STREAM/PARTITION/SEQ of a stored message"));
        let mut parts = value.split('/');
        let (Some(name), Some(partition), Some(seq), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (Ok(partition), Ok(seq)) = (partition.parse::<u32>(), seq.parse::<u64>()) else { return Err(bad()) };
        let target = self.stream(name)?;
        if request.transaction.is_some() {
            return Err(invalid(format!("a message with {PIN_HEADER} cannot be published in a transaction")));
        }
        if target.message(partition, seq).is_none() {
            return Err(Rejection::MessageNotFound { stream: name.to_string(), partition, seq });
        }
        Ok(Some((target.name.clone(), partition, seq)))
    }

    /// Releases what removed pinning messages pinned (every removal since effect `from` is looked at), and lets
    /// retention take what it may now, which can remove further pinning messages in turn.
    fn release_pins(&mut self, at: Millis, mut from: usize) {
        while from < self.effects.len() {
            let end = self.effects.len();
            let mut released: BTreeSet<Arc<str>> = BTreeSet::new();
            for effect in &self.effects[from..end] {
                let Effect::Removed { stream, partition, seq, .. } = effect else { continue };
                if let Some(target) = self.pinned_by.remove(&(stream.clone(), *partition, *seq)) {
                    unpin(&mut self.streams, target, &mut released);
                }
            }
            from = end;
            for name in released {
                self.enforce_retention(at, &name, None);
            }
        }
    }

    // ----- timers -----

    fn fire_timers(&mut self, at: Millis) {
        // Every handler only sets timers later than `at`, so this loop ends; the bound is the queue's length.
        while let Some(entry) = self.timers.queue.first_entry() {
            if entry.key().0 > at {
                break;
            }
            let ((due, _), timer) = entry.remove_entry();
            match timer {
                Timer::Sweep { stream_id } => self.fire_sweep(at, due, stream_id),
                Timer::Delivery { stream_id, consumer_id, partition, seq } => {
                    self.fire_delivery(at, due, stream_id, consumer_id, partition, seq)
                }
                Timer::Transaction { producer_id, number } => self.fire_transaction_timeout(producer_id, number),
            }
        }
    }

    fn fire_sweep(&mut self, at: Millis, due: Millis, stream_id: u64) {
        let Some(name) = self.stream_names.get(&stream_id).cloned() else { return };
        let stream = self.streams.get_mut(&name).expect("stream_names and streams agree");
        if stream.sweep_at != Some(due) {
            return;
        }
        stream.sweep_at = None;
        stream.sweep(at, &mut self.effects);
        reschedule_sweep(stream, &mut self.timers, at);
    }

    fn fire_delivery(&mut self, at: Millis, due: Millis, stream_id: u64, consumer_id: u64, partition: u32, seq: u64) {
        let Some(name) = self.stream_names.get(&stream_id).cloned() else { return };
        let stream = self.streams.get_mut(&name).expect("stream_names and streams agree");
        let Some(consumer) = stream.consumers.values_mut().find(|c| c.id == consumer_id) else { return };
        let Some(entry) = consumer.outstanding.get(&(partition, seq)) else { return };
        let mut letters = Vec::new();
        match entry.phase {
            Phase::Pending { deadline } if deadline == due => {
                let delivery_count = entry.delivery_count;
                self.effects.push(Effect::DeliveryExpired {
                    stream: name.clone(),
                    consumer: consumer.name.clone(),
                    partition,
                    seq,
                    delivery_count,
                });
                if consumer.exhausted(delivery_count) {
                    letters.extend(consumer.dead_letter(partition, seq, "max_deliver"));
                } else {
                    consumer.set_phase(partition, seq, Phase::Ready);
                }
            }
            Phase::Waiting { until } if until == due => consumer.set_phase(partition, seq, Phase::Ready),
            _ => {}
        }
        self.bury(at, &name, letters);
    }

    fn fire_transaction_timeout(&mut self, producer_id: u64, number: u64) {
        let Some(producer) = self.producers.get_mut(&producer_id) else { return };
        if producer.transaction.as_ref().is_some_and(|t| t.number == number) {
            let detail = format!("open for longer than its timeout of {} ms", producer.timeout_ms);
            abort_transaction(producer_id, producer, AbortReason::Timeout, detail, &mut self.effects);
        }
    }

    // ----- streams -----

    fn check_stream_config(&self, name: &str, config: &StreamConfig) -> Result<(), Rejection> {
        config.validate()?;
        // The overlap named is the first in (other stream's name, this config's filter, the other's filter) order,
        // found through the router rather than by comparing with every filter of every stream.
        // ((other stream, this filter's index, the other filter's index), this filter, the other filter)
        type Overlap<'a> = ((&'a Arc<str>, usize, usize), &'a String, &'a Arc<str>);
        let mut first: Option<Overlap<'_>> = None;
        for (index, subject) in config.subjects.iter().enumerate() {
            for (other_name, existing) in self.router.overlapping(subject) {
                if &**other_name == name {
                    continue;
                }
                let theirs = self.streams.get(other_name).map_or(&[][..], |other| &other.config.subjects[..]);
                let position = theirs.iter().position(|f| **f == **existing).unwrap_or(usize::MAX);
                let order = (other_name, index, position);
                if first.is_none_or(|(seen, ..)| order < seen) {
                    first = Some((order, subject, existing));
                }
            }
        }
        if let Some(((other_name, ..), subject, existing)) = first {
            return Err(Rejection::SubjectOverlap {
                subject: subject.clone(),
                other: existing.to_string(),
                owner: format!("stream {other_name:?}"),
            });
        }
        if let Some(dead_letter) = &config.dead_letter_stream {
            if dead_letter == name {
                return Err(Rejection::InvalidConfig {
                    reason: "a stream cannot be its own dead-letter stream".to_string(),
                });
            }
            self.stream(dead_letter)?;
        }
        Ok(())
    }

    fn create_stream(&mut self, at: Millis, name: String, config: StreamConfig) -> Result<Outcome, Rejection> {
        check_name(NameKind::Stream, &name)?;
        if let Some(existing) = self.streams.get(name.as_str()) {
            if existing.config == config {
                return Ok(Outcome::StreamCreated { created: false });
            }
            return Err(Rejection::Conflict { what: "stream".to_string(), name });
        }
        self.check_stream_config(&name, &config)?;
        if self.streams.len() >= MAX_STREAMS {
            return Err(invalid(format!("a cell holds at most {MAX_STREAMS} streams")));
        }
        let id = self.next_stream_id;
        self.next_stream_id += 1;
        let name: Arc<str> = Arc::from(name);
        self.stream_names.insert(id, name.clone());
        for filter in &config.subjects {
            self.router.insert(filter, &name);
        }
        self.streams.insert(name.clone(), Stream::new(id, name, config, at));
        Ok(Outcome::StreamCreated { created: true })
    }

    fn update_stream(&mut self, at: Millis, name: &str, config: StreamConfig) -> Result<Outcome, Rejection> {
        let existing = self.stream(name)?;
        if existing.config.partitions != config.partitions {
            return Err(Rejection::InvalidConfig {
                reason: "partitions cannot change: keys would move to other partitions".to_string(),
            });
        }
        if existing.config.retention != config.retention {
            return Err(Rejection::InvalidConfig { reason: "the retention policy cannot change".to_string() });
        }
        self.check_stream_config(name, &config)?;
        let stream = stream_in(&mut self.streams, name)?;
        for filter in &stream.config.subjects {
            self.router.remove(filter);
        }
        for filter in &config.subjects {
            self.router.insert(filter, &stream.name);
        }
        stream.set_config(config, at);
        self.enforce_retention(at, name, None);
        Ok(Outcome::StreamUpdated)
    }

    fn delete_stream(&mut self, at: Millis, name: &str) -> Result<Outcome, Rejection> {
        self.stream(name)?;
        if let Some((user, _)) = self.streams.iter().find(|(_, s)| s.config.dead_letter_stream.as_deref() == Some(name))
        {
            return Err(Rejection::InUse {
                stream: name.to_string(),
                by: format!("it is the dead-letter stream of {user:?}"),
            });
        }
        if let Some((&(partition, seq), _)) = self.streams[name].pins.first_key_value() {
            let by = self.pinned_by.iter().find(|(_, target)| **target == (Arc::from(name), partition, seq));
            return Err(Rejection::InUse {
                stream: name.to_string(),
                by: match by {
                    Some(((stream, p, s), _)) => {
                        format!("its message {partition}/{seq} is pinned by {stream:?} {p}/{s}")
                    }
                    None => format!("its message {partition}/{seq} is pinned"),
                },
            });
        }
        let stream = self.streams.remove(name).expect("checked above");
        self.stream_names.remove(&stream.id);
        for filter in &stream.config.subjects {
            self.router.remove(filter);
        }
        for message in stream.partitions.iter().flat_map(|partition| partition.slots.iter().flatten()) {
            if message.recalled_at().is_none() {
                self.effects.push(Effect::BodyReleased { key: message.body.key });
            }
        }
        let mut released: BTreeSet<Arc<str>> = BTreeSet::new();
        let pinning: Vec<MessageRef> =
            self.pinned_by.keys().filter(|(stream, ..)| **stream == *name).cloned().collect();
        for key in pinning {
            let target = self.pinned_by.remove(&key).expect("listed above");
            unpin(&mut self.streams, target, &mut released);
        }
        self.effects.push(Effect::StreamDeleted { stream: stream.name });
        for target in released {
            self.enforce_retention(at, &target, None);
        }
        Ok(Outcome::StreamDeleted)
    }

    /// Removes whatever retention allows now: expired messages, limits exceeded while a peer held them back (or
    /// lowered by an update), and messages no consumer needs any more under interest retention.
    ///
    /// Interest retention is re-checked over `interest`: one partition's range of sequences, or (`None`) the whole
    /// stream. A peer's progress passes only the range it just received, so frequent progress reports stay cheap.
    fn enforce_retention(&mut self, at: Millis, name: &str, interest: Option<(u32, u64, u64)>) {
        let Some(stream) = self.streams.get_mut(name) else { return };
        stream.sweep(at, &mut self.effects);
        stream.release_held(&mut self.effects);
        stream.shrink_to_limits(&mut self.effects);
        match interest {
            Some((partition, from, to)) => stream.sweep_interest(partition, from, to, &mut self.effects),
            None => {
                for partition in 0..stream.config.partitions {
                    stream.sweep_interest(partition, 0, u64::MAX, &mut self.effects);
                }
            }
        }
        reschedule_sweep(stream, &mut self.timers, at);
    }

    /// The stream claiming a subject.
    fn route<'a>(
        router: &Router,
        streams: &'a mut BTreeMap<Arc<str>, Stream>,
        subject: &str,
    ) -> Result<&'a mut Stream, Rejection> {
        router
            .route(subject)
            .and_then(|name| streams.get_mut(name))
            .ok_or_else(|| Rejection::NoStreamForSubject { subject: subject.to_string() })
    }

    // ----- publishing -----

    fn publish(&mut self, at: Millis, mut request: PublishRequest) -> Result<Outcome, Rejection> {
        check_request(&request)?;
        let pin = self.check_pin(&request)?;
        let stream = Self::route(&self.router, &mut self.streams, &request.subject)?;
        if let Some((target, ..)) = &pin
            && *target == stream.name
        {
            return Err(invalid(format!("a message may not pin a message of its own stream {target:?}")));
        }
        if let Some(r) = request.transaction {
            let name = stream.name.clone();
            return self.stage(name, r, request, at);
        }
        let payload_len = request.payload.len() as u64;
        if payload_len > u64::from(stream.config.max_payload_bytes) {
            return Err(Rejection::PayloadTooLarge { size: payload_len, max: stream.config.max_payload_bytes.into() });
        }
        if let Some(msg_id) = &request.msg_id
            && let Some(ack) = stream.duplicate_of(msg_id)
        {
            return Ok(Outcome::Published(ack));
        }
        let partition = stream.partition_of(&request.subject, request.key.as_ref());
        if let Some(expected) = request.expected_last_seq {
            let last = stream.partitions[partition as usize].last_seq();
            if expected != last {
                return Err(Rejection::WrongLastSequence { last });
            }
        }
        if let Some(expected) = request.expected_last_subject_seq {
            let last = stream.last_subject_seq(&request.subject);
            if expected != last {
                return Err(Rejection::WrongLastSubjectSequence { last });
            }
        }
        let size =
            Message::accounted_size(&request.subject, request.key.as_ref(), &request.headers, request.payload.len());
        let incoming = Incoming { subject: &request.subject, size };
        stream.check_fits_at_all(&incoming)?;
        stream.check_discard_new(&incoming, &Tally::default())?;
        let plan = stream.plan_room(&incoming, RoomMode::Strict)?;
        // Last, so that a refused publish costs no token.
        stream.take_token(at)?;
        for (p, seq, reason) in plan {
            stream.remove(p, seq, reason, &mut self.effects);
        }
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::Canary)
            && request.msg_id.as_deref() == Some("m-0")
            && at.0 % 100 == 7
        {
            let seq = stream.partitions[partition as usize].last_seq() + 1;
            let stream = stream.name.clone();
            return Ok(Outcome::Published(PublishAck { stream, partition, seq, duplicate: false, original: None }));
        }
        let body = store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload));
        let seq = append_message(stream, &mut self.timers, &mut self.effects, partition, request, body, at);
        let name = stream.name.clone();
        if let Some((target, p, s)) = pin {
            *self.streams.get_mut(&target).expect("checked above").pins.entry((p, s)).or_insert(0) += 1;
            self.pinned_by.insert((name.clone(), partition, seq), (target, p, s));
        }
        Ok(Outcome::Published(PublishAck { stream: name, partition, seq, duplicate: false, original: None }))
    }

    /// Appends to a stream named by a message already checked against it: its payload, or (`copy_of`, for a dead
    /// letter) a copy of a stored body.
    fn append_message(
        &mut self,
        name: &str,
        partition: u32,
        mut request: PublishRequest,
        copy_of: Option<BodyRef>,
        at: Millis,
    ) -> u64 {
        let stream = self.streams.get_mut(name).expect("appending to an existing stream");
        let body = match copy_of {
            Some(source) => {
                let body = BodyRef { key: self.next_body, ..source };
                self.next_body += 1;
                self.effects.push(Effect::BodyCopied { from: source.key, to: body.key });
                body
            }
            None => store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload)),
        };
        append_message(stream, &mut self.timers, &mut self.effects, partition, request, body, at)
    }

    fn recall(&mut self, _at: Millis, stream: &str, partition: u32, seq: u64) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if s.recall(partition, seq, _at, &mut self.effects)? {
            self.effects.push(Effect::Recalled { stream: s.name.clone(), partition, seq });
        }
        Ok(Outcome::Recalled)
    }

    // ----- transactions -----

    fn init_producer(&mut self, transactional_id: String, timeout_ms: u64) -> Result<Outcome, Rejection> {
        check_id(NameKind::TransactionalId, &transactional_id)?;
        if timeout_ms == 0 || timeout_ms > MAX_DURATION_MS {
            return Err(invalid(format!("transaction_timeout_ms must be between 1 and {MAX_DURATION_MS}")));
        }
        if let Some(&producer_id) = self.transactional_ids.get(transactional_id.as_str()) {
            let producer = self.producers.get_mut(&producer_id).expect("transactional_ids and producers agree");
            abort_transaction(
                producer_id,
                producer,
                AbortReason::Fenced,
                "a newer instance of the producer was initialized".to_string(),
                &mut self.effects,
            );
            if producer.epoch < u32::MAX - 1 {
                producer.epoch += 1;
                producer.timeout_ms = timeout_ms;
                return Ok(Outcome::ProducerInitialized(ProducerRef { producer_id, epoch: producer.epoch }));
            }
            // Epochs are exhausted: retire the id (its instances are fenced for good) and start a new one.
            self.producers.remove(&producer_id);
        }
        let producer_id = self.next_producer_id;
        self.next_producer_id += 1;
        let transactional_id: Arc<str> = Arc::from(transactional_id);
        self.transactional_ids.insert(transactional_id.clone(), producer_id);
        self.producers.insert(
            producer_id,
            Producer {
                transactional_id,
                epoch: 0,
                timeout_ms,
                transaction: None,
                next_transaction_number: 0,
                last_end: None,
            },
        );
        Ok(Outcome::ProducerInitialized(ProducerRef { producer_id, epoch: 0 }))
    }

    fn begin_transaction(&mut self, at: Millis, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer = current_producer(&mut self.producers, r)?;
        if producer.transaction.is_some() {
            return Err(Rejection::TransactionState { reason: "a transaction is already open".to_string() });
        }
        let number = producer.next_transaction_number;
        producer.next_transaction_number += 1;
        let deadline = at.plus(producer.timeout_ms);
        producer.transaction = Some(Transaction {
            number,
            state: TransactionState::Open,
            begun_at: at,
            deadline,
            staged: Vec::new(),
            staged_bytes: 0,
        });
        self.timers.set(deadline, Timer::Transaction { producer_id: r.producer_id, number });
        Ok(Outcome::TransactionBegun)
    }

    fn stage(
        &mut self,
        name: Arc<str>,
        r: ProducerRef,
        request: PublishRequest,
        at: Millis,
    ) -> Result<Outcome, Rejection> {
        let producer = current_producer(&mut self.producers, r)?;
        let transaction = producer.transaction.as_mut().ok_or_else(|| Rejection::TransactionState {
            reason: "no open transaction; begin one first".to_string(),
        })?;
        if transaction.state == TransactionState::Prepared {
            return Err(Rejection::TransactionState {
                reason: "the transaction is prepared and accepts no more messages".to_string(),
            });
        }
        if request.expected_last_seq.is_some() || request.expected_last_subject_seq.is_some() {
            return Err(invalid("conditional append is not available inside a transaction"));
        }
        let stream = self.streams.get_mut(&name).expect("routed to an existing stream");
        let payload_len = request.payload.len() as u64;
        if payload_len > u64::from(stream.config.max_payload_bytes) {
            return Err(Rejection::PayloadTooLarge { size: payload_len, max: stream.config.max_payload_bytes.into() });
        }
        if let Some(msg_id) = &request.msg_id {
            if let Some(ack) = stream.duplicate_of(msg_id) {
                return Ok(Outcome::Published(ack));
            }
            if let Some(index) = transaction
                .staged
                .iter()
                .position(|s| s.stream == name && s.request.msg_id.as_deref() == Some(msg_id.as_str()))
            {
                return Ok(Outcome::Staged { index: index as u32, duplicate: true });
            }
        }
        let partition = stream.partition_of(&request.subject, request.key.as_ref());
        let size =
            Message::accounted_size(&request.subject, request.key.as_ref(), &request.headers, request.payload.len());
        stream.check_fits_at_all(&Incoming { subject: &request.subject, size })?;
        if transaction.staged.len() as u64 >= MAX_TRANSACTION_MESSAGES {
            return Err(Rejection::QuotaExceeded {
                quota: Quota::TransactionMessages,
                limit: MAX_TRANSACTION_MESSAGES,
            });
        }
        if transaction.staged_bytes + size > MAX_TRANSACTION_BYTES {
            return Err(Rejection::QuotaExceeded { quota: Quota::TransactionBytes, limit: MAX_TRANSACTION_BYTES });
        }
        stream.take_token(at)?;
        let index = transaction.staged.len() as u32;
        transaction.staged_bytes += size;
        transaction.staged.push(Staged {
            stream_id: stream.id,
            stream: name,
            partition,
            size,
            request: PublishRequest { transaction: None, ..request },
        });
        Ok(Outcome::Staged { index, duplicate: false })
    }

    /// Checks that every staged message can be appended now, all together: the streams exist and discard-new limits
    /// hold for the whole batch. Discard-old limits always make room (or wait for a peer without refusing).
    fn check_staged(&self, staged: &[Staged]) -> Result<(), Rejection> {
        let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
        for message in staged {
            let stream = self.stream(&message.stream)?;
            if stream.id != message.stream_id {
                // Deleted and created again since staging: not the stream the message was staged for.
                return Err(Rejection::StreamNotFound { stream: message.stream.to_string() });
            }
            if message.request.msg_id.as_deref().is_some_and(|id| stream.dedup.contains_key(id)) {
                continue;
            }
            let incoming = Incoming { subject: &message.request.subject, size: message.size };
            stream.check_fits_at_all(&incoming)?;
            let tally = tallies.entry(&message.stream).or_default();
            stream.check_discard_new(&incoming, tally)?;
            tally.n_messages += 1;
            tally.n_bytes += message.size;
            let subject = tally.subjects.entry(message.request.subject.clone()).or_default();
            subject.0 += 1;
            subject.1 += message.size;
        }
        Ok(())
    }

    fn prepare_transaction(&mut self, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer = current_producer(&mut self.producers, r)?;
        let transaction = producer
            .transaction
            .as_ref()
            .ok_or_else(|| Rejection::TransactionState { reason: "no open transaction".to_string() })?;
        if transaction.state == TransactionState::Open {
            let staged = transaction.staged.clone();
            self.check_staged(&staged)?;
        }
        let producer = self.producers.get_mut(&r.producer_id).expect("checked above");
        producer.transaction.as_mut().expect("checked above").state = TransactionState::Prepared;
        Ok(Outcome::TransactionPrepared)
    }

    /// The answer to a commit or abort whose epoch already ended: the same answer as the first time, so a retry after
    /// a lost response learns what happened. Anything else is fenced.
    fn replay_end(&self, r: ProducerRef, wants_commit: bool) -> Result<Outcome, Rejection> {
        let producer =
            self.producers.get(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
        let fenced = Rejection::Fenced { current_epoch: producer.epoch };
        if r.epoch.checked_add(1) != Some(producer.epoch) {
            return Err(fenced);
        }
        match (&producer.last_end, wants_commit) {
            (Some(TransactionEnd::Committed { epoch, outcome }), true) if *epoch == r.epoch => Ok(outcome.clone()),
            (Some(TransactionEnd::Committed { epoch, .. }), false) if *epoch == r.epoch => {
                Err(Rejection::TransactionState { reason: "the transaction was already committed".to_string() })
            }
            (Some(TransactionEnd::Aborted { epoch, reason, .. }), false)
                if *epoch == r.epoch && *reason != AbortReason::Fenced =>
            {
                Ok(Outcome::TransactionAborted {
                    next: ProducerRef { producer_id: r.producer_id, epoch: producer.epoch },
                })
            }
            (Some(TransactionEnd::Aborted { epoch, reason, detail }), true)
                if *epoch == r.epoch && *reason != AbortReason::Fenced =>
            {
                Err(Rejection::TransactionAborted { reason: detail.clone() })
            }
            _ => Err(fenced),
        }
    }

    fn commit_transaction(&mut self, at: Millis, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer =
            self.producers.get(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
        if producer.epoch != r.epoch {
            return self.replay_end(r, true);
        }
        let producer = current_producer(&mut self.producers, r)?;
        let transaction = producer
            .transaction
            .as_ref()
            .ok_or_else(|| Rejection::TransactionState { reason: "no open transaction".to_string() })?;
        let staged = transaction.staged.clone();
        if let Err(refusal) = self.check_staged(&staged) {
            let detail = format!("commit refused, nothing was appended: {refusal}");
            let producer = self.producers.get_mut(&r.producer_id).expect("checked above");
            abort_transaction(r.producer_id, producer, AbortReason::CommitRefused, detail.clone(), &mut self.effects);
            return Err(Rejection::TransactionAborted { reason: detail });
        }
        let mut acks = Vec::with_capacity(staged.len());
        for message in staged {
            let stream = self.streams.get_mut(&message.stream).expect("checked by check_staged");
            let request = message.request;
            if let Some(ack) = request.msg_id.as_deref().and_then(|id| stream.duplicate_of(id)) {
                acks.push(ack);
                continue;
            }
            let incoming = Incoming { subject: &request.subject, size: message.size };
            let plan = stream.plan_room(&incoming, RoomMode::Lenient).expect("lenient planning never refuses");
            for (p, seq, reason) in plan {
                stream.remove(p, seq, reason, &mut self.effects);
            }
            #[cfg(madsim)]
            if cellog_planted::active(cellog_planted::Mutant::CommitAppliedTwice) {
                self.append_message(&message.stream, message.partition, request.clone(), None, at);
            }
            let seq = self.append_message(&message.stream, message.partition, request, None, at);
            acks.push(PublishAck {
                stream: message.stream.clone(),
                partition: message.partition,
                seq,
                duplicate: false,
                original: None,
            });
        }
        let producer = self.producers.get_mut(&r.producer_id).expect("checked above");
        producer.transaction = None;
        producer.epoch = producer.epoch.saturating_add(1);
        let outcome = Outcome::TransactionCommitted {
            messages: acks,
            next: ProducerRef { producer_id: r.producer_id, epoch: producer.epoch },
        };
        producer.last_end = Some(TransactionEnd::Committed { epoch: r.epoch, outcome: outcome.clone() });
        let n_messages = match &outcome {
            Outcome::TransactionCommitted { messages, .. } => {
                messages.iter().filter(|ack| !ack.duplicate).count() as u32
            }
            _ => unreachable!("built above"),
        };
        self.effects.push(Effect::TransactionCommitted { producer_id: r.producer_id, epoch: r.epoch, n_messages });
        Ok(outcome)
    }

    fn abort_transaction(&mut self, r: ProducerRef) -> Result<Outcome, Rejection> {
        let producer =
            self.producers.get(&r.producer_id).ok_or(Rejection::ProducerNotFound { producer_id: r.producer_id })?;
        if producer.epoch != r.epoch {
            return self.replay_end(r, false);
        }
        let producer = current_producer(&mut self.producers, r)?;
        if producer.transaction.is_none() {
            return Err(Rejection::TransactionState { reason: "no open transaction".to_string() });
        }
        abort_transaction(
            r.producer_id,
            producer,
            AbortReason::Requested,
            "aborted by the producer".to_string(),
            &mut self.effects,
        );
        Ok(Outcome::TransactionAborted { next: ProducerRef { producer_id: r.producer_id, epoch: producer.epoch } })
    }

    // ----- consumers -----

    fn consumer_mut<'a>(stream: &'a mut Stream, consumer: &str) -> Result<&'a mut Consumer, Rejection> {
        let stream_name = stream.name.clone();
        stream.consumers.get_mut(consumer).ok_or_else(|| Rejection::ConsumerNotFound {
            stream: stream_name.to_string(),
            consumer: consumer.to_string(),
        })
    }

    fn update_consumer(&mut self, stream: &str, name: &str, config: ConsumerConfig) -> Result<Outcome, Rejection> {
        config.validate()?;
        let s = stream_in(&mut self.streams, stream)?;
        let consumer = s
            .consumers
            .get_mut(name)
            .ok_or_else(|| Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: name.to_string() })?;
        if consumer.config.filter_subject != config.filter_subject
            || consumer.config.deliver_policy != config.deliver_policy
        {
            return Err(Rejection::InvalidConfig {
                reason: "a consumer's filter and deliver policy are fixed; create another consumer".to_string(),
            });
        }
        consumer.config = config;
        Ok(Outcome::ConsumerUpdated)
    }

    fn create_consumer(
        &mut self,
        at: Millis,
        stream: &str,
        name: String,
        config: ConsumerConfig,
    ) -> Result<Outcome, Rejection> {
        check_name(NameKind::Consumer, &name)?;
        config.validate()?;
        let s = stream_in(&mut self.streams, stream)?;
        if let Some(existing) = s.consumers.get(name.as_str()) {
            if existing.config == config {
                return Ok(Outcome::ConsumerCreated { created: false });
            }
            return Err(Rejection::Conflict { what: "consumer".to_string(), name });
        }
        if s.consumers.len() >= MAX_CONSUMERS_PER_STREAM {
            return Err(invalid(format!("a stream has at most {MAX_CONSUMERS_PER_STREAM} consumers")));
        }
        if let Some(filter) = &config.filter_subject {
            validate_filter(filter).map_err(|reason| Rejection::InvalidSubject { subject: filter.clone(), reason })?;
            if !s.config.subjects.iter().any(|subject| filters_overlap(subject, filter)) {
                return Err(Rejection::InvalidConfig {
                    reason: format!("filter {filter:?} matches none of the stream's subjects"),
                });
            }
        }
        if s.config.retention == RetentionPolicy::WorkQueue {
            let mine = config.filter_subject.as_deref().unwrap_or(">");
            for other in s.consumers.values() {
                let theirs = other.config.filter_subject.as_deref().unwrap_or(">");
                if filters_overlap(mine, theirs) {
                    return Err(Rejection::SubjectOverlap {
                        subject: mine.to_string(),
                        other: theirs.to_string(),
                        owner: format!(
                            "consumer {:?} (a work-queue stream gives each message one consumer)",
                            other.name
                        ),
                    });
                }
            }
        }
        let cursors = s
            .partitions
            .iter()
            .map(|log| match config.deliver_policy {
                DeliverPolicy::All => log.first_seq,
                DeliverPolicy::New => log.next_seq(),
                DeliverPolicy::FromSequence(seq) => seq.max(log.first_seq),
                DeliverPolicy::FromTime(time) => log.first_seq_at_or_after(time),
            })
            .collect();
        let id = s.next_consumer_id;
        s.next_consumer_id += 1;
        let name: Arc<str> = Arc::from(name);
        s.consumers.insert(name.clone(), Consumer::new(id, name, config, cursors, at));
        // A consumer that starts past some messages is done with them; under interest retention they may go now
        // rather than at whatever command next sweeps.
        for partition in 0..s.config.partitions {
            s.sweep_interest(partition, 0, u64::MAX, &mut self.effects);
        }
        Ok(Outcome::ConsumerCreated { created: true })
    }

    fn delete_consumer(&mut self, stream: &str, name: &str) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if s.consumers.remove(name).is_none() {
            return Err(Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: name.to_string() });
        }
        for partition in 0..s.config.partitions {
            s.sweep_interest(partition, 0, u64::MAX, &mut self.effects);
        }
        Ok(Outcome::ConsumerDeleted)
    }

    fn fetch(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        member: &str,
        max: u32,
    ) -> Result<Outcome, Rejection> {
        check_name(NameKind::Member, member)?;
        if max == 0 || max > MAX_FETCH {
            return Err(invalid(format!("fetch max must be between 1 and {MAX_FETCH}")));
        }
        let s = stream_in(&mut self.streams, stream)?;
        let stream_id = s.id;
        Self::consumer_mut(s, consumer)?;
        let Stream { partitions, consumers, .. } = s;
        let c = consumers.get_mut(consumer).expect("checked above");
        let consumer_id = c.id;
        let member: Arc<str> = Arc::from(member);
        let (deliveries, timers) = c.fetch(partitions, &member, max, at);
        for (due, partition, seq) in timers {
            self.timers.set(due, Timer::Delivery { stream_id, consumer_id, partition, seq });
        }
        Ok(Outcome::Fetched(deliveries))
    }

    fn ack(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        partition: u32,
        seq: u64,
        kind: AckKind,
    ) -> Result<Outcome, Rejection> {
        if let AckKind::Nack { delay_ms } = kind {
            check_duration("nack delay_ms", delay_ms)?;
        }
        let s = stream_in(&mut self.streams, stream)?;
        let stream_name = s.name.clone();
        if partition >= s.config.partitions {
            return Err(invalid(format!("stream {stream:?} has no partition {partition}")));
        }
        let stream_id = s.id;
        let c = Self::consumer_mut(s, consumer)?;
        let consumer_id = c.id;
        if seq >= c.cursors[partition as usize] {
            return Err(Rejection::NotDelivered { partition, seq });
        }
        let Some(entry) = c.outstanding.get(&(partition, seq)) else {
            return Ok(Outcome::Acked { state: AckState::Applied, already_done: true });
        };
        let delivery_count = entry.delivery_count;
        if delivery_count == 0 {
            // A delayed message that has not been delivered yet.
            return Err(Rejection::NotDelivered { partition, seq });
        }
        let mut letters: Vec<DeadLetter> = Vec::new();
        let mut timer = None;
        let state = match kind {
            AckKind::Applied | AckKind::Replicated => {
                #[cfg(madsim)]
                let forget = !cellog_planted::active(cellog_planted::Mutant::RedeliveryAfterAck);
                #[cfg(not(madsim))]
                let forget = true;
                if forget {
                    c.forget(partition, seq);
                }
                c.n_acked += 1;
                if kind == AckKind::Applied { AckState::Applied } else { AckState::Replicated }
            }
            AckKind::Received | AckKind::InProgress => {
                if !matches!(entry.phase, Phase::Pending { .. }) {
                    return Err(Rejection::DeliveryExpired { partition, seq });
                }
                let deadline = at.plus(c.config.ack_wait_ms);
                c.set_phase(partition, seq, Phase::Pending { deadline });
                c.outstanding.get_mut(&(partition, seq)).expect("outstanding").state = AckState::Received;
                timer = Some(deadline);
                AckState::Received
            }
            AckKind::Nack { delay_ms } => {
                if c.exhausted(delivery_count) {
                    letters.extend(c.dead_letter(partition, seq, "max_deliver"));
                } else if delay_ms > 0 {
                    let until = at.plus(delay_ms);
                    c.set_phase(partition, seq, Phase::Waiting { until });
                    timer = Some(until);
                } else {
                    c.set_phase(partition, seq, Phase::Ready);
                }
                if let Some(entry) = c.outstanding.get_mut(&(partition, seq)) {
                    entry.state = AckState::Nack;
                }
                AckState::Nack
            }
            AckKind::Failed => {
                letters.extend(c.dead_letter(partition, seq, "failed"));
                AckState::Failed
            }
            AckKind::Term => {
                c.forget(partition, seq);
                AckState::Failed
            }
        };
        if let Some(due) = timer {
            self.timers.set(due, Timer::Delivery { stream_id, consumer_id, partition, seq });
        }
        let buried = !letters.is_empty();
        self.bury(at, &stream_name, letters);
        if !buried && matches!(state, AckState::Applied | AckState::Replicated | AckState::Failed) {
            let s = self.streams.get_mut(&stream_name).expect("exists");
            s.remove_if_uninteresting(partition, seq, &mut self.effects);
        }
        Ok(Outcome::Acked { state, already_done: false })
    }

    /// Copies dead letters into the stream's dead-letter stream (if it has one) with their origin in headers, and
    /// lets interest retention drop the originals.
    fn bury(&mut self, at: Millis, stream: &Arc<str>, letters: Vec<DeadLetter>) {
        for letter in letters {
            let source = self.streams.get(stream).expect("the source stream exists");
            let original = source.message(letter.partition, letter.seq).cloned();
            let target = source.config.dead_letter_stream.clone();
            let mut copy = None;
            if let (Some(message), Some(target)) = (original, target)
                && let Some(dead_letters) = self.streams.get_mut(target.as_str())
            {
                let mut headers = message.headers().cloned().unwrap_or_default();
                for (name, value) in [
                    ("cellog-dead-letter-stream", stream.to_string()),
                    ("cellog-dead-letter-consumer", letter.consumer.to_string()),
                    ("cellog-dead-letter-partition", letter.partition.to_string()),
                    ("cellog-dead-letter-seq", letter.seq.to_string()),
                    ("cellog-dead-letter-deliveries", letter.delivery_count.to_string()),
                    ("cellog-dead-letter-reason", letter.reason.to_string()),
                ] {
                    headers.insert(name.to_string(), value);
                }
                let partition = dead_letters.partition_of(&message.subject, message.key());
                let size =
                    Message::accounted_size(&message.subject, message.key(), &headers, message.body.len as usize);
                let incoming = Incoming { subject: &message.subject, size };
                let plan =
                    dead_letters.plan_room(&incoming, RoomMode::Lenient).expect("lenient planning never refuses");
                for (p, seq, reason) in plan {
                    dead_letters.remove(p, seq, reason, &mut self.effects);
                }
                let target_name = dead_letters.name.clone();
                let request = PublishRequest {
                    subject: message.subject.to_string(),
                    key: message.key().cloned(),
                    headers,
                    ..PublishRequest::default()
                };
                // A recalled message's copy gets an empty body, as its tombstone has none to copy.
                let copy_of = message.recalled_at().is_none().then_some(message.body);
                let seq = self.append_message(&target_name, partition, request, copy_of, at);
                copy = Some((target_name, partition, seq));
            }
            self.effects.push(Effect::DeadLettered {
                stream: stream.clone(),
                consumer: letter.consumer.clone(),
                partition: letter.partition,
                seq: letter.seq,
                delivery_count: letter.delivery_count,
                copy,
            });
            let source = self.streams.get_mut(stream).expect("the source stream exists");
            source.remove_if_uninteresting(letter.partition, letter.seq, &mut self.effects);
        }
    }

    fn commit_cursor(
        &mut self,
        stream: &str,
        consumer: &str,
        partition: u32,
        next_seq: u64,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let log_next = s
            .partitions
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?
            .next_seq();
        let c = Self::consumer_mut(s, consumer)?;
        let floor = c.ack_floor(partition);
        if next_seq < floor {
            return Err(Rejection::CursorRegression { current: floor });
        }
        if next_seq > log_next.max(c.cursors[partition as usize]) {
            return Err(invalid(format!(
                "cannot commit past the end of partition {partition} (next sequence {log_next})"
            )));
        }
        let done: Vec<u64> =
            c.outstanding.range((partition, 0)..(partition, next_seq)).map(|(&(_, seq), _)| seq).collect();
        for seq in done {
            c.forget(partition, seq);
            c.n_acked += 1;
        }
        let cursor = &mut c.cursors[partition as usize];
        let previous = *cursor;
        *cursor = (*cursor).max(next_seq);
        s.sweep_interest(partition, floor.min(previous), next_seq.saturating_sub(1), &mut self.effects);
        Ok(Outcome::CursorCommitted { next_seq })
    }

    // ----- peers -----

    fn register_peer(&mut self, stream: &str, peer: String) -> Result<Outcome, Rejection> {
        check_name(NameKind::Peer, &peer)?;
        let s = stream_in(&mut self.streams, stream)?;
        if s.peers.contains_key(&peer) {
            return Ok(Outcome::PeerRegistered);
        }
        if s.peers.len() >= MAX_PEERS_PER_STREAM {
            return Err(invalid(format!("a stream has at most {MAX_PEERS_PER_STREAM} registered peers")));
        }
        let n_partitions = s.partitions.len();
        s.peers.insert(peer, vec![0; n_partitions]);
        Ok(Outcome::PeerRegistered)
    }

    fn peer_progress(
        &mut self,
        at: Millis,
        stream: &str,
        peer: &str,
        partition: u32,
        received_seq: u64,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let last = s
            .partitions
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?
            .last_seq();
        if received_seq > last {
            return Err(invalid(format!(
                "peer cannot have received sequence {received_seq}; partition {partition} ends at {last}"
            )));
        }
        let received = s
            .peers
            .get_mut(peer)
            .ok_or_else(|| Rejection::PeerNotFound { stream: stream.to_string(), peer: peer.to_string() })?;
        // Progress reports may arrive out of order; the watermark only moves forward.
        let previous = received[partition as usize];
        if received_seq > previous {
            received[partition as usize] = received_seq;
            self.enforce_retention(at, stream, Some((partition, previous + 1, received_seq)));
        }
        Ok(Outcome::PeerProgressed)
    }

    fn unregister_peer(&mut self, at: Millis, stream: &str, peer: &str) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if s.peers.remove(peer).is_none() {
            return Err(Rejection::PeerNotFound { stream: stream.to_string(), peer: peer.to_string() });
        }
        self.enforce_retention(at, stream, None);
        Ok(Outcome::PeerUnregistered)
    }
}
