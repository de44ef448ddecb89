//! Monotonic reads per consumer: a consumer is handed new messages of a partition in increasing sequence.

use std::collections::BTreeMap;

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker = Checker { name: "monotonic", property: "monotonic reads per consumer", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    let mut last: BTreeMap<(&str, u32), u64> = BTreeMap::new();
    for fetch in fetches(evidence) {
        let consumer = fetch.consumer;
        for message in fetch.seen.iter().filter(|message| message.delivery_count == 1) {
            let key = (consumer, message.partition);
            if let Some(&previous) = last.get(&key)
                && message.seq <= previous
            {
                return Err(format!(
                    "{consumer} was first handed {}/{} after {}/{previous}",
                    message.partition, message.seq, message.partition
                ));
            }
            last.insert(key, message.seq);
        }
    }
    Ok(())
}
