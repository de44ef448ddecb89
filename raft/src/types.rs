//! The openraft type configuration of a cell: what a log entry carries and what applying it answers.

use cellog_core::{Command, Millis, Outcome, Rejection};
use serde::{Deserialize, Serialize};

/// A node's id within a cell.
pub type NodeId = u64;

/// Where a node of the cell is reached: its peer (Raft) address and its client address. Membership carries it, so
/// every node can tell a client where the leader is.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeAddrs {
    /// The address other nodes send Raft messages to.
    pub raft_addr: String,
    /// The address clients connect to.
    pub client_addr: String,
}

impl NodeAddrs {
    /// A node reached at `raft_addr` by its peers and at `client_addr` by clients.
    pub fn new(raft_addr: impl Into<String>, client_addr: impl Into<String>) -> Self {
        NodeAddrs { raft_addr: raft_addr.into(), client_addr: client_addr.into() }
    }
}

impl std::fmt::Display for NodeAddrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "raft {} client {}", self.raft_addr, self.client_addr)
    }
}

/// What a log entry carries: commands for the cell and the time the leader stamped on them. Concurrent proposals
/// share one entry, so one fsync on each node commits them all (group commit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The leader's clock when it proposed the commands, in cell milliseconds. The cell clamps it so that time never
    /// goes backwards across leaders.
    pub at: Millis,
    /// The commands, applied in order.
    pub commands: Vec<Command>,
}

/// What applying an entry answers the proposers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A blank or membership entry: nothing for a client.
    Empty,
    /// The cell's answer to each command, in order.
    Applied(Vec<Result<Outcome, Rejection>>),
}

openraft::declare_raft_types!(
    /// The type configuration of a cell's Raft group.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = NodeAddrs,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = crate::snapshot_transfer::SnapshotData,
        AsyncRuntime = crate::runtime::CellRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// A cell's Raft instance.
pub type Raft = openraft::Raft<TypeConfig>;
/// A log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id.
pub type LogId = openraft::LogId<NodeId>;
/// openraft's storage error for this config.
pub type RaftStorageError = openraft::StorageError<NodeId>;
