//! Streams and what keeps or removes their messages: creating, updating and deleting streams, retention, registered
//! peers (whose watermarks hold retention back) and pins (messages that keep another stream's message).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::limits::{MAX_PEERS_PER_STREAM, MAX_STREAMS, invalid};
use super::timers::reschedule_sweep;
use super::{Cell, MessageRef, stream_in};
use crate::command::PublishRequest;
use crate::config::StreamConfig;
use crate::effect::BodyOp;
use crate::error::Rejection;
use crate::outcome::Outcome;
use crate::stream::Stream;
use crate::tenant::{subject_tenant, tenant_of};
use crate::time::Millis;

/// The header that makes a message pin another: `STREAM/PARTITION/SEQ` of a stored message in another stream.
/// Retention, recall and stream deletion keep a pinned message until every message pinning it is gone (removed by
/// its own stream's retention, or its stream deleted). Removals by age and by limits go oldest first and stop at a
/// pinned message, as they stop at a registered peer's watermark. Provenance rows pin the envelopes they describe.
pub const PIN_HEADER: &str = "Cellog-Pin";

/// Takes one pin off `target`; when it was the last, names the target's stream in `released` (retention may now take
/// the message).
pub(super) fn unpin(streams: &mut BTreeMap<Arc<str>, Stream>, target: MessageRef, released: &mut BTreeSet<Arc<str>>) {
    let (stream, partition, seq) = target;
    if let Some(target_stream) = streams.get_mut(&stream)
        && target_stream.unpin(partition, seq)
    {
        released.insert(stream);
    }
}

