//! Raft between the nodes of a cell, whatever carries it. openraft's messages leave as [`Frame`]s (postcard, a
//! crc32c, the cell's name) through a [`Link`] the transport provides, and a frame from a peer is answered by
//! [`CellNode::answer`]; a frame that fails its checksum or names another cell is refused, never applied. The
//! transport (gRPC in `cellog-net`, madsim's network in simulation) moves bytes and names no openraft type.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::error::{NetworkError, RPCError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::node::CellNode;
use crate::storage::Storage;
use crate::types::{NodeAddrs, NodeId, TypeConfig};

/// The three calls between the nodes of a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    /// Log entries (or a heartbeat) from the leader.
    AppendEntries,
    /// One chunk of a snapshot, for a follower too far behind for the log.
    InstallSnapshot,
    /// Leader election.
    Vote,
}

/// One Raft message on the wire: a request, or the receiver's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The cell of the sender.
    pub cell: String,
    /// crc32c of `payload`.
    pub crc32c: u32,
    /// The postcard encoding of the message.
    pub payload: Bytes,
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// It came from another cell.
    #[error("message for cell {got:?}, this is cell {expected:?}")]
    WrongCell {
        /// The receiver's cell.
        expected: String,
        /// The sender's.
        got: String,
    },
    /// Its checksum does not match: it was damaged on the way.
    #[error("checksum mismatch: carried {carried:08x}, computed {computed:08x}")]
    Checksum {
        /// What it carried.
        carried: u32,
        /// What its payload sums to.
        computed: u32,
    },
    /// It does not decode.
    #[error("malformed: {0}")]
    Malformed(#[from] postcard::Error),
}

/// Frames `value` as a message of `cell`.
pub fn frame_message<T: Serialize>(cell: &str, value: &T) -> Result<Frame, postcard::Error> {
    let payload = postcard::to_allocvec(value)?;
    Ok(Frame { cell: cell.to_string(), crc32c: crc32c::crc32c(&payload), payload: payload.into() })
}

/// Unframes a message, checking its cell and checksum.
pub fn unframe_message<T: DeserializeOwned>(cell: &str, frame: &Frame) -> Result<T, FrameError> {
    if frame.cell != cell {
        return Err(FrameError::WrongCell { expected: cell.to_string(), got: frame.cell.clone() });
    }
    let computed = crc32c::crc32c(&frame.payload);
    if computed != frame.crc32c {
        return Err(FrameError::Checksum { carried: frame.crc32c, computed });
    }
    Ok(postcard::from_bytes(&frame.payload)?)
}

/// Why a call to a peer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The peer could not be reached (or did not answer): it may not have seen the message.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The call failed otherwise.
    #[error("{0}")]
    Failed(String),
}

/// A connection to one peer, as the transport provides it.
pub trait Link: Send + Sync + 'static {
    /// Sends `frame` as `rpc` and returns the peer's answer, giving up after `timeout`.
    fn call(
        &mut self,
        rpc: Rpc,
        frame: Frame,
        timeout: Duration,
    ) -> impl Future<Output = Result<Frame, LinkError>> + Send;
}

/// How a node reaches its peers, as the transport provides it.
pub trait Links: Send + Sync + 'static {
    /// A connection to one peer.
    type Link: Link;

    /// A connection to peer `target`, reached at `addrs` (made lazily: an unusable address fails its calls).
    fn link(&mut self, target: NodeId, addrs: &NodeAddrs) -> Self::Link;
}

/// openraft's network over the links of a transport.
pub struct Network<L> {
    cell: Arc<str>,
    links: L,
}

impl<L: Links> Network<L> {
    /// The network of a node of `cell`.
    pub fn new(cell: impl Into<Arc<str>>, links: L) -> Self {
        Network { cell: cell.into(), links }
    }
}

/// A node's connection to one peer.
pub struct Connection<K> {
    cell: Arc<str>,
    target: NodeId,
    link: K,
}

impl<L: Links> RaftNetworkFactory<TypeConfig> for Network<L> {
    type Network = Connection<L::Link>;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddrs) -> Self::Network {
        Connection { cell: self.cell.clone(), target, link: self.links.link(target, node) }
    }
}

fn io_error(message: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(message.to_string())
}

impl<K: Link> Connection<K> {
    /// Sends `request` as `rpc` and unframes the peer's `Result<R, E>`.
    async fn call<Q, R, E>(
        &mut self,
        rpc: Rpc,
        request: &Q,
        option: &RPCOption,
    ) -> Result<R, RPCError<NodeId, NodeAddrs, E>>
    where
        Q: Serialize,
        R: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let frame = frame_message(&self.cell, request).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let answer = self.link.call(rpc, frame, option.hard_ttl()).await.map_err(|error| match error {
            LinkError::Unreachable(message) => RPCError::Unreachable(Unreachable::new(&io_error(message))),
            LinkError::Failed(message) => RPCError::Network(NetworkError::new(&io_error(message))),
        })?;
        let answer: Result<R, E> =
            unframe_message(&self.cell, &answer).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

impl<K: Link> RaftNetwork<TypeConfig> for Connection<K> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddrs, openraft::error::RaftError<NodeId>>> {
        self.call(Rpc::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, NodeAddrs, openraft::error::RaftError<NodeId, openraft::error::InstallSnapshotError>>,
    > {
        self.call(Rpc::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddrs, openraft::error::RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}

/// Why a frame from a peer got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The frame was refused (another cell, damaged, malformed): nothing was applied.
    #[error(transparent)]
    Refused(#[from] FrameError),
    /// The answer could not be framed.
    #[error("the answer could not be encoded: {0}")]
    Unencodable(postcard::Error),
}

impl<S: Storage + Clone> CellNode<S> {
    /// Answers a framed Raft message from a peer of cell `cell`: checks it, hands it to Raft (a vote to
    /// [`CellNode::vote`], which a repairing node refuses), and frames Raft's result.
    pub async fn answer(&self, cell: &str, rpc: Rpc, frame: &Frame) -> Result<Frame, AnswerError> {
        let framed = match rpc {
            Rpc::AppendEntries => {
                let request: AppendEntriesRequest<TypeConfig> = unframe_message(cell, frame)?;
                frame_message(cell, &self.raft.append_entries(request).await)
            }
            Rpc::InstallSnapshot => {
                let request: InstallSnapshotRequest<TypeConfig> = unframe_message(cell, frame)?;
                frame_message(cell, &self.raft.install_snapshot(request).await)
            }
            Rpc::Vote => {
                let request: VoteRequest<NodeId> = unframe_message(cell, frame)?;
                frame_message(cell, &self.vote(request).await)
            }
        };
        framed.map_err(AnswerError::Unencodable)
    }
}
