//! openraft's state machine over `cellog-core`: committed entries are applied to the [`Cell`], and the cell's answer
//! goes back to the proposer. Snapshots are the cell's own encoding plus the last applied log id and membership,
//! written and synced to storage before openraft may purge the log they cover.

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use cellog_core::{Cell, Effect};
use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use crate::storage::{Batch, Space, Storage, StorageError};
use crate::transition;
use crate::types::{Entry, LogId, Node, NodeId, RaftStorageError, Response, TypeConfig};

/// The key of the one snapshot record in [`Space::State`].
const SNAPSHOT_KEY: u64 = 0;

/// Most effects kept for the host between drains; older ones are dropped and counted.
pub const MAX_PENDING_EFFECTS: usize = 65_536;

/// The replicated state as this node has applied it.
#[derive(Debug, Default)]
pub struct Replica {
    /// The cell.
    pub cell: Cell,
    /// The last entry applied.
    pub last_applied: Option<LogId>,
    /// The last membership applied.
    pub membership: StoredMembership<NodeId, Node>,
    /// Effects of applied commands, with the index that produced them, until the host drains them.
    pub effects: Vec<(u64, Effect)>,
    /// Effects dropped because the host did not drain them in time.
    pub n_effects_dropped: u64,
}

/// Queues the effects of entry `index` for the host, dropping (and counting) those past [`MAX_PENDING_EFFECTS`].
fn keep_effects(
    pending: &mut Vec<(u64, Effect)>,
    dropped: &mut u64,
    index: u64,
    effects: impl IntoIterator<Item = Effect>,
) {
    for effect in effects {
        if pending.len() >= MAX_PENDING_EFFECTS {
            *dropped += 1;
        } else {
            pending.push((index, effect));
        }
    }
}

/// What a snapshot holds.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotFile {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, Node>,
    /// `Cell::snapshot()`: versioned and checksummed on its own.
    cell: Vec<u8>,
}

fn snapshot_id(last_applied: Option<LogId>) -> String {
    // Deterministic: the same state gives the same id on every replica and in every run.
    match last_applied {
        Some(log_id) => format!("{}-{}-{}", log_id.leader_id.term, log_id.leader_id.node_id, log_id.index),
        None => "empty".to_string(),
    }
}

/// The state machine half of a node's storage.
#[derive(Clone, Debug)]
pub struct StateMachineStore<S> {
    storage: S,
    replica: Arc<Mutex<Replica>>,
    /// The last log id covered by the stored snapshot. Held while a snapshot is written, so a snapshot built in the
    /// background never overwrites a newer one installed meanwhile.
    stored: Arc<Mutex<Option<LogId>>>,
}

fn state_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::write_state_machine(openraft::AnyError::error(error.to_string())).into()
}

impl<S: Storage + Clone> StateMachineStore<S> {
    /// The state machine over `storage`, starting from the stored snapshot if there is one.
    pub fn open(storage: S) -> Result<Self, StorageError> {
        let replica = match storage.get(Space::State, SNAPSHOT_KEY)? {
            Some(bytes) => Self::decode(&bytes)?,
            None => Replica::default(),
        };
        let stored = Arc::new(Mutex::new(replica.last_applied));
        Ok(StateMachineStore { storage, replica: Arc::new(Mutex::new(replica)), stored })
    }

    fn decode(bytes: &[u8]) -> Result<Replica, StorageError> {
        let corrupt = |reason: String| StorageError::Corrupt { space: Space::State, key: SNAPSHOT_KEY, reason };
        let file: SnapshotFile =
            postcard::from_bytes(bytes).map_err(|error| corrupt(format!("snapshot does not decode: {error}")))?;
        let cell = Cell::restore(&file.cell).map_err(|error| corrupt(format!("cell snapshot: {error}")))?;
        Ok(Replica { cell, last_applied: file.last_applied, membership: file.membership, ..Replica::default() })
    }

