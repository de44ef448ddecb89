//! At-least-once processing: a durable consumer that went on until nothing came back (`Duties::drained`) ends up
//! acking every acknowledged message of its stream that is not delayed. A nacked or ignored delivery must come back
//! until it is acked; one that never does was lost to that consumer. An ack whose answer never came counts, since it
//! may have landed.

use std::collections::BTreeSet;

use crate::history::Op;

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker =
    Checker { name: "processed", property: "a drained consumer ends up acking every acknowledged message", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut acked: BTreeSet<(&str, u32, u64)> = BTreeSet::new();
    for operation in &evidence.operations {
        if let Op::Ack { consumer, partition, seq, kind: "ack" | "term" } = &operation.op
            && !operation.refused()
        {
            acked.insert((consumer, *partition, *seq));
        }
    }
    for ack in acks(evidence) {
        let Some(consumer) = evidence.duties.consumers.get(ack.stream) else { continue };
        if !evidence.duties.drained.contains(consumer)
            || matches!(ack.operation.op, Op::Publish { delay_ms: Some(delay), .. } if delay > 0)
        {
            continue;
        }
        if !acked.contains(&(consumer.as_str(), ack.partition, ack.seq)) {
            return Err(format!(
                "{consumer} never acked {} at {}/{}/{}, which it drained",
                ack.msg_id, ack.stream, ack.partition, ack.seq
            ));
        }
    }
    Ok(())
}
