//! The client library: connects to any node of a cell, follows the leader, and retries what is safe to retry.
//!
//! What is retried: a call refused because the node does not lead (it never reached the log) goes to the named leader; a
//! node that is down or has no leader yet is retried on the next known node with backoff; a rate limit or a full
//! store is retried after the advised delay. A call whose outcome is unknown (the connection broke after it was
//! sent) is retried only when it is idempotent: a publish with a message id (the retry deduplicates to the original
//! sequence), a read, an ack. Everything else is returned as it came.

#![allow(
    clippy::disallowed_methods,
    reason = "retry deadlines and latencies use the runtime's clock (madsim's simulated one under --cfg madsim)"
)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cellog_proto::v1::{self, cellog_client::CellogClient, mail_client::MailClient};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use crate::limits::{MAX_CLIENT_MESSAGE, MAX_PUBLISH_BATCH, PUBLISH_BATCH_BYTES};
use crate::status::{detail_of, from_item_error};
use crate::token;

pub use crate::error::ClientError;
use crate::error::protocol_mismatch;

/// How a client behaves. (`Debug` shows whether it has a token, never the token.)
#[derive(Clone)]
pub struct ClientOptions {
    /// How long one call keeps retrying before it gives up.
    pub retry_for: Duration,
    /// Deadline of one attempt.
    pub attempt_timeout: Duration,
    /// First pause between attempts; doubles up to a second.
    pub backoff: Duration,
    /// After a node failed to answer, ask the next node that does for the cell's members and remember their
    /// addresses, so that a client outlives the nodes it was given. Off for a client meant for one node only.
    pub discover: bool,
    /// When an attempt has waited this long for its node, and as often again until it ends, ask every known node
    /// who leads: a leader that stopped answering (paused, cut off from its peers but not from the client) holds a
    /// call until `attempt_timeout` otherwise, long after the cell elected another. The attempt is given up once its
    /// node is silent or names itself leader while another node names a different leader at a later term; it is
    /// retried there when it is safe to repeat, and answered as of unknown outcome when it is not. A node that says
    /// it does not lead (a follower serving a read itself) is never given up on. `None`: wait for `attempt_timeout`.
    /// Needs `discover`.
    pub suspect_after: Option<Duration>,
    /// How often a client that is being answered asks for the cell's members anyway. A client learns a new node
    /// only from a node it knows: if every node it knows leaves the cell within this interval, it is stranded.
    pub discover_every: Duration,
    /// Retry a call the cell refused to slow its caller down (`RATE_LIMITED`, `STORAGE_FULL`) after the pause it
    /// advises, until `retry_for` runs out. Off, such a refusal is returned at once, for a caller that sheds load
    /// itself.
    pub retry_backpressure: bool,
    /// The API token every call carries (`authorization: Bearer TOKEN`), if any. Without one, only a node that serves
    /// callers without credentials (`--insecure`) answers.
    pub token: Option<String>,
    /// TLS toward the cell's nodes; `None`: plaintext.
    pub tls: Option<ClientTls>,
}

/// TLS toward a cell: the cell CA's certificate to verify nodes with, and optionally a client certificate naming the
/// caller's principal (`cellog://CELL/principal/NAME`, made by `cellog certs issue client`), all PEM. (`Debug` shows
/// whether it has an identity, never its key.)
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The cell CA's certificate.
    pub ca_pem: Vec<u8>,
    /// The caller's certificate and key, if it authenticates by certificate.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ClientOptions {
            retry_for,
            attempt_timeout,
            backoff,
            discover,
            suspect_after,
            discover_every,
            retry_backpressure,
            token,
            tls,
        } = self;
        f.debug_struct("ClientOptions")
            .field("retry_for", retry_for)
            .field("attempt_timeout", attempt_timeout)
            .field("backoff", backoff)
            .field("discover", discover)
            .field("suspect_after", suspect_after)
            .field("discover_every", discover_every)
            .field("retry_backpressure", retry_backpressure)
            .field("token", &crate::token::redacted(token))
            .field("tls", tls)
            .finish()
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("identity", &crate::token::redacted(&self.identity))
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            retry_for: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            backoff: Duration::from_millis(50),
            discover: true,
            suspect_after: Some(SUSPECT_AFTER),
            discover_every: DISCOVERY_INTERVAL,
            retry_backpressure: true,
            token: None,
            tls: None,
        }
    }
}

