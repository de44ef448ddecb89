//! openraft's state machine over `cellog-core`: committed entries are applied to the [`Cell`], and the cell's answer
//! goes back to the proposer. Message bodies live in the storage's bodies space ([`crate::bodies`]).
//!
//! The stored snapshot is the cell's state without its bodies, plus the last applied log id and membership, written
//! and synced to storage (with the deletes of bodies removed before it) before openraft may purge the log it covers.
//! The snapshot sent to a follower is the whole cell, bodies included, read back from the stored one; installing it
//! replaces the follower's bodies and state in one write.

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use cellog_core::{Body, Cell, Effect, Record, SNAPSHOT_VERSION, SnapshotError};
use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::bodies::{BodyError, BodyReadError, BodyWork, StoredBodies};
use crate::storage::{Batch, Space, Storage, StorageError};
use crate::stored_snapshot::{self, SNAPSHOT_CHUNK_BYTES};
use crate::transition;
use crate::types::{Entry, LogId, NodeAddrs, NodeId, RaftStorageError, Response, TypeConfig};

/// A panic interrupted applying entries on this node: its replica may hold part of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a panic interrupted applying entries on this node; it serves nothing from its replica until it restarts")]
pub struct Interrupted;

/// Locks a replica for reading, refusing one that a panic interrupted.
pub(crate) fn read_replica(replica: &Mutex<Replica>) -> Result<MutexGuard<'_, Replica>, Interrupted> {
    replica.lock().map_err(|_| Interrupted)
}

/// The replicated state as this node has applied it.
#[derive(Debug, Default)]
pub struct Replica {
    /// The cell.
    pub cell: Cell,
    /// The last entry applied.
    pub last_applied: Option<LogId>,
    /// The last membership applied.
    pub membership: StoredMembership<NodeId, NodeAddrs>,
}

/// What a snapshot holds.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotFile {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, NodeAddrs>,
    /// `Cell::snapshot()` where stored, `Cell::snapshot_whole()` (bodies included) where sent: versioned and
    /// checksummed on its own.
    cell: Vec<u8>,
}

impl Replica {
    /// A snapshot file of this replica around `cell` (its state alone, or whole).
    fn file(&self, cell: Vec<u8>) -> SnapshotFile {
        SnapshotFile { last_applied: self.last_applied, membership: self.membership.clone(), cell }
    }

    /// The meta of a snapshot of this replica.
    fn meta(&self) -> SnapshotMeta<NodeId, NodeAddrs> {
        SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: snapshot_id(self.last_applied),
        }
    }
}

/// Whether a snapshot file must hold its bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Whole {
    /// Stored: the bodies are in the bodies space.
    No,
    /// Sent: the bodies come with it.
    Yes,
}

fn snapshot_id(last_applied: Option<LogId>) -> String {
    // Deterministic: the same state gives the same id on every replica and in every run.
    match last_applied {
        Some(log_id) => format!("{}-{}-{}", log_id.leader_id.term, log_id.leader_id.node_id, log_id.index),
        None => "empty".to_string(),
    }
}

/// A record's payload for an answer: its body read and verified (empty for a tombstone). Called after the apply
/// or read that produced the record, with `replica` not held, over the node's `bodies`. A body that does not verify is never served, and
/// marks this node for repair; one that is missing because its message was removed since the record was taken is
/// [`BodyError::Removed`].
pub fn payload<S: Storage>(
    bodies: &StoredBodies<S>,
    replica: &Mutex<Replica>,
    stream: &str,
    record: &Record,
) -> Result<Bytes, BodyError> {
    let body = match &record.body {
        Body::Stored(body) => body,
        Body::Tombstone { .. } => return Ok(Bytes::new()),
    };
    let (partition, seq) = (record.partition, record.seq);
    let reason = match bodies.read(body) {
        Ok(bytes) => return Ok(bytes),
        Err(BodyReadError::Missing { .. }) => {
            // Released bodies are deleted only after their message is gone from the state, so a body missing
            // while its message still refers to it is damage; otherwise the message went in between.
            let replica = replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let current = replica.cell.read(stream, partition, seq).ok().map(|record| record.body);
            drop(replica);
            if current.as_ref() != Some(&record.body) {
                return Err(BodyError::Removed { partition, seq });
            }
            BodyReadError::Missing { key: body.key }.to_string()
        }
        Err(BodyReadError::Damaged { reason }) => reason,
    };
    bodies.mark_damaged(body.key, &reason);
    Err(BodyError::Unreadable { partition, seq, reason })
}

/// The state machine half of a node's storage.
#[derive(Clone, Debug)]
pub struct StateMachineStore<S> {
    storage: S,
    bodies: Arc<StoredBodies<S>>,
    replica: Arc<Mutex<Replica>>,
    /// The last log id covered by the stored snapshot. Held while a snapshot is written, so a snapshot built in the
    /// background never overwrites a newer one installed meanwhile.
    stored: Arc<Mutex<Option<LogId>>>,
    /// The stored snapshot's meta, from `open` until openraft first asks for the current snapshot or a snapshot is
    /// built or installed. openraft 0.9.25 asks first when the node starts (`get_initial_state`, after re-applying
    /// the committed log), for the meta alone; answering with it spares the start reading every body.
    initial_meta: Arc<Mutex<Option<SnapshotMeta<NodeId, NodeAddrs>>>>,
}

