//! The sans-IO state machine of a cellog cell: streams, consumers, transactions and retention.
//!
//! This crate is what every replica of a cell runs. It is a pure function of its input: commands come in with the
//! time the leader stamped on them, typed outcomes and effects come out. It does no IO, reads no clock, spawns
//! nothing and draws no random numbers; its dependencies name no async runtime, RPC or Raft crate. That is what lets
//! Raft replicate it and the simulator replay it bit for bit.
//!
//! ```text
//!                 (at, Command)                       Outcome | Rejection (bodies by reference)
//!  Raft log ───────────────────────▶  Cell::apply  ───────────────────────▶ proposer
//!                                        │   ▲
//!     BodyOp: body work (stored, copied, │   │ Command::Tick when the leader's clock
//!     released) into the entry's storage ▼   │ passes Cell::next_deadline()
//!     batch; transitions, when traced   host
//! ```
//!
//! - [`Cell`] holds the state; [`Cell::apply`] is the only way to change it.
//! - [`Command`] lists every state change; [`Outcome`] and [`Rejection`] are the answers.
//! - Each apply queues [`BodyOp`]s, body work ([`body`]) the host does in the same batch as the entry, and, while
//!   the host traces them, [`Transition`]s; the host drains both after each apply, and `apply` refuses to run over
//!   either undrained.
//! - [`Cell::snapshot`] / [`Cell::restore`] encode the state deterministically (bodies by reference;
//!   [`Cell::snapshot_whole`] adds the bytes the host hands it); [`Cell::digest`] compares replicas.
//!
//! What this crate is not: it does not store anything (bodies included), does not replicate, and does not talk to
//! clients. Records and deliveries carry [`BodyRef`]s; the node that answers reads the bytes.

pub mod auth;
pub mod body;
mod bucket;
mod cell;
mod command;
mod config;
mod consumer;
mod dedup;
mod effect;
mod error;
pub mod group;
mod headers;
mod index;
mod info;
mod memory;
pub mod mirror;
mod outcome;
mod partition;
pub mod placement;
pub mod quota;
mod route;
mod snapshot;
mod stream;
pub mod subject;
pub mod tenant;
mod time;

pub use auth::{Access, Actor, Grants, NODE_HEADER_PREFIX, ROOT, SENDER_HEADER, TokenHash, is_node_header};
pub use body::BodyRef;
pub use cell::transaction::{MAX_TRANSACTION_BYTES, MAX_TRANSACTION_MESSAGES};
pub use cell::{
    Cell, MAX_COMMAND_BYTES, MAX_CONSUMERS_PER_STREAM, MAX_DEDUP_IDS, MAX_FETCH, MAX_GROUP_MEMBERS, MAX_HEADER_BYTES,
    MAX_ID_BYTES, MAX_INGEST_GAP, MAX_INGEST_MESSAGES, MAX_KEY_BYTES, MAX_OPEN_TRANSACTIONS, MAX_PEERS_PER_STREAM,
    MAX_PRODUCERS, MAX_READ, MAX_RESPONSE_BYTES, MAX_SESSION_TIMEOUT_MS, MAX_STREAMS, MIN_SESSION_TIMEOUT_MS,
    MirrorRead, PIN_HEADER, PRODUCER_IDLE_MS,
};
pub use command::{
    AckItem, AckKind, Command, GroupMember, Headers, IngestMessage, ProducerRef, PublishRequest, Strategy,
};
pub use config::{
    ConsumerConfig, DeliverPolicy, DiscardPolicy, MAX_DURATION_MS, MAX_PARTITIONS, MAX_PAYLOAD_LIMIT, RateLimit,
    RetentionPolicy, StreamConfig,
};
pub use consumer::Work;
pub use dedup::IdKey;
pub use effect::{BodyOp, Transition};
pub use error::{Cap, NameKind, Quota, Rejection, SnapshotError};
pub use group::{GroupInfo, MemberInfo, PartitionOwner};
pub use info::{
    ConsumerInfo, DeliveryInfo, DeliveryPhase, PartitionInfo, PartitionLag, PeerInfo, ProducerInfo, StreamInfo,
};
pub use memory::MemoryBodies;
pub use outcome::{
    AbortReason, AckAnswer, AckState, Body, Delivery, GroupChange, MemberAssignment, Outcome, PublishAck, Record,
    RemovalReason,
};
pub use snapshot::{SNAPSHOT_VERSION, StateDigest};
pub use subject::SubjectError;
pub use tenant::Scope;
pub use time::Millis;

/// The `tracing` target under which hosts report the cell's state transitions (applied entries, role and membership
/// changes, mail received and settled), so that one filter collects them in order: the log's operator view and the
/// simulator's trace. The core itself traces nothing.
pub const TRANSITIONS: &str = "cellog::transition";