/// What to do after a failed attempt.
enum Next {
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
fn classify(status: &Status, idempotent: bool, retry_backpressure: bool) -> Next {
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

/// The error one item of a batch answer (an ack, a publish of a batch) carries, as a [`ClientError`].
pub fn item_error(error: v1::Error) -> ClientError {
    from_item_error(error).into()
}

/// The items of an ack call's answer, each refusal settled as [`ClientError::settle`] does: when an earlier attempt
/// got no answer, an ack the answered attempt refused may have been applied by that one.
fn settle_items(mut results: Vec<v1::AckResult>, earlier_unknown: bool) -> Vec<v1::AckResult> {
    if earlier_unknown {
        for result in &mut results {
            if let Some(v1::ack_result::Result::Error(error)) = &mut result.result {
                let settled = ClientError::settle(item_error(error.clone()), true);
                if let ClientError::Indefinite { .. } = settled {
                    *error = outcome_unknown_item(&settled);
                }
            }
        }
    }
    results
}

/// An item error that says its outcome is unknown (`UNKNOWN`, `OUTCOME_UNKNOWN`), with why.
fn outcome_unknown_item(error: &ClientError) -> v1::Error {
    let detail = v1::ErrorDetail {
        reason: "OUTCOME_UNKNOWN".to_string(),
        message: error.to_string(),
        ..v1::ErrorDetail::default()
    };
    v1::Error { code: Code::Unknown as i32, detail: Some(detail) }
}

/// How often a client asks the cell for its members, so that it learns of nodes added since it was made.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(10);

/// How long an attempt waits on its node before the client asks the others who leads (see
/// [`ClientOptions::suspect_after`]): shorter than the shortest election timeout (350 ms by default), so that a new
/// leader is found within one interval of its election.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(250);

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

struct Route {
    addrs: Vec<String>,
    current: usize,
    /// A node failed to answer since the members were last asked for.
    stale: bool,
    /// When the members were last asked for.
    discovered_at: Option<Instant>,
    channels: std::collections::BTreeMap<String, Channel>,
}

/// A connection to a cell.
#[derive(Clone)]
pub struct Client {
    route: Arc<Mutex<Route>>,
    options: ClientOptions,
    /// The credential's metadata value, checked once.
    bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

/// A channel to the node at `addr`, which is `host:port`: the scheme follows from `tls` alone, so that an address (from
/// a flag, a membership answer or a leader hint) can never turn a TLS client into a plaintext one.
fn connect(addr: &str, tls: Option<&ClientTls>) -> Result<Channel, ClientError> {
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
fn cellog(channel: Channel) -> CellogClient<Channel> {
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
    /// A client of the cell whose nodes include `addrs` (`host:port`). Connections are made on first use.
    pub fn new(
        addrs: impl IntoIterator<Item = impl Into<String>>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let addrs: Vec<String> = addrs.into_iter().map(Into::into).collect();
        if addrs.is_empty() {
            return Err(ClientError::NoNodes);
        }
        for addr in &addrs {
            connect(addr, options.tls.as_ref())?;
        }
        let bearer = match &options.token {
            Some(token) => {
                token::check(token).map_err(|reason| ClientError::Credential { reason })?;
                let value = format!("{}{token}", token::BEARER);
                Some(value.parse().map_err(|_| ClientError::Credential { reason: "not a header value".to_string() })?)
            }
            None => None,
        };
        let route =
            Route { addrs, current: 0, stale: false, discovered_at: None, channels: std::collections::BTreeMap::new() };
        Ok(Client { route: Arc::new(Mutex::new(route)), options, bearer })
    }

    /// The node the next call goes to.
    pub fn current_addr(&self) -> String {
        let route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        route.addrs[route.current].clone()
    }

    /// The channel to the node the next call goes to.
    fn channel(&self) -> Result<Channel, ClientError> {
        self.channel_to(&self.current_addr())
    }

    /// The channel to the node at `addr`, made on first use.
    fn channel_to(&self, addr: &str) -> Result<Channel, ClientError> {
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(channel) = route.channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = connect(addr, self.options.tls.as_ref())?;
        route.channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// A call's request: the attempt's deadline and the caller's credential.
    fn request<M>(&self, message: M) -> Request<M> {
        let mut request = self.credentials(Request::new(message));
        request.set_timeout(self.options.attempt_timeout);
        request
    }

    /// `request` with the caller's credential, if it has one.
    fn credentials<M>(&self, mut request: Request<M>) -> Request<M> {
        if let Some(value) = &self.bearer {
            request.metadata_mut().insert(token::AUTHORIZATION, value.clone());
        }
        request
    }

    fn current(&self) -> Result<CellogClient<Channel>, ClientError> {
        self.channel().map(cellog)
    }

    fn go_to(&self, addr: String) {
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match route.addrs.iter().position(|known| *known == addr) {
            Some(index) => route.current = index,
            None => {
                route.addrs.push(addr);
                route.current = route.addrs.len() - 1;
            }
        }
    }

    fn next_node(&self) {
        let mut route = self.route.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        route.current = (route.current + 1) % route.addrs.len();
        route.stale = true;
    }

    /// After a node failed to answer, and every [`ClientOptions::discover_every`] anyway: asks the current node for the cell's
    /// members and remembers any new address.
    async fn rediscover(&self) {
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
    async fn deposed(&self, addr: &str) -> Status {
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
    async fn successor(&self, addr: &str, every: Duration) -> Option<Status> {
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
    async fn leader_seen_by(&self, addr: &str, patience: Duration) -> Option<v1::ClusterStatusResponse> {
        let mut request = self.credentials(Request::new(v1::ClusterStatusRequest::default()));
        request.set_timeout(patience);
        let mut client = cellog(self.channel_to(addr).ok()?);
        let answer = tokio::time::timeout(patience, client.cluster_status(request)).await.ok()?.ok()?;
        Some(answer.into_inner())
    }

    /// After a call gave up on `status`: the next call should not try a silent or deposed node first.
    fn after_giving_up(&self, status: &Status) {
        let detail = detail_of(status);
        if detail.reason == "LEADER_CHANGED" && !detail.leader_addr.is_empty() {
            self.go_to(detail.leader_addr);
        } else if unreachable(status) {
            self.next_node();
        }
    }

    /// Follows a failed attempt's advice; false when the call should give up.
    async fn recover(&self, status: &Status, idempotent: bool, deadline: Instant, backoff: &mut Duration) -> bool {
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

    async fn call_on<C, T, M, F, Fut>(
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
    async fn call_tracked<C, T, M, F, Fut>(
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

    /// Seals `payload` for `recipients` (cells) and stores it in this cell's outbox for delivery. An `envelope_id`
    /// makes a retry safe: the same id is stored once.
    pub async fn send_sealed(
        &self,
        recipients: &[String],
        payload: Bytes,
        envelope_id: Option<&str>,
    ) -> Result<v1::SendSealedResponse, ClientError> {
        let request = v1::SendSealedRequest {
            recipients: recipients.to_vec(),
            payload,
            envelope_id: envelope_id.unwrap_or_default().to_string(),
        };
        self.call_mail(envelope_id.is_some(), request, |mut c, r| async move { c.send_sealed(r).await }).await
    }

    /// Each recipient's result for an envelope this cell sent.
    pub async fn delivery_status(&self, envelope_id: &str) -> Result<v1::DeliveryStatusResponse, ClientError> {
        let request = v1::DeliveryStatusRequest { envelope_id: envelope_id.to_string() };
        self.call_mail(true, request, |mut c, r| async move { c.delivery_status(r).await }).await
    }

    /// Hands an envelope to this cell (cell to cell; a repeat is stored once).
    pub async fn deliver(&self, envelope: Bytes) -> Result<v1::DeliverResponse, ClientError> {
        let request = v1::DeliverRequest { envelope };
        self.call_mail(true, request, |mut c, r| async move { c.deliver(r).await }).await
    }

    /// This cell's inbox from `from_seq` on, opened.
    pub async fn read_mail(&self, from_seq: u64, max: u32) -> Result<Vec<v1::OpenedMail>, ClientError> {
        let request = v1::ReadMailRequest { from_seq, max };
        Ok(self.call_mail(true, request, |mut c, r| async move { c.read_mail(r).await }).await?.mail)
    }

    /// Replaces a stored message's payload with a tombstone (its id stays remembered).
    pub async fn recall(&self, stream: &str, partition: u32, seq: u64) -> Result<(), ClientError> {
        let request = v1::RecallRequest { stream: stream.to_string(), partition, seq };
        self.call(true, request, |mut c, r| async move { c.recall(r).await }).await?;
        Ok(())
    }

    /// Creates a stream (the same config again is a success with `created` false).
    pub async fn create_stream(&self, name: &str, config: v1::StreamConfig) -> Result<bool, ClientError> {
        let request = v1::CreateStreamRequest { name: name.to_string(), config: Some(config) };
        let response = self.call(true, request, |mut c, r| async move { c.create_stream(r).await }).await?;
        Ok(response.created)
    }

    /// Changes a stream's limits.
    pub async fn update_stream(&self, name: &str, config: v1::StreamConfig) -> Result<(), ClientError> {
        let request = v1::UpdateStreamRequest { name: name.to_string(), config: Some(config) };
        self.call(true, request, |mut c, r| async move { c.update_stream(r).await }).await?;
        Ok(())
    }

    /// Deletes a stream and everything in it.
    pub async fn delete_stream(&self, name: &str) -> Result<(), ClientError> {
        let request = v1::DeleteStreamRequest { name: name.to_string() };
        self.call(false, request, |mut c, r| async move { c.delete_stream(r).await }).await?;
        Ok(())
    }

    /// Every stream.
    pub async fn list_streams(&self) -> Result<Vec<v1::StreamInfo>, ClientError> {
        let response =
            self.call(true, v1::ListStreamsRequest {}, |mut c, r| async move { c.list_streams(r).await }).await?;
        Ok(response.streams)
    }

    /// One stream.
    pub async fn stream_info(&self, name: &str) -> Result<v1::StreamInfo, ClientError> {
        let request = v1::GetStreamRequest { name: name.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_stream(r).await }).await
    }

    /// Publishes one message. With a message id it is retried through failovers and lands exactly once.
    pub async fn publish(&self, request: v1::PublishRequest) -> Result<v1::PublishAck, ClientError> {
        let idempotent = request.msg_id.is_some();
        self.call(idempotent, request, |mut c, r| async move { c.publish(r).await }).await
    }

    /// Publishes many messages pipelined, at most `window` unanswered at once, and returns one result per message in
    /// the order given, with the time from its (last) send to its ack.
    pub async fn publish_batch(&self, requests: Vec<v1::PublishRequest>, window: usize) -> Vec<BatchResult> {
        let window = window.max(1);
        let mut results: Vec<Option<BatchResult>> = vec![None; requests.len()];
        let mut todo: VecDeque<usize> = (0..requests.len()).collect();
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        // Per message: whether an attempt of it went out and got no answer, so that it may have been applied.
        let mut unanswered = vec![false; requests.len()];
        while !todo.is_empty() {
            let failure = match self.current() {
                Ok(client) => {
                    self.publish_round(client, &requests, &mut todo, &mut results, &mut unanswered, window).await
                }
                Err(error) => Some((Status::unavailable(error.to_string()), None)),
            };
            let Some((status, failed_at)) = failure else { continue };
            // Messages from the one that failed on were not answered: retry those that are safe to retry.
            let idempotent = failed_at.is_none_or(|index| requests[index].msg_id.is_some());
            if !self.recover(&status, idempotent, deadline, &mut backoff).await {
                self.after_giving_up(&status);
                let error = ClientError::from(status);
                for index in todo.drain(..) {
                    let error = ClientError::settle(error.clone(), unanswered[index]);
                    results[index] = Some(BatchResult { result: Err(error), latency: Duration::ZERO });
                }
                break;
            }
        }
        if results.iter().any(|result| result.as_ref().is_some_and(|result| result.result.is_ok())) {
            self.rediscover().await;
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or(BatchResult { result: Err(ClientError::NoNodes), latency: Duration::ZERO }))
            .collect()
    }

    /// One pass over `todo` on one connection. Returns the status that ended it early and the message it concerned;
    /// marks in `unanswered` each message that went out and may have been applied without an answer.
    async fn publish_round(
        &self,
        mut client: CellogClient<Channel>,
        requests: &[v1::PublishRequest],
        todo: &mut VecDeque<usize>,
        results: &mut [Option<BatchResult>],
        unanswered: &mut [bool],
        window: usize,
    ) -> Option<(Status, Option<usize>)> {
        // The messages in flight when the call broke went out and got no answer.
        let broke = |in_flight: &VecDeque<(usize, Instant)>, unanswered: &mut [bool], status: &Status| {
            if ClientError::from(status.clone()).outcome_unknown() {
                in_flight.iter().for_each(|(index, _)| unanswered[*index] = true);
            }
        };
        // Each request carries the messages that fit in the window, up to a quarter of it, so that answers to the
        // first requests free room while the later ones are still being committed.
        let per_request = (window / 4).clamp(1, MAX_PUBLISH_BATCH);
        // Every request in flight carries at least one message, so the channel never holds more than `window`.
        let (sender, receiver) = mpsc::channel::<v1::PublishBatchRequest>(window);
        let outgoing = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let mut in_flight: VecDeque<(usize, Instant)> = VecDeque::new();
        // Prime the window before opening the call, so the first messages go out with it.
        Self::send_more(&sender, requests, todo, &mut in_flight, window, per_request);
        // A node that stopped answering (paused, cut off, hung) must not hold the batch for ever: opening the call, and
        // each answer while messages are in flight, takes at most one attempt's deadline.
        // A leader deposed meanwhile gives the call up sooner (see `ClientOptions::suspect_after`).
        let silent = || Status::deadline_exceeded("the node did not answer within the attempt deadline");
        let addr = self.current_addr();
        let opening = tokio::time::timeout(
            self.options.attempt_timeout,
            client.publish_batch(self.credentials(Request::new(outgoing))),
        );
        let opened = tokio::select! {
            biased;
            opened = opening => opened.unwrap_or_else(|_| Err(silent())),
            deposed = self.deposed(&addr) => Err(deposed),
        };
        let mut answers = match opened {
            Ok(response) => response.into_inner(),
            Err(status) => {
                broke(&in_flight, unanswered, &status);
                Self::requeue(todo, &mut in_flight);
                return Some((status, None));
            }
        };
        let mut sender = Some(sender);
        loop {
            if todo.is_empty() {
                // Closing our side lets the node end the call once it has answered everything.
                if in_flight.is_empty() {
                    return None;
                }
                sender = None;
            }
            if let Some(open) = &sender {
                Self::send_more(open, requests, todo, &mut in_flight, window, per_request);
            }
            let next = tokio::time::timeout(self.options.attempt_timeout, answers.message());
            let answer = tokio::select! {
                biased;
                answer = next => answer.unwrap_or_else(|_| Err(silent())),
                deposed = self.deposed(&addr) => Err(deposed),
            };
            let answer = match answer {
                Ok(Some(answer)) => answer,
                Ok(None) if in_flight.is_empty() && todo.is_empty() => return None,
                Ok(None) => {
                    let front = in_flight.front().map(|(index, _)| *index);
                    let status = Status::unavailable("the node ended the batch early");
                    broke(&in_flight, unanswered, &status);
                    Self::requeue(todo, &mut in_flight);
                    return Some((status, front));
                }
                Err(status) => {
                    let front = in_flight.front().map(|(index, _)| *index);
                    broke(&in_flight, unanswered, &status);
                    Self::requeue(todo, &mut in_flight);
                    return Some((status, front));
                }
            };
            // The answers continue the call's sequence: one per message sent, in order.
            for answer in answer.results {
                let Some((index, sent)) = in_flight.pop_front() else {
                    return Some((Status::internal("the node answered more messages than were sent"), None));
                };
                match answer.result {
                    Some(v1::publish_result::Result::Ack(ack)) => {
                        results[index] = Some(BatchResult { result: Ok(ack), latency: sent.elapsed() });
                    }
                    Some(v1::publish_result::Result::Error(error)) => {
                        let status = from_item_error(error);
                        let retryable = !matches!(
                            classify(&status, requests[index].msg_id.is_some(), self.options.retry_backpressure),
                            Next::Fail
                        );
                        if retryable {
                            // Those sent after it are dropped with the call unanswered; it was answered itself.
                            broke(&in_flight, unanswered, &Status::cancelled("the batch was given up"));
                            unanswered[index] |= ClientError::from(status.clone()).outcome_unknown();
                            in_flight.push_front((index, sent));
                            Self::requeue(todo, &mut in_flight);
                            return Some((status, Some(index)));
                        }
                        let error = ClientError::settle(status.into(), unanswered[index]);
                        results[index] = Some(BatchResult { result: Err(error), latency: sent.elapsed() });
                    }
                    None => {
                        results[index] = Some(BatchResult {
                            result: Err(Status::internal("an empty answer").into()),
                            latency: sent.elapsed(),
                        });
                    }
                }
            }
        }
    }

    /// Sends the next messages of `todo` on a call while fewer than `window` are in flight, at most `per_request` in
    /// one request and, past its first, at most [`PUBLISH_BATCH_BYTES`] of them. A request the call no longer takes
    /// (it ended) puts its messages back, unsent.
    fn send_more(
        sender: &mpsc::Sender<v1::PublishBatchRequest>,
        requests: &[v1::PublishRequest],
        todo: &mut VecDeque<usize>,
        in_flight: &mut VecDeque<(usize, Instant)>,
        window: usize,
        per_request: usize,
    ) {
        while in_flight.len() < window && !todo.is_empty() {
            let room = per_request.min(window - in_flight.len());
            let mut messages = Vec::with_capacity(room.min(todo.len()));
            let mut bytes = 0;
            while messages.len() < room
                && let Some(&index) = todo.front()
            {
                let size = requests[index].encoded_len();
                if !messages.is_empty() && bytes + size > PUBLISH_BATCH_BYTES {
                    break;
                }
                bytes += size;
                todo.pop_front();
                messages.push(requests[index].clone());
                in_flight.push_back((index, Instant::now()));
            }
            let sent = messages.len();
            if sender.try_send(v1::PublishBatchRequest { messages }).is_err() {
                for _ in 0..sent {
                    let (index, _) = in_flight.pop_back().expect("the request's messages are in flight");
                    todo.push_front(index);
                }
                return;
            }
        }
    }

    /// Puts unanswered messages back at the front of `todo`, in order.
    fn requeue(todo: &mut VecDeque<usize>, in_flight: &mut VecDeque<(usize, Instant)>) {
        while let Some((index, _)) = in_flight.pop_back() {
            todo.push_front(index);
        }
    }

    /// Reads stored messages of a partition from `from_seq` on; `local` reads this node's replica as it is.
    pub async fn read(
        &self,
        stream: &str,
        partition: u32,
        from_seq: u64,
        max: u32,
        local: bool,
    ) -> Result<v1::ReadResponse, ClientError> {
        let request = v1::ReadRequest { stream: stream.to_string(), partition, from_seq, max, local };
        if local {
            // A local read is about this node: never redirected.
            return Ok(self.current()?.read(self.request(request)).await?.into_inner());
        }
        self.call(true, request, |mut c, r| async move { c.read(r).await }).await
    }

    /// Creates a consumer (the same config again is a success with `created` false).
    pub async fn create_consumer(
        &self,
        stream: &str,
        name: &str,
        config: v1::ConsumerConfig,
    ) -> Result<bool, ClientError> {
        let request =
            v1::CreateConsumerRequest { stream: stream.to_string(), name: name.to_string(), config: Some(config) };
        let response = self.call(true, request, |mut c, r| async move { c.create_consumer(r).await }).await?;
        Ok(response.created)
    }

    /// Changes a consumer's ack wait, max deliver and max in flight (its filter and deliver policy are fixed).
    pub async fn update_consumer(
        &self,
        stream: &str,
        name: &str,
        config: v1::ConsumerConfig,
    ) -> Result<(), ClientError> {
        let request =
            v1::UpdateConsumerRequest { stream: stream.to_string(), name: name.to_string(), config: Some(config) };
        self.call(true, request, |mut c, r| async move { c.update_consumer(r).await }).await?;
        Ok(())
    }

    /// Deletes a consumer.
    pub async fn delete_consumer(&self, stream: &str, name: &str) -> Result<(), ClientError> {
        let request = v1::DeleteConsumerRequest { stream: stream.to_string(), name: name.to_string() };
        self.call(false, request, |mut c, r| async move { c.delete_consumer(r).await }).await?;
        Ok(())
    }

    /// Creates principal `name` with `grants`, or replaces an existing one's grants (its tokens stay). Returns whether
    /// it was created.
    pub async fn put_principal(&self, name: &str, grants: v1::Grants) -> Result<bool, ClientError> {
        let request = v1::PutPrincipalRequest { name: name.to_string(), grants: Some(grants) };
        Ok(self.call(true, request, |mut c, r| async move { c.put_principal(r).await }).await?.created)
    }

    /// Deletes a principal and its tokens.
    pub async fn delete_principal(&self, name: &str) -> Result<(), ClientError> {
        let request = v1::DeletePrincipalRequest { name: name.to_string() };
        self.call(false, request, |mut c, r| async move { c.delete_principal(r).await }).await?;
        Ok(())
    }

    /// The cell's principals, in name order.
    pub async fn list_principals(&self) -> Result<Vec<v1::Principal>, ClientError> {
        let request = v1::ListPrincipalsRequest {};
        Ok(self.call(true, request, |mut c, r| async move { c.list_principals(r).await }).await?.principals)
    }

    /// Gives `principal` the token whose SHA-256 is `token_sha256` (see [`crate::token::hash`]).
    pub async fn add_token(&self, principal: &str, token_sha256: [u8; 32]) -> Result<(), ClientError> {
        let request = v1::AddTokenRequest {
            principal: principal.to_string(),
            token_sha256: Bytes::copy_from_slice(&token_sha256),
        };
        self.call(true, request, |mut c, r| async move { c.add_token(r).await }).await?;
        Ok(())
    }

    /// Revokes the token whose SHA-256 is `token_sha256`.
    pub async fn revoke_token(&self, token_sha256: [u8; 32]) -> Result<(), ClientError> {
        let request = v1::RevokeTokenRequest { token_sha256: Bytes::copy_from_slice(&token_sha256) };
        self.call(false, request, |mut c, r| async move { c.revoke_token(r).await }).await?;
        Ok(())
    }

    /// The caller's principal and grants.
    pub async fn who_am_i(&self) -> Result<v1::Principal, ClientError> {
        self.call(true, v1::WhoAmIRequest {}, |mut c, r| async move { c.who_am_i(r).await }).await
    }

    /// Registers a peer of `stream` (a mirror, another cell): retention keeps what it has not received. Registering
    /// a registered peer changes nothing.
    pub async fn register_peer(&self, stream: &str, peer: &str) -> Result<(), ClientError> {
        let request = v1::RegisterPeerRequest { stream: stream.to_string(), peer: peer.to_string() };
        self.call(true, request, |mut c, r| async move { c.register_peer(r).await }).await?;
        Ok(())
    }

    /// Records that `peer` has received `partition` of `stream` up to `received_seq` (the watermark never goes back,
    /// so a repeat is harmless).
    pub async fn peer_progress(
        &self,
        stream: &str,
        peer: &str,
        partition: u32,
        received_seq: u64,
    ) -> Result<(), ClientError> {
        let request =
            v1::PeerProgressRequest { stream: stream.to_string(), peer: peer.to_string(), partition, received_seq };
        self.call(true, request, |mut c, r| async move { c.peer_progress(r).await }).await?;
        Ok(())
    }

    /// Removes a peer; retention no longer waits for it.
    pub async fn unregister_peer(&self, stream: &str, peer: &str) -> Result<(), ClientError> {
        let request = v1::UnregisterPeerRequest { stream: stream.to_string(), peer: peer.to_string() };
        self.call(false, request, |mut c, r| async move { c.unregister_peer(r).await }).await?;
        Ok(())
    }

    /// The directory records `cell` with its nodes' client addresses (replacing those it held); true when it is new.
    pub async fn put_cell(&self, cell: &str, addresses: Vec<String>) -> Result<bool, ClientError> {
        let request = v1::PutCellRequest { cell: cell.to_string(), addresses };
        Ok(self.call(true, request, |mut c, r| async move { c.put_cell(r).await }).await?.created)
    }

    /// Every cell the directory records, with its addresses.
    pub async fn list_cells(&self) -> Result<Vec<v1::CellAddresses>, ClientError> {
        Ok(self.call(true, v1::ListCellsRequest {}, |mut c, r| async move { c.list_cells(r).await }).await?.cells)
    }

    /// The directory places `stream` on `cell` at epoch 1 (the same placement again changes nothing).
    pub async fn place_stream(&self, stream: &str, cell: &str) -> Result<v1::Placement, ClientError> {
        let request = v1::PlaceStreamRequest { stream: stream.to_string(), cell: cell.to_string() };
        self.call(true, request, |mut c, r| async move { c.place_stream(r).await }).await
    }

    /// The directory records a move of `stream` to `to` at the epoch after `epoch`, if `epoch` is current (the same
    /// move again is answered alike).
    pub async fn move_placement(&self, stream: &str, to: &str, epoch: u64) -> Result<v1::Placement, ClientError> {
        let request = v1::MoveStreamRequest { stream: stream.to_string(), to: to.to_string(), epoch };
        self.call(true, request, |mut c, r| async move { c.move_stream(r).await }).await
    }

    /// The directory records the move of `stream` at `epoch` done.
    pub async fn finish_move(&self, stream: &str, epoch: u64) -> Result<v1::Placement, ClientError> {
        let request = v1::FinishMoveRequest { stream: stream.to_string(), epoch };
        self.call(true, request, |mut c, r| async move { c.finish_move(r).await }).await
    }

    /// Where `stream` lives, as the directory records it.
    pub async fn locate_stream(&self, stream: &str) -> Result<v1::StreamLocation, ClientError> {
        let request = v1::LocateStreamRequest { stream: stream.to_string() };
        self.call(true, request, |mut c, r| async move { c.locate_stream(r).await }).await
    }

    /// This cell stops taking writes to `stream` from `epoch` on (it moved to `to`); the answer holds where each
    /// partition ended.
    pub async fn fence_stream(&self, stream: &str, epoch: u64, to: &str) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::FenceStreamRequest { stream: stream.to_string(), epoch, to: to.to_string() };
        self.call(true, request, |mut c, r| async move { c.fence_stream(r).await }).await
    }

    /// `stream` moves to this cell at `epoch` from `from`: writes wait until it is accepted. With a `config`, a cell
    /// that does not hold the stream creates it in the same step.
    pub async fn receive_stream(
        &self,
        stream: &str,
        epoch: u64,
        from: &str,
        config: Option<v1::StreamConfig>,
    ) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::ReceiveStreamRequest { stream: stream.to_string(), epoch, from: from.to_string(), config };
        self.call(true, request, |mut c, r| async move { c.receive_stream(r).await }).await
    }

    /// Copies messages into `stream` moving here, at their positions (what is here already is passed over).
    pub async fn ingest(
        &self,
        stream: &str,
        epoch: u64,
        messages: Vec<v1::Message>,
        through: Vec<u64>,
    ) -> Result<v1::IngestMessagesResponse, ClientError> {
        let request = v1::IngestMessagesRequest { stream: stream.to_string(), epoch, messages, through };
        self.call(true, request, |mut c, r| async move { c.ingest_messages(r).await }).await
    }

    /// This cell takes writes to `stream` from `epoch` on, once it holds every partition `through` those positions.
    pub async fn accept_stream(
        &self,
        stream: &str,
        epoch: u64,
        through: Vec<u64>,
    ) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::AcceptStreamRequest { stream: stream.to_string(), epoch, through };
        self.call(true, request, |mut c, r| async move { c.accept_stream(r).await }).await
    }

    /// Creates `name` on this cell as a mirror of `source_stream` on `source_cell` (whose nodes `source_addresses`
    /// reach); answers whether it was created (false: the same mirror existed).
    pub async fn create_mirror(
        &self,
        name: &str,
        config: v1::StreamConfig,
        source_cell: &str,
        source_stream: &str,
        source_addresses: Vec<String>,
    ) -> Result<bool, ClientError> {
        let request = v1::CreateMirrorRequest {
            name: name.to_string(),
            config: Some(config),
            source_cell: source_cell.to_string(),
            source_stream: source_stream.to_string(),
            source_addresses,
        };
        let created: v1::CreateMirrorResponse =
            self.call(true, request, |mut c, r| async move { c.create_mirror(r).await }).await?;
        Ok(created.created)
    }

    /// This cell's mirrors and how far each is, as its leader sees them.
    pub async fn list_mirrors(&self) -> Result<Vec<v1::MirrorStatus>, ClientError> {
        let answer: v1::ListMirrorsResponse =
            self.call(true, v1::ListMirrorsRequest {}, |mut c, r| async move { c.list_mirrors(r).await }).await?;
        Ok(answer.mirrors)
    }

    /// On a mirror's source: registers the mirror `peer` of `stream`.
    pub async fn register_mirror(&self, stream: &str, peer: &str) -> Result<(), ClientError> {
        let request = v1::RegisterMirrorRequest { stream: stream.to_string(), peer: peer.to_string() };
        self.call(true, request, |mut c, r| async move { c.register_mirror(r).await }).await?;
        Ok(())
    }

    /// On a mirror's source: one read for the mirror `peer` (see `MirrorRead`).
    pub async fn mirror_read(
        &self,
        stream: &str,
        peer: &str,
        from: Vec<u64>,
        max: u32,
        recalls_from: u64,
    ) -> Result<v1::MirrorReadResponse, ClientError> {
        let request =
            v1::MirrorReadRequest { stream: stream.to_string(), peer: peer.to_string(), from, max, recalls_from };
        self.call(true, request, |mut c, r| async move { c.mirror_read(r).await }).await
    }

    /// On a mirror's source: what the mirror `peer` holds and how many logged recalls it applied.
    pub async fn mirror_progress(
        &self,
        stream: &str,
        peer: &str,
        received: Vec<u64>,
        recalls_applied: u64,
    ) -> Result<(), ClientError> {
        let request =
            v1::MirrorProgressRequest { stream: stream.to_string(), peer: peer.to_string(), received, recalls_applied };
        self.call(true, request, |mut c, r| async move { c.mirror_progress(r).await }).await?;
        Ok(())
    }

    /// `stream`'s ownership as this cell sees it.
    pub async fn ownership(&self, stream: &str) -> Result<v1::StreamOwnership, ClientError> {
        let request = v1::GetOwnershipRequest { stream: stream.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_ownership(r).await }).await
    }

    /// Every consumer of a stream.
    pub async fn list_consumers(&self, stream: &str) -> Result<Vec<v1::ConsumerInfo>, ClientError> {
        let request = v1::ListConsumersRequest { stream: stream.to_string() };
        Ok(self.call(true, request, |mut c, r| async move { c.list_consumers(r).await }).await?.consumers)
    }

    /// One consumer.
    pub async fn consumer_info(&self, stream: &str, name: &str) -> Result<v1::ConsumerInfo, ClientError> {
        let request = v1::GetConsumerRequest { stream: stream.to_string(), name: name.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_consumer(r).await }).await
    }

    /// Takes up to `max` deliveries for `member`. Not retried when its outcome is unknown: deliveries it may have
    /// made come back after their ack wait.
    pub async fn fetch(
        &self,
        stream: &str,
        consumer: &str,
        member: &str,
        max: u32,
    ) -> Result<Vec<v1::Delivery>, ClientError> {
        let request = v1::FetchRequest {
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            member: member.to_string(),
            max,
        };
        Ok(self.call(false, request, |mut c, r| async move { c.fetch(r).await }).await?.deliveries)
    }

    /// Opens a push subscription at the leader.
    pub async fn subscribe(
        &self,
        stream: &str,
        consumer: &str,
        member: &str,
        max_in_flight: u32,
    ) -> Result<tonic::Streaming<v1::Delivery>, ClientError> {
        let request = v1::SubscribeRequest {
            stream: stream.to_string(),
            consumer: consumer.to_string(),
            member: member.to_string(),
            max_in_flight,
        };
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        loop {
            let status = match self.current()?.subscribe(self.credentials(Request::new(request.clone()))).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if !self.recover(&status, true, deadline, &mut backoff).await {
                return Err(status.into());
            }
        }
    }

    /// Answers deliveries; one result per item. Acks are idempotent, so they are retried through failovers.
    pub async fn ack(
        &self,
        stream: &str,
        consumer: &str,
        acks: Vec<v1::AckItem>,
    ) -> Result<Vec<v1::AckResult>, ClientError> {
        let request = v1::AckRequest { stream: stream.to_string(), consumer: consumer.to_string(), acks };
        let call = |mut c: CellogClient<Channel>, r| async move { c.ack(r).await };
        let (response, earlier_unknown) = self.call_tracked(cellog, true, request, call).await?;
        Ok(settle_items(response.results, earlier_unknown))
    }

    /// Joins a consumer group as `member` (a new incarnation if it was in it): its assignment. Not retried when its
    /// outcome is unknown: a join that landed unanswered is fenced by the next one.
    pub async fn join_group(&self, request: v1::JoinGroupRequest) -> Result<v1::GroupAssignment, ClientError> {
        self.call(false, request, |mut c, r| async move { c.join_group(r).await }).await
    }

    /// A member's heartbeat, releasing `released`: its assignment. Retried through failovers (a release repeated
    /// changes nothing more).
    pub async fn heartbeat(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        released: Vec<u32>,
    ) -> Result<v1::GroupAssignment, ClientError> {
        let request = v1::HeartbeatRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            released,
        };
        self.call(true, request, |mut c, r| async move { c.heartbeat(r).await }).await
    }

    /// Leaves a group: whether it was a member.
    pub async fn leave_group(&self, stream: &str, group: &str, member: &str) -> Result<bool, ClientError> {
        let request =
            v1::LeaveGroupRequest { stream: stream.to_string(), group: group.to_string(), member: member.to_string() };
        Ok(self.call(true, request, |mut c, r| async move { c.leave_group(r).await }).await?.was_member)
    }

    /// A stream's consumer groups.
    pub async fn list_groups(&self, stream: &str) -> Result<Vec<v1::GroupInfo>, ClientError> {
        let request = v1::ListGroupsRequest { stream: stream.to_string() };
        Ok(self.call(true, request, |mut c, r| async move { c.list_groups(r).await }).await?.groups)
    }

    /// One consumer group: members, generation, owners, lag.
    pub async fn group_info(&self, stream: &str, group: &str) -> Result<v1::GroupInfo, ClientError> {
        let request = v1::GetGroupRequest { stream: stream.to_string(), group: group.to_string() };
        self.call(true, request, |mut c, r| async move { c.get_group(r).await }).await
    }

    /// Takes up to `max` deliveries for a member from the partitions it owns; the group's generation comes with them.
    /// Not retried when its outcome is unknown: deliveries it may have made come back after their ack wait.
    pub async fn member_fetch(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        max: u32,
    ) -> Result<v1::MemberFetchResponse, ClientError> {
        let request = v1::MemberFetchRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            max,
        };
        self.call(false, request, |mut c, r| async move { c.member_fetch(r).await }).await
    }

    /// Opens a member's push subscription at the leader; it ends when the group's generation moves.
    pub async fn member_subscribe(
        &self,
        request: v1::MemberSubscribeRequest,
    ) -> Result<tonic::Streaming<v1::Delivery>, ClientError> {
        let deadline = Instant::now() + self.options.retry_for;
        let mut backoff = self.options.backoff;
        loop {
            let status = match self.current()?.member_subscribe(self.credentials(Request::new(request.clone()))).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            if !self.recover(&status, true, deadline, &mut backoff).await {
                return Err(status.into());
            }
        }
    }

    /// Answers a member's deliveries; one result per item (NOT_OWNER for a partition it no longer owns since
    /// `generation`).
    pub async fn member_ack(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        acks: Vec<v1::AckItem>,
    ) -> Result<Vec<v1::AckResult>, ClientError> {
        let request = v1::MemberAckRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            acks,
        };
        let call = |mut c: CellogClient<Channel>, r| async move { c.member_ack(r).await };
        let (response, earlier_unknown) = self.call_tracked(cellog, true, request, call).await?;
        Ok(settle_items(response.results, earlier_unknown))
    }

    /// Commits a partition's position as a member: everything below `next_seq` is done.
    pub async fn member_commit(
        &self,
        stream: &str,
        group: &str,
        member: &str,
        generation: u64,
        partition: u32,
        next_seq: u64,
    ) -> Result<u64, ClientError> {
        let request = v1::MemberCommitRequest {
            stream: stream.to_string(),
            group: group.to_string(),
            member: member.to_string(),
            generation,
            partition,
            next_seq,
        };
        Ok(self.call(true, request, |mut c, r| async move { c.member_commit(r).await }).await?.next_seq)
    }

    /// Registers a transactional producer, fencing older instances.
    pub async fn init_producer(
        &self,
        transactional_id: &str,
        transaction_timeout_ms: u64,
    ) -> Result<v1::ProducerRef, ClientError> {
        let request =
            v1::InitProducerRequest { transactional_id: transactional_id.to_string(), transaction_timeout_ms };
        self.call(false, request, |mut c, r| async move { c.init_producer(r).await }).await
    }

    /// Opens a transaction.
    pub async fn begin(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(false, producer, |mut c, r| async move { c.begin_transaction(r).await }).await
    }

    /// Validates the open transaction.
    pub async fn prepare(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(false, producer, |mut c, r| async move { c.prepare_transaction(r).await }).await
    }

    /// Commits the transaction. A retried commit gets the first commit's answer, so it is retried through failovers.
    pub async fn commit(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(true, producer, |mut c, r| async move { c.commit_transaction(r).await }).await
    }

    /// Aborts the transaction (retried like a commit).
    pub async fn abort(&self, producer: v1::ProducerRef) -> Result<v1::TransactionResponse, ClientError> {
        self.call(true, producer, |mut c, r| async move { c.abort_transaction(r).await }).await
    }

    /// The status of the node the client talks to (not redirected): its role, term and indexes, the leader and the
    /// members, without the state's digest (`state_digest` is empty).
    pub async fn cluster_status(&self) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.status_call(v1::ClusterStatusRequest::default()).await
    }

    /// The same, with the digest of the node's applied state (`state_digest`), to compare replicas. The node encodes
    /// its whole state for it, and applies nothing meanwhile.
    pub async fn cluster_status_with_digest(&self) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.status_call(v1::ClusterStatusRequest { state_digest: true, ..Default::default() }).await
    }

