//! What an apply leaves for its host, in two kinds: [`BodyOp`] it must do (a body to store, copy or release, in the
//! same storage batch as the entry), and [`Transition`]s a trace may show (what happened to messages, consumers,
//! transactions and principals). Work is always queued; a transition is built only while the host traces them
//! ([`crate::Cell::trace_transitions`]), so a node that traces nothing pays for none.
//!
//! Both queue in the cell until drained ([`crate::Cell::drain_work`], [`crate::Cell::drain_transitions`]), which the
//! host must do after every apply ([`crate::Cell::apply`] refuses to run while any is queued). What the cell itself
//! follows within an apply (the streams whose counts changed, for the quota ledger; the messages removed, for pins)
//! it keeps beside them, whether or not anything traces.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::auth::{Grants, TokenHash};
use crate::body::BodyRef;
use crate::outcome::{AbortReason, GroupChange, RemovalReason};

/// Storage work for the host, in order, in the same storage batch as the entry that produced it (see [`crate::body`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum BodyOp {
    /// Store `bytes` under `body.key`: a published message's payload, with the reference the cell keeps (so a host
    /// can check the bytes wherever it keeps them).
    BodyStored {
        /// The reference: key, length and crc32c.
        body: BodyRef,
        /// The bytes.
        bytes: Bytes,
    },
    /// Store under `to` a copy of the body under `from` (a dead letter's copy). A host that cannot read `from` stores
    /// nothing under `to`, and a later read of the copy fails its check.
    BodyCopied {
        /// The original's key.
        from: u64,
        /// The copy's key.
        to: u64,
    },
    /// No message refers to the body under `key` any more. A host whose state becomes durable later than its bodies
    /// deletes it once a durable state no longer refers to it.
    BodyReleased {
        /// The key.
        key: u64,
    },
}

