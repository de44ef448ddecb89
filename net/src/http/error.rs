//! Errors of the HTTP API: the same contract as gRPC's (see the top of `cellog.proto`), as a JSON body
//! `{"error": {"code": "NOT_FOUND", "reason": "STREAM_NOT_FOUND", "message": …, "retry_after_ms": …, "leader_addr": …,
//! …}}` (the `ErrorDetail` fields beside the gRPC code's name) with the HTTP status that code maps to, and the same
//! `cellog-reason`, `cellog-leader` and `retry-after-ms` headers (plus HTTP's `Retry-After`, in whole seconds).

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cellog_client::status::{detail_of, failed};
use tonic::{Code, Status};

/// An error answered as JSON.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: Status,
    /// Where the HTTP status is more exact than the gRPC code's (a body too large, a method not allowed).
    http: Option<StatusCode>,
    /// `Allow`, for a method not allowed.
    allow: Option<String>,
}

impl From<Status> for ApiError {
    fn from(status: Status) -> Self {
        ApiError { status, http: None, allow: None }
    }
}

impl ApiError {
    /// `INVALID_ARGUMENT` with `reason`.
    pub(crate) fn invalid(reason: &str, message: impl Into<String>) -> Self {
        failed(Code::InvalidArgument, reason, message).into()
    }

    /// No route at this path.
    pub(crate) fn no_route(path: &str) -> Self {
        let message = format!("no route {path:?}; the routes are listed in /v1/openapi.json");
        ApiError { status: failed(Code::NotFound, "NO_ROUTE", message), http: None, allow: None }
    }

    /// A route at this path, not under this method.
    pub(crate) fn method_not_allowed(method: &str, path: &str, allowed: &[&str]) -> Self {
        let message = format!("{path} does not take {method}; it takes {}", allowed.join(", "));
        ApiError {
            status: failed(Code::Unimplemented, "METHOD_NOT_ALLOWED", message),
            http: Some(StatusCode::METHOD_NOT_ALLOWED),
            allow: Some(allowed.join(", ")),
        }
    }

    /// A body past [`super::MAX_BODY_BYTES`], or one that could not be read.
    pub(crate) fn body(error: axum::extract::rejection::BytesRejection) -> Self {
        let http = error.status();
        let status = if http == StatusCode::PAYLOAD_TOO_LARGE {
            let message = format!("the request body is over {} bytes", super::MAX_BODY_BYTES);
            failed(Code::OutOfRange, "TOO_LARGE", message)
        } else {
            failed(Code::InvalidArgument, "BAD_BODY", format!("the request body could not be read: {error}"))
        };
        ApiError { status, http: Some(http), allow: None }
    }
}

/// `status` as the JSON of an error: `{"error": {"code": …, ErrorDetail's fields…}}`.
pub(crate) fn json_of(status: &Status) -> serde_json::Value {
    let detail = detail_of(status);
    let mut fields = match serde_json::to_value(&detail) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    fields.insert("code".to_string(), code_name(status.code()).into());
    serde_json::json!({ "error": fields })
}

/// The name of a gRPC code, as `cellog.proto` and gRPC's documentation write it.
pub(crate) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The HTTP status of a gRPC code (the mapping gRPC's HTTP gateways use; a failed precondition, which here is a
/// conditional append or a transaction in the wrong state, is a conflict).
pub(crate) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted | Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let detail = detail_of(&self.status);
        let http = self.http.unwrap_or_else(|| http_status(self.status.code()));
        let mut response = (http, axum::Json(json_of(&self.status))).into_response();
        let headers = response.headers_mut();
        let mut set = |name: &'static str, value: String| {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        };
        set("cellog-reason", detail.reason.clone());
        if detail.retry_after_ms > 0 {
            set("retry-after-ms", detail.retry_after_ms.to_string());
            set("retry-after", detail.retry_after_ms.div_ceil(1000).to_string());
        }
        if !detail.leader_addr.is_empty() {
            set("cellog-leader", detail.leader_addr.clone());
        }
        if let Some(allow) = self.allow
            && let Ok(value) = HeaderValue::from_str(&allow)
        {
            response.headers_mut().insert(header::ALLOW, value);
        }
        response
    }
}
