//! A host's body store in memory, for tests, benchmarks and a cell without durable storage (see [`crate::body`]).

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::body::BodyRef;
use crate::effect::BodyOp;
use crate::outcome::{Body, Record};

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
    pub fn apply(&mut self, work: &BodyOp) {
        match work {
            BodyOp::BodyStored { body, bytes } => {
                self.bodies.insert(body.key, bytes.clone());
            }
            BodyOp::BodyCopied { from, to } => {
                // A source that is not here leaves nothing under `to`: a later read of the copy fails, as it would
                // on a store that lost the source.
                if let Some(body) = self.bodies.get(from).cloned() {
                    self.bodies.insert(*to, body);
                }
            }
            BodyOp::BodyReleased { key } => {
                self.bodies.remove(key);
            }
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
