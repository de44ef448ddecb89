//! Where a node listens. In production the addresses are bound before Raft starts, so a taken port fails the start at
//! once, and the client address also serves gRPC health and reflection, and the HTTP address metrics, the JSON API,
//! live tails and the console (see [`crate::http`]).
//! In simulation (`--cfg madsim`) the servers bind on madsim's network, and health, reflection and metrics, which
//! have no simulated transport, are left out.

use std::net::SocketAddr;
use std::sync::Arc;

use cellog_mail::MailService;
use cellog_proto::raft::raft_server::RaftServer;
use cellog_proto::v1::cellog_server::CellogServer;
use cellog_proto::v1::mail_server::MailServer;
use cellog_raft::CellNode;
use cellog_raft::storage::Storage;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::limits::Limits;
#[cfg(not(madsim))]
use crate::limits::{Connections, Counted};
use crate::mail_cell::NodeCell;
use crate::metrics::{Metered, Metrics};
use crate::service::CellogService;
use crate::transport::RaftService;

type Node<S> = Arc<CellNode<Metered<S>>>;

/// An address that could not be bound.
#[derive(Debug)]
pub(crate) struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// Why.
    pub error: std::io::Error,
}

/// The servers' types: madsim's generated servers name their interceptor, tonic's do not.
#[cfg(not(madsim))]
mod served {
    use super::*;
    pub(crate) type Client<S> = CellogServer<CellogService<Metered<S>>>;
    pub(crate) type Mail<S> = MailServer<MailService<NodeCell<Metered<S>>>>;
    pub(crate) type Raft<S> = RaftServer<RaftService<Metered<S>>>;
}

#[cfg(madsim)]
mod served {
    use super::*;
    use tonic::codegen::IdentityInterceptor;
    pub(crate) type Client<S> = CellogServer<CellogService<Metered<S>>, IdentityInterceptor>;
    pub(crate) type Mail<S> = MailServer<MailService<NodeCell<Metered<S>>>, IdentityInterceptor>;
    pub(crate) type Raft<S> = RaftServer<RaftService<Metered<S>>, IdentityInterceptor>;
}

/// What a node serves: the client API and mail on the client address, Raft on the peer address, and the client API
/// again over JSON on the HTTP address.
pub(crate) struct Services<S: Storage + Clone> {
    pub client: served::Client<S>,
    pub api: CellogService<Metered<S>>,
    pub mail: served::Mail<S>,
    pub raft: served::Raft<S>,
    /// What the peer port checks before a call's body is read.
    #[cfg(not(madsim))]
    pub raft_door: crate::transport::PeerDoor<Metered<S>>,
    /// What the client port checks before a call's message is decoded.
    #[cfg(not(madsim))]
    pub client_door: crate::auth::ClientDoor<Metered<S>>,
}

/// Resolves once the node is told to stop.
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// The addresses of a node, bound.
#[cfg(not(madsim))]
pub(crate) struct Listeners {
    client: tokio::net::TcpListener,
    raft: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
}

#[cfg(not(madsim))]
async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|error| BindError { addr, error })
}

#[cfg(not(madsim))]
impl Listeners {
    pub(crate) async fn bind(
        client: SocketAddr,
        raft: SocketAddr,
        metrics: Option<SocketAddr>,
    ) -> Result<Self, BindError> {
        let metrics = match metrics {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Listeners { client: bind(client).await?, raft: bind(raft).await?, metrics })
    }

    /// Where clients connect (the bound port, when port 0 was asked for).
    pub(crate) fn client_addr(&self) -> SocketAddr {
        self.client.local_addr().expect("a bound socket has an address")
    }

    pub(crate) fn raft_addr(&self) -> SocketAddr {
        self.raft.local_addr().expect("a bound socket has an address")
    }

