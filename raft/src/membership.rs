//! The cell's membership as a node's callers see it: a view of the members and this node's Raft state, and the
//! changes an operator makes (add a learner, promote it, remove a node), with errors of their own, so that nothing
//! outside this crate names an openraft type.

use std::collections::BTreeSet;

use openraft::ChangeMembers;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};

use crate::node::CellNode;
use crate::storage::Storage;
use crate::types::{NodeAddrs, NodeId};

/// One member of the cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its id.
    pub id: NodeId,
    /// Where it is reached.
    pub addrs: NodeAddrs,
    /// A voter (or else a learner).
    pub voter: bool,
    /// The last log index the leader knows it holds (known on the leader only).
    pub matched_index: Option<u64>,
}

/// The cell as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    /// This node.
    pub node_id: NodeId,
    /// Its Raft role: `Leader`, `Follower`, `Candidate`, `Learner`, `Shutdown`.
    pub role: String,
    /// Whether it leads.
    pub leading: bool,
    /// Its term.
    pub term: u64,
    /// The leader, with its addresses, when known.
    pub leader: Option<(NodeId, Option<NodeAddrs>)>,
    /// Its last log index.
    pub last_log_index: Option<u64>,
    /// Its last applied index.
    pub applied_index: Option<u64>,
    /// Every member, by id.
    pub members: Vec<Member>,
    /// Whether it is catching up entries its storage lost.
    pub repairing: bool,
    /// Where it stopped applying entries, as its operator asked (`--halt-apply-at`), once it did.
    pub apply_halted_at: Option<u64>,
}

/// Why a membership change was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// This node does not lead (the leader's id and address, when known).
    #[error("not the leader")]
    NotLeader {
        /// The leader, if this node knows it.
        leader: Option<(NodeId, NodeAddrs)>,
    },
    /// Another change (or a new leader's own membership) is still being committed: retry shortly.
    #[error("{0}")]
    Changing(String),
    /// The change is not allowed (removing the last voter, promoting a node that is not a learner, ...).
    #[error("{0}")]
    Refused(String),
    /// Raft stopped or failed; whether the change was made is unknown.
    #[error("raft: {0}")]
    Raft(String),
}

fn membership_error(error: RaftError<NodeId, ClientWriteError<NodeId, NodeAddrs>>) -> MembershipError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            MembershipError::NotLeader { leader: forward.leader_id.zip(forward.leader_node) }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error @ ChangeMembershipError::InProgress(_))) => {
            MembershipError::Changing(error.to_string())
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
            MembershipError::Refused(error.to_string())
        }
        other => MembershipError::Raft(other.to_string()),
    }
}

impl<S: Storage + Clone> CellNode<S> {
    /// Whether node `id` is a member of the cell as this node sees it, or may be one because this node knows no
    /// membership yet (a node not founded nor joined). Reads the metrics in place: a door asks it of every call.
    pub fn may_be_member(&self, id: NodeId) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.get_node(&id).is_some() || membership.nodes().next().is_none()
    }

    /// The cell as this node sees it now.
    pub fn cluster_view(&self) -> ClusterView {
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let matched = metrics.replication.clone().unwrap_or_default();
        let members = membership
            .nodes()
            .map(|(id, addrs)| Member {
                id: *id,
                addrs: addrs.clone(),
                voter: voters.contains(id),
                matched_index: matched.get(id).and_then(|log_id| log_id.map(|log_id| log_id.index)),
            })
            .collect();
        let leader = metrics.current_leader.map(|leader| (leader, membership.get_node(&leader).cloned()));
        ClusterView {
            node_id: self.id,
            role: format!("{:?}", metrics.state),
            leading: metrics.state.is_leader(),
            term: metrics.current_term,
            leader,
            last_log_index: metrics.last_log_index,
            // Raft is told a halted entry is done; the replica stops before it.
            applied_index: match self.halted_at() {
                Some(halted_at) => halted_at.checked_sub(1),
                None => metrics.last_applied.map(|log_id| log_id.index),
            },
            members,
            repairing: self.is_repairing(),
            apply_halted_at: self.halted_at(),
        }
    }

    /// Adds node `id` as a learner, reached at `addrs`, and waits until it has caught up.
    pub async fn add_learner(&self, id: NodeId, addrs: NodeAddrs) -> Result<(), MembershipError> {
        self.raft.add_learner(id, addrs, true).await.map_err(membership_error)?;
        Ok(())
    }

    /// Makes learner `id` a voter.
    pub async fn promote(&self, id: NodeId) -> Result<(), MembershipError> {
        let change = ChangeMembers::AddVoterIds([id].into_iter().collect());
        self.raft.change_membership(change, false).await.map_err(membership_error)?;
        Ok(())
    }

    /// Removes node `id` from the cell, voter or learner.
    pub async fn remove(&self, id: NodeId) -> Result<(), MembershipError> {
        let is_voter = self.raft.metrics().borrow().membership_config.membership().voter_ids().any(|v| v == id);
        let ids = [id].into_iter().collect();
        let change = if is_voter { ChangeMembers::RemoveVoters(ids) } else { ChangeMembers::RemoveNodes(ids) };
        self.raft.change_membership(change, false).await.map_err(membership_error)?;
        Ok(())
    }
}
