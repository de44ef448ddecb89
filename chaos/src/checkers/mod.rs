//! The checkers: one file per property, each over the run's [`Evidence`]: the client history (what was asked and
//! answered, `unknown` meaning it may or may not have happened) and what every replica holds at the end.

use std::collections::BTreeMap;

use cellog_sim::history::{Completion, Op, Value};
use cellog_sim::{SimNodeId, Stored};

mod cell_time;
mod delayed;
mod delivery;
mod duplicate;
mod fenced;
mod lost;
mod monotonic;
mod order;
mod position;
mod replicas;
mod transactions;
mod unknown;
mod watermark;

/// What a run leaves to check.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// Every client operation, with its completion if it got one.
    pub operations: Vec<(String, Op, Option<Completion>)>,
    /// What each node holds in the checked stream, after convergence.
    pub stored: BTreeMap<SimNodeId, Stored>,
    /// What each node holds in the feed a registered peer holds back.
    pub feed: BTreeMap<SimNodeId, Stored>,
    /// Per node, each message of the checked stream as (partition, sequence, cell time stored at), in order.
    pub stamps: BTreeMap<SimNodeId, Vec<(u32, u64, u64)>>,
    /// The transactions whose commit was acknowledged.
    pub committed: Vec<usize>,
}

/// A property and its check.
#[derive(Clone, Copy, Debug)]
pub struct Checker {
    /// The property, as a sentence.
    pub property: &'static str,
    /// `Err` describes the first violation found.
    pub check: fn(&Evidence) -> Result<(), String>,
}

/// Every checker.
pub const ALL: &[Checker] = &[
    lost::CHECKER,
    duplicate::CHECKER,
    position::CHECKER,
    replicas::CHECKER,
    order::CHECKER,
    monotonic::CHECKER,
    delivery::CHECKER,
    transactions::CHECKER,
    fenced::CHECKER,
    unknown::CHECKER,
    watermark::CHECKER,
    delayed::CHECKER,
    cell_time::CHECKER,
];

/// Runs every checker; returns the violated properties with what was found.
pub fn check_all(evidence: &Evidence) -> Vec<(&'static str, String)> {
    ALL.iter().filter_map(|checker| (checker.check)(evidence).err().map(|found| (checker.property, found))).collect()
}

/// One acknowledged publish outside a transaction: its id, stream, partition and sequence.
pub(crate) struct Ack<'a> {
    pub msg_id: &'a str,
    pub stream: &'a str,
    pub partition: u32,
    pub seq: u64,
}

/// Every acknowledged publish outside a transaction, in history order.
pub(crate) fn acks(evidence: &Evidence) -> impl Iterator<Item = Ack<'_>> {
    evidence.operations.iter().filter_map(|(_, op, done)| match (op, done) {
        (
            Op::Publish { msg_id, txn: None, .. },
            Some(Completion::Ok(Value::Published { stream, partition, seq, .. })),
        ) => Some(Ack { msg_id, stream, partition: *partition, seq: *seq }),
        _ => None,
    })
}

/// Every fetch that succeeded: the consumer and what it was handed.
pub(crate) fn fetches(evidence: &Evidence) -> impl Iterator<Item = (&str, &[cellog_sim::history::Seen])> {
    evidence.operations.iter().filter_map(|(_, op, done)| match (op, done) {
        (Op::Fetch { consumer, .. }, Some(Completion::Ok(Value::Messages(seen)))) => {
            Some((consumer.as_str(), &seen[..]))
        }
        _ => None,
    })
}
