//! No acknowledged publish is lost: every node holds it, where it was acknowledged.

use super::{Checker, Evidence, acks};

pub(super) const CHECKER: Checker = Checker { name: "lost", property: "no acknowledged publish lost", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for ack in acks(evidence) {
        let Some(nodes) = evidence.held.get(ack.stream).filter(|_| !evidence.duties.trimmed.contains(ack.stream))
        else {
            continue;
        };
        for (node, stored) in nodes {
            let held = stored
                .get(ack.msg_id)
                .is_some_and(|copies| copies.iter().any(|copy| (copy.partition, copy.seq) == (ack.partition, ack.seq)));
            if !held {
                let elsewhere = stored.get(ack.msg_id).map_or(String::new(), |copies| {
                    let at: Vec<String> = copies.iter().map(|c| format!("{}/{}", c.partition, c.seq)).collect();
                    format!(" (it holds it at {})", at.join(", "))
                });
                return Err(format!(
                    "node {node} lacks {} acknowledged at {}/{}/{}{elsewhere}",
                    ack.msg_id, ack.stream, ack.partition, ack.seq
                ));
            }
        }
    }
    Ok(())
}
