//! Per-producer order within a partition: a transaction's messages land in the order they were staged.

use std::collections::BTreeMap;

use crate::history::{Op, Value};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker { name: "order", property: "per-producer order within a partition", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for operation in &evidence.operations {
        let (Op::Txn { step: "commit", .. }, Some(Value::Messages(landed))) = (&operation.op, operation.ok()) else {
            continue;
        };
        let mut last: BTreeMap<u32, u64> = BTreeMap::new();
        for message in landed {
            if let Some(&previous) = last.get(&message.partition)
                && message.seq <= previous
            {
                return Err(format!(
                    "{}'s commit landed a later-staged message at {}/{} before {previous}",
                    operation.process, message.partition, message.seq
                ));
            }
            last.insert(message.partition, message.seq);
        }
    }
    Ok(())
}