    pub(crate) fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|listener| listener.local_addr().ok())
    }

    /// Serves the client and peer APIs (over TLS with `tls`) and the metrics; a TLS config tonic refuses fails here.
    pub(crate) fn serve<S: Storage + Clone>(
        self,
        services: Services<S>,
        node: Node<S>,
        metrics: Arc<Metrics>,
        stopped: watch::Receiver<bool>,
        tls: Option<&crate::tls::NodeTls>,
        limits: &Limits,
    ) -> Result<Vec<JoinHandle<()>>, String> {
        use futures::StreamExt;
        use tonic::service::interceptor::InterceptedService;
        use tonic::transport::Server;
        use tonic::transport::server::TcpIncoming;

        let keepalive = Some(limits.keepalive);
        // One budget of request bytes for the client port and the HTTP port together.
        let request_bytes = crate::budget::RequestBytes::new(limits.max_request_bytes_in_flight);
        let mut client_server = Server::builder()
            .timeout(limits.request_timeout)
            .max_concurrent_streams(limits.max_calls_per_connection)
            .http2_keepalive_interval(keepalive)
            .http2_keepalive_timeout(keepalive)
            .layer(crate::budget::CountLayer { budget: request_bytes.clone() });
        // Peers are members of the cell: their calls (a snapshot sent in chunks among them) are not timed out.
        let raft_server = Server::builder()
            .http2_keepalive_interval(keepalive)
            .http2_keepalive_timeout(keepalive)
            .max_concurrent_streams(limits.max_calls_per_connection);
        // TLS is the node's own (not tonic's): its certificate is read again when rotated (see `crate::tls`).
        let client_tls = tls.map(crate::tls::NodeTls::client_port).transpose()?;
        let raft_tls = tls.map(crate::tls::NodeTls::peer_port).transpose()?;
        let handshake = crate::limits::HANDSHAKE_TIMEOUT;
        let Services { client: client_service, api, mail: mail_service, raft: raft_service, raft_door, client_door } =
            services;
        // Sealed mail is not behind it: another cell delivers (`Deliver`) without a credential of this cell, on the
        // envelope's signature, and its other calls authorize their callers themselves.
        let client_service = InterceptedService::new(client_service, client_door);
        // A peer's certificate is checked before its message is read (a message may be 64 MiB).
        let mut raft_server = raft_server.layer(tonic::service::InterceptorLayer::new(raft_door));
        let mut servers = Vec::new();
        let client_stopped = stopped.clone();
        // Every connection to the client port is counted while open; one past the cap is closed as it is accepted,
        // before its handshake or a byte of it is read.
        let connections = Connections::new(limits.max_connections);
        let client = TcpIncoming::from(self.client).with_nodelay(Some(true)).with_keepalive(keepalive).filter_map(
            move |accepted| {
                let admitted = match accepted {
                    Ok(stream) => match connections.try_open() {
                        Some(slot) => Some(Ok(Counted { stream, _slot: slot })),
                        None => {
                            tracing::debug!(peer = ?stream.peer_addr().ok(), "closed a connection past the cap");
                            None
                        }
                    },
                    Err(error) => Some(Err(error)),
                };
                std::future::ready(admitted)
            },
        );
        let (watched, watch_stopped) = (node.clone(), stopped.clone());
        servers.push(tokio::spawn(async move {
            let (health, health_service) = tonic_health::server::health_reporter();
            health.set_serving::<CellogServer<CellogService<Metered<S>>>>().await;
            // A node that cannot go on says so before it stops (see `RunningNode::failed`), for the service and for
            // the server as a whole (what a default probe asks). The watch ends with the node.
            let not_serving = health.clone();
            tokio::spawn(async move {
                // `biased`: polled in this order, never in one drawn at random, so a simulated run repeats.
                tokio::select! {
                    biased;
                    _ = watched.wait_fatal() => {
                        not_serving.set_not_serving::<CellogServer<CellogService<Metered<S>>>>().await;
                        not_serving.set_service_status("", tonic_health::ServingStatus::NotServing).await;
                    }
                    () = until_stopped(watch_stopped) => {}
                }
            });
            // Both versions of reflection: many tools (grpcurl before 1.9, Python's grpcio-reflection, Postman,
            // grpcui) ask only `v1alpha`.
            let reflection = || {
                tonic_reflection::server::Builder::configure()
                    .register_encoded_file_descriptor_set(cellog_proto::FILE_DESCRIPTOR_SET)
                    .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            };
            let unavailable = |error: &tonic_reflection::server::Error| {
                tracing::error!(%error, "gRPC reflection unavailable");
            };
            let v1 = reflection().build_v1().inspect_err(unavailable).ok();
            let v1alpha = reflection().build_v1alpha().inspect_err(unavailable).ok();
            let router = client_server
                .add_service(health_service)
                .add_optional_service(v1)
                .add_optional_service(v1alpha)
                .add_service(client_service)
                .add_service(mail_service);
            let result = match client_tls {
                Some(acceptor) => {
                    let client = crate::tls::handshaken(client, acceptor, handshake);
                    router.serve_with_incoming_shutdown(client, until_stopped(client_stopped)).await
                }
                None => router.serve_with_incoming_shutdown(client, until_stopped(client_stopped)).await,
            };
            if let Err(error) = result {
                tracing::error!(%error, "client server failed");
            }
        }));
        let raft_stopped = stopped.clone();
        let raft = self.raft;
        servers.push(tokio::spawn(async move {
            let router = raft_server.add_service(raft_service);
            let raft = TcpIncoming::from(raft).with_nodelay(Some(true)).with_keepalive(keepalive);
            let result = match raft_tls {
                Some(acceptor) => {
                    let raft = crate::tls::handshaken(raft, acceptor, handshake);
                    router.serve_with_incoming_shutdown(raft, until_stopped(raft_stopped)).await
                }
                None => router.serve_with_incoming_shutdown(raft, until_stopped(raft_stopped)).await,
            };
            if let Err(error) = result {
                tracing::error!(%error, "raft server failed");
            }
        }));
        if let Some(listener) = self.metrics {
            let door = crate::http::serve::Door {
                tls: tls.map(crate::tls::NodeTls::http_acceptor).transpose()?,
                max_connections: limits.max_connections,
                handshake_timeout: crate::limits::HANDSHAKE_TIMEOUT,
                header_timeout: crate::limits::HEADER_TIMEOUT,
            };
            let router =
                crate::http::router(api, node, metrics, limits, request_bytes, tls.map(|tls| tls.ca_pem().to_vec()));
            servers.push(crate::http::serve::serve(listener, router, door, stopped));
        }
        Ok(servers)
    }
}

