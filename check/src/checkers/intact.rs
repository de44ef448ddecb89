//! A message is handed out and held with the bytes it was published with: whatever a consumer is delivered, a reader
//! reads or a node holds under a message id is a body some publish of that id carried. A flipped bit or a misplaced
//! write that a replica took for a good record, and then served or passed on (as leader, to every other replica, where
//! the replicas' comparison cannot see it), is caught here against what the clients sent.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Fingerprint, Op, Value};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker {
    name: "intact",
    property: "every message handed out or held carries the bytes it was published with",
    check,
};

fn check(evidence: &Evidence) -> Result<(), String> {
    // Per message id: the bodies its publishes carried (a retry carries the same body; a history may hold others).
    let mut published: BTreeMap<&str, BTreeSet<Fingerprint>> = BTreeMap::new();
    for operation in &evidence.operations {
        if let Op::Publish { msg_id, payload, .. } = &operation.op {
            published.entry(msg_id).or_default().insert(*payload);
        }
    }
    let foreign =
        |msg_id: &str, payload: Fingerprint| published.get(msg_id).is_some_and(|bodies| !bodies.contains(&payload));
    for operation in &evidence.operations {
        let (Op::Fetch { .. } | Op::Read { .. }, Some(Value::Messages(seen))) = (&operation.op, operation.ok()) else {
            continue;
        };
        for message in seen {
            if let (Some(msg_id), Some(payload)) = (message.msg_id.as_deref(), message.payload)
                && foreign(msg_id, payload)
            {
                return Err(format!(
                    "{} was handed {msg_id} at {}/{} with a body no publish of it carried (fingerprint {payload:?})",
                    operation.process, message.partition, message.seq
                ));
            }
        }
    }
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            for (msg_id, copies) in stored {
                if let Some(copy) = copies.iter().find(|copy| foreign(msg_id, Fingerprint::of(&copy.body))) {
                    return Err(format!(
                        "node {node} holds {msg_id} in {stream} at {}/{} with a body no publish of it carried \
                         ({} bytes)",
                        copy.partition,
                        copy.seq,
                        copy.body.len()
                    ));
                }
            }
        }
    }
    Ok(())
}