fn state_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::write_state_machine(openraft::AnyError::error(error.to_string())).into()
}

impl<S: Storage + Clone> StateMachineStore<S> {
    /// The state machine over `storage`, starting from the stored snapshot if there is one.
    pub fn open(storage: S) -> Result<Self, StorageError> {
        let bodies = Arc::new(StoredBodies::new(storage.clone()));
        let replica = match stored_snapshot::get(&storage)? {
            Some(bytes) => Self::decode(&bytes, Whole::No)?.0,
            None => Replica::default(),
        };
        let stored = Arc::new(Mutex::new(replica.last_applied));
        let initial_meta = Arc::new(Mutex::new(replica.last_applied.map(|_| replica.meta())));
        Ok(StateMachineStore { storage, bodies, replica: Arc::new(Mutex::new(replica)), stored, initial_meta })
    }

    /// Decodes a snapshot file: a stored one (state only, its bodies in this node's storage), or a sent one
    /// (`Whole::Yes`), whose bodies come back checked for the caller to store.
    fn decode(bytes: &[u8], whole: Whole) -> Result<(Replica, Vec<(u64, Bytes)>), StorageError> {
        let corrupt =
            |reason: String| StorageError::Corrupt { space: Space::State, key: stored_snapshot::HEADER_KEY, reason };
        let file: SnapshotFile =
            postcard::from_bytes(bytes).map_err(|error| corrupt(format!("snapshot does not decode: {error}")))?;
        let (cell, bodies) = match whole {
            Whole::No => Cell::restore(&file.cell).map(|cell| (cell, Vec::new())),
            Whole::Yes => Cell::restore_whole(&file.cell),
        }
        .map_err(|error| match error {
            // Not damage: a snapshot this build cannot read is kept, and the node refuses to start over it.
            SnapshotError::UnsupportedVersion { version } => StorageError::Unsupported {
                reason: format!(
                    "the stored state is a snapshot of version {version}; this build reads version {SNAPSHOT_VERSION}"
                ),
            },
            other => corrupt(format!("cell snapshot: {other}")),
        })?;
        Ok((Replica { cell, last_applied: file.last_applied, membership: file.membership }, bodies))
    }

    fn take_initial_meta(&self) -> Option<SnapshotMeta<NodeId, NodeAddrs>> {
        self.initial_meta.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }

    /// The node's message bodies.
    pub fn bodies(&self) -> Arc<StoredBodies<S>> {
        self.bodies.clone()
    }

    /// The applied state, shared with the host for reads.
    pub fn replica(&self) -> Arc<Mutex<Replica>> {
        self.replica.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Replica> {
        self.replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Encodes the current state (without bodies), writes it to storage with the deletes of the bodies removed so far,
    /// and syncs it.
    fn persist_snapshot(&self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        self.take_initial_meta();
        let mut batch = Batch::new();
        let (bytes, meta) = {
            // Never a replica that a panic interrupted: it may hold half an entry, and a snapshot would keep it.
            let replica = read_replica(&self.replica).map_err(state_error)?;
            let file = replica.file(replica.cell.snapshot());
            // Taken with the state: every body removed so far is one this snapshot no longer refers to.
            self.bodies.take_deletes(&mut batch);
            let meta = replica.meta();
            (postcard::to_stdvec(&file).expect("encoding into memory does not fail"), meta)
        };
        let mut stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *stored > meta.last_log_id {
            // A newer snapshot was installed while this one was built: it stays (and replaced every body, so the
            // deletes taken above are moot).
            drop(stored);
            return self.get_stored()?.ok_or_else(|| state_error("the stored snapshot vanished"));
        }
        stored_snapshot::put(&mut batch, &bytes, SNAPSHOT_CHUNK_BYTES);
        self.storage.write(batch).map_err(state_error)?;
        self.storage.sync().map_err(state_error)?;
        self.storage.checkpoint().map_err(state_error)?;
        *stored = meta.last_log_id;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) })
    }

    /// The stored snapshot, if any, whole: its state with every body it refers to, for a follower that has nothing.
    /// Holds the stored snapshot in place meanwhile, so none of its bodies is deleted while they are read.
    fn get_stored(&self) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        let _stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(bytes) = stored_snapshot::get(&self.storage).map_err(state_error)? else {
            return Ok(None);
        };
        let (replica, _) = Self::decode(&bytes, Whole::No).map_err(state_error)?;
        let mut bodies = Vec::new();
        for body in replica.cell.body_refs() {
            match self.bodies.read(&body) {
                Ok(bytes) => bodies.push((body.key, bytes)),
                Err(error) => {
                    // The stored snapshot refers to it, so it was never deleted: damage.
                    let reason = error.to_string();
                    self.bodies.mark_damaged(body.key, &reason);
                    return Err(state_error(format!("the snapshot's body {}: {reason}", body.key)));
                }
            }
        }
        let file = replica.file(replica.cell.snapshot_whole(bodies).map_err(state_error)?);
        let meta = replica.meta();
        let bytes = postcard::to_stdvec(&file).expect("encoding into memory does not fail");
        Ok(Some(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) }))
    }
}

