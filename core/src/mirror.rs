//! Mirrors: a stream of this cell that follows a stream of another cell.
//!
//! A mirror holds its source's messages at the positions they hold there (partition and sequence, ids kept), in
//! order and without gaps: where the source has a message the mirror has it, where the source has none (recalled,
//! or removed before the mirror read it) the mirror has none. It takes no write of its own
//! ([`Rejection::Mirror`](crate::Rejection::Mirror)); only the copy ([`Command::MirrorIngest`]) adds to it, and only
//! at or past the end of each partition, so what it holds is always a prefix of its source.
//!
//! The follower cell's leader runs the copy (the node's mirror driver): it reads the source from where each partition
//! of the mirror ends, copies what it read, and then reports on the source what the mirror holds
//! ([`Command::MirrorProgress`]). The mirror is registered on the source as a peer ([`Command::RegisterMirror`]), so
//! the source's retention keeps whatever the mirror has not received. Everything the driver needs to resume is in the
//! two cells' states (each partition's end here, the recalls applied here, the peer's watermarks there), so a new
//! leader on either side takes up where the last stopped.
//!
//! Recalls reach mirrors through the source's *recall log*: while a stream has registered mirrors, each recall it
//! applies is logged with a number, and kept until every mirror reports it applied ([`RecallLog`]). A mirror's copy
//! applies the recalls it read before the messages, so a message recalled on the source after the mirror copied it
//! is recalled on the mirror, and one recalled before is copied as a hole. The log is bounded: while
//! [`MAX_PENDING_RECALLS`] wait for a lagging mirror, a further recall is refused
//! ([`Rejection::RecallsPending`](crate::Rejection::RecallsPending)) rather than never reaching it.
//!
//! [`Command::MirrorIngest`]: crate::Command::MirrorIngest
//! [`Command::MirrorProgress`]: crate::Command::MirrorProgress
//! [`Command::RegisterMirror`]: crate::Command::RegisterMirror

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::snapshot::v9;

/// Most recalls a stream keeps for a mirror that has not applied them.
pub const MAX_PENDING_RECALLS: usize = 65_536;
/// Most recalls one read of a mirror's source answers.
pub const MAX_RECALLS_READ: usize = 4_096;

/// Where a mirror's messages come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorSource {
    /// The source's cell.
    pub cell: String,
    /// The stream on that cell.
    pub stream: String,
    /// Client addresses of that cell's nodes.
    pub addresses: Vec<String>,
}

/// A mirror, as its cell records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mirror {
    /// Its source.
    pub source: MirrorSource,
    /// How many of the source's logged recalls it has applied: the next one it reads is this one.
    pub recalls_applied: u64,
}

/// One logged recall: its number in the stream's recall log and the position it recalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedRecall {
    /// Its number: recalls are numbered from 0 in the order the stream applied them.
    pub number: u64,
    /// The partition.
    pub partition: u32,
    /// The sequence.
    pub seq: u64,
}

/// A stream's recalls that its mirrors have not all applied yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecallLog {
    /// The number the next logged recall gets.
    pub next: u64,
    /// The logged recalls some mirror still lacks, oldest first.
    pub pending: VecDeque<LoggedRecall>,
    /// Each registered mirror (a peer of the stream) and how many recalls it has applied.
    pub mirrors: BTreeMap<Arc<str>, u64>,
}

impl RecallLog {
    /// Forgets the recalls every mirror has applied.
    pub(crate) fn prune(&mut self) {
        let applied = self.mirrors.values().copied().min().unwrap_or(self.next);
        while self.pending.front().is_some_and(|recall| recall.number < applied) {
            self.pending.pop_front();
        }
    }

    /// The mirror furthest behind, and how many recalls it has applied.
    pub fn most_behind(&self) -> Option<(&str, u64)> {
        self.mirrors.iter().min_by_key(|(_, applied)| **applied).map(|(name, applied)| (&**name, *applied))
    }

    /// The logged recalls from number `from` on, at most `max`.
    pub fn since(&self, from: u64, max: usize) -> Vec<LoggedRecall> {
        self.pending.iter().filter(|recall| recall.number >= from).take(max).copied().collect()
    }
}

/// The mirrors of this cell and the recall logs of its streams that are mirrored elsewhere.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Mirroring {
    /// This cell's mirror streams by name.
    pub mirrors: BTreeMap<Arc<str>, Mirror>,
    /// The recall log of each stream of this cell that has registered mirrors.
    pub recalls: BTreeMap<Arc<str>, RecallLog>,
}

impl From<v9::Mirroring> for Mirroring {
    fn from(mirroring: v9::Mirroring) -> Self {
        let v9::Mirroring { mirrors, recalls } = mirroring;
        let mirrors = mirrors
            .into_iter()
            .map(|(name, v9::Mirror { source: v9::MirrorSource { cell, stream, addresses }, recalls_applied })| {
                (name, Mirror { source: MirrorSource { cell, stream, addresses }, recalls_applied })
            })
            .collect();
        let recalls = recalls
            .into_iter()
            .map(|(name, v9::RecallLog { next, pending, mirrors })| {
                let pending = pending
                    .into_iter()
                    .map(|v9::LoggedRecall { number, partition, seq }| LoggedRecall { number, partition, seq })
                    .collect();
                (name, RecallLog { next, pending, mirrors })
            })
            .collect();
        Mirroring { mirrors, recalls }
    }
}
