//! A delayed message is not delivered before its time. The producer delays one message in ten by a day, longer than
//! any run (clock jumps included), so any delivery of one is early.

use cellog_sim::mixed::is_delayed;

use super::{Checker, Evidence, fetches};

pub(super) const CHECKER: Checker = Checker { property: "a delayed message is not delivered before its time", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (consumer, seen) in fetches(evidence) {
        if let Some(early) = seen.iter().filter_map(|m| m.msg_id.as_deref()).find(|msg_id| is_delayed(msg_id)) {
            return Err(format!("{consumer} was handed {early}, a day before its delay ends"));
        }
    }
    Ok(())
}