    /// The same, with the digest of each part of the node's applied state as well (`digest_parts`), to find where two
    /// replicas differ.
    pub async fn cluster_status_with_parts(&self) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.status_call(v1::ClusterStatusRequest { state_digest: true, digest_parts: true }).await
    }

    async fn status_call(&self, request: v1::ClusterStatusRequest) -> Result<v1::ClusterStatusResponse, ClientError> {
        let request = self.request(request);
        let addr = self.current_addr();
        match self.current()?.cluster_status(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(protocol_mismatch(&status, &addr, self.options.tls.is_some())
                .unwrap_or_else(|| ClientError::from(status))),
        }
    }

    /// Adds a node as a learner and waits until it has caught up.
    pub async fn add_learner(
        &self,
        node_id: u64,
        raft_addr: &str,
        client_addr: &str,
    ) -> Result<v1::ClusterStatusResponse, ClientError> {
        let request =
            v1::AddLearnerRequest { node_id, raft_addr: raft_addr.to_string(), client_addr: client_addr.to_string() };
        self.call(true, request, |mut c, r| async move { c.add_learner(r).await }).await
    }

    /// Makes a learner a voter.
    pub async fn promote(&self, node_id: u64) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.call(true, v1::PromoteRequest { node_id }, |mut c, r| async move { c.promote(r).await }).await
    }

    /// Removes a node from the cell.
    pub async fn remove_node(&self, node_id: u64) -> Result<v1::ClusterStatusResponse, ClientError> {
        self.call(true, v1::RemoveNodeRequest { node_id }, |mut c, r| async move { c.remove_node(r).await }).await
    }
}

