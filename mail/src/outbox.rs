//! The outbox scheduler, sans-IO: which recipients of which envelopes to try now, what a settled attempt means, and
//! when to look again. The delivery loop ([`crate::deliver`]) feeds it the outbox's envelopes, the attempts as they
//! end and the time; it answers with the attempts to start, the results to record and the next wake-up. It reads no
//! clock and does no I/O, so its decisions are unit-tested without a runtime, and in simulation they repeat.
//!
//! Time is whatever the caller measures it in (`T`): the runtime's `Instant` in the loop, a `Duration` in tests.

use std::collections::BTreeMap;
use std::ops::Add;
use std::time::Duration;

use bytes::Bytes;
use cellog_proto::v1::DeliveryResult;

/// How delivery retries.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Pause after the first failed attempt; it doubles per attempt, up to `max`, with a spread of up to a half.
    pub first: Duration,
    /// Longest pause between attempts.
    pub max: Duration,
    /// After this long since sealing, an unreachable recipient's result is FAILED. Must stay well below
    /// [`crate::schema::INBOX_DEDUP_MS`], so a late repeat is still recognized as one.
    pub give_up_after: Duration,
    /// Deadline of one attempt (following the recipient cell's leader included).
    pub attempt_timeout: Duration,
    /// How often the leader looks at the outbox when nothing wakes it.
    pub poll: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first: Duration::from_millis(200),
            max: Duration::from_secs(30),
            give_up_after: Duration::from_secs(24 * 3600),
            attempt_timeout: Duration::from_secs(5),
            poll: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// The pause after attempt `attempt` (1-based) of delivering `id` to `cell`: exponential, spread by a hash of
    /// both so that many envelopes held by one outage do not all retry at once (no random draw: the same envelope
    /// retries on the same schedule in every run).
    pub fn backoff(&self, id: &str, cell: &str, attempt: u32) -> Duration {
        let doubled = self.first.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let base = doubled.min(self.max);
        let spread = crc32c::crc32c(format!("{id}/{cell}/{attempt}").as_bytes()) % 1000;
        base + base.mul_f64(f64::from(spread) / 2000.0)
    }
}

/// How one delivery attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The recipient cell stored the envelope (or had it already).
    Delivered,
    /// The recipient cell refused it for good.
    Denied(String),
    /// No address is known for the recipient cell.
    NoHome,
    /// No answer, or one worth retrying.
    Unreachable(String),
}

/// An attempt to start now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    /// The envelope's outbox sequence.
    pub seq: u64,
    /// The envelope id.
    pub id: String,
    /// The recipient cell.
    pub recipient: String,
    /// The envelope.
    pub bytes: Bytes,
}

/// A recipient's final result, to be recorded in the results stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Final {
    /// The envelope id.
    pub id: String,
    /// Delivered, denied, no home or failed.
    pub result: DeliveryResult,
    /// Why, when it was not delivered.
    pub detail: String,
    /// Attempts made.
    pub attempts: u32,
}

/// What a settled attempt means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled<T> {
    /// The recipient's result is final: record it, then say [`Outbox::recorded`] or [`Outbox::unrecorded`].
    Final(Final),
    /// Not delivered yet: tried again at `at`.
    Retry {
        /// Attempts made so far.
        attempts: u32,
        /// When the next attempt is due.
        at: T,
    },
    /// The envelope or recipient is no longer pending here (the outbox was cleared since it started).
    Stale,
}

/// A recipient without a result yet.
#[derive(Clone, Debug)]
struct Recipient<T> {
    attempts: u32,
    last_error: String,
    /// When the next attempt may start; `None` while one is in flight or its result is being recorded.
    next: Option<T>,
}

/// An outbox envelope with recipients still pending.
#[derive(Clone, Debug)]
struct Job<T> {
    id: String,
    bytes: Bytes,
    sealed_at_ms: u64,
    pending: BTreeMap<String, Recipient<T>>,
}

