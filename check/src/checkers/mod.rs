//! The checkers: one file per property, each a pure function of the run's [`Evidence`]. A checker names the first
//! violation it finds, with where it is (node, stream, partition, sequence, consumer) so that a failure reads as a
//! finding, not a mismatch.

use crate::evidence::Evidence;
use crate::history::{Op, Operation, Seen, Value};

mod cell_time;
mod delayed;
mod delivery;
mod duplicate;
mod fenced;
mod grants;
mod group;
mod handover;
mod intact;
mod lost;
mod mirror;
mod monotonic;
mod order;
mod position;
mod processed;
mod redelivery;
mod replicas;
mod state;
mod transactions;
mod unknown;
mod watermark;

/// A property and its check.
#[derive(Clone, Copy, Debug)]
pub struct Checker {
    /// A short name (the checker's file).
    pub name: &'static str,
    /// The property, as a sentence.
    pub property: &'static str,
    /// `Err` describes the first violation found.
    pub check: fn(&Evidence) -> Result<(), String>,
}

/// A property a run violated, and what was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The checker's short name.
    pub checker: &'static str,
    /// The property.
    pub property: &'static str,
    /// The first violation of it.
    pub found: String,
}

/// Every checker.
pub const ALL: &[Checker] = &[
    lost::CHECKER,
    duplicate::CHECKER,
    position::CHECKER,
    replicas::CHECKER,
    intact::CHECKER,
    state::CHECKER,
    order::CHECKER,
    monotonic::CHECKER,
    delivery::CHECKER,
    processed::CHECKER,
    redelivery::CHECKER,
    transactions::CHECKER,
    fenced::CHECKER,
    grants::CHECKER,
    group::CHECKER,
    handover::CHECKER,
    unknown::CHECKER,
    watermark::CHECKER,
    delayed::CHECKER,
    cell_time::CHECKER,
    mirror::CHECKER,
];

/// Runs every checker; returns the violated properties with what was found.
pub fn check_all(evidence: &Evidence) -> Vec<Violation> {
    ALL.iter()
        .filter_map(|checker| {
            (checker.check)(evidence).err().map(|found| Violation {
                checker: checker.name,
                property: checker.property,
                found,
            })
        })
        .collect()
}

/// One acknowledged publish outside a transaction: its id, stream, partition and sequence.
pub(crate) struct Ack<'a> {
    pub msg_id: &'a str,
    pub stream: &'a str,
    pub partition: u32,
    pub seq: u64,
    pub operation: &'a Operation,
}

/// Every acknowledged publish outside a transaction, in history order.
pub(crate) fn acks(evidence: &Evidence) -> impl Iterator<Item = Ack<'_>> {
    evidence.operations.iter().filter_map(|operation| match (&operation.op, operation.ok()) {
        (Op::Publish { msg_id, txn: None, .. }, Some(Value::Published { stream, partition, seq, .. })) => {
            Some(Ack { msg_id, stream, partition: *partition, seq: *seq, operation })
        }
        _ => None,
    })
}

/// A fetch that succeeded: the consumer, the operation (its times), and what it was handed.
pub(crate) struct Fetch<'a> {
    pub consumer: &'a str,
    pub operation: &'a Operation,
    pub seen: &'a [Seen],
}

impl Fetch<'_> {
    /// When the answer came.
    pub fn answered_ms(&self) -> u64 {
        self.operation.completed.as_ref().map_or(self.operation.invoked_ms, |(at, _)| *at)
    }
}

/// Every fetch that succeeded, in history order.
pub(crate) fn fetches(evidence: &Evidence) -> impl Iterator<Item = Fetch<'_>> {
    evidence.operations.iter().filter_map(|operation| match (&operation.op, operation.ok()) {
        (Op::Fetch { consumer, .. }, Some(Value::Messages(seen))) => Some(Fetch { consumer, operation, seen }),
        _ => None,
    })
}

/// A transaction as one process ran it: from a `begin` to the step that ended it.
pub(crate) struct Transaction<'a> {
    pub process: &'a str,
    /// The ids of the messages it staged (whether or not staging was acknowledged).
    pub staged: Vec<&'a str>,
    /// Its commit, if one was asked for.
    pub commit: Option<&'a Operation>,
    /// Its abort, if one was asked for.
    pub abort: Option<&'a Operation>,
}

/// Every transaction of the history: each `begin` of a process, with the publishes it staged up to its commit,
/// abort or next `begin`.
pub(crate) fn transactions(evidence: &Evidence) -> Vec<Transaction<'_>> {
    let mut done: Vec<Transaction<'_>> = Vec::new();
    let mut open: std::collections::BTreeMap<&str, Transaction<'_>> = std::collections::BTreeMap::new();
    for operation in &evidence.operations {
        let process = operation.process.as_str();
        match &operation.op {
            Op::Txn { step: "begin", .. } => {
                let fresh = Transaction { process, staged: Vec::new(), commit: None, abort: None };
                done.extend(open.insert(process, fresh));
            }
            Op::Publish { msg_id, txn: Some(_), .. } => {
                if let Some(transaction) = open.get_mut(process) {
                    transaction.staged.push(msg_id);
                }
            }
            Op::Txn { step: "commit", .. } => {
                if let Some(mut transaction) = open.remove(process) {
                    transaction.commit = Some(operation);
                    done.push(transaction);
                }
            }
            Op::Txn { step: "abort", .. } => {
                if let Some(mut transaction) = open.remove(process) {
                    transaction.abort = Some(operation);
                    done.push(transaction);
                }
            }
            _ => {}
        }
    }
    done.extend(open.into_values());
    done
}
