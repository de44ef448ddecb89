//! The vocabulary of the cell, coming out: the outcome of a command, the records and deliveries readers see, and why
//! a message or a transaction ended.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::body::BodyRef;
use crate::command::{Headers, ProducerRef};
use crate::error::Rejection;
use crate::snapshot::v3;
use crate::time::Millis;

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

/// What an ack did: the delivery's state after it, and whether the message was already done (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckAnswer {
    /// The delivery's state after the ack.
    pub state: AckState,
    /// The message was already done for this consumer: nothing changed.
    pub already_done: bool,
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
