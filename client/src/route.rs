//! Where a call goes and what happens when it fails: the cell's known nodes and their channels, the leader followed,
//! the members asked for again, a deposed leader noticed while a call waits on it, and the retry of what is safe.

#![allow(
    clippy::disallowed_methods,
    reason = "retry deadlines and latencies use the runtime's clock (madsim's simulated one under --cfg madsim)"
)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_proto::v1::{self, cellog_client::CellogClient, mail_client::MailClient};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use crate::error::{ClientError, protocol_mismatch};
use crate::limits::MAX_CLIENT_MESSAGE;
use crate::options::{ClientOptions, ClientTls};
use crate::status::detail_of;
use crate::token;

/// What to do after a failed attempt.
pub(crate) enum Next {
    /// Retry at once at this leader.
    Leader(String),
    /// Retry after a pause, on the next node.
    Elsewhere(Duration),
    /// Retry after a pause, on the same node.
    Later(Duration),
    /// Give up.
    Fail,
}

/// Whether a failed call may have been applied.
pub(crate) fn classify(status: &Status, idempotent: bool, retry_backpressure: bool) -> Next {
    let detail = detail_of(status);
    let advised = Duration::from_millis(detail.retry_after_ms);
    match (status.code(), detail.reason.as_str()) {
        (Code::Unavailable, "NOT_LEADER") if !detail.leader_addr.is_empty() => Next::Leader(detail.leader_addr),
        (Code::Unavailable, "NOT_LEADER") => Next::Elsewhere(advised),
        // Handed to Raft before leadership moved: it may still commit, so only a repeat that changes nothing is safe.
        (Code::Unavailable, "LEADER_CHANGED") if idempotent && !detail.leader_addr.is_empty() => {
            Next::Leader(detail.leader_addr)
        }
        (Code::ResourceExhausted, "RATE_LIMITED" | "STORAGE_FULL") if retry_backpressure => Next::Later(advised),
        // The cell refused it: the stream is moving here and takes writes once it has caught up.
        (Code::Unavailable, "STREAM_MOVING") => Next::Later(advised),
        // Refused before it reached the cell, or broken in flight: safe only when a repeat changes nothing.
        (Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Internal, _)
            if idempotent =>
        {
            Next::Elsewhere(advised)
        }
        _ => Next::Fail,
    }
}

/// The longest pause between attempts while the cell has no leader a node can name, or a node did not answer: an
/// election takes about a second, and a pause doubling up to a second would find its winner up to a second late.
const LEADERLESS_BACKOFF: Duration = Duration::from_millis(200);

/// Whether a failure says the node could not be reached or did not answer in time (rather than that it refused).
fn unreachable(status: &Status) -> bool {
    match status.code() {
        // A node that refuses says why; a status without its own reason came from the transport.
        Code::Unavailable => detail_of(status).reason == "UNAVAILABLE",
        Code::DeadlineExceeded | Code::Cancelled => true,
        _ => false,
    }
}

