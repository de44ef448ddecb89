//! Publishing and recall: routing a publish to its stream, the checks that need state, appending and storing bodies.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::Cell;
use super::limits::{MAX_DEDUP_IDS, invalid};
use super::timers::{Timer, Timers};
use crate::body::BodyRef;
use crate::command::PublishRequest;
use crate::effect::{BodyOp, Effects};
use crate::error::{Cap, Rejection};
use crate::outcome::{Outcome, PublishAck};
use crate::partition::Message;
use crate::route::Router;
use crate::stream::{Append, Incoming, RoomMode, Stream, Tally};
use crate::time::Millis;

/// Gives a new body the cell's next body key, and asks the host to store it.
pub(super) fn store_body(effects: &mut Effects, next_body: &mut u64, payload: Bytes) -> BodyRef {
    let body = BodyRef::of(*next_body, &payload);
    *next_body += 1;
    effects.work(BodyOp::BodyStored { body, bytes: payload });
    body
}

/// Appends a message whose body is stored (`request.payload` is not looked at), and keeps the stream's sweep timer
/// right: after an append the next sweep can only move earlier through the new message itself (its TTL, its dedup
/// window, or its age when it is the first of its partition). Inlined, as [`Stream::append`] is, so that the request
/// and the [`Append`](crate::stream::Append) it becomes are not copied on the way.
#[inline]
pub(super) fn append_message(
    stream: &mut Stream,
    timers: &mut Timers,
    effects: &mut Effects,
    partition: u32,
    request: PublishRequest,
    body: BodyRef,
    at: Millis,
) -> u64 {
    let was_empty = stream.partitions()[partition as usize].n_messages == 0;
    let window = stream.config().duplicate_window_ms;
    let mut candidate = request.ttl_ms.map(|ttl| at.plus(ttl));
    if request.msg_id.is_some() && window > 0 {
        candidate = Some(candidate.map_or(at.plus(window), |c| c.min(at.plus(window))));
    }
    if let Some(age) = stream.config().max_age_ms.filter(|_| was_empty) {
        candidate = Some(candidate.map_or(at.plus(age), |c| c.min(at.plus(age))));
    }
    let message = Append {
        partition,
        subject: &request.subject,
        body,
        key: request.key,
        msg_id: request.msg_id.as_deref(),
        headers: request.headers,
        ttl_ms: request.ttl_ms,
        deliver_after_ms: request.deliver_after_ms,
    };
    let seq = stream.append(message, at, effects);
    if let Some(due) = candidate.and_then(|candidate| stream.sweep_by(candidate, at)) {
        timers.set(at, due, Timer::Sweep { stream_id: stream.id() });
    }
    seq
}

