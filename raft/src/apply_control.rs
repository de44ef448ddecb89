//! The way out of a poisoned entry: an entry whose apply panics panics on every replica, at the same index, since
//! every replica applies the same commands in the same order. Left alone, each node restarts, replays its log, and
//! panics there again. The node's operator has two flags (`cellog node --halt-apply-at` and `--skip-entry`) that
//! this module turns into a decision per entry:
//! - **halt**: apply nothing at or past an index. The node starts, votes, keeps and replicates its log, and serves
//!   what it applied before the index, so that the cell can be inspected and its data read; every write and every
//!   linearizable read is refused with `APPLY_HALTED` naming the index.
//! - **skip**: apply one entry (named by index *and* term, so that a log rewritten since cannot make the flag pass
//!   over another entry) as nothing. Its commands are answered `ENTRY_SKIPPED`, and nothing of them is written. Every
//!   replica must be given the same flag, so that every replica passes over the same entry: a replica that applied it
//!   would hold another state, which the state digests (`cellog status --digest`) show.
//!
//! A panic names the entry it interrupted (index and term), so the operator knows what to give.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::types::LogId;

/// What an operator tells a node about the entries it applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyControl {
    /// Apply nothing at or past this log index.
    pub halt_at: Option<u64>,
    /// Entries applied as nothing, each as (index, term).
    pub skip: BTreeSet<(u64, u64)>,
}

/// What becomes of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Applied as usual.
    Apply,
    /// Passed over: its commands are answered that they were skipped, and nothing of them is written.
    Skip,
    /// Not applied, nor anything after it.
    Halt,
}

impl ApplyControl {
    /// What becomes of the entry `log_id`.
    pub(crate) fn fate(&self, log_id: &LogId) -> Fate {
        if self.halt_at.is_some_and(|halt_at| log_id.index >= halt_at) {
            Fate::Halt
        } else if self.skip.contains(&(log_id.index, log_id.leader_id.term)) {
            Fate::Skip
        } else {
            Fate::Apply
        }
    }

    /// Parses `INDEX:TERM`, as `--skip-entry` takes it.
    pub fn parse_entry(text: &str) -> Result<(u64, u64), String> {
        let (index, term) = text
            .split_once(':')
            .ok_or_else(|| format!("{text:?} is not INDEX:TERM (a panic names both: \"entry 41 (term 3)\")"))?;
        let number = |what: &str, value: &str| {
            value.trim().parse::<u64>().map_err(|_| format!("{what} {value:?} in {text:?} is not a number"))
        };
        Ok((number("index", index)?, number("term", term)?))
    }
}

/// Where this node stopped applying, if it did, shared with the node's doors: read without waiting on applying.
#[derive(Clone, Debug, Default)]
pub struct Halted(Arc<AtomicU64>);

impl Halted {
    /// The index of the first entry the node did not apply, once it halted.
    pub fn at(&self) -> Option<u64> {
        self.0.load(Ordering::Acquire).checked_sub(1)
    }

    pub(crate) fn set(&self, index: u64) {
        // The first index it halted at: later entries are past it anyway.
        let _ = self.0.compare_exchange(0, index.saturating_add(1), Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The entry a panic interrupted while it was applied, so that the node's fatal reason names it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Applying(Arc<std::sync::Mutex<Option<LogId>>>);

impl Applying {
    pub(crate) fn set(&self, log_id: Option<LogId>) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = log_id;
    }

    pub(crate) fn get(&self) -> Option<LogId> {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What an operator reads when applying `log_id` panicked: which entry, and the two ways past it.
pub(crate) fn panicked_at(log_id: &LogId) -> String {
    let (index, term) = (log_id.index, log_id.leader_id.term);
    format!(
        "applying entry {index} (term {term}) panicked; if it panics on every node, restart every node with \
         --halt-apply-at {index} to serve what was applied before it, or with --skip-entry {index}:{term} to pass \
         over it (its commands are answered ENTRY_SKIPPED and nothing of them is written)"
    )
}

#[cfg(test)]
mod tests {
    use openraft::LeaderId;

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(LeaderId::new(term, 1), index)
    }

    #[test]
    fn an_entry_is_halted_at_or_past_the_index_and_skipped_only_at_its_index_and_term() {
        let control = ApplyControl { halt_at: Some(10), skip: BTreeSet::from([(7, 2)]) };
        assert_eq!(control.fate(&log_id(2, 6)), Fate::Apply);
        assert_eq!(control.fate(&log_id(2, 7)), Fate::Skip);
        assert_eq!(control.fate(&log_id(3, 7)), Fate::Apply, "the same index in another term is another entry");
        assert_eq!(control.fate(&log_id(3, 10)), Fate::Halt);
        assert_eq!(control.fate(&log_id(3, 11)), Fate::Halt);
        assert_eq!(ApplyControl::default().fate(&log_id(1, 1)), Fate::Apply);
    }

    #[test]
    fn a_skipped_entry_is_named_by_index_and_term() {
        assert_eq!(ApplyControl::parse_entry("41:3"), Ok((41, 3)));
        assert!(ApplyControl::parse_entry("41").unwrap_err().contains("INDEX:TERM"));
        assert!(ApplyControl::parse_entry("x:3").unwrap_err().contains("index \"x\""));
        assert!(ApplyControl::parse_entry("41:-1").unwrap_err().contains("term"));
    }

    #[test]
    fn a_node_halts_once_at_the_first_index() {
        let halted = Halted::default();
        assert_eq!(halted.at(), None);
        halted.set(5);
        halted.set(9);
        assert_eq!(halted.at(), Some(5));
    }

    #[test]
    fn a_panic_names_the_entry_and_both_ways_past_it() {
        let message = panicked_at(&log_id(3, 41));
        assert!(message.contains("entry 41 (term 3)"), "{message}");
        assert!(message.contains("--halt-apply-at 41"), "{message}");
        assert!(message.contains("--skip-entry 41:3"), "{message}");
    }
}
