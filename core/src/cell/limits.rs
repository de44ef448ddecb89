//! What a command may ask for at all: the cell's size limits and the checks that need no state.

use crate::command::PublishRequest;
use crate::config::MAX_DURATION_MS;
use crate::error::{NameKind, Rejection};
use crate::subject::{validate_name, validate_subject};

/// Most streams in a cell.
pub const MAX_STREAMS: usize = 10_000;
/// Most consumers on one stream.
pub const MAX_CONSUMERS_PER_STREAM: usize = 1024;
/// Most registered peers on one stream.
pub const MAX_PEERS_PER_STREAM: usize = 64;
/// Most messages one fetch may ask for.
pub const MAX_FETCH: u32 = 10_000;
/// Longest message id or transactional id, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Most header bytes (names plus values) on one message.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most records one read returns.
pub const MAX_READ: usize = 10_000;

pub(super) fn invalid(reason: impl Into<String>) -> Rejection {
    Rejection::Invalid { reason: reason.into() }
}

pub(super) fn check_name(kind: NameKind, name: &str) -> Result<(), Rejection> {
    validate_name(name).map_err(|reason| Rejection::InvalidName { kind, name: name.to_string(), reason })
}

pub(super) fn check_id(kind: NameKind, id: &str) -> Result<(), Rejection> {
    let reason = if id.is_empty() {
        Some("is empty".to_string())
    } else if id.len() > MAX_ID_BYTES {
        Some(format!("is {} bytes long; the limit is {MAX_ID_BYTES}", id.len()))
    } else {
        id.chars().find(|c| c.is_control()).map(|c| format!("contains the control character {c:?}"))
    };
    match reason {
        Some(reason) => Err(Rejection::InvalidName { kind, name: id.to_string(), reason }),
        None => Ok(()),
    }
}

pub(super) fn check_duration(what: &str, value: u64) -> Result<(), Rejection> {
    if value > MAX_DURATION_MS {
        return Err(invalid(format!("{what} of {value} ms exceeds the limit of {MAX_DURATION_MS} ms")));
    }
    Ok(())
}

/// Checks everything about a publish that needs no state.
pub(super) fn check_request(request: &PublishRequest) -> Result<(), Rejection> {
    validate_subject(&request.subject)
        .map_err(|reason| Rejection::InvalidSubject { subject: request.subject.clone(), reason })?;
    if let Some(msg_id) = &request.msg_id {
        check_id(NameKind::MessageId, msg_id)?;
    }
    let mut header_bytes = 0usize;
    for (name, value) in &request.headers {
        if name.is_empty() || name.chars().any(|c| c.is_control() || c.is_whitespace() || c == ':') {
            return Err(Rejection::InvalidName {
                kind: NameKind::Header,
                name: name.clone(),
                reason: "must be non-empty, without whitespace, control characters or ':'".to_string(),
            });
        }
        header_bytes += name.len() + value.len();
    }
    if header_bytes > MAX_HEADER_BYTES {
        return Err(invalid(format!("headers take {header_bytes} bytes; the limit is {MAX_HEADER_BYTES}")));
    }
    if request.ttl_ms == Some(0) {
        return Err(invalid("ttl_ms must be at least 1 when set"));
    }
    check_duration("ttl_ms", request.ttl_ms.unwrap_or(0))?;
    check_duration("deliver_after_ms", request.deliver_after_ms.unwrap_or(0))?;
    Ok(())
}
