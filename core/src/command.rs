//! The vocabulary of the cell: commands in, outcomes and effects out, and the records readers see.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::auth::{Actor, Grants, TokenHash};
use crate::body::BodyRef;
use crate::config::{ConsumerConfig, StreamConfig};
use crate::error::Rejection;
use crate::snapshot::v3;
use crate::time::Millis;

pub use crate::headers::Headers;

/// A producer instance in a transaction: its id and the epoch it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerRef {
    /// The id from `InitProducer`.
    pub producer_id: u64,
    /// The epoch from `InitProducer` (or from the end of the previous transaction).
    pub epoch: u32,
}

/// One message to publish.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRequest {
    /// Where it goes; the stream claiming this subject stores it.
    pub subject: String,
    /// The body.
    pub payload: Bytes,
    /// Partitioning key; the subject is used when absent, so one subject stays in one partition.
    pub key: Option<Bytes>,
    /// Idempotency key: a repeat within the dedup horizon returns the original sequence.
    pub msg_id: Option<String>,
    /// Headers stored with the message.
    pub headers: Headers,
    /// Append only if the partition's last sequence is this (0: empty).
    pub expected_last_seq: Option<u64>,
    /// Append only if the subject's last sequence is this (0: no retained message on the subject).
    pub expected_last_subject_seq: Option<u64>,
    /// Remove the message this long after it is stored.
    pub ttl_ms: Option<u64>,
    /// Deliver to consumers no earlier than this long after it is stored.
    pub deliver_after_ms: Option<u64>,
    /// Stage into this producer's open transaction instead of appending now.
    pub transaction: Option<ProducerRef>,
}

impl PublishRequest {
    /// A plain publish of `payload` to `subject`.
    pub fn new(subject: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        PublishRequest { subject: subject.into(), payload: payload.into(), ..PublishRequest::default() }
    }

    /// The same request with a message id.
    pub fn with_id(mut self, msg_id: impl Into<String>) -> Self {
        self.msg_id = Some(msg_id.into());
        self
    }
}

/// How a consumer answers a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckKind {
    /// Received but not processed yet: the ack deadline is extended (as `InProgress`), state `Received`.
    Received,
    /// Still working: extend the ack deadline by `ack_wait_ms`.
    InProgress,
    /// Processed: done for this consumer.
    Applied,
    /// Copied to another replica or cell: done for this consumer.
    Replicated,
    /// Failed for good: dead-lettered at once, never redelivered.
    Failed,
    /// Not now: redeliver after `delay_ms` (at once when 0), unless `max_deliver` is reached.
    Nack {
        /// How long to wait before redelivering.
        delay_ms: u64,
    },
    /// Stop delivering it, without dead-lettering.
    Term,
}

/// The five recorded states of a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AckState {
    /// Delivered or confirmed received; not processed yet.
    Received,
    /// Processed by the consumer.
    Applied,
    /// Processing failed for good.
    Failed,
    /// Negatively acknowledged; waiting for redelivery.
    Nack,
    /// Copied elsewhere by a replicating consumer.
    Replicated,
}

