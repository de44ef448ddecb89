//! At-least-once delivery to durable consumers, and no redelivery after a committed ack.

use std::collections::{BTreeMap, BTreeSet};

use cellog_sim::history::{Completion, Op};
use cellog_sim::mixed::{AUDIT, JOBS, STREAM, WORKERS, is_delayed};

use super::{Checker, Evidence, acks, fetches};

pub(super) const CHECKER: Checker =
    Checker { property: "at-least-once delivery, and no redelivery after a committed ack", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut delivered: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (consumer, seen) in fetches(evidence) {
        delivered.entry(consumer).or_default().extend(seen.iter().filter_map(|m| m.msg_id.as_deref()));
    }
    // Delayed messages are not due within a run (the delay checker sees that none comes early).
    for ack in acks(evidence).filter(|ack| !is_delayed(ack.msg_id)) {
        let consumer = match ack.stream {
            STREAM => AUDIT,
            JOBS => WORKERS,
            _ => continue,
        };
        if !delivered.get(consumer).is_some_and(|ids| ids.contains(ack.msg_id)) {
            return Err(format!("acknowledged {} was never delivered to {consumer}", ack.msg_id));
        }
    }
    // An ack that succeeded is committed: the message never comes back to that consumer.
    let mut acked: BTreeSet<(&str, u32, u64)> = BTreeSet::new();
    for (_, op, done) in &evidence.operations {
        match (op, done) {
            (Op::Fetch { consumer, .. }, Some(Completion::Ok(cellog_sim::history::Value::Messages(seen)))) => {
                if let Some(again) = seen.iter().find(|m| acked.contains(&(consumer.as_str(), m.partition, m.seq))) {
                    return Err(format!("{consumer} was handed {}/{} again after its ack", again.partition, again.seq));
                }
            }
            (Op::Ack { consumer, partition, seq, kind: "ack" }, Some(Completion::Ok(_))) => {
                acked.insert((consumer.as_str(), *partition, *seq));
            }
            _ => {}
        }
    }
    Ok(())
}
