//! At-least-once delivery to durable consumers: each durable consumer the workload names is handed every
//! acknowledged message of its stream that is not delayed (delayed ones are the delay checker's).

use std::collections::{BTreeMap, BTreeSet};

use crate::history::Op;

use super::{Checker, Evidence, acks, fetches};

pub(super) const CHECKER: Checker =
    Checker { name: "delivery", property: "at-least-once delivery to durable consumers", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut delivered: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for fetch in fetches(evidence) {
        delivered.entry(fetch.consumer).or_default().extend(fetch.seen.iter().filter_map(|m| m.msg_id.as_deref()));
    }
    for ack in acks(evidence) {
        let Some(consumer) = evidence.duties.consumers.get(ack.stream) else { continue };
        if matches!(ack.operation.op, Op::Publish { delay_ms: Some(delay), .. } if delay > 0) {
            continue;
        }
        if !delivered.get(consumer.as_str()).is_some_and(|ids| ids.contains(ack.msg_id)) {
            return Err(format!(
                "{} acknowledged at {}/{}/{} was never handed to {consumer}",
                ack.msg_id, ack.stream, ack.partition, ack.seq
            ));
        }
    }
    Ok(())
}