/// The leader's delivery schedule: envelopes by outbox sequence, each with its pending recipients.
#[derive(Clone, Debug)]
pub struct Outbox<T> {
    jobs: BTreeMap<u64, Job<T>>,
    scanned: u64,
}

impl<T> Default for Outbox<T> {
    fn default() -> Self {
        Outbox { jobs: BTreeMap::new(), scanned: 0 }
    }
}

impl<T: Copy + Ord + Add<Duration, Output = T>> Outbox<T> {
    /// An empty schedule that has looked at nothing yet.
    pub fn new() -> Self {
        Outbox::default()
    }

    /// The last outbox sequence looked at: the next scan starts after it.
    pub fn scanned(&self) -> u64 {
        self.scanned
    }

    /// Outbox message `seq` holds nothing to deliver (a tombstone, or not an envelope): the scan moves past it.
    pub fn skip(&mut self, seq: u64) {
        self.scanned = self.scanned.max(seq);
    }

    /// Envelope `id` at outbox sequence `seq`, sealed at `sealed_at_ms` (cell time), still to be delivered to
    /// `recipients` (those without a result): each is due at once.
    pub fn add(
        &mut self,
        seq: u64,
        id: String,
        bytes: Bytes,
        sealed_at_ms: u64,
        recipients: impl IntoIterator<Item = String>,
        now: T,
    ) {
        self.skip(seq);
        let pending: BTreeMap<String, Recipient<T>> = recipients
            .into_iter()
            .map(|cell| (cell, Recipient { attempts: 0, last_error: String::new(), next: Some(now) }))
            .collect();
        if !pending.is_empty() {
            self.jobs.insert(seq, Job { id, bytes, sealed_at_ms, pending });
        }
    }

