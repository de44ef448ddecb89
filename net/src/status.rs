//! The node's side of the error codec ([`cellog_client::status`]): core rejections and failed proposals as gRPC
//! statuses with a code a client can act on and the detail it needs (the leader's address, when to retry, which peer
//! lags).

use cellog_client::status::{failed, status};
use cellog_core::{Quota, Rejection};
use cellog_proto::v1::ErrorDetail;
use cellog_raft::{Interrupted, NodeAddrs, NodeId, ProposeError};
use tonic::{Code, Status};

fn detail(reason: &str, message: impl Into<String>) -> ErrorDetail {
    ErrorDetail { reason: reason.to_string(), message: message.into(), ..ErrorDetail::default() }
}

/// A malformed request.
pub fn invalid_argument(message: impl Into<String>) -> Status {
    failed(Code::InvalidArgument, "INVALID_ARGUMENT", message)
}

/// This node's copy of a message body does not verify: nothing of it is served. The node repairs it from a peer's copy
/// (or, when no peer holds one, takes a whole snapshot at its next start; its `cellog_bodies_unreadable` gauge counts
/// such reads); a fetched delivery is redelivered after its ack wait.
pub fn body_unreadable(partition: u32, seq: u64, reason: &str) -> Status {
    let message = format!(
        "this node's copy of message {partition}/{seq} does not verify ({reason}), so it is not served; the node \
         repairs it from a peer's copy (or, when no peer holds one, from the leader's snapshot when restarted)"
    );
    failed(Code::DataLoss, "BODY_UNREADABLE", message)
}

/// The node cannot serve now; retrying (elsewhere or later) may help.
pub fn unavailable(reason: &str, message: impl Into<String>, retry_after_ms: u64) -> Status {
    status(Code::Unavailable, ErrorDetail { retry_after_ms, ..detail(reason, message) })
}

/// A panic interrupted applying on this node: it serves nothing from its replica and is stopping.
pub fn interrupted(error: Interrupted) -> Status {
    unavailable("NODE_FAILED", format!("{error}; ask another node"), 0)
}

/// An `UNAVAILABLE` naming the leader, when known, as where to go instead.
fn leader_status(reason: &str, message: String, leader: Option<&(NodeId, NodeAddrs)>) -> Status {
    let (leader_id, leader_addr) = leader.map(|(id, node)| (*id, node.client_addr.clone())).unwrap_or_default();
    let retry_after_ms = if leader.is_some() { 0 } else { 200 };
    status(Code::Unavailable, ErrorDetail { leader_id, leader_addr, retry_after_ms, ..detail(reason, message) })
}

/// This node does not lead, and the command never reached the log; `leader` is where to go instead.
pub fn not_leader(leader: Option<&(NodeId, NodeAddrs)>) -> Status {
    let message = match leader {
        Some((id, node)) => format!("not the leader; the leader is node {id} at {}", node.client_addr),
        None => "not the leader, and no leader is known yet; retry shortly".to_string(),
    };
    leader_status("NOT_LEADER", message, leader)
}

