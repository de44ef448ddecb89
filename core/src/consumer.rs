//! Durable consumers: a cursor per partition, the deliveries outstanding, redelivery, dead-lettering and lag.
//!
//! Everything below a partition's cursor has been looked at: each such message is either done (acknowledged,
//! terminated, dead-lettered, committed past, or filtered out) or outstanding (delivered and pending, ready for
//! redelivery, or waiting for a delay). The committed position of a partition (its ack floor) is the smallest
//! outstanding sequence, or the cursor when nothing is outstanding.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use crate::command::AckKind;
use crate::config::ConsumerConfig;
use crate::error::Rejection;
use crate::index::SubjectState;
use crate::info::{ConsumerInfo, DeliveryInfo, DeliveryPhase, PartitionLag};
use crate::outcome::{AckState, Delivery};
use crate::partition::Partition;
use crate::snapshot::v3;
use crate::subject::filter_matches;
use crate::time::Millis;

/// Where an outstanding message is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Phase {
    /// Delivered; becomes a redelivery candidate at `deadline`.
    Pending { deadline: Millis },
    /// A candidate for (re)delivery on the next fetch.
    Ready,
    /// Held back until `until` (a nack delay, or a delayed first delivery).
    Waiting { until: Millis },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Outstanding {
    pub delivery_count: u32,
    pub phase: Phase,
    pub state: AckState,
    /// The member that holds the current delivery.
    pub member: Option<Arc<str>>,
}

impl From<v3::Phase> for Phase {
    fn from(phase: v3::Phase) -> Self {
        match phase {
            v3::Phase::Pending { deadline } => Phase::Pending { deadline: deadline.into() },
            v3::Phase::Ready => Phase::Ready,
            v3::Phase::Waiting { until } => Phase::Waiting { until: until.into() },
        }
    }
}

impl From<v3::Outstanding> for Outstanding {
    fn from(outstanding: v3::Outstanding) -> Self {
        Outstanding {
            delivery_count: outstanding.delivery_count,
            phase: outstanding.phase.into(),
            state: outstanding.state.into(),
            member: outstanding.member,
        }
    }
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

/// What an ack did.
#[derive(Debug)]
pub(crate) struct Acked {
    pub state: AckState,
    /// The message was done with already; nothing changed.
    pub already_done: bool,
    /// When a delivery timer for the message is due: a new ack deadline, or the end of a nack's delay.
    pub timer: Option<Millis>,
    pub dead_letter: Option<DeadLetter>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Consumer {
    id: u64,
    name: Arc<str>,
    config: ConsumerConfig,
    created_at: Millis,
    /// Per partition, the next sequence to look at for a first delivery.
    cursors: Vec<u64>,
    outstanding: BTreeMap<(u32, u64), Outstanding>,
    ready: BTreeSet<(u32, u64)>,
    n_pending: u32,
    /// The partition the next fetch starts scanning from, so partitions share fetches fairly.
    next_partition: u32,
    n_delivered: u64,
    n_redelivered: u64,
    n_acked: u64,
    n_dead_lettered: u64,
}

/// Most slots one fetch looks at for new messages, so a fetch over a long filtered-out stretch stays bounded; the
/// cursor keeps its place and the next fetch goes on.
pub(crate) const FETCH_SCAN_LIMIT: usize = 65_536;

/// Most slots [`Consumer::work`] looks at for a message its filter matches before it answers [`Work::Skip`]: small,
/// since every subscription asks after every applied batch.
const WORK_SCAN_LIMIT: usize = 1_024;

/// How many of a matching subject's latest messages [`Consumer::work`] looks at before it looks at the slots.
const WORK_SUBJECT_TAIL: usize = 64;

/// What a fetch from a consumer would do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Nothing: no room for another delivery, or nothing past the cursors and no redelivery ready.
    None,
    /// Move cursors over messages the consumer's filter does not match (its lag and ack floor follow), and deliver
    /// a match only if one lies further than [`WORK_SCAN_LIMIT`] slots on.
    Skip,
    /// Deliver (or redeliver) a message, or start a delayed one's wait.
    Deliver,
}

impl From<v3::Consumer> for Consumer {
    fn from(consumer: v3::Consumer) -> Self {
        Consumer {
            id: consumer.id,
            name: consumer.name,
            config: consumer.config.into(),
            created_at: consumer.created_at.into(),
            cursors: consumer.cursors,
            outstanding: consumer.outstanding.into_iter().map(|(at, outstanding)| (at, outstanding.into())).collect(),
            ready: consumer.ready,
            n_pending: consumer.n_pending,
            next_partition: consumer.next_partition,
            n_delivered: consumer.n_delivered,
            n_redelivered: consumer.n_redelivered,
            n_acked: consumer.n_acked,
            n_dead_lettered: consumer.n_dead_lettered,
        }
    }
}

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

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Replaces the config; the filter and deliver policy are fixed.
    pub fn update_config(&mut self, config: ConsumerConfig) -> Result<(), Rejection> {
        if self.config.filter_subject != config.filter_subject || self.config.deliver_policy != config.deliver_policy {
            return Err(Rejection::InvalidConfig {
                reason: "a consumer's filter and deliver policy are fixed; create another consumer".to_string(),
            });
        }
        self.config = config;
        Ok(())
    }

