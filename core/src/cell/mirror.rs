//! Mirrors of other cells' streams, and the recall logs this cell's streams keep for their mirrors elsewhere (see
//! [`crate::mirror`]).

use std::sync::Arc;

use super::limits::{MAX_READ, invalid};
use super::{Cell, stream_in};
use crate::command::IngestMessage;
use crate::config::StreamConfig;
use crate::error::Rejection;
use crate::mirror::{LoggedRecall, MAX_PENDING_RECALLS, MAX_RECALLS_READ, Mirror, MirrorSource, RecallLog};
use crate::outcome::{Outcome, Record};
use crate::time::Millis;

impl Cell {
    pub(super) fn create_mirror(
        &mut self,
        at: Millis,
        name: String,
        config: StreamConfig,
        source: MirrorSource,
    ) -> Result<Outcome, Rejection> {
        if let Some(mirror) = self.mirroring.mirrors.get_mut(name.as_str()) {
            let same = mirror.source.cell == source.cell && mirror.source.stream == source.stream;
            if !same || self.streams.get(name.as_str()).is_none_or(|s| *s.config() != config) {
                return Err(Rejection::Conflict { what: "mirror".to_string(), name });
            }
            // The same mirror again: its source's nodes may have moved.
            mirror.source.addresses = source.addresses;
            return Ok(Outcome::StreamCreated { created: false });
        }
        if self.streams.contains_key(name.as_str()) {
            return Err(Rejection::Conflict { what: "stream".to_string(), name });
        }
        let created = self.create_stream(at, name.clone(), config)?;
        let name = self.streams.get_key_value(name.as_str()).expect("created above").0.clone();
        self.mirroring.mirrors.insert(name, Mirror { source, recalls_applied: 0 });
        Ok(created)
    }

    pub(super) fn mirror_ingest(
        &mut self,
        at: Millis,
        name: &str,
        messages: Vec<IngestMessage>,
        through: &[u64],
        recalls: &[LoggedRecall],
        recalls_through: u64,
    ) -> Result<Outcome, Rejection> {
        let applied = match self.mirroring.mirrors.get(name) {
            Some(mirror) => mirror.recalls_applied,
            None if self.streams.contains_key(name) => {
                return Err(invalid(format!("stream {name:?} is not a mirror; a mirror's copy goes only to a mirror")));
            }
            None => return Err(Rejection::StreamNotFound { stream: name.to_string() }),
        };
        let n = self.stream(name)?.partitions().len();
        let mut previous: Option<u64> = None;
        for recall in recalls {
            if recall.partition as usize >= n {
                return Err(invalid(format!(
                    "stream {name:?} has {n} partitions; a recall names partition {}",
                    recall.partition
                )));
            }
            if previous.is_some_and(|number| recall.number <= number) || recall.number >= recalls_through {
                return Err(invalid(format!(
                    "recalls come in rising numbers below recalls_through ({recalls_through}); {} does not",
                    recall.number
                )));
            }
            previous = Some(recall.number);
        }
        // The messages are checked whole before anything changes; recalls cannot fail once checked. Both were read
        // from the source at one moment, where a message recalled before it was read is a hole: copied first or
        // recalled first, the mirror ends the same.
        let outcome = self.ingest(at, name, messages, through)?;
        for recall in recalls.iter().filter(|recall| recall.number >= applied) {
            // A message this mirror does not hold (not copied yet, or removed here) has nothing to recall; one a
            // message of this cell pins stays, as on any stream.
            let _ = self.recall_logged(at, name, recall.partition, recall.seq, false);
        }
        let mirror = self.mirroring.mirrors.get_mut(name).expect("checked above");
        mirror.recalls_applied = mirror.recalls_applied.max(recalls_through);
        // A recall leaves a tombstone in its place: each partition ends where the copy left it.
        Ok(outcome)
    }

    /// Recalls a message and logs the recall for the stream's mirrors, if it has any. With `bounded`, a recall is
    /// refused while the log holds [`MAX_PENDING_RECALLS`] (a client's recall); a mirror's copy of its source's
    /// recall is never refused for it.
    pub(super) fn recall_logged(
        &mut self,
        at: Millis,
        stream: &str,
        partition: u32,
        seq: u64,
        bounded: bool,
    ) -> Result<Outcome, Rejection> {
        let s = stream_in(&mut self.streams, stream)?;
        let log = self.mirroring.recalls.get_mut(stream).filter(|log| !log.mirrors.is_empty());
        if bounded
            && let Some(log) = &log
            && log.pending.len() >= MAX_PENDING_RECALLS
        {
            let (peer, _) = log.most_behind().expect("a log with mirrors");
            return Err(Rejection::RecallsPending {
                stream: stream.to_string(),
                peer: peer.to_string(),
                pending: log.pending.len() as u64,
            });
        }
        if s.recall(partition, seq, at, &mut self.effects)? {
            self.effects.recalled(s.name(), partition, seq);
            if let Some(log) = log {
                log.pending.push_back(LoggedRecall { number: log.next, partition, seq });
                log.next += 1;
            }
        }
        Ok(Outcome::Recalled)
    }

    pub(super) fn register_mirror(&mut self, stream: &str, peer: String) -> Result<Outcome, Rejection> {
        let name = self.stream(stream)?.name().clone();
        let outcome = self.register_peer(stream, peer.clone())?;
        let log = self.mirroring.recalls.entry(name).or_default();
        let next = log.next;
        // Registered again (a new leader of the mirror's cell), it keeps what it had applied.
        log.mirrors.entry(Arc::from(peer)).or_insert(next);
        Ok(outcome)
    }

