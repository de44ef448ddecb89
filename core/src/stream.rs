//! A stream: its partitions ([`crate::partition`]), its subject and dedup indexes ([`crate::index`]), TTLs, its rate
//! limit ([`crate::bucket`]), registered peers and pins, appends and consumers. The retention decisions that remove
//! messages are in [`retention`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use crate::body::BodyRef;
use crate::bucket::TokenBucket;
use crate::command::Headers;
use crate::config::{ConsumerConfig, DeliverPolicy, StreamConfig};
use crate::consumer::{Consumer, DeliveryTimer};
use crate::dedup::{DedupIndex, IdKey};
use crate::effect::{BodyOp, Effects};
use crate::error::Rejection;
use crate::index::{DedupEntry, SubjectState};
use crate::info::{PartitionInfo, PeerInfo, StreamInfo};
use crate::outcome::{Delivery, PublishAck, Record};
use crate::partition::{Extras, Message, Partition};
use crate::snapshot::v3;
use crate::time::Millis;

mod retention;

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
}

fn consumer_not_found(stream: &str, consumer: &str) -> Rejection {
    Rejection::ConsumerNotFound { stream: stream.to_string(), consumer: consumer.to_string() }
}
