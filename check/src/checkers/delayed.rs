//! A delayed message is not delivered before its time: a fetch answered before the publish was even asked for plus
//! its delay handed it out early, whatever the clocks did.

use std::collections::BTreeMap;

use crate::history::Op;

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker =
    Checker { name: "delayed", property: "a delayed message is not delivered before its time", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    // Per message id: the earliest it may be due.
    let mut due: BTreeMap<&str, u64> = BTreeMap::new();
    for operation in &evidence.operations {
        if let Op::Publish { msg_id, delay_ms: Some(delay), .. } = &operation.op {
            let at = operation.invoked_ms.saturating_add(*delay);
            let earliest = due.entry(msg_id).or_insert(at);
            *earliest = (*earliest).min(at);
        }
    }
    for fetch in fetches(evidence) {
        for msg_id in fetch.seen.iter().filter_map(|m| m.msg_id.as_deref()) {
            if let Some(&at) = due.get(msg_id)
                && fetch.answered_ms() < at
            {
                return Err(format!(
                    "{} was handed {msg_id} by {} ms, before it was due at {at} ms",
                    fetch.consumer,
                    fetch.answered_ms()
                ));
            }
        }
    }
    Ok(())
}
