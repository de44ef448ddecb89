//! Durable consumers: a cursor per partition, the deliveries outstanding, redelivery, dead-lettering and lag.
//!
//! Everything below a partition's cursor has been looked at: each such message is either done (acknowledged,
//! terminated, dead-lettered, committed past, or filtered out) or outstanding (delivered and pending, ready for
//! redelivery, or waiting for a delay). The committed position of a partition (its ack floor) is the smallest
//! outstanding sequence, or the cursor when nothing is outstanding.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{AckState, Delivery};
use crate::config::ConsumerConfig;
use crate::partition::Partition;
use crate::subject::filter_matches;
use crate::time::Millis;

/// Where an outstanding message is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Phase {
    /// Delivered; becomes a redelivery candidate at `deadline`.
    Pending { deadline: Millis },
    /// A candidate for (re)delivery on the next fetch.
    Ready,
    /// Held back until `until` (a nack delay, or a delayed first delivery).
    Waiting { until: Millis },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Outstanding {
    pub delivery_count: u32,
    pub phase: Phase,
    pub state: AckState,
    /// The member that holds the current delivery.
    pub member: Option<Arc<str>>,
}

/// A message that left the consumer for good without being processed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeadLetter {
    pub consumer: Arc<str>,
    pub partition: u32,
    pub seq: u64,
    pub delivery_count: u32,
    pub reason: &'static str,
}

/// A timer a consumer asks the cell to set: fire at `due` for `(partition, seq)`.
pub(crate) type DeliveryTimer = (Millis, u32, u64);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Consumer {
    pub id: u64,
    pub name: Arc<str>,
    pub config: ConsumerConfig,
    pub created_at: Millis,
    /// Per partition, the next sequence to look at for a first delivery.
    pub cursors: Vec<u64>,
    pub outstanding: BTreeMap<(u32, u64), Outstanding>,
    pub ready: BTreeSet<(u32, u64)>,
    pub n_pending: u32,
    /// The partition the next fetch starts scanning from, so partitions share fetches fairly.
    pub next_partition: u32,
    pub n_delivered: u64,
    pub n_redelivered: u64,
    pub n_acked: u64,
    pub n_dead_lettered: u64,
}

/// Most slots one fetch looks at for new messages, so a fetch over a long filtered-out stretch stays bounded; the
/// cursor keeps its place and the next fetch goes on.
pub(crate) const FETCH_SCAN_LIMIT: usize = 65_536;

impl Consumer {
    pub fn new(id: u64, name: Arc<str>, config: ConsumerConfig, cursors: Vec<u64>, at: Millis) -> Self {
        Consumer {
            id,
            name,
            config,
            created_at: at,
            cursors,
            outstanding: BTreeMap::new(),
            ready: BTreeSet::new(),
            n_pending: 0,
            next_partition: 0,
            n_delivered: 0,
            n_redelivered: 0,
            n_acked: 0,
            n_dead_lettered: 0,
        }
    }

    pub fn matches(&self, subject: &str) -> bool {
        self.config.filter_subject.as_deref().is_none_or(|filter| filter_matches(filter, subject))
    }

    /// Whether the consumer is finished with a message it matches: looked at and no longer outstanding.
    pub fn is_done(&self, partition: u32, seq: u64) -> bool {
        seq < self.cursors[partition as usize] && !self.outstanding.contains_key(&(partition, seq))
    }

    /// The committed position of a partition: everything below it is done.
    pub fn ack_floor(&self, partition: u32) -> u64 {
        self.outstanding
            .range((partition, 0)..=(partition, u64::MAX))
            .next()
            .map_or(self.cursors[partition as usize], |(&(_, seq), _)| seq)
    }

    /// Removes an outstanding entry, keeping the counters and the ready index in step.
    pub fn forget(&mut self, partition: u32, seq: u64) -> Option<Outstanding> {
        let entry = self.outstanding.remove(&(partition, seq))?;
        match entry.phase {
            Phase::Pending { .. } => self.n_pending -= 1,
            Phase::Ready => {
                self.ready.remove(&(partition, seq));
            }
            Phase::Waiting { .. } => {}
        }
        Some(entry)
    }

    /// Moves an outstanding entry to a new phase, keeping the counters and the ready index in step.
    pub fn set_phase(&mut self, partition: u32, seq: u64, phase: Phase) {
        let entry = self.outstanding.get_mut(&(partition, seq)).expect("set_phase on an outstanding entry");
        match entry.phase {
            Phase::Pending { .. } => self.n_pending -= 1,
            Phase::Ready => {
                self.ready.remove(&(partition, seq));
            }
            Phase::Waiting { .. } => {}
        }
        entry.phase = phase;
        match phase {
            Phase::Pending { .. } => self.n_pending += 1,
            Phase::Ready => {
                self.ready.insert((partition, seq));
            }
            Phase::Waiting { .. } => {}
        }
    }

