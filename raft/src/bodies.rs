//! The cell's message bodies in the node's storage ([`Space::Bodies`]), so a node's memory does not grow with the bytes
//! it retains.
//!
//! The cell hands its body work out as effects ([`cellog_core::body`]); the state machine gathers the work of one
//! apply call in a [`BodyWork`] while it holds the replica, and writes it before it lets go, without the journal
//! ([`Storage::write_unlogged`]): a crash or a restart may lose it, and the restart's replay of the log writes it
//! again. That is enough, because the log holds every body until a snapshot covers it, and a snapshot is stored only
//! after [`Storage::persist`] has made every body written before it durable. A released body is deleted only when a
//! snapshot that no longer refers to it is stored: until then the stored snapshot may still be sent to a follower,
//! with its bodies, and a restart replays the release from the log anyway. While a snapshot is being sent
//! ([`StoredBodies::hold`]), deletes wait for a later snapshot, and the store is marked
//! ([`MetaKey::BodiesUnswept`]) so that a restart meanwhile deletes what the stored state no longer refers to.
//!
//! A body the log already holds where it can be read again ([`crate::in_log`]: at least
//! [`crate::in_log::IN_LOG_MIN_BYTES`], applied from the entry the log store wrote) is not written at all: the node
//! keeps its place in the log, in memory, and reads it from there. A snapshot that refers to it copies it into the
//! store before it is stored ([`StoredBodies::copy_out`]), since the log behind a snapshot may go; a body released
//! before that is never written. A restart forgets the places, and its replay writes the bodies it applies as above.
//!
//! Bodies are read by the node that answers a client, after the apply and outside the replica's lock
//! ([`StoredBodies::read`]). Reads are verified twice: the record's frame (crc32c over space, key and bytes) and the
//! body's own length and crc32c, which the cell's [`BodyRef`] carries. A body that fails either is never served. A
//! running node repairs it from a peer's copy ([`crate::body_repair`]); where that cannot be done,
//! [`StoredBodies::mark_damaged`] records the damage in [`MetaKey::BodiesDamaged`], so that the node's next start
//! drops its state and takes a whole snapshot from the leader.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use bytes::Bytes;
use cellog_core::{BodyOp, BodyRef};
use tokio::sync::{mpsc, oneshot};

use crate::in_log::{InLog, Placed};
use crate::snapshot_transfer::{BodySource, Hold, Holds};
use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};

/// Why a body could not be read back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyReadError {
    /// Nothing is stored under the key: damage, or a body released and deleted since its reference was read.
    #[error("body {key} is not in this node's storage")]
    Missing {
        /// The key.
        key: u64,
    },
    /// Something is stored but does not verify (or the device failed): damage.
    #[error("{reason}")]
    Damaged {
        /// What does not verify.
        reason: String,
    },
}

/// Why a record's payload is not served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// This node's copy of the body is missing or does not verify against its length and crc32c. It is never served;
    /// another replica serves it, or this one once it has repaired it from a peer's copy (or, when no peer has one,
    /// from the leader's snapshot at its next start).
    #[error(
        "message {partition}/{seq}: this node's copy of the body does not verify ({reason}); it is being repaired from a peer"
    )]
    Unreadable {
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
        /// What does not verify.
        reason: String,
    },
    /// The message was removed (by retention, a recall or its stream's deletion) after the record was taken and
    /// before its body was read.
    #[error("message {partition}/{seq} was removed while it was being read")]
    Removed {
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
}

/// Why the body is still needed once a peer's copy comes back.
#[derive(Clone, Debug)]
pub(crate) enum Need {
    /// A snapshot being sent holds it: it cannot have been deleted.
    Held,
    /// A client's read of this message found it damaged: needed while the message still refers to it.
    Record {
        /// The stored stream.
        stream: String,
        /// The partition.
        partition: u32,
        /// The sequence.
        seq: u64,
    },
}

/// A damaged body handed to the node's repairs ([`crate::body_repair`]).
#[derive(Debug)]
pub(crate) struct Damaged {
    /// The reference this node's state holds.
    pub body: BodyRef,
    /// Why it is still needed.
    pub need: Need,
    /// What was wrong with this node's copy.
    pub reason: String,
    /// Told the repaired body, or why there is none.
    pub answer: oneshot::Sender<Result<Bytes, String>>,
}

