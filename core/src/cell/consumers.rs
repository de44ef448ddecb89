//! Consumers: creating and updating them, fetches, acks of every kind, dead letters and cursor commits.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::limits::{MAX_CONSUMERS_PER_STREAM, invalid};
use super::timers::Timer;
use super::{Cell, stream_in};
use crate::command::{AckItem, AckKind, GroupMember, PublishRequest};
use crate::config::{ConsumerConfig, RetentionPolicy};
use crate::consumer::{Acked, DeadLetter};
use crate::effect::Transition;
use crate::error::Rejection;
use crate::outcome::{AckAnswer, AckState, Delivery, Outcome};
use crate::partition::Message;
use crate::stream::{Incoming, RoomMode};
use crate::subject::{filters_overlap, validate_filter};
use crate::time::Millis;

impl Cell {
    pub(super) fn update_consumer(
        &mut self,
        stream: &str,
        name: &str,
        config: ConsumerConfig,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        s.consumer_mut(name)?.update_config(config)?;
        Ok(Outcome::ConsumerUpdated)
    }

    pub(super) fn create_consumer(
        &mut self,
        at: Millis,
        stream: &str,
        name: String,
        config: ConsumerConfig,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if let Ok(existing) = s.consumer(&name) {
            if *existing.config() == config {
                return Ok(Outcome::ConsumerCreated { created: false });
            }
            return Err(Rejection::Conflict { what: "consumer".to_string(), name });
        }
        if s.n_consumers() >= MAX_CONSUMERS_PER_STREAM {
            return Err(invalid(format!("a stream has at most {MAX_CONSUMERS_PER_STREAM} consumers")));
        }
        if let Some(filter) = &config.filter_subject {
            validate_filter(filter).map_err(|reason| Rejection::InvalidSubject { subject: filter.clone(), reason })?;
            if !s.config().subjects.iter().any(|subject| filters_overlap(subject, filter)) {
                return Err(Rejection::InvalidConfig {
                    reason: format!("filter {filter:?} matches none of the stream's subjects"),
                });
            }
        }
        if s.config().retention == RetentionPolicy::WorkQueue {
            let mine = config.filter_subject.as_deref().unwrap_or(">");
            for other in s.consumers() {
                let theirs = other.config().filter_subject.as_deref().unwrap_or(">");
                if filters_overlap(mine, theirs) {
                    return Err(Rejection::SubjectOverlap {
                        subject: mine.to_string(),
                        other: theirs.to_string(),
                        owner: format!(
                            "consumer {:?} (a work-queue stream gives each message one consumer)",
                            other.name()
                        ),
                    });
                }
            }
        }
        // A consumer that starts past some messages is done with them; under interest retention they may go now
        // rather than at whatever command next sweeps.
        s.add_consumer(Arc::from(name), config, at, &mut self.effects);
        Ok(Outcome::ConsumerCreated { created: true })
    }

