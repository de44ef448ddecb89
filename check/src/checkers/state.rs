//! Replicas that applied the same index hold the same state: the same streams, partitions, consumers, producers and
//! timers. A difference is reported by the finest parts that differ (a consumer or a partition rather than its
//! whole stream), which is where a replica went its own way: a snapshot that left something out, a dedup index that
//! was not carried, a write applied on one replica only.

use std::collections::BTreeMap;

use super::{Checker, Evidence};
use crate::evidence::NodeState;

pub(super) const CHECKER: Checker =
    Checker { name: "state", property: "replicas that applied the same index hold the same state", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut by_index: BTreeMap<u64, Vec<(u64, &NodeState)>> = BTreeMap::new();
    for (node, state) in &evidence.states {
        by_index.entry(state.applied_index).or_default().push((*node, state));
    }
    for (index, nodes) in by_index {
        let Some(&(first, reference)) = nodes.first() else { continue };
        let reference = &reference.parts;
        for &(node, state) in &nodes[1..] {
            let parts = &state.parts;
            let differ: Vec<&String> =
                reference.keys().chain(parts.keys()).filter(|part| reference.get(*part) != parts.get(*part)).collect();
            let mut finest: Vec<&String> = differ
                .iter()
                .copied()
                .filter(|part| !differ.iter().any(|other| other.starts_with(&format!("{part} "))))
                .collect();
            finest.sort_unstable();
            finest.dedup();
            if !finest.is_empty() {
                let parts: Vec<&str> = finest.iter().map(|part| part.as_str()).collect();
                return Err(format!(
                    "nodes {first} and {node} both applied {index} and differ in {}",
                    parts.join(", ")
                ));
            }
        }
    }
    Ok(())
}
