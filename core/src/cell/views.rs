//! What hosts read: watermarks, positions, lag, outstanding deliveries and stored records, by reference.

use std::sync::Arc;

use super::Cell;
use super::limits::{MAX_READ, MAX_RESPONSE_BYTES, invalid};
use super::transaction::TransactionState;
use crate::auth::{Access, Actor, Grants};
use crate::consumer::Work;
use crate::error::Rejection;
use crate::info::{ConsumerInfo, DeliveryInfo, ProducerInfo, StreamInfo};
use crate::outcome::Record;
use crate::snapshot::{StateDigest, digest_of};
use crate::time::Millis;

impl Cell {
    /// The digest of each part of the state, named: `cell` (time, counters, timers, pins), `producers`, `principals`, and per
    /// stream `stream NAME` (all of it), `stream NAME partition P` and `stream NAME consumer C`. Two replicas whose
    /// digests differ differ in the parts whose digests differ: a report can say which stream, partition or consumer
    /// it is, not only that the states differ.
    pub fn digest_parts(&self) -> Vec<(String, StateDigest)> {
        let counters = (self.last_at, self.n_applied, self.next_stream_id, self.next_producer_id, self.next_body);
        let mut parts = vec![
            ("cell".to_string(), digest_of(&(counters, &self.timers, &self.pinned_by, &self.stream_names))),
            ("producers".to_string(), digest_of(&(&self.producers, &self.transactional_ids))),
            ("principals".to_string(), digest_of(&self.auth)),
            ("directory".to_string(), digest_of(&self.directory)),
            ("ownership".to_string(), digest_of(&self.ownership)),
            ("mirroring".to_string(), digest_of(&self.mirroring)),
            ("quotas".to_string(), digest_of(&self.quotas)),
        ];
        for (name, stream) in &self.streams {
            parts.push((format!("stream {name}"), digest_of(stream)));
            for (index, partition) in stream.partitions().iter().enumerate() {
                parts.push((format!("stream {name} partition {index}"), digest_of(partition)));
            }
            for consumer in stream.consumers() {
                parts.push((format!("stream {name} consumer {}", consumer.name()), digest_of(consumer)));
            }
            for ((_, group), state) in
                self.groups.range((name.clone(), Arc::from(""))..).take_while(|((s, _), _)| s == name)
            {
                parts.push((format!("stream {name} group {group}"), digest_of(state)));
            }
        }
        parts
    }

    /// The time of the last applied command.
    pub fn last_at(&self) -> Millis {
        self.last_at
    }

    /// How many commands have been applied (accepted or refused).
    pub fn n_applied(&self) -> u64 {
        self.n_applied
    }

    /// When the next timer is due; the leader proposes a `Tick` once its clock passes it.
    pub fn next_deadline(&self) -> Option<Millis> {
        let timer = self.timers.first_due();
        let expiry = Some(self.producers_expire_from.0).filter(|&at| at < Millis::MAX);
        let session = Some(self.members_expire_from.0).filter(|&at| at < Millis::MAX);
        timer.into_iter().chain(expiry).chain(session).min()
    }

    /// Names of all streams, in order.
    pub fn stream_names(&self) -> Vec<Arc<str>> {
        self.streams.keys().cloned().collect()
    }

    /// A stream's config, watermarks and sizes.
    pub fn stream_info(&self, name: &str) -> Result<StreamInfo, Rejection> {
        Ok(self.stream(name)?.info())
    }

    /// A consumer's positions, lag and oldest unacknowledged age as of `now`.
    pub fn consumer_info(&self, stream: &str, consumer: &str, now: Millis) -> Result<ConsumerInfo, Rejection> {
        let stream = self.stream(stream)?;
        Ok(stream.consumer(consumer)?.info(stream.partitions(), now))
    }

    /// What a fetch from the consumer would do now (see [`Work`]), and how many of its deliveries await an ack;
    /// read-only and cheap (unlike [`Cell::consumer_info`], which scans for the oldest unacknowledged message), for
    /// a subscription to ask after every applied batch before it proposes a fetch.
    pub fn consumer_work(&self, stream: &str, consumer: &str) -> Result<(Work, u32), Rejection> {
        let (room, per_subject) = self.in_flight_caps(stream);
        let stream = self.stream(stream)?;
        let consumer = stream.consumer(consumer)?;
        let work = if room == 0 {
            Work::None
        } else {
            consumer.work(stream.partitions(), stream.subjects(), None, per_subject)
        };
        Ok((work, consumer.n_pending()))
    }

    /// A consumer's outstanding deliveries, in (partition, sequence) order, at most `max`.
    pub fn deliveries(&self, stream: &str, consumer: &str, max: usize) -> Result<Vec<DeliveryInfo>, Rejection> {
        Ok(self.stream(stream)?.consumer(consumer)?.deliveries(max.min(MAX_READ)))
    }

