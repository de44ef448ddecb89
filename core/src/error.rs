//! Typed rejections: what a command gets back when it cannot be applied. A rejection never changes state (apart from
//! refilling a token bucket, which is a function of time alone).

use serde::{Deserialize, Serialize};

use crate::subject::SubjectError;

/// Which limit a `QuotaExceeded` refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Quota {
    /// The stream's `max_messages`.
    StreamMessages,
    /// The stream's `max_bytes`.
    StreamBytes,
    /// The stream's `max_messages_per_subject`.
    SubjectMessages,
    /// The stream's `max_bytes_per_subject`.
    SubjectBytes,
    /// The most messages one transaction may stage.
    TransactionMessages,
    /// The most bytes one transaction may stage.
    TransactionBytes,
    /// The tenant's most streams.
    TenantStreams,
    /// The tenant's most retained messages, across its streams.
    TenantMessages,
    /// The tenant's most retained bytes, across its streams.
    TenantBytes,
    /// The cell's most streams.
    CellStreams,
    /// The cell's most retained messages, across every stream.
    CellMessages,
    /// The cell's most retained bytes, across every stream.
    CellBytes,
}

/// Why a command was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Rejection {
    /// No stream of that name.
    #[error("stream {stream:?} not found")]
    StreamNotFound {
        /// The name asked for.
        stream: String,
    },
    /// No consumer of that name on the stream.
    #[error("consumer {consumer:?} not found on stream {stream:?}")]
    ConsumerNotFound {
        /// The stream.
        stream: String,
        /// The consumer asked for.
        consumer: String,
    },
    /// No stream claims the subject.
    #[error("no stream claims subject {subject:?}")]
    NoStreamForSubject {
        /// The subject published to.
        subject: String,
    },
    /// No retained message at that position.
    #[error("no message at {stream:?} partition {partition} sequence {seq}")]
    MessageNotFound {
        /// The stream.
        stream: String,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
    /// No producer with that id.
    #[error("producer {producer_id} not found; call init_producer")]
    ProducerNotFound {
        /// The id given.
        producer_id: u64,
    },
    /// No registered peer of that name.
    #[error("peer {peer:?} is not registered on stream {stream:?}")]
    PeerNotFound {
        /// The stream.
        stream: String,
        /// The peer.
        peer: String,
    },
    /// A malformed subject or filter.
    #[error("invalid subject {subject:?}: {reason}")]
    InvalidSubject {
        /// The subject as given.
        subject: String,
        /// What is wrong with it.
        reason: SubjectError,
    },
    /// A malformed name.
    #[error("invalid {kind} {name:?}: {reason}")]
    InvalidName {
        /// Which kind of name.
        kind: NameKind,
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A config that cannot work on its own.
    #[error("invalid config: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// A malformed argument that is not a name, subject or config.
    #[error("invalid request: {reason}")]
    Invalid {
        /// What is wrong.
        reason: String,
    },
    /// The stream or consumer exists with a different config (creating with the identical config succeeds).
    #[error("{what} {name:?} already exists with a different config")]
    Conflict {
        /// "stream" or "consumer".
        what: String,
        /// Its name.
        name: String,
    },
    /// A subject filter overlaps one claimed by another stream (or, on a work-queue stream, another consumer).
    #[error("subject filter {subject:?} overlaps {other:?} of {owner:?}")]
    SubjectOverlap {
        /// The new filter.
        subject: String,
        /// The existing filter.
        other: String,
        /// Who holds the existing filter.
        owner: String,
    },
    /// The stream is still referenced.
    #[error("stream {stream:?} is in use: {by}")]
    InUse {
        /// The stream.
        stream: String,
        /// What uses it.
        by: String,
    },
    /// The payload is larger than the stream allows.
    #[error("payload of {size} bytes exceeds the limit of {max}")]
    PayloadTooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// Conditional append on the partition's last sequence failed.
    #[error("wrong last sequence: the partition's last sequence is {last}")]
    WrongLastSequence {
        /// The actual last sequence (0 when the partition is empty).
        last: u64,
    },
    /// Conditional append on the subject's last sequence failed.
    #[error("wrong last subject sequence: the subject's last sequence is {last}")]
    WrongLastSubjectSequence {
        /// The actual last sequence of the subject (0 when it has no retained message).
        last: u64,
    },
    /// A discard-new limit is reached.
    #[error("quota exceeded: {quota:?} limit of {limit}")]
    QuotaExceeded {
        /// Which limit.
        quota: Quota,
        /// Its value.
        limit: u64,
    },
    /// The stream's token bucket is empty.
    #[error("rate limited; retry after {retry_after_ms} ms")]
    RateLimited {
        /// When one token will be available.
        retry_after_ms: u64,
    },
    /// Making room would delete a message a registered peer has not received yet.
    #[error("storage full: peer {lagging_peer:?} has received partition {partition} only up to {received}")]
    StorageFull {
        /// The peer holding retention back.
        lagging_peer: String,
        /// The partition.
        partition: u32,
        /// The last sequence the peer has received.
        received: u64,
    },
    /// The message is pinned by a message in another stream (a provenance row referencing it): retention and recall
    /// keep it until every pinning message is gone, so making room this way is refused.
    #[error("message {partition}/{seq} of stream {stream:?} is pinned (a provenance row references it)")]
    Pinned {
        /// The pinned message's stream.
        stream: String,
        /// Its partition.
        partition: u32,
        /// Its sequence.
        seq: u64,
    },
    /// The producer epoch is not the current one: a newer instance exists, or the transaction ended.
    #[error("producer fenced: current epoch is {current_epoch}")]
    Fenced {
        /// The producer's current epoch.
        current_epoch: u32,
    },
    /// The transaction is not in a state that allows the request.
    #[error("transaction state: {reason}")]
    TransactionState {
        /// What was expected.
        reason: String,
    },
    /// The transaction this request belonged to was aborted.
    #[error("transaction aborted: {reason}")]
    TransactionAborted {
        /// Why.
        reason: String,
    },
    /// Ack of a sequence the consumer has not delivered yet.
    #[error("partition {partition} sequence {seq} has not been delivered to this consumer")]
    NotDelivered {
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
    /// An in-progress for a delivery whose ack deadline already passed: the message awaits redelivery, and
    /// extending it would let the consumer hold more than its `max_in_flight`.
    #[error("the delivery of partition {partition} sequence {seq} expired; it awaits redelivery")]
    DeliveryExpired {
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
    /// A cursor commit below the consumer's committed position.
    #[error("cursor may only move forward; it is at {current}")]
    CursorRegression {
        /// The committed position (everything below it is done).
        current: u64,
    },
    /// The caller's credential names no principal of this cell.
    #[error("unauthenticated: {reason}")]
    Unauthenticated {
        /// What is wrong with the credential.
        reason: String,
    },
    /// The principal lacks the grant the request needs. Nothing was changed.
    #[error("permission denied: principal {principal:?} lacks {needs}")]
    PermissionDenied {
        /// The principal.
        principal: String,
        /// The grant it would need.
        needs: String,
    },
    /// No principal of that name.
    #[error("principal {principal:?} not found")]
    PrincipalNotFound {
        /// The name asked for.
        principal: String,
    },
    /// A cap on what clients grow in the replicated state is reached; nothing was changed.
    #[error("{cap} is at its cap of {limit}")]
    CapReached {
        /// Which cap.
        cap: Cap,
        /// Its value.
        limit: u64,
    },
    /// No consumer group of that name on the stream.
    #[error("group {group:?} not found on stream {stream:?}")]
    GroupNotFound {
        /// The stream.
        stream: String,
        /// The group asked for.
        group: String,
    },
    /// The member is not in the group (it never joined, left, or missed its session timeout): join again.
    #[error("{member:?} is not a member of group {group:?} (generation {generation}); join the group again")]
    UnknownMember {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The group's current generation.
        generation: u64,
    },
    /// The member does not own the partition, or was granted it after the generation it named: an ack, nack or commit
    /// from an older generation, or for a partition that moved, changes nothing.
    #[error(
        "member {member:?} of group {group:?} does not own partition {partition} at the generation it named (the \
         group is at generation {generation}); heartbeat for the current assignment"
    )]
    NotOwner {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The partition.
        partition: u32,
        /// The group's current generation.
        generation: u64,
    },
    /// The stream moved to another cell: nothing was written here. Send the write to that cell (the directory
    /// gives its addresses).
    #[error("stream {stream:?} moved to cell {cell:?} at ownership epoch {epoch}; nothing was written here")]
    Moved {
        /// The stream.
        stream: String,
        /// The cell that owns it now.
        cell: String,
        /// The ownership epoch it moved at.
        epoch: u64,
    },
    /// The stream is moving to this cell and accepts writes once it has caught up with the cell it comes from.
    #[error(
        "stream {stream:?} is moving here from cell {from:?} (ownership epoch {epoch}) and accepts writes once it has \
         caught up; retry shortly"
    )]
    StreamMoving {
        /// The stream.
        stream: String,
        /// The cell it moves from.
        from: String,
        /// The epoch it will be owned at here.
        epoch: u64,
    },
    /// A step of a move named an ownership epoch the cell has already passed (or, in the directory, not the
    /// current one): a later move overtook it. Nothing changed.
    #[error("stream {stream:?}: ownership epoch {epoch} is stale; the current epoch is {current}")]
    StaleEpoch {
        /// The stream.
        stream: String,
        /// The epoch asked for.
        epoch: u64,
        /// The epoch recorded.
        current: u64,
    },
    /// The directory records no cell of that name.
    #[error("cell {cell:?} is not in the directory; add it first")]
    CellNotFound {
        /// The cell asked for.
        cell: String,
    },
    /// The directory has not placed the stream on any cell.
    #[error("stream {stream:?} is not placed on any cell")]
    NotPlaced {
        /// The stream asked for.
        stream: String,
    },
    /// The stream is a mirror of a stream of another cell: it takes no writes of its own. Write to the source.
    #[error("stream {stream:?} mirrors stream {source_stream:?} of cell {cell:?} and takes no writes of its own")]
    Mirror {
        /// The mirror.
        stream: String,
        /// The source's cell.
        cell: String,
        /// The source stream.
        source_stream: String,
    },
    /// A recall was refused: the stream's recall log holds its limit of recalls a mirror has not applied yet. Nothing
    /// was recalled; retry once the mirror catches up, or unregister it.
    #[error(
        "stream {stream:?}: {pending} recalls wait for mirror {peer:?} to apply them, the limit; nothing was recalled"
    )]
    RecallsPending {
        /// The stream.
        stream: String,
        /// The mirror furthest behind.
        peer: String,
        /// Recalls waiting.
        pending: u64,
    },
}

