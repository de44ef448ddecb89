//! The node's HTTP port, one router: Prometheus metrics (`/metrics`), the client API over JSON (`/v1/…`: the
//! operations of `cellog.v1.Cellog` with their messages in the protobuf JSON mapping, routed by one table that also
//! writes the OpenAPI document at `/v1/openapi.json`), live tails of a stream over server-sent events and WebSocket,
//! and the web console (`/console`). Not in simulation builds, which have no HTTP transport.
//!
//! - [`routes`]: the table of routes, each an operation of the gRPC service at a path.
//! - [`api`]: a request's JSON (body, query and path) into the operation's request message, the call on the same
//!   [`CellogService`] gRPC serves, and its answer or error as JSON.
//! - [`error`]: the error contract of gRPC (reason, retry advice, leader) as a JSON body with the HTTP status.
//! - [`tail`]: a stream's messages as they are applied, read from this node's replica (no log entry, no consumer).
//! - [`openapi`]: the OpenAPI document, made from the route table and the `.proto` descriptors and their comments.
//! - [`console`]: the console's page, script and style, embedded in the binary.

pub(crate) mod api;
pub(crate) mod console;
pub(crate) mod error;
pub(crate) mod forward;
pub(crate) mod openapi;
pub(crate) mod routes;
pub(crate) mod tail;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use cellog_raft::CellNode;
use cellog_raft::storage::Storage;
use tokio::sync::Semaphore;

use crate::limits::Limits;
use crate::metrics::{Metered, Metrics};
use crate::service::CellogService;

pub use routes::MAX_BATCH;
pub use tail::{DEFAULT_MAX_BEHIND, HEARTBEAT, MAX_MAX_BEHIND};

/// The largest request body the JSON API reads: the largest gRPC message, its bytes in base64 (a third more), and
/// room for the JSON around them.
pub const MAX_BODY_BYTES: usize = cellog_client::limits::MAX_CLIENT_MESSAGE / 3 * 4 + 64 * 1024;

/// What every handler shares.
pub(crate) struct Http<S: Storage + Clone> {
    pub service: CellogService<Metered<S>>,
    pub node: Arc<CellNode<Metered<S>>>,
    pub metrics: Arc<Metrics>,
    /// A permit per JSON call in flight: one past the limit is refused at once, never queued.
    pub calls: Arc<Semaphore>,
    pub max_calls: usize,
    /// A permit per open tail.
    pub tails: Arc<Semaphore>,
    pub max_tails: usize,
    pub request_timeout: std::time::Duration,
    /// How a call refused as `NOT_LEADER` reaches the leader.
    pub forward: forward::Forward,
}

/// The node's HTTP router.
pub(crate) fn router<S: Storage + Clone>(
    service: CellogService<Metered<S>>,
    node: Arc<CellNode<Metered<S>>>,
    metrics: Arc<Metrics>,
    limits: &Limits,
    ca_pem: Option<Vec<u8>>,
) -> axum::Router {
    let max_calls = limits.max_connections.max(1);
    let max_tails = limits.max_subscriptions.max(1);
    let http = Arc::new(Http {
        service,
        node,
        metrics,
        calls: Arc::new(Semaphore::new(max_calls)),
        max_calls,
        tails: Arc::new(Semaphore::new(max_tails)),
        max_tails,
        request_timeout: limits.request_timeout,
        forward: forward::Forward::new(ca_pem),
    });
    axum::Router::new()
        .route("/metrics", get(render_metrics::<S>))
        .route("/v1/openapi.json", get(|| async { openapi::served() }))
        .route("/v1/streams/{name}/tail", get(tail::sse::<S>))
        .route("/v1/streams/{name}/tail/ws", get(tail::websocket::<S>))
        .route("/", get(console::home))
        .route("/console", get(console::page))
        .route("/console/{asset}", get(console::asset))
        .fallback(json_api::<S>)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(http)
}

async fn render_metrics<S: Storage + Clone>(State(http): State<Arc<Http<S>>>) -> Response {
    let open = http.max_tails.saturating_sub(http.tails.available_permits());
    http.metrics.http_tails.set(i64::try_from(open).unwrap_or(i64::MAX));
    (
        [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        http.metrics.render(&http.node),
    )
        .into_response()
}

/// Every other path: a route of the table, or a JSON error.
async fn json_api<S: Storage + Clone>(
    State(http): State<Arc<Http<S>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match api::serve(&http, &method, &uri, &headers, body).await {
        Ok(answer) => answer,
        Err(error) => error.into_response(),
    }
}
