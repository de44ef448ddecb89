//! A stream's retention: whether a message fits, the room a publish makes under discard-old limits (oldest first, never
//! past a message a registered peer lacks or another message pins), and every removal: by limits, age, TTL and interest,
//! each releasing the message's body and following its indexes.

use std::sync::Arc;

use super::{Incoming, RoomMode, Stream, Tally};
use crate::config::{DiscardPolicy, RetentionPolicy};
use crate::effect::{BodyOp, Effects};
use crate::error::{Quota, Rejection};
use crate::index::SubjectState;
use crate::outcome::RemovalReason;
use crate::partition::Message;
use crate::time::Millis;

impl Stream {
    fn storage_full(&self, partition: u32, seq: u64) -> Option<Rejection> {
        if let Some((peer, received)) = self.lagging_peer(partition, seq) {
            return Some(Rejection::StorageFull { lagging_peer: peer.to_string(), partition, received });
        }
        self.is_pinned(partition, seq).then(|| Rejection::Pinned { stream: self.name.to_string(), partition, seq })
    }

    /// Checks discard-new limits for one more message on top of what `tally` already promises.
    pub fn check_discard_new(&self, incoming: &Incoming<'_>, tally: &Tally) -> Result<(), Rejection> {
        if self.config.discard != DiscardPolicy::New {
            return Ok(());
        }
        let (subject_messages, subject_bytes) = self.subject_usage(incoming.subject, tally);
        let checks = [
            (Quota::SubjectMessages, self.config.max_messages_per_subject, subject_messages + 1),
            (Quota::SubjectBytes, self.config.max_bytes_per_subject, subject_bytes + incoming.size),
            (Quota::StreamMessages, self.config.max_messages, self.n_messages + tally.n_messages + 1),
            (Quota::StreamBytes, self.config.max_bytes, self.n_bytes + tally.n_bytes + incoming.size),
        ];
        for (quota, limit, needed) in checks {
            if let Some(limit) = limit
                && needed > limit
            {
                return Err(Rejection::QuotaExceeded { quota, limit });
            }
        }
        Ok(())
    }

    fn subject_usage(&self, subject: &str, tally: &Tally) -> (u64, u64) {
        let (stored_messages, stored_bytes) =
            self.subjects.get(subject).map_or((0, 0), |state| (state.n_messages, state.n_bytes));
        let (staged_messages, staged_bytes) = tally.subjects.get(subject).copied().unwrap_or((0, 0));
        (stored_messages + staged_messages, stored_bytes + staged_bytes)
    }

    /// A message that could never fit, whatever is removed.
    pub fn check_fits_at_all(&self, incoming: &Incoming<'_>) -> Result<(), Rejection> {
        for (quota, limit) in
            [(Quota::SubjectBytes, self.config.max_bytes_per_subject), (Quota::StreamBytes, self.config.max_bytes)]
        {
            if let Some(limit) = limit
                && incoming.size > limit
            {
                return Err(Rejection::QuotaExceeded { quota, limit });
            }
        }
        Ok(())
    }

