//! No duplicate: one message id is never at two sequences, in what nodes hold or in what clients were told.

use std::collections::BTreeMap;

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker =
    Checker { name: "duplicate", property: "no duplicate (one message id at two sequences)", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            if let Some((msg_id, copies)) = stored.iter().find(|(_, copies)| copies.len() > 1) {
                let at: Vec<String> = copies.iter().map(|c| format!("{}/{}", c.partition, c.seq)).collect();
                return Err(format!("node {node} holds {msg_id} in {stream} at {}", at.join(" and ")));
            }
        }
    }
    let mut told: BTreeMap<(&str, &str), (u32, u64)> = BTreeMap::new();
    for ack in acks(evidence) {
        let position = (ack.partition, ack.seq);
        if let Some(first) = told.insert((ack.stream, ack.msg_id), position)
            && first != position
        {
            return Err(format!(
                "{} was acknowledged in {} at {}/{} and at {}/{}",
                ack.msg_id, ack.stream, first.0, first.1, position.0, position.1
            ));
        }
    }
    Ok(())
}
