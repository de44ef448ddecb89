//! Raft between the nodes of a cell over gRPC (`cellog.raft.v1.Raft`). Each call carries one openraft message,
//! postcard-encoded with a crc32c; a receiver refuses a message that fails the check or comes from another cell.

use std::sync::Arc;
use std::time::Duration;

use cellog_proto::raft::RaftMessage;
use cellog_proto::raft::raft_client::RaftClient;
use cellog_proto::raft::raft_server::Raft as RaftRpc;
use cellog_raft::storage::Storage;
use cellog_raft::{CellNode, NodeAddrs, NodeId, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// Largest Raft message on the wire (a batch of entries or a snapshot chunk).
pub const MAX_RAFT_MESSAGE: usize = 64 * 1024 * 1024;

/// How long a node waits to connect to a peer before counting it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Frames a value as a message of `cell`: postcard, its crc32c and the cell's name.
pub fn frame_message<T: Serialize>(cell: &str, value: &T) -> Result<RaftMessage, postcard::Error> {
    let payload = postcard::to_allocvec(value)?;
    Ok(RaftMessage { cell: cell.to_string(), crc32c: crc32c::crc32c(&payload), payload: payload.into() })
}

/// Why a Raft message was refused.
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

/// Unframes a message, checking its cell and checksum.
pub fn unframe_message<T: DeserializeOwned>(cell: &str, message: &RaftMessage) -> Result<T, FrameError> {
    if message.cell != cell {
        return Err(FrameError::WrongCell { expected: cell.to_string(), got: message.cell.clone() });
    }
    let computed = crc32c::crc32c(&message.payload);
    if computed != message.crc32c {
        return Err(FrameError::Checksum { carried: message.crc32c, computed });
    }
    Ok(postcard::from_bytes(&message.payload)?)
}

/// How a node reaches its peers.
#[derive(Clone, Debug)]
pub struct GrpcNetwork {
    cell: Arc<str>,
}

impl GrpcNetwork {
    /// The network of a node of `cell`.
    pub fn new(cell: impl Into<Arc<str>>) -> Self {
        GrpcNetwork { cell: cell.into() }
    }
}

/// A node's connection to one peer.
pub struct PeerConnection {
    cell: Arc<str>,
    target: NodeId,
    client: Result<RaftClient<Channel>, String>,
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddrs) -> PeerConnection {
        let client = Endpoint::from_shared(format!("http://{}", node.raft_addr))
            .map(|endpoint| {
                let channel = endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).connect_lazy();
                RaftClient::new(channel)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            })
            .map_err(|error| format!("bad peer address {:?}: {error}", node.raft_addr));
        PeerConnection { cell: self.cell.clone(), target, client }
    }
}

/// A transport failure: the peer may not have seen the message.
fn unreachable<E: std::fmt::Display>(error: E) -> Unreachable {
    Unreachable::new(&std::io::Error::other(error.to_string()))
}

impl PeerConnection {
    /// Sends `request` with `call` and unframes the peer's `Result<R, E>`.
    async fn call<Q, R, E, F, Fut>(
        &mut self,
        request: &Q,
        option: &RPCOption,
        call: F,
    ) -> Result<R, RPCError<NodeId, NodeAddrs, E>>
    where
        Q: Serialize,
        R: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
        F: FnOnce(RaftClient<Channel>, Request<RaftMessage>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<RaftMessage>, Status>>,
    {
        let client = self.client.clone().map_err(|error| RPCError::Unreachable(unreachable(error)))?;
        let message =
            frame_message(&self.cell, request).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let mut request = Request::new(message);
        request.set_timeout(option.hard_ttl());
        let response = call(client, request).await.map_err(|status| match status.code() {
            tonic::Code::Unavailable | tonic::Code::Cancelled => RPCError::Unreachable(unreachable(status)),
            _ => RPCError::Network(NetworkError::new(&status)),
        })?;
        let answer: Result<R, E> = unframe_message(&self.cell, response.get_ref())
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId>>> {
        self.call(&rpc, &option, |mut client, request| async move { client.append_entries(request).await }).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(&rpc, &option, |mut client, request| async move { client.install_snapshot(request).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, NodeAddrs, RaftError<NodeId>>> {
        self.call(&rpc, &option, |mut client, request| async move { client.vote(request).await }).await
    }
}

/// The receiving side: hands each message to the local node.
pub struct RaftService<S> {
    cell: Arc<str>,
    node: Arc<CellNode<S>>,
}

impl<S> RaftService<S> {
    /// The service of `node` in `cell`.
    pub fn new(cell: impl Into<Arc<str>>, node: Arc<CellNode<S>>) -> Self {
        RaftService { cell: cell.into(), node }
    }

    fn unframe<T: DeserializeOwned>(&self, request: &Request<RaftMessage>) -> Result<T, Status> {
        unframe_message(&self.cell, request.get_ref()).map_err(|error| {
            tracing::warn!(%error, "refused a raft message");
            Status::invalid_argument(error.to_string())
        })
    }

    fn answer<T: Serialize>(&self, answer: &T) -> Result<Response<RaftMessage>, Status> {
        frame_message(&self.cell, answer).map(Response::new).map_err(|error| Status::internal(error.to_string()))
    }
}

#[tonic::async_trait]
impl<S: Storage + Clone> RaftRpc for RaftService<S> {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = self.unframe(&request)?;
        self.answer(&self.node.raft.append_entries(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = self.unframe(&request)?;
        self.answer(&self.node.raft.install_snapshot(rpc).await)
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc: VoteRequest<NodeId> = self.unframe(&request)?;
        self.answer(&self.node.vote(rpc).await)
    }
}