/// Every state change of a cell. Applied with the leader-stamped time by [`crate::Cell::apply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Command {
    /// Create a stream; the identical config again is a success.
    CreateStream {
        /// Its name.
        name: String,
        /// Its config.
        config: StreamConfig,
    },
    /// Change a stream's limits (partitions and retention policy are fixed).
    UpdateStream {
        /// Its name.
        name: String,
        /// The new config.
        config: StreamConfig,
    },
    /// Delete a stream and everything in it.
    DeleteStream {
        /// Its name.
        name: String,
    },
    /// Publish one message (or stage it, when `transaction` is set).
    Publish(PublishRequest),
    /// Replace a message's payload with a tombstone; readers see the tombstone.
    Recall {
        /// The stream.
        stream: String,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
    /// Create a durable consumer; the identical config again is a success.
    CreateConsumer {
        /// The stream.
        stream: String,
        /// The consumer's name.
        name: String,
        /// Its config.
        config: ConsumerConfig,
    },
    /// Delete a consumer and its cursors.
    DeleteConsumer {
        /// The stream.
        stream: String,
        /// The consumer.
        name: String,
    },
    /// Deliver up to `max` messages to `member` of a consumer (redeliveries first).
    Fetch {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// Which member of the consumer asks (for work queues; any name for a single reader).
        member: String,
        /// Most messages to deliver.
        max: u32,
    },
    /// Answer a delivery.
    Ack {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// The answer.
        kind: AckKind,
    },
    /// Declare everything below `next_seq` in a partition done for a consumer.
    CommitCursor {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// The partition.
        partition: u32,
        /// First sequence not yet done.
        next_seq: u64,
    },
    /// Register a transactional producer, fencing every older instance with the same id.
    InitProducer {
        /// Stable id of the producer across restarts.
        transactional_id: String,
        /// Open or prepared transactions older than this are aborted.
        transaction_timeout_ms: u64,
    },
    /// Open a transaction.
    BeginTransaction(ProducerRef),
    /// Validate the open transaction; it accepts no more messages.
    PrepareTransaction(ProducerRef),
    /// Make every staged message visible at once, in order.
    CommitTransaction(ProducerRef),
    /// Drop every staged message.
    AbortTransaction(ProducerRef),
    /// Register a peer (a mirror, another cell) whose received watermark holds retention back.
    RegisterPeer {
        /// The stream.
        stream: String,
        /// The peer's name.
        peer: String,
    },
    /// Record that a peer has received a partition up to `received_seq`.
    PeerProgress {
        /// The stream.
        stream: String,
        /// The peer.
        peer: String,
        /// The partition.
        partition: u32,
        /// Last sequence received.
        received_seq: u64,
    },
    /// Remove a peer; retention no longer waits for it.
    UnregisterPeer {
        /// The stream.
        stream: String,
        /// The peer.
        peer: String,
    },
    /// Fire every timer due at the command's time. Proposed by the leader when `next_deadline()` passes.
    Tick,
    /// Change a consumer's ack wait, max deliver and max in flight. Its filter and deliver policy are fixed; the new
    /// values apply from now on (deliveries already made keep their ack deadlines).
    UpdateConsumer {
        /// The stream.
        stream: String,
        /// The consumer.
        name: String,
        /// The new config.
        config: ConsumerConfig,
    },
    /// Run `command` as the principal `actor` is, if its grants allow (see [`crate::auth`]). Every command a client
    /// sends arrives wrapped in this; a bare command is the node's own.
    As {
        /// Who sends it.
        actor: Actor,
        /// What it asks.
        command: Box<Command>,
    },
    /// Create a principal, or replace an existing one's grants (its tokens stay).
    PutPrincipal {
        /// Its name.
        name: String,
        /// What it may do.
        grants: Grants,
    },
    /// Delete a principal and its tokens.
    DeletePrincipal {
        /// Its name.
        name: String,
    },
    /// Give a principal an API token, by the token's SHA-256.
    AddToken {
        /// The principal.
        principal: String,
        /// The token's hash.
        token: TokenHash,
    },
    /// Revoke an API token: later commands carrying it are refused.
    RevokeToken {
        /// The token's hash.
        token: TokenHash,
    },
    /// Revoke a certificate by its serial: a call presenting it is refused from the next entry on, until it ends.
    RevokeCertificate {
        /// The certificate's serial number, as its DER encodes it.
        serial: Vec<u8>,
        /// What it names (a principal's or a node's URI), for listings.
        subject: String,
        /// When it ends, in milliseconds since the epoch: the cell forgets the revocation then.
        until_ms: u64,
    },
    /// Set the quotas of a tenant (`None`: the cell's own, over every stream). Unlimited quotas drop a tenant's entry.
    SetQuotas {
        /// The tenant, or none for the cell.
        tenant: Option<String>,
        /// What it may hold.
        quotas: crate::quota::Quotas,
    },
    /// Reserve subjects for the node: no principal may publish to them, or recall or delete a stream claiming them
    /// (the node's own streams: sealed mail, results, provenance). The node's own command only.
    ReserveSubjects {
        /// The subject filter.
        filter: String,
    },
    /// Join a consumer group on a stream as `member`, creating the group (and its consumer, with `config`) at its
    /// first join. A member already in the group joins again as a new incarnation: the earlier one is fenced. Answers
    /// the member's assignment ([`Outcome::GroupAssignment`]).
    JoinGroup {
        /// The stream.
        stream: String,
        /// The group (also its consumer's name).
        group: String,
        /// The member.
        member: String,
        /// The group's strategy; every member must name the same.
        strategy: Strategy,
        /// How long the cell waits for the member's next heartbeat before it removes the member.
        session_timeout_ms: u64,
        /// The group's consumer; every member must name the same.
        config: ConsumerConfig,
    },
    /// A member is alive: keeps its session, gives up `released` (partitions it was told to revoke, once it has
    /// acknowledged or committed what it wants of them), and gets its assignment back.
    Heartbeat {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The generation the member knows.
        generation: u64,
        /// Partitions it gives up.
        released: Vec<u32>,
    },
    /// A member leaves its group; its partitions go to the others.
    LeaveGroup {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The member.
        member: String,
    },
    /// Deliver up to `max` messages to a member, from the partitions it owns (redeliveries first).
    MemberFetch {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The generation the member knows: it gets nothing from a partition granted after it.
        generation: u64,
        /// Most messages to deliver.
        max: u32,
    },
    /// Answer a delivery as a member of a generation; refused unless the member owns the partition since then.
    MemberAck {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The generation the member knows.
        generation: u64,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// The answer.
        kind: AckKind,
    },
    /// Declare everything below `next_seq` in a partition done, as a member of a generation; refused unless the member
    /// owns the partition since then.
    MemberCommit {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The generation the member knows.
        generation: u64,
        /// The partition.
        partition: u32,
        /// First sequence not yet done.
        next_seq: u64,
    },
    /// The directory records a cell and its nodes' addresses (replacing any it held): see [`crate::placement`].
    PutCell {
        /// The cell's name.
        cell: String,
        /// Its nodes' client addresses.
        addresses: Vec<String>,
    },
    /// The directory places a stream on a cell, at ownership epoch 1; placing it again on the same cell changes
    /// nothing.
    PlaceStream {
        /// The stream.
        stream: String,
        /// Its cell.
        cell: String,
    },
    /// The directory records a move of a stream to another cell at the next epoch, if the stream is at `epoch` and no
    /// move of it is under way.
    MoveStream {
        /// The stream.
        stream: String,
        /// The cell it moves to.
        to: String,
        /// The epoch the mover saw: the move happens only from it.
        epoch: u64,
    },
    /// The directory records the move of a stream at `epoch` done.
    FinishMove {
        /// The stream.
        stream: String,
        /// The epoch of the move.
        epoch: u64,
    },
    /// The directory forgets a stream's placement.
    Unplace {
        /// The stream.
        stream: String,
    },
    /// The cell that owns a stream stops accepting writes to it from `epoch` on: it moved to cell `to`.
    FenceStream {
        /// The stream.
        stream: String,
        /// The epoch of the move.
        epoch: u64,
        /// The cell it moved to.
        to: String,
    },
    /// A stream moves to this cell at `epoch` from cell `from`: writes wait until [`Command::AcceptStream`]. With a
    /// `config`, a stream this cell does not hold is created with it in the same step, so that it is never here
    /// without being fenced as receiving, and a publish routed here meanwhile finds it and is told to wait.
    ReceiveStream {
        /// The stream.
        stream: String,
        /// The epoch of the move.
        epoch: u64,
        /// The cell it moves from.
        from: String,
        /// Its config on the cell it moves from, to create it with if this cell does not hold it.
        config: Option<crate::config::StreamConfig>,
    },
    /// This cell owns a stream from `epoch` on and accepts writes to it, once it holds every partition through the
    /// positions the cell it moves from was fenced at.
    AcceptStream {
        /// The stream.
        stream: String,
        /// The epoch of the move.
        epoch: u64,
        /// The last sequence of each partition when the cell it moves from was fenced (its fence's answer):
        /// accepted only once this cell's partitions reach them, so no write here takes a position the old owner
        /// had given.
        through: Vec<u64>,
    },
    /// A cell receiving a stream copies its messages from the cell it moves from, each at the position it holds
    /// there (partition and sequence, ids kept, so deduplication carries over the move). Taken only while this cell
    /// receives the stream at `epoch`. A message at or below its partition's last sequence is already here and is
    /// passed over, so a copy retried after a lost answer changes nothing.
    Ingest {
        /// The stream.
        stream: String,
        /// The epoch of the move.
        epoch: u64,
        /// The messages, each partition's in rising sequence.
        messages: Vec<IngestMessage>,
        /// Per partition (empty, or one per partition), the last sequence the cell it moves from had given, so the
        /// next write here follows it even when the messages up to it were removed there.
        through: Vec<u64>,
    },
    /// Creates stream `name` as a mirror of `source` (see [`crate::mirror`]): it takes no writes of its own, and
    /// only [`Command::MirrorIngest`] adds to it. The same mirror again is answered as created before; again with
    /// other addresses of the same source, it records them.
    CreateMirror {
        /// The mirror's name here.
        name: String,
        /// Its config (its partitions must be the source's).
        config: crate::config::StreamConfig,
        /// What it follows.
        source: crate::mirror::MirrorSource,
    },
    /// A mirror's copy of what it read from its source: first the recalls logged there (each recalls its message
    /// here if this mirror holds it), then the messages, each at the position it holds there (ids kept); `through`
    /// moves each partition past the positions the read found empty. What is already here is passed over, so a
    /// copy retried changes nothing.
    MirrorIngest {
        /// The mirror.
        stream: String,
        /// The messages, each partition's in rising sequence.
        messages: Vec<IngestMessage>,
        /// Per partition (empty, or one per partition), the position through which the read was whole.
        through: Vec<u64>,
        /// Recalls logged on the source, in their order.
        recalls: Vec<crate::mirror::LoggedRecall>,
        /// How many of the source's recalls are applied once these are: the next read starts there.
        recalls_through: u64,
    },
    /// On a mirror's source: registers the mirror as a peer of `stream` (retention keeps what it has not received)
    /// whose recalls are logged for it from now on.
    RegisterMirror {
        /// The source stream.
        stream: String,
        /// The mirror's peer name.
        peer: String,
    },
    /// On a mirror's source: what the mirror holds (each partition's last sequence there) and how many of the
    /// stream's logged recalls it has applied. Watermarks never go back.
    MirrorProgress {
        /// The source stream.
        stream: String,
        /// The mirror's peer name.
        peer: String,
        /// Per partition, the last sequence the mirror holds.
        received: Vec<u64>,
        /// How many logged recalls the mirror has applied.
        recalls_applied: u64,
    },
    /// Replaces the streams `principal` may mirror (register as the stream's mirror, read it for mirroring, report its
    /// progress, and read its info), in stored names; none takes the grant away. Cluster admin only.
    GrantMirror {
        /// The principal.
        principal: String,
        /// The streams, in stored names.
        streams: Vec<String>,
    },
    /// Answer deliveries of one consumer (or, as a member of a generation, of one group), in order, each on its own:
    /// a refused item refuses nothing else, and each answers as [`Command::Ack`] (or [`Command::MemberAck`]) would.
    /// The acks of one call travel as one command, so the log carries and the cell checks the caller once.
    Acks {
        /// The stream.
        stream: String,
        /// The consumer, or the group.
        consumer: String,
        /// The member acking and the generation it knows, for a group; none for a consumer.
        member: Option<GroupMember>,
        /// The answers, at most [`crate::cell::MAX_FETCH`].
        items: Vec<AckItem>,
    },
}

