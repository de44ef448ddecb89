//! A stream: its partitions ([`crate::partition`]), its subject and dedup indexes ([`crate::index`]), TTLs, its rate
//! limit ([`crate::bucket`]), registered peers and pins, and the retention decisions that remove messages.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use crate::body::BodyRef;
use crate::bucket::TokenBucket;
use crate::command::Headers;
use crate::config::{ConsumerConfig, DeliverPolicy, DiscardPolicy, RetentionPolicy, StreamConfig};
use crate::consumer::{Consumer, DeliveryTimer};
use crate::dedup::{DedupIndex, IdKey};
use crate::effect::{BodyOp, Effects};
use crate::error::{Quota, Rejection};
use crate::index::{DedupEntry, SubjectState};
use crate::info::{PartitionInfo, PeerInfo, StreamInfo};
use crate::outcome::{Delivery, PublishAck, Record, RemovalReason};
use crate::partition::{Extras, Message, Partition};
use crate::snapshot::v3;
use crate::time::Millis;

/// Whether a removal may be refused (a plain publish) or must make do (a committed transaction, a dead letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RoomMode {
    /// Refuse with `QuotaExceeded` or `StorageFull` when room cannot be made.
    Strict,
    /// Never refuse: remove what may be removed and let the stream exceed its limits until it can shrink.
    Lenient,
}

/// What a new message will need: its partition, subject and size.
pub(crate) struct Incoming<'a> {
    pub subject: &'a str,
    pub size: u64,
}

/// A message to append: checked, with room made and its body stored.
pub(crate) struct Append<'a> {
    pub partition: u32,
    pub subject: &'a str,
    pub body: BodyRef,
    pub key: Option<Bytes>,
    pub msg_id: Option<&'a str>,
    pub headers: Headers,
    pub ttl_ms: Option<u64>,
    pub deliver_after_ms: Option<u64>,
}

