//! Transactions are atomic: each node shows a transaction whole or not at all, a transaction whose commit was
//! acknowledged is shown, one whose commit was refused or whose abort was acknowledged is not, and no consumer is ever handed a message of a
//! transaction that no node shows. Transactions are found in the history (a process's `begin`, its staged publishes,
//! its commit or abort); the streams they write to must be among the evidence's held streams, kept whole (no
//! work-queue retention, no limits).

use std::collections::BTreeSet;

use crate::history::{Completion, Op};

use super::{Checker, Evidence, fetches, transactions};

pub(super) const CHECKER: Checker = Checker { name: "transactions", property: "transactions are atomic", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut shown: BTreeSet<&str> = BTreeSet::new();
    for transaction in transactions(evidence) {
        // Staged publishes the cell refused are not part of it; unknown ones may be.
        let staged_ok: Vec<&str> = evidence
            .operations
            .iter()
            .filter(|o| o.process == transaction.process && o.ok().is_some())
            .filter_map(|o| match &o.op {
                Op::Publish { msg_id, txn: Some(_), .. } if transaction.staged.contains(&msg_id.as_str()) => {
                    Some(msg_id.as_str())
                }
                _ => None,
            })
            .collect();
        let commit = transaction.commit.and_then(|c| c.done());
        let aborted =
            transaction.abort.is_some_and(|abort| abort.ok().is_some()) && !matches!(commit, Some(Completion::Ok(_)));
        let name = format!("{}'s transaction of {:?}", transaction.process, transaction.staged);
        for (stream, nodes) in evidence.held.iter().filter(|(stream, _)| !evidence.duties.trimmed.contains(*stream)) {
            for (node, stored) in nodes {
                let here: Vec<&str> =
                    transaction.staged.iter().copied().filter(|id| stored.contains_key(*id)).collect();
                if here.is_empty() {
                    continue;
                }
                if let Some(missing) = staged_ok.iter().find(|id| !stored.contains_key(**id)) {
                    return Err(format!("node {node} shows {here:?} of {name} in {stream}, but not {missing}"));
                }
                if matches!(commit, Some(Completion::Fail(_))) {
                    return Err(format!("node {node} shows {name} in {stream}, though its commit was refused"));
                }
                if aborted {
                    return Err(format!("node {node} shows {name} in {stream}, though its abort was acknowledged"));
                }
                shown.extend(here);
            }
        }
        if matches!(commit, Some(Completion::Ok(_)))
            && let Some(missing) = staged_ok.iter().find(|id| !shown.contains(**id))
        {
            return Err(format!("{name} was committed, but no node shows {missing}"));
        }
    }
    let staged: BTreeSet<&str> = transactions(evidence).into_iter().flat_map(|t| t.staged).collect();
    for fetch in fetches(evidence) {
        let aborted_read =
            fetch.seen.iter().filter_map(|m| m.msg_id.as_deref()).find(|id| staged.contains(id) && !shown.contains(id));
        if let Some(msg_id) = aborted_read {
            return Err(format!("{} was handed {msg_id}, of a transaction that never committed", fetch.consumer));
        }
    }
    Ok(())
}
