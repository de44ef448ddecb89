//! openraft's state machine over `cellog-core`: committed entries are applied to the [`Cell`], and the cell's answer
//! goes back to the proposer. Message bodies live in the storage's bodies space ([`crate::bodies`]).
//!
//! The stored snapshot is the cell's state without its bodies, plus the last applied log id and membership, written
//! and synced to storage (with the deletes of bodies removed before it) before openraft may purge the log it covers.
//! The snapshot sent to a follower is that stored file followed by every body it refers to, streamed from the store
//! as it is sent and into the follower's store as it arrives ([`crate::snapshot_transfer`]); installing it stores
//! the file and deletes the bodies the new state no longer refers to, in one synced write.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use cellog_core::{Body, BodyRef, Cell, Command, Outcome, Record, SNAPSHOT_VERSION, SnapshotError, Transition};
use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

use crate::apply_control::{self, ApplyControl, Applying, Fate, Halted};
use crate::bodies::{self, BodyError, BodyReadError, BodyWork, Need, StoredBodies};
use crate::runtime::{id_key, off_the_workers};
use crate::snapshot_transfer::{Incoming, Outgoing, SnapshotData};
use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};
use crate::stored_snapshot::{self, SNAPSHOT_CHUNK_BYTES};
use crate::transition;
use crate::types::{Entry, LogId, NodeAddrs, NodeId, ProposeError, RaftStorageError, Response, TypeConfig};

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

/// What a snapshot holds: stored as it is, and sent as it is followed by its bodies.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotFile<'a> {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, NodeAddrs>,
    /// `Cell::snapshot()`: the state without bodies, versioned and checksummed on its own. Borrowed from the bytes
    /// it is decoded from (the same encoding as a `Vec<u8>`'s), rather than copied a byte at a time.
    #[serde(borrow)]
    cell: Cow<'a, [u8]>,
}

impl Replica {
    /// A snapshot file of this replica.
    fn file(&self) -> SnapshotFile<'static> {
        SnapshotFile {
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            cell: Cow::Owned(self.cell.snapshot()),
        }
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

fn snapshot_id(last_applied: Option<LogId>) -> String {
    // Deterministic: the same state gives the same id on every replica and in every run.
    match last_applied {
        Some(log_id) => format!("{}-{}-{}", log_id.leader_id.term, log_id.leader_id.node_id, log_id.index),
        None => "empty".to_string(),
    }
}

/// A record's payload for an answer: its body read and verified (empty for a tombstone). Called after the apply
/// or read that produced the record, with `replica` not held, over the node's `bodies`. A body that does not verify is
/// never served, and is repaired (see [`crate::body_repair`]); one that is missing because its message was removed
/// since the record was taken is [`BodyError::Removed`].
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
    checked(bodies, replica, stream, record, body, bodies.read(body))
}

/// The payloads of `records`, as [`payload`] gives each, with their bodies read in one batched read.
pub fn payloads<S: Storage>(
    bodies: &StoredBodies<S>,
    replica: &Mutex<Replica>,
    stream: &str,
    records: &[&Record],
) -> Vec<Result<Bytes, BodyError>> {
    let stored: Vec<&BodyRef> = records
        .iter()
        .filter_map(|record| match &record.body {
            Body::Stored(body) => Some(body),
            Body::Tombstone { .. } => None,
        })
        .collect();
    let mut reads = bodies.read_many(&stored).into_iter();
    records
        .iter()
        .map(|record| match &record.body {
            Body::Stored(body) => {
                let read = reads.next().unwrap_or(Err(BodyReadError::Missing { key: body.key }));
                checked(bodies, replica, stream, record, body, read)
            }
            Body::Tombstone { .. } => Ok(Bytes::new()),
        })
        .collect()
}

