//! No two messages at one (partition, sequence): clients are never told two ids landed at the same place.

use std::collections::BTreeMap;

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker =
    Checker { name: "position", property: "no two messages at one (partition, sequence)", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut at: BTreeMap<(&str, u32, u64), &str> = BTreeMap::new();
    for ack in acks(evidence) {
        if let Some(other) = at.insert((ack.stream, ack.partition, ack.seq), ack.msg_id)
            && other != ack.msg_id
        {
            return Err(format!(
                "{other} and {} were both acknowledged at {}/{}/{}",
                ack.msg_id, ack.stream, ack.partition, ack.seq
            ));
        }
    }
    Ok(())
}