    pub(super) fn delete_consumer(&mut self, stream: &str, name: &str) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let ids = s.consumer(name).map(|c| (s.id(), c.id()));
        if let Ok((stream_id, consumer_id)) = ids {
            self.timers.cancel_consumer(stream_id, consumer_id);
        }
        let s = stream_in(&mut self.streams, stream)?;
        if !s.remove_consumer(name, &mut self.effects) {
            return Err(Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: name.to_string() });
        }
        // A group's consumer goes with its group.
        self.groups.remove(&(Arc::from(stream), Arc::from(name)));
        Ok(Outcome::ConsumerDeleted)
    }

    pub(super) fn fetch(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        member: &str,
        max: u32,
        only: Option<&BTreeSet<u32>>,
    ) -> Result<Vec<Delivery>, Rejection> {
        // The tenant's and the cell's caps on deliveries awaiting an ack (see `crate::quota`).
        let (room, per_subject) = self.in_flight_caps(stream);
        let max = max.min(u32::try_from(room).unwrap_or(u32::MAX));
        let s = stream_in(&mut self.streams, stream)?;
        if max == 0 {
            // No room under a quota: nothing is delivered, and nothing (not even the partition a fetch starts at) moves.
            s.consumer(consumer)?;
            return Ok(Vec::new());
        }
        let stream_id = s.id();
        let member: Arc<str> = Arc::from(member);
        let (consumer_id, deliveries, timers) = s.fetch(consumer, &member, max, at, only, per_subject)?;
        for (due, partition, seq) in timers {
            self.timers.set(at, due, Timer::Delivery { stream_id, consumer_id, partition, seq });
        }
        Ok(deliveries)
    }

    pub(super) fn ack(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        partition: u32,
        seq: u64,
        kind: AckKind,
    ) -> Result<AckAnswer, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let stream_name = s.name().clone();
        if partition >= s.config().partitions {
            return Err(invalid(format!("stream {stream:?} has no partition {partition}")));
        }
        let stream_id = s.id();
        let c = s.consumer_mut(consumer)?;
        let consumer_id = c.id();
        let Acked { state, already_done, timer, dead_letter } = c.ack(partition, seq, kind, at)?;
        if already_done {
            return Ok(AckAnswer { state, already_done: true });
        }
        if !c.is_outstanding(partition, seq) {
            self.timers.cancel_delivery(stream_id, consumer_id, partition, seq);
        }
        if let Some(due) = timer {
            self.timers.set(at, due, Timer::Delivery { stream_id, consumer_id, partition, seq });
        }
        let letters: Vec<DeadLetter> = dead_letter.into_iter().collect();
        let buried = !letters.is_empty();
        self.bury(at, &stream_name, letters);
        if !buried && matches!(state, AckState::Applied | AckState::Replicated | AckState::Failed) {
            let s = self.streams.get_mut(&stream_name).expect("exists");
            s.remove_if_uninteresting(partition, seq, &mut self.effects);
        }
        Ok(AckAnswer { state, already_done: false })
    }

    /// The acks of [`Command::Acks`], each answered on its own and in order, as `member` of a group when one is
    /// named (each item then refused unless the member owns its partition in its generation).
    pub(super) fn ack_each(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        member: Option<&GroupMember>,
        items: Vec<AckItem>,
    ) -> Result<Outcome, Rejection> {
        // A stream or consumer that is not there refuses the whole batch.
        stream_in(&mut self.streams, stream)?.consumer(consumer)?;
        if member.is_none() {
            self.refuse_group_consumer(stream, consumer)?;
        }
        let answers = items
            .into_iter()
            .map(|AckItem { partition, seq, kind }| {
                if let Some(GroupMember { member, generation }) = member {
                    self.check_member_owns(stream, consumer, member, *generation, partition)?;
                }
                self.ack(at, stream, consumer, partition, seq, kind)
            })
            .collect();
        Ok(Outcome::AckedEach(answers))
    }

    /// Copies dead letters into the stream's dead-letter stream (if it has one) with their origin in headers, and
    /// lets interest retention drop the originals.
    pub(super) fn bury(&mut self, at: Millis, stream: &Arc<str>, letters: Vec<DeadLetter>) {
        for letter in letters {
            let source = self.streams.get(stream).expect("the source stream exists");
            let original = source.message(letter.partition, letter.seq).cloned();
            let target = source.config().dead_letter_stream.clone();
            let mut copy = None;
            // A dead-letter stream that moved to another cell gets no copy here (it would fork that stream's log),
            // nor does one that claims subjects reserved for the node (its streams are written by the node alone;
            // a principal can name no such stream, but the node may reserve its subjects after it was named).
            if let (Some(message), Some(target)) = (original, target)
                && super::placement::writable(&self.ownership, &self.mirroring, &target).is_ok()
                && let Some(dead_letters) = self.streams.get_mut(target.as_str())
                && self.auth.reserved_overlap(&dead_letters.config().subjects).is_none()
            {
                let mut headers = message.headers().map(crate::headers::Packed::to_headers).unwrap_or_default();
                for (name, value) in [
                    ("cellog-dead-letter-stream", stream.to_string()),
                    ("cellog-dead-letter-consumer", letter.consumer.to_string()),
                    ("cellog-dead-letter-partition", letter.partition.to_string()),
                    ("cellog-dead-letter-seq", letter.seq.to_string()),
                    ("cellog-dead-letter-deliveries", letter.delivery_count.to_string()),
                    ("cellog-dead-letter-reason", letter.reason.to_string()),
                ] {
                    headers.insert(name.to_string(), value);
                }
                let partition = dead_letters.partition_of(&message.subject, message.key());
                let size =
                    Message::accounted_size(&message.subject, message.key(), &headers, message.body.len as usize);
                let incoming = Incoming { subject: &message.subject, size };
                let plan =
                    dead_letters.plan_room(&incoming, RoomMode::Lenient).expect("lenient planning never refuses");
                for (p, seq, reason) in plan {
                    dead_letters.remove(p, seq, reason, &mut self.effects);
                }
                let target_name = dead_letters.name().clone();
                let request = PublishRequest {
                    subject: message.subject.to_string(),
                    key: message.key().cloned(),
                    headers,
                    ..PublishRequest::default()
                };
                // A recalled message's copy gets an empty body, as its tombstone has none to copy.
                let copy_of = message.recalled_at().is_none().then_some(message.body);
                let seq = self.append_message(&target_name, partition, request, copy_of, at);
                copy = Some((target_name, partition, seq));
            }
            self.effects.note(|| Transition::DeadLettered {
                stream: stream.clone(),
                consumer: letter.consumer.clone(),
                partition: letter.partition,
                seq: letter.seq,
                delivery_count: letter.delivery_count,
                copy,
            });
            let source = self.streams.get_mut(stream).expect("the source stream exists");
            source.remove_if_uninteresting(letter.partition, letter.seq, &mut self.effects);
        }
    }

    pub(super) fn commit_cursor(
        &mut self,
        stream: &str,
        consumer: &str,
        partition: u32,
        next_seq: u64,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let log_next = s
            .partitions()
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?
            .next_seq();
        let from = s.consumer_mut(consumer)?.commit_cursor(partition, next_seq, log_next)?;
        s.sweep_interest(partition, from, next_seq.saturating_sub(1), &mut self.effects);
        Ok(Outcome::CursorCommitted { next_seq })
    }
}
