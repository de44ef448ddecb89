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
use crate::tls::NodeTls;

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

/// The network of a node of `cell`, over gRPC (over mutual TLS with `tls`), timing its `AppendEntries` into
/// `metrics`. A peer dialed over TLS must present a certificate that `revoked` does not name (see [`Revoked`]).
pub fn grpc_network(
    cell: CellIdentity,
    tls: Option<NodeTls>,
    revoked: Revoked,
    metrics: Arc<Metrics>,
) -> Network<GrpcLinks> {
    let name = cell.name().to_string();
    Network::new(cell, GrpcLinks { tls, cell: name, revoked, metrics })
}

/// Whether a serial is revoked, as [`Revoked`] asks its node.
type IsRevokedFn = dyn Fn(&[u8]) -> bool + Send + Sync;

/// Which certificate serials the cell revokes, as the node that dials knows them; nothing until the node is set in
/// (its network is made before it).
#[derive(Clone, Default)]
pub struct Revoked(Arc<std::sync::OnceLock<Box<IsRevokedFn>>>);

impl Revoked {
    /// Asks `node` from now on (without keeping it alive).
    pub fn follow<S: Storage + Clone>(&self, node: &Arc<CellNode<S>>) {
        let node = Arc::downgrade(node);
        let _ = self.0.set(Box::new(move |serial| node.upgrade().is_some_and(|node| node.is_revoked(serial))));
    }

    /// The question a dialer's verifier asks of each peer's serial.
    #[cfg_attr(madsim, allow(dead_code))]
    fn checker(&self) -> Arc<IsRevokedFn> {
        let revoked = self.clone();
        Arc::new(move |serial: &[u8]| revoked.0.get().is_some_and(|is_revoked| is_revoked(serial)))
    }
}

/// Connections to peers over gRPC.
#[derive(Clone)]
pub struct GrpcLinks {
    tls: Option<NodeTls>,
    /// The cell a dialed peer's certificate must name.
    #[cfg_attr(madsim, allow(dead_code))]
    cell: String,
    #[cfg_attr(madsim, allow(dead_code))]
    revoked: Revoked,
    metrics: Arc<Metrics>,
}

/// A connection to one peer over gRPC (`Err`: its address is unusable).
pub struct GrpcLink {
    client: Result<RaftClient<Channel>, String>,
    metrics: Arc<Metrics>,
    /// With TLS, the node's material and the rotation of its certificate the connection dials with: a link made
    /// before the certificate was rotated dials again with the new one. (No TLS in simulation.)
    #[cfg(not(madsim))]
    tls: Option<(NodeTls, u64)>,
    #[cfg(not(madsim))]
    raft_addr: String,
    #[cfg(not(madsim))]
    cell: String,
    #[cfg(not(madsim))]
    revoked: Revoked,
}

/// A client of the peer port at `raft_addr` (connected at its first call), over TLS with `dial`: the node's own
/// dialer, which verifies the peer against the CA as the node has it now, the cell and the revoked certificates.
fn raft_client(dial: Option<Dial<'_>>, raft_addr: &str) -> Result<RaftClient<Channel>, String> {
    let bad = |error: &dyn std::fmt::Display| format!("bad peer address {raft_addr:?}: {error}");
    let endpoint = Endpoint::from_shared(format!("http://{raft_addr}")).map_err(|error| bad(&error))?;
    let endpoint = endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true);
    let channel = match dial {
        #[cfg(not(madsim))]
        Some(dial) => {
            let config = dial.tls.dial(dial.cell, dial.revoked.checker()).map_err(|error| bad(&error))?;
            endpoint.connect_with_connector_lazy(dialer::Dialer::new(config, raft_addr).map_err(|error| bad(&error))?)
        }
        #[cfg(madsim)]
        Some(_) => return Err("no TLS in simulation".to_string()),
        None => endpoint.connect_lazy(),
    };
    Ok(RaftClient::new(channel).max_decoding_message_size(MAX_RAFT_MESSAGE).max_encoding_message_size(MAX_RAFT_MESSAGE))
}

/// What dialing a peer over TLS needs.
struct Dial<'a> {
    #[cfg_attr(madsim, allow(dead_code))]
    tls: &'a NodeTls,
    #[cfg_attr(madsim, allow(dead_code))]
    cell: &'a str,
    #[cfg_attr(madsim, allow(dead_code))]
    revoked: &'a Revoked,
}

impl GrpcLinks {
    fn dial(&self) -> Option<Dial<'_>> {
        self.tls.as_ref().map(|tls| Dial { tls, cell: &self.cell, revoked: &self.revoked })
    }
}

#[cfg(not(madsim))]
mod dialer {
    //! The connections a node dials to its peers over TLS, made by the node itself (not tonic's TLS) so that its
    //! verifier can refuse a revoked peer and follow a changed CA.

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::ServerName;

    /// Dials one peer address over TLS.
    #[derive(Clone)]
    pub(super) struct Dialer {
        connector: tokio_rustls::TlsConnector,
        addr: String,
        name: ServerName<'static>,
    }