/// The body work of one apply call: bodies to write, in key order, and bodies left in the log. Filled while the
/// replica is held and written before it is let go ([`StoredBodies::write`]).
#[derive(Debug, Default)]
#[must_use = "body work that is not written loses the bodies the applied state refers to"]
pub struct BodyWork {
    puts: BTreeMap<u64, Bytes>,
    in_log: BTreeMap<u64, Kept>,
    /// The entry being applied: its index and where its payloads are in the log.
    entry: Option<(u64, Placed)>,
}

impl BodyWork {
    /// The effects acted on from now on are the entry `index`'s, whose payloads are where `placed` says.
    pub fn enter(&mut self, index: u64, placed: &Placed) {
        self.entry = (!placed.is_empty()).then(|| (index, placed.clone()));
    }

    /// Where `bytes`, a body of the entry being applied, are in the log.
    fn in_log(&self, bytes: &Bytes) -> Option<InLog> {
        let (index, placed) = self.entry.as_ref()?;
        placed.find(bytes).map(|offset| InLog { index: *index, offset })
    }
}

/// A body the node keeps in the log: where, and the reference that checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kept {
    at: InLog,
    body: BodyRef,
}

/// The bodies of a node's [`Storage`].
#[derive(Debug)]
pub struct StoredBodies<S> {
    storage: S,
    /// Released bodies not yet covered by a stored snapshot.
    released: Mutex<Vec<u64>>,
    n_unreadable: AtomicU64,
    /// The damage mark is written (once per process is enough: it stays until the next start acts on it).
    marked: AtomicBool,
    /// Snapshots being sent from these bodies.
    holds: Holds,
    /// The bodies kept in the log (see [`crate::in_log`]), by key, until a snapshot copies them out.
    in_log: Mutex<BTreeMap<u64, Kept>>,
    /// The running node's repairs, once it has started.
    repairs: OnceLock<RepairQueue>,
}

/// The queue to a node's repairs, and what starts the task that takes from it: started with the first damage found,
/// so that a node whose disk damages nothing runs no task for it (and a simulated run schedules none).
struct RepairQueue {
    queue: mpsc::Sender<Damaged>,
    start: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for RepairQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepairQueue").field("queue", &self.queue).finish_non_exhaustive()
    }
}

impl<S: Storage> StoredBodies<S> {
    /// The bodies in `storage`.
    pub fn new(storage: S) -> Self {
        StoredBodies {
            storage,
            released: Mutex::new(Vec::new()),
            n_unreadable: AtomicU64::new(0),
            marked: AtomicBool::new(false),
            holds: Holds::default(),
            in_log: Mutex::new(BTreeMap::new()),
            repairs: OnceLock::new(),
        }
    }

    /// Hands the damage reads find from now on to the node's repairs, through `queue`; `start` starts the task that
    /// takes from it, when the first damage is found.
    pub(crate) fn repair_through(&self, queue: mpsc::Sender<Damaged>, start: Box<dyn FnOnce() + Send>) {
        let _ = self.repairs.set(RepairQueue { queue, start: Mutex::new(Some(start)) });
    }