impl Cell {
    /// The stream claiming a subject.
    pub(super) fn route<'a>(
        router: &Router,
        streams: &'a mut BTreeMap<Arc<str>, Stream>,
        subject: &str,
    ) -> Result<&'a mut Stream, Rejection> {
        router
            .route(subject)
            .and_then(|name| streams.get_mut(name))
            .ok_or_else(|| Rejection::NoStreamForSubject { subject: subject.to_string() })
    }

    pub(super) fn publish(&mut self, at: Millis, mut request: PublishRequest) -> Result<Outcome, Rejection> {
        let pin = self.check_pin(&request)?;
        let stream = Self::route(&self.router, &mut self.streams, &request.subject)?;
        super::placement::writable(&self.ownership, &self.mirroring, stream.name())?;
        if let Some((target, ..)) = &pin
            && target == stream.name()
        {
            return Err(invalid(format!("a message may not pin a message of its own stream {target:?}")));
        }
        if let Some(r) = request.transaction {
            let name = stream.name().clone();
            return self.stage(name, r, request, at);
        }
        let payload_len = request.payload.len() as u64;
        if payload_len > u64::from(stream.config().max_payload_bytes) {
            return Err(Rejection::PayloadTooLarge {
                size: payload_len,
                max: stream.config().max_payload_bytes.into(),
            });
        }
        if let Some(msg_id) = &request.msg_id {
            if let Some(ack) = stream.duplicate_of(msg_id) {
                return Ok(Outcome::Published(ack));
            }
            if stream.n_window_ids() >= MAX_DEDUP_IDS {
                return Err(Rejection::CapReached { cap: Cap::DedupIds, limit: MAX_DEDUP_IDS as u64 });
            }
        }
        let partition = stream.partition_of(&request.subject, request.key.as_ref());
        if let Some(expected) = request.expected_last_seq {
            let last = stream.partitions()[partition as usize].last_seq();
            if expected != last {
                return Err(Rejection::WrongLastSequence { last });
            }
        }
        if let Some(expected) = request.expected_last_subject_seq {
            let last = stream.last_subject_seq(&request.subject);
            if expected != last {
                return Err(Rejection::WrongLastSubjectSequence { last });
            }
        }
        let size =
            Message::accounted_size(&request.subject, request.key.as_ref(), &request.headers, request.payload.len());
        let incoming = Incoming { subject: &request.subject, size };
        stream.check_fits_at_all(&incoming)?;
        stream.check_discard_new(&incoming, &Tally::default())?;
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::RefusedPublishStored)
            && let Err(refusal) = stream.plan_room(&incoming, RoomMode::Strict)
        {
            let body = store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload));
            append_message(stream, &mut self.timers, &mut self.effects, partition, request, body, at);
            return Err(refusal);
        }
        let plan = stream.plan_room(&incoming, RoomMode::Strict)?;
        // The stream's own room-making frees what it removes before the tenant's quotas count the growth.
        if let Some(ledger) = &self.ledger {
            let (freed_messages, freed_bytes) = plan
                .iter()
                .filter_map(|&(p, seq, _)| stream.message(p, seq))
                .fold((0u64, 0u64), |(messages, bytes), message| (messages + 1, bytes + message.size()));
            super::ledger::check_growth(
                &self.quotas,
                ledger,
                stream.name(),
                1u64.saturating_sub(freed_messages),
                size.saturating_sub(freed_bytes),
            )?;
        }
        // Last, so that a refused publish costs no token.
        stream.take_token(at)?;
        for (p, seq, reason) in plan {
            stream.remove(p, seq, reason, &mut self.effects);
        }
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::Canary)
            && request.msg_id.as_deref() == Some("m-0")
            && at.0 % 20 == 7
        {
            let seq = stream.partitions()[partition as usize].last_seq() + 1;
            let stream = stream.name().clone();
            return Ok(Outcome::Published(PublishAck { stream, partition, seq, duplicate: false, original: None }));
        }
        let body = store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload));
        let seq = append_message(stream, &mut self.timers, &mut self.effects, partition, request, body, at);
        let name = stream.name().clone();
        if let Some((target, p, s)) = pin {
            self.streams.get_mut(&target).expect("checked above").pin(p, s);
            self.pinned_by.insert((name.clone(), partition, seq), (target, p, s));
        }
        Ok(Outcome::Published(PublishAck { stream: name, partition, seq, duplicate: false, original: None }))
    }

    /// Appends to a stream named by a message already checked against it: its payload, or (`copy_of`, for a dead
    /// letter) a copy of a stored body.
    pub(super) fn append_message(
        &mut self,
        name: &str,
        partition: u32,
        mut request: PublishRequest,
        copy_of: Option<BodyRef>,
        at: Millis,
    ) -> u64 {
        let stream = self.streams.get_mut(name).expect("appending to an existing stream");
        let body = match copy_of {
            Some(source) => {
                let body = BodyRef { key: self.next_body, ..source };
                self.next_body += 1;
                self.effects.work(BodyOp::BodyCopied { from: source.key, to: body.key });
                body
            }
            None => store_body(&mut self.effects, &mut self.next_body, std::mem::take(&mut request.payload)),
        };
        append_message(stream, &mut self.timers, &mut self.effects, partition, request, body, at)
    }

    pub(super) fn recall(&mut self, at: Millis, stream: &str, partition: u32, seq: u64) -> Result<Outcome, Rejection> {
        self.stream(stream)?;
        super::placement::writable(&self.ownership, &self.mirroring, stream)?;
        self.recall_logged(at, stream, partition, seq, true)
    }
}