/// One answer of [`Command::Acks`]: to the delivery at `seq` of `partition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckItem {
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub seq: u64,
    /// The answer.
    pub kind: AckKind,
}

/// A member of a consumer group as it names itself in a command: its name and the generation it knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// The member.
    pub member: String,
    /// The generation the member knows.
    pub generation: u64,
}

/// What an ack did: the delivery's state after it, and whether the message was already done (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckAnswer {
    /// The delivery's state after the ack.
    pub state: AckState,
    /// The message was already done for this consumer: nothing changed.
    pub already_done: bool,
}

/// A message copied into a stream moving here, at the position it held on the cell it moves from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestMessage {
    /// Its partition.
    pub partition: u32,
    /// Its sequence there.
    pub seq: u64,
    /// The message: subject, payload, key, id and headers (nothing else: no condition, TTL, delay or transaction).
    pub request: PublishRequest,
}

impl Command {
    /// The transactional producer it acts for, if any (looking through [`Command::As`]); a registration's producer
    /// is known only from its outcome.
    pub fn producer(&self) -> Option<u64> {
        match self {
            Command::BeginTransaction(r)
            | Command::PrepareTransaction(r)
            | Command::CommitTransaction(r)
            | Command::AbortTransaction(r) => Some(r.producer_id),
            Command::Publish(request) => request.transaction.map(|r| r.producer_id),
            Command::As { command, .. } => command.producer(),
            _ => None,
        }
    }

