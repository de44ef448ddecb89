//! A mirror is a gap-free, in-order prefix of its source with ids preserved: every message a mirror's replica holds
//! is at the position (partition and sequence) its source holds it at, with the same id and body; and below the last
//! sequence the mirror holds in a partition, it holds every message its source holds there (a range passed over
//! shows as a gap).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{Checker, Evidence};
use crate::evidence::Stored;

pub(super) const CHECKER: Checker = Checker {
    name: "mirror",
    property: "a mirror is a gap-free, in-order prefix of its source with ids preserved",
    check,
};

/// What a stream holds by position: the id and body at each (partition, sequence).
fn by_position(stored: &Stored) -> BTreeMap<(u32, u64), (&str, &Bytes)> {
    stored
        .iter()
        .flat_map(|(id, copies)| copies.iter().map(move |held| ((held.partition, held.seq), (id.as_str(), &held.body))))
        .collect()
}

fn check(evidence: &Evidence) -> Result<(), String> {
    for (mirror, source) in &evidence.duties.mirrors {
        let (Some(mirrors), Some(sources)) = (evidence.held.get(mirror), evidence.held.get(source)) else { continue };
        // Every source replica holds the same (the replicas checker sees to that); any one stands for the source.
        let Some((_, source_stored)) = sources.iter().next() else { continue };
        let origin = by_position(source_stored);
        for (node, stored) in mirrors {
            let copied = by_position(stored);
            let mut tops: BTreeMap<u32, u64> = BTreeMap::new();
            for (&(partition, seq), &(id, body)) in &copied {
                match origin.get(&(partition, seq)) {
                    Some(&(origin_id, origin_body)) if origin_id == id && origin_body == body => {}
                    Some(&(origin_id, _)) if origin_id != id => {
                        return Err(format!(
                            "node {node}'s mirror {mirror} holds {id} at {partition}/{seq}, where {source} holds \
                             {origin_id}"
                        ));
                    }
                    Some(_) => {
                        return Err(format!(
                            "node {node}'s mirror {mirror} holds {id} at {partition}/{seq} with another body than \
                             {source} holds"
                        ));
                    }
                    None => {
                        return Err(format!(
                            "node {node}'s mirror {mirror} holds {id} at {partition}/{seq}, where {source} holds \
                             nothing"
                        ));
                    }
                }
                let top = tops.entry(partition).or_default();
                *top = (*top).max(seq);
            }
            for (&(partition, seq), &(id, _)) in &origin {
                let below_top = tops.get(&partition).is_some_and(|&top| seq < top);
                if below_top && !copied.contains_key(&(partition, seq)) {
                    return Err(format!(
                        "node {node}'s mirror {mirror} lacks {id} at {partition}/{seq}, below the last sequence it \
                         holds there ({}): a gap {source} does not have",
                        tops[&partition]
                    ));
                }
            }
        }
    }
    Ok(())
}
