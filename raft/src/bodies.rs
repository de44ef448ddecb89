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
use cellog_core::{BodyRef, Effect};
use tokio::sync::{mpsc, oneshot};

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

/// The body work of one apply call: bodies to write, in key order. Filled while the replica is held and written
/// before it is let go ([`StoredBodies::write`]).
#[derive(Debug, Default)]
#[must_use = "body work that is not written loses the bodies the applied state refers to"]
pub struct BodyWork {
    puts: BTreeMap<u64, Bytes>,
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

    /// Acts on one effect the cell drained: a body to store or copy joins `work`; a released one waits for the next
    /// stored snapshot. Every other effect is none of this store's business.
    pub fn act(&self, work: &mut BodyWork, effect: &Effect) {
        match effect {
            Effect::BodyStored { key, body } => {
                work.puts.insert(*key, body.clone());
            }
            Effect::BodyCopied { from, to } => {
                let source = match work.puts.get(from) {
                    Some(body) => Ok(body.clone()),
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
            Effect::BodyReleased { key } => {
                // Put during this apply, it need not be written. It is deleted from storage all the same: a log
                // replayed after a restart puts bodies again that were written before it.
                work.puts.remove(key);
                self.released().push(*key);
            }
            _ => {}
        }
    }

    /// Puts the bodies of `work` into `batch`.
    pub fn stage(&self, work: BodyWork, batch: &mut Batch) {
        for (key, body) in work.puts {
            batch.put(Space::Bodies, key, &body);
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
        match self.storage.get(Space::Bodies, body.key) {
            Ok(Some(bytes)) => {
                body.verify(&bytes).map_err(|reason| BodyReadError::Damaged { reason })?;
                Ok(Bytes::from(bytes))
            }
            Ok(None) => Err(BodyReadError::Missing { key: body.key }),
            Err(error) => Err(BodyReadError::Damaged { reason: error.to_string() }),
        }
    }

    /// The bodies `bodies` refer to, each read and verified as [`StoredBodies::read`] does, in one batched read.
    pub fn read_many(&self, bodies: &[&BodyRef]) -> Vec<Result<Bytes, BodyReadError>> {
        let keys: Vec<u64> = bodies.iter().map(|body| body.key).collect();
        self.storage
            .get_many(Space::Bodies, &keys)
            .into_iter()
            .zip(bodies)
            .map(|(read, body)| match read {
                Ok(Some(bytes)) => {
                    body.verify(&bytes).map_err(|reason| BodyReadError::Damaged { reason })?;
                    Ok(Bytes::from(bytes))
                }
                Ok(None) => Err(BodyReadError::Missing { key: body.key }),
                Err(error) => Err(BodyReadError::Damaged { reason: error.to_string() }),
            })
            .collect()
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