impl Cell {
    pub(super) fn check_stream_config(&self, name: &str, config: &StreamConfig) -> Result<(), Rejection> {
        config.validate()?;
        // A tenant's stream claims its tenant's subjects and no others; the cell's own, none of a tenant's.
        let tenant = tenant_of(name);
        let whose = |tenant: Option<&str>| tenant.map_or("the cell's own".to_string(), |t| format!("tenant {t:?}'s"));
        if let Some(subject) = config.subjects.iter().find(|subject| subject_tenant(subject) != tenant) {
            return Err(Rejection::InvalidConfig {
                reason: format!(
                    "stream {name:?} is {} and cannot claim {subject:?}, {} subjects",
                    whose(tenant),
                    whose(subject_tenant(subject))
                ),
            });
        }
        if let Some(dead_letter) = &config.dead_letter_stream
            && tenant_of(dead_letter) != tenant
        {
            return Err(Rejection::InvalidConfig {
                reason: format!("dead-letter stream {dead_letter:?} is not in the scope of stream {name:?}"),
            });
        }
        // The overlap named is the first in (other stream's name, this config's filter, the other's filter) order,
        // found through the router rather than by comparing with every filter of every stream.
        // ((other stream, this filter's index, the other filter's index), this filter, the other filter)
        type Overlap<'a> = ((&'a Arc<str>, usize, usize), &'a String, &'a Arc<str>);
        let mut first: Option<Overlap<'_>> = None;
        for (index, subject) in config.subjects.iter().enumerate() {
            for (other_name, existing) in self.router.overlapping(subject) {
                if &**other_name == name {
                    continue;
                }
                let theirs = self.streams.get(other_name).map_or(&[][..], |other| &other.config().subjects[..]);
                let position = theirs.iter().position(|f| **f == **existing).unwrap_or(usize::MAX);
                let order = (other_name, index, position);
                if first.is_none_or(|(seen, ..)| order < seen) {
                    first = Some((order, subject, existing));
                }
            }
        }
        if let Some(((other_name, ..), subject, existing)) = first {
            return Err(Rejection::SubjectOverlap {
                subject: subject.clone(),
                other: existing.to_string(),
                owner: format!("stream {other_name:?}"),
            });
        }
        if let Some(dead_letter) = &config.dead_letter_stream {
            if dead_letter == name {
                return Err(Rejection::InvalidConfig {
                    reason: "a stream cannot be its own dead-letter stream".to_string(),
                });
            }
            self.stream(dead_letter)?;
        }
        Ok(())
    }

    pub(super) fn create_stream(
        &mut self,
        at: Millis,
        name: String,
        config: StreamConfig,
    ) -> Result<Outcome, Rejection> {
        if let Some(existing) = self.streams.get(name.as_str()) {
            if *existing.config() == config {
                return Ok(Outcome::StreamCreated { created: false });
            }
            return Err(Rejection::Conflict { what: "stream".to_string(), name });
        }
        self.check_stream_config(&name, &config)?;
        if self.streams.len() >= MAX_STREAMS {
            return Err(invalid(format!("a cell holds at most {MAX_STREAMS} streams")));
        }
        self.check_stream_quota(&name)?;
        let id = self.next_stream_id;
        self.next_stream_id += 1;
        let name: Arc<str> = Arc::from(name);
        self.stream_names.insert(id, name.clone());
        for filter in &config.subjects {
            self.router.insert(filter, &name);
        }
        self.streams.insert(name.clone(), Stream::new(id, name, config, at, self.id_key.0));
        Ok(Outcome::StreamCreated { created: true })
    }

    pub(super) fn update_stream(&mut self, at: Millis, name: &str, config: StreamConfig) -> Result<Outcome, Rejection> {
        let existing = self.stream(name)?;
        if existing.config().partitions != config.partitions {
            return Err(Rejection::InvalidConfig {
                reason: "partitions cannot change: keys would move to other partitions".to_string(),
            });
        }
        if existing.config().retention != config.retention {
            return Err(Rejection::InvalidConfig { reason: "the retention policy cannot change".to_string() });
        }
        self.check_stream_config(name, &config)?;
        let stream = stream_in(&mut self.streams, name)?;
        for filter in &stream.config().subjects {
            self.router.remove(filter);
        }
        for filter in &config.subjects {
            self.router.insert(filter, stream.name());
        }
        stream.set_config(config, at);
        self.enforce_retention(at, name, None);
        Ok(Outcome::StreamUpdated)
    }

    pub(super) fn delete_stream(&mut self, at: Millis, name: &str) -> Result<Outcome, Rejection> {
        self.stream(name)?;
        if let Some((user, _)) =
            self.streams.iter().find(|(_, s)| s.config().dead_letter_stream.as_deref() == Some(name))
        {
            return Err(Rejection::InUse {
                stream: name.to_string(),
                by: format!("it is the dead-letter stream of {user:?}"),
            });
        }
        if let Some((partition, seq)) = self.streams[name].first_pinned() {
            let by = self.pinned_by.iter().find(|(_, target)| **target == (Arc::from(name), partition, seq));
            return Err(Rejection::InUse {
                stream: name.to_string(),
                by: match by {
                    Some(((stream, p, s), _)) => {
                        format!("its message {partition}/{seq} is pinned by {stream:?} {p}/{s}")
                    }
                    None => format!("its message {partition}/{seq} is pinned"),
                },
            });
        }
        let stream = self.streams.remove(name).expect("checked above");
        self.stream_names.remove(&stream.id());
        self.timers.cancel_stream(stream.id());
        for filter in &stream.config().subjects {
            self.router.remove(filter);
        }
        for body in stream.bodies() {
            self.effects.work(BodyOp::BodyReleased { key: body.key });
        }
        let mut released: BTreeSet<Arc<str>> = BTreeSet::new();
        let pinning: Vec<MessageRef> =
            self.pinned_by.keys().filter(|(stream, ..)| **stream == *name).cloned().collect();
        for key in pinning {
            let target = self.pinned_by.remove(&key).expect("listed above");
            unpin(&mut self.streams, target, &mut released);
        }
        self.forget_groups_of(name);
        self.forget_mirroring_of(name);
        self.effects.stream_deleted(stream.name());
        for target in released {
            self.enforce_retention(at, &target, None);
        }
        Ok(Outcome::StreamDeleted)
    }

    /// Removes whatever retention allows now: expired messages, limits exceeded while a peer held them back (or
    /// lowered by an update), and messages no consumer needs any more under interest retention.
    ///
    /// Interest retention is re-checked over `interest`: one partition's range of sequences, or (`None`) the whole
    /// stream. A peer's progress passes only the range it just received, so frequent progress reports stay cheap.
    pub(super) fn enforce_retention(&mut self, at: Millis, name: &str, interest: Option<(u32, u64, u64)>) {
        let Some(stream) = self.streams.get_mut(name) else { return };
        stream.sweep(at, &mut self.effects);
        stream.release_held(&mut self.effects);
        stream.shrink_to_limits(&mut self.effects);
        match interest {
            Some((partition, from, to)) => stream.sweep_interest(partition, from, to, &mut self.effects),
            None => stream.sweep_all_interest(&mut self.effects),
        }
        reschedule_sweep(stream, &mut self.timers, at);
    }

    // ----- pins -----

    /// The message a publish pins, checked: its header names a stored message of another stream.
    pub(super) fn check_pin(&self, request: &PublishRequest) -> Result<Option<MessageRef>, Rejection> {
        let Some(value) = request.headers.get(PIN_HEADER) else { return Ok(None) };
        let bad = || invalid(format!("{PIN_HEADER} {value:?}: expected STREAM/PARTITION/SEQ of a stored message"));
        // From the right: a tenant's stream name holds a `/` of its own (`TENANT/NAME/PARTITION/SEQ`).
        let mut parts = value.rsplitn(3, '/');
        let (Some(seq), Some(partition), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if crate::tenant::validate_scoped_name(name).is_err() {
            return Err(bad());
        }
        let (Ok(partition), Ok(seq)) = (partition.parse::<u32>(), seq.parse::<u64>()) else { return Err(bad()) };
        let target = self.stream(name)?;
        if request.transaction.is_some() {
            return Err(invalid(format!("a message with {PIN_HEADER} cannot be published in a transaction")));
        }
        if target.message(partition, seq).is_none() {
            return Err(Rejection::MessageNotFound { stream: name.to_string(), partition, seq });
        }
        Ok(Some((target.name().clone(), partition, seq)))
    }

    /// Releases what removed pinning messages pinned (every removal of this apply from the `from`th on is looked at), and lets
    /// retention take what it may now, which can remove further pinning messages in turn.
    pub(super) fn release_pins(&mut self, at: Millis, mut from: usize) {
        while from < self.effects.n_removed() {
            let end = self.effects.n_removed();
            let mut released: BTreeSet<Arc<str>> = BTreeSet::new();
            for removal in self.effects.removed_since(from) {
                if let Some(target) = self.pinned_by.remove(removal) {
                    unpin(&mut self.streams, target, &mut released);
                }
            }
            from = end;
            for name in released {
                self.enforce_retention(at, &name, None);
            }
        }
    }

    // ----- peers -----

    pub(super) fn register_peer(&mut self, stream: &str, peer: String) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if !s.register_peer(peer, MAX_PEERS_PER_STREAM) {
            return Err(invalid(format!("a stream has at most {MAX_PEERS_PER_STREAM} registered peers")));
        }
        Ok(Outcome::PeerRegistered)
    }

    pub(super) fn peer_progress(
        &mut self,
        at: Millis,
        stream: &str,
        peer: &str,
        partition: u32,
        received_seq: u64,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let last = s
            .partitions()
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?
            .last_seq();
        if received_seq > last {
            return Err(invalid(format!(
                "peer cannot have received sequence {received_seq}; partition {partition} ends at {last}"
            )));
        }
        if let Some(previous) = s.peer_progress(peer, partition, received_seq)? {
            self.enforce_retention(at, stream, Some((partition, previous + 1, received_seq)));
        }
        Ok(Outcome::PeerProgressed)
    }

    pub(super) fn unregister_peer(&mut self, at: Millis, stream: &str, peer: &str) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        if !s.unregister_peer(peer) {
            return Err(Rejection::PeerNotFound { stream: stream.to_string(), peer: peer.to_string() });
        }
        self.forget_mirror_peer(stream, peer);
        self.enforce_retention(at, stream, None);
        Ok(Outcome::PeerUnregistered)
    }
}
