//! Cell time never goes backwards: along each partition, every replica stamps a later message no earlier than the one
//! before it, whatever the nodes' clocks did.

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker { name: "cell-time", property: "cell time never goes backwards", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (stream, nodes) in &evidence.held {
        for (node, stored) in nodes {
            let mut stamps: Vec<(u32, u64, u64)> =
                stored.values().flatten().map(|c| (c.partition, c.seq, c.stored_at_ms)).collect();
            stamps.sort_unstable();
            for pair in stamps.windows(2) {
                let ((p1, s1, at1), (p2, s2, at2)) = (pair[0], pair[1]);
                if p1 == p2 && at2 < at1 {
                    return Err(format!(
                        "node {node} stamps {stream}/{p2}/{s2} at {at2} ms, before {p2}/{s1} at {at1} ms"
                    ));
                }
            }
        }
    }
    Ok(())
}
