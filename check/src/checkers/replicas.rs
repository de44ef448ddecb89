//! Every replica holds the same bytes at the same (partition, sequence) of every stream. A difference is reported
//! where it is: the stream, the position, and what each of the two nodes holds there.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{Checker, Evidence};
use crate::evidence::Stored;

pub(super) const CHECKER: Checker = Checker {
    name: "replicas",
    property: "every replica holds the same bytes at the same (partition, sequence)",
    check,
};

fn by_position(stored: &Stored) -> BTreeMap<(u32, u64), (&str, &Bytes)> {
    stored
        .iter()
        .flat_map(|(msg_id, copies)| copies.iter().map(move |c| ((c.partition, c.seq), (msg_id.as_str(), &c.body))))
        .collect()
}

fn describe(held: Option<&(&str, &Bytes)>) -> String {
    match held {
        None => "nothing".to_string(),
        Some((msg_id, body)) => format!("{msg_id} ({} bytes)", body.len()),
    }
}

fn check(evidence: &Evidence) -> Result<(), String> {
    for (stream, nodes) in &evidence.held {
        let mut nodes = nodes.iter();
        let Some((first_node, first)) = nodes.next() else { continue };
        let reference = by_position(first);
        for (node, stored) in nodes {
            let here = by_position(stored);
            let positions = reference.keys().chain(here.keys());
            if let Some(&(partition, seq)) = positions.filter(|p| reference.get(p) != here.get(p)).min() {
                let (theirs, ours) = (reference.get(&(partition, seq)), here.get(&(partition, seq)));
                let what = if theirs.map(|t| t.0) == ours.map(|o| o.0) { " with other bytes" } else { "" };
                return Err(format!(
                    "nodes {first_node} and {node} differ in {stream} at {partition}/{seq}: {} against {}{what}",
                    describe(theirs),
                    describe(ours)
                ));
            }
        }
    }
    Ok(())
}