    /// Its kind in kebab case (`publish`, `create-stream`), looking through [`Command::As`] to what it runs.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::As { command, .. } => command.kind(),
            other => other.into(),
        }
    }
}

/// What a reader sees in place of a body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Body {
    /// The payload as published, stored by the host under the reference's key. The node that answers reads and
    /// verifies it; the cell never does.
    Stored(BodyRef),
    /// The message was recalled.
    Tombstone {
        /// When it was recalled.
        recalled_at: Millis,
    },
}

/// A stored message as readers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The partition.
    pub partition: u32,
    /// Its sequence in the partition.
    pub seq: u64,
    /// Its subject.
    pub subject: Arc<str>,
    /// Its key, if published with one.
    pub key: Option<Bytes>,
    /// Its message id, if published with one.
    pub msg_id: Option<Arc<str>>,
    /// Its headers.
    pub headers: Headers,
    /// The payload, or the tombstone that replaced it.
    pub body: Body,
    /// When it was stored.
    pub stored_at: Millis,
}

/// Most bytes of records ([`Record::size`]) one fetch or read answers with, besides its first record (which
/// is answered whatever its size: a record always fits the wire). A fetch stops before the record that would pass it
/// and leaves that record undelivered, so that no delivery is counted that its answer could not carry.
pub const MAX_RESPONSE_BYTES: u64 = 8 * 1024 * 1024;

