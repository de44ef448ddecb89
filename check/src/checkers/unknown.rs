//! A refusal is final, and only a refusal is: a message whose every publish the cell refused is not stored. (A publish
//! that timed out is unknown, not refused, and may be stored.)

use std::collections::BTreeMap;

use crate::history::Op;

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker {
    name: "unknown",
    property: "a refused operation did not happen; a timed-out one counts as unknown",
    check,
};

fn check(evidence: &Evidence) -> Result<(), String> {
    // Per message id: whether any publish of it succeeded or may have.
    let mut may_exist: BTreeMap<&str, bool> = BTreeMap::new();
    for operation in &evidence.operations {
        if let Op::Publish { msg_id, txn: None, .. } = &operation.op {
            *may_exist.entry(msg_id).or_default() |= !operation.refused();
        }
    }
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            if let Some(msg_id) = stored.keys().find(|id| may_exist.get(id.as_str()) == Some(&false)) {
                return Err(format!("node {node} holds {msg_id} in {stream}, though every publish of it was refused"));
            }
        }
    }
    Ok(())
}
