//! Bounds on what callers hold open on one node: connections to the client port, concurrent calls on one connection,
//! subscriptions, how long one call may take before it answers, and keep-alive probes that find dead clients.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::{Code, Status};

/// The bounds, with the defaults documented on each field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open on the client port at once: a connection past it is answered `RESOURCE_EXHAUSTED
    /// TOO_MANY_CONNECTIONS` on every call until enough others close. Default 4 096.
    pub max_connections: usize,
    /// Calls (HTTP/2 streams) open on one connection at once: past it, the client's next call waits for one to end.
    /// Default 256.
    pub max_calls_per_connection: u32,
    /// Subscriptions open on this node at once: past it, `Subscribe` is answered `RESOURCE_EXHAUSTED
    /// TOO_MANY_SUBSCRIPTIONS`. Default 4 096.
    pub max_subscriptions: usize,
    /// Longest a call may take to answer (a streaming call's answer starts at once; its stream is not cut): past it,
    /// the call is cancelled. Default 30 s.
    pub request_timeout: Duration,
    /// How often an idle connection is probed (HTTP/2 pings, and TCP keep-alive), and how long a ping may go
    /// unanswered before the connection is closed: a client that vanished frees what it held. Default 20 s.
    pub keepalive: Duration,
}

impl Limits {
    /// The defaults.
    pub const DEFAULT: Limits = Limits {
        max_connections: 4096,
        max_calls_per_connection: 256,
        max_subscriptions: 4096,
        request_timeout: Duration::from_secs(30),
        keepalive: Duration::from_secs(20),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// The connections open on the client port, and which of them came past the limit. (In simulation the node has no
/// client port of its own to count.)
#[derive(Debug)]
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) struct Connections {
    max: usize,
    open: AtomicUsize,
    over: Mutex<BTreeSet<SocketAddr>>,
}

#[cfg_attr(madsim, allow(dead_code))]
impl Connections {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Connections { max, open: AtomicUsize::new(0), over: Mutex::default() })
    }

    fn over(&self) -> std::sync::MutexGuard<'_, BTreeSet<SocketAddr>> {
        self.over.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a connection from `peer` until the returned slot is dropped (when the connection closes).
    pub(crate) fn open(self: &Arc<Self>, peer: Option<SocketAddr>) -> Slot {
        let open = self.open.fetch_add(1, Ordering::AcqRel) + 1;
        let over = match peer {
            Some(peer) if open > self.max => self.over().insert(peer).then_some(peer),
            _ => None,
        };
        Slot { connections: self.clone(), over }
    }

    /// Refuses a call on a connection that came past the limit.
    pub(crate) fn admit(&self, peer: Option<SocketAddr>) -> Result<(), Status> {
        match peer {
            Some(peer) if self.over().contains(&peer) => Err(cellog_client::status::failed(
                Code::ResourceExhausted,
                "TOO_MANY_CONNECTIONS",
                format!(
                    "this node serves at most {} client connections at once; this one came past them (close \
                     another, or retry later)",
                    self.max
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// One open connection, counted until it is dropped.
#[derive(Debug)]
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) struct Slot {
    connections: Arc<Connections>,
    over: Option<SocketAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.open.fetch_sub(1, Ordering::AcqRel);
        if let Some(peer) = self.over {
            self.connections.over().remove(&peer);
        }
    }
}

/// The refusal of a subscription past [`Limits::max_subscriptions`].
pub(crate) fn too_many_subscriptions(max: usize) -> Status {
    cellog_client::status::failed(
        Code::ResourceExhausted,
        "TOO_MANY_SUBSCRIPTIONS",
        format!("this node serves at most {max} subscriptions at once; close one, or subscribe on another node later"),
    )
}

#[cfg(not(madsim))]
pub(crate) use counted::Counted;

#[cfg(not(madsim))]
mod counted {
    //! A client connection that holds its [`Slot`] while it is open.

    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::TcpStream;
    use tonic::transport::server::{Connected, TcpConnectInfo};

    use super::Slot;

    /// A TCP connection, counted while it is open.
    pub(crate) struct Counted {
        pub(crate) stream: TcpStream,
        pub(crate) _slot: Slot,
    }

    impl Connected for Counted {
        type ConnectInfo = TcpConnectInfo;
        fn connect_info(&self) -> TcpConnectInfo {
            self.stream.connect_info()
        }
    }

    impl AsyncRead for Counted {
        fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.stream).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counted {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.stream).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.stream).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.stream).poll_shutdown(cx)
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.stream.is_write_vectored()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_past_the_limit_is_refused_until_it_closes() {
        let connections = Connections::new(2);
        let addr = |port: u16| Some(SocketAddr::from(([127, 0, 0, 1], port)));
        let first = connections.open(addr(1));
        let _second = connections.open(addr(2));
        let third = connections.open(addr(3));
        assert!(connections.admit(addr(1)).is_ok());
        let refused = connections.admit(addr(3)).expect_err("the third is past two");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert_eq!(cellog_client::status::detail_of(&refused).reason, "TOO_MANY_CONNECTIONS");
        // Closing an admitted connection does not admit one already past the limit; a new one comes in under it.
        drop(first);
        assert!(connections.admit(addr(3)).is_err());
        drop(third);
        let _fourth = connections.open(addr(4));
        assert!(connections.admit(addr(4)).is_ok());
        assert!(connections.admit(addr(3)).is_ok(), "a closed connection's address is forgotten");
    }
}
