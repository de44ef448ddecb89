//! The error codec shared by nodes and clients: every failure travels as a gRPC status with a code a client can act
//! on and an `ErrorDetail` in its details (the error's stable name, the leader's address, when to retry, which peer
//! lags), mirrored in metadata for tools like grpcurl. Nodes build statuses with [`status`]; clients read them back
//! with [`detail_of`].

use cellog_proto::v1::{self, ErrorDetail};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// The metadata key of the error's stable name.
pub const REASON_KEY: &str = "cellog-reason";
/// The metadata key of the leader's client address.
pub const LEADER_KEY: &str = "cellog-leader";
/// The metadata key of the retry advice.
pub const RETRY_AFTER_KEY: &str = "retry-after-ms";

/// Builds a status carrying `detail`.
pub fn status(code: Code, detail: ErrorDetail) -> Status {
    let mut status = Status::with_details(code, detail.message.clone(), detail.encode_to_vec().into());
    let metadata = status.metadata_mut();
    if let Ok(value) = MetadataValue::try_from(detail.reason.as_str()) {
        metadata.insert(REASON_KEY, value);
    }
    if !detail.leader_addr.is_empty()
        && let Ok(value) = MetadataValue::try_from(detail.leader_addr.as_str())
    {
        metadata.insert(LEADER_KEY, value);
    }
    if detail.retry_after_ms > 0 {
        metadata.insert(RETRY_AFTER_KEY, MetadataValue::from(detail.retry_after_ms));
    }
    status
}

/// A status with a stable name and a message, and no further advice.
pub fn failed(code: Code, reason: &str, message: impl Into<String>) -> Status {
    status(code, ErrorDetail { reason: reason.to_string(), message: message.into(), ..ErrorDetail::default() })
}

/// A status as an item error inside a batched or streamed answer.
pub fn to_item_error(status: &Status) -> v1::Error {
    v1::Error { code: status.code() as i32, detail: Some(detail_of(status)) }
}

/// The detail a status carries; statuses from elsewhere (a proxy, the transport) get one made from their message.
pub fn detail_of(status: &Status) -> ErrorDetail {
    ErrorDetail::decode(status.details()).ok().filter(|detail| !detail.reason.is_empty()).unwrap_or_else(|| {
        ErrorDetail {
            reason: format!("{:?}", status.code()).to_uppercase(),
            message: status.message().to_string(),
            ..ErrorDetail::default()
        }
    })
}

/// An item error back as a status.
pub fn from_item_error(error: v1::Error) -> Status {
    let detail = error.detail.unwrap_or_default();
    status(Code::from_i32(error.code), detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_survives_the_status_and_the_item_error() {
        let detail = ErrorDetail {
            reason: "NOT_LEADER".to_string(),
            message: "not the leader".to_string(),
            leader_id: 2,
            leader_addr: "10.0.0.2:7401".to_string(),
            retry_after_ms: 0,
            ..ErrorDetail::default()
        };
        let sent = status(Code::Unavailable, detail.clone());
        assert_eq!(detail_of(&sent), detail);
        assert_eq!(sent.metadata().get(LEADER_KEY).and_then(|value| value.to_str().ok()), Some("10.0.0.2:7401"));
        let again = from_item_error(to_item_error(&sent));
        assert_eq!((again.code(), detail_of(&again)), (Code::Unavailable, detail));
    }

    #[test]
    fn a_status_from_elsewhere_gets_a_detail_from_its_code() {
        let detail = detail_of(&Status::deadline_exceeded("timeout"));
        assert_eq!((detail.reason.as_str(), detail.message.as_str()), ("DEADLINEEXCEEDED", "timeout"));
    }
}
