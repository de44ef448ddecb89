//! The cell's timer queue and what fires from it: sweeps, delivery deadlines and transaction timeouts.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::Cell;
use crate::effect::Transition;
use crate::snapshot::v3;
use crate::stream::Stream;
use crate::time::Millis;

/// A timer in the cell's queue. Each is checked against current state when it fires, so a timer whose reason went
/// away fires as a no-op. The commonest reasons to go away (an acknowledged delivery, a deleted consumer or stream)
/// take their timers out of the queue at once ([`Timers::cancel`]): left in, each would cost a `Tick` entry when it
/// came due on an idle cell, and its memory (and its bytes in every snapshot) until then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(super) enum Timer {
    /// The stream's dedup window, TTLs and max age.
    Sweep { stream_id: u64 },
    /// An ack deadline or the end of a delay for one outstanding message.
    Delivery { stream_id: u64, consumer_id: u64, partition: u32, seq: u64 },
    /// A transaction's timeout.
    Transaction { producer_id: u64, number: u64 },
}

/// The timer queue: ordered by due time, ties by the order they were set in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(super) struct Timers {
    queue: BTreeMap<(Millis, u64), Timer>,
    next_number: u64,
    /// The queue's keys by timer: derived from the queue (not encoded, rebuilt on decode), so that the timers of
    /// something that went away can be found and taken out.
    #[serde(skip)]
    by_timer: BTreeSet<(Timer, Millis, u64)>,
}

impl From<v3::Timer> for Timer {
    fn from(timer: v3::Timer) -> Self {
        match timer {
            v3::Timer::Sweep { stream_id } => Timer::Sweep { stream_id },
            v3::Timer::Delivery { stream_id, consumer_id, partition, seq } => {
                Timer::Delivery { stream_id, consumer_id, partition, seq }
            }
            v3::Timer::Transaction { producer_id, number } => Timer::Transaction { producer_id, number },
        }
    }
}

impl From<v3::Timers> for Timers {
    fn from(timers: v3::Timers) -> Self {
        let queue: BTreeMap<(Millis, u64), Timer> =
            timers.queue.into_iter().map(|((due, number), timer)| ((due.into(), number), timer.into())).collect();
        let by_timer = queue.iter().map(|(&(due, number), &timer)| (timer, due, number)).collect();
        Timers { queue, next_number: timers.next_number, by_timer }
    }
}

impl Timers {
    /// Sets `timer` for `due`, which must be later than `at`, the time of the command setting it: `fire_timers`
    /// relies on that to end, and a timer due at or before its own setting would fire a command late.
    pub(super) fn set(&mut self, at: Millis, due: Millis, timer: Timer) {
        assert!(due > at, "timer {timer:?} set for {due:?}, not later than the time it was set at ({at:?})");
        self.by_timer.insert((timer, due, self.next_number));
        self.queue.insert((due, self.next_number), timer);
        self.next_number += 1;
    }

    /// When the first timer is due.
    pub(super) fn first_due(&self) -> Option<Millis> {
        self.queue.keys().next().map(|&(due, _)| due)
    }

    /// Takes out the first timer if it is due at `at`.
    fn pop_due(&mut self, at: Millis) -> Option<(Millis, Timer)> {
        let entry = self.queue.first_entry()?;
        if entry.key().0 > at {
            return None;
        }
        let ((due, number), timer) = entry.remove_entry();
        self.by_timer.remove(&(timer, due, number));
        Some((due, timer))
    }

    /// Takes out every timer from `first` to `last` in timer order (one delivery's, a consumer's, a stream's).
    pub(super) fn cancel(&mut self, first: Timer, last: Timer) {
        let range = (first, Millis(0), 0)..=(last, Millis::MAX, u64::MAX);
        while let Some(&key) = self.by_timer.range(range.clone()).next() {
            self.queue.remove(&(key.1, key.2));
            self.by_timer.remove(&key);
        }
    }

    /// Takes out the timers of one delivery, which is no longer outstanding.
    pub(super) fn cancel_delivery(&mut self, stream_id: u64, consumer_id: u64, partition: u32, seq: u64) {
        let timer = Timer::Delivery { stream_id, consumer_id, partition, seq };
        self.cancel(timer, timer);
    }

