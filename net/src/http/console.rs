//! The web console: one page, its script and its style, embedded in the binary (no build step). It shows what this
//! node's replica holds (`/console/overview`: streams with counts and bytes, consumers with lag and the age of the
//! oldest unacknowledged message, consumer groups with their members, generation and lag, the cell with its
//! leader, term and indexes), refreshed every two seconds, a live
//! tail of a stream and a subject, and a form to publish. The page reads a token from its address's fragment
//! (`/console#token=…`, never sent to the server) or asks for one, and sends it as `Authorization: Bearer`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use cellog_raft::storage::Storage;
use serde_json::json;

use super::Http;
use super::error::ApiError;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// `/`: the console.
pub(crate) async fn home() -> Redirect {
    Redirect::to("/console")
}

/// What the page may load and run: its own script, style and calls, nothing inline, nothing from elsewhere, and no
/// framing by another site.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `/console`: the page.
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

/// `/console/{asset}`: the script, the style, and the overview.
pub(crate) async fn asset<S: Storage + Clone>(
    State(http): State<Arc<Http<S>>>,
    Path(asset): Path<String>,
    headers: HeaderMap,
) -> Response {
    match asset.as_str() {
        "console.js" => ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT).into_response(),
        "console.css" => ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response(),
        "overview" => match overview(&http, &headers) {
            Ok(overview) => axum::Json(overview).into_response(),
            Err(error) => error.into_response(),
        },
        _ => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

fn overview<S: Storage + Clone>(http: &Http<S>, headers: &HeaderMap) -> Result<serde_json::Value, ApiError> {
    let request = super::api::grpc(headers.get(header::AUTHORIZATION), ())?;
    let actor = http.service.callers().actor(&request)?;
    let (streams, cluster) = http.service.overview(&actor)?;
    let streams: Vec<_> = streams
        .iter()
        .map(|entry| {
            json!({
                "stream": value(&entry.stream),
                "consumers": entry.consumers.iter().map(value).collect::<Vec<_>>(),
                "groups": entry.groups.iter().map(value).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(json!({ "streams": streams, "cluster": value(&cluster) }))
}

fn value<T: serde::Serialize>(message: &T) -> serde_json::Value {
    serde_json::to_value(message).unwrap_or_default()
}