    /// The removals that make room for `incoming` under discard-old limits, oldest first. In strict mode a removal a
    /// registered peer has not received refuses the publish; in lenient mode it is left out.
    pub fn plan_room(
        &self,
        incoming: &Incoming<'_>,
        mode: RoomMode,
    ) -> Result<Vec<(u32, u64, RemovalReason)>, Rejection> {
        let mut plan: Vec<(u32, u64, RemovalReason)> = Vec::new();
        if self.config.discard != DiscardPolicy::Old {
            return Ok(plan);
        }
        let config = &self.config;
        let mut freed_messages = 0u64;
        let mut freed_bytes = 0u64;
        if let Some(state) = self.subjects.get(incoming.subject)
            && (config.max_messages_per_subject.is_some() || config.max_bytes_per_subject.is_some())
        {
            let over = |messages: u64, bytes: u64| {
                config.max_messages_per_subject.is_some_and(|limit| messages + 1 > limit)
                    || config.max_bytes_per_subject.is_some_and(|limit| bytes + incoming.size > limit)
            };
            let (mut messages, mut bytes) = (state.n_messages, state.n_bytes);
            for &(partition, seq) in &state.order {
                if !over(messages, bytes) {
                    break;
                }
                let Some(message) = self.message(partition, seq) else { continue };
                messages -= 1;
                bytes -= message.size();
                freed_messages += 1;
                freed_bytes += message.size();
                plan.push((partition, seq, RemovalReason::SubjectLimit));
            }
        }
        if config.max_messages.is_some() || config.max_bytes.is_some() {
            let over = |messages: u64, bytes: u64| {
                config.max_messages.is_some_and(|limit| messages + 1 > limit)
                    || config.max_bytes.is_some_and(|limit| bytes + incoming.size > limit)
            };
            let mut messages = self.n_messages - freed_messages;
            let mut bytes = self.n_bytes - freed_bytes;
            let mut oldest = OldestFirst::new(self);
            while over(messages, bytes) {
                let Some((partition, seq, message)) = oldest.next() else { break };
                if plan.iter().any(|&(p, s, _)| p == partition && s == seq) {
                    continue;
                }
                messages -= 1;
                bytes -= message.size();
                plan.push((partition, seq, RemovalReason::StreamLimit));
            }
        }
        match mode {
            RoomMode::Strict => {
                if let Some(rejection) = plan.iter().find_map(|&(p, s, _)| self.storage_full(p, s)) {
                    return Err(rejection);
                }
            }
            RoomMode::Lenient => plan.retain(|&(p, s, _)| !self.held(p, s)),
        }
        Ok(plan)
    }

    /// Removes a message and its index entries. Returns whether it was there.
    pub fn remove(&mut self, partition: u32, seq: u64, reason: RemovalReason, effects: &mut Effects) -> bool {
        let Some(message) = self.partitions[partition as usize].take(seq) else { return false };
        if message.recalled_at().is_none() {
            effects.work(BodyOp::BodyReleased { key: message.body.key });
        }
        let size = message.size();
        debug_assert!(self.n_messages >= 1 && self.n_bytes >= size, "a stream counts every message it holds");
        self.n_messages -= 1;
        self.n_bytes -= size;
        let mut subject_emptied = false;
        if let Some(state) = self.subjects.get_mut(&*message.subject) {
            state.n_messages -= 1;
            state.n_bytes -= size;
            subject_emptied = state.n_messages == 0;
            let partitions = &self.partitions;
            let dead = |entry: &&(u32, u64)| partitions[entry.0 as usize].get(entry.1).is_none();
            while state.order.front().is_some_and(|e| dead(&e)) {
                state.order.pop_front();
            }
            while state.order.back().is_some_and(|e| dead(&e)) {
                state.order.pop_back();
            }
        }
        if subject_emptied {
            self.subjects.remove(&*message.subject);
        }
        if let Some(msg_id) = &message.msg_id
            && self.dedup.get(msg_id).is_some_and(|e| e.partition == partition && e.seq == seq && !e.window_open)
        {
            self.dedup.remove(msg_id);
        }
        if let Some(expires_at) = message.expires_at() {
            self.ttl_index.remove(&(expires_at, partition, seq));
            self.ttl_held.remove(&(partition, seq));
        }
        effects.removed(&self.name, partition, seq, reason);
        // Paired with the partition: the message is gone and the front slot is never a hole.
        debug_assert!(self.partitions[partition as usize].get(seq).is_none());
        debug_assert!(self.partitions[partition as usize].slots.front().is_none_or(Option::is_some));
        true
    }

    /// Removes a message under interest retention if every consumer is done with it and no peer still needs it.
    pub fn remove_if_uninteresting(&mut self, partition: u32, seq: u64, effects: &mut Effects) {
        if self.config.retention == RetentionPolicy::Limits {
            return;
        }
        let Some(message) = self.message(partition, seq) else { return };
        if self.all_consumers_done(partition, seq, &message.subject) && !self.held(partition, seq) {
            self.remove(partition, seq, RemovalReason::Interest, effects);
        }
    }

