//! No duplicate: one message id is never at two sequences, in what nodes hold or in what clients were told.

use std::collections::BTreeMap;

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker = Checker { property: "no duplicate (one message id at two sequences)", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (node, stored) in &evidence.stored {
        if let Some((msg_id, copies)) = stored.iter().find(|(_, copies)| copies.len() > 1) {
            return Err(format!("node {node} holds {msg_id} {} times", copies.len()));
        }
    }
    let mut told: BTreeMap<(&str, &str), (u32, u64)> = BTreeMap::new();
    for ack in acks(evidence) {
        let position = (ack.partition, ack.seq);
        if let Some(first) = told.insert((ack.stream, ack.msg_id), position)
            && first != position
        {
            return Err(format!("{} was acknowledged at {first:?} and at {position:?}", ack.msg_id));
        }
    }
    Ok(())
}