/// What a read of `record`'s body gives: the payload, or why it is not served.
fn checked<S: Storage>(
    bodies: &StoredBodies<S>,
    replica: &Mutex<Replica>,
    stream: &str,
    record: &Record,
    body: &BodyRef,
    read: Result<Bytes, BodyReadError>,
) -> Result<Bytes, BodyError> {
    let (partition, seq) = (record.partition, record.seq);
    let reason = match read {
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
    // The client is told now; the repair goes on without it, and the delivery comes again.
    let need = Need::Record { stream: stream.to_string(), partition, seq };
    drop(bodies.found_damaged(*body, need, &reason));
    Err(BodyError::Unreadable { partition, seq, reason })
}

/// Decodes a snapshot file; its bodies are in this node's storage, or on their way to it.
fn decode(bytes: &[u8]) -> Result<Replica, StorageError> {
    let corrupt =
        |reason: String| StorageError::Corrupt { space: Space::State, key: stored_snapshot::HEADER_KEY, reason };
    let file: SnapshotFile =
        postcard::from_bytes(bytes).map_err(|error| corrupt(format!("snapshot does not decode: {error}")))?;
    let cell = Cell::restore_keyed(&file.cell, id_key()).map_err(|error| match error {
        // Not damage: a snapshot this build cannot read is kept, and the node refuses to start over it.
        SnapshotError::UnsupportedVersion { version } => StorageError::Unsupported {
            reason: format!(
                "the stored state is a snapshot of version {version}; this build reads version {SNAPSHOT_VERSION}"
            ),
        },
        other => corrupt(format!("cell snapshot: {other}")),
    })?;
    Ok(Replica { cell, last_applied: file.last_applied, membership: file.membership })
}

/// The last log id the stored snapshot covers, from its file alone (the state is not restored): what recovery needs to
/// know of a snapshot whose bodies are damaged. A snapshot that does not verify is an error.
pub(crate) fn stored_last_applied<S: Storage>(storage: &S) -> Result<Option<LogId>, StorageError> {
    let Some(bytes) = stored_snapshot::get(storage)? else { return Ok(None) };
    let file: SnapshotFile = postcard::from_bytes(&bytes).map_err(|error| StorageError::Corrupt {
        space: Space::State,
        key: stored_snapshot::HEADER_KEY,
        reason: format!("snapshot does not decode: {error}"),
    })?;
    Ok(file.last_applied)
}

/// Wakes the node's [`crate::CellNode::wait_fatal`] when applying (or installing a snapshot) panics: the replica is
/// poisoned then, and the task that applied (and whoever awaits it) is gone, so nothing else might look again. It
/// names the entry that panicked, if one did, for the operator ([`crate::apply_control`]).
/// Declared before the replica's guard, it drops after it: the replica is poisoned by the time the alarm rings.
struct PanicAlarm<'a> {
    seen: &'a watch::Sender<bool>,
    /// Where the entry a panic interrupted is told, when entries are applied.
    applying: Option<&'a Applying>,
    /// The entry being applied: kept here, not behind the shared lock, which only a panic takes.
    current: std::cell::Cell<Option<LogId>>,
}

impl Drop for PanicAlarm<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let (Some(applying), Some(log_id)) = (self.applying, self.current.get()) {
                let (index, term) = (log_id.index, log_id.leader_id.term);
                tracing::error!(target: transition::TARGET, index, term, "apply-panicked");
                tracing::error!("{}", apply_control::panicked_at(&log_id));
                applying.set(Some(log_id));
            }
            self.seen.send_replace(true);
        }
    }
}

/// Panics on a publish to the poisoned subject (see `cellog_planted::poison`), as a caller's command would whose
/// apply has a bug.
#[cfg(madsim)]
fn poisoned(command: &Command) {
    match command {
        Command::Publish(publish) if cellog_planted::poison::hits(&publish.subject) => {
            panic!("a poisoned command: applying it panics on every replica")
        }
        Command::As { command, .. } => poisoned(command),
        _ => {}
    }
}

/// The bodies the state in a snapshot file refers to: what a receiver checks the bodies that follow against.
fn references(file: &[u8]) -> Result<Vec<BodyRef>, String> {
    decode(file).map(|replica| replica.cell.body_refs()).map_err(|error| error.to_string())
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
    /// Notified after every batch of entries applied and every snapshot installed.
    applied: Arc<Notify>,
    /// Set once the node cannot go on (see [`crate::CellNode::wait_fatal`]); applying sets it if it panics.
    fatal_seen: Arc<watch::Sender<bool>>,
    /// The stored snapshot's size in bytes (0: none), for the node's snapshot budget.
    snapshot_bytes: Arc<AtomicU64>,
    /// What the node's doors check credentials against, without waiting on the replica (which applying holds).
    credentials: Credentials,
    /// What the operator said about entries to halt at or pass over.
    control: Arc<ApplyControl>,
    /// Where applying halted, once it did.
    halted: Halted,
    /// The entry being applied.
    applying: Applying,
}