    /// Runs interest retention over a whole partition range (after a consumer is deleted or a peer catches up).
    pub fn sweep_interest(&mut self, partition: u32, from: u64, to_inclusive: u64, effects: &mut Effects) {
        if self.config.retention == RetentionPolicy::Limits {
            return;
        }
        let first = from.max(self.partitions[partition as usize].first_seq);
        let last = to_inclusive.min(self.partitions[partition as usize].last_seq());
        for seq in first..=last {
            self.remove_if_uninteresting(partition, seq, effects);
        }
    }

    /// Runs interest retention over every partition, whole.
    pub fn sweep_all_interest(&mut self, effects: &mut Effects) {
        for partition in 0..self.config.partitions {
            self.sweep_interest(partition, 0, u64::MAX, effects);
        }
    }

    /// Removes the oldest messages while discard-old limits are exceeded: after a lagging peer caught up (lenient
    /// appends may have overshot meanwhile) or after an update lowered the limits. Stops at a message a peer still
    /// needs, since removing a newer one instead would break the oldest-first order.
    pub fn shrink_to_limits(&mut self, effects: &mut Effects) {
        if self.config.discard != DiscardPolicy::Old {
            return;
        }
        let (max_subject_messages, max_subject_bytes) =
            (self.config.max_messages_per_subject, self.config.max_bytes_per_subject);
        let subject_over = |state: &SubjectState| {
            max_subject_messages.is_some_and(|limit| state.n_messages > limit)
                || max_subject_bytes.is_some_and(|limit| state.n_bytes > limit)
        };
        let over_subjects: Vec<Arc<str>> =
            self.subjects.iter().filter(|(_, state)| subject_over(state)).map(|(s, _)| s.clone()).collect();
        for subject in over_subjects {
            while let Some(state) = self.subjects.get(&subject)
                && subject_over(state)
            {
                let &(partition, seq) = state.order.front().expect("a subject with messages has a live front");
                if self.held(partition, seq) {
                    break;
                }
                self.remove(partition, seq, RemovalReason::SubjectLimit, effects);
            }
        }
        loop {
            let over = self.config.max_messages.is_some_and(|limit| self.n_messages > limit)
                || self.config.max_bytes.is_some_and(|limit| self.n_bytes > limit);
            if !over {
                break;
            }
            let Some((partition, seq, _)) = OldestFirst::new(self).next() else { break };
            if self.held(partition, seq) {
                break;
            }
            self.remove(partition, seq, RemovalReason::StreamLimit, effects);
        }
    }

    /// Fires the stream's due timers: the dedup window, TTLs and max age. Removals wait for lagging peers.
    pub fn sweep(&mut self, at: Millis, effects: &mut Effects) {
        while let Some((due, msg_id, partition, seq)) = self.dedup_expiry.front().cloned() {
            if due > at {
                break;
            }
            self.dedup_expiry.pop_front();
            let retained = self.message(partition, seq).is_some();
            if let Some(entry) = self.dedup.get_mut(&msg_id)
                && entry.partition == partition
                && entry.seq == seq
            {
                if retained {
                    entry.window_open = false;
                } else {
                    self.dedup.remove(&msg_id);
                }
            }
        }
        while let Some(&(expires_at, partition, seq)) = self.ttl_index.first() {
            if expires_at > at {
                break;
            }
            self.ttl_index.pop_first();
            if self.held(partition, seq) {
                self.ttl_held.insert((partition, seq));
            } else {
                self.remove(partition, seq, RemovalReason::Ttl, effects);
            }
        }
        if let Some(max_age_ms) = self.config.max_age_ms {
            for partition in 0..self.config.partitions {
                while let Some((seq, message)) = self.partitions[partition as usize].front() {
                    if message.stored_at.plus(max_age_ms) > at || self.held(partition, seq) {
                        break;
                    }
                    self.remove(partition, seq, RemovalReason::Age, effects);
                }
            }
        }
    }

