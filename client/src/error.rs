//! Why a client call failed: the cell's answer, or what kept the call from reaching it.

use cellog_proto::v1;
use tonic::{Code, Status};

use crate::status::detail_of;

/// Why a call failed.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The cell answered with an error.
    #[error("{}: {}", .detail.reason, .detail.message)]
    Status {
        /// The gRPC code.
        code: Code,
        /// What the node said.
        detail: v1::ErrorDetail,
    },
    /// An address is not usable.
    #[error("bad address {addr:?}: {reason}")]
    Address {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// No node was given.
    #[error("no node address given")]
    NoNodes,
    /// The token given cannot be sent.
    #[error("bad token: {reason}")]
    Credential {
        /// What is wrong with it.
        reason: String,
    },
    /// The node at `addr` speaks another protocol than the client (TLS where the client speaks plaintext, or the
    /// other way round): the call never reached the cell, and retrying cannot help.
    #[error("the node at {addr} {reason}")]
    Protocol {
        /// The node's address.
        addr: String,
        /// What it answered, and what to change.
        reason: String,
    },
    /// The last attempt was refused before it was proposed (no leader there, a rate limit), but an earlier attempt
    /// got no answer and may have been applied: the call's outcome is unknown.
    #[error("{last}; an earlier attempt got no answer and may have been applied")]
    Indefinite {
        /// The last attempt's error.
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// The gRPC code, when the cell answered.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Status { code, .. } => Some(*code),
            ClientError::Indefinite { last } => last.code(),
            _ => None,
        }
    }

    /// The stable error name (e.g. `STREAM_NOT_FOUND`), when the cell answered.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ClientError::Status { detail, .. } => Some(&detail.reason),
            ClientError::Indefinite { last } => last.reason(),
            _ => None,
        }
    }

    /// What the cell said of the error (its reason, the leader, the cell a stream moved to, ...), when it answered.
    pub fn detail(&self) -> Option<&v1::ErrorDetail> {
        match self {
            ClientError::Status { detail, .. } => Some(detail),
            ClientError::Indefinite { last } => last.detail(),
            _ => None,
        }
    }

    /// Whether the call may have taken effect all the same: the cell did not say it refused it (a timeout, a broken
    /// connection, leadership moving while it was committed). Such a call counts as unknown, never as failed.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            // Refused by the cell all the same: not proposed here, or a stream still moving here.
            ClientError::Status { code: Code::Unavailable, detail } => {
                detail.reason != "NOT_LEADER" && detail.reason != "STREAM_MOVING"
            }
            ClientError::Status { code, .. } => {
                matches!(code, Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Internal)
            }
            ClientError::Address { .. }
            | ClientError::NoNodes
            | ClientError::Credential { .. }
            | ClientError::Protocol { .. } => false,
            ClientError::Indefinite { .. } => true,
        }
    }

    /// The error a retried call ends with, `last` being its last attempt's. When an earlier attempt got no answer
    /// (and so may have been applied), two kinds of refusal do not make the call a refusal: one that says only that
    /// the last attempt was not proposed (no leader there, a rate limit), and one that says the caller's standing
    /// moved on in between (a group member whose session ended, a partition that moved to another member, a stream
    /// that moved to another cell: a call that landed unanswered is followed by such a refusal of its repeat, not by
    /// "already done").
    pub(crate) fn settle(last: ClientError, earlier_unknown: bool) -> ClientError {
        let not_proposed = matches!(last.code(), Some(Code::Unavailable | Code::ResourceExhausted));
        let standing_moved = matches!(last.reason(), Some("UNKNOWN_MEMBER" | "NOT_OWNER" | "MOVED"));
        if earlier_unknown && (not_proposed || standing_moved) && !last.outcome_unknown() {
            ClientError::Indefinite { last: Box::new(last) }
        } else {
            last
        }
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        ClientError::Status { code: status.code(), detail: detail_of(&status) }
    }
}

/// The failure of a call to `addr` as a [`ClientError::Protocol`], when the transport's words say the node speaks
/// another protocol than the client: a plaintext client meeting a TLS node sees only an HTTP/2 protocol error, and a
/// TLS client meeting a plaintext node a record that is not TLS.
pub(crate) fn protocol_mismatch(status: &Status, addr: &str, tls: bool) -> Option<ClientError> {
    // A node's own refusals carry a detail; the transport's do not.
    if !status.details().is_empty() {
        return None;
    }
    // The transport's words: the status's message and the errors beneath it (hyper's, h2's, rustls's).
    let mut message = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        message = format!("{message}: {error}");
        source = error.source();
    }
    let reason = if !tls && (message.contains("h2 protocol error") || message.contains("frame with invalid size")) {
        "did not answer plaintext HTTP/2; it may serve TLS: give its cell CA's certificate (--ca, or ClientOptions::tls)"
    } else if tls && (message.contains("InvalidContentType") || message.contains("corrupt message")) {
        "did not answer TLS; it may serve plaintext (a client given a CA speaks only TLS), or not be a cellog node"
    } else {
        return None;
    };
    Some(ClientError::Protocol { addr: addr.to_string(), reason: format!("{reason} ({message})") })
}