impl Record {
    /// About how many bytes it takes in an answer: its payload (nothing for a tombstone), subject, key, message id and
    /// headers, and a fixed allowance for the rest. What budgets answers ([`crate::MAX_RESPONSE_BYTES`]).
    pub fn size(&self) -> u64 {
        let payload = match &self.body {
            Body::Stored(body) => u64::from(body.len),
            Body::Tombstone { .. } => 0,
        };
        let key = self.key.as_ref().map_or(0, |key| key.len());
        let msg_id = self.msg_id.as_ref().map_or(0, |id| id.len());
        let headers: usize = self.headers.iter().map(|(name, value)| name.len() + value.len() + 8).sum();
        payload + (self.subject.len() + key + msg_id + headers + 64) as u64
    }
}

/// Where a publish landed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishAck {
    /// The stream.
    pub stream: Arc<str>,
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub seq: u64,
    /// A repeat of an earlier message id: nothing was appended; `seq` is the original's.
    pub duplicate: bool,
    /// For a duplicate, the stored original, when it is still retained (boxed: most acks carry none).
    pub original: Option<Box<Record>>,
}

/// One message handed to a consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The message.
    pub record: Record,
    /// How many times it has been delivered to this consumer, this one included.
    pub delivery_count: u32,
    /// When it becomes a redelivery candidate unless acknowledged or extended.
    pub ack_deadline: Millis,
}

