//! The openraft type configuration of a cell: what a log entry carries and what applying it answers.

use std::io::Cursor;

use cellog_core::{Command, Millis, Outcome, Rejection};
use serde::{Deserialize, Serialize};

/// A node's id within a cell.
pub type NodeId = u64;

/// A node's address, as the network layer knows it.
pub type Node = openraft::BasicNode;

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
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
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