    impl Dialer {
        pub(super) fn new(config: rustls::ClientConfig, addr: &str) -> Result<Self, String> {
            let host = match addr.rsplit_once(':') {
                Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
                None => return Err("an address is host:port".to_string()),
            };
            let name = ServerName::try_from(host.to_string()).map_err(|error| error.to_string())?;
            Ok(Dialer { connector: tokio_rustls::TlsConnector::from(Arc::new(config)), addr: addr.to_string(), name })
        }
    }

    type Connection = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

    impl tower_service::Service<http::Uri> for Dialer {
        type Response = Connection;
        type Error = std::io::Error;
        type Future = Pin<Box<dyn Future<Output = Result<Connection, std::io::Error>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _uri: http::Uri) -> Self::Future {
            let (connector, addr, name) = (self.connector.clone(), self.addr.clone(), self.name.clone());
            Box::pin(async move {
                let stream = tokio::net::TcpStream::connect(&addr).await?;
                stream.set_nodelay(true)?;
                let tls = connector.connect(name, stream).await?;
                Ok(hyper_util::rt::TokioIo::new(tls))
            })
        }
    }
}

impl Links for GrpcLinks {
    type Link = GrpcLink;

    fn link(&mut self, _target: NodeId, addrs: &NodeAddrs) -> GrpcLink {
        GrpcLink {
            client: raft_client(self.dial(), &addrs.raft_addr),
            metrics: self.metrics.clone(),
            #[cfg(not(madsim))]
            tls: self.tls.as_ref().map(|tls| (tls.clone(), tls.generation())),
            #[cfg(not(madsim))]
            raft_addr: addrs.raft_addr.clone(),
            #[cfg(not(madsim))]
            cell: self.cell.clone(),
            #[cfg(not(madsim))]
            revoked: self.revoked.clone(),
        }
    }
}

impl Link for GrpcLink {
    #[allow(clippy::disallowed_methods, reason = "times the round trip of an AppendEntries on the runtime's clock")]
    async fn call(&mut self, rpc: Rpc, frame: Frame, timeout: Duration) -> Result<Frame, LinkError> {
        #[cfg(not(madsim))]
        if let Some((tls, generation)) = &mut self.tls {
            let now = tls.generation();
            if now != *generation {
                *generation = now;
                let dial = Dial { tls, cell: &self.cell, revoked: &self.revoked };
                self.client = raft_client(Some(dial), &self.raft_addr);
            }
        }
        let mut client = self.client.clone().map_err(LinkError::Unreachable)?;
        let mut request = Request::new(to_wire(frame));
        request.set_timeout(timeout);
        let response = match rpc {
            Rpc::AppendEntries => {
                let sent = tokio::time::Instant::now();
                let response = client.append_entries(request).await;
                if response.is_ok() {
                    self.metrics.raft_append_round_trip.observe(sent.elapsed().as_secs_f64());
                }
                response
            }
            Rpc::InstallSnapshot => client.install_snapshot(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::Bodies => client.bodies(request).await,
            Rpc::Founding => client.founding(request).await,
        };
        match response {
            Ok(response) => from_wire(response.into_inner()).map_err(|status| LinkError::Failed(status.to_string())),
            // A peer that answers late is busy (writing a large AppendEntries, say), not gone: openraft backs off from
            // an unreachable one for half a second, in which it sends that peer no heartbeat.
            Err(status) if timed_out(&status) => Err(LinkError::Failed(status.to_string())),
            Err(status) => match status.code() {
                tonic::Code::Unavailable | tonic::Code::Cancelled => Err(LinkError::Unreachable(status.to_string())),
                tonic::Code::ResourceExhausted
                    if cellog_client::status::detail_of(&status).reason == "STORAGE_FULL" =>
                {
                    Err(LinkError::StorageFull(status.message().to_string()))
                }
                _ => Err(LinkError::Failed(status.to_string())),
            },
        }
    }
}

/// Whether a call ended because its deadline passed: tonic answers `CANCELLED` "Timeout expired" on a channel, and
/// `DEADLINE_EXCEEDED` where the deadline travelled with the call (and under simulation).
fn timed_out(status: &Status) -> bool {
    match status.code() {
        tonic::Code::DeadlineExceeded => true,
        // The message of tonic's `TimeoutExpired` (the simulated tonic has no such type to compare with).
        tonic::Code::Cancelled => status.message() == "Timeout expired",
        _ => false,
    }
}

/// The node a peer's certificate names, verified by the peer port's door ([`PeerDoor`]) before the message was read,
/// carried to the service in the request's extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct VerifiedPeer(pub NodeId);

/// The peer port's door, run on a call's headers before its body is read or decoded: with TLS on, the caller's
/// certificate must name a node of this cell (a client certificate, which names a principal, does not) that is a
/// member of it; the node it names goes on to the service, which refuses a message naming another sender. A node
/// that knows no membership yet (the cell is being founded, or it is a learner about to learn it) takes any node of
/// its cell. Without TLS (loopback, or `--insecure`) it admits every call.
#[cfg(not(madsim))]
pub(crate) struct PeerDoor<S> {
    node: Arc<CellNode<S>>,
    /// With TLS on, the cell a peer's certificate must name.
    cell: Option<String>,
}

#[cfg(not(madsim))]
impl<S> Clone for PeerDoor<S> {
    fn clone(&self) -> Self {
        PeerDoor { node: self.node.clone(), cell: self.cell.clone() }
    }
}

#[cfg(not(madsim))]
impl<S: Storage + Clone> PeerDoor<S> {
    /// The door of `node`'s peer port; with `tls_cell`, each call must come with a certificate naming a member of
    /// that cell.
    pub(crate) fn new(node: Arc<CellNode<S>>, tls_cell: Option<String>) -> Self {
        PeerDoor { node, cell: tls_cell }
    }

