//! The node's status (its role, its cell's leader and membership, optionally the state's digest) and the overview
//! the console and metrics read.

#[cfg(not(madsim))]
use cellog_core::{Actor, Scope};
use cellog_proto::v1;
use cellog_raft::storage::Storage;
use tonic::Status;

use super::CellogService;
#[cfg(not(madsim))]
use super::{group_out, lock, sees_consumer, visible_streams};
#[cfg(not(madsim))]
use crate::convert;
#[cfg(not(madsim))]
use crate::status::from_rejection;

/// What the console shows: each visible stream, and the node's view of the cell.
#[cfg(not(madsim))]
pub(crate) type Overview = (Vec<StreamOverview>, v1::ClusterStatusResponse);

/// A stream as the console shows it: its info, its consumers, and its consumer groups.
#[cfg(not(madsim))]
pub(crate) struct StreamOverview {
    pub stream: v1::StreamInfo,
    pub consumers: Vec<v1::ConsumerInfo>,
    pub groups: Vec<v1::GroupInfo>,
}

/// How much of the applied state's digest a status gives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Digest {
    None,
    /// The whole state's.
    Whole,
    /// The whole state's and each part's.
    Parts,
}

impl<S: Storage + Clone> CellogService<S> {
    /// The node's status, without the state's digest.
    pub(super) fn status(&self) -> Result<v1::ClusterStatusResponse, Status> {
        self.status_with(Digest::None)
    }

    /// The node's status, with as much of the state's digest as `digest` asks for. A digest encodes the whole state
    /// under the replica's lock, so only the calls that compare replicas ask for one.
    pub(super) fn status_with(&self, digest: Digest) -> Result<v1::ClusterStatusResponse, Status> {
        let view = self.node.cluster_view();
        let (digest, parts) = match digest {
            Digest::None => (None, Vec::new()),
            Digest::Whole => (Some(self.node.digest().map_err(crate::status::interrupted)?.1), Vec::new()),
            Digest::Parts => {
                let (_, digest, parts) = self.node.digest_parts().map_err(crate::status::interrupted)?;
                (Some(digest), parts)
            }
        };
        let digest_parts =
            parts.into_iter().map(|(part, digest)| v1::DigestPart { part, digest: hex::encode(digest.0) }).collect();
        let nodes = view
            .members
            .into_iter()
            .map(|member| v1::NodeInfo {
                id: member.id,
                raft_addr: member.addrs.raft_addr,
                client_addr: member.addrs.client_addr,
                voter: member.voter,
                matched_index: member.matched_index,
            })
            .collect();
        let leader_addr = view.leader.as_ref().and_then(|(_, addrs)| addrs.as_ref());
        Ok(v1::ClusterStatusResponse {
            node_id: view.node_id,
            state: view.role,
            term: view.term,
            leader_id: view.leader.as_ref().map(|(id, _)| *id),
            leader_addr: leader_addr.map(|addrs| addrs.client_addr.clone()).unwrap_or_default(),
            last_log_index: view.last_log_index,
            applied_index: view.applied_index,
            nodes,
            repairing: view.repairing,
            apply_halted_at: view.apply_halted_at,
            state_digest: digest.map(|digest| hex::encode(digest.0)).unwrap_or_default(),
            digest_parts,
        })
    }

    #[cfg(not(madsim))]
    /// What the console shows, from this node's replica without a read barrier (any node answers, as of what it
    /// applied): the streams `actor` may see with their consumers, and the node's view of the cell.
    pub(crate) fn overview(&self, actor: &Actor) -> Result<Overview, Status> {
        let streams = {
            let replica = lock(&self.node)?;
            let cell = &replica.cell;
            let principal = cell.authenticate(actor).map_err(|rejection| from_rejection(&rejection))?;
            let scope = Scope::of(&principal);
            let streams = visible_streams(cell, actor, true).map_err(|rejection| from_rejection(&rejection))?;
            let mut overview = Vec::with_capacity(streams.len());
            for (info, consumers) in streams {
                let named = info.name.to_string();
                let stored = scope.name_in(&named);
                // The groups the caller may see: those it may consume, or every one for an admin.
                let mut groups = Vec::new();
                for group in cell.group_names(&stored).map_err(|rejection| from_rejection(&rejection))? {
                    if sees_consumer(&stored, &group)(cell, &principal).is_ok() {
                        let group = cell.group_info(&stored, &group, cell.last_at());
                        groups.push(group_out(&named, scope, group.map_err(|rejection| from_rejection(&rejection))?));
                    }
                }
                let consumers =
                    consumers.into_iter().map(|consumer| convert::consumer_info_to_wire(&named, consumer)).collect();
                overview.push(StreamOverview { stream: convert::stream_info_to_wire(info), consumers, groups });
            }
            overview
        };
        Ok((streams, self.status()?))
    }
}
