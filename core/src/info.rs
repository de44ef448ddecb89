//! Read-only views of the cell for operators and clients: stream and consumer info, lag.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{ConsumerConfig, StreamConfig};
use crate::outcome::AckState;
use crate::time::Millis;

/// One partition of a stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionInfo {
    /// The partition.
    pub partition: u32,
    /// The oldest retained sequence (equal to `high_watermark + 1` when empty).
    pub low_watermark: u64,
    /// The last sequence assigned (0 before the first message).
    pub high_watermark: u64,
    /// Messages retained.
    pub n_messages: u64,
    /// Bytes retained.
    pub n_bytes: u64,
}

/// A registered peer and what it has received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// The peer's name.
    pub name: String,
    /// Per partition, the last sequence received.
    pub received: Vec<u64>,
}

/// A stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Its name.
    pub name: Arc<str>,
    /// Its config.
    pub config: StreamConfig,
    /// When it was created.
    pub created_at: Millis,
    /// Messages retained.
    pub n_messages: u64,
    /// Bytes retained.
    pub n_bytes: u64,
    /// Distinct subjects with retained messages.
    pub n_subjects: u64,
    /// Message ids remembered for deduplication.
    pub n_dedup_ids: u64,
    /// Its partitions.
    pub partitions: Vec<PartitionInfo>,
    /// Its consumers' names.
    pub consumers: Vec<Arc<str>>,
    /// Its registered peers.
    pub peers: Vec<PeerInfo>,
}

/// A consumer's position in one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionLag {
    /// The partition.
    pub partition: u32,
    /// Next sequence to look at for a first delivery.
    pub cursor: u64,
    /// Everything below this is done.
    pub ack_floor: u64,
    /// Retained-or-future sequences not yet done: from the ack floor (or the low watermark, if later) to the high
    /// watermark. Counted in sequences, filtered-out subjects included.
    pub lag: u64,
    /// Deliveries outstanding in this partition (pending, ready or waiting).
    pub n_outstanding: u64,
}

/// A consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerInfo {
    /// Its name.
    pub name: Arc<str>,
    /// Its config.
    pub config: ConsumerConfig,
    /// When it was created.
    pub created_at: Millis,
    /// Per partition positions.
    pub partitions: Vec<PartitionLag>,
    /// Sum of the partitions' lag.
    pub lag_total: u64,
    /// Largest lag of one partition.
    pub lag_max: u64,
    /// Deliveries awaiting an ack.
    pub n_pending: u32,
    /// Messages ready for redelivery.
    pub n_ready: u64,
    /// Milliseconds since the oldest message not yet done was stored (0 when none), as of `now`.
    pub oldest_unacked_age_ms: u64,
    /// Deliveries made.
    pub n_delivered: u64,
    /// Of which redeliveries.
    pub n_redelivered: u64,
    /// Acks (applied or replicated).
    pub n_acked: u64,
    /// Messages dead-lettered.
    pub n_dead_lettered: u64,
}

/// A transactional producer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerInfo {
    /// Its id.
    pub producer_id: u64,
    /// Its stable transactional id.
    pub transactional_id: Arc<str>,
    /// Its current epoch.
    pub epoch: u32,
    /// Messages staged in its open transaction, if one is open.
    pub open_transaction: Option<u64>,
    /// Whether the open transaction is prepared.
    pub prepared: bool,
}

/// Where an outstanding delivery is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryPhase {
    /// Delivered; a redelivery candidate from `ack_deadline` on.
    Pending {
        /// When it expires unless acknowledged or extended.
        ack_deadline: Millis,
    },
    /// Waiting to be delivered again on the next fetch.
    Ready,
    /// Held back until `until` (a nack delay, or a delayed first delivery).
    Waiting {
        /// When it becomes ready.
        until: Millis,
    },
}

/// One message a consumer has looked at and is not done with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryInfo {
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub seq: u64,
    /// Deliveries so far (0 for a delayed message not delivered yet).
    pub delivery_count: u32,
    /// The state the last answer recorded.
    pub state: AckState,
    /// The member holding the current delivery.
    pub member: Option<Arc<str>>,
    /// Where it is.
    pub phase: DeliveryPhase,
}