    /// The attempts due at `now`, at most `room` of them, in outbox order and by recipient; each is in flight until
    /// it is settled.
    pub fn due(&mut self, now: T, room: usize) -> Vec<Start> {
        let mut starts = Vec::new();
        'jobs: for (&seq, job) in &mut self.jobs {
            for (cell, recipient) in &mut job.pending {
                if starts.len() >= room {
                    break 'jobs;
                }
                if recipient.next.is_none_or(|at| at > now) {
                    continue;
                }
                recipient.next = None;
                starts.push(Start { seq, id: job.id.clone(), recipient: cell.clone(), bytes: job.bytes.clone() });
            }
        }
        starts
    }

    /// When the earliest waiting attempt is due, if any waits.
    pub fn next_wake(&self) -> Option<T> {
        self.jobs.values().flat_map(|job| job.pending.values().filter_map(|recipient| recipient.next)).min()
    }

    /// An attempt to deliver outbox envelope `seq` to `recipient` ended with `attempt`, at `now` (and `cell_now_ms`
    /// in cell time, which decides giving up).
    pub fn settle(
        &mut self,
        seq: u64,
        recipient: &str,
        attempt: Attempt,
        now: T,
        cell_now_ms: u64,
        policy: &RetryPolicy,
    ) -> Settled<T> {
        let Some(job) = self.jobs.get_mut(&seq) else { return Settled::Stale };
        let Some(entry) = job.pending.get_mut(recipient) else { return Settled::Stale };
        entry.attempts += 1;
        let attempts = entry.attempts;
        let (result, detail) = match attempt {
            Attempt::Delivered => (DeliveryResult::Delivered, String::new()),
            Attempt::Denied(reason) => (DeliveryResult::Denied, reason),
            Attempt::NoHome => (DeliveryResult::NoHome, format!("no address is known for cell {recipient:?}")),
            Attempt::Unreachable(reason) => {
                let give_up_ms = u64::try_from(policy.give_up_after.as_millis()).unwrap_or(u64::MAX);
                if cell_now_ms.saturating_sub(job.sealed_at_ms) < give_up_ms {
                    let at = now + policy.backoff(&job.id, recipient, attempts);
                    entry.next = Some(at);
                    entry.last_error = reason;
                    return Settled::Retry { attempts, at };
                }
                (DeliveryResult::Failed, format!("gave up after {attempts} attempts; last: {reason}"))
            }
        };
        Settled::Final(Final { id: job.id.clone(), result, detail, attempts })
    }

    /// `recipient`'s final result for envelope `seq` is recorded: it is done.
    pub fn recorded(&mut self, seq: u64, recipient: &str) {
        if let Some(job) = self.jobs.get_mut(&seq) {
            job.pending.remove(recipient);
            if job.pending.is_empty() {
                self.jobs.remove(&seq);
            }
        }
    }

    /// `recipient`'s final result for envelope `seq` could not be recorded (leadership moving, say): it stays pending
    /// and is tried again from `at`.
    pub fn unrecorded(&mut self, seq: u64, recipient: &str, at: T) {
        if let Some(entry) = self.jobs.get_mut(&seq).and_then(|job| job.pending.get_mut(recipient)) {
            entry.next = Some(at);
        }
    }

    /// Leadership is lost: whoever leads next starts over from the outbox and the results.
    pub fn clear(&mut self) {
        self.jobs.clear();
        self.scanned = 0;
    }

    /// Attempts made so far to deliver envelope `seq` to `recipient`, and the last error, while it is pending here.
    pub fn progress(&self, seq: u64, recipient: &str) -> Option<(u32, &str)> {
        let entry = self.jobs.get(&seq)?.pending.get(recipient)?;
        Some((entry.attempts, entry.last_error.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            first: ms(100),
            max: ms(1000),
            give_up_after: ms(10_000),
            attempt_timeout: ms(500),
            poll: ms(500),
        }
    }

    fn outbox(recipients: &[&str]) -> Outbox<Duration> {
        let mut outbox = Outbox::new();
        let recipients = recipients.iter().map(|cell| cell.to_string());
        outbox.add(1, "e1".to_string(), Bytes::from_static(b"sealed"), 0, recipients, ms(0));
        outbox
    }

    fn started(starts: &[Start]) -> Vec<(u64, &str)> {
        starts.iter().map(|start| (start.seq, start.recipient.as_str())).collect()
    }

    #[test]
    fn every_pending_recipient_is_due_at_once_and_in_flight_until_settled() {
        let mut outbox = outbox(&["bravo", "alpha"]);
        assert_eq!(outbox.next_wake(), Some(ms(0)));
        assert_eq!(started(&outbox.due(ms(0), 64)), [(1, "alpha"), (1, "bravo")], "by recipient name");
        assert!(outbox.due(ms(10_000), 64).is_empty(), "in flight: not started twice");
        assert_eq!(outbox.next_wake(), None);
    }

    #[test]
    fn room_bounds_the_attempts_started() {
        let mut outbox = outbox(&["a", "b", "c"]);
        outbox.add(2, "e2".to_string(), Bytes::new(), 0, ["a".to_string()], ms(0));
        assert_eq!(started(&outbox.due(ms(0), 2)), [(1, "a"), (1, "b")]);
        assert_eq!(started(&outbox.due(ms(0), 2)), [(1, "c"), (2, "a")]);
        assert!(outbox.due(ms(0), 0).is_empty());
    }

    #[test]
    fn an_unreachable_recipient_is_retried_after_its_backoff_with_its_last_error_kept() {
        let mut outbox = outbox(&["bravo"]);
        outbox.due(ms(0), 64);
        let settled = outbox.settle(1, "bravo", Attempt::Unreachable("down".into()), ms(50), 50, &policy());
        let at = ms(50) + policy().backoff("e1", "bravo", 1);
        assert_eq!(settled, Settled::Retry { attempts: 1, at });
        assert!(at >= ms(150) && at < ms(200), "the first pause, spread by up to a half: {at:?}");
        assert_eq!(outbox.progress(1, "bravo"), Some((1, "down")));
        assert_eq!(outbox.next_wake(), Some(at));
        assert!(outbox.due(at - ms(1), 64).is_empty(), "not before it is due");
        assert_eq!(started(&outbox.due(at, 64)), [(1, "bravo")]);
    }

    #[test]
    fn backoff_doubles_up_to_the_most_and_repeats_per_envelope() {
        let policy = policy();
        let pauses: Vec<Duration> = (1..=6).map(|n| policy.backoff("e1", "bravo", n)).collect();
        for (n, pause) in pauses.iter().enumerate() {
            let base = (policy.first * (1 << n)).min(policy.max);
            assert!(*pause >= base && *pause < base + base / 2, "attempt {}: {pause:?} from {base:?}", n + 1);
        }
        assert_eq!(policy.backoff("e1", "bravo", 3), pauses[2], "no random draw");
    }

    #[test]
    fn past_the_give_up_time_an_unreachable_recipient_fails() {
        let mut outbox = outbox(&["bravo"]);
        outbox.due(ms(0), 64);
        let settled = outbox.settle(1, "bravo", Attempt::Unreachable("down".into()), ms(0), 10_000, &policy());
        let Settled::Final(last) = settled else { panic!("final: {settled:?}") };
        assert_eq!((last.result, last.attempts), (DeliveryResult::Failed, 1));
        assert_eq!(last.detail, "gave up after 1 attempts; last: down");
    }

    #[test]
    fn a_final_result_is_done_once_recorded_and_retried_when_it_could_not_be() {
        let mut outbox = outbox(&["alpha", "bravo"]);
        outbox.due(ms(0), 64);
        for (recipient, attempt, result) in [
            ("alpha", Attempt::Delivered, DeliveryResult::Delivered),
            ("bravo", Attempt::Denied("no key".into()), DeliveryResult::Denied),
        ] {
            let settled = outbox.settle(1, recipient, attempt, ms(5), 5, &policy());
            let Settled::Final(last) = settled else { panic!("final: {settled:?}") };
            assert_eq!((last.id.as_str(), last.result, last.attempts), ("e1", result, 1));
        }
        outbox.unrecorded(1, "bravo", ms(105));
        outbox.recorded(1, "alpha");
        assert_eq!(outbox.progress(1, "alpha"), None);
        assert_eq!(started(&outbox.due(ms(105), 64)), [(1, "bravo")], "tried again: the result was not stored");
        let settled = outbox.settle(1, "bravo", Attempt::NoHome, ms(110), 110, &policy());
        assert!(matches!(settled, Settled::Final(Final { result: DeliveryResult::NoHome, attempts: 2, .. })));
        outbox.recorded(1, "bravo");
        assert_eq!(outbox.next_wake(), None);
        assert!(outbox.due(ms(1_000_000), 64).is_empty(), "the envelope is done");
    }

    #[test]
    fn after_a_clear_old_attempts_are_stale_and_the_scan_starts_over() {
        let mut outbox = outbox(&["bravo"]);
        outbox.skip(7);
        assert_eq!(outbox.scanned(), 7);
        outbox.due(ms(0), 64);
        outbox.clear();
        assert_eq!(outbox.scanned(), 0);
        assert_eq!(outbox.settle(1, "bravo", Attempt::Delivered, ms(1), 1, &policy()), Settled::Stale);
    }

    #[test]
    fn an_envelope_with_every_result_recorded_is_not_scheduled() {
        let mut outbox: Outbox<Duration> = Outbox::new();
        outbox.add(3, "e3".to_string(), Bytes::new(), 0, Vec::<String>::new(), ms(0));
        assert_eq!(outbox.scanned(), 3, "looked at");
        assert!(outbox.due(ms(0), 64).is_empty());
    }
}
