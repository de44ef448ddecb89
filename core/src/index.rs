//! A stream's indexes of its messages: per subject (counts, bytes and order, for per-subject limits, newest-wins and
//! conditional appends) and per message id (for deduplication; the index itself is [`crate::dedup`]).

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;

use crate::snapshot::v3;

/// Per-subject accounting. `order` lists the subject's messages oldest first; entries whose message is gone are
/// dropped lazily, but both ends are always live.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct SubjectState {
    /// The subject, shared by every message on it.
    pub name: Arc<str>,
    pub n_messages: u64,
    pub n_bytes: u64,
    pub order: VecDeque<(u32, u64)>,
}

/// A remembered message id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct DedupEntry {
    pub partition: u32,
    pub seq: u64,
    /// True until the duplicate window passes; after that the entry lives exactly as long as its message.
    pub window_open: bool,
}

impl From<v3::SubjectState> for SubjectState {
    fn from(state: v3::SubjectState) -> Self {
        SubjectState { name: state.name, n_messages: state.n_messages, n_bytes: state.n_bytes, order: state.order }
    }
}

impl From<v3::DedupEntry> for DedupEntry {
    fn from(entry: v3::DedupEntry) -> Self {
        DedupEntry { partition: entry.partition, seq: entry.seq, window_open: entry.window_open }
    }
}
