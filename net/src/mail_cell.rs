//! The node's cell as mail sees it ([`cellog_mail::MailCell`]): proposals answered as statuses, reads from the
//! replica, payloads read from this node's storage outside the replica's lock.

use std::sync::{Arc, MutexGuard};

use bytes::Bytes;
use cellog_core::Scope;
use cellog_core::tenant::tenant_of;
use cellog_core::{Access, Body, Command, Outcome, Record, Rejection};
use cellog_mail::MailCell;
use cellog_mail::cell::Need;
use cellog_mail::schema::{INBOX, inbox_stream, scoped, stream_configs};
use cellog_raft::storage::Storage;
use cellog_raft::{BodyError, CellNode, ProposeError, Replica};
use tonic::Status;

use crate::auth::Callers;
use crate::service::answered;
use crate::status::from_propose;

/// A node's cell, for its mailroom, and how the node treats callers.
pub struct NodeCell<S>(pub Arc<CellNode<S>>, pub Callers);

impl<S: Storage + Clone> NodeCell<S> {
    /// The replica, or UNAVAILABLE once a panic interrupted applying (the node is stopping).
    fn replica(&self) -> Result<MutexGuard<'_, Replica>, Status> {
        self.0.replica().map_err(crate::status::interrupted)
    }
}

impl<S: Storage + Clone + Send + Sync + 'static> MailCell for NodeCell<S> {
    fn authorize<T>(&self, request: &tonic::Request<T>, need: Need<'_>) -> Result<Arc<str>, Status> {
        let actor = self.1.actor(request)?;
        let replica = self.replica()?;
        let principal =
            replica.cell.authenticate(&actor).map_err(|rejection| crate::status::from_rejection(&rejection))?;
        let tenant = tenant_of(&principal);
        let (Need::Write(stream) | Need::Read(stream)) = need;
        // The mail streams' subjects are the schema's, whether or not the stream exists yet; a tenant's principal
        // is judged on them in its own scope, and reads its tenant's inbox.
        let subjects: Vec<String> = stream_configs()
            .into_iter()
            .find(|(name, _)| *name == stream)
            .map(|(_, config)| config.subjects.iter().map(|subject| scoped(tenant, subject)).collect())
            .unwrap_or_default();
        let stream = if stream == INBOX { inbox_stream(tenant) } else { stream.to_string() };
        let access = match need {
            Need::Write(_) => Access::Write { stream: &stream, subjects: &subjects },
            Need::Read(_) => Access::Read { stream: &stream, subjects: &subjects },
        };
        let decided = replica.cell.authorize(&principal, &access).map_err(|rejection| match tenant {
            Some(_) => Scope::of(&principal).rejection_out(rejection),
            None => rejection,
        });
        decided.map_err(|rejection| crate::status::from_rejection(&rejection))?;
        Ok(principal)
    }

    async fn propose(&self, command: Command) -> Result<Outcome, Status> {
        answered(self.0.propose_now(command).await)
    }

    async fn read_barrier(&self) -> Result<(), Status> {
        self.0.read_barrier().await.map_err(from_propose)
    }

    fn is_leader(&self) -> bool {
        self.0.is_leader()
    }

    fn lead(&self) -> Result<(), Status> {
        if self.0.is_leader() {
            return Ok(());
        }
        Err(from_propose(ProposeError::NotLeader { leader: self.0.leader() }))
    }

    fn now_ms(&self) -> u64 {
        self.0.now().0
    }

    fn is_reserved(&self, filter: &str) -> bool {
        self.replica().is_ok_and(|replica| replica.cell.is_reserved(filter))
    }

    fn stream_config(&self, stream: &str) -> Option<cellog_core::StreamConfig> {
        self.replica().ok()?.cell.stream_info(stream).ok().map(|info| info.config)
    }

    fn has_tenant(&self, tenant: &str) -> bool {
        self.replica()
            .is_ok_and(|replica| replica.cell.principals().iter().any(|(name, _, _)| tenant_of(name) == Some(tenant)))
    }

    fn read(&self, stream: &str, from_seq: u64, max: usize) -> Result<Vec<Record>, Status> {
        match self.replica()?.cell.read_from(stream, 0, from_seq, max) {
            Ok(records) => Ok(records),
            Err(Rejection::StreamNotFound { .. }) => Ok(Vec::new()),
            Err(rejection) => Err(crate::status::from_rejection(&rejection)),
        }
    }

    fn last(&self, stream: &str, subject: &str) -> Option<Record> {
        self.replica().ok()?.cell.last_for_subject(stream, subject).ok()
    }

    fn payload(&self, stream: &str, record: &Record) -> Result<Option<Bytes>, String> {
        if matches!(record.body, Body::Tombstone { .. }) {
            return Ok(None);
        }
        match self.0.payload(stream, record) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(BodyError::Removed { .. }) => Ok(None),
            Err(error @ BodyError::Unreadable { .. }) => Err(error.to_string()),
        }
    }
}
