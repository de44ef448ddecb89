//! Every replica holds the same bytes at the same (partition, sequence).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker =
    Checker { property: "every replica holds the same bytes at the same (partition, sequence)", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let by_position = |stored: &cellog_sim::Stored| -> BTreeMap<(u32, u64), (String, Bytes)> {
        stored
            .iter()
            .flat_map(|(msg_id, copies)| {
                copies.iter().map(move |(p, s, body)| ((*p, *s), (msg_id.clone(), body.clone())))
            })
            .collect()
    };
    let mut nodes = evidence.stored.iter();
    let Some((first_node, first)) = nodes.next() else { return Ok(()) };
    let reference = by_position(first);
    for (node, stored) in nodes {
        let here = by_position(stored);
        if here != reference {
            let differs = reference
                .iter()
                .find(|(position, message)| here.get(position) != Some(message))
                .map(|(position, _)| *position)
                .or_else(|| here.keys().find(|position| !reference.contains_key(position)).copied());
            return Err(format!("nodes {first_node} and {node} differ at {differs:?}"));
        }
    }
    Ok(())
}