/// Counts of messages already promised to a stream (staged in a transaction that is committing).
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    pub n_messages: u64,
    pub n_bytes: u64,
    pub subjects: BTreeMap<String, (u64, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Stream {
    id: u64,
    name: Arc<str>,
    config: StreamConfig,
    created_at: Millis,
    partitions: Vec<Partition>,
    next_stream_seq: u64,
    n_messages: u64,
    n_bytes: u64,
    subjects: BTreeMap<Arc<str>, SubjectState>,
    dedup: DedupIndex,
    /// (window end, id, partition, seq) in publish order, hence in time order.
    dedup_expiry: VecDeque<(Millis, Arc<str>, u32, u64)>,
    /// (expiry, partition, seq) of messages with a TTL, not yet expired.
    ttl_index: BTreeSet<(Millis, u32, u64)>,
    /// Messages whose TTL passed while a registered peer had not received them: removed once it has.
    ttl_held: BTreeSet<(u32, u64)>,
    bucket: Option<TokenBucket>,
    consumers: BTreeMap<Arc<str>, Consumer>,
    next_consumer_id: u64,
    /// Registered peers and, per partition, the last sequence each has received.
    peers: BTreeMap<String, Vec<u64>>,
    /// Messages another stream's messages pin (see [`crate::PIN_HEADER`]), with how many pin each: retention keeps
    /// them until every pin is gone.
    pins: BTreeMap<(u32, u64), u32>,
    /// When the stream's sweep timer is set for.
    sweep_at: Option<Millis>,
}

impl From<v3::Stream> for Stream {
    fn from(stream: v3::Stream) -> Self {
        let partitions: Vec<Partition> = stream.partitions.into_iter().map(Partition::from).collect();
        // A message id is one allocation, shared by the message, its index entry and its expiry, as in a running cell:
        // the copies decoded for the index are dropped for the message's own.
        let shared = |id: Arc<str>, partition: u32, seq: u64| -> Arc<str> {
            let message = partitions.get(partition as usize).and_then(|held| held.get(seq));
            match message.and_then(|message| message.msg_id.as_ref()) {
                Some(own) if **own == *id => own.clone(),
                _ => id,
            }
        };
        Stream {
            id: stream.id,
            name: stream.name,
            config: stream.config.into(),
            created_at: stream.created_at.into(),
            next_stream_seq: stream.next_stream_seq,
            n_messages: stream.n_messages,
            n_bytes: stream.n_bytes,
            subjects: stream.subjects.into_iter().map(|(subject, state)| (subject, state.into())).collect(),
            // Hashed with the key of the cell being restored, which its host keys it with next (see
            // `Cell::restore_keyed`): a million ids are not hashed twice.
            dedup: DedupIndex::from_entries(
                crate::dedup::restoring_key(),
                stream.dedup.into_iter().map(|(id, entry)| (shared(id, entry.partition, entry.seq), entry.into())),
            ),
            dedup_expiry: stream
                .dedup_expiry
                .into_iter()
                .map(|(end, id, partition, seq)| (end.into(), shared(id, partition, seq), partition, seq))
                .collect(),
            ttl_index: stream
                .ttl_index
                .into_iter()
                .map(|(expiry, partition, seq)| (expiry.into(), partition, seq))
                .collect(),
            ttl_held: stream.ttl_held,
            bucket: stream.bucket.map(TokenBucket::from),
            consumers: stream.consumers.into_iter().map(|(name, consumer)| (name, consumer.into())).collect(),
            next_consumer_id: stream.next_consumer_id,
            peers: stream.peers,
            pins: stream.pins,
            sweep_at: stream.sweep_at.map(Millis::from),
            partitions,
        }
    }
}

impl Stream {
    pub fn new(id: u64, name: Arc<str>, config: StreamConfig, at: Millis, id_key: IdKey) -> Self {
        let partitions = (0..config.partitions).map(|_| Partition::new()).collect();
        let bucket = config.rate_limit.map(|rate| TokenBucket::full(rate, at));
        Stream {
            id,
            name,
            config,
            created_at: at,
            partitions,
            next_stream_seq: 1,
            n_messages: 0,
            n_bytes: 0,
            subjects: BTreeMap::new(),
            dedup: DedupIndex::new(id_key),
            dedup_expiry: VecDeque::new(),
            ttl_index: BTreeSet::new(),
            ttl_held: BTreeSet::new(),
            bucket,
            consumers: BTreeMap::new(),
            next_consumer_id: 1,
            peers: BTreeMap::new(),
            pins: BTreeMap::new(),
            sweep_at: None,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    /// Its subject index.
    pub(crate) fn subjects(&self) -> &BTreeMap<Arc<str>, SubjectState> {
        &self.subjects
    }

    /// The stored bodies of its messages, partition by partition in sequence order (recalled messages have none).
    pub fn bodies(&self) -> impl Iterator<Item = BodyRef> + '_ {
        self.partitions
            .iter()
            .flat_map(|partition| partition.slots.iter().flatten())
            .filter(|message| message.recalled_at().is_none())
            .map(|message| message.body)
    }

    /// Its config, watermarks and sizes.
    pub fn info(&self) -> StreamInfo {
        StreamInfo {
            name: self.name.clone(),
            config: self.config.clone(),
            created_at: self.created_at,
            n_messages: self.n_messages,
            n_bytes: self.n_bytes,
            n_subjects: self.subjects.len() as u64,
            n_dedup_ids: self.dedup.len() as u64,
            partitions: self
                .partitions
                .iter()
                .enumerate()
                .map(|(index, partition)| PartitionInfo {
                    partition: index as u32,
                    low_watermark: partition.first_seq,
                    high_watermark: partition.last_seq(),
                    n_messages: partition.n_messages,
                    n_bytes: partition.n_bytes,
                })
                .collect(),
            consumers: self.consumers.keys().cloned().collect(),
            peers: self
                .peers
                .iter()
                .map(|(name, received)| PeerInfo { name: name.clone(), received: received.clone() })
                .collect(),
        }
    }

    /// Replaces the limits of the config, keeping the token bucket's level when the rate limit stays.
    /// Replaces the config. Tokens earned before the change are earned at the old rate (and capped by the new
    /// burst); message ids already remembered get the new duplicate window, counted from when they were stored.
    pub fn set_config(&mut self, config: StreamConfig, at: Millis) {
        self.bucket = match (self.config.rate_limit, config.rate_limit, self.bucket.take()) {
            (Some(old_rate), Some(new_rate), Some(mut bucket)) => {
                bucket.refill(old_rate, at);
                bucket.millitokens = bucket.millitokens.min(u64::from(new_rate.burst) * 1000);
                Some(bucket)
            }
            (_, Some(new_rate), _) => Some(TokenBucket::full(new_rate, at)),
            (_, None, _) => None,
        };
        let (old_window, new_window) = (self.config.duplicate_window_ms, config.duplicate_window_ms);
        if old_window != new_window {
            // Every window end moves by the same amount, so the queue stays in time order.
            for (due, ..) in &mut self.dedup_expiry {
                *due = Millis(due.0.saturating_sub(old_window).saturating_add(new_window));
            }
        }
        self.config = config;
    }

    pub fn partition_of(&self, subject: &str, key: Option<&Bytes>) -> u32 {
        if self.config.partitions == 1 {
            return 0;
        }
        let key = key.map_or(subject.as_bytes(), |key| key.as_ref());
        crate::subject::partition_for_key(key, self.config.partitions)
    }

    pub fn message(&self, partition: u32, seq: u64) -> Option<&Message> {
        self.partitions.get(partition as usize)?.get(seq)
    }

    pub fn record(&self, partition: u32, seq: u64) -> Option<Record> {
        self.message(partition, seq).map(|message| message.record(partition, seq))
    }

    /// The earlier publish with this message id, if it is remembered.
    pub fn duplicate_of(&self, msg_id: &str) -> Option<PublishAck> {
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::DedupIgnored) {
            return None;
        }
        let entry = self.dedup.get(msg_id)?;
        Some(PublishAck {
            stream: self.name.clone(),
            partition: entry.partition,
            seq: entry.seq,
            duplicate: true,
            original: self.record(entry.partition, entry.seq).map(Box::new),
        })
    }

    /// Whether a publish with this message id is remembered.
    pub fn remembers(&self, msg_id: &str) -> bool {
        self.dedup.contains_key(msg_id)
    }

    /// How many message ids are within their dedup window (an id stays remembered after its window while its
    /// message is retained, at the cost of the message itself).
    pub fn n_window_ids(&self) -> usize {
        self.dedup_expiry.len()
    }

    /// Hashes the message-id index with `key` (see [`IdKey`]).
    pub fn key_ids(&mut self, key: IdKey) {
        self.dedup.rekey(key);
    }

    /// Forgets every remembered message id (a planted bug's snapshot).
    #[cfg(madsim)]
    pub fn forget_dedup(&mut self) {
        self.dedup.clear();
        self.dedup_expiry.clear();
    }

    /// The newest retained message on `subject`.
    pub fn last_on_subject(&self, subject: &str) -> Option<(u32, u64)> {
        self.subjects.get(subject).and_then(|state| state.order.back()).copied()
    }

    /// The sequence of the newest retained message on `subject` (0 when none).
    pub fn last_subject_seq(&self, subject: &str) -> u64 {
        self.last_on_subject(subject).map_or(0, |(_, seq)| seq)
    }

    /// Takes one publish token, or says how long to wait.
    pub fn take_token(&mut self, at: Millis) -> Result<(), Rejection> {
        match (self.config.rate_limit, self.bucket.as_mut()) {
            (Some(rate), Some(bucket)) => {
                bucket.take(rate, at).map_err(|retry_after_ms| Rejection::RateLimited { retry_after_ms })
            }
            _ => Ok(()),
        }
    }

    /// The first registered peer that has not received `(partition, seq)`, with what it has received.
    pub fn lagging_peer(&self, partition: u32, seq: u64) -> Option<(&str, u64)> {
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::RetentionIgnoresPeerWatermark) {
            return None;
        }
        self.peers.iter().find_map(|(peer, received)| {
            let received = received[partition as usize];
            (received < seq).then_some((peer.as_str(), received))
        })
    }

    /// Whether a pinning message elsewhere references `(partition, seq)`.
    pub fn is_pinned(&self, partition: u32, seq: u64) -> bool {
        self.pins.contains_key(&(partition, seq))
    }

    /// Whether retention must keep `(partition, seq)` for now: a registered peer lacks it, or it is pinned.
    pub fn held(&self, partition: u32, seq: u64) -> bool {
        self.lagging_peer(partition, seq).is_some() || self.is_pinned(partition, seq)
    }

    /// Registers `peer` as having received nothing yet; a registered peer stays as it is. Returns false, changing
    /// nothing, when `max` other peers are registered already.
    pub fn register_peer(&mut self, peer: String, max: usize) -> bool {
        if self.peers.contains_key(&peer) {
            return true;
        }
        if self.peers.len() >= max {
            return false;
        }
        self.peers.insert(peer, vec![0; self.partitions.len()]);
        true
    }

    /// Records that `peer` has received `partition` up to `received_seq`. Reports may arrive out of order, so the
    /// watermark only moves forward; returns the previous one when it moved.
    pub fn peer_progress(&mut self, peer: &str, partition: u32, received_seq: u64) -> Result<Option<u64>, Rejection> {
        let received = self
            .peers
            .get_mut(peer)
            .ok_or_else(|| Rejection::PeerNotFound { stream: self.name.to_string(), peer: peer.to_string() })?;
        let previous = received[partition as usize];
        #[cfg(madsim)]
        let received_seq = if cellog_planted::active(cellog_planted::Mutant::PeerProgressOverstated) {
            (received_seq + 1).min(self.partitions[partition as usize].last_seq())
        } else {
            received_seq
        };
        if received_seq > previous {
            received[partition as usize] = received_seq;
            return Ok(Some(previous));
        }
        Ok(None)
    }

    /// Forgets a registered peer. Returns whether it was registered.
    pub fn unregister_peer(&mut self, peer: &str) -> bool {
        self.peers.remove(peer).is_some()
    }

    /// Adds one pin to `(partition, seq)`.
    pub fn pin(&mut self, partition: u32, seq: u64) {
        *self.pins.entry((partition, seq)).or_insert(0) += 1;
    }

    /// Takes one pin off `(partition, seq)`, if it has any. Returns whether that was its last.
    pub fn unpin(&mut self, partition: u32, seq: u64) -> bool {
        let Some(count) = self.pins.get_mut(&(partition, seq)) else { return false };
        *count -= 1;
        if *count == 0 {
            self.pins.remove(&(partition, seq));
            return true;
        }
        false
    }

    /// How many messages it retains.
    pub fn n_messages(&self) -> u64 {
        self.n_messages
    }

    /// The accounted bytes of the messages it retains.
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }

    /// The first pinned message, in (partition, seq) order.
    pub fn first_pinned(&self) -> Option<(u32, u64)> {
        self.pins.keys().next().copied()
    }

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

    /// Appends a message and indexes it. The caller has made room, checked everything and stored the body.
    #[inline]
    pub fn append(&mut self, message: Append<'_>, at: Millis, effects: &mut Effects) -> u64 {
        let Append { partition, subject, body, key, msg_id, headers, ttl_ms, deliver_after_ms } = message;
        let (n_messages, n_bytes) = (self.n_messages, self.n_bytes);
        let size = Message::accounted_size(subject, key.as_ref(), &headers, body.len as usize);
        let seq = self.partitions[partition as usize].next_seq();
        // One lookup both interns the subject and counts the message against it.
        let subject: Arc<str> = match self.subjects.get_mut(subject) {
            Some(state) => {
                state.n_messages += 1;
                state.n_bytes += size;
                state.order.push_back((partition, seq));
                state.name.clone()
            }
            None => {
                let name: Arc<str> = Arc::from(subject);
                let order = VecDeque::from([(partition, seq)]);
                let state = SubjectState { name: name.clone(), n_messages: 1, n_bytes: size, order };
                self.subjects.insert(name.clone(), state);
                name
            }
        };
        let msg_id: Option<Arc<str>> = msg_id.map(Arc::from);
        let expires_at = ttl_ms.map(|ttl| at.plus(ttl));
        let deliver_at = deliver_after_ms.filter(|delay| *delay > 0).map(|delay| at.plus(delay));
        let extras =
            (key.is_some() || !headers.is_empty() || expires_at.is_some() || deliver_at.is_some()).then(|| {
                self.partitions[partition as usize]
                    .extras_like(key.as_ref(), &headers, expires_at, deliver_at)
                    .unwrap_or_else(|| {
                        Arc::new(Extras { key, headers: headers.into(), expires_at, deliver_at, recalled_at: None })
                    })
            });
        let message =
            Message { stream_seq: self.next_stream_seq, subject, msg_id: msg_id.clone(), body, stored_at: at, extras };
        debug_assert_eq!(message.size(), size);
        self.next_stream_seq += 1;
        self.n_messages += 1;
        self.n_bytes += size;
        let pushed = self.partitions[partition as usize].push(message);
        debug_assert_eq!(pushed, seq);
        if let Some(msg_id) = msg_id {
            let window_open = self.config.duplicate_window_ms > 0;
            if window_open {
                self.dedup_expiry.push_back((at.plus(self.config.duplicate_window_ms), msg_id.clone(), partition, seq));
            }
            self.dedup.insert(msg_id, DedupEntry { partition, seq, window_open });
        }
        if let Some(expires_at) = expires_at {
            self.ttl_index.insert((expires_at, partition, seq));
        }
        effects.appended(&self.name, partition, seq);
        // Paired with the counts before: one more message, exactly its size more bytes, and its partition agrees.
        debug_assert_eq!((self.n_messages, self.n_bytes), (n_messages + 1, n_bytes + size));
        debug_assert_eq!(self.partitions[partition as usize].last_seq(), seq);
        seq
    }

    /// Moves a partition's next sequence on to `next` (see [`Partition::skip_to`]): a message copied at its position
    /// from another cell follows the holes that cell left.
    pub(crate) fn skip_to(&mut self, partition: u32, next: u64) {
        self.partitions[partition as usize].skip_to(next);
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

    /// Replaces a message's payload with a tombstone; its id stays remembered so a retry does not republish it.
    pub fn recall(&mut self, partition: u32, seq: u64, at: Millis, effects: &mut Effects) -> Result<bool, Rejection> {
        let not_found = || Rejection::MessageNotFound { stream: self.name.to_string(), partition, seq };
        if self.is_pinned(partition, seq) {
            return Err(Rejection::Pinned { stream: self.name.to_string(), partition, seq });
        }
        let partition_state = self.partitions.get_mut(partition as usize).ok_or_else(not_found)?;
        let message = partition_state.get_mut(seq).ok_or_else(not_found)?;
        if message.recalled_at().is_some() {
            return Ok(false);
        }
        let freed = u64::from(message.body.len);
        effects.work(BodyOp::BodyReleased { key: message.body.key });
        message.body = BodyRef::of(message.body.key, &[]);
        Arc::make_mut(message.extras.get_or_insert_default()).recalled_at = Some(at);
        let subject = message.subject.clone();
        partition_state.n_bytes -= freed;
        self.n_bytes -= freed;
        if let Some(state) = self.subjects.get_mut(&*subject) {
            state.n_bytes -= freed;
        }
        Ok(true)
    }

    /// Whether a message has served its purpose under interest and work-queue retention: at least one consumer's
    /// filter matches it, and every consumer it matches is done with it. A message no consumer wants (yet) waits.
    pub fn all_consumers_done(&self, partition: u32, seq: u64, subject: &str) -> bool {
        let mut interested = self.consumers.values().filter(|c| c.matches(subject)).peekable();
        interested.peek().is_some() && interested.all(|c| c.is_done(partition, seq))
    }

    /// The named consumer, or `ConsumerNotFound`.
    pub fn consumer(&self, name: &str) -> Result<&Consumer, Rejection> {
        self.consumers.get(name).ok_or_else(|| consumer_not_found(&self.name, name))
    }

    /// The named consumer, or `ConsumerNotFound`.
    pub fn consumer_mut(&mut self, name: &str) -> Result<&mut Consumer, Rejection> {
        self.consumers.get_mut(name).ok_or_else(|| consumer_not_found(&self.name, name))
    }

    /// The consumer with this id, if it still exists.
    pub fn consumer_by_id(&self, id: u64) -> Option<&Consumer> {
        self.consumers.values().find(|c| c.id() == id)
    }

    pub fn consumer_by_id_mut(&mut self, id: u64) -> Option<&mut Consumer> {
        self.consumers.values_mut().find(|c| c.id() == id)
    }

    /// Its consumers, in name order.
    pub fn consumers(&self) -> impl Iterator<Item = &Consumer> {
        self.consumers.values()
    }

    pub fn n_consumers(&self) -> usize {
        self.consumers.len()
    }

    /// Adds a consumer whose cursors start where its deliver policy says. Interest retention may then take what it
    /// starts past.
    pub fn add_consumer(&mut self, name: Arc<str>, config: ConsumerConfig, at: Millis, effects: &mut Effects) {
        let cursors = self
            .partitions
            .iter()
            .map(|log| match config.deliver_policy {
                DeliverPolicy::All => log.first_seq,
                DeliverPolicy::New => log.next_seq(),
                DeliverPolicy::FromSequence(seq) => seq.max(log.first_seq),
                DeliverPolicy::FromTime(time) => log.first_seq_at_or_after(time),
            })
            .collect();
        let id = self.next_consumer_id;
        self.next_consumer_id += 1;
        self.consumers.insert(name.clone(), Consumer::new(id, name, config, cursors, at));
        self.sweep_all_interest(effects);
    }

    /// Removes a consumer, and lets interest retention take what only it still needed. Returns whether it existed.
    pub fn remove_consumer(&mut self, name: &str, effects: &mut Effects) -> bool {
        if self.consumers.remove(name).is_none() {
            return false;
        }
        self.sweep_all_interest(effects);
        true
    }

    /// Drops every consumer (a planted bug's snapshot install).
    #[cfg(madsim)]
    pub fn forget_consumers(&mut self) {
        self.consumers.clear();
    }

    /// Fetches for `member` of the named consumer (see [`Consumer::fetch`]): the consumer's id, the deliveries and
    /// the timers to set.
    pub fn fetch(
        &mut self,
        consumer: &str,
        member: &Arc<str>,
        max: u32,
        at: Millis,
        only: Option<&BTreeSet<u32>>,
        per_subject: Option<u32>,
    ) -> Result<(u64, Vec<Delivery>, Vec<DeliveryTimer>), Rejection> {
        let c = self.consumers.get_mut(consumer).ok_or_else(|| consumer_not_found(&self.name, consumer))?;
        let (deliveries, timers) = c.fetch(&self.partitions, member, max, at, only, per_subject);
        Ok((c.id(), deliveries, timers))
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

fn consumer_not_found(stream: &str, consumer: &str) -> Rejection {
    Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: consumer.to_string() }
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