    /// The member `request`'s certificate names, or why the call is refused (what it tells the caller names nothing
    /// of this cell but what the caller sent).
    fn admit<T>(&self, request: &Request<T>) -> Result<Option<NodeId>, Status> {
        let Some(cell) = &self.cell else { return Ok(None) };
        // One parse of the certificate per call; the cell's state is read without copying it.
        let named = request.peer_certs().and_then(|certs| certs.first().and_then(|cert| crate::tls::Named::read(cert)));
        let Some((named, (their_cell, id))) = named.and_then(|named| named.node().map(|node| (named, node))) else {
            return Err(Status::permission_denied("the peer's certificate names no node of a cell"));
        };
        if self.node.is_revoked(named.serial()) {
            tracing::warn!(node = id, "refused a raft call with a revoked certificate");
            return Err(Status::permission_denied("the peer's certificate is revoked"));
        }
        if their_cell != *cell {
            tracing::warn!(node = id, cell = %their_cell, "refused a raft call from another cell's node");
            return Err(Status::permission_denied("the peer's certificate names no node of this cell"));
        }
        if !self.node.may_be_member(id) {
            tracing::warn!(node = id, "refused a raft call from a node that is not a member");
            return Err(Status::permission_denied(format!("node {id} is not a member of this cell")));
        }
        Ok(Some(id))
    }
}

#[cfg(not(madsim))]
impl<S: Storage + Clone> tonic::service::Interceptor for PeerDoor<S> {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(id) = self.admit(&request)? {
            request.extensions_mut().insert(VerifiedPeer(id));
        }
        Ok(request)
    }
}

/// The receiving side: hands each message to the local node.
pub struct RaftService<S> {
    node: Arc<CellNode<S>>,
    metrics: Arc<Metrics>,
    /// With TLS on, the cell a peer's certificate must name (checked by the [`PeerDoor`] in front of this service).
    tls_cell: Option<String>,
}

impl<S: Storage + Clone> RaftService<S> {
    /// The service of `node`, recording into `metrics`; with `tls_cell`, each message must have passed a
    /// [`PeerDoor`] of that cell.
    pub fn new(node: Arc<CellNode<S>>, metrics: Arc<Metrics>, tls_cell: Option<String>) -> Self {
        RaftService { node, metrics, tls_cell }
    }

    /// The node the door verified a message comes from; with TLS on, a message the door did not see is refused.
    fn sender(&self, request: &Request<RaftMessage>) -> Result<Option<NodeId>, Status> {
        match (request.extensions().get::<VerifiedPeer>(), &self.tls_cell) {
            (Some(VerifiedPeer(id)), _) => Ok(Some(*id)),
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Status::permission_denied("the peer's certificate was not verified")),
        }
    }

    #[allow(clippy::disallowed_methods, reason = "times a leader's messages and their answers on the runtime's clock")]
    async fn answer(&self, rpc: Rpc, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let sender = self.sender(&request)?;
        let received = tokio::time::Instant::now();
        if rpc == Rpc::AppendEntries {
            self.metrics.leader_message(received);
        }
        match self.node.answer(rpc, &from_wire(request.into_inner())?, sender).await {
            Ok(frame) => {
                if rpc == Rpc::AppendEntries {
                    self.metrics.raft_append_answer.observe(received.elapsed().as_secs_f64());
                }
                Ok(Response::new(to_wire(frame)))
            }
            Err(AnswerError::Refused(error)) => {
                tracing::warn!(%error, "refused a raft message");
                Err(Status::invalid_argument(error.to_sender()))
            }
            Err(error @ AnswerError::StorageFull { .. }) => {
                Err(cellog_client::status::failed(tonic::Code::ResourceExhausted, "STORAGE_FULL", error.to_string()))
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

    async fn bodies(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.answer(Rpc::Bodies, request).await
    }

    async fn founding(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.answer(Rpc::Founding, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call whose deadline passed, however tonic says so, is told apart from a peer that is gone (a refused or reset
    /// connection), which openraft backs off from.
    #[test]
    fn a_call_past_its_deadline_is_told_apart_from_a_peer_that_is_gone() {
        let table = [
            (Status::deadline_exceeded("request timeout: 100ms"), true),
            (Status::cancelled("Timeout expired"), true),
            (Status::cancelled("the operation was cancelled"), false),
            (Status::unavailable("connection refused"), false),
            (Status::internal("Timeout expired"), false),
        ];
        for (status, late) in table {
            assert_eq!(timed_out(&status), late, "{status:?}");
        }
    }
}