/// What the node's doors check a caller's credential against: the principals, their tokens and the revoked
/// certificates as the applied state last had them. Replaced whole when an entry changes one of them or a snapshot is
/// installed, and read without waiting on the replica (which applying holds), so a door costs a call no turn at it.
#[derive(Clone, Debug, Default)]
pub struct Credentials(Arc<std::sync::RwLock<Arc<cellog_core::auth::Auth>>>);

impl Credentials {
    /// Takes the credentials of `cell`.
    fn follow(&self, cell: &Cell) {
        let auth = Arc::new(cell.auth().clone());
        *self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = auth;
    }

    fn current(&self) -> Arc<cellog_core::auth::Auth> {
        self.0.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Whether the certificate with `serial` is revoked.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.current().revoked().contains_key(serial)
    }

    /// The principal `actor` is, as the cell would authenticate it now.
    pub fn authenticate(&self, actor: &cellog_core::Actor) -> Result<Arc<str>, cellog_core::Rejection> {
        self.current().authenticate(actor)
    }
}

/// Whether an outcome changed what [`Credentials`] holds.
fn changes_credentials(result: &Result<Outcome, cellog_core::Rejection>) -> bool {
    matches!(
        result,
        Ok(Outcome::CertificateRevoked { revoked: true }
            | Outcome::TokenAdded
            | Outcome::TokenRevoked
            | Outcome::PrincipalPut { .. }
            | Outcome::PrincipalDeleted)
    )
}

fn state_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::write_state_machine(openraft::AnyError::error(error.to_string())).into()
}