    /// One retained message (a recalled one reads as its tombstone).
    pub fn read(&self, stream: &str, partition: u32, seq: u64) -> Result<Record, Rejection> {
        let s = self.stream(stream)?;
        s.record(partition, seq).ok_or_else(|| Rejection::MessageNotFound {
            stream: stream.to_string(),
            partition,
            seq,
        })
    }

    /// Up to `max` retained messages of a partition from sequence `from` on, skipping removed ones, and no more than
    /// [`MAX_RESPONSE_BYTES`] of them after the first: a reader continues from the last sequence it got.
    pub fn read_from(&self, stream: &str, partition: u32, from: u64, max: usize) -> Result<Vec<Record>, Rejection> {
        let s = self.stream(stream)?;
        let log = s
            .partitions()
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?;
        let mut records = Vec::new();
        let mut bytes = 0u64;
        for record in (from.max(log.first_seq)..log.next_seq())
            .filter_map(|seq| log.get(seq).map(|message| message.record(partition, seq)))
            .take(max.min(MAX_READ))
        {
            bytes += record.size();
            if !records.is_empty() && bytes > MAX_RESPONSE_BYTES {
                break;
            }
            records.push(record);
        }
        Ok(records)
    }

    /// The first sequence of a partition stored at or after `time` (one past its last when none is): where a reader
    /// that starts from a time begins, as a consumer delivering from that time would.
    pub fn first_seq_at_or_after(&self, stream: &str, partition: u32, time: Millis) -> Result<u64, Rejection> {
        let s = self.stream(stream)?;
        let log = s
            .partitions()
            .get(partition as usize)
            .ok_or_else(|| invalid(format!("stream {stream:?} has no partition {partition}")))?;
        Ok(log.first_seq_at_or_after(time))
    }

    /// The newest retained message on a subject (for newest-wins, key-value use).
    pub fn last_for_subject(&self, stream: &str, subject: &str) -> Result<Record, Rejection> {
        let s = self.stream(stream)?;
        let not_found = || Rejection::MessageNotFound { stream: stream.to_string(), partition: 0, seq: 0 };
        let (partition, seq) = s.last_on_subject(subject).ok_or_else(not_found)?;
        s.record(partition, seq).ok_or_else(not_found)
    }

    /// The principals, their tokens and grants, and the revoked certificates: what a node's doors copy to check
    /// credentials without waiting on the replica.
    pub fn auth(&self) -> &crate::auth::Auth {
        &self.auth
    }

    /// The principal an actor is, as a command it sends would be authenticated against this state (a node
    /// authenticates a read with it).
    pub fn authenticate(&self, actor: &Actor) -> Result<Arc<str>, Rejection> {
        self.auth.authenticate(actor)
    }

    /// Refuses `access` unless `principal`'s grants allow it, as a command would be refused (a node authorizes reads
    /// and membership changes with it).
    pub fn authorize(&self, principal: &str, access: &Access<'_>) -> Result<(), Rejection> {
        self.auth.authorize(principal, access)
    }

    /// Authorizes reading a stream: its subject filters must be covered by the principal's subscribe grants.
    pub fn authorize_read(&self, principal: &str, stream: &str) -> Result<(), Rejection> {
        let s = self.stream(stream)?;
        self.auth.authorize(principal, &Access::Read { stream, subjects: &s.config().subjects })
    }

    /// Whether `filter` is reserved for the node (see [`crate::Command::ReserveSubjects`]).
    pub fn is_reserved(&self, filter: &str) -> bool {
        self.auth.is_reserved(filter)
    }

    /// The principals, in name order: each one's grants and how many tokens it holds.
    pub fn principals(&self) -> Vec<(Arc<str>, Grants, usize)> {
        self.auth.principals().iter().map(|(name, p)| (name.clone(), p.grants.clone(), p.tokens.len())).collect()
    }

    /// The streams `principal` may mirror (a mirror grant; a cluster admin may mirror any), if it exists.
    pub fn mirror_grants(&self, principal: &str) -> Option<&std::collections::BTreeSet<String>> {
        self.auth.mirror_grants(principal)
    }

    /// The revoked certificates the cell remembers, by serial.
    pub fn revoked_certificates(&self) -> &std::collections::BTreeMap<Vec<u8>, crate::auth::Revoked> {
        self.auth.revoked()
    }

    /// Whether a certificate with `serial` is revoked (a node asks before it serves a call presenting it).
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.auth.revoked().contains_key(serial)
    }

    /// A transactional producer.
    pub fn producer_info(&self, producer_id: u64) -> Option<ProducerInfo> {
        self.producers.get(&producer_id).map(|p| ProducerInfo {
            producer_id,
            transactional_id: p.transactional_id.clone(),
            epoch: p.epoch,
            open_transaction: p.transaction.as_ref().map(|t| t.staged.len() as u64),
            prepared: p.transaction.as_ref().is_some_and(|t| t.state == TransactionState::Prepared),
        })
    }
}
