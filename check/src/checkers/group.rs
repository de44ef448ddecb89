//! A consumer group's partition has one owner at a time: no two members are handed one partition in fetches answered
//! at the same generation (a generation fixes who owns what), and a member's earlier incarnation is fenced: once the
//! member has joined again (its join answered at a newer generation), no ack naming an older generation lands.

use std::collections::BTreeMap;

use crate::history::{Op, Value};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker {
    name: "group",
    property: "a consumer group's partition has one owner at a time, and a fenced member's ack never lands",
    check,
};

fn check(evidence: &Evidence) -> Result<(), String> {
    // (group, generation, partition) -> the member handed it, and by which process.
    let mut handed: BTreeMap<(&str, u64, u32), (&str, &str)> = BTreeMap::new();
    // (group, member) -> each join's answered generation and when it was answered.
    let mut joins: BTreeMap<(&str, &str), Vec<(u64, u64)>> = BTreeMap::new();
    for operation in &evidence.operations {
        match (&operation.op, operation.ok(), &operation.completed) {
            (Op::MemberFetch { group, member, .. }, Some(Value::MemberMessages { generation, seen }), _) => {
                for message in seen {
                    let key = (group.as_str(), *generation, message.partition);
                    let (other, process) = *handed.entry(key).or_insert((member, &operation.process));
                    if other != member {
                        return Err(format!(
                            "partition {} of group {group} was handed to {other} ({process}) and to {member} ({}) at \
                             generation {generation}",
                            message.partition, operation.process
                        ));
                    }
                }
            }
            (Op::JoinGroup { group, member }, Some(Value::Assignment { generation, .. }), Some((at, _))) => {
                joins.entry((group, member)).or_default().push((*generation, *at));
            }
            _ => {}
        }
    }
    for operation in &evidence.operations {
        let Op::MemberAck { group, member, generation, partition, seq } = &operation.op else { continue };
        if operation.ok().is_none() {
            continue;
        }
        let rejoined = joins
            .get(&(group.as_str(), member.as_str()))
            .and_then(|joins| joins.iter().find(|&&(joined, at)| joined > *generation && at < operation.invoked_ms));
        if let Some((joined, at)) = rejoined {
            return Err(format!(
                "{}'s ack of {group} partition {partition} seq {seq} at generation {generation} landed after {member} \
                 joined again at generation {joined} ({at} ms)",
                operation.process
            ));
        }
    }
    Ok(())
}
