//! A consumer group hands a partition over in order: its new owner is handed what the old owner had not acknowledged
//! before anything newer of that partition. So each key (one partition) is processed by one member at a time, in
//! order, across rebalances.
//!
//! From the history: when a fetch by member `m` hands a message first (delivery count 1) of a partition, every earlier
//! message of that partition first handed to another member (in a fetch that ended before this one began) is either
//! acknowledged (an ack that was not refused, begun before this fetch ended) or handed again to `m` (begun before this
//! fetch ended, this fetch included). A partition that moved to `m` left its unacknowledged messages ready for `m`,
//! and a fetch takes ready messages before new ones. A member that joined again is another member here (an
//! incarnation is told by the generation its process's last join was answered with): joining again releases what the
//! earlier incarnation owned.

use std::collections::BTreeMap;

use crate::history::{Completion, Op, Value};

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker {
    name: "handover",
    property: "a group partition's new owner gets the old owner's unacknowledged messages before newer ones",
    check,
};

/// A group and one of its partitions.
type Place<'a> = (&'a str, u32);

/// A member incarnation: its name, and the generation its join was answered with (0: no join seen).
type Holder<'a> = (&'a str, u64);

/// A member fetch's answer: who, when it began and ended, and what it handed.
struct Fetch<'a> {
    process: &'a str,
    group: &'a str,
    holder: Holder<'a>,
    invoked: u64,
    completed: u64,
    handed: Vec<(u32, u64, u32)>,
}

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut fetches = Vec::new();
    // (process, group, member) -> the generation of the last join answered so far, in the process's order.
    let mut joined: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
    // (group, partition) -> seq -> who it was first handed to, and when that fetch ended.
    let mut first: BTreeMap<Place<'_>, BTreeMap<u64, (Holder<'_>, u64)>> = BTreeMap::new();
    // (group, partition, seq) -> when the earliest ack that may have landed began.
    let mut acked: BTreeMap<(&str, u32, u64), u64> = BTreeMap::new();
    // (group, partition, seq, holder) -> when the earliest fetch that handed it to the holder again began.
    let mut again: BTreeMap<(&str, u32, u64, Holder<'_>), u64> = BTreeMap::new();
    for operation in &evidence.operations {
        let process = operation.process.as_str();
        match (&operation.op, &operation.completed) {
            (Op::JoinGroup { group, member }, Some((_, Completion::Ok(Value::Assignment { generation, .. })))) => {
                joined.insert((process, group, member), *generation);
            }
            (
                Op::MemberFetch { group, member, .. },
                Some((completed, Completion::Ok(Value::MemberMessages { seen, .. }))),
            ) => {
                let holder =
                    (member.as_str(), joined.get(&(process, group.as_str(), member.as_str())).copied().unwrap_or(0));
                let handed: Vec<(u32, u64, u32)> =
                    seen.iter().map(|s| (s.partition, s.seq, s.delivery_count)).collect();
                for &(partition, seq, count) in &handed {
                    if count == 1 {
                        let by = first.entry((group, partition)).or_default();
                        by.entry(seq).or_insert((holder, *completed));
                    } else {
                        let at = again.entry((group, partition, seq, holder)).or_insert(operation.invoked_ms);
                        *at = (*at).min(operation.invoked_ms);
                    }
                }
                fetches.push(Fetch {
                    process,
                    group,
                    holder,
                    invoked: operation.invoked_ms,
                    completed: *completed,
                    handed,
                });
            }
            (Op::MemberAck { group, partition, seq, .. }, completion)
                if !matches!(completion, Some((_, Completion::Fail(_)))) =>
            {
                let at = acked.entry((group, *partition, *seq)).or_insert(operation.invoked_ms);
                *at = (*at).min(operation.invoked_ms);
            }
            _ => {}
        }
    }
    for fetch in &fetches {
        for &(partition, seq, count) in &fetch.handed {
            if count != 1 {
                continue;
            }
            let Some(earlier) = first.get(&(fetch.group, partition)) else { continue };
            for (&older, &(holder, handed_at)) in earlier.range(..seq) {
                if holder == fetch.holder || handed_at >= fetch.invoked {
                    continue;
                }
                let before_the_end = |at: Option<&u64>| at.is_some_and(|&at| at < fetch.completed);
                if before_the_end(acked.get(&(fetch.group, partition, older)))
                    || before_the_end(again.get(&(fetch.group, partition, older, fetch.holder)))
                {
                    continue;
                }
                let ((member, joined), (other, other_joined)) = (fetch.holder, holder);
                return Err(format!(
                    "{member} (joined at generation {joined}, {}) was handed group {} partition {partition} seq {seq} \
                     first at {} ms, while seq {older}, handed to {other} (joined at generation {other_joined}) at \
                     {handed_at} ms, was neither acknowledged nor handed to it again",
                    fetch.process, fetch.group, fetch.completed
                ));
            }
        }
    }
    Ok(())
}
