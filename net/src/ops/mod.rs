//! The API's writes as a table: each request that becomes one command says which command (checking what only the
//! wire can get wrong, such as a config's shape or a zero quota), and which reply the command's outcome gives. The
//! service runs every one of them the same way ([`crate::service::CellogService`]'s `run`): the caller's credential
//! first, then the command proposed as the caller, then the reply; an outcome of another kind is an internal error.
//! A handler is one line, and a new write is one impl here.
//!
//! Writes whose answer needs more than their outcome (a placement or an ownership read back, a publish's ack with
//! its payload, a transaction's state) stay with their handlers.

use cellog_core::{Command, Outcome};
use cellog_proto::v1;
use tonic::Status;

use crate::convert;

mod auth;
mod cells;
mod consumers;
mod groups;
mod mirrors;
mod streams;

/// A request that is one write: the command it asks for and the reply its outcome gives.
pub(crate) trait Write: Send + 'static {
    /// The reply on the wire.
    type Reply;

    /// The command this request asks for, or why the request is malformed.
    fn command(self) -> Result<Command, Status>;

    /// The reply `outcome` gives, or `outcome` back when it is not this command's.
    fn reply(outcome: Outcome) -> Result<Self::Reply, Outcome>;
}

/// The reply to a cursor's commit, a consumer's or a group member's.
fn cursor_committed(outcome: Outcome) -> Result<v1::CommitCursorResponse, Outcome> {
    match outcome {
        Outcome::CursorCommitted { next_seq } => Ok(v1::CommitCursorResponse { next_seq }),
        other => Err(other),
    }
}

/// The reply to a member's join or heartbeat: its assignment.
fn assignment(outcome: Outcome) -> Result<v1::GroupAssignment, Outcome> {
    match outcome {
        Outcome::GroupAssignment(assignment) => Ok(convert::assignment_to_wire(assignment)),
        other => Err(other),
    }
}
