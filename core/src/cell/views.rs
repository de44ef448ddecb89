//! What hosts read: watermarks, positions, lag, outstanding deliveries and stored records, by reference.

use std::sync::Arc;

use super::Cell;
use super::limits::{MAX_READ, invalid};
use super::transaction::TransactionState;
use crate::command::Record;
use crate::consumer::Phase;
use crate::error::Rejection;
use crate::info::{
    ConsumerInfo, DeliveryInfo, DeliveryPhase, PartitionInfo, PartitionLag, PeerInfo, ProducerInfo, StreamInfo,
};
use crate::time::Millis;

impl Cell {
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
}