    /// Its deliveries awaiting an ack.
    pub fn n_pending(&self) -> u32 {
        self.n_pending
    }

    pub fn matches(&self, subject: &str) -> bool {
        self.config.filter_subject.as_deref().is_none_or(|filter| filter_matches(filter, subject))
    }

    /// Whether the consumer is finished with a message it matches: looked at and no longer outstanding.
    pub fn is_done(&self, partition: u32, seq: u64) -> bool {
        seq < self.cursors[partition as usize] && !self.outstanding.contains_key(&(partition, seq))
    }

    /// Whether a message awaits anything of this consumer (an ack, a redelivery, the end of a delay).
    pub fn is_outstanding(&self, partition: u32, seq: u64) -> bool {
        self.outstanding.contains_key(&(partition, seq))
    }

    /// Whether a delivery timer set for `due` would still do something when it fires (see
    /// [`Consumer::delivery_timer_fired`]).
    pub fn delivery_timer_is_live(&self, partition: u32, seq: u64, due: Millis) -> bool {
        self.outstanding.get(&(partition, seq)).is_some_and(|entry| match entry.phase {
            Phase::Pending { deadline } => deadline == due,
            Phase::Waiting { until } => until == due,
            Phase::Ready => false,
        })
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

    /// Applies an ack of `kind` at `at` to a message of `partition` (which exists). Refuses one not delivered yet, and a
    /// progress ack of one whose delivery expired.
    pub fn ack(&mut self, partition: u32, seq: u64, kind: AckKind, at: Millis) -> Result<Acked, Rejection> {
        if seq >= self.cursors[partition as usize] {
            return Err(Rejection::NotDelivered { partition, seq });
        }
        let Some(entry) = self.outstanding.get(&(partition, seq)) else {
            return Ok(Acked { state: AckState::Applied, already_done: true, timer: None, dead_letter: None });
        };
        let delivery_count = entry.delivery_count;
        if delivery_count == 0 {
            // A delayed message that has not been delivered yet.
            return Err(Rejection::NotDelivered { partition, seq });
        }
        let mut dead_letter = None;
        let mut timer = None;
        let state = match kind {
            AckKind::Applied | AckKind::Replicated => {
                #[cfg(madsim)]
                let forget = !cellog_planted::active(cellog_planted::Mutant::RedeliveryAfterAck);
                #[cfg(not(madsim))]
                let forget = true;
                if forget {
                    self.forget(partition, seq);
                }
                self.n_acked += 1;
                if kind == AckKind::Applied { AckState::Applied } else { AckState::Replicated }
            }
            AckKind::Received | AckKind::InProgress => {
                if !matches!(entry.phase, Phase::Pending { .. }) {
                    return Err(Rejection::DeliveryExpired { partition, seq });
                }
                let deadline = at.plus(self.config.ack_wait_ms);
                self.set_phase(partition, seq, Phase::Pending { deadline });
                self.outstanding.get_mut(&(partition, seq)).expect("outstanding").state = AckState::Received;
                timer = Some(deadline);
                AckState::Received
            }
            #[cfg(madsim)]
            AckKind::Nack { .. } if cellog_planted::active(cellog_planted::Mutant::NackForgets) => {
                self.forget(partition, seq);
                AckState::Nack
            }
            AckKind::Nack { delay_ms } => {
                if self.exhausted(delivery_count) {
                    dead_letter = self.dead_letter(partition, seq, "max_deliver");
                } else if delay_ms > 0 {
                    let until = at.plus(delay_ms);
                    self.set_phase(partition, seq, Phase::Waiting { until });
                    timer = Some(until);
                } else {
                    self.set_phase(partition, seq, Phase::Ready);
                }
                if let Some(entry) = self.outstanding.get_mut(&(partition, seq)) {
                    entry.state = AckState::Nack;
                }
                AckState::Nack
            }
            AckKind::Failed => {
                dead_letter = self.dead_letter(partition, seq, "failed");
                AckState::Failed
            }
            AckKind::Term => {
                self.forget(partition, seq);
                AckState::Failed
            }
        };
        Ok(Acked { state, already_done: false, timer, dead_letter })
    }

    /// A delivery timer set for `due` fired for `(partition, seq)`: an expired ack deadline makes the message ready
    /// again, or a dead letter once `max_deliver` is reached; an ended delay makes it ready. A stale timer changes
    /// nothing. Returns an expired delivery's count, with its dead letter if it became one.
    pub fn delivery_timer_fired(&mut self, partition: u32, seq: u64, due: Millis) -> Option<(u32, Option<DeadLetter>)> {
        let entry = self.outstanding.get(&(partition, seq))?;
        match entry.phase {
            #[cfg(madsim)]
            Phase::Pending { .. } if cellog_planted::active(cellog_planted::Mutant::AckWaitNeverExpires) => None,
            Phase::Pending { deadline } if deadline == due => {
                let delivery_count = entry.delivery_count;
                if self.exhausted(delivery_count) {
                    Some((delivery_count, self.dead_letter(partition, seq, "max_deliver")))
                } else {
                    self.set_phase(partition, seq, Phase::Ready);
                    Some((delivery_count, None))
                }
            }
            Phase::Waiting { until } if until == due => {
                self.set_phase(partition, seq, Phase::Ready);
                None
            }
            _ => None,
        }
    }

    /// Commits `partition`'s cursor to `next_seq`, `log_next` being the partition's next sequence: what lies below is
    /// done. Returns the sequence from which interest retention should look again.
    pub fn commit_cursor(&mut self, partition: u32, next_seq: u64, log_next: u64) -> Result<u64, Rejection> {
        let floor = self.ack_floor(partition);
        if next_seq < floor {
            return Err(Rejection::CursorRegression { current: floor });
        }
        if next_seq > log_next.max(self.cursors[partition as usize]) {
            return Err(Rejection::Invalid {
                reason: format!("cannot commit past the end of partition {partition} (next sequence {log_next})"),
            });
        }
        let done: Vec<u64> =
            self.outstanding.range((partition, 0)..(partition, next_seq)).map(|(&(_, seq), _)| seq).collect();
        for seq in done {
            self.forget(partition, seq);
            self.n_acked += 1;
        }
        let cursor = &mut self.cursors[partition as usize];
        let previous = *cursor;
        *cursor = (*cursor).max(next_seq);
        Ok(floor.min(previous))
    }

    /// Its positions, lag and oldest unacknowledged age over `partitions` (its stream's) as of `now`.
    pub fn info(&self, partitions: &[Partition], now: Millis) -> ConsumerInfo {
        let mut lags = Vec::with_capacity(partitions.len());
        let mut oldest: Option<Millis> = None;
        for (index, log) in partitions.iter().enumerate() {
            let partition = index as u32;
            let ack_floor = self.ack_floor(partition);
            let from = ack_floor.max(log.first_seq);
            let lag = log.next_seq().saturating_sub(from);
            let n_outstanding = self.outstanding.range((partition, 0)..=(partition, u64::MAX)).count() as u64;
            // The oldest message not yet done: the first retained, matching message at or after the ack floor.
            let oldest_here = (from..log.next_seq())
                .take(FETCH_SCAN_LIMIT)
                .filter_map(|seq| log.get(seq).map(|message| (seq, message)))
                .find(|(seq, message)| self.matches(&message.subject) && !self.is_done(partition, *seq))
                .map(|(_, message)| message.stored_at);
            oldest = match (oldest, oldest_here) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            lags.push(PartitionLag { partition, cursor: self.cursors[index], ack_floor, lag, n_outstanding });
        }
        ConsumerInfo {
            name: self.name.clone(),
            config: self.config.clone(),
            created_at: self.created_at,
            lag_total: lags.iter().map(|p| p.lag).sum(),
            lag_max: lags.iter().map(|p| p.lag).max().unwrap_or(0),
            partitions: lags,
            n_pending: self.n_pending,
            n_ready: self.ready.len() as u64,
            oldest_unacked_age_ms: oldest.map_or(0, |stored_at| now.since(stored_at)),
            n_delivered: self.n_delivered,
            n_redelivered: self.n_redelivered,
            n_acked: self.n_acked,
            n_dead_lettered: self.n_dead_lettered,
        }
    }

    /// Its outstanding deliveries, in (partition, sequence) order, at most `max`.
    pub fn deliveries(&self, max: usize) -> Vec<DeliveryInfo> {
        self.outstanding
            .iter()
            .take(max)
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
            .collect()
    }

    /// What a fetch now would do, without making one (see [`Work`]). A subscription asks this before it proposes a
    /// fetch, so an idle one writes nothing to the log.
    ///
    /// `subjects` is the stream's subject index: with a filter, the subjects it matches say at once whether a match
    /// lies past a cursor (none matching: nothing to deliver, however many messages wait), without looking at the
    /// messages one by one after every batch.
    ///
    /// With `only`, about those partitions alone (a group member's).
    ///
    /// With `per_subject`, at most that many deliveries of one subject await an ack (see [`Consumer::fetch`]).
    pub fn work(
        &self,
        partitions: &[Partition],
        subjects: &BTreeMap<Arc<str>, SubjectState>,
        only: Option<&BTreeSet<u32>>,
        per_subject: Option<u32>,
    ) -> Work {
        let allowed = |partition: u32| only.is_none_or(|only| only.contains(&partition));
        if self.n_pending >= self.config.max_in_flight {
            return Work::None;
        }
        if let Some(cap) = per_subject {
            return self.work_capped(partitions, cap, &allowed);
        }
        if self.ready.iter().any(|&(partition, _)| allowed(partition)) {
            return Work::Deliver;
        }
        let cursor = |partition: u32| {
            let log = &partitions[partition as usize];
            self.cursors[partition as usize].max(log.first_seq)
        };
        let unscanned =
            (0..partitions.len() as u32).any(|p| allowed(p) && cursor(p) < partitions[p as usize].next_seq());
        if !unscanned {
            return Work::None;
        }
        if let Some(filter) = self.config.filter_subject.as_deref()
            && subjects.len() <= WORK_SCAN_LIMIT
        {
            let mut matching = subjects.values().filter(|state| filter_matches(filter, &state.name)).peekable();
            if matching.peek().is_none() {
                return Work::Skip;
            }
            // The latest messages of each matching subject: one past its partition's cursor is a delivery.
            let past = |&&(partition, seq): &&(u32, u64)| {
                allowed(partition) && seq >= cursor(partition) && partitions[partition as usize].get(seq).is_some()
            };
            if matching.any(|state| state.order.iter().rev().take(WORK_SUBJECT_TAIL).any(|entry| past(&entry))) {
                return Work::Deliver;
            }
        }
        self.scan_cursors(partitions, &allowed, |_| true)
    }

    /// What a fetch would do with the messages past the cursors (at most [`WORK_SCAN_LIMIT`] slots looked at):
    /// deliver the first match that `takes`; a match it does not take ends its partition's scan (the cursor would
    /// wait on it).
    fn scan_cursors(
        &self,
        partitions: &[Partition],
        allowed: &impl Fn(u32) -> bool,
        takes: impl Fn(&crate::partition::Message) -> bool,
    ) -> Work {
        let (mut scanned, mut unmatched) = (0usize, false);
        for (index, (log, cursor)) in partitions.iter().zip(&self.cursors).enumerate() {
            if !allowed(index as u32) {
                continue;
            }
            for seq in (*cursor).max(log.first_seq)..log.next_seq() {
                if scanned == WORK_SCAN_LIMIT {
                    // Perhaps a match further on: the fetch that skips looks much further (and delivers what it
                    // finds), and moves the cursor a long way.
                    return Work::Skip;
                }
                scanned += 1;
                match log.get(seq) {
                    Some(message) if self.matches(&message.subject) => {
                        if takes(message) {
                            return Work::Deliver;
                        }
                        break;
                    }
                    _ => unmatched = true,
                }
            }
        }
        if unmatched { Work::Skip } else { Work::None }
    }

    /// [`Consumer::work`] under a cap per subject: exact, as a fetch under it would go (a subscription proposes a
    /// fetch only when it would change something). Looks at every delivery awaiting an ack and at most
    /// [`WORK_SCAN_LIMIT`] slots past the cursors.
    fn work_capped(&self, partitions: &[Partition], cap: u32, allowed: &impl Fn(u32) -> bool) -> Work {
        let pending = self.pending_by_subject(partitions);
        let open = |subject: &Arc<str>| pending.get(subject).is_none_or(|&n| n < cap);
        for &(partition, seq) in &self.ready {
            if !allowed(partition) {
                continue;
            }
            match partitions[partition as usize].get(seq) {
                Some(message) if !open(&message.subject) => {}
                // Deliverable, or gone (a fetch forgets it).
                _ => return Work::Deliver,
            }
        }
        // A message of a subject at its cap is held back while there is room to; past that the cursor waits on it.
        let may_hold_back = self.ready.len() < self.config.max_in_flight as usize;
        self.scan_cursors(partitions, allowed, |message| may_hold_back || open(&message.subject))
    }

    /// Deliveries awaiting an ack, by their message's subject (one whose message is gone counts for none).
    fn pending_by_subject(&self, partitions: &[Partition]) -> BTreeMap<Arc<str>, u32> {
        let mut pending: BTreeMap<Arc<str>, u32> = BTreeMap::new();
        for (&(partition, seq), entry) in &self.outstanding {
            if matches!(entry.phase, Phase::Pending { .. })
                && let Some(message) = partitions[partition as usize].get(seq)
            {
                *pending.entry(message.subject.clone()).or_insert(0) += 1;
            }
        }
        pending
    }

    /// How many deliveries to `member` in `partitions` await an ack: a group member's subscription window.
    pub fn n_pending_of(&self, member: &str, partitions: &BTreeSet<u32>) -> u32 {
        let mut n = 0;
        for &partition in partitions {
            n += self
                .outstanding
                .range((partition, 0)..=(partition, u64::MAX))
                .filter(|(_, entry)| {
                    matches!(entry.phase, Phase::Pending { .. }) && entry.member.as_deref() == Some(member)
                })
                .count() as u32;
        }
        n
    }

    /// A group member gave `partition` up: its deliveries awaiting an ack become redelivery candidates at once, for the
    /// partition's next owner (a delay's wait keeps its end).
    pub fn release_partition(&mut self, partition: u32) {
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::HandoverSkipsUnacked) {
            return;
        }
        let pending: Vec<u64> = self
            .outstanding
            .range((partition, 0)..=(partition, u64::MAX))
            .filter(|(_, entry)| matches!(entry.phase, Phase::Pending { .. }))
            .map(|(&(_, seq), _)| seq)
            .collect();
        for seq in pending {
            self.set_phase(partition, seq, Phase::Ready);
            self.outstanding.get_mut(&(partition, seq)).expect("outstanding").member = None;
        }
    }