/// A proposal that got no answer from the cell.
pub fn from_propose(error: ProposeError) -> Status {
    match error {
        ProposeError::NotLeader { leader } => not_leader(leader.as_ref()),
        ProposeError::LeaderChanged { leader } => leader_status(
            "LEADER_CHANGED",
            "leadership moved while the command was being committed, so it may still be applied; retry only with \
             the same message id"
                .to_string(),
            leader.as_ref(),
        ),
        ProposeError::Raft(message) => failed(
            Code::Unknown,
            "OUTCOME_UNKNOWN",
            format!("the outcome is unknown ({message}); retry with the same message id to deduplicate"),
        ),
        // Neither passes with a retry: the operator restarts the node without the halt, or another command is sent.
        ProposeError::ApplyHalted { .. } => failed(Code::FailedPrecondition, "APPLY_HALTED", error.to_string()),
        ProposeError::EntrySkipped { .. } => failed(Code::FailedPrecondition, "ENTRY_SKIPPED", error.to_string()),
        ProposeError::QuorumStorageFull { low } => cellog_client::status::status(
            Code::ResourceExhausted,
            ErrorDetail {
                reason: "STORAGE_FULL".to_string(),
                message: format!(
                    "the disks of nodes {low:?} are below their watermarks and take no entries, which leaves too few \
                     voters to commit: writes that grow the store are refused until room is made (reads, \
                     acknowledgements, recalls and deletes go on); nothing was written"
                ),
                retry_after_ms: 1000,
                ..Default::default()
            },
        ),
        // A pause worth waiting before a retry: the disk frees as retention and deletes run.
        ProposeError::StorageFull { free, min } => cellog_client::status::status(
            Code::ResourceExhausted,
            ErrorDetail {
                reason: "STORAGE_FULL".to_string(),
                message: format!(
                    "the leader's disk has {free} bytes free, below its watermark of {min}: writes that grow the store \
                     are refused until room is made (reads, acknowledgements, recalls and deletes go on); nothing was \
                     written"
                ),
                retry_after_ms: 1000,
                ..Default::default()
            },
        ),
    }
}
/// The code and detail of a core rejection.
pub fn rejection_parts(rejection: &Rejection) -> (Code, ErrorDetail) {
    let message = rejection.to_string();
    let (code, reason) = match rejection {
        Rejection::StreamNotFound { .. } => (Code::NotFound, "STREAM_NOT_FOUND"),
        Rejection::ConsumerNotFound { .. } => (Code::NotFound, "CONSUMER_NOT_FOUND"),
        Rejection::NoStreamForSubject { .. } => (Code::NotFound, "NO_STREAM_FOR_SUBJECT"),
        Rejection::MessageNotFound { .. } => (Code::NotFound, "MESSAGE_NOT_FOUND"),
        Rejection::ProducerNotFound { .. } => (Code::NotFound, "PRODUCER_NOT_FOUND"),
        Rejection::PeerNotFound { .. } => (Code::NotFound, "PEER_NOT_FOUND"),
        Rejection::InvalidSubject { .. } => (Code::InvalidArgument, "INVALID_SUBJECT"),
        Rejection::InvalidName { .. } => (Code::InvalidArgument, "INVALID_NAME"),
        Rejection::InvalidConfig { .. } => (Code::InvalidArgument, "INVALID_CONFIG"),
        Rejection::Invalid { .. } => (Code::InvalidArgument, "INVALID_ARGUMENT"),
        Rejection::PayloadTooLarge { .. } => (Code::InvalidArgument, "PAYLOAD_TOO_LARGE"),
        Rejection::Conflict { .. } => (Code::AlreadyExists, "CONFLICT"),
        Rejection::SubjectOverlap { .. } => (Code::FailedPrecondition, "SUBJECT_OVERLAP"),
        Rejection::InUse { .. } => (Code::FailedPrecondition, "IN_USE"),
        Rejection::WrongLastSequence { .. } => (Code::FailedPrecondition, "WRONG_LAST_SEQUENCE"),
        Rejection::WrongLastSubjectSequence { .. } => (Code::FailedPrecondition, "WRONG_LAST_SUBJECT_SEQUENCE"),
        Rejection::QuotaExceeded { quota, .. } => (
            Code::ResourceExhausted,
            match quota {
                Quota::StreamMessages | Quota::StreamBytes => "STREAM_QUOTA_EXCEEDED",
                Quota::SubjectMessages | Quota::SubjectBytes => "SUBJECT_QUOTA_EXCEEDED",
                Quota::TransactionMessages | Quota::TransactionBytes => "TRANSACTION_QUOTA_EXCEEDED",
                Quota::TenantStreams | Quota::TenantMessages | Quota::TenantBytes => "TENANT_QUOTA_EXCEEDED",
                Quota::CellStreams | Quota::CellMessages | Quota::CellBytes => "CELL_QUOTA_EXCEEDED",
            },
        ),
        Rejection::RateLimited { .. } => (Code::ResourceExhausted, "RATE_LIMITED"),
        Rejection::StorageFull { .. } => (Code::ResourceExhausted, "STORAGE_FULL"),
        Rejection::Pinned { .. } => (Code::FailedPrecondition, "PINNED"),
        Rejection::Fenced { .. } => (Code::FailedPrecondition, "FENCED"),
        Rejection::TransactionState { .. } => (Code::FailedPrecondition, "TRANSACTION_STATE"),
        Rejection::TransactionAborted { .. } => (Code::Aborted, "TRANSACTION_ABORTED"),
        Rejection::NotDelivered { .. } => (Code::FailedPrecondition, "NOT_DELIVERED"),
        Rejection::DeliveryExpired { .. } => (Code::FailedPrecondition, "DELIVERY_EXPIRED"),
        Rejection::CursorRegression { .. } => (Code::FailedPrecondition, "CURSOR_REGRESSION"),
        Rejection::Unauthenticated { .. } => (Code::Unauthenticated, "UNAUTHENTICATED"),
        Rejection::PermissionDenied { .. } => (Code::PermissionDenied, "PERMISSION_DENIED"),
        Rejection::PrincipalNotFound { .. } => (Code::NotFound, "PRINCIPAL_NOT_FOUND"),
        Rejection::CapReached { .. } => (Code::ResourceExhausted, "CAP_REACHED"),
        Rejection::GroupNotFound { .. } => (Code::NotFound, "GROUP_NOT_FOUND"),
        Rejection::UnknownMember { .. } => (Code::FailedPrecondition, "UNKNOWN_MEMBER"),
        Rejection::NotOwner { .. } => (Code::FailedPrecondition, "NOT_OWNER"),
        Rejection::Moved { .. } => (Code::FailedPrecondition, "MOVED"),
        Rejection::StreamMoving { .. } => (Code::Unavailable, "STREAM_MOVING"),
        Rejection::StaleEpoch { .. } => (Code::FailedPrecondition, "STALE_EPOCH"),
        Rejection::CellNotFound { .. } => (Code::NotFound, "CELL_NOT_FOUND"),
        Rejection::NotPlaced { .. } => (Code::NotFound, "NOT_PLACED"),
        Rejection::Mirror { .. } => (Code::FailedPrecondition, "MIRROR"),
        Rejection::RecallsPending { .. } => (Code::ResourceExhausted, "RECALLS_PENDING"),
    };
    let mut detail = detail(reason, message);
    match rejection {
        Rejection::RateLimited { retry_after_ms } => detail.retry_after_ms = (*retry_after_ms).max(1),
        Rejection::StorageFull { lagging_peer, .. } => {
            detail.lagging_peer = lagging_peer.clone();
            detail.retry_after_ms = 1000;
        }
        Rejection::RecallsPending { peer, .. } => {
            detail.lagging_peer = peer.clone();
            detail.retry_after_ms = 1000;
        }
        Rejection::Mirror { cell, .. } => detail.cell = cell.clone(),
        Rejection::Fenced { current_epoch } => detail.current_epoch = *current_epoch,
        Rejection::UnknownMember { generation, .. } | Rejection::NotOwner { generation, .. } => {
            detail.generation = *generation
        }
        Rejection::WrongLastSequence { last } | Rejection::WrongLastSubjectSequence { last } => detail.last_seq = *last,
        Rejection::Moved { cell, epoch, .. } | Rejection::StreamMoving { from: cell, epoch, .. } => {
            detail.cell = cell.clone();
            detail.ownership_epoch = *epoch;
            if matches!(rejection, Rejection::StreamMoving { .. }) {
                // The new owner accepts once it has caught up: usually well within a second.
                detail.retry_after_ms = 200;
            }
        }
        Rejection::StaleEpoch { current, .. } => detail.ownership_epoch = *current,
        _ => {}
    }
    (code, detail)
}

/// A core rejection as a status.
pub fn from_rejection(rejection: &Rejection) -> Status {
    let (code, detail) = rejection_parts(rejection);
    status(code, detail)
}