    /// Takes out the delivery timers of a deleted consumer.
    pub(super) fn cancel_consumer(&mut self, stream_id: u64, consumer_id: u64) {
        self.cancel(
            Timer::Delivery { stream_id, consumer_id, partition: 0, seq: 0 },
            Timer::Delivery { stream_id, consumer_id, partition: u32::MAX, seq: u64::MAX },
        );
    }

    /// Takes out the sweeps and delivery timers of a deleted stream.
    pub(super) fn cancel_stream(&mut self, stream_id: u64) {
        self.cancel(Timer::Sweep { stream_id }, Timer::Sweep { stream_id });
        self.cancel(
            Timer::Delivery { stream_id, consumer_id: 0, partition: 0, seq: 0 },
            Timer::Delivery { stream_id, consumer_id: u64::MAX, partition: u32::MAX, seq: u64::MAX },
        );
    }
}

/// Sets a stream's sweep timer to its next deadline, if that changed. Every sweep at `at` handles everything due by
/// then, so the next deadline is later; the clamp only guards that.
pub(super) fn reschedule_sweep(stream: &mut Stream, timers: &mut Timers, at: Millis) {
    if let Some(due) = stream.reschedule_sweep(at) {
        timers.set(at, due, Timer::Sweep { stream_id: stream.id() });
    }
}

impl Cell {
    /// The state with the delivery timers that would fire as no-ops taken out (their delivery or its stream gone,
    /// or set for an earlier deadline): equal for two states that differ only in how early such timers were taken
    /// out, e.g. a state restored from a snapshot written before acks took them out and the state that wrote it. For
    /// tests.
    #[doc(hidden)]
    pub fn without_stale_timers(&self) -> Cell {
        let mut cell = self.clone();
        let live = |timer: &Timer, due: Millis| match *timer {
            Timer::Delivery { stream_id, consumer_id, partition, seq } => self
                .stream_names
                .get(&stream_id)
                .and_then(|name| self.streams[name].consumer_by_id(consumer_id))
                .is_some_and(|consumer| consumer.delivery_timer_is_live(partition, seq, due)),
            Timer::Sweep { stream_id } => self.stream_names.contains_key(&stream_id),
            Timer::Transaction { .. } => true,
        };
        let stale: Vec<Timer> =
            self.timers.queue.iter().filter(|&(&(due, _), timer)| !live(timer, due)).map(|(_, &t)| t).collect();
        for timer in stale {
            cell.timers.cancel(timer, timer);
        }
        cell
    }

    pub(super) fn fire_timers(&mut self, at: Millis) {
        // Every handler only sets timers later than `at`, so this loop ends; the bound is the queue's length.
        while let Some((due, timer)) = self.timers.pop_due(at) {
            match timer {
                Timer::Sweep { stream_id } => self.fire_sweep(at, due, stream_id),
                Timer::Delivery { stream_id, consumer_id, partition, seq } => {
                    self.fire_delivery(at, due, stream_id, consumer_id, partition, seq)
                }
                Timer::Transaction { producer_id, number } => self.fire_transaction_timeout(producer_id, number),
            }
        }
    }

    pub(super) fn fire_sweep(&mut self, at: Millis, due: Millis, stream_id: u64) {
        let Some(name) = self.stream_names.get(&stream_id).cloned() else { return };
        let stream = self.streams.get_mut(&name).expect("stream_names and streams agree");
        if let Some(next) = stream.fire_sweep(due, at, &mut self.effects) {
            self.timers.set(at, next, Timer::Sweep { stream_id });
        }
    }

    pub(super) fn fire_delivery(
        &mut self,
        at: Millis,
        due: Millis,
        stream_id: u64,
        consumer_id: u64,
        partition: u32,
        seq: u64,
    ) {
        let Some(name) = self.stream_names.get(&stream_id).cloned() else { return };
        let stream = self.streams.get_mut(&name).expect("stream_names and streams agree");
        let Some(consumer) = stream.consumer_by_id_mut(consumer_id) else { return };
        let mut letters = Vec::new();
        if let Some((delivery_count, dead_letter)) = consumer.delivery_timer_fired(partition, seq, due) {
            self.effects.note(|| Transition::DeliveryExpired {
                stream: name.clone(),
                consumer: consumer.name().clone(),
                partition,
                seq,
                delivery_count,
            });
            letters.extend(dead_letter);
        }
        self.bury(at, &name, letters);
    }
}