impl<S: Storage + Clone> RaftSnapshotBuilder<TypeConfig> for StateMachineStore<S> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        self.persist_snapshot()
    }
}

impl<S: Storage + Clone> RaftStateMachine<TypeConfig> for StateMachineStore<S> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, NodeAddrs>), RaftStorageError> {
        let replica = self.lock();
        Ok((replica.last_applied, replica.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replica = self.lock();
        let replica = &mut *replica;
        let mut work = BodyWork::default();
        let mut responses = Vec::new();
        for entry in entries {
            replica.last_applied = Some(entry.log_id);
            let traced = transition::tracing_entries();
            // Transitions, collected only to be traced; body work goes to `work` as each command's effects drain.
            let mut transitions: Vec<Effect> = Vec::new();
            let response = match entry.payload {
                EntryPayload::Blank => Response::Empty,
                EntryPayload::Normal(request) => {
                    let kinds: Vec<&'static str> =
                        if traced { request.commands.iter().map(Into::into).collect() } else { Vec::new() };
                    let mut results = Vec::with_capacity(request.commands.len());
                    for command in request.commands {
                        results.push(replica.cell.apply(request.at, command));
                        for effect in replica.cell.drain_effects() {
                            if effect.is_body_work() {
                                self.bodies.act(&mut work, &effect);
                            } else if traced {
                                transitions.push(effect);
                            }
                        }
                    }
                    if traced {
                        transition::applied(entry.log_id.index, request.at, &kinds, &results);
                    }
                    Response::Applied(results)
                }
                EntryPayload::Membership(membership) => {
                    transition::membership(entry.log_id.index, &membership);
                    replica.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Response::Empty
                }
            };
            if traced {
                transition::effects(entry.log_id.index, &transitions);
            }
            responses.push(response);
        }
        // Written while the replica is held, so a snapshot taken of this state finds its bodies written (and its
        // sync makes them durable). Not synced here: the log holds these bodies until a snapshot covers them, and
        // that snapshot is stored only after a sync.
        self.bodies.write(work).map_err(state_error)?;
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, RaftStorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeAddrs>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), RaftStorageError> {
        self.take_initial_meta();
        let bytes = snapshot.into_inner();
        let mut stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (replica, bodies) = Self::decode(&bytes, Whole::Yes)
            .map_err(|error| StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::new(&error)))
            .map_err(RaftStorageError::from)
            .and_then(|(replica, bodies)| {
                if replica.last_applied == meta.last_log_id {
                    return Ok((replica, bodies));
                }
                Err(state_error(format!(
                    "snapshot {} holds state up to {:?}, its meta says {:?}",
                    meta.snapshot_id, replica.last_applied, meta.last_log_id
                )))
            })?;
        // The old bodies out, the new ones and the state in, in one write, durable before openraft purges the log
        // this snapshot replaces. Readers wait meanwhile: the old state's bodies are going.
        let mut current = self.lock();
        // Every release still pending belongs to the state being replaced, whose bodies all go. (A refused snapshot
        // returned above, and its state keeps them.)
        self.bodies.reset();
        let mut batch = Batch::new();
        batch.delete_range(Space::Bodies, 0..u64::MAX);
        for (key, body) in bodies {
            batch.put(Space::Bodies, key, &body);
        }
        let file = replica.file(replica.cell.snapshot());
        let bytes = postcard::to_stdvec(&file).expect("encoding into memory does not fail");
        stored_snapshot::put(&mut batch, &bytes, SNAPSHOT_CHUNK_BYTES);
        self.storage.write(batch).map_err(state_error)?;
        self.storage.sync().map_err(state_error)?;
        self.storage.checkpoint().map_err(state_error)?;
        *stored = meta.last_log_id;
        drop(stored);
        current.cell = replica.cell;
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::SnapshotSkipsConsumers) {
            current.cell.forget_consumers();
        }
        current.last_applied = replica.last_applied;
        current.membership = replica.membership;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        if let Some(meta) = self.take_initial_meta() {
            // The data is left empty: it does not decode, so it could never be installed by mistake.
            return Ok(Some(Snapshot { meta, snapshot: Box::new(Cursor::new(Vec::new())) }));
        }
        self.get_stored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_a_panic_interrupted_is_never_read() {
        let replica = Arc::new(Mutex::new(Replica::default()));
        assert!(read_replica(&replica).is_ok());
        let holder = replica.clone();
        let panicked = std::thread::spawn(move || {
            let _applying = holder.lock().unwrap();
            panic!("a bug in apply");
        })
        .join();
        assert!(panicked.is_err());
        assert!(replica.is_poisoned());
        assert_eq!(read_replica(&replica).map(|_| ()), Err(Interrupted));
        assert!(Interrupted.to_string().contains("serves nothing"));
    }
}