/// The addresses of a node on madsim's network.
#[cfg(madsim)]
pub(crate) struct Listeners {
    client: SocketAddr,
    raft: SocketAddr,
}

#[cfg(madsim)]
impl Listeners {
    pub(crate) async fn bind(
        client: SocketAddr,
        raft: SocketAddr,
        _metrics: Option<SocketAddr>,
    ) -> Result<Self, BindError> {
        Ok(Listeners { client, raft })
    }

    pub(crate) fn client_addr(&self) -> SocketAddr {
        self.client
    }

    pub(crate) fn raft_addr(&self) -> SocketAddr {
        self.raft
    }

    pub(crate) fn metrics_addr(&self) -> Option<SocketAddr> {
        None
    }

    pub(crate) fn serve<S: Storage + Clone>(
        self,
        services: Services<S>,
        _node: Node<S>,
        _metrics: Arc<Metrics>,
        stopped: watch::Receiver<bool>,
        tls: Option<&crate::tls::NodeTls>,
        _limits: &Limits,
    ) -> Result<Vec<JoinHandle<()>>, String> {
        use tonic::transport::Server;

        if tls.is_some() {
            return Err("TLS is not available in simulation".to_string());
        }

        // No HTTP port in simulation.
        let Services { client: client_service, api, mail: mail_service, raft: raft_service } = services;
        drop(api);
        let (client, raft) = (self.client, self.raft);
        let client_stopped = stopped.clone();
        Ok(vec![
            tokio::spawn(async move {
                let result = Server::builder()
                    .add_service(client_service)
                    .add_service(mail_service)
                    .serve_with_shutdown(client, until_stopped(client_stopped))
                    .await;
                if let Err(error) = result {
                    tracing::error!(%error, "client server failed");
                }
            }),
            tokio::spawn(async move {
                let result =
                    Server::builder().add_service(raft_service).serve_with_shutdown(raft, until_stopped(stopped)).await;
                if let Err(error) = result {
                    tracing::error!(%error, "raft server failed");
                }
            }),
        ])
    }
}