/// The result of a successful command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Outcome {
    /// The stream exists with this config; `created` is false when it already did.
    StreamCreated {
        /// Whether this command created it.
        created: bool,
    },
    /// The stream's config was changed.
    StreamUpdated,
    /// The stream is gone.
    StreamDeleted,
    /// The message was appended, or was a duplicate.
    Published(PublishAck),
    /// The message was staged in the producer's transaction.
    Staged {
        /// Its position among the transaction's staged messages.
        index: u32,
        /// A repeat of a message id already staged in this transaction.
        duplicate: bool,
    },
    /// The message now reads as a tombstone.
    Recalled,
    /// The consumer exists with this config; `created` is false when it already did.
    ConsumerCreated {
        /// Whether this command created it.
        created: bool,
    },
    /// The consumer is gone.
    ConsumerDeleted,
    /// Messages delivered (possibly none).
    Fetched(Vec<Delivery>),
    /// The ack was recorded.
    Acked {
        /// The delivery's state after the ack.
        state: AckState,
        /// The message was already done for this consumer: nothing changed.
        already_done: bool,
    },
    /// The cursor moved.
    CursorCommitted {
        /// The new committed position.
        next_seq: u64,
    },
    /// A producer instance; every older epoch is fenced.
    ProducerInitialized(ProducerRef),
    /// A transaction is open.
    TransactionBegun,
    /// The transaction validated and accepts no more messages.
    TransactionPrepared,
    /// Every staged message is visible. The producer continues with `next`.
    TransactionCommitted {
        /// Where each staged message landed, in staging order.
        messages: Vec<PublishAck>,
        /// The producer's epoch for its next transaction.
        next: ProducerRef,
    },
    /// Every staged message was dropped. The producer continues with `next`.
    TransactionAborted {
        /// The producer's epoch for its next transaction.
        next: ProducerRef,
    },
    /// The peer is registered.
    PeerRegistered,
    /// The peer's watermark moved.
    PeerProgressed,
    /// The peer is gone.
    PeerUnregistered,
    /// Timers fired.
    Ticked,
    /// The consumer's config was changed.
    ConsumerUpdated,
    /// The principal exists with these grants; `created` is false when it already did.
    PrincipalPut {
        /// Whether this command created it.
        created: bool,
    },
    /// The principal is gone.
    PrincipalDeleted,
    /// The principal holds the token.
    TokenAdded,
    /// The token no longer works.
    TokenRevoked,
    /// The certificate no longer works; `revoked` is false when it already did not.
    CertificateRevoked {
        /// Whether this command revoked it.
        revoked: bool,
    },
    /// The quotas are set.
    QuotasSet,
    /// The subjects are reserved for the node; `reserved` is false when they already were.
    SubjectsReserved {
        /// Whether this command reserved them.
        reserved: bool,
    },
    /// A member's assignment after its join or heartbeat.
    GroupAssignment(MemberAssignment),
    /// The member left; `was_member` is false when it was not in the group.
    GroupLeft {
        /// Whether it was a member.
        was_member: bool,
    },
    /// Messages delivered to a member (possibly none), and the group's generation: a newer one than the member knows
    /// means its assignment changed.
    MemberFetched {
        /// The group's generation.
        generation: u64,
        /// The deliveries.
        deliveries: Vec<Delivery>,
    },
    /// The directory holds the cell with these addresses; `created` is false when it already knew the cell.
    CellPut {
        /// Whether this command added it.
        created: bool,
    },
    /// A stream's placement as the directory now records it.
    Placed(crate::placement::Placement),
    /// The directory no longer places the stream.
    Unplaced,
    /// A stream's ownership as this cell now sees it; for a fence, the last sequence of each partition when it was
    /// fenced (the position the new owner catches up to).
    Ownership {
        /// The ownership.
        ownership: crate::placement::Ownership,
        /// The last sequence of each partition (0 for an empty one), by partition.
        last_seqs: Vec<u64>,
    },
    /// Messages copied into a stream moving here: how many were new, and each partition's last sequence now.
    Ingested {
        /// Messages appended (those already here are not counted).
        appended: u32,
        /// The last sequence of each partition, by partition.
        last_seqs: Vec<u64>,
    },
    /// The principal may mirror these streams now, and no other.
    MirrorGranted,
    /// Each ack of [`Command::Acks`] answered, in order: what it did, or why it was refused.
    AckedEach(Vec<Result<AckAnswer, Rejection>>),
}

