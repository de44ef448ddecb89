//! The openraft type configuration of a cell: what a log entry carries and what applying it answers.

use std::sync::{Arc, Mutex};

use cellog_core::{Command, Millis, Outcome, Rejection};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::in_log::Placed;

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
    /// Who waits for the answers, on the node that proposed the entry: in memory only, never stored nor sent.
    #[serde(skip)]
    pub(crate) waiting: Waiting,
    /// Where its payloads are in its stored encoding, once the log store wrote it (see [`crate::in_log`]): in memory
    /// only, never stored nor sent.
    #[serde(skip)]
    pub(crate) placed: Placed,
}

impl Request {
    /// The entry of `commands` stamped `at`, with nobody waiting for its answers.
    pub fn new(at: Millis, commands: Vec<Command>) -> Self {
        Request { at, commands, waiting: Waiting::default(), placed: Placed::default() }
    }
}

/// The proposers of an entry, waiting on the node that proposed it for each command's answer, in order. The entry
/// keeps them (shared by its clones) while it is in memory, so the state machine answers them as it applies the entry,
/// without the hops through Raft's responder; whatever takes them first answers them (see `node::pack_proposals`).
/// An entry read back from the store, or received from a leader, has nobody waiting.
#[derive(Clone, Default)]
pub(crate) struct Waiting(Option<Arc<Mutex<Option<Proposers>>>>);

/// Who proposed an entry, and its place among the entries in flight.
pub(crate) struct Proposers {
    /// Where each command's answer goes, in order.
    pub(crate) replies: Vec<oneshot::Sender<ProposeResult>>,
    /// Held until the proposers are answered: the next entry is proposed once this one is applied.
    pub(crate) in_flight: OwnedSemaphorePermit,
}

impl Proposers {
    /// Answers each proposer with its command's result, in order, and lets the next entry be proposed. A proposer
    /// that stopped waiting does not need its answer.
    pub(crate) fn answer(self, results: Vec<Result<Outcome, Rejection>>) {
        let Proposers { replies, in_flight } = self;
        drop(in_flight);
        if replies.len() != results.len() {
            let error = format!("{} commands were answered with {} results", replies.len(), results.len());
            return Proposers::fail_all(replies, &ProposeError::Raft(error));
        }
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(Ok(result));
        }
    }

    /// Tells every proposer why there is no answer, and lets the next entry be proposed.
    pub(crate) fn fail(self, error: ProposeError) {
        let Proposers { replies, in_flight } = self;
        drop(in_flight);
        Proposers::fail_all(replies, &error);
    }

    fn fail_all(replies: Vec<oneshot::Sender<ProposeResult>>, error: &ProposeError) {
        for reply in replies {
            let _ = reply.send(Err(error.clone()));
        }
    }
}

impl Waiting {
    pub(crate) fn new(proposers: Proposers) -> Self {
        Waiting(Some(Arc::new(Mutex::new(Some(proposers)))))
    }

    /// The proposers, unless another holder of this entry took them already.
    pub(crate) fn take(&self) -> Option<Proposers> {
        let slot = self.0.as_ref()?;
        slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

/// Who waits is not what the entry says: two entries are equal whoever waits for them.
impl PartialEq for Waiting {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Waiting {}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Waiting" } else { "Nobody" })
    }
}

/// What applying an entry answers the proposers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A blank or membership entry: nothing for a client.
    Empty,
    /// The cell's answer to each command, in order.
    Applied(Vec<Result<Outcome, Rejection>>),
    /// The cell's answers went to the proposers waiting on this node as the entry was applied (see [`Waiting`]).
    Answered,
    /// Not applied: this node halted applying at `index`, as its operator asked ([`crate::apply_control`]).
    Halted {
        /// The first index not applied.
        index: u64,
    },
    /// Passed over as the operator asked: none of its commands was applied ([`crate::apply_control`]).
    Skipped {
        /// The entry's index.
        index: u64,
        /// The entry's term.
        term: u64,
    },
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

/// Why a proposal got no answer from the cell.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader (the leader's id and address, when known).
    #[error("not the leader; the leader is {leader:?}")]
    NotLeader {
        /// The leader, if this node knows it.
        leader: Option<(NodeId, NodeAddrs)>,
    },
    /// The command was handed to Raft, and leadership moved before it committed. The next leader may still commit
    /// it: the outcome is unknown (the new leader's id and address, when known).
    #[error(
        "leadership moved while the command was being committed; it may still be applied. The leader is {leader:?}"
    )]
    LeaderChanged {
        /// The new leader, if this node knows it.
        leader: Option<(NodeId, NodeAddrs)>,
    },
    /// Raft stopped or failed; the outcome of the proposal is unknown.
    #[error("raft: {0}")]
    Raft(String),
    /// The store's device has less free space than the node's watermark: a write that would grow the store was
    /// refused, and nothing was queued.
    #[error("the disk has {free} bytes free, below this node's watermark of {min}")]
    StorageFull {
        /// Bytes free.
        free: u64,
        /// The watermark.
        min: u64,
    },
    /// Too few voters have room on their disks for a quorum: the peers named are below their free-space watermarks and
    /// take no entries, so a write that would grow the store was refused, and nothing was queued.
    #[error("nodes {low:?} are below their disks' watermarks; too few voters have room to commit a write")]
    QuorumStorageFull {
        /// The voters without room (this node among them if it is one).
        low: Vec<NodeId>,
    },
    /// This node stopped applying entries at `index`, as its operator asked (`--halt-apply-at`): it takes no write
    /// and no linearizable read until it is restarted without the halt. Refused before the log: nothing was written.
    #[error(
        "this node stopped applying at entry {index}, as its operator asked (--halt-apply-at); it takes no write \
         and no linearizable read until it restarts without the halt; nothing was written"
    )]
    ApplyHalted {
        /// The first index not applied.
        index: u64,
    },
    /// The entry holding the command was passed over, as the operator asked (`--skip-entry`): the command was not
    /// applied, and is not.
    #[error(
        "entry {index} (term {term}) was passed over, as the operator asked (--skip-entry); its commands were not \
         applied"
    )]
    EntrySkipped {
        /// The entry's index.
        index: u64,
        /// The entry's term.
        term: u64,
    },
}

impl ProposeError {
    /// A command whose entry reached the log of a node that halted before it: it is applied once the node restarts
    /// without the halt (unless that entry is passed over), so its outcome is unknown.
    pub(crate) fn halted_in_log(index: u64) -> Self {
        ProposeError::Raft(format!(
            "this node stopped applying at entry {index}, as its operator asked (--halt-apply-at); the command is in \
             the log, and is applied once the node restarts without the halt"
        ))
    }
}

/// A proposal's answer: the cell's, or why there is none.
pub(crate) type ProposeResult = Result<Result<Outcome, Rejection>, ProposeError>;

pub(crate) fn stopping() -> ProposeError {
    ProposeError::Raft("the node is stopping".to_string())
}

/// The answer to a submitted command, once its entry is committed and applied.
#[must_use = "the answer says whether the command was applied"]
pub struct Answer(pub(crate) oneshot::Receiver<ProposeResult>);

impl Answer {
    /// Waits for the answer.
    pub async fn wait(self) -> ProposeResult {
        self.0.await.map_err(|_| stopping())?
    }
}
