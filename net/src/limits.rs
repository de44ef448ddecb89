//! Bounds on what callers hold open on one node: connections to the client port, concurrent calls on one connection,
//! subscriptions, how long one call may take before it answers, and keep-alive probes that find dead clients.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tonic::{Code, Status};

use crate::auth::PrincipalRate;

/// Longest a TLS handshake may take on any port: a caller that opens a connection and sends nothing holds it no
/// longer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest request body the JSON API reads: the largest gRPC message, its bytes in base64 (a third more), and
/// room for the JSON around them.
pub const MAX_HTTP_BODY_BYTES: usize = cellog_client::limits::MAX_CLIENT_MESSAGE / 3 * 4 + 64 * 1024;

/// Longest a request's head may take to arrive on the HTTP port (its line and headers, the first or the next on a
/// kept-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The bounds, with the defaults documented on each field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open on the client port at once, and on the HTTP port: a connection past it is closed as it is
    /// accepted, before a byte of it is read. Default 4 096.
    pub max_connections: usize,
    /// Calls (HTTP/2 streams) open on one connection at once: past it, the client's next call waits for one to end.
    /// Default 256.
    pub max_calls_per_connection: u32,
    /// Subscriptions open on this node at once: past it, `Subscribe` is answered `RESOURCE_EXHAUSTED
    /// TOO_MANY_SUBSCRIPTIONS`. Default 4 096.
    pub max_subscriptions: usize,
    /// Subscriptions (and, apart, HTTP tails) one principal holds open on this node at once, root excepted: past it,
    /// its next one is answered `RESOURCE_EXHAUSTED TOO_MANY_SUBSCRIPTIONS` (`TOO_MANY_TAILS`), so that one principal
    /// cannot take every subscription of the node. Default 1 024.
    pub max_subscriptions_per_principal: usize,
    /// Longest a call may take to answer (a streaming call's answer starts at once; its stream is not cut): past it,
    /// the call is cancelled. Default 30 s.
    pub request_timeout: Duration,
    /// How often an idle connection is probed (HTTP/2 pings, and TCP keep-alive), and how long a ping may go
    /// unanswered before the connection is closed: a client that vanished frees what it held. Default 20 s.
    pub keepalive: Duration,
    /// The free-disk watermark: while the store's device has fewer bytes free, this node (as leader) refuses writes
    /// that grow the store with `RESOURCE_EXHAUSTED STORAGE_FULL`, and goes on serving reads, acknowledgements, recalls
    /// and deletes, so a full disk never stops the store. 0 turns it off. Default 256 MiB.
    pub min_free_disk_bytes: u64,
    /// Commands per second (reads, opened subscriptions and tails included) all the principals of one tenant together
    /// may send this node, beside each principal's own rate. Default 50 000, in bursts of 100 000.
    pub tenant_rate: Option<PrincipalRate>,
    /// Commands per second every caller but root together may send this node. Default none: set it from what the
    /// node's disk and cores take.
    pub cell_rate: Option<PrincipalRate>,
    /// Publishes per second to one subject, all the principals of its tenant together, beside the rates above.
    /// Default none.
    pub subject_rate: Option<PrincipalRate>,
    /// Bytes of requests every caller together may have sent this node and not yet had read (a gRPC message until it
    /// is whole, an HTTP body for its call's life): past it, a request is refused as `RESOURCE_EXHAUSTED
    /// REQUEST_BYTES` (see `crate::budget`). At least one largest request. Default 256 MiB.
    pub max_request_bytes_in_flight: u64,
}

impl Limits {
    /// The defaults.
    pub const DEFAULT: Limits = Limits {
        max_connections: 4096,
        max_calls_per_connection: 256,
        max_subscriptions: 4096,
        max_subscriptions_per_principal: 1024,
        request_timeout: Duration::from_secs(30),
        keepalive: Duration::from_secs(20),
        min_free_disk_bytes: 256 * 1024 * 1024,
        tenant_rate: Some(PrincipalRate { per_second: 50_000, burst: 100_000 }),
        cell_rate: None,
        subject_rate: None,
        max_request_bytes_in_flight: 256 * 1024 * 1024,
    };

