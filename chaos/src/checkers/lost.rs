//! No acknowledged publish is lost: every node holds it, where it was acknowledged.

use cellog_sim::mixed::STREAM;

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker = Checker { property: "no acknowledged publish lost", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for ack in acks(evidence).filter(|ack| ack.stream == STREAM) {
        for (node, stored) in &evidence.stored {
            let held = stored.get(ack.msg_id).is_some_and(|copies| {
                copies.iter().any(|&(partition, seq, _)| (partition, seq) == (ack.partition, ack.seq))
            });
            if !held {
                return Err(format!("node {node} lacks {} acknowledged at {}/{}", ack.msg_id, ack.partition, ack.seq));
            }
        }
    }
    Ok(())
}
