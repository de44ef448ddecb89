//! The faults of a run as plain data, drawn from a seed: one at a time, each held for a while, then undone.

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` the node; it starts again when the hold ends.
    Kill(u64),
    /// SIGSTOP the node; SIGCONT when the hold ends.
    Pause(u64),
    /// Cut the node off from the other nodes (not from the clients); heal when the hold ends.
    Isolate(u64),
    /// `kill -9` every node at once; all start again when the hold ends.
    RestartAll,
}

impl Fault {
    /// Its kind, for the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(_) => "kill -9",
            Fault::Pause(_) => "pause",
            Fault::Isolate(_) => "partition",
            Fault::RestartAll => "whole-cell restart",
        }
    }
}

/// A fault, when it starts (after the workload starts), and how long it lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// When it starts.
    pub at_ms: u64,
    /// What.
    pub fault: Fault,
    /// How long it lasts.
    pub hold_ms: u64,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>7}ms +{:>5}ms {:?}", self.at_ms, self.hold_ms, self.fault)
    }
}

/// The steps of a run of `duration_ms` over nodes `1..=nodes`, from `seed`: a fault every one to four seconds, each
/// held for half a second to four seconds, whole-cell restarts rarer than the rest.
pub fn draw(seed: u64, nodes: u64, duration_ms: u64) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut steps = Vec::new();
    let mut at_ms = rng.gen_range(1_000..3_000);
    while at_ms < duration_ms {
        let node = rng.gen_range(1..=nodes);
        let fault = match rng.gen_range(0..10) {
            0..=2 => Fault::Kill(node),
            3..=5 => Fault::Pause(node),
            6..=8 => Fault::Isolate(node),
            _ => Fault::RestartAll,
        };
        let hold_ms = rng.gen_range(500..4_000);
        steps.push(Step { at_ms, fault, hold_ms });
        at_ms += hold_ms + rng.gen_range(1_000..4_000);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_one_schedule_of_faults_that_do_not_overlap() {
        let steps = draw(7, 3, 120_000);
        assert_eq!(steps, draw(7, 3, 120_000));
        assert_ne!(steps, draw(8, 3, 120_000));
        assert!(steps.len() >= 15, "{} steps in two minutes", steps.len());
        for pair in steps.windows(2) {
            assert!(pair[0].at_ms + pair[0].hold_ms < pair[1].at_ms, "{} then {}", pair[0], pair[1]);
        }
        let kinds: std::collections::BTreeSet<&str> = steps.iter().map(|step| step.fault.kind()).collect();
        assert_eq!(kinds.len(), 4, "every kind of fault in two minutes: {kinds:?}");
    }
}
