//! The deterministic simulation harness: cellog nodes running the production node code (`cellog-net`'s
//! `RunningNode`, over `cellog-raft` and `cellog-core`) on madsim's runtime and network, each on a simulated disk and
//! clock that the harness owns, so they survive crashes and restarts. Clients are the real client library, running on
//! a machine of their own. Nothing in a node knows it is simulated.
//!
//! - [`Cluster`]: the cell and the vocabulary to hurt it (`cluster.node(2).crash()`, `partition`, `power_fail`, ...).
//! - [`trace`]: one line per state transition, in simulated time, hashed into `trace_hash`.
//! - [`history`]: every client operation, invoked and completed (ok, fail, or unknown), recorded as it happens into
//!   `cellog-check`'s types, which its checkers read.
//! - [`seeds`]: one seed per run, one random stream per concern.
//! - [`workload`]: producers, consumers and transactional producers that record into the history.
//! - [`fault`]: faults and schedules of them as plain data, and `Cluster::inject` / `run_schedule` / `heal_all`.
//! - [`mixed`]: the mixed workload `ci/sim-run` and the chaos sweeps run under a schedule.
//!
//! Everything here but [`history`] and [`workload`] exists only under `--cfg madsim`; those two also drive real node
//! processes (`faults/`), with a clock of their own.

/// Every simulation (the tests, `sim-run`, the chaos sweeps) allocates through jemalloc: a simulated cell's nodes,
/// client and network all allocate and free per message on one thread. With glibc's allocator, `examples/speed` ran
/// 11–12× real time with a snapshot every 500 entries and 19–24× with production's interval; with jemalloc 16–17× and
/// 26–27× (four interleaved rounds each; one round of the latter measured 15× against 20×).
#[cfg(madsim)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(madsim)]
mod cluster;
#[cfg(madsim)]
pub mod fault;
pub mod history;
#[cfg(madsim)]
pub mod mixed;
#[cfg(madsim)]
pub mod moves;
#[cfg(madsim)]
pub mod seeds;
#[cfg(madsim)]
pub mod trace;
pub mod workload;

#[cfg(madsim)]
pub use cellog_check::Stored;
#[cfg(madsim)]
pub use cluster::{
    Cluster, NetworkFaults, NodeCtl, SIM_CELL, SIM_SNAPSHOT_EVERY, SimNodeId, seed_openssl_outside_the_simulation,
    sim_retry,
};