/// A connection to a cell.
#[derive(Clone)]
pub struct Client {
    pub(crate) route: Arc<Mutex<Route>>,
    pub(crate) options: ClientOptions,
    /// The credential's metadata value, checked once.
    pub(crate) bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

/// The nodes a client knows, the one its next call goes to, and a channel to each node it has called.
pub(crate) struct Route {
    addrs: Vec<String>,
    current: usize,
    /// A node failed to answer since the members were last asked for.
    stale: bool,
    /// When the members were last asked for.
    discovered_at: Option<Instant>,
    channels: std::collections::BTreeMap<String, Channel>,
}

impl Route {
    /// The nodes at `addrs`, not yet called; the first is called first.
    pub(crate) fn new(addrs: Vec<String>) -> Self {
        Route { addrs, current: 0, stale: false, discovered_at: None, channels: std::collections::BTreeMap::new() }
    }
}

/// A channel to the node at `addr`, which is `host:port`: the scheme follows from `tls` alone, so that an address (from
/// a flag, a membership answer or a leader hint) can never turn a TLS client into a plaintext one.
pub(crate) fn connect(addr: &str, tls: Option<&ClientTls>) -> Result<Channel, ClientError> {
    if addr.contains("://") {
        return Err(ClientError::Address {
            addr: addr.to_string(),
            reason: "an address is host:port, without a scheme (TLS is on when a CA is given, and only then)"
                .to_string(),
        });
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let uri = format!("{scheme}://{addr}");
    let bad =
        |error: tonic::transport::Error| ClientError::Address { addr: addr.to_string(), reason: error.to_string() };
    let endpoint = Endpoint::from_shared(uri).map_err(bad)?;
    #[cfg(not(madsim))]
    let endpoint = match tls {
        Some(tls) => {
            use tonic::transport::{Certificate, ClientTlsConfig, Identity};
            let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint.tls_config(config).map_err(bad)?
        }
        None => endpoint,
    };
    Ok(endpoint.connect_timeout(Duration::from_secs(2)).tcp_nodelay(true).connect_lazy())
}

/// The client API over a channel, with the wire limits.
pub(crate) fn cellog(channel: Channel) -> CellogClient<Channel> {
    CellogClient::new(channel)
        .max_decoding_message_size(MAX_CLIENT_MESSAGE)
        .max_encoding_message_size(MAX_CLIENT_MESSAGE)
}

/// The client API of the one node at `addr` (`host:port`), with the wire limits and none of [`Client`]'s routing or
/// retries: what a node uses to pass a caller's call on to its leader. Connects on first use.
pub fn node_api(addr: &str, tls: Option<&ClientTls>) -> Result<CellogClient<Channel>, ClientError> {
    Ok(cellog(connect(addr, tls)?))
}

/// Sealed mail over a channel, with the wire limits.
fn mail(channel: Channel) -> MailClient<Channel> {
    MailClient::new(channel).max_decoding_message_size(MAX_CLIENT_MESSAGE).max_encoding_message_size(MAX_CLIENT_MESSAGE)
}

impl Client {
    /// The node the next call goes to.
    pub fn current_addr(&self) -> String {
        let route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        route.addrs[route.current].clone()
    }

    /// The channel to the node the next call goes to.
    pub(crate) fn channel(&self) -> Result<Channel, ClientError> {
        self.channel_to(&self.current_addr())
    }

    /// The channel to the node at `addr`, made on first use.
    pub(crate) fn channel_to(&self, addr: &str) -> Result<Channel, ClientError> {
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(channel) = route.channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = connect(addr, self.options.tls.as_ref())?;
        route.channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// A call's request: the attempt's deadline and the caller's credential.
    pub(crate) fn request<M>(&self, message: M) -> Request<M> {
        let mut request = self.credentials(Request::new(message));
        request.set_timeout(self.options.attempt_timeout);
        request
    }

    /// `request` with the caller's credential, if it has one.
    pub(crate) fn credentials<M>(&self, mut request: Request<M>) -> Request<M> {
        if let Some(value) = &self.bearer {
            request.metadata_mut().insert(token::AUTHORIZATION, value.clone());
        }
        request
    }

    pub(crate) fn current(&self) -> Result<CellogClient<Channel>, ClientError> {
        self.channel().map(cellog)
    }

    pub(crate) fn go_to(&self, addr: String) {
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match route.addrs.iter().position(|known| *known == addr) {
            Some(index) => route.current = index,
            None => {
                route.addrs.push(addr);
                route.current = route.addrs.len() - 1;
            }
        }
    }

    pub(crate) fn next_node(&self) {
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        route.current = (route.current + 1) % route.addrs.len();
        route.stale = true;
    }

    /// After a node failed to answer, and every [`ClientOptions::discover_every`] anyway: asks the current node for the cell's
    /// members and remembers any new address.
    pub(crate) async fn rediscover(&self) {
        if !self.options.discover {
            return;
        }
        {
            let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let due = route.discovered_at.is_none_or(|at| at.elapsed() >= self.options.discover_every);
            if !route.stale && !due {
                return;
            }
            route.stale = false;
            route.discovered_at = Some(Instant::now());
        }
        let Ok(mut client) = self.current() else { return };
        let request = self.request(v1::ClusterStatusRequest::default());
        let Ok(status) = client.cluster_status(request).await else { return };
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for node in status.into_inner().nodes {
            if !node.client_addr.is_empty() && !route.addrs.contains(&node.client_addr) {
                route.addrs.push(node.client_addr);
            }
        }
    }

    /// Resolves once the node at `addr`, which an attempt waits on, has been deposed (see
    /// [`ClientOptions::suspect_after`]), with a `LEADER_CHANGED` status naming its successor; never otherwise.
    pub(crate) async fn deposed(&self, addr: &str) -> Status {
        let Some(every) = self.options.suspect_after.filter(|_| self.options.discover) else {
            return std::future::pending().await;
        };
        tokio::time::sleep(every).await;
        loop {
            // Once every interval, however long a silent node takes not to answer.
            let asked_at = Instant::now();
            if let Some(status) = self.successor(addr, every).await {
                return status;
            }
            tokio::time::sleep_until(asked_at + every).await;
        }
    }

    /// Asks `addr` who leads, for at most half of `every`, then (unless it knows it does not lead) every other known
    /// node, so that their answers are fresh however long `addr` took not to answer: a `LEADER_CHANGED` status naming
    /// the leader when `addr` is silent or names itself at a term earlier than another node's leader, which is not
    /// `addr`.
    pub(crate) async fn successor(&self, addr: &str, every: Duration) -> Option<Status> {
        let own_term = match self.leader_seen_by(addr, every / 2).await {
            // It leads, in its own view: deposed only if a later term has another leader.
            Some(own) if own.leader_addr == addr => own.term,
            // It knows it does not lead (it serves the call itself, or the cell is electing): let it answer.
            Some(_) => return None,
            None => 0,
        };
        let others: Vec<String> = {
            let route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            route.addrs.iter().filter(|node| *node != addr).cloned().collect()
        };
        let asks = others.iter().map(|node| async move { Some((node, self.leader_seen_by(node, every).await?)) });
        let answers = futures::future::join_all(asks).await;
        let (node, newer) = answers
            .iter()
            .flatten()
            .filter(|(_, status)| {
                !status.leader_addr.is_empty() && status.leader_addr != addr && status.term > own_term
            })
            .max_by_key(|(_, status)| status.term)?;
        let detail = v1::ErrorDetail {
            reason: "LEADER_CHANGED".to_string(),
            message: format!(
                "{addr} did not answer or no longer leads: {node} names {} the leader at term {}; the call may or \
                 may not have been applied at {addr}, and goes to the new leader only if it is safe to repeat",
                newer.leader_addr, newer.term
            ),
            leader_id: newer.leader_id.unwrap_or_default(),
            leader_addr: newer.leader_addr.clone(),
            ..v1::ErrorDetail::default()
        };
        Some(crate::status::status(Code::Unavailable, detail))
    }

    /// What the node at `addr` says of the cell's leader, if it answers within `patience`.
    pub(crate) async fn leader_seen_by(&self, addr: &str, patience: Duration) -> Option<v1::ClusterStatusResponse> {
        let mut request = self.credentials(Request::new(v1::ClusterStatusRequest::default()));
        request.set_timeout(patience);
        let mut client = cellog(self.channel_to(addr).ok()?);
        let answer = tokio::time::timeout(patience, client.cluster_status(request)).await.ok()?.ok()?;
        Some(answer.into_inner())
    }

    /// After a call gave up on `status`: the next call should not try a silent or deposed node first.
    pub(crate) fn after_giving_up(&self, status: &Status) {
        let detail = detail_of(status);
        if detail.reason == "LEADER_CHANGED" && !detail.leader_addr.is_empty() {
            self.go_to(detail.leader_addr);
        } else if unreachable(status) {
            self.next_node();
        }
    }

    /// Follows a failed attempt's advice; false when the call should give up.
    pub(crate) async fn recover(
        &self,
        status: &Status,
        idempotent: bool,
        deadline: Instant,
        backoff: &mut Duration,
    ) -> bool {
        if Instant::now() >= deadline {
            return false;
        }
        match classify(status, idempotent, self.options.retry_backpressure) {
            Next::Leader(addr) => {
                // A leader that keeps naming itself while refusing has just lost its lease: pause a little.
                if addr == self.current_addr() {
                    tokio::time::sleep(*backoff).await;
                }
                self.go_to(addr);
            }
            Next::Elsewhere(advised) => {
                self.next_node();
                tokio::time::sleep(advised.max(*backoff)).await;
                *backoff = (*backoff * 2).min(LEADERLESS_BACKOFF);
            }
            Next::Later(advised) => {
                tokio::time::sleep(advised.max(*backoff)).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(1));
            }
            Next::Fail => return false,
        }
        true
    }

    /// Runs one call of the client API, following the leader and retrying what is safe.
    pub async fn call<T, M, F, Fut>(&self, idempotent: bool, message: M, call: F) -> Result<T, ClientError>
    where
        M: Clone,
        F: Fn(CellogClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        self.call_on(cellog, idempotent, message, call).await
    }

    /// Runs one call of sealed mail, following the leader and retrying what is safe.
    pub async fn call_mail<T, M, F, Fut>(&self, idempotent: bool, message: M, call: F) -> Result<T, ClientError>
    where
        M: Clone,
        F: Fn(MailClient<Channel>, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        self.call_on(mail, idempotent, message, call).await
    }

    pub(crate) async fn call_on<C, T, M, F, Fut>(
        &self,
        service: fn(Channel) -> C,
        idempotent: bool,
        message: M,
        call: F,
    ) -> Result<T, ClientError>
    where
        M: Clone,
        F: Fn(C, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        self.call_tracked(service, idempotent, message, call).await.map(|(answer, _)| answer)
    }

    /// [`Client::call_on`], also saying whether an attempt before the answered one got no answer (and so may have
    /// been applied).
    pub(crate) async fn call_tracked<C, T, M, F, Fut>(
        &self,
        service: fn(Channel) -> C,
        idempotent: bool,
        message: M,
        call: F,
    ) -> Result<(T, bool), ClientError>
    where
        M: Clone,
        F: Fn(C, Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        let mut earlier_unknown = false;
        loop {
            let request = self.request(message.clone());
            let addr = self.current_addr();
            let attempt = call(service(self.channel()?), request);
            // Biased: tokio's random branch order draws from a thread's own generator, which a simulation cannot
            // seed, so the same seed would not run the same way twice.
            let answer = tokio::select! {
                biased;
                answer = attempt => answer,
                deposed = self.deposed(&addr) => Err(deposed),
            };
            let status = match answer {
                Ok(response) => {
                    self.rediscover().await;
                    return Ok((response.into_inner(), earlier_unknown));
                }
                Err(status) => status,
            };
            if let Some(mismatch) = protocol_mismatch(&status, &addr, self.options.tls.is_some()) {
                return Err(if earlier_unknown {
                    ClientError::Indefinite { last: Box::new(mismatch) }
                } else {
                    mismatch
                });
            }
            if !self.recover(&status, idempotent, deadline, &mut backoff).await {
                self.after_giving_up(&status);
                return Err(ClientError::settle(status.into(), earlier_unknown));
            }
            earlier_unknown |= ClientError::from(status).outcome_unknown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the transport says when the node speaks the other protocol becomes an error naming the node and what to
    /// change; the same words from the node itself (with a detail), or the other client's, stay as they are.
    #[test]
    fn a_protocol_mismatch_is_named() {
        let h2 = Status::new(Code::Internal, "h2 protocol error: http2 error");
        let not_tls =
            Status::new(Code::Unknown, "transport error: received corrupt message of type InvalidContentType");
        let mismatch = |status: &Status, tls| protocol_mismatch(status, "10.0.0.1:7400", tls).map(|e| e.to_string());
        assert!(mismatch(&h2, false).is_some_and(|text| text.starts_with(
            "the node at 10.0.0.1:7400 did not answer \
            plaintext HTTP/2; it may serve TLS"
        )));
        assert!(
            mismatch(&not_tls, true).is_some_and(|text| text.contains("did not answer TLS; it may serve plaintext"))
        );
        assert_eq!(mismatch(&h2, true), None, "a TLS client meets no plaintext preface trouble");
        assert_eq!(mismatch(&not_tls, false), None);
        let refused = crate::status::failed(Code::Internal, "INTERNAL", "h2 protocol error");
        assert_eq!(mismatch(&refused, false), None, "the node's own words");
        assert_eq!(mismatch(&Status::new(Code::Unknown, "transport error: broken pipe"), false), None);
    }

    /// An address is `host:port`: a scheme in it is refused, so `http://` never turns a TLS client into a plaintext
    /// one, nor `https://` a plaintext client into one that verifies nothing.
    #[tokio::test]
    async fn an_address_with_a_scheme_is_refused() {
        let tls = ClientTls { ca_pem: b"-----BEGIN CERTIFICATE-----".to_vec(), identity: None };
        for addr in ["http://127.0.0.1:7401", "https://127.0.0.1:7401", "HTTP://127.0.0.1:7401", "unix://x"] {
            for tls in [None, Some(&tls)] {
                let refused = connect(addr, tls).map(|_| ()).expect_err(addr);
                assert!(
                    matches!(&refused, ClientError::Address { reason, .. } if reason.contains("host:port")),
                    "{refused}"
                );
            }
        }
        assert!(connect("127.0.0.1:7401", None).is_ok());
    }

    #[test]
    fn a_silent_node_is_unreachable_and_a_refusing_one_is_not() {
        assert!(unreachable(&Status::unavailable("transport error")), "no answer from the node");
        assert!(unreachable(&Status::deadline_exceeded("timeout")));
        let refused = |reason| crate::status::failed(Code::Unavailable, reason, "refused");
        assert!(!unreachable(&refused("NOT_LEADER")), "the node answered: it does not lead");
        assert!(!unreachable(&refused("MEMBERSHIP_CHANGING")));
        assert!(!unreachable(&Status::invalid_argument("bad")));
    }
}
