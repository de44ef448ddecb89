//! Seeded fault sweeps of simulated cells.
//!
//! - [`nemesis`]: swarm testing: each seed picks its own mix of the simulator's faults and their rates, and a
//!   schedule of them, as plain data.
//! - the checkers are `cellog-check`'s: one per property, over the run's history and the replicas' final contents.
//! - [`run`]: one seed: a three-node cell under the mixed workload and the seed's schedule (safety phase), then
//!   heal and converge within a fixed simulated-time budget (liveness phase), then the checkers.
//! - [`planted`]: which checker must catch each planted bug.
//! - [`regressions`]: failing schedules kept as data in `chaos/regressions/`, replayed by `ci/chaos --regressions`.
//! - `src/bin/chaos.rs` (`ci/chaos`): runs seeds, prints a one-line replay for each failure, and shrinks a failing
//!   schedule to fewer steps that still fail.
//!
//! Everything here exists only under `--cfg madsim`; in other builds the crate is empty.

#[cfg(madsim)]
pub mod nemesis;
#[cfg(madsim)]
pub mod planted;
#[cfg(madsim)]
pub mod regressions;
#[cfg(madsim)]
pub mod run;
