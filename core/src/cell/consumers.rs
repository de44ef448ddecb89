//! Consumers: creating and updating them, fetches, acks of every kind, dead letters and cursor commits.

use std::sync::Arc;

use super::limits::{MAX_CONSUMERS_PER_STREAM, MAX_FETCH, check_duration, check_name, invalid};
use super::timers::Timer;
use super::{Cell, stream_in};
use crate::command::{AckKind, AckState, Effect, Outcome, PublishRequest};
use crate::config::{ConsumerConfig, DeliverPolicy, RetentionPolicy};
use crate::consumer::{Consumer, DeadLetter, Phase};
use crate::error::{NameKind, Rejection};
use crate::partition::Message;
use crate::stream::{Incoming, RoomMode, Stream};
use crate::subject::{filters_overlap, validate_filter};
use crate::time::Millis;

impl Cell {
    pub(super) fn consumer_mut<'a>(stream: &'a mut Stream, consumer: &str) -> Result<&'a mut Consumer, Rejection> {
        let stream_name = stream.name.clone();
        stream.consumers.get_mut(consumer).ok_or_else(|| Rejection::ConsumerNotFound {
            stream: stream_name.to_string(),
            consumer: consumer.to_string(),
        })
    }

    pub(super) fn update_consumer(
        &mut self,
        stream: &str,
        name: &str,
        config: ConsumerConfig,
    ) -> Result<Outcome, Rejection> {
        config.validate()?;
        let s = stream_in(&mut self.streams, stream)?;
        let consumer = s
            .consumers
            .get_mut(name)
            .ok_or_else(|| Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: name.to_string() })?;
        if consumer.config.filter_subject != config.filter_subject
            || consumer.config.deliver_policy != config.deliver_policy
        {
            return Err(Rejection::InvalidConfig {
                reason: "a consumer's filter and deliver policy are fixed; create another consumer".to_string(),
            });
        }
        consumer.config = config;
        Ok(Outcome::ConsumerUpdated)
    }

    pub(super) fn create_consumer(
        &mut self,
        at: Millis,
        stream: &str,
        name: String,
        config: ConsumerConfig,
    ) -> Result<Outcome, Rejection> {
        check_name(NameKind::Consumer, &name)?;
        config.validate()?;
        let s = stream_in(&mut self.streams, stream)?;
        if let Some(existing) = s.consumers.get(name.as_str()) {
            if existing.config == config {
                return Ok(Outcome::ConsumerCreated { created: false });
            }
            return Err(Rejection::Conflict { what: "consumer".to_string(), name });
        }
        if s.consumers.len() >= MAX_CONSUMERS_PER_STREAM {
            return Err(invalid(format!("a stream has at most {MAX_CONSUMERS_PER_STREAM} consumers")));
        }
        if let Some(filter) = &config.filter_subject {
            validate_filter(filter).map_err(|reason| Rejection::InvalidSubject { subject: filter.clone(), reason })?;
            if !s.config.subjects.iter().any(|subject| filters_overlap(subject, filter)) {
                return Err(Rejection::InvalidConfig {
                    reason: format!("filter {filter:?} matches none of the stream's subjects"),
                });
            }
        }
        if s.config.retention == RetentionPolicy::WorkQueue {
            let mine = config.filter_subject.as_deref().unwrap_or(">");
            for other in s.consumers.values() {
                let theirs = other.config.filter_subject.as_deref().unwrap_or(">");
                if filters_overlap(mine, theirs) {
                    return Err(Rejection::SubjectOverlap {
                        subject: mine.to_string(),
                        other: theirs.to_string(),
                        owner: format!(
                            "consumer {:?} (a work-queue stream gives each message one consumer)",
                            other.name
                        ),
                    });
                }
            }
        }
        let cursors = s
            .partitions
            .iter()
            .map(|log| match config.deliver_policy {
                DeliverPolicy::All => log.first_seq,
                DeliverPolicy::New => log.next_seq(),
                DeliverPolicy::FromSequence(seq) => seq.max(log.first_seq),
                DeliverPolicy::FromTime(time) => log.first_seq_at_or_after(time),
            })
            .collect();
        let id = s.next_consumer_id;
        s.next_consumer_id += 1;
        let name: Arc<str> = Arc::from(name);
        s.consumers.insert(name.clone(), Consumer::new(id, name, config, cursors, at));
        // A consumer that starts past some messages is done with them; under interest retention they may go now
        // rather than at whatever command next sweeps.
        for partition in 0..s.config.partitions {
            s.sweep_interest(partition, 0, u64::MAX, &mut self.effects);
        }
        Ok(Outcome::ConsumerCreated { created: true })
    }

    pub(super) fn delete_consumer(&mut self, stream: &str, name: &str) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if s.consumers.remove(name).is_none() {
            return Err(Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: name.to_string() });
        }
        for partition in 0..s.config.partitions {
            s.sweep_interest(partition, 0, u64::MAX, &mut self.effects);
        }
        Ok(Outcome::ConsumerDeleted)
    }

    pub(super) fn fetch(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        member: &str,
        max: u32,
    ) -> Result<Outcome, Rejection> {
        check_name(NameKind::Member, member)?;
        if max == 0 || max > MAX_FETCH {
            return Err(invalid(format!("fetch max must be between 1 and {MAX_FETCH}")));
        }
        let s = stream_in(&mut self.streams, stream)?;
        let stream_id = s.id;
        Self::consumer_mut(s, consumer)?;
        let Stream { partitions, consumers, .. } = s;
        let c = consumers.get_mut(consumer).expect("checked above");
        let consumer_id = c.id;
        let member: Arc<str> = Arc::from(member);
        let (deliveries, timers) = c.fetch(partitions, &member, max, at);
        for (due, partition, seq) in timers {
            self.timers.set(at, due, Timer::Delivery { stream_id, consumer_id, partition, seq });
        }
        Ok(Outcome::Fetched(deliveries))
    }

    pub(super) fn ack(
        &mut self,
        at: Millis,
        stream: &str,
        consumer: &str,
        partition: u32,
        seq: u64,
        kind: AckKind,
    ) -> Result<Outcome, Rejection> {
        if let AckKind::Nack { delay_ms } = kind {
            check_duration("nack delay_ms", delay_ms)?;
        }
        let s = stream_in(&mut self.streams, stream)?;
        let stream_name = s.name.clone();
        if partition >= s.config.partitions {
            return Err(invalid(format!("stream {stream:?} has no partition {partition}")));
        }
        let stream_id = s.id;
        let c = Self::consumer_mut(s, consumer)?;
        let consumer_id = c.id;
        if seq >= c.cursors[partition as usize] {
            return Err(Rejection::NotDelivered { partition, seq });
        }
        let Some(entry) = c.outstanding.get(&(partition, seq)) else {
            return Ok(Outcome::Acked { state: AckState::Applied, already_done: true });
        };
        let delivery_count = entry.delivery_count;
        if delivery_count == 0 {
            // A delayed message that has not been delivered yet.
            return Err(Rejection::NotDelivered { partition, seq });
        }
        let mut letters: Vec<DeadLetter> = Vec::new();
        let mut timer = None;
        let state = match kind {
            AckKind::Applied | AckKind::Replicated => {
                #[cfg(madsim)]
                let forget = !cellog_planted::active(cellog_planted::Mutant::RedeliveryAfterAck);
                #[cfg(not(madsim))]
                let forget = true;
                if forget {
                    c.forget(partition, seq);
                }
                c.n_acked += 1;
                if kind == AckKind::Applied { AckState::Applied } else { AckState::Replicated }
            }
            AckKind::Received | AckKind::InProgress => {
                if !matches!(entry.phase, Phase::Pending { .. }) {
                    return Err(Rejection::DeliveryExpired { partition, seq });
                }
                let deadline = at.plus(c.config.ack_wait_ms);
                c.set_phase(partition, seq, Phase::Pending { deadline });
                c.outstanding.get_mut(&(partition, seq)).expect("outstanding").state = AckState::Received;
                timer = Some(deadline);
                AckState::Received
            }
            AckKind::Nack { delay_ms } => {
                if c.exhausted(delivery_count) {
                    letters.extend(c.dead_letter(partition, seq, "max_deliver"));
                } else if delay_ms > 0 {
                    let until = at.plus(delay_ms);
                    c.set_phase(partition, seq, Phase::Waiting { until });
                    timer = Some(until);
                } else {
                    c.set_phase(partition, seq, Phase::Ready);
                }
                if let Some(entry) = c.outstanding.get_mut(&(partition, seq)) {
                    entry.state = AckState::Nack;
                }
                AckState::Nack
            }
            AckKind::Failed => {
                letters.extend(c.dead_letter(partition, seq, "failed"));
                AckState::Failed
            }
            AckKind::Term => {
                c.forget(partition, seq);
                AckState::Failed
            }
        };
        if let Some(due) = timer {
            self.timers.set(at, due, Timer::Delivery { stream_id, consumer_id, partition, seq });
        }
        let buried = !letters.is_empty();
        self.bury(at, &stream_name, letters);
        if !buried && matches!(state, AckState::Applied | AckState::Replicated | AckState::Failed) {
            let s = self.streams.get_mut(&stream_name).expect("exists");
            s.remove_if_uninteresting(partition, seq, &mut self.effects);
        }
        Ok(Outcome::Acked { state, already_done: false })
    }

    /// Copies dead letters into the stream's dead-letter stream (if it has one) with their origin in headers, and
    /// lets interest retention drop the originals.
    pub(super) fn bury(&mut self, at: Millis, stream: &Arc<str>, letters: Vec<DeadLetter>) {
        for letter in letters {
            let source = self.streams.get(stream).expect("the source stream exists");
            let original = source.message(letter.partition, letter.seq).cloned();
            let target = source.config.dead_letter_stream.clone();
            let mut copy = None;
            if let (Some(message), Some(target)) = (original, target)
                && let Some(dead_letters) = self.streams.get_mut(target.as_str())
            {
                let mut headers = message.headers().cloned().unwrap_or_default();
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
                let target_name = dead_letters.name.clone();
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
            self.effects.push(Effect::DeadLettered {
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
            .partitions
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?
            .next_seq();
        let c = Self::consumer_mut(s, consumer)?;
        let floor = c.ack_floor(partition);
        if next_seq < floor {
            return Err(Rejection::CursorRegression { current: floor });
        }
        if next_seq > log_next.max(c.cursors[partition as usize]) {
            return Err(invalid(format!(
                "cannot commit past the end of partition {partition} (next sequence {log_next})"
            )));
        }
        let done: Vec<u64> =
            c.outstanding.range((partition, 0)..(partition, next_seq)).map(|(&(_, seq), _)| seq).collect();
        for seq in done {
            c.forget(partition, seq);
            c.n_acked += 1;
        }
        let cursor = &mut c.cursors[partition as usize];
        let previous = *cursor;
        *cursor = (*cursor).max(next_seq);
        s.sweep_interest(partition, floor.min(previous), next_seq.saturating_sub(1), &mut self.effects);
        Ok(Outcome::CursorCommitted { next_seq })
    }
}