impl From<v3::ProducerRef> for ProducerRef {
    fn from(r: v3::ProducerRef) -> Self {
        ProducerRef { producer_id: r.producer_id, epoch: r.epoch }
    }
}

impl From<v3::PublishRequest> for PublishRequest {
    fn from(request: v3::PublishRequest) -> Self {
        PublishRequest {
            subject: request.subject,
            payload: request.payload,
            key: request.key,
            msg_id: request.msg_id,
            headers: request.headers,
            expected_last_seq: request.expected_last_seq,
            expected_last_subject_seq: request.expected_last_subject_seq,
            ttl_ms: request.ttl_ms,
            deliver_after_ms: request.deliver_after_ms,
            transaction: request.transaction.map(ProducerRef::from),
        }
    }
}

impl From<v3::AckState> for AckState {
    fn from(state: v3::AckState) -> Self {
        match state {
            v3::AckState::Received => AckState::Received,
            v3::AckState::Applied => AckState::Applied,
            v3::AckState::Failed => AckState::Failed,
            v3::AckState::Nack => AckState::Nack,
            v3::AckState::Replicated => AckState::Replicated,
        }
    }
}

impl From<v3::Body> for Body {
    fn from(body: v3::Body) -> Self {
        match body {
            v3::Body::Stored(body) => Body::Stored(body.into()),
            v3::Body::Tombstone { recalled_at } => Body::Tombstone { recalled_at: recalled_at.into() },
        }
    }
}

impl From<v3::Record> for Record {
    fn from(record: v3::Record) -> Self {
        Record {
            partition: record.partition,
            seq: record.seq,
            subject: record.subject,
            key: record.key,
            msg_id: record.msg_id,
            headers: record.headers,
            body: record.body.into(),
            stored_at: record.stored_at.into(),
        }
    }
}

impl From<v3::PublishAck> for PublishAck {
    fn from(ack: v3::PublishAck) -> Self {
        PublishAck {
            stream: ack.stream,
            partition: ack.partition,
            seq: ack.seq,
            duplicate: ack.duplicate,
            original: ack.original.map(|original| Box::new(Record::from(*original))),
        }
    }
}

impl From<v3::Delivery> for Delivery {
    fn from(delivery: v3::Delivery) -> Self {
        Delivery {
            record: delivery.record.into(),
            delivery_count: delivery.delivery_count,
            ack_deadline: delivery.ack_deadline.into(),
        }
    }
}

impl From<v3::Outcome> for Outcome {
    fn from(outcome: v3::Outcome) -> Self {
        use v3::Outcome as V3;
        match outcome {
            V3::StreamCreated { created } => Outcome::StreamCreated { created },
            V3::StreamUpdated => Outcome::StreamUpdated,
            V3::StreamDeleted => Outcome::StreamDeleted,
            V3::Published(ack) => Outcome::Published(ack.into()),
            V3::Staged { index, duplicate } => Outcome::Staged { index, duplicate },
            V3::Recalled => Outcome::Recalled,
            V3::ConsumerCreated { created } => Outcome::ConsumerCreated { created },
            V3::ConsumerDeleted => Outcome::ConsumerDeleted,
            V3::Fetched(deliveries) => Outcome::Fetched(deliveries.into_iter().map(Delivery::from).collect()),
            V3::Acked { state, already_done } => Outcome::Acked { state: state.into(), already_done },
            V3::CursorCommitted { next_seq } => Outcome::CursorCommitted { next_seq },
            V3::ProducerInitialized(r) => Outcome::ProducerInitialized(r.into()),
            V3::TransactionBegun => Outcome::TransactionBegun,
            V3::TransactionPrepared => Outcome::TransactionPrepared,
            V3::TransactionCommitted { messages, next } => Outcome::TransactionCommitted {
                messages: messages.into_iter().map(PublishAck::from).collect(),
                next: next.into(),
            },
            V3::TransactionAborted { next } => Outcome::TransactionAborted { next: next.into() },
            V3::PeerRegistered => Outcome::PeerRegistered,
            V3::PeerProgressed => Outcome::PeerProgressed,
            V3::PeerUnregistered => Outcome::PeerUnregistered,
            V3::Ticked => Outcome::Ticked,
            V3::ConsumerUpdated => Outcome::ConsumerUpdated,
        }
    }
}