impl<S: Storage + Clone> StateMachineStore<S> {
    /// The state machine over `storage`, starting from the stored snapshot if there is one.
    pub fn open(storage: S) -> Result<Self, StorageError> {
        let bodies = Arc::new(StoredBodies::new(storage.clone()));
        let (mut replica, snapshot_bytes) = match stored_snapshot::get(&storage)? {
            Some(bytes) => (decode(&bytes)?, bytes.len() as u64),
            None => (Replica::default(), 0),
        };
        replica.cell.key_ids(id_key());
        if storage.get(Space::Meta, MetaKey::BodiesUnswept as u64)?.is_some() {
            // Bodies of a snapshot received half way, or of releases whose deletes waited for a snapshot being sent:
            // everything the stored state does not refer to goes. The log replayed next writes its bodies again.
            let mut batch = Batch::new();
            bodies::delete_all_but(&replica.cell.body_refs(), &mut batch);
            batch.delete_range(Space::Meta, MetaKey::BodiesUnswept as u64..MetaKey::BodiesUnswept as u64 + 1);
            storage.write(batch)?;
            storage.sync()?;
        }
        let stored = Arc::new(Mutex::new(replica.last_applied));
        let initial_meta = Arc::new(Mutex::new(replica.last_applied.map(|_| replica.meta())));
        let applied = Arc::new(Notify::new());
        let fatal_seen = Arc::new(watch::Sender::new(false));
        let replica = Arc::new(Mutex::new(replica));
        let snapshot_bytes = Arc::new(AtomicU64::new(snapshot_bytes));
        let credentials = Credentials::default();
        credentials.follow(&replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).cell);
        Ok(StateMachineStore {
            storage,
            bodies,
            replica,
            stored,
            initial_meta,
            applied,
            fatal_seen,
            snapshot_bytes,
            credentials,
            control: Arc::default(),
            halted: Halted::default(),
            applying: Applying::default(),
        })
    }

    /// The same, applying entries as the operator says (see [`crate::apply_control`]). Given before Raft starts: it
    /// applies the committed log as it starts.
    pub fn with_control(self, control: ApplyControl) -> Self {
        StateMachineStore { control: Arc::new(control), ..self }
    }

    /// Where applying halted, once it did.
    pub fn halted(&self) -> Halted {
        self.halted.clone()
    }

    /// The entry being applied, if applying is under way (or a panic interrupted it).
    pub(crate) fn applying(&self) -> Applying {
        self.applying.clone()
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

    /// Notified (`notify_waiters`) after every batch of entries applied and every snapshot installed: what waits for
    /// the state to change registers first, then reads the replica, then waits.
    pub fn applied(&self) -> Arc<Notify> {
        self.applied.clone()
    }

    /// What the node's doors check credentials against.
    pub fn credentials(&self) -> Credentials {
        self.credentials.clone()
    }

    /// Set once the node cannot go on: by applying, if it panics, and by the node's watchdog.
    pub(crate) fn fatal_seen(&self) -> Arc<watch::Sender<bool>> {
        self.fatal_seen.clone()
    }

    /// The stored snapshot's size in bytes (0: none), kept as snapshots are built and installed.
    pub(crate) fn snapshot_bytes(&self) -> Arc<AtomicU64> {
        self.snapshot_bytes.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Replica> {
        self.replica.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Encodes the current state (without bodies), writes it to storage with the deletes of the bodies removed so far,
    /// and syncs it.
    fn persist_snapshot(&self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        self.take_initial_meta();
        let (bytes, meta, released, kept) = {
            // Never a replica that a panic interrupted: it may hold half an entry, and a snapshot would keep it.
            let replica = read_replica(&self.replica).map_err(state_error)?;
            let file = replica.file();
            // Taken with the state: every body released so far is one this snapshot no longer refers to, and every
            // body kept in the log that it refers to must be copied out before it is stored.
            let released = self.bodies.take_released();
            let kept = self.bodies.kept_now();
            (postcard::to_stdvec(&file).expect("encoding into memory does not fail"), replica.meta(), released, kept)
        };
        let mut stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *stored > meta.last_log_id {
            // A newer snapshot was installed while this one was built: it stays. The releases taken above were not
            // among the bodies its install deleted; a later snapshot deletes them.
            self.bodies.give_back(released);
            return Ok(Snapshot { meta: self.stored_meta()?, snapshot: Box::new(SnapshotData::Empty) });
        }
        // The bodies this state refers to were written without the journal before the replica was let go, or are in
        // the log and copied out now (with `stored` held, so no install replaces the log meanwhile): durable, before
        // the snapshot that lets the log holding them go.
        if let Err(error) = self.bodies.copy_out(&kept, &released).and_then(|()| self.storage.persist()) {
            self.bodies.give_back(released);
            return Err(state_error(error));
        }
        let mut batch = Batch::new();
        self.delete_unless_held(released, &mut batch);
        stored_snapshot::put(&mut batch, &bytes, SNAPSHOT_CHUNK_BYTES);
        self.storage.write(batch).map_err(state_error)?;
        self.storage.sync().map_err(state_error)?;
        self.storage.checkpoint().map_err(state_error)?;
        *stored = meta.last_log_id;
        self.bodies.forget(&kept);
        self.snapshot_bytes.store(bytes.len() as u64, Ordering::Release);
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::Empty) })
    }

    /// Adds the deletes of the bodies under `keys` to `batch`; while a snapshot is being sent they wait for a later
    /// snapshot instead, and the store is marked so that a restart meanwhile deletes them. Called with `stored` held,
    /// as a send takes its hold, so that no send starts between the check and the write.
    fn delete_unless_held(&self, keys: Vec<u64>, batch: &mut Batch) {
        if keys.is_empty() {
            return;
        }
        if self.bodies.held() {
            self.bodies.give_back(keys);
            batch.put(Space::Meta, MetaKey::BodiesUnswept as u64, &[]);
        } else {
            bodies::delete_bodies(keys, batch);
        }
    }

    /// A receiver of a snapshot stream into this node's storage.
    fn incoming(&self) -> Incoming {
        Incoming::new(Arc::new(self.storage.clone()), references)
    }

    /// The meta of the stored snapshot.
    fn stored_meta(&self) -> Result<SnapshotMeta<NodeId, NodeAddrs>, RaftStorageError> {
        let bytes = stored_snapshot::get(&self.storage)
            .map_err(state_error)?
            .ok_or_else(|| state_error("the stored snapshot vanished"))?;
        Ok(decode(&bytes).map_err(state_error)?.meta())
    }

    /// The stored snapshot, if any, as a stream of its file and every body it refers to, read from storage as it is
    /// sent. Its bodies are held in place until the stream is dropped.
    fn get_stored(&self) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        let _stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let hold = self.bodies.hold();
        let Some(bytes) = stored_snapshot::get(&self.storage).map_err(state_error)? else {
            return Ok(None);
        };
        let replica = decode(&bytes).map_err(state_error)?;
        let meta = replica.meta();
        let refs = replica.cell.body_refs();
        drop(replica);
        let stream = Outgoing::new(&bytes, refs, self.bodies.clone(), hold);
        Ok(Some(Snapshot { meta, snapshot: Box::new(SnapshotData::Outgoing(stream)) }))
    }
}

