//! A refusal is final, and only a refusal is: a message whose every publish the cell refused is not stored, and no
//! consumer or reader is ever handed it. (A publish that timed out is unknown, not refused, and may be stored.)

use std::collections::BTreeMap;

use crate::history::{Op, Value};

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
    let refused = |msg_id: &str| may_exist.get(msg_id) == Some(&false);
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            if let Some(msg_id) = stored.keys().find(|id| refused(id)) {
                return Err(format!("node {node} holds {msg_id} in {stream}, though every publish of it was refused"));
            }
        }
    }
    // Retention may have removed it by the end: what was handed out or read during the run counts too.
    for operation in &evidence.operations {
        if let (Op::Fetch { .. } | Op::Read { .. }, Some(Value::Messages(seen))) = (&operation.op, operation.ok())
            && let Some(msg_id) = seen.iter().filter_map(|m| m.msg_id.as_deref()).find(|id| refused(id))
        {
            return Err(format!("{} was handed {msg_id}, though every publish of it was refused", operation.process));
        }
    }
    Ok(())
}