/// The answer to one message of a batch.
#[derive(Clone, Debug)]
pub struct BatchResult {
    /// Where it landed, or why not.
    pub result: Result<v1::PublishAck, ClientError>,
    /// From its last send to its ack.
    pub latency: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: Code, reason: &str) -> ClientError {
        ClientError::Status { code, detail: v1::ErrorDetail { reason: reason.to_string(), ..Default::default() } }
    }

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

    /// `Debug` output of options shows that a token and a key are there, never what they are.
    #[test]
    fn debug_output_shows_no_secret() {
        let options = ClientOptions {
            token: Some("cellog_the-token-itself-0123456789abcdef".to_string()),
            tls: Some(ClientTls {
                ca_pem: b"the CA".to_vec(),
                identity: Some((b"the certificate".to_vec(), b"the private key".to_vec())),
            }),
            ..ClientOptions::default()
        };
        let shown = format!("{options:?} {options:#?}");
        for secret in ["the-token-itself", "private key", "112, 114, 105"] {
            assert!(!shown.contains(secret), "{secret:?} in {shown}");
        }
        assert!(shown.contains("token: Some(\"<redacted>\")"), "{shown}");
    }

    #[test]
    fn only_a_refusal_is_a_definite_failure() {
        assert!(!error(Code::Unavailable, "NOT_LEADER").outcome_unknown(), "refused before the log");
        assert!(error(Code::Unavailable, "LEADER_CHANGED").outcome_unknown(), "handed to Raft, may commit");
        assert!(error(Code::Unavailable, "").outcome_unknown(), "a broken connection");
        assert!(error(Code::DeadlineExceeded, "").outcome_unknown(), "a timeout");
        assert!(error(Code::Unknown, "OUTCOME_UNKNOWN").outcome_unknown());
        assert!(!error(Code::FailedPrecondition, "FENCED").outcome_unknown());
        assert!(!error(Code::Aborted, "TRANSACTION_ABORTED").outcome_unknown());
        assert!(!error(Code::NotFound, "STREAM_NOT_FOUND").outcome_unknown());
        assert!(!ClientError::NoNodes.outcome_unknown());
    }

    #[test]
    fn a_refusal_after_an_unanswered_attempt_leaves_the_outcome_unknown() {
        let not_leader = error(Code::Unavailable, "NOT_LEADER");
        assert!(!ClientError::settle(not_leader.clone(), false).outcome_unknown(), "nothing went out unanswered");
        let settled = ClientError::settle(not_leader, true);
        assert!(settled.outcome_unknown(), "an earlier attempt may have been applied: {settled}");
        assert_eq!(settled.reason(), Some("NOT_LEADER"));
        let limited = ClientError::settle(error(Code::ResourceExhausted, "RATE_LIMITED"), true);
        assert!(limited.outcome_unknown());
        // A verdict of the cell on the call itself stays one: a repeat is answered by the state it left.
        assert!(!ClientError::settle(error(Code::FailedPrecondition, "FENCED"), true).outcome_unknown());
        assert!(!ClientError::settle(error(Code::NotFound, "STREAM_NOT_FOUND"), true).outcome_unknown());
        // A member's standing that moved on in between is no verdict on an attempt that went before it.
        for reason in ["UNKNOWN_MEMBER", "NOT_OWNER"] {
            let moved = error(Code::FailedPrecondition, reason);
            assert!(!ClientError::settle(moved.clone(), false).outcome_unknown(), "{reason}, nothing unanswered");
            let settled = ClientError::settle(moved, true);
            assert!(settled.outcome_unknown(), "{reason} after an unanswered attempt: {settled}");
            assert_eq!(settled.reason(), Some(reason));
        }
    }

    #[test]
    fn an_ack_item_refused_after_an_unanswered_attempt_is_answered_as_unknown() {
        let refused = |reason: &str| v1::AckResult {
            result: Some(v1::ack_result::Result::Error(v1::Error {
                code: Code::FailedPrecondition as i32,
                detail: Some(v1::ErrorDetail { reason: reason.to_string(), ..Default::default() }),
            })),
            already_done: false,
        };
        let reason = |result: &v1::AckResult| match &result.result {
            Some(v1::ack_result::Result::Error(error)) => error.detail.as_ref().map(|d| d.reason.clone()),
            _ => None,
        };
        let answered = vec![refused("NOT_OWNER"), refused("NOT_DELIVERED")];
        let kept = settle_items(answered.clone(), false);
        assert_eq!(
            kept.iter().map(reason).collect::<Vec<_>>(),
            [Some("NOT_OWNER".into()), Some("NOT_DELIVERED".into())]
        );
        let settled = settle_items(answered, true);
        assert_eq!(
            settled.iter().map(reason).collect::<Vec<_>>(),
            [Some("OUTCOME_UNKNOWN".into()), Some("NOT_DELIVERED".into())],
            "a refusal that the state an earlier attempt left explains stays one"
        );
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
