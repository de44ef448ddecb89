//! The deterministic simulation harness: cellog nodes running the production node code (`cellog-net`'s
//! `RunningNode`, over `cellog-raft` and `cellog-core`) on madsim's runtime and network, each on a simulated disk
//! that the harness owns, so it survives crashes and restarts. Clients are the real client library, running on a node
//! of their own. Nothing in a node knows it is simulated.
//!
//! Everything here exists only under `--cfg madsim`; in other builds the crate is empty.

#[cfg(madsim)]
mod cluster;

#[cfg(madsim)]
pub use cluster::{Cluster, SIM_SNAPSHOT_EVERY, SimNodeId};
