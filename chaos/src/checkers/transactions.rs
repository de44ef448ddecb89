//! Transactions are atomic: a transaction is visible whole or not at all, an acknowledged commit is visible, and no
//! consumer is ever handed a message of a transaction that did not commit.

use std::collections::BTreeSet;

use cellog_sim::mixed::{TXN_SIZE, TXNS, txn_message_id};

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker = Checker { property: "transactions are atomic", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut visible: BTreeSet<String> = BTreeSet::new();
    for (node, stored) in &evidence.stored {
        for round in 0..TXNS {
            let n = (0..TXN_SIZE).filter(|&index| stored.contains_key(&txn_message_id(round, index))).count();
            if n != 0 && n != TXN_SIZE {
                return Err(format!("node {node} shows {n} of transaction {round}'s {TXN_SIZE} messages"));
            }
            if n == 0 && evidence.committed.contains(&round) {
                return Err(format!("node {node} lacks transaction {round}, whose commit was acknowledged"));
            }
            if n == TXN_SIZE {
                visible.extend((0..TXN_SIZE).map(|index| txn_message_id(round, index)));
            }
        }
    }
    for (consumer, seen) in fetches(evidence) {
        let aborted_read =
            seen.iter().filter_map(|m| m.msg_id.as_deref()).find(|id| id.starts_with('t') && !visible.contains(*id));
        if let Some(msg_id) = aborted_read {
            return Err(format!("{consumer} was handed {msg_id}, of a transaction that never committed"));
        }
    }
    Ok(())
}
