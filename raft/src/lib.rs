//! Replication of a cellog cell with openraft.
//!
//! - [`types`]: the type configuration: entries carry a core `Command` and the leader-stamped time.
//! - [`runtime`]: the async runtime openraft runs on, tokio in production and madsim under `--cfg madsim`.
//! - [`storage`]: the one `Storage` trait, its checksummed record format, and its implementations: RocksDB (behind the
//!   `rocksdb` feature, which the simulation build leaves off) and the simulated disk.
//! - [`stored_snapshot`]: the stored state snapshot, in chunks, so that no record grows with the cell.
//! - [`snapshot_transfer`]: a snapshot streamed from the store to a follower's store, memory bounded whatever the
//!   bodies add up to.
//! - [`bodies`]: the cell's message bodies in the storage's bodies space.
//! - [`body_repair`]: a body the node's disk damaged, repaired from a peer's copy while the node runs.
//! - [`log_store`] and [`state_machine`]: openraft's storage traits over `Storage`, the latter applying committed
//!   entries to `cellog-core`.
//! - [`node`]: a running node: Raft over its storage, and the gate that keeps a repairing node from voting.
//! - [`identity`]: which cell a node belongs to: the cell's name and its random id.
//! - [`network`]: Raft messages framed and checked, sent through links a transport provides, and answered.
//! - [`membership`]: the cell as a node sees it, and adding, promoting and removing members, with errors of its own.
//! - [`format`]: the storage format a data directory is written in, checked first, and the migrations from older ones.
//! - [`recovery`]: opening a node's storage after a crash, verifying every record and cutting off a corrupt log
//!   suffix so the node repairs itself from its peers.
//! - [`transition`]: state transitions (applied entries, effects, role, membership, snapshots) as `tracing` events,
//!   which operators read in the log and the simulator collects into its trace.
//!
//! What this crate is not: it carries no bytes between nodes (a transport implements [`network::Links`]; `net`
//! provides gRPC) and decides nothing about messages (the core does). openraft's types stay inside it.

#![allow(clippy::result_large_err, reason = "openraft's storage and network traits fix their (large) error types")]

pub mod apply_control;
pub mod bodies;
pub mod body_repair;
pub mod clock;
pub mod door;
pub mod format;
mod founder;
pub mod founding;
pub mod identity;
pub mod in_log;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod node;
pub mod proposals;
pub mod recovery;
pub mod room;
pub mod runtime;
pub mod snapshot_transfer;
pub mod state_machine;
pub mod storage;
pub mod stored_snapshot;
pub mod timing;
pub mod transition;
pub mod types;

pub use apply_control::ApplyControl;
pub use bodies::{BodyError, StoredBodies};
pub use clock::{Clock, SystemClock};
pub use door::{Admitted, Door};
pub use format::{FormatCheck, STORE_FORMAT};
pub use log_store::LogStore;
pub use membership::{ClusterView, Member, MembershipError};
pub use node::{CellNode, FREE_BYTES_EVERY, Past, StartError};
pub use proposals::{ENTRIES_IN_FLIGHT, MAX_BATCH, MAX_BATCH_BYTES};
pub use recovery::{Recovery, open_stores};
pub use state_machine::{Interrupted, Replica, StateMachineStore};
pub use timing::RaftTiming;
pub use types::{Answer, Entry, LogId, NodeAddrs, NodeId, ProposeError, Raft, Request, Response, TypeConfig};