impl<S: Storage + Clone> RaftSnapshotBuilder<TypeConfig> for StateMachineStore<S> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, RaftStorageError> {
        let store = self.clone();
        off_the_workers(move || store.persist_snapshot()).await
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
        let alarm = PanicAlarm { seen: &self.fatal_seen, applying: Some(&self.applying), current: Default::default() };
        let mut replica = self.lock();
        let replica = &mut *replica;
        let mut work = BodyWork::default();
        let mut responses = Vec::new();
        // The answers for proposers waiting on this node, sent once the entries' bodies are written.
        let mut answers = Vec::new();
        // The proposers of entries not applied, and why.
        let mut unapplied = Vec::new();
        for entry in entries {
            let fate = match (&entry.payload, self.control.fate(&entry.log_id)) {
                // Only commands can be passed over; a blank or membership entry runs no command.
                (EntryPayload::Blank | EntryPayload::Membership(_), Fate::Skip) => Fate::Apply,
                (_, fate) => fate,
            };
            let (index, term) = (entry.log_id.index, entry.log_id.leader_id.term);
            if fate == Fate::Halt {
                // Not applied, nor is anything after it: the replica stays as it was before the halt, and openraft,
                // told the entry is done, goes on replicating the log. Restarted without the halt, the node applies it.
                if self.halted.at().is_none() {
                    tracing::warn!(target: transition::TARGET, index, "apply-halted");
                }
                self.halted.set(index);
                let halt_at = self.halted.at().unwrap_or(index);
                if let EntryPayload::Normal(request) = &entry.payload
                    && let Some(proposers) = request.waiting.take()
                {
                    unapplied.push((proposers, ProposeError::halted_in_log(halt_at)));
                }
                responses.push(Response::Halted { index: halt_at });
                continue;
            }
            replica.last_applied = Some(entry.log_id);
            if fate == Fate::Skip {
                tracing::warn!(target: transition::TARGET, index, term, "entry-skipped");
                let response = match &entry.payload {
                    EntryPayload::Normal(request) => match request.waiting.take() {
                        Some(proposers) => {
                            unapplied.push((proposers, ProposeError::EntrySkipped { index, term }));
                            Response::Answered
                        }
                        None => Response::Skipped { index, term },
                    },
                    _ => Response::Empty,
                };
                responses.push(response);
                continue;
            }
            alarm.current.set(Some(entry.log_id));
            let traced = transition::tracing_entries();
            // Transitions, built and collected only to be traced; body work goes to `work` as each command's drains.
            replica.cell.trace_transitions(traced);
            let mut transitions: Vec<Transition> = Vec::new();
            let response = match entry.payload {
                EntryPayload::Blank => Response::Empty,
                EntryPayload::Normal(request) => {
                    work.enter(index, &request.placed);
                    let waiting = request.waiting.take();
                    let kinds: Vec<&'static str> =
                        if traced { request.commands.iter().map(Command::kind).collect() } else { Vec::new() };
                    let mut results = Vec::with_capacity(request.commands.len());
                    for command in request.commands {
                        #[cfg(madsim)]
                        poisoned(&command);
                        let result = replica.cell.apply(request.at, command);
                        if changes_credentials(&result) {
                            self.credentials.follow(&replica.cell);
                        }
                        results.push(result);
                        for op in replica.cell.drain_work() {
                            self.bodies.act(&mut work, &op);
                        }
                        transitions.extend(replica.cell.drain_transitions());
                    }
                    if traced {
                        transition::applied(entry.log_id.index, request.at, &kinds, &results);
                    }
                    match waiting {
                        Some(proposers) => {
                            answers.push((proposers, results));
                            Response::Answered
                        }
                        None => Response::Applied(results),
                    }
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
        alarm.current.set(None);
        // Written while the replica is held, so a snapshot taken of this state finds its bodies written (and makes
        // them durable before it is stored). Not durable here: the log holds these bodies until a snapshot covers
        // them (see `crate::bodies`).
        self.bodies.write(work).map_err(state_error)?;
        for (proposers, results) in answers {
            proposers.answer(results);
        }
        for (proposers, error) in unapplied {
            proposers.fail(error);
        }
        self.applied.notify_waiters();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, RaftStorageError> {
        Ok(Box::new(SnapshotData::Incoming(self.incoming())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeAddrs>,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), RaftStorageError> {
        let (store, meta) = (self.clone(), meta.clone());
        off_the_workers(move || store.install(&meta, snapshot)).await?;
        self.applied.notify_waiters();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        if let Some(meta) = self.take_initial_meta() {
            // The data is left empty: a receiver would find it incomplete, so it could never be installed by mistake.
            return Ok(Some(Snapshot { meta, snapshot: Box::new(SnapshotData::Empty) }));
        }
        let store = self.clone();
        off_the_workers(move || store.get_stored()).await
    }
}

impl<S: Storage + Clone> StateMachineStore<S> {
    /// Installs a snapshot received whole (see [`RaftStateMachine::install_snapshot`]).
    fn install(
        &self,
        meta: &SnapshotMeta<NodeId, NodeAddrs>,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), RaftStorageError> {
        let _alarm = PanicAlarm { seen: &self.fatal_seen, applying: None, current: Default::default() };
        self.take_initial_meta();
        // openraft installs only a stream that ended whole: the receiver checked every body as it arrived, and wrote
        // it. A stream handed over within the process (openraft's storage suite does that) is received here.
        let received = match *snapshot {
            SnapshotData::Incoming(incoming) => incoming.into_received(),
            SnapshotData::Outgoing(mut stream) => {
                let mut incoming = self.incoming();
                incoming.take_all(&mut stream).map_err(state_error)?;
                incoming.into_received()
            }
            SnapshotData::Empty => None,
        }
        .ok_or_else(|| state_error(format!("snapshot {} was not received whole", meta.snapshot_id)))?;
        let mut stored = self.stored.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut replica = decode(&received.file)
            .map_err(|error| StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::new(&error)))
            .map_err(RaftStorageError::from)
            .and_then(|replica| {
                if replica.last_applied == meta.last_log_id {
                    return Ok(replica);
                }
                Err(state_error(format!(
                    "snapshot {} holds state up to {:?}, its meta says {:?}",
                    meta.snapshot_id, replica.last_applied, meta.last_log_id
                )))
            })?;
        replica.cell.key_ids(id_key());
        // The new bodies are in; the state goes in with the deletes of the old bodies the new state does not refer to,
        // in one write, durable before openraft purges the log this snapshot replaces. Readers wait meanwhile: the old
        // state's bodies are going.
        let mut current = self.lock();
        let mut gone: Vec<u64> = self.bodies.take_released();
        gone.extend(current.cell.body_refs().iter().map(|body| body.key));
        let kept: std::collections::BTreeSet<u64> = received.bodies.iter().map(|body| body.key).collect();
        gone.retain(|key| !kept.contains(key));
        let mut batch = Batch::new();
        self.delete_unless_held(gone, &mut batch);
        stored_snapshot::put(&mut batch, &received.file, SNAPSHOT_CHUNK_BYTES);
        self.storage.write(batch).map_err(state_error)?;
        self.storage.sync().map_err(state_error)?;
        self.storage.checkpoint().map_err(state_error)?;
        *stored = meta.last_log_id;
        self.bodies.forget_all();
        self.snapshot_bytes.store(received.file.len() as u64, Ordering::Release);
        drop(stored);
        current.cell = replica.cell;
        self.credentials.follow(&current.cell);
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::SnapshotSkipsConsumers) {
            current.cell.forget_consumers();
        }
        current.last_applied = replica.last_applied;
        current.membership = replica.membership;
        Ok(())
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

    #[test]
    fn a_panic_while_applying_raises_the_alarm_and_a_return_does_not() {
        let seen = watch::Sender::new(false);
        {
            let _alarm = PanicAlarm { seen: &seen, applying: None, current: Default::default() };
        }
        assert!(!*seen.borrow(), "applying returned");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _alarm = PanicAlarm { seen: &seen, applying: None, current: Default::default() };
            panic!("applying went wrong");
        }));
        assert!(panicked.is_err());
        assert!(*seen.borrow(), "the node's wait_fatal wakes");
    }
}
