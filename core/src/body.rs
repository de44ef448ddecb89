//! Where message bodies live: behind [`BodyStore`], so that the cell's memory does not grow with retained bytes.
//!
//! The cell keeps, per message, a [`BodyRef`]: the key its body is stored under, its length and its crc32c. Keys come
//! from a counter in the cell's state, so every replica stores the same body under the same key and a key is never
//! used twice. The store is synchronous and deterministic (a `get` returns what the last `put` under that key
//! stored): the cell never awaits, and a body store is no source of time or randomness. It is not part of the state:
//! the digest covers each body's length and crc32c, not its bytes, and [`crate::Cell::snapshot_state`] leaves bodies
//! out for a host whose store is durable on its own.
//!
//! [`MemoryBodies`] keeps bodies in memory (tests, benchmarks, a cell without a host). A replicated node puts them in
//! its storage's bodies space.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Where a message's body is stored, and what it must read back as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyRef {
    /// The key in the body store.
    pub key: u64,
    /// Its length in bytes.
    pub len: u32,
    /// crc32c of its bytes.
    pub crc: u32,
}

impl BodyRef {
    /// The reference for `body` stored under `key`.
    pub fn of(key: u64, body: &[u8]) -> Self {
        BodyRef { key, len: body.len() as u32, crc: crc32c::crc32c(body) }
    }

    /// Checks bytes read back from the store against the reference.
    pub fn verify(&self, body: &[u8]) -> Result<(), String> {
        if body.len() != self.len as usize {
            return Err(format!("body {} is {} bytes long, {} were stored", self.key, body.len(), self.len));
        }
        let crc = crc32c::crc32c(body);
        if crc != self.crc {
            return Err(format!("body {} has crc32c {crc:08x}, {:08x} was stored", self.key, self.crc));
        }
        Ok(())
    }
}

/// Stores message bodies by key for a cell.
///
/// ### To ensure correctness
/// - `get` returns the bytes of the last `put` (or `copy`) under the key, or an error; never other bytes. The cell
///   verifies them against the [`BodyRef`] anyway.
/// - A key always holds the same body: a host replaying its log after a restart may put it again. `delete` is called
///   when no message refers to the key any more; the store may defer it (a durable store keeps a body until the state
///   that no longer refers to it is durable).
/// - Nothing here may draw on a clock or randomness: every replica calls the same operations in the same order.
pub trait BodyStore: Send + Sync {
    /// Stores `body` under `key`.
    fn put(&self, key: u64, body: Bytes);
    /// Stores under `to` a copy of the body under `from` (a dead letter). A store that cannot read `from` stores
    /// nothing under `to`, and a later read of `to` fails.
    fn copy(&self, from: u64, to: u64);
    /// Forgets the body under `key`.
    fn delete(&self, key: u64);
    /// The body under `key`, or why it cannot be read.
    fn get(&self, key: u64) -> Result<Bytes, String>;
}

/// Bodies in memory, in a `BTreeMap`.
#[derive(Debug, Default)]
pub struct MemoryBodies {
    bodies: Mutex<BTreeMap<u64, Bytes>>,
}

impl MemoryBodies {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Bytes>> {
        self.bodies.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many bodies are stored.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl BodyStore for MemoryBodies {
    fn put(&self, key: u64, body: Bytes) {
        self.lock().insert(key, body);
    }

    fn copy(&self, from: u64, to: u64) {
        let mut bodies = self.lock();
        if let Some(body) = bodies.get(&from).cloned() {
            bodies.insert(to, body);
        }
    }

    fn delete(&self, key: u64) {
        self.lock().remove(&key);
    }

    fn get(&self, key: u64) -> Result<Bytes, String> {
        self.lock().get(&key).cloned().ok_or_else(|| format!("body {key} is not stored"))
    }
}

/// A cell's handle on its body store. Not state: two handles always compare equal, and a decoded cell gets its
/// store attached by the host (or a fresh [`MemoryBodies`]).
#[derive(Clone)]
pub struct Bodies(Arc<dyn BodyStore>);

impl Bodies {
    /// A handle on `store`.
    pub fn new(store: Arc<dyn BodyStore>) -> Self {
        Bodies(store)
    }

    /// A handle on a fresh, empty [`MemoryBodies`].
    pub fn in_memory() -> Self {
        Bodies(Arc::new(MemoryBodies::default()))
    }

    /// The store.
    pub fn store(&self) -> &dyn BodyStore {
        &*self.0
    }

    /// Reads and verifies a body.
    pub fn read(&self, body: &BodyRef) -> Result<Bytes, String> {
        let bytes = self.0.get(body.key)?;
        body.verify(&bytes)?;
        Ok(bytes)
    }
}

impl Default for Bodies {
    fn default() -> Self {
        Bodies::in_memory()
    }
}

impl PartialEq for Bodies {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Bodies {}

impl std::fmt::Debug for Bodies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bodies")
    }
}