    /// Whether `max_deliver` forbids another delivery.
    pub fn exhausted(&self, delivery_count: u32) -> bool {
        self.config.max_deliver.is_some_and(|max| delivery_count >= max)
    }

    /// Ends an outstanding message's life in this consumer as a dead letter.
    pub fn dead_letter(&mut self, partition: u32, seq: u64, reason: &'static str) -> Option<DeadLetter> {
        let entry = self.forget(partition, seq)?;
        self.n_dead_lettered += 1;
        Some(DeadLetter { consumer: self.name.clone(), partition, seq, delivery_count: entry.delivery_count, reason })
    }

    /// Delivers up to `max` messages to `member`: redelivery candidates first (oldest first), then new messages from
    /// the cursors, starting at a rotating partition. Returns the deliveries and the timers to set.
    pub fn fetch(
        &mut self,
        partitions: &[Partition],
        member: &Arc<str>,
        max: u32,
        at: Millis,
    ) -> (Vec<Delivery>, Vec<DeliveryTimer>) {
        let mut deliveries = Vec::new();
        let mut timers = Vec::new();
        let mut budget = max.min(self.config.max_in_flight.saturating_sub(self.n_pending));
        let deadline = at.plus(self.config.ack_wait_ms);

        let candidates: Vec<(u32, u64)> = self.ready.iter().copied().collect();
        for (partition, seq) in candidates {
            if budget == 0 {
                break;
            }
            let Some(message) = partitions[partition as usize].get(seq) else {
                // The message is gone (age, limits, TTL): nothing left to deliver.
                self.forget(partition, seq);
                continue;
            };
            let record = message.record(partition, seq);
            self.set_phase(partition, seq, Phase::Pending { deadline });
            let entry = self.outstanding.get_mut(&(partition, seq)).expect("just set");
            entry.delivery_count += 1;
            entry.state = AckState::Received;
            entry.member = Some(member.clone());
            if entry.delivery_count > 1 {
                self.n_redelivered += 1;
            }
            self.n_delivered += 1;
            deliveries.push(Delivery { record, delivery_count: entry.delivery_count, ack_deadline: deadline });
            timers.push((deadline, partition, seq));
            budget -= 1;
        }

        let n_partitions = partitions.len() as u32;
        let mut scanned = 0usize;
        for offset in 0..n_partitions {
            let partition = (self.next_partition + offset) % n_partitions;
            let log = &partitions[partition as usize];
            let cursor = &mut self.cursors[partition as usize];
            *cursor = (*cursor).max(log.first_seq);
            while budget > 0 && scanned < FETCH_SCAN_LIMIT && *cursor < log.next_seq() {
                let seq = *cursor;
                *cursor += 1;
                scanned += 1;
                let Some(message) = log.get(seq) else { continue };
                let matches =
                    self.config.filter_subject.as_deref().is_none_or(|filter| filter_matches(filter, &message.subject));
                if !matches {
                    continue;
                }
                #[cfg(madsim)]
                let early = cellog_planted::active(cellog_planted::Mutant::DelayedVisibleEarly);
                #[cfg(not(madsim))]
                let early = false;
                if let Some(deliver_at) = message.deliver_at().filter(|deliver_at| *deliver_at > at && !early) {
                    self.outstanding.insert(
                        (partition, seq),
                        Outstanding {
                            delivery_count: 0,
                            phase: Phase::Waiting { until: deliver_at },
                            state: AckState::Received,
                            member: None,
                        },
                    );
                    timers.push((deliver_at, partition, seq));
                    continue;
                }
                self.outstanding.insert(
                    (partition, seq),
                    Outstanding {
                        delivery_count: 1,
                        phase: Phase::Pending { deadline },
                        state: AckState::Received,
                        member: Some(member.clone()),
                    },
                );
                self.n_pending += 1;
                self.n_delivered += 1;
                deliveries.push(Delivery {
                    record: message.record(partition, seq),
                    delivery_count: 1,
                    ack_deadline: deadline,
                });
                timers.push((deadline, partition, seq));
                budget -= 1;
            }
        }
        if n_partitions > 0 {
            self.next_partition = (self.next_partition + 1) % n_partitions;
        }
        // Paired with the cursors: every outstanding delivery lies below its partition's cursor, so the ack floor
        // never passes the cursor.
        debug_assert!(self.cursors.iter().enumerate().all(|(partition, &cursor)| {
            let partition = partition as u32;
            self.outstanding
                .range((partition, 0)..=(partition, u64::MAX))
                .next_back()
                .is_none_or(|(&(_, seq), _)| seq < cursor)
        }));
        (deliveries, timers)
    }
}