    /// The least [`Limits::max_request_bytes_in_flight`] may be: one largest request on either port.
    pub const LEAST_REQUEST_BYTES_IN_FLIGHT: u64 = {
        let grpc = cellog_client::limits::MAX_CLIENT_MESSAGE as u64 + 5;
        let http = MAX_HTTP_BODY_BYTES as u64;
        if grpc > http { grpc } else { http }
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// The connections open on a port. (In simulation the node has no client port of its own to count.)
#[derive(Debug)]
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) struct Connections {
    max: usize,
    open: AtomicUsize,
}

#[cfg_attr(madsim, allow(dead_code))]
impl Connections {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Connections { max, open: AtomicUsize::new(0) })
    }

    /// Counts a connection until the returned slot is dropped (when the connection closes), or `None` when `max` are
    /// open: the caller closes it.
    pub(crate) fn try_open(self: &Arc<Self>) -> Option<Slot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < self.max).then_some(open + 1))
            .ok()
            .map(|_| Slot { connections: self.clone() })
    }
}

/// One open connection, counted until it is dropped.
#[derive(Debug)]
#[cfg_attr(madsim, allow(dead_code))]
pub(crate) struct Slot {
    connections: Arc<Connections>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many of something (subscriptions, tails) each principal holds open on this node, against a cap per principal.
/// Root is not capped: the operator must always reach the node.
#[derive(Debug)]
pub(crate) struct PerPrincipal {
    max: usize,
    open: std::sync::Mutex<std::collections::BTreeMap<Arc<str>, usize>>,
}

impl PerPrincipal {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(PerPrincipal { max, open: std::sync::Mutex::default() })
    }

    /// Counts one more for `principal` until the returned hold is dropped, or `None` when it holds `max` already.
    pub(crate) fn try_open(self: &Arc<Self>, principal: &Arc<str>) -> Option<Held> {
        if **principal != *cellog_core::ROOT {
            let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let count = open.entry(principal.clone()).or_insert(0);
            if *count >= self.max {
                return None;
            }
            *count += 1;
        }
        Some(Held { counts: self.clone(), principal: principal.clone() })
    }

    /// The cap.
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

/// One counted for a principal, until dropped.
#[derive(Debug)]
pub(crate) struct Held {
    counts: Arc<PerPrincipal>,
    principal: Arc<str>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.principal);
            }
        }
    }
}

/// The refusal of a principal's subscription (or tail, `what`) past its cap on this node.
pub(crate) fn too_many_for_principal(reason: &str, what: &str, principal: &str, max: usize) -> Status {
    cellog_client::status::failed(
        Code::ResourceExhausted,
        reason,
        format!("principal {principal:?} holds {max} {what} open on this node, its most; close one first"),
    )
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
    fn each_principal_but_root_holds_at_most_its_cap() {
        let caps = PerPrincipal::new(2);
        let (alice, bob, root): (Arc<str>, Arc<str>, Arc<str>) = ("alice".into(), "bob".into(), "root".into());
        let first = caps.try_open(&alice).expect("one of two");
        let _second = caps.try_open(&alice).expect("two of two");
        assert!(caps.try_open(&alice).is_none(), "a third is past alice's two");
        let _bobs = caps.try_open(&bob).expect("bob's count is his own");
        let roots: Vec<_> = (0..5).map(|_| caps.try_open(&root).expect("root is not capped")).collect();
        drop(first);
        let _third = caps.try_open(&alice).expect("one closed, so one more");
        assert!(caps.try_open(&alice).is_none());
        drop(roots);
    }

    #[test]
    fn a_connection_past_the_cap_gets_no_slot_until_another_closes() {
        let connections = Connections::new(2);
        let first = connections.try_open().expect("one of two");
        let _second = connections.try_open().expect("two of two");
        assert!(connections.try_open().is_none(), "a third is past two");
        drop(first);
        let _third = connections.try_open().expect("one closed, so one more");
        assert!(connections.try_open().is_none());
    }
}
