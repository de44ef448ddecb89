//! A refusal is final, and only a refusal is: a message whose every publish the cell refused is not stored. (A publish
//! that timed out is unknown, not refused, and may be stored.)

use std::collections::BTreeMap;

use cellog_sim::history::{Completion, Op};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker =
    Checker { property: "a refused operation did not happen; a timed-out one counts as unknown", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    // Per message id: whether any publish of it succeeded or may have.
    let mut may_exist: BTreeMap<&str, bool> = BTreeMap::new();
    for (_, op, done) in &evidence.operations {
        if let Op::Publish { msg_id, txn: None, .. } = op {
            let possible = !matches!(done, Some(Completion::Fail(_)));
            *may_exist.entry(msg_id).or_default() |= possible;
        }
    }
    for (node, stored) in evidence.stored.iter().chain(&evidence.feed) {
        for msg_id in stored.keys() {
            if may_exist.get(msg_id.as_str()) == Some(&false) {
                return Err(format!("node {node} holds {msg_id}, though every publish of it was refused"));
            }
        }
    }
    Ok(())
}
