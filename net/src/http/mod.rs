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
pub(crate) mod serve;
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
use tonic::Status;

use self::error::ApiError;
use crate::limits::Limits;
use crate::metrics::{Metered, Metrics};
use crate::service::CellogService;

pub use routes::MAX_BATCH;
pub use tail::{DEFAULT_MAX_BEHIND, HEARTBEAT, MAX_MAX_BEHIND};

/// The largest request body the JSON API reads (see [`crate::limits::MAX_HTTP_BODY_BYTES`]).
pub const MAX_BODY_BYTES: usize = crate::limits::MAX_HTTP_BODY_BYTES;

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
    /// Each principal's open tails.
    pub tails_per_principal: Arc<crate::limits::PerPrincipal>,
    pub request_timeout: std::time::Duration,
    /// How a call refused as `NOT_LEADER` reaches the leader.
    pub forward: forward::Forward,
    /// The node's budget of request bytes in flight, which a JSON call's body counts against for the call's life.
    pub request_bytes: Arc<crate::budget::RequestBytes>,
}

/// The node's HTTP router.
pub(crate) fn router<S: Storage + Clone>(
    service: CellogService<Metered<S>>,
    node: Arc<CellNode<Metered<S>>>,
    metrics: Arc<Metrics>,
    limits: &Limits,
    request_bytes: Arc<crate::budget::RequestBytes>,
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
        tails_per_principal: crate::limits::PerPrincipal::new(limits.max_subscriptions_per_principal),
        request_timeout: limits.request_timeout,
        forward: forward::Forward::new(ca_pem),
        request_bytes,
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
        .layer(axum::middleware::from_fn_with_state(http.clone(), door::<S>))
        .with_state(http)
}

/// Paths anyone may read: the console's page, script and style, and the OpenAPI document (static text, no state).
fn is_public(path: &str) -> bool {
    matches!(path, "/" | "/console" | "/console/console.js" | "/console/console.css" | "/v1/openapi.json")
}

/// Whether a request's `Origin`, when it has one (a browser's), is the node's own: a page of another site may not
/// open a WebSocket tail here.
fn same_origin(headers: &axum::http::HeaderMap) -> bool {
    let Some(origin) = headers.get(axum::http::header::ORIGIN) else { return true };
    let host = headers.get(axum::http::header::HOST).and_then(|host| host.to_str().ok());
    let origin = origin.to_str().ok().and_then(|origin| origin.split_once("://").map(|(_, rest)| rest));
    matches!((origin, host), (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host))
}

/// Every request but a public one: its credential is checked against this node's replica before its body is read
/// (a caller without one costs the node its headers only), `/metrics` answers a cluster admin or the scrape token
/// alone, and a JSON call takes a permit and its time limit here, so that reading its body counts against both.
async fn door<S: Storage + Clone>(
    State(http): State<Arc<Http<S>>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    if is_public(path) {
        return next.run(request).await;
    }
    let metrics = path == "/metrics";
    let tail = path.starts_with("/v1/streams/") && (path.ends_with("/tail") || path.ends_with("/tail/ws"));
    let credential = request.headers().get(axum::http::header::AUTHORIZATION);
    let grpc = match api::grpc(credential, ()) {
        Ok(grpc) => grpc,
        Err(error) => return error.into_response(),
    };
    let actor = match http.service.callers().actor(&grpc) {
        Ok(actor) => actor,
        Err(status) => return ApiError::from(status).into_response(),
    };
    if metrics && matches!(actor, cellog_core::Actor::Token(hash) if Some(hash) == http.service.callers().scrape_token)
    {
        return next.run(request).await;
    }
    let principal = match http.service.principal(&actor) {
        Ok(principal) => principal,
        Err(status) => return ApiError::from(status).into_response(),
    };
    if metrics {
        let allowed = http.node.replica().map_err(|error| Status::unavailable(error.to_string())).and_then(|replica| {
            replica
                .cell
                .authorize(&principal, &cellog_core::Access::ClusterAdmin)
                .map_err(|rejection| crate::status::from_rejection(&rejection))
        });
        return match allowed {
            Ok(()) => next.run(request).await,
            Err(status) => ApiError::from(status).into_response(),
        };
    }
    if tail {
        if path.ends_with("/ws") && !same_origin(request.headers()) {
            return ApiError::from(cellog_client::status::failed(
                tonic::Code::PermissionDenied,
                "CROSS_ORIGIN",
                "a WebSocket tail is opened from this node's own pages or without an Origin, not from another site's",
            ))
            .into_response();
        }
        // A tail holds one of the tails' permits for as long as it is open, and is not timed.
        return next.run(request).await;
    }
    let Ok(_permit) = http.calls.clone().try_acquire_owned() else {
        return ApiError::from(cellog_client::status::failed(
            tonic::Code::ResourceExhausted,
            "TOO_MANY_CALLS",
            format!("this node answers at most {} HTTP calls at once; retry shortly", http.max_calls),
        ))
        .into_response();
    };
    let _bytes = match http.request_bytes.hold(crate::budget::http_body_bytes(request.headers(), MAX_BODY_BYTES as u64))
    {
        Ok(held) => held,
        Err(status) => return ApiError::from(status).into_response(),
    };
    match tokio::time::timeout(http.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::from(cellog_client::status::failed(
            tonic::Code::DeadlineExceeded,
            "TIMEOUT",
            format!("no answer within {} ms", http.request_timeout.as_millis()),
        ))
        .into_response(),
    }
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