    /// The applied state, shared with the host for reads.
    pub fn replica(&self) -> Arc<Mutex<Replica>> {
        self.replica.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Replica> {
        self.replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Encodes the current state, writes it to storage and syncs it.
    fn persist_snapshot(&self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        let (bytes, meta) = {
            let replica = self.lock();
            let file = SnapshotFile {
                last_applied: replica.last_applied,
                membership: replica.membership.clone(),
                cell: replica.cell.snapshot(),
            };
            let meta = SnapshotMeta {
                last_log_id: replica.last_applied,
                last_membership: replica.membership.clone(),
                snapshot_id: snapshot_id(replica.last_applied),
            };
            (postcard::to_stdvec(&file).expect("encoding into memory does not fail"), meta)
        };
        let mut stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *stored > meta.last_log_id {
            // A newer snapshot was installed while this one was built: it stays, and is what this build returns.
            drop(stored);
            return self.get_stored()?.ok_or_else(|| state_error("the stored snapshot vanished"));
        }
        let mut batch = Batch::new();
        batch.put(Space::State, SNAPSHOT_KEY, &bytes);
        self.storage.write(batch).map_err(state_error)?;
        self.storage.sync().map_err(state_error)?;
        *stored = meta.last_log_id;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) })
    }

    /// The stored snapshot, if any.
    fn get_stored(&self) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        let Some(bytes) = self.storage.get(Space::State, SNAPSHOT_KEY).map_err(state_error)? else {
            return Ok(None);
        };
        let replica = Self::decode(&bytes).map_err(state_error)?;
        let meta = SnapshotMeta {
            last_log_id: replica.last_applied,
            last_membership: replica.membership,
            snapshot_id: snapshot_id(replica.last_applied),
        };
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

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership<NodeId, Node>), RaftStorageError> {
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
        let mut responses = Vec::new();
        for entry in entries {
            replica.last_applied = Some(entry.log_id);
            let traced = transition::tracing_entries();
            let response = match entry.payload {
                EntryPayload::Blank => Response::Empty,
                EntryPayload::Normal(request) => {
                    let kinds: Vec<&'static str> =
                        if traced { request.commands.iter().map(Into::into).collect() } else { Vec::new() };
                    let results: Vec<_> =
                        request.commands.into_iter().map(|command| replica.cell.apply(request.at, command)).collect();
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
            let index = entry.log_id.index;
            // Collected only to be traced; otherwise the effects go straight from the cell to the host's queue.
            if traced {
                let effects: Vec<Effect> = replica.cell.drain_effects().collect();
                transition::effects(index, &effects);
                keep_effects(&mut replica.effects, &mut replica.n_effects_dropped, index, effects);
            } else {
                keep_effects(&mut replica.effects, &mut replica.n_effects_dropped, index, replica.cell.drain_effects());
            }
            responses.push(response);
        }
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
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), RaftStorageError> {
        let bytes = snapshot.into_inner();
        let replica = Self::decode(&bytes)
            .map_err(|error| StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::new(&error)))?;
        if replica.last_applied != meta.last_log_id {
            return Err(state_error(format!(
                "snapshot {} holds state up to {:?}, its meta says {:?}",
                meta.snapshot_id, replica.last_applied, meta.last_log_id
            )));
        }
        // Durable before openraft purges the log this snapshot replaces.
        {
            let mut stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut batch = Batch::new();
            batch.put(Space::State, SNAPSHOT_KEY, &bytes);
            self.storage.write(batch).map_err(state_error)?;
            self.storage.sync().map_err(state_error)?;
            *stored = meta.last_log_id;
        }
        let mut current = self.lock();
        current.cell = replica.cell;
        #[cfg(madsim)]
        if cellog_core::mutant::active(cellog_core::mutant::Mutant::SnapshotSkipsConsumers) {
            current.cell.forget_consumers();
        }
        current.last_applied = replica.last_applied;
        current.membership = replica.membership;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        self.get_stored()
    }
}