    /// Damage a read found in `body`, which is still needed as `need` says: counted, and handed to the node's
    /// repairs, whose answer comes on the returned receiver. Without repairs (a store opened alone), or with their
    /// queue closed, the damage is marked for the next start and `None` returned; with their queue full, a read
    /// leaves it to a later read, and `None` is returned too.
    pub(crate) fn found_damaged(
        &self,
        body: BodyRef,
        need: Need,
        reason: &str,
    ) -> Option<oneshot::Receiver<Result<Bytes, String>>> {
        let Some(repairs) = self.repairs.get() else {
            self.mark_damaged(body.key, reason);
            return None;
        };
        self.n_unreadable.fetch_add(1, Ordering::Relaxed);
        let waits = matches!(need, Need::Held);
        let (answer, answered) = oneshot::channel();
        match repairs.queue.try_send(Damaged { body, need, reason: reason.to_string(), answer }) {
            Ok(()) => {
                tracing::warn!(key = body.key, reason, "a message body does not verify; repairing it from a peer");
                if let Some(start) = repairs.start.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
                    start();
                }
                Some(answered)
            }
            Err(mpsc::error::TrySendError::Full(_)) if !waits => None,
            Err(_) => {
                self.mark(body.key, reason);
                None
            }
        }
    }

    fn released(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.released.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Kept>> {
        self.in_log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Acts on one piece of body work the cell drained: a body to store or copy joins `work`; a released one waits
    /// for the next stored snapshot.
    pub fn act(&self, work: &mut BodyWork, op: &BodyOp) {
        match op {
            BodyOp::BodyStored { body, bytes } => match work.in_log(bytes) {
                Some(at) => {
                    work.in_log.insert(body.key, Kept { at, body: *body });
                }
                None => {
                    work.puts.insert(body.key, bytes.clone());
                }
            },
            BodyOp::BodyCopied { from, to } => {
                // A copy of a body this apply left in the log stays there too: the same bytes, under the new key. A
                // body an earlier apply left there is copied into the store: a place is only ever in an entry of the
                // apply that keeps it, so the snapshot that lets that entry go has copied out every body placed in it.
                if let Some(kept) = work.in_log.get(from).copied() {
                    work.in_log.insert(*to, Kept { at: kept.at, body: BodyRef { key: *to, ..kept.body } });
                    return;
                }
                let kept = self.kept().get(from).copied();
                let in_log = || kept.and_then(|kept| self.read_in_log(kept.at, &kept.body).ok().flatten());
                let source = match work.puts.get(from).cloned().or_else(in_log) {
                    Some(body) => Ok(body),
                    None => match self.storage.get(Space::Bodies, *from) {
                        Ok(Some(body)) => Ok(Bytes::from(body)),
                        Ok(None) => Err(BodyReadError::Missing { key: *from }.to_string()),
                        Err(error) => Err(error.to_string()),
                    },
                };
                match source {
                    Ok(body) => {
                        work.puts.insert(*to, body);
                    }
                    // Nothing is stored under `to`: a read of the copy fails its check, as the original's would.
                    Err(reason) => self.mark_damaged(*from, &reason),
                }
            }
            BodyOp::BodyReleased { key } => {
                // Put during this apply, it need not be written. It is deleted from storage all the same: a log
                // replayed after a restart puts bodies again that were written before it.
                work.puts.remove(key);
                work.in_log.remove(key);
                self.released().push(*key);
            }
        }
    }

    /// Puts the bodies of `work` into `batch`, and keeps the places of those left in the log.
    fn stage(&self, work: BodyWork, batch: &mut Batch) {
        for (key, body) in work.puts {
            batch.put(Space::Bodies, key, &body);
        }
        if !work.in_log.is_empty() {
            self.kept().extend(work.in_log);
        }
    }

    /// Writes the bodies of `work` without the journal ([`Storage::write_unlogged`]): the log holds them until a
    /// snapshot covers them, and the snapshot is stored only after [`Storage::persist`], so a crash before then loses
    /// nothing the log cannot write again. Spared the journal, a body is not synced a second time with the next append.
    pub fn write(&self, work: BodyWork) -> Result<(), StorageError> {
        let mut batch = Batch::new();
        self.stage(work, &mut batch);
        if batch.is_empty() { Ok(()) } else { self.storage.write_unlogged(batch) }
    }

    /// Takes the bodies released so far, for a snapshot taken after those releases: the caller deletes them with
    /// that snapshot ([`delete_bodies`]), or gives them back ([`StoredBodies::give_back`]) if it may not.
    pub fn take_released(&self) -> Vec<u64> {
        std::mem::take(&mut *self.released())
    }

    /// Releases taken by [`StoredBodies::take_released`] that were not deleted: a later snapshot deletes them.
    pub fn give_back(&self, keys: Vec<u64>) {
        self.released().extend(keys);
    }

    /// Keeps every body in place until the returned hold is dropped: a snapshot is being sent from them.
    pub fn hold(&self) -> Hold {
        self.holds.hold()
    }

    /// Whether a snapshot is being sent from these bodies, so none may be deleted.
    pub fn held(&self) -> bool {
        self.holds.held()
    }

    /// Forgets every release not yet deleted (the whole state is being replaced).
    pub fn reset(&self) {
        self.released().clear();
    }

    /// The body `body` refers to, verified against the reference. Says nothing about damage on its own: the caller,
    /// who knows whether the reference is still current, calls [`StoredBodies::mark_damaged`].
    pub fn read(&self, body: &BodyRef) -> Result<Bytes, BodyReadError> {
        let kept = self.kept().get(&body.key).copied();
        match kept.map(|kept| self.read_in_log(kept.at, body)) {
            Some(Ok(Some(bytes))) => Ok(bytes),
            Some(Err(reason)) => from_store(self.storage.get(Space::Bodies, body.key), body, Some(reason)),
            Some(Ok(None)) | None => from_store(self.storage.get(Space::Bodies, body.key), body, None),
        }
    }

    /// The bodies `bodies` refer to, each read and verified as [`StoredBodies::read`] does, those in the store in one
    /// batched read.
    pub fn read_many(&self, bodies: &[&BodyRef]) -> Vec<Result<Bytes, BodyReadError>> {
        let places: Vec<Option<Kept>> = {
            let kept = self.kept();
            if kept.is_empty() {
                vec![None; bodies.len()]
            } else {
                bodies.iter().map(|body| kept.get(&body.key).copied()).collect()
            }
        };
        let mut read: Vec<Option<Result<Option<Bytes>, String>>> =
            places.iter().zip(bodies).map(|(kept, body)| kept.map(|kept| self.read_in_log(kept.at, body))).collect();
        let from_store_at: Vec<usize> =
            (0..bodies.len()).filter(|&at| !matches!(read[at], Some(Ok(Some(_))))).collect();
        let keys: Vec<u64> = from_store_at.iter().map(|&at| bodies[at].key).collect();
        let mut stored = self.storage.get_many(Space::Bodies, &keys).into_iter();
        let mut answers: Vec<Result<Bytes, BodyReadError>> = Vec::with_capacity(bodies.len());
        for (at, body) in bodies.iter().enumerate() {
            let answer = match read[at].take() {
                Some(Ok(Some(bytes))) => Ok(bytes),
                in_log => {
                    let stored = stored.next().unwrap_or(Ok(None));
                    from_store(stored, body, in_log.and_then(Result::err))
                }
            };
            answers.push(answer);
        }
        answers
    }

    /// A body kept in the log, read from `at` and verified against `body`; `None` when the log no longer holds the
    /// entry (a snapshot copied the body out, or it was released, and the log behind the snapshot went); an error
    /// says what was damaged.
    fn read_in_log(&self, at: InLog, body: &BodyRef) -> Result<Option<Bytes>, String> {
        let start = at.offset as usize;
        match self.storage.read_part(Space::Log, at.index, start..start + body.len as usize) {
            Ok(Some(bytes)) => {
                body.verify(&bytes)?;
                Ok(Some(Bytes::from(bytes)))
            }
            Ok(None) => Ok(None),
            Err(error) => Err(error.to_string()),
        }
    }

    /// The bodies kept in the log now: what a snapshot of the state as it is now must copy out before it is stored.
    /// Taken with the state, under the replica's lock.
    pub(crate) fn kept_now(&self) -> BTreeMap<u64, Kept> {
        self.kept().clone()
    }

    /// Copies the bodies of `kept` into the store, unlogged (a persist makes them durable, before the snapshot that
    /// refers to them is stored), but those in `released` (the snapshot does not refer to them), in batches of at most
    /// 4 MiB. A body that cannot be read from the log is damage, unless the store already holds a copy that verifies
    /// (a repair wrote it): the node marks it and goes on.
    pub(crate) fn copy_out(&self, kept: &BTreeMap<u64, Kept>, released: &[u64]) -> Result<(), StorageError> {
        const BATCH_BYTES: usize = 4 << 20;
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::InLogNotCopied) {
            return Ok(());
        }
        let released: std::collections::BTreeSet<u64> = released.iter().copied().collect();
        let mut batch = Batch::new();
        let mut bytes = 0;
        for (key, kept) in kept {
            if released.contains(key) {
                continue;
            }
            match self.read_in_log(kept.at, &kept.body) {
                Ok(Some(body)) => {
                    bytes += body.len();
                    batch.put(Space::Bodies, *key, &body);
                }
                read => {
                    let reason = read.err().unwrap_or_else(|| format!("entry {} is not in the log", kept.at.index));
                    if from_store(self.storage.get(Space::Bodies, *key), &kept.body, None).is_err() {
                        self.mark_damaged(*key, &reason);
                    }
                }
            }
            if bytes >= BATCH_BYTES {
                self.storage.write_unlogged(std::mem::take(&mut batch))?;
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.storage.write_unlogged(batch)?;
        }
        Ok(())
    }

    /// Forgets the places of `kept` once a snapshot that copied them out is stored: the log behind it may go.
    pub(crate) fn forget(&self, kept: &BTreeMap<u64, Kept>) {
        let mut places = self.kept();
        for (key, copied) in kept {
            if places.get(key) == Some(copied) {
                places.remove(key);
            }
        }
    }

    /// Forgets every body kept in the log: a snapshot installed whole replaces the state and the log, and brought
    /// every body it refers to.
    pub(crate) fn forget_all(&self) {
        self.kept().clear();
    }

    /// Reads that failed on damage since the node started.
    pub fn n_unreadable(&self) -> u64 {
        self.n_unreadable.load(Ordering::Relaxed)
    }

    /// Records that the body under `key` is damaged on this node: counted, logged, and marked so that the next start
    /// takes a whole snapshot from the leader.
    pub fn mark_damaged(&self, key: u64, reason: &str) {
        self.n_unreadable.fetch_add(1, Ordering::Relaxed);
        self.mark(key, reason);
    }

    /// Marks the damage to the body under `key`, already counted, so that the next start takes a whole snapshot.
    pub(crate) fn mark(&self, key: u64, reason: &str) {
        tracing::error!(
            key,
            reason,
            "a message body does not verify; it is not served, and the node takes a whole snapshot at its next start"
        );
        if self.marked.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::BodiesDamaged as u64, &key.to_le_bytes());
        if let Err(error) = self.storage.write(batch).and_then(|()| self.storage.sync()) {
            tracing::error!(%error, "could not record the damaged body");
        }
    }
}

