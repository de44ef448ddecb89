//! The cell's message bodies in the node's storage ([`Space::Bodies`]), so a node's memory does not grow with the bytes
//! it retains.
//!
//! Applying an entry puts its bodies into an overlay, which is written to storage (not synced) when the apply ends;
//! every later sync (the next log append's, at the latest) makes them durable. That is enough, because the log holds
//! every body until a snapshot covers it, and a snapshot is stored only after a sync. A removed body is deleted only
//! when a snapshot that no longer refers to it is stored: until then the stored snapshot may still be sent to a
//! follower, with its bodies, and a restart replays the removal from the log anyway.
//!
//! Reads are verified twice: the record's seal (crc32c over space, key and bytes) and the body's own length and
//! crc32c, which the cell keeps. A body that fails either is never served: the cell reads it as unreadable, and this
//! store records the damage in [`MetaKey::BodiesDamaged`], so that the node's next start drops its state and takes a
//! whole snapshot from the leader.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use cellog_core::BodyStore;

use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};

/// Bodies of the current apply not yet written, and removals not yet covered by a stored snapshot.
#[derive(Debug, Default)]
struct Pending {
    puts: BTreeMap<u64, Bytes>,
    deletes: Vec<u64>,
}

/// A [`BodyStore`] over a node's [`Storage`].
#[derive(Debug)]
pub struct StoredBodies<S> {
    storage: S,
    pending: Mutex<Pending>,
    n_unreadable: AtomicU64,
    /// The damage mark is written (once per process is enough: it stays until the next start acts on it).
    marked: AtomicBool,
}

impl<S: Storage> StoredBodies<S> {
    /// The bodies in `storage`.
    pub fn new(storage: S) -> Self {
        StoredBodies {
            storage,
            pending: Mutex::new(Pending::default()),
            n_unreadable: AtomicU64::new(0),
            marked: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the bodies put since the last call into `batch`.
    pub fn take_puts(&self, batch: &mut Batch) {
        for (key, body) in std::mem::take(&mut self.lock().puts) {
            batch.put(Space::Bodies, key, &body);
        }
    }

    /// Writes the bodies put since the last write (not synced).
    pub fn write_puts(&self) -> Result<(), StorageError> {
        let mut batch = Batch::new();
        self.take_puts(&mut batch);
        if batch.is_empty() { Ok(()) } else { self.storage.write(batch) }
    }

    /// Moves the deletes of bodies removed so far into `batch`, for a snapshot taken after those removals.
    pub fn take_deletes(&self, batch: &mut Batch) {
        let mut keys = std::mem::take(&mut self.lock().deletes);
        keys.sort_unstable();
        // Retention removes oldest first, so removed keys come in long runs: one range each.
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

    /// Forgets everything pending (the whole state is being replaced).
    pub fn reset(&self) {
        *self.lock() = Pending::default();
    }

    /// Reads that failed since the node started.
    pub fn n_unreadable(&self) -> u64 {
        self.n_unreadable.load(Ordering::Relaxed)
    }

    fn damaged(&self, key: u64, reason: &str) {
        self.n_unreadable.fetch_add(1, Ordering::Relaxed);
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

impl<S: Storage> BodyStore for StoredBodies<S> {
    fn put(&self, key: u64, body: Bytes) {
        self.lock().puts.insert(key, body);
    }

    fn copy(&self, from: u64, to: u64) {
        if let Ok(body) = self.get(from) {
            self.put(to, body);
        }
    }

    fn delete(&self, key: u64) {
        let mut pending = self.lock();
        // Put during this apply, it need not be written. It is deleted from storage all the same: a log replayed
        // after a restart puts bodies again that were written before it.
        pending.puts.remove(&key);
        pending.deletes.push(key);
    }

    fn get(&self, key: u64) -> Result<Bytes, String> {
        if let Some(body) = self.lock().puts.get(&key) {
            return Ok(body.clone());
        }
        let reason = match self.storage.get(Space::Bodies, key) {
            Ok(Some(body)) => return Ok(Bytes::from(body)),
            Ok(None) => format!("body {key} is not in this node's storage"),
            Err(error) => error.to_string(),
        };
        self.damaged(key, &reason);
        Err(reason)
    }
}
