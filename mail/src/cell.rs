//! What mail needs of its own cell, and nothing more: propose a command, read a stream, know whether this node leads,
//! and the cell's time. The node implements it over its replica; tests may implement it over anything.

use std::future::Future;

use bytes::Bytes;
use cellog_core::{Command, Outcome, Record};
use tonic::Status;

/// What a mail call needs of its caller's principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need<'a> {
    /// Publish grants covering every subject of this stream (sending: the outbox).
    Write(&'a str),
    /// Subscribe grants covering every subject of this stream (the inbox, the results).
    Read(&'a str),
}

/// This node's view of its cell, as mail uses it.
pub trait MailCell: Send + Sync + 'static {
    /// The principal a call's credential names, if its grants meet `need` on this node's replica; refuses the call
    /// otherwise (UNAUTHENTICATED, PERMISSION_DENIED). A tenant's principal needs its grants on the mail subjects in
    /// its own scope (`mail.>` as it names them), and reads its tenant's inbox rather than the cell's.
    fn authorize<T>(&self, request: &tonic::Request<T>, need: Need<'_>) -> Result<std::sync::Arc<str>, Status>;

    /// Proposes `command` and waits for the cell's answer. A rejection comes back as the status a client would get
    /// for it (its stable name in the detail); so does a proposal that never reached the log.
    fn propose(&self, command: Command) -> impl Future<Output = Result<Outcome, Status>> + Send;

    /// Waits until this node has applied everything committed before the call (reads after it are not stale).
    fn read_barrier(&self) -> impl Future<Output = Result<(), Status>> + Send;

    /// Whether this node leads its cell now.
    fn is_leader(&self) -> bool;

    /// `Ok` when this node leads; otherwise the NOT_LEADER status naming the leader, when known.
    fn lead(&self) -> Result<(), Status>;

    /// The cell's time, in milliseconds.
    fn now_ms(&self) -> u64;

    /// Whether `filter` is reserved for the node (see `Command::ReserveSubjects`).
    fn is_reserved(&self, filter: &str) -> bool;

    /// Whether `stream` exists.
    fn has_stream(&self, stream: &str) -> bool {
        self.stream_subjects(stream).is_some()
    }

    /// The subject filters of `stream`, if it exists.
    fn stream_subjects(&self, stream: &str) -> Option<Vec<String>> {
        self.stream_config(stream).map(|config| config.subjects)
    }

    /// The config of `stream`, if it exists.
    fn stream_config(&self, stream: &str) -> Option<cellog_core::StreamConfig>;

    /// Whether some principal of this cell belongs to `tenant`.
    fn has_tenant(&self, tenant: &str) -> bool;

    /// Up to `max` records of `stream`'s only partition from `from_seq` on; a stream that does not exist reads as
    /// empty.
    fn read(&self, stream: &str, from_seq: u64, max: usize) -> Result<Vec<Record>, Status>;

    /// The last record of `subject` in `stream`, if any.
    fn last(&self, stream: &str, subject: &str) -> Option<Record>;

    /// A record's payload from this node's storage: `None` for a tombstone or a message removed since the record was
    /// read, an error for a body this node cannot read.
    fn payload(&self, stream: &str, record: &Record) -> Result<Option<Bytes>, String>;
}
