//! A fenced producer never commits: once a newer instance of a transactional id has been registered (its
//! `InitProducer` answered with a higher epoch), the older epoch's prepares and commits asked after that never
//! succeed, and nothing it stages after that is ever shown by a node or handed to a consumer.

use std::collections::BTreeMap;

use crate::history::{Op, Value};

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker = Checker { name: "fenced", property: "a fenced producer never commits", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    // Per producer id: each epoch registered and when its registration was answered.
    let mut registered: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
    for operation in &evidence.operations {
        if let (Op::InitProducer { .. }, Some(Value::Producer { producer_id, epoch }), Some((at, _))) =
            (&operation.op, operation.ok(), &operation.completed)
        {
            registered.entry(*producer_id).or_default().push((*epoch, *at));
        }
    }
    // Whether (producer, epoch) was fenced before `at`.
    let fenced_before = |producer: u64, epoch: u32, at: u64| {
        registered.get(&producer).and_then(|epochs| epochs.iter().find(|&&(e, when)| e > epoch && when < at)).copied()
    };
    let mut staged_fenced: Vec<&str> = Vec::new();
    for operation in &evidence.operations {
        match &operation.op {
            Op::Txn { step: step @ ("commit" | "prepare"), producer_id, epoch } => {
                if let Some((newer, when)) = fenced_before(*producer_id, *epoch, operation.invoked_ms)
                    && operation.ok().is_some()
                {
                    return Err(format!(
                        "{} could {step} at epoch {epoch} of producer {producer_id}, fenced by epoch {newer} at {when} ms",
                        operation.process
                    ));
                }
            }
            Op::Publish { msg_id, txn: Some((producer_id, epoch)), .. }
                if fenced_before(*producer_id, *epoch, operation.invoked_ms).is_some() =>
            {
                staged_fenced.push(msg_id);
            }
            _ => {}
        }
    }
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            if let Some(msg_id) = staged_fenced.iter().find(|id| stored.contains_key(**id)) {
                return Err(format!("node {node} shows {msg_id} in {stream}, staged by a fenced producer"));
            }
        }
    }
    for fetch in fetches(evidence) {
        let handed = fetch.seen.iter().filter_map(|m| m.msg_id.as_deref()).find(|id| staged_fenced.contains(id));
        if let Some(msg_id) = handed {
            return Err(format!("{} was handed {msg_id}, staged by a fenced producer", fetch.consumer));
        }
    }
    Ok(())
}
