//! One seed of a chaos sweep.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use cellog_check::{Violation, check_all};
use cellog_sim::fault::Step;
use cellog_sim::seeds::{Concern, Seeds};
use cellog_sim::{Cluster, SimNodeId, mixed, moves};

use crate::nemesis::Swarm;

/// The founding nodes of every run's cell.
pub const NODES: [SimNodeId; 3] = [1, 2, 3];
/// Across cells: the nodes of the two cells a stream moves between (the directory's are 1 to 3).
pub const MOVE_NODES: [SimNodeId; 6] = [4, 5, 6, 7, 8, 9];

/// Whether runs are of the workload across cells ([`moves`]) rather than the mixed one of one cell.
static ACROSS_CELLS: AtomicBool = AtomicBool::new(false);

/// Makes runs from now on run the workload across cells (`true`) or the mixed one (`false`).
pub fn set_across_cells(on: bool) {
    ACROSS_CELLS.store(on, Ordering::Relaxed);
}

/// Whether runs are across cells.
pub fn across_cells() -> bool {
    ACROSS_CELLS.load(Ordering::Relaxed)
}

/// What one seed did.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Its mix of faults.
    pub swarm: Swarm,
    /// The steps that ran (the seed's schedule less the dropped ones), with their index in the full schedule.
    pub schedule: Vec<(usize, Step)>,
    /// The properties violated, with what was found.
    pub violations: Vec<Violation>,
    /// Why the cell did not converge or could not be read at the end, if so (the checkers ran on what was read).
    pub liveness: Option<String>,
    /// Publishes acknowledged.
    pub acknowledged: usize,
    /// The run's trace, rendered.
    pub trace: String,
    /// The run's history, rendered.
    pub history: String,
}

/// The seed's mix and full schedule, for a cell of `nodes`.
pub fn plan(seed: u64, nodes: &[u64]) -> (Swarm, Vec<Step>) {
    let seeds = Seeds(seed);
    let (mut faults, mut network) = (seeds.rng(Concern::Faults), seeds.rng(Concern::Network));
    let swarm = Swarm::draw(&mut faults);
    let schedule = swarm.schedule(&mut faults, &mut network, nodes);
    (swarm, schedule)
}

/// The seed's mix and full schedule for the workload runs are of now: the mixed one's, or, across cells, one over
/// the nodes of the two cells a stream moves between, less the faults that act on the first cell alone.
pub fn plan_now(seed: u64) -> (Swarm, Vec<Step>) {
    if !across_cells() {
        return plan(seed, &NODES);
    }
    let (swarm, schedule) = plan(seed, &MOVE_NODES);
    (swarm, schedule.into_iter().filter(moves::applies).collect())
}

/// The command that replays this seed with these steps dropped.
pub fn replay(seed: u64, dropped: &BTreeSet<usize>) -> String {
    let mut command = format!("ci/chaos{} --seed {seed}", if across_cells() { " --moves" } else { "" });
    if !dropped.is_empty() {
        let dropped: Vec<String> = dropped.iter().map(ToString::to_string).collect();
        command.push_str(&format!(" --drop {}", dropped.join(",")));
    }
    if let Some(mutant) = cellog_planted::current() {
        command.push_str(&format!(" --mutant {}", <&'static str>::from(mutant)));
    }
    command
}

/// Runs `seed` without the steps in `dropped`. Panics when the harness does (a liveness failure: the cell did not
/// converge within its budget, or a workload call the harness needs never succeeded).
pub fn run(seed: u64, dropped: &BTreeSet<usize>) -> Report {
    let (swarm, full) = plan_now(seed);
    let schedule: Vec<(usize, Step)> =
        full.into_iter().enumerate().filter(|(index, _)| !dropped.contains(index)).collect();
    if across_cells() {
        return run_moves(seed, swarm, schedule, replay(seed, dropped));
    }
    run_schedule(seed, swarm, schedule, replay(seed, dropped))
}

/// Runs the workload across cells ([`moves`]) from `seed` under `schedule`.
pub fn run_moves(seed: u64, swarm: Swarm, schedule: Vec<(usize, Step)>, replay: String) -> Report {
    let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    runtime.block_on(async move {
        let mut cluster = Cluster::with_cells(&moves::CELLS, swarm.timing(), false);
        cluster.set_replay(replay);
        let steps: Vec<Step> = schedule.iter().map(|(_, step)| step.clone()).collect();
        let outcome = moves::run(&mut cluster, &steps).await;
        let evidence = moves::evidence(&cluster, &outcome);
        let mut liveness = outcome.liveness.clone();
        if outcome.moves == 0 {
            let why = "no move of the stream finished".to_string();
            liveness = Some(liveness.map_or(why.clone(), |earlier| format!("{earlier}; {why}")));
        }
        Report {
            seed,
            swarm,
            schedule,
            violations: check_all(&evidence),
            liveness,
            acknowledged: cluster.history().acknowledged_in(moves::STREAM).len(),
            trace: cluster.trace().render(),
            history: cluster.history().render(),
        }
    })
}

/// Runs the mixed workload from `seed` under `schedule` (each step with its index in the schedule it came from),
/// with `swarm`'s snapshot interval and log kept behind a snapshot; `replay` is the command a failure prints.
pub fn run_schedule(seed: u64, swarm: Swarm, schedule: Vec<(usize, Step)>, replay: String) -> Report {
    let runtime = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
    runtime.block_on(async move {
        let mut cluster = Cluster::with_timing(3, swarm.timing());
        cluster.set_replay(replay);
        let steps: Vec<Step> = schedule.iter().map(|(_, step)| step.clone()).collect();
        let outcome = mixed::run(&mut cluster, &steps).await;
        let evidence = mixed::evidence(&cluster, &outcome);
        Report {
            seed,
            swarm,
            schedule,
            violations: check_all(&evidence),
            liveness: outcome.liveness,
            acknowledged: cluster.history().acknowledged_in(mixed::STREAM).len(),
            trace: cluster.trace().render(),
            history: cluster.history().render(),
        }
    })
}
