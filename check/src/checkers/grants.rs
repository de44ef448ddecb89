//! A principal publishes only where its grants allow, and never as the node: a publish by a process whose principal
//! may not publish to the subject, or one carrying a header that is the node's (a forged `Cellog-Sender`), is refused
//! (or times out), never acknowledged, and no node stores it.

use cellog_core::subject::filter_matches;

use crate::history::{Op, Value};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker {
    name: "grants",
    property: "a publish outside its principal's grants, or carrying the node's headers, is never acknowledged or stored",
    check,
};

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut outside = Vec::new();
    for operation in &evidence.operations {
        let Op::Publish { msg_id, subject, .. } = &operation.op else { continue };
        let why = if evidence.duties.forged.contains(msg_id) {
            "carrying a header that is the node's".to_string()
        } else {
            let Some(filters) = evidence.duties.publishers.get(&operation.process) else { continue };
            if filters.iter().any(|filter| filter_matches(filter, subject)) {
                continue;
            }
            format!("outside its grants {filters:?}")
        };
        if let Some(Value::Published { stream, partition, seq, .. }) = operation.ok() {
            return Err(format!(
                "{} published {msg_id} to {subject}, {why}, and it was acknowledged at {stream}/{partition}/{seq}",
                operation.process
            ));
        }
        outside.push(msg_id.as_str());
    }
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            if let Some(msg_id) = outside.iter().find(|id| stored.contains_key(**id)) {
                return Err(format!(
                    "node {node} holds {msg_id} in {stream}, published outside its principal's grants or as the node"
                ));
            }
        }
    }
    Ok(())
}
