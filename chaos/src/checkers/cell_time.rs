//! Cell time never goes backwards: along each partition, every replica stamps a later message no earlier than the one
//! before it, whatever the nodes' clocks did.

use super::{Checker, Evidence};

pub(super) const CHECKER: Checker = Checker { property: "cell time never goes backwards", check };

fn check(evidence: &Evidence) -> Result<(), String> {
    for (node, stamps) in &evidence.stamps {
        for pair in stamps.windows(2) {
            let ((p1, s1, at1), (p2, s2, at2)) = (pair[0], pair[1]);
            if p1 == p2 && at2 < at1 {
                return Err(format!("node {node} stamps {p2}/{s2} at {at2}, before {p1}/{s1} at {at1}"));
            }
        }
    }
    Ok(())
}
