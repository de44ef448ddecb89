//! Failing schedules kept as data: each file of `chaos/regressions/` is one failure a sweep found, shrunk, with what
//! failed and what fixed it. A seed alone would drift: when the workload or the nemesis changes, the same seed draws
//! another schedule. The file keeps the schedule itself (and the seed, which still drives the simulator and the
//! workload), so `ci/chaos --regressions` replays the same faults at the same times after any change.

use std::path::{Path, PathBuf};

use cellog_sim::fault::Step;
use serde::{Deserialize, Serialize};

use crate::run::{NODES, Report, plan, run_schedule};

/// Where the regressions live, from the workspace root.
pub const DIRECTORY: &str = "chaos/regressions";

/// One kept failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Regression {
    /// The seed of the simulator and the workload.
    pub seed: u64,
    /// What failed, as the sweep reported it.
    pub failed: String,
    /// What fixed it.
    pub fix: String,
    /// Entries between snapshots.
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot.
    pub keep_logs: u64,
    /// The schedule, shrunk to the steps the failure needs.
    pub steps: Vec<Step>,
}

impl Regression {
    /// Reads one regression file.
    pub fn read(path: &Path) -> Result<Regression, String> {
        let text = std::fs::read_to_string(path).map_err(|error| format!("{}: {error}", path.display()))?;
        toml::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a regression is plain data")
    }

    /// Runs it: the mixed workload from its seed, under its schedule and timing.
    pub fn run(&self, path: &Path) -> Report {
        let (mut swarm, _) = plan(self.seed, &NODES);
        swarm.snapshot_every = self.snapshot_every;
        swarm.keep_logs = self.keep_logs;
        let schedule = self.steps.iter().cloned().enumerate().collect();
        run_schedule(self.seed, swarm, schedule, format!("ci/chaos --regression {}", path.display()))
    }
}

/// Every regression file, in name order.
pub fn files(directory: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(directory).map_err(|error| format!("{}: {error}", directory.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kept_regression_reads_and_writes_back_the_same() {
        let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
        for path in files(&directory).unwrap() {
            let regression = Regression::read(&path).unwrap();
            assert_eq!(toml::from_str::<Regression>(&regression.to_toml()).unwrap(), regression, "{}", path.display());
            assert!(
                !regression.failed.is_empty() && !regression.fix.is_empty(),
                "{} says what failed and the fix",
                path.display()
            );
        }
    }
}
