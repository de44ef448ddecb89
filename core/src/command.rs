//! The vocabulary of the cell, going in: commands and what they carry (publish requests, ack kinds, a group's
//! strategy). What comes out is in [`crate::outcome`] and [`crate::effect`].

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::auth::{Actor, Grants, TokenHash};
use crate::config::{ConsumerConfig, StreamConfig};
use crate::snapshot::v3;

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
