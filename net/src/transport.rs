//! Raft between the nodes of a cell over gRPC (`cellog.raft.v1.Raft`): each call carries one frame of
//! [`cellog_raft::network`] (an openraft message, postcard with a crc32c and the cell's name). This file moves bytes;
//! framing, checking and answering are the raft crate's.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellog_proto::raft::RaftMessage;
use cellog_proto::raft::raft_client::RaftClient;
use cellog_proto::raft::raft_server::Raft as RaftRpc;
use cellog_raft::network::{AnswerError, CellId, CellIdentity, Frame, Link, LinkError, Links, Network, Rpc};
use cellog_raft::storage::Storage;
use cellog_raft::{CellNode, NodeAddrs, NodeId};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;

/// Largest Raft message on the wire: a frame of at most `MAX_MESSAGE_BYTES` (a batch of entries or a snapshot chunk;
/// raft sends fewer entries rather than more) and the call's own fields.
pub const MAX_RAFT_MESSAGE: usize = cellog_raft::network::MAX_MESSAGE_BYTES + 64 * 1024;

/// How long a node waits to connect to a peer before counting it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn to_wire(frame: Frame) -> RaftMessage {
    let cell_id = frame.cell_id.map_or_else(Bytes::new, |id| Bytes::copy_from_slice(&id.0.to_le_bytes()));
    RaftMessage { cell: frame.cell, crc32c: frame.crc32c, payload: frame.payload, cell_id }
}

/// The frame a message carries; a cell id that is not 16 bytes is malformed.
fn from_wire(message: RaftMessage) -> Result<Frame, Status> {
    let cell_id = match message.cell_id.len() {
        0 => None,
        _ => Some(CellId(u128::from_le_bytes(
            message.cell_id[..].try_into().map_err(|_| Status::invalid_argument("a cell id is 16 bytes"))?,
        ))),
    };
    Ok(Frame { cell: message.cell, cell_id, crc32c: message.crc32c, payload: message.payload })
}

/// The network of a node of `cell`, over gRPC.
pub fn grpc_network(cell: CellIdentity) -> Network<GrpcLinks> {
    Network::new(cell, GrpcLinks)
}

/// Connections to peers over gRPC.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcLinks;

/// A connection to one peer over gRPC (`Err`: its address is unusable).
pub struct GrpcLink(Result<RaftClient<Channel>, String>);

impl Links for GrpcLinks {
    type Link = GrpcLink;

    fn link(&mut self, _target: NodeId, addrs: &NodeAddrs) -> GrpcLink {
        let client = Endpoint::from_shared(format!("http://{}", addrs.raft_addr))
            .map(|endpoint| {
                let channel = endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true).connect_lazy();
                RaftClient::new(channel)
                    .max_decoding_message_size(MAX_RAFT_MESSAGE)
                    .max_encoding_message_size(MAX_RAFT_MESSAGE)
            })
            .map_err(|error| format!("bad peer address {:?}: {error}", addrs.raft_addr));
        GrpcLink(client)
    }
}

impl Link for GrpcLink {
    async fn call(&mut self, rpc: Rpc, frame: Frame, timeout: Duration) -> Result<Frame, LinkError> {
        let mut client = self.0.clone().map_err(LinkError::Unreachable)?;
        let mut request = Request::new(to_wire(frame));
        request.set_timeout(timeout);
        let response = match rpc {
            Rpc::AppendEntries => client.append_entries(request).await,
            Rpc::InstallSnapshot => client.install_snapshot(request).await,
            Rpc::Vote => client.vote(request).await,
        };
        match response {
            Ok(response) => from_wire(response.into_inner()).map_err(|status| LinkError::Failed(status.to_string())),
            Err(status) => match status.code() {
                tonic::Code::Unavailable | tonic::Code::Cancelled => Err(LinkError::Unreachable(status.to_string())),
                _ => Err(LinkError::Failed(status.to_string())),
            },
        }
    }
}

/// The receiving side: hands each message to the local node.
pub struct RaftService<S> {
    node: Arc<CellNode<S>>,
    metrics: Arc<Metrics>,
}

impl<S: Storage + Clone> RaftService<S> {
    /// The service of `node`, recording into `metrics`.
    pub fn new(node: Arc<CellNode<S>>, metrics: Arc<Metrics>) -> Self {
        RaftService { node, metrics }
    }

    #[allow(clippy::disallowed_methods, reason = "times the gaps between a leader's messages on the runtime's clock")]
    async fn answer(&self, rpc: Rpc, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        if rpc == Rpc::AppendEntries {
            self.metrics.leader_message(tokio::time::Instant::now());
        }
        match self.node.answer(rpc, &from_wire(request.into_inner())?).await {
            Ok(frame) => Ok(Response::new(to_wire(frame))),
            Err(AnswerError::Refused(error)) => {
                tracing::warn!(%error, "refused a raft message");
                Err(Status::invalid_argument(error.to_sender()))
            }
            Err(error @ (AnswerError::Unencodable(_) | AnswerError::Storage(_))) => {
                Err(Status::internal(error.to_string()))
            }
        }
    }
}

#[tonic::async_trait]
impl<S: Storage + Clone> RaftRpc for RaftService<S> {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.answer(Rpc::AppendEntries, request).await
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.answer(Rpc::InstallSnapshot, request).await
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.answer(Rpc::Vote, request).await
    }
}
