//! The cell's timer queue and what fires from it: sweeps, delivery deadlines and transaction timeouts.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Cell;
use crate::command::Effect;
use crate::snapshot::v3;
use crate::stream::Stream;
use crate::time::Millis;

/// A timer in the cell's queue. Each is checked against current state when it fires, so a timer whose reason went
/// away (an ack, a commit, a deleted stream) fires as a no-op instead of being searched for and removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    pub(super) queue: BTreeMap<(Millis, u64), Timer>,
    pub(super) next_number: u64,
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
        Timers {
            queue: timers
                .queue
                .into_iter()
                .map(|((due, number), timer)| ((due.into(), number), timer.into()))
                .collect(),
            next_number: timers.next_number,
        }
    }
}

impl Timers {
    /// Sets `timer` for `due`, which must be later than `at`, the time of the command setting it: `fire_timers`
    /// relies on that to end, and a timer due at or before its own setting would fire a command late.
    pub(super) fn set(&mut self, at: Millis, due: Millis, timer: Timer) {
        assert!(due > at, "timer {timer:?} set for {due:?}, not later than the time it was set at ({at:?})");
        self.queue.insert((due, self.next_number), timer);
        self.next_number += 1;
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
    pub(super) fn fire_timers(&mut self, at: Millis) {
        // Every handler only sets timers later than `at`, so this loop ends; the bound is the queue's length.
        while let Some(entry) = self.timers.queue.first_entry() {
            if entry.key().0 > at {
                break;
            }
            let ((due, _), timer) = entry.remove_entry();
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
            self.effects.push(Effect::DeliveryExpired {
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
