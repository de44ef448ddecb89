//! Per-producer order within a partition: a transaction's messages land in the order they were staged.

use std::collections::BTreeMap;

use cellog_sim::history::{Completion, Op, Value};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker { property: "per-producer order within a partition", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (process, op, done) in &evidence.operations {
        let (Op::Txn { step: "commit", .. }, Some(Completion::Ok(Value::Messages(landed)))) = (op, done) else {
            continue;
        };
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        for message in landed {
            if let Some(&previous) = last.get(&message.partition)
                && message.seq <= previous
            {
                return Err(format!(
                    "{process}'s commit landed a later-staged message at {}/{} before {previous}",
                    message.partition, message.seq
                ));
            }
            last.insert(message.partition, message.seq);
        }
    }
    Ok(())
}