impl<S: Storage> BodySource for StoredBodies<S> {
    /// A body a snapshot being sent refers to. The stored snapshot refers to it and it is held, so it cannot have
    /// been deleted: missing is damage, as is anything that does not verify.
    fn body(&self, body: &BodyRef) -> Result<Bytes, String> {
        self.read(body).map_err(|error| error.to_string())
    }

    fn repair(&self, body: &BodyRef, reason: &str) -> Option<oneshot::Receiver<Result<Bytes, String>>> {
        self.found_damaged(*body, Need::Held, reason)
    }
}

/// A body read from the store, verified against `body`; when it is not there, `in_log` says why the log could not
/// serve it either (damage), if the node kept it there.
fn from_store(
    read: Result<Option<impl Into<Bytes> + AsRef<[u8]>>, StorageError>,
    body: &BodyRef,
    in_log: Option<String>,
) -> Result<Bytes, BodyReadError> {
    match read {
        Ok(Some(bytes)) => {
            body.verify(bytes.as_ref()).map_err(|reason| BodyReadError::Damaged { reason })?;
            Ok(bytes.into())
        }
        Ok(None) => match in_log {
            Some(reason) => Err(BodyReadError::Damaged { reason }),
            None => Err(BodyReadError::Missing { key: body.key }),
        },
        Err(error) => Err(BodyReadError::Damaged { reason: error.to_string() }),
    }
}

/// Adds the deletes of the bodies under `keys` to `batch`, one range per run of consecutive keys.
pub fn delete_bodies(mut keys: Vec<u64>, batch: &mut Batch) {
    keys.sort_unstable();
    // Retention removes oldest first, so released keys come in long runs: one range each.
    let mut runs: Vec<std::ops::Range<u64>> = Vec::new();
    for key in keys {
        match runs.last_mut() {
            Some(run) if run.end == key => run.end += 1,
            Some(run) if run.end > key => {}
            _ => runs.push(key..key + 1),
        }
    }
    for run in runs {
        batch.delete_range(Space::Bodies, run);
    }
}

/// Adds the deletes of every body not in `kept` (sorted by key) to `batch`: one range per gap between them.
pub fn delete_all_but(kept: &[BodyRef], batch: &mut Batch) {
    let mut from = 0u64;
    for body in kept {
        if body.key > from {
            batch.delete_range(Space::Bodies, from..body.key);
        }
        from = body.key.saturating_add(1);
    }
    if from < u64::MAX {
        batch.delete_range(Space::Bodies, from..u64::MAX);
    }
}