    /// Delivers up to `max` messages to `member`: redelivery candidates first (oldest first), then new messages from
    /// the cursors, starting at a rotating partition; only from the partitions in `only` when given (a group member's).
    /// Returns the deliveries and the timers to set.
    ///
    /// With `per_subject`, at most that many deliveries of one subject await an ack: a candidate of a subject at its
    /// cap stays a candidate, and a new message of one is held back as a candidate (in order, behind the subject's
    /// earlier ones) while the consumer's other subjects go on. At most `max_in_flight` candidates are held at once;
    /// past that the cursor waits on the next message of a capped subject.
    pub fn fetch(
        &mut self,
        partitions: &[Partition],
        member: &Arc<str>,
        max: u32,
        at: Millis,
        only: Option<&BTreeSet<u32>>,
        per_subject: Option<u32>,
    ) -> (Vec<Delivery>, Vec<DeliveryTimer>) {
        let allowed = |partition: u32| only.is_none_or(|only| only.contains(&partition));
        let mut pending = per_subject.map(|_| self.pending_by_subject(partitions)).unwrap_or_default();
        let cap = per_subject.unwrap_or(u32::MAX);
        let at_cap = |pending: &BTreeMap<Arc<str>, u32>, subject: &Arc<str>| {
            per_subject.is_some() && pending.get(subject).is_some_and(|&n| n >= cap)
        };
        let mut deliveries = Vec::new();
        let mut timers = Vec::new();
        let mut budget = max.min(self.config.max_in_flight.saturating_sub(self.n_pending));
        let deadline = at.plus(self.config.ack_wait_ms);
        // The answer's bytes: a record that would take them past the budget (after the first) is left for the next
        // fetch, neither delivered nor counted, so the answer always fits the wire.
        let mut bytes = 0u64;
        let mut fits = |record: &crate::outcome::Record, delivered: usize| {
            bytes += record.size();
            delivered == 0 || bytes <= crate::outcome::MAX_RESPONSE_BYTES
        };

        let candidates: Vec<(u32, u64)> = self.ready.iter().copied().filter(|&(p, _)| allowed(p)).collect();
        for (partition, seq) in candidates {
            if budget == 0 {
                break;
            }
            let Some(message) = partitions[partition as usize].get(seq) else {
                // The message is gone (age, limits, TTL): nothing left to deliver.
                self.forget(partition, seq);
                continue;
            };
            if at_cap(&pending, &message.subject) {
                continue;
            }
            let record = message.record(partition, seq);
            if !fits(&record, deliveries.len()) {
                budget = 0;
                break;
            }
            if per_subject.is_some() {
                *pending.entry(message.subject.clone()).or_insert(0) += 1;
            }
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
            if !allowed(partition) {
                continue;
            }
            let log = &partitions[partition as usize];
            let cursor = &mut self.cursors[partition as usize];
            *cursor = (*cursor).max(log.first_seq);
            while budget > 0 && scanned < FETCH_SCAN_LIMIT && *cursor < log.next_seq() {
                let seq = *cursor;
                *cursor += 1;
                scanned += 1;
                #[cfg(madsim)]
                if cellog_planted::active(cellog_planted::Mutant::FetchSkipsMessage) && seq % 10 == 6 {
                    *cursor += 1;
                }
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
                if at_cap(&pending, &message.subject) {
                    if self.ready.len() >= self.config.max_in_flight as usize {
                        // No more may be held back: the cursor waits on it.
                        *cursor = seq;
                        break;
                    }
                    let held_back =
                        Outstanding { delivery_count: 0, phase: Phase::Ready, state: AckState::Received, member: None };
                    self.outstanding.insert((partition, seq), held_back);
                    self.ready.insert((partition, seq));
                    continue;
                }
                let record = message.record(partition, seq);
                if !fits(&record, deliveries.len()) {
                    // Not taken: the cursor stays on it.
                    *cursor = seq;
                    budget = 0;
                    break;
                }
                if per_subject.is_some() {
                    *pending.entry(message.subject.clone()).or_insert(0) += 1;
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
                deliveries.push(Delivery { record, delivery_count: 1, ack_deadline: deadline });
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