    /// Removes expired messages that a lagging peer held back and has now received (after a peer's progress or
    /// removal).
    pub fn release_held(&mut self, effects: &mut Effects) {
        let released: Vec<(u32, u64)> =
            self.ttl_held.iter().copied().filter(|&(partition, seq)| !self.held(partition, seq)).collect();
        for (partition, seq) in released {
            self.ttl_held.remove(&(partition, seq));
            self.remove(partition, seq, RemovalReason::Ttl, effects);
        }
    }

    /// When the stream next has something to sweep. Age removals held back by a lagging peer are not deadlines: the
    /// peer's progress triggers a sweep.
    pub fn next_sweep(&self) -> Option<Millis> {
        let dedup = self.dedup_expiry.front().map(|(due, ..)| *due);
        // A TTL that a peer holds back when it comes due moves to `ttl_held`, so the first entry is always a deadline.
        let ttl = self.ttl_index.first().map(|(expires_at, ..)| *expires_at);
        let age = self.config.max_age_ms.and_then(|max_age_ms| {
            (0..self.config.partitions)
                .filter_map(|partition| {
                    let (seq, message) = self.partitions[partition as usize].front()?;
                    (!self.held(partition, seq)).then(|| message.stored_at.plus(max_age_ms))
                })
                .min()
        });
        [dedup, ttl, age].into_iter().flatten().min()
    }

    /// Sets the sweep time to the next deadline, no earlier than just after `at`. Returns it when it changed (and is
    /// set), for the caller's timer.
    pub fn reschedule_sweep(&mut self, at: Millis) -> Option<Millis> {
        let next = self.next_sweep().map(|due| due.max(at.plus(1)));
        if next == self.sweep_at {
            return None;
        }
        self.sweep_at = next;
        next
    }

    /// After an append that may need a sweep at `candidate`: moves the sweep time earlier to it, or reschedules when
    /// none is set. Returns the sweep time when it changed, for the caller's timer.
    pub fn sweep_by(&mut self, candidate: Millis, at: Millis) -> Option<Millis> {
        match self.sweep_at {
            None => self.reschedule_sweep(at),
            Some(current) if candidate < current => {
                self.sweep_at = Some(candidate);
                Some(candidate)
            }
            Some(_) => None,
        }
    }

    /// The sweep timer set for `due` fired: sweeps if that is still the stream's sweep time. Returns the next sweep
    /// time when it changed, for the caller's timer.
    pub fn fire_sweep(&mut self, due: Millis, at: Millis, effects: &mut Effects) -> Option<Millis> {
        if self.sweep_at != Some(due) {
            return None;
        }
        self.sweep_at = None;
        self.sweep(at, effects);
        self.reschedule_sweep(at)
    }
}

/// Messages of a stream oldest first across partitions (by arrival order), for discard-old eviction.
struct OldestFirst<'a> {
    stream: &'a Stream,
    /// Next slot index per partition.
    positions: Vec<usize>,
}

impl<'a> OldestFirst<'a> {
    fn new(stream: &'a Stream) -> Self {
        OldestFirst { stream, positions: vec![0; stream.partitions.len()] }
    }
}

impl<'a> Iterator for OldestFirst<'a> {
    type Item = (u32, u64, &'a Message);

    fn next(&mut self) -> Option<Self::Item> {
        let mut best: Option<(u32, u64, &'a Message)> = None;
        for (index, partition) in self.stream.partitions.iter().enumerate() {
            let position = &mut self.positions[index];
            while matches!(partition.slots.get(*position), Some(None)) {
                *position += 1;
            }
            if let Some(Some(message)) = partition.slots.get(*position)
                && best.is_none_or(|(_, _, current)| message.stream_seq < current.stream_seq)
            {
                best = Some((index as u32, partition.first_seq + *position as u64, message));
            }
        }
        let (partition, _, _) = best?;
        self.positions[partition as usize] += 1;
        best
    }
}
