//! The HTTP port's door: the accept loop in front of the router. A connection past the cap is closed at once, before
//! a byte is read; a node with TLS serves HTTPS with its own certificate, and a handshake that does not finish in
//! time is dropped; a request's head must arrive within its timeout. What a caller may then do is the router's
//! (credential first, see [`super::door`]).
//!
//! Hand-written rather than `axum::serve`, which has no TLS, no connection cap and no header timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// How the HTTP port admits connections.
#[derive(Clone)]
pub(crate) struct Door {
    /// HTTPS with the node's certificate, when the node has TLS.
    pub tls: Option<TlsAcceptor>,
    /// Connections open at once; one past them is closed unread.
    pub max_connections: usize,
    /// Longest a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// Longest a request's head (its line and headers) may take to arrive, the first or the next on a kept-alive
    /// connection.
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` through `door` until `stopped`.
pub(crate) fn serve(
    listener: TcpListener,
    router: axum::Router,
    door: Door,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let open = Arc::new(Semaphore::new(door.max_connections.max(1)));
        let mut stopping = stopped.clone();
        loop {
            // `biased`: polled in this order, never in one drawn at random.
            let accepted = tokio::select! {
                biased;
                () = until_stopped(&mut stopping) => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(%error, "the HTTP port could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = open.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "closed an HTTP connection past the cap");
                drop(stream);
                continue;
            };
            let (router, door, stopped) = (router.clone(), door.clone(), stopped.clone());
            tokio::spawn(async move {
                connection(stream, peer, router, &door, stopped).await;
                drop(slot);
            });
        }
    })
}

/// One connection: its handshake, then its requests until it closes or the node stops.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    door: &Door,
    stopped: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    match &door.tls {
        None => http1(TokioIo::new(stream), router, door, stopped).await,
        Some(acceptor) => match tokio::time::timeout(door.handshake_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => http1(TokioIo::new(tls), router, door, stopped).await,
            Ok(Err(error)) => tracing::debug!(%peer, %error, "an HTTPS handshake failed"),
            Err(_) => tracing::debug!(%peer, "an HTTPS handshake timed out"),
        },
    }
}

/// Resolves once the node is told to stop (the guard `wait_for` gives is dropped here, not held across an await).
async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

async fn http1<I>(io: TokioIo<I>, router: axum::Router, door: &Door, mut stopped: watch::Receiver<bool>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(door.header_timeout);
    // Upgrades: the WebSocket tail.
    let connection = builder.serve_connection(io, TowerToHyperService::new(router)).with_upgrades();
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        biased;
        _ = connection.as_mut() => {}
        () = until_stopped(&mut stopped) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
