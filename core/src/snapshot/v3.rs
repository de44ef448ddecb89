//! The frozen shape of a version 3 snapshot's state: plain data that decodes exactly what version 3 writes.
//!
//! Every type here mirrors, field for field and variant for variant, the in-memory type of the same name as it was
//! when version 3 was current; the in-memory types convert from these (each in its own module). Nothing here may
//! change: a change to the encoding is a new version (see [`super`]).
//!
//! A collection type may differ from its in-memory counterpart where the encoding is the same: postcard writes a
//! `VecDeque` and a `Vec` alike, and [`Partition::slots`] is a `Vec` so that converting it reuses its allocation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A point in cell time, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Millis(pub u64);

/// Message headers.
pub(crate) type Headers = BTreeMap<String, String>;

/// A stored message: (stream, partition, seq).
pub(crate) type MessageRef = (Arc<str>, u32, u64);

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Cell {
    pub last_at: Millis,
    pub n_applied: u64,
    pub streams: BTreeMap<Arc<str>, Stream>,
    pub stream_names: BTreeMap<u64, Arc<str>>,
    pub next_stream_id: u64,
    pub producers: BTreeMap<u64, Producer>,
    pub transactional_ids: BTreeMap<Arc<str>, u64>,
    pub next_producer_id: u64,
    pub timers: Timers,
    pub pinned_by: BTreeMap<MessageRef, MessageRef>,
    pub next_body: u64,
}

