//! No redelivery after a committed ack: once an ack of a delivery has succeeded, no fetch invoked after it hands that
//! message to the same consumer again. (A fetch already under way when the ack was answered may still carry it.)

use std::collections::BTreeMap;

use crate::history::Op;

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker =
    Checker { name: "redelivery", property: "no redelivery after a committed ack", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    // Per consumer and position: when the first successful ack of it was answered.
    let mut acked: BTreeMap<(&str, u32, u64), u64> = BTreeMap::new();
    for operation in &evidence.operations {
        if let (Op::Ack { consumer, partition, seq, kind: "ack" }, Some((at, _))) =
            (&operation.op, &operation.completed)
            && operation.ok().is_some()
        {
            let first = acked.entry((consumer.as_str(), *partition, *seq)).or_insert(*at);
            *first = (*first).min(*at);
        }
    }
    for fetch in fetches(evidence) {
        for message in fetch.seen {
            if let Some(&at) = acked.get(&(fetch.consumer, message.partition, message.seq))
                && at < fetch.operation.invoked_ms
            {
                return Err(format!(
                    "{} was handed {}/{} again by a fetch asked at {} ms, after its ack was answered at {at} ms",
                    fetch.consumer, message.partition, message.seq, fetch.operation.invoked_ms
                ));
            }
        }
    }
    Ok(())
}