/// Which cap a [`Rejection::CapReached`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Cap {
    /// Bytes of one message's key ([`crate::MAX_KEY_BYTES`]).
    KeyBytes,
    /// Transactional producers in the cell ([`crate::MAX_PRODUCERS`]).
    Producers,
    /// Open transactions in the cell ([`crate::MAX_OPEN_TRANSACTIONS`]).
    OpenTransactions,
    /// Message ids one stream's dedup index holds ([`crate::MAX_DEDUP_IDS`]).
    DedupIds,
    /// Members of one consumer group ([`crate::MAX_GROUP_MEMBERS`]).
    GroupMembers,
}

impl Cap {
    /// Every cap.
    pub const ALL: [Cap; 5] = [Cap::KeyBytes, Cap::Producers, Cap::OpenTransactions, Cap::DedupIds, Cap::GroupMembers];

    /// Its name (`key-bytes`, `dedup-ids`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for Cap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cap::KeyBytes => "the message key's size in bytes",
            Cap::Producers => "the number of transactional producers",
            Cap::OpenTransactions => "the number of open transactions",
            Cap::DedupIds => "the number of message ids in the stream's dedup window",
            Cap::GroupMembers => "the number of members of the consumer group",
        })
    }
}

/// Why a snapshot could not be restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The bytes do not start with the snapshot magic.
    #[error("not a cellog snapshot")]
    NotASnapshot,
    /// Written by a newer or unknown encoding.
    #[error("unsupported snapshot version {version}")]
    UnsupportedVersion {
        /// The version found.
        version: u32,
    },
    /// The checksum does not match the contents.
    #[error("snapshot checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    ChecksumMismatch {
        /// The stored crc32c.
        stored: u32,
        /// The crc32c of the contents.
        computed: u32,
    },
    /// The contents passed the checksum but do not decode.
    #[error("snapshot does not decode: {reason}")]
    Malformed {
        /// The decoder's message.
        reason: String,
    },
    /// A body the state refers to could not be read from the body store, or is missing from the snapshot, or does
    /// not verify.
    #[error("snapshot body {key}: {reason}")]
    Body {
        /// The body's key.
        key: u64,
        /// What went wrong.
        reason: String,
    },
    /// A snapshot of the state alone (its bodies kept by the host) was given where a whole one was needed.
    #[error("the snapshot holds no bodies; restore it over the body store that holds them")]
    NoBodies,
}

/// What kind of name a name rejection is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NameKind {
    /// A stream name.
    Stream,
    /// A consumer name.
    Consumer,
    /// A work-queue member name.
    Member,
    /// A registered peer name.
    Peer,
    /// A message id.
    MessageId,
    /// A transactional id.
    TransactionalId,
    /// A header name.
    Header,
    /// A principal's name.
    Principal,
    /// A cell's name.
    Cell,
    /// A tenant's name.
    Tenant,
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameKind::Stream => "stream name",
            NameKind::Consumer => "consumer name",
            NameKind::Member => "member name",
            NameKind::Peer => "peer name",
            NameKind::MessageId => "message id",
            NameKind::TransactionalId => "transactional id",
            NameKind::Header => "header",
            NameKind::Principal => "principal name",
            NameKind::Cell => "cell name",
            NameKind::Tenant => "tenant name",
        })
    }
}