    pub(super) fn mirror_progress(
        &mut self,
        at: Millis,
        stream: &str,
        peer: &str,
        received: &[u64],
        recalls_applied: u64,
    ) -> Result<Outcome, Rejection> {
        let s = self.stream(stream)?;
        let not_registered = || Rejection::PeerNotFound { stream: stream.to_string(), peer: peer.to_string() };
        let log = self.mirroring.recalls.get(stream).ok_or_else(not_registered)?;
        log.mirrors.get(peer).ok_or_else(not_registered)?;
        if received.len() != s.partitions().len() {
            return Err(invalid(format!(
                "a mirror's progress names every partition: {} are given, stream {stream:?} has {}",
                received.len(),
                s.partitions().len()
            )));
        }
        for (p, (&seq, partition)) in received.iter().zip(s.partitions()).enumerate() {
            if seq > partition.last_seq() {
                return Err(invalid(format!(
                    "peer cannot have received sequence {seq}; partition {p} ends at {}",
                    partition.last_seq()
                )));
            }
        }
        if recalls_applied > log.next {
            return Err(invalid(format!(
                "a mirror cannot have applied {recalls_applied} recalls; stream {stream:?} logged {}",
                log.next
            )));
        }
        for (p, &seq) in received.iter().enumerate() {
            self.peer_progress(at, stream, peer, p as u32, seq)?;
        }
        let log = self.mirroring.recalls.get_mut(stream).expect("checked above");
        let applied = log.mirrors.get_mut(peer).expect("checked above");
        *applied = (*applied).max(recalls_applied);
        log.prune();
        Ok(Outcome::PeerProgressed)
    }

    /// Forgets a peer's recall watermark (it was unregistered) and the recalls only it lacked.
    pub(super) fn forget_mirror_peer(&mut self, stream: &str, peer: &str) {
        if let Some(log) = self.mirroring.recalls.get_mut(stream) {
            log.mirrors.remove(peer);
            log.prune();
            if log.mirrors.is_empty() {
                self.mirroring.recalls.remove(stream);
            }
        }
    }

    /// Forgets a deleted stream's mirror record and recall log.
    pub(super) fn forget_mirroring_of(&mut self, stream: &str) {
        self.mirroring.mirrors.remove(stream);
        self.mirroring.recalls.remove(stream);
    }

    /// The mirror of that name, if this cell has one.
    pub fn mirror(&self, name: &str) -> Option<&Mirror> {
        self.mirroring.mirrors.get(name)
    }

    /// This cell's mirrors, by name.
    pub fn mirrors(&self) -> impl Iterator<Item = (&Arc<str>, &Mirror)> {
        self.mirroring.mirrors.iter()
    }

    /// A stream's recall log, if other cells mirror it.
    pub fn recall_log(&self, stream: &str) -> Option<&RecallLog> {
        self.mirroring.recalls.get(stream)
    }
}

/// What one read of a mirror's source answers ([`Cell::mirror_read`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorRead {
    /// The messages read, each partition's in rising sequence (recalled ones are left out: holes to the mirror).
    pub records: Vec<Record>,
    /// Per partition, the sequence through which the read is whole: every position up to it that holds no record
    /// here holds no message on the source either.
    pub scanned: Vec<u64>,
    /// Per partition, the source's last sequence.
    pub last_seqs: Vec<u64>,
    /// The logged recalls from the number asked for on.
    pub recalls: Vec<LoggedRecall>,
    /// The number the next read of recalls starts from.
    pub recalls_next: u64,
}

impl Cell {
    /// One read of `stream` for its mirror `peer`: each partition from `from` on (one sequence per partition), at
    /// most `max` messages in all and no more than `max_bytes` of them after the first, shared between the
    /// partitions so none waits behind a busy one; and the recalls logged for its mirrors from number `recalls_from`
    /// on. Refused unless `peer` is registered as a mirror of the stream (so that every recall since is logged).
    pub fn mirror_read(
        &self,
        stream: &str,
        peer: &str,
        from: &[u64],
        max: usize,
        max_bytes: u64,
        recalls_from: u64,
    ) -> Result<MirrorRead, Rejection> {
        let s = self.stream(stream)?;
        let log = self
            .mirroring
            .recalls
            .get(stream)
            .filter(|log| log.mirrors.contains_key(peer))
            .ok_or_else(|| Rejection::PeerNotFound { stream: stream.to_string(), peer: peer.to_string() })?;
        let partitions = s.partitions();
        if from.len() != partitions.len() {
            return Err(invalid(format!(
                "stream {stream:?} has {} partitions; the mirror reads {}",
                partitions.len(),
                from.len()
            )));
        }
        let share = (max.min(MAX_READ) / partitions.len()).max(1);
        let (mut records, mut scanned, mut bytes) = (Vec::new(), Vec::with_capacity(from.len()), 0u64);
        for (p, (log, &from)) in partitions.iter().zip(from).enumerate() {
            let start = from.max(1);
            let mut through = log.last_seq();
            let mut taken = 0;
            for seq in start.max(log.first_seq)..log.next_seq() {
                let Some(message) = log.get(seq) else { continue };
                if message.recalled_at().is_some() {
                    continue;
                }
                let record = message.record(p as u32, seq);
                if taken == share || (!records.is_empty() && bytes + record.size() > max_bytes) {
                    through = seq - 1;
                    break;
                }
                bytes += record.size();
                taken += 1;
                records.push(record);
            }
            scanned.push(through.max(start - 1));
        }
        let recalls = log.since(recalls_from, MAX_RECALLS_READ);
        let recalls_next = match recalls.last() {
            Some(last) if recalls.len() == MAX_RECALLS_READ => last.number + 1,
            _ => log.next.max(recalls_from),
        };
        let last_seqs = partitions.iter().map(|p| p.last_seq()).collect();
        Ok(MirrorRead { records, scanned, last_seqs, recalls, recalls_next })
    }
}