/// What an apply did, for a trace: the golden traces and the simulator's trace are made of these. Built only while the
/// host traces them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Transition {
    /// A message was appended.
    Appended {
        /// The stream.
        stream: Arc<str>,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
    /// A message was removed.
    Removed {
        /// The stream.
        stream: Arc<str>,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// Why.
        reason: RemovalReason,
    },
    /// A message's payload was replaced by a tombstone.
    Recalled {
        /// The stream.
        stream: Arc<str>,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
    /// A delivery passed its ack deadline and can be redelivered.
    DeliveryExpired {
        /// The stream.
        stream: Arc<str>,
        /// The consumer.
        consumer: Arc<str>,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// Deliveries so far.
        delivery_count: u32,
    },
    /// A message left a consumer for good after failing or exhausting its deliveries.
    DeadLettered {
        /// The stream.
        stream: Arc<str>,
        /// The consumer.
        consumer: Arc<str>,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// Deliveries made.
        delivery_count: u32,
        /// Where the copy went: the dead-letter stream, partition and sequence, or none when the stream has no
        /// dead-letter stream.
        copy: Option<(Arc<str>, u32, u64)>,
    },
    /// A transaction's messages became visible.
    TransactionCommitted {
        /// The producer.
        producer_id: u64,
        /// The epoch that committed.
        epoch: u32,
        /// How many messages became visible.
        n_messages: u32,
    },
    /// A transaction was aborted.
    TransactionAborted {
        /// The producer.
        producer_id: u64,
        /// The epoch that was aborted.
        epoch: u32,
        /// Why.
        reason: AbortReason,
    },
    /// A transactional producer idle for [`crate::PRODUCER_IDLE_MS`] was forgotten: its id and epochs are fenced for
    /// good, and its transactional id starts afresh.
    ProducerExpired {
        /// The producer.
        producer_id: u64,
        /// Its transactional id.
        transactional_id: Arc<str>,
    },
    /// A stream was deleted with all its messages.
    StreamDeleted {
        /// The stream.
        stream: Arc<str>,
    },
    /// A principal was created or its grants replaced.
    Granted {
        /// The principal.
        principal: Arc<str>,
        /// Its grants now.
        grants: Grants,
    },
    /// A principal was deleted.
    PrincipalDeleted {
        /// The principal.
        principal: Arc<str>,
    },
    /// A principal got a token.
    TokenAdded {
        /// The principal.
        principal: Arc<str>,
        /// The token's hash.
        token: TokenHash,
    },
    /// A token was revoked.
    TokenRevoked {
        /// The principal that held it.
        principal: Arc<str>,
        /// The token's hash.
        token: TokenHash,
    },
    /// A consumer group moved to a new generation: a member joined, left, expired or released partitions.
    GroupChanged {
        /// The stream.
        stream: Arc<str>,
        /// The group.
        group: Arc<str>,
        /// Its new generation.
        generation: u64,
        /// The member whose command (or expiry) changed it.
        member: Arc<str>,
        /// What happened.
        change: GroupChange,
        /// Partitions granted to a member at this generation.
        granted: Vec<(Arc<str>, u32)>,
        /// Partitions a member is newly told to give up.
        revoking: Vec<(Arc<str>, u32)>,
        /// Partitions their owner gave up (their outstanding deliveries go back for redelivery).
        released: Vec<u32>,
    },
}

/// A message by stream, partition and sequence.
type Removal = (Arc<str>, u32, u64);

/// The queue an apply fills: work, transitions when traced, and what the cell follows within the apply.
#[derive(Clone, Debug, Default)]
pub(crate) struct Effects {
    work: Vec<BodyOp>,
    /// Whether the host traces transitions (a setting of the host's, not state).
    traced: bool,
    transitions: Vec<Transition>,
    /// The streams whose counts changed in this apply, a run of one stream entered once (the ledger re-reads them).
    changed: Vec<Arc<str>>,
    /// The messages removed in this apply (what they pinned is released).
    removed: Vec<Removal>,
}

/// Pending work and transitions compare; the host's setting and what an apply follows do not (a restored cell equals
/// the one it was taken from).
impl PartialEq for Effects {
    fn eq(&self, other: &Self) -> bool {
        self.work == other.work && self.transitions == other.transitions
    }
}

impl Eq for Effects {}

impl Effects {
    /// Queues storage work.
    #[inline]
    pub(crate) fn work(&mut self, work: BodyOp) {
        self.work.push(work);
    }

    /// Queues storage work, in order.
    #[inline]
    pub(crate) fn extend_work(&mut self, work: impl IntoIterator<Item = BodyOp>) {
        self.work.extend(work);
    }

    /// Queues the transition `build` makes, only while the host traces them.
    #[inline]
    pub(crate) fn note(&mut self, build: impl FnOnce() -> Transition) {
        if self.traced {
            self.transitions.push(build());
        }
    }

    /// A message was appended to `stream`.
    #[inline]
    pub(crate) fn appended(&mut self, stream: &Arc<str>, partition: u32, seq: u64) {
        self.changed(stream);
        self.note(|| Transition::Appended { stream: stream.clone(), partition, seq });
    }

    /// A message left `stream`.
    #[inline]
    pub(crate) fn removed(&mut self, stream: &Arc<str>, partition: u32, seq: u64, reason: RemovalReason) {
        self.changed(stream);
        self.removed.push((stream.clone(), partition, seq));
        self.note(|| Transition::Removed { stream: stream.clone(), partition, seq, reason });
    }

    /// A message's payload in `stream` was replaced by a tombstone.
    #[inline]
    pub(crate) fn recalled(&mut self, stream: &Arc<str>, partition: u32, seq: u64) {
        self.changed(stream);
        self.note(|| Transition::Recalled { stream: stream.clone(), partition, seq });
    }

    /// `stream` was deleted.
    #[inline]
    pub(crate) fn stream_deleted(&mut self, stream: &Arc<str>) {
        self.changed(stream);
        self.note(|| Transition::StreamDeleted { stream: stream.clone() });
    }

    #[inline]
    fn changed(&mut self, stream: &Arc<str>) {
        if self.changed.last().is_none_or(|last| !Arc::ptr_eq(last, stream) && last != stream) {
            self.changed.push(stream.clone());
        }
    }

    /// The streams whose counts changed in this apply (each run of one stream once).
    pub(crate) fn changed_streams(&self) -> &[Arc<str>] {
        &self.changed
    }

    /// How many removals this apply has made so far.
    pub(crate) fn n_removed(&self) -> usize {
        self.removed.len()
    }

    /// The removals from the `from`th on.
    pub(crate) fn removed_since(&self, from: usize) -> &[Removal] {
        &self.removed[from..]
    }

    /// Forgets what this apply followed; its work and transitions wait for the host.
    pub(crate) fn end_apply(&mut self) {
        self.changed.clear();
        self.removed.clear();
    }

    /// Whether work or transitions wait to be drained, and how many.
    pub(crate) fn queued(&self) -> usize {
        self.work.len() + self.transitions.len()
    }

    pub(crate) fn set_traced(&mut self, traced: bool) {
        self.traced = traced;
    }

    pub(crate) fn traced(&self) -> bool {
        self.traced
    }

    pub(crate) fn drain_work(&mut self) -> std::vec::Drain<'_, BodyOp> {
        self.work.drain(..)
    }

    pub(crate) fn drain_transitions(&mut self) -> std::vec::Drain<'_, Transition> {
        self.transitions.drain(..)
    }
}
