//! Message bodies: the cell keeps references, the host keeps the bytes.
//!
//! The cell keeps, per message, a [`BodyRef`]: the key its body is stored under, its length and its crc32c. Keys come
//! from a counter in the cell's state, so every replica stores the same body under the same key and a key is never
//! used twice. The cell never holds, reads or writes body bytes after `apply` returns: a new body leaves `apply` as
//! [`Effect::BodyStored`] (with its bytes), a dead letter's copy as [`Effect::BodyCopied`], and a body no message
//! refers to any more as [`Effect::BodyReleased`]. The host must act on every one of them, in order, in the same
//! storage batch as the entry that produced them (raft-rs' `Ready`): [`crate::Cell::apply`] refuses to run while
//! effects of an earlier apply are still queued.
//!
//! Records and deliveries carry [`BodyRef`]s; the node that answers a client reads the bytes after the apply, outside
//! the replica's lock, and checks them with [`BodyRef::verify`].
//!
//! [`MemoryBodies`] is a host's body store in memory (tests, benchmarks, a cell without durable storage). A replicated
//! node keeps bodies in its storage's bodies space instead.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::command::{Body, Effect, Record};

/// Where a message's body is stored, and what it must read back as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyRef {
    /// The key in the host's body store.
    pub key: u64,
    /// Its length in bytes.
    pub len: u32,
    /// crc32c of its bytes.
    pub crc: u32,
}

impl BodyRef {
    /// The reference for `body` stored under `key`.
    pub fn of(key: u64, body: &[u8]) -> Self {
        assert!(body.len() <= u32::MAX as usize, "a body's length fits in 32 bits (payloads are bounded far below)");
        BodyRef { key, len: body.len() as u32, crc: crc32c::crc32c(body) }
    }

    /// Checks bytes read back from a store against the reference.
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

/// Bodies in memory, kept by a host that applies the cell's body effects to them.
///
/// Plain data: no lock and no sharing. The cell never holds one; whoever drives the cell calls
/// [`MemoryBodies::apply`] with every effect it drains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryBodies {
    bodies: BTreeMap<u64, Bytes>,
}

impl MemoryBodies {
    /// Acts on one drained effect: stores, copies or forgets a body. Every other effect is none of its business.
    pub fn apply(&mut self, effect: &Effect) {
        match effect {
            Effect::BodyStored { key, body } => {
                self.bodies.insert(*key, body.clone());
            }
            Effect::BodyCopied { from, to } => {
                // A source that is not here leaves nothing under `to`: a later read of the copy fails, as it would
                // on a store that lost the source.
                if let Some(body) = self.bodies.get(from).cloned() {
                    self.bodies.insert(*to, body);
                }
            }
            Effect::BodyReleased { key } => {
                self.bodies.remove(key);
            }
            _ => {}
        }
    }

    /// Stores `body` under `key` (the bodies of a whole snapshot, or a test's tampering).
    pub fn insert(&mut self, key: u64, body: Bytes) {
        self.bodies.insert(key, body);
    }

    /// Forgets the body under `key` (a test's tampering).
    pub fn remove(&mut self, key: u64) {
        self.bodies.remove(&key);
    }

    /// The body `body` refers to, verified.
    pub fn read(&self, body: &BodyRef) -> Result<Bytes, String> {
        let bytes = self.bodies.get(&body.key).ok_or_else(|| format!("body {} is not stored", body.key))?;
        body.verify(bytes)?;
        Ok(bytes.clone())
    }

    /// A record's payload: its body's bytes, or nothing for a tombstone.
    pub fn payload(&self, record: &Record) -> Result<Bytes, String> {
        match &record.body {
            Body::Stored(body) => self.read(body),
            Body::Tombstone { .. } => Ok(Bytes::new()),
        }
    }

    /// How many bodies are stored.
    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }

    /// Every stored body, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Bytes)> {
        self.bodies.iter().map(|(key, body)| (*key, body))
    }
}