impl From<v3::AbortReason> for AbortReason {
    fn from(reason: v3::AbortReason) -> Self {
        match reason {
            v3::AbortReason::Requested => AbortReason::Requested,
            v3::AbortReason::Fenced => AbortReason::Fenced,
            v3::AbortReason::Timeout => AbortReason::Timeout,
            v3::AbortReason::CommitRefused => AbortReason::CommitRefused,
        }
    }
}

/// Why a message left a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum RemovalReason {
    /// Older than `max_age_ms`.
    Age,
    /// Its own TTL passed.
    Ttl,
    /// Made room under `max_messages` or `max_bytes`.
    StreamLimit,
    /// Made room under a per-subject limit (newest wins).
    SubjectLimit,
    /// Every consumer was done with it (interest or work-queue retention).
    Interest,
}

/// Why a transaction was aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum AbortReason {
    /// The producer asked.
    Requested,
    /// A newer instance of the producer was initialized.
    Fenced,
    /// It stayed open or prepared past its timeout.
    Timeout,
    /// Its commit was refused (a limit or a vanished stream); nothing was appended.
    CommitRefused,
}

/// What moved a consumer group to a new generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum GroupChange {
    /// A member joined (or joined again as a new incarnation).
    Joined,
    /// A member left.
    Left,
    /// A member missed its session timeout.
    Expired,
    /// A member gave up partitions.
    Released,
}

/// How a group spreads its stream's partitions over its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Strategy {
    /// Contiguous ranges of partitions, in member-name order; the first members get one more when it does not divide.
    Range,
    /// Partition `p` to the `p mod n`-th member in name order.
    RoundRobin,
    /// Balanced, moving as few partitions as balance allows; eager (every partition is revoked at a change).
    Sticky,
    /// The sticky assignment, incrementally: only the partitions that move are revoked, and assigned to their new
    /// owner once released.
    CooperativeSticky,
}

impl Strategy {
    /// Every strategy, in a fixed order.
    pub const ALL: [Strategy; 4] =
        [Strategy::Range, Strategy::RoundRobin, Strategy::Sticky, Strategy::CooperativeSticky];

    /// Its name: `range`, `round-robin`, `sticky`, `cooperative-sticky`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Range => "range",
            Strategy::RoundRobin => "round-robin",
            Strategy::Sticky => "sticky",
            Strategy::CooperativeSticky => "cooperative-sticky",
        }
    }

    /// Whether a change of membership revokes only what moves (otherwise everything is revoked first).
    pub fn is_cooperative(self) -> bool {
        self == Strategy::CooperativeSticky
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.name() == text)
            .ok_or_else(|| format!("unknown strategy {text:?}; one of range, round-robin, sticky, cooperative-sticky"))
    }
}

/// What one member sees of a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAssignment {
    /// The group's generation.
    pub generation: u64,
    /// Partitions it owns and may fetch from.
    pub partitions: Vec<u32>,
    /// Partitions it owns but must give up: finish or commit what it has of them, then release them.
    pub revoking: Vec<u32>,
    /// Partitions assigned to it that another member still owns; they come once released.
    pub pending: Vec<u32>,
    /// How long the cell waits for its next heartbeat.
    pub session_timeout_ms: u64,
}