// ----- timers -----

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Timers {
    pub queue: BTreeMap<(Millis, u64), Timer>,
    pub next_number: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Timer {
    Sweep { stream_id: u64 },
    Delivery { stream_id: u64, consumer_id: u64, partition: u32, seq: u64 },
    Transaction { producer_id: u64, number: u64 },
}

// ----- transactional producers -----

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Producer {
    pub transactional_id: Arc<str>,
    pub epoch: u32,
    pub timeout_ms: u64,
    pub transaction: Option<Transaction>,
    pub next_transaction_number: u64,
    pub last_end: Option<TransactionEnd>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Transaction {
    pub number: u64,
    pub state: TransactionState,
    pub begun_at: Millis,
    pub deadline: Millis,
    pub staged: Vec<Staged>,
    pub staged_bytes: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum TransactionState {
    Open,
    Prepared,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Staged {
    pub stream: Arc<str>,
    pub stream_id: u64,
    pub partition: u32,
    pub size: u64,
    pub request: PublishRequest,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum TransactionEnd {
    Committed { epoch: u32, outcome: Outcome },
    Aborted { epoch: u32, reason: AbortReason, detail: String },
}

// ----- streams -----

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Stream {
    pub id: u64,
    pub name: Arc<str>,
    pub config: StreamConfig,
    pub created_at: Millis,
    pub partitions: Vec<Partition>,
    pub next_stream_seq: u64,
    pub n_messages: u64,
    pub n_bytes: u64,
    pub subjects: BTreeMap<Arc<str>, SubjectState>,
    /// A map on the wire, decoded as its pairs: they go into a hash table, and a B-tree of a million ids on the way
    /// cost as much as the table.
    pub dedup: Vec<(Arc<str>, DedupEntry)>,
    pub dedup_expiry: VecDeque<(Millis, Arc<str>, u32, u64)>,
    pub ttl_index: BTreeSet<(Millis, u32, u64)>,
    pub ttl_held: BTreeSet<(u32, u64)>,
    pub bucket: Option<TokenBucket>,
    pub consumers: BTreeMap<Arc<str>, Consumer>,
    pub next_consumer_id: u64,
    pub peers: BTreeMap<String, Vec<u64>>,
    pub pins: BTreeMap<(u32, u64), u32>,
    pub sweep_at: Option<Millis>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Partition {
    pub first_seq: u64,
    /// A `VecDeque` in memory.
    pub slots: Vec<Option<Message>>,
    pub n_messages: u64,
    pub n_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Message {
    pub stream_seq: u64,
    /// Shared by every message on the subject while a cell is decoded.
    #[serde(deserialize_with = "super::intern::interned_subject")]
    pub subject: Arc<str>,
    pub msg_id: Option<Arc<str>>,
    pub body: BodyRef,
    pub stored_at: Millis,
    pub extras: Option<Box<Extras>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Extras {
    pub key: Option<Bytes>,
    /// A `Headers` map on the wire, decoded straight into the form a partition keeps.
    pub headers: crate::headers::Packed,
    pub expires_at: Option<Millis>,
    pub deliver_at: Option<Millis>,
    pub recalled_at: Option<Millis>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct BodyRef {
    pub key: u64,
    pub len: u32,
    pub crc: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct SubjectState {
    pub name: Arc<str>,
    pub n_messages: u64,
    pub n_bytes: u64,
    pub order: VecDeque<(u32, u64)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct DedupEntry {
    pub partition: u32,
    pub seq: u64,
    pub window_open: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TokenBucket {
    pub millitokens: u64,
    pub refilled_at: Millis,
}

// ----- consumers -----

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Consumer {
    pub id: u64,
    pub name: Arc<str>,
    pub config: ConsumerConfig,
    pub created_at: Millis,
    pub cursors: Vec<u64>,
    pub outstanding: BTreeMap<(u32, u64), Outstanding>,
    pub ready: BTreeSet<(u32, u64)>,
    pub n_pending: u32,
    pub next_partition: u32,
    pub n_delivered: u64,
    pub n_redelivered: u64,
    pub n_acked: u64,
    pub n_dead_lettered: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Outstanding {
    pub delivery_count: u32,
    pub phase: Phase,
    pub state: AckState,
    pub member: Option<Arc<str>>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum Phase {
    Pending { deadline: Millis },
    Ready,
    Waiting { until: Millis },
}

// ----- configuration -----

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StreamConfig {
    pub subjects: Vec<String>,
    pub partitions: u32,
    pub retention: RetentionPolicy,
    pub discard: DiscardPolicy,
    pub max_age_ms: Option<u64>,
    pub max_messages: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_messages_per_subject: Option<u64>,
    pub max_bytes_per_subject: Option<u64>,
    pub max_payload_bytes: u32,
    pub duplicate_window_ms: u64,
    pub rate_limit: Option<RateLimit>,
    pub dead_letter_stream: Option<String>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum RetentionPolicy {
    Limits,
    Interest,
    WorkQueue,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum DiscardPolicy {
    Old,
    New,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct RateLimit {
    pub messages_per_second: u32,
    pub burst: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ConsumerConfig {
    pub filter_subject: Option<String>,
    pub deliver_policy: DeliverPolicy,
    pub ack_wait_ms: u64,
    pub max_deliver: Option<u32>,
    pub max_in_flight: u32,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum DeliverPolicy {
    All,
    New,
    FromSequence(u64),
    FromTime(Millis),
}

// ----- commands and outcomes -----

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct ProducerRef {
    pub producer_id: u64,
    pub epoch: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PublishRequest {
    pub subject: String,
    pub payload: Bytes,
    pub key: Option<Bytes>,
    pub msg_id: Option<String>,
    pub headers: Headers,
    pub expected_last_seq: Option<u64>,
    pub expected_last_subject_seq: Option<u64>,
    pub ttl_ms: Option<u64>,
    pub deliver_after_ms: Option<u64>,
    pub transaction: Option<ProducerRef>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum AckState {
    Received,
    Applied,
    Failed,
    Nack,
    Replicated,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum AbortReason {
    Requested,
    Fenced,
    Timeout,
    CommitRefused,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Body {
    Stored(BodyRef),
    Tombstone { recalled_at: Millis },
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub partition: u32,
    pub seq: u64,
    pub subject: Arc<str>,
    pub key: Option<Bytes>,
    pub msg_id: Option<Arc<str>>,
    pub headers: Headers,
    pub body: Body,
    pub stored_at: Millis,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PublishAck {
    pub stream: Arc<str>,
    pub partition: u32,
    pub seq: u64,
    pub duplicate: bool,
    pub original: Option<Box<Record>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Delivery {
    pub record: Record,
    pub delivery_count: u32,
    pub ack_deadline: Millis,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Outcome {
    StreamCreated { created: bool },
    StreamUpdated,
    StreamDeleted,
    Published(PublishAck),
    Staged { index: u32, duplicate: bool },
    Recalled,
    ConsumerCreated { created: bool },
    ConsumerDeleted,
    Fetched(Vec<Delivery>),
    Acked { state: AckState, already_done: bool },
    CursorCommitted { next_seq: u64 },
    ProducerInitialized(ProducerRef),
    TransactionBegun,
    TransactionPrepared,
    TransactionCommitted { messages: Vec<PublishAck>, next: ProducerRef },
    TransactionAborted { next: ProducerRef },
    PeerRegistered,
    PeerProgressed,
    PeerUnregistered,
    Ticked,
    ConsumerUpdated,
}
