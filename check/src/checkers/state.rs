//! Replicas that applied the same index hold the same state: the same streams, partitions, consumers, producers and
//! timers. A difference is reported by the finest parts that differ (a consumer or a partition rather than its
//! whole stream), which is where a replica went its own way: a snapshot that left something out, a dedup index that
//! was not carried, a write applied on one replica only. The states read during the run count as well as those at
//! the end: a state at an index is the same whenever it is read, so two reads at one index must agree whichever
//! nodes and moments they come from.

use std::collections::BTreeMap;

use super::{Checker, Evidence};
use crate::evidence::NodeState;

pub(super) const CHECKER: Checker =
    Checker { name: "state", property: "replicas that applied the same index hold the same state", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut by_index: BTreeMap<u64, Vec<(u64, &NodeState, When)>> = BTreeMap::new();
    let read = evidence.samples.iter().map(|(node, state)| (*node, state, When::During));
    for (node, state, when) in read.chain(evidence.states.iter().map(|(node, state)| (*node, state, When::End))) {
        by_index.entry(state.applied_index).or_default().push((node, state, when));
    }
    for (index, nodes) in by_index {
        let Some(&(first, reference, first_when)) = nodes.first() else { continue };
        let reference = &reference.parts;
        for &(node, state, when) in &nodes[1..] {
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
                let at = match (first_when, when) {
                    (When::End, When::End) => String::new(),
                    (When::During, When::During) => " (both read during the run)".to_string(),
                    _ => " (one read during the run, one at the end)".to_string(),
                };
                return Err(format!(
                    "nodes {first} and {node} both applied {index} and differ in {}{at}",
                    parts.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// When a state was read.
#[derive(Clone, Copy)]
enum When {
    During,
    End,
}
