//! The snapshot encoding of a cell and the state digest that compares replicas.
//!
//! Layout: 8 bytes of magic, a little-endian `u32` version, a little-endian `u32` crc32c of the body, then the body:
//! the cell encoded with postcard, then the message bodies (postcard `Option<Vec<(key, bytes)>>`, in key order).
//! [`Cell::snapshot`] includes the bodies, so the bytes are the whole state; [`Cell::snapshot_state`] leaves them out
//! for a host whose body store is durable on its own. Every map in the cell is a `BTreeMap`, so the same state always
//! encodes to the same bytes, which is what makes the digest (SHA-256 of the state's encoding, which holds each
//! body's length and crc32c) comparable across replicas.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserializer;
use sha2::{Digest, Sha256};

use crate::body::Bodies;
use crate::cell::Cell;
use crate::error::SnapshotError;

const MAGIC: &[u8; 8] = b"CELLOGSN";
/// The encoding version this build writes and reads.
/// Version 2 added pins (messages that keep others from retention); version 3 moved message bodies out of the state
/// into their own section. Older versions are refused as unsupported.
pub const SNAPSHOT_VERSION: u32 = 3;
const HEADER_BYTES: usize = 16;

/// A SHA-256 digest of a cell's whole state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateDigest(pub [u8; 32]);

impl std::fmt::Display for StateDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Stored bodies by key, in key order.
type BodySection = Option<Vec<(u64, Bytes)>>;

thread_local! {
    /// While a cell is decoded: the subjects seen so far. Every message on a subject shares one allocation in a
    /// running cell; without this, decoding would give each its own copy, and a million messages would take tens of
    /// megabytes more after a restart than before it.
    static SUBJECTS: RefCell<Option<BTreeSet<Arc<str>>>> = const { RefCell::new(None) };
}

/// Decodes a message's subject, shared with every other message on it while a cell is decoded.
pub(crate) fn interned_subject<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    struct Subject;
    impl serde::de::Visitor<'_> for Subject {
        type Value = Arc<str>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a subject")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Arc<str>, E> {
            Ok(SUBJECTS.with_borrow_mut(|subjects| match subjects {
                Some(subjects) => match subjects.get(text) {
                    Some(shared) => shared.clone(),
                    None => {
                        let shared: Arc<str> = Arc::from(text);
                        subjects.insert(shared.clone());
                        shared
                    }
                },
                None => Arc::from(text),
            }))
        }
    }
    deserializer.deserialize_str(Subject)
}

/// Shares subjects while it lives (see [`SUBJECTS`]).
struct Interning;

impl Interning {
    fn start() -> Self {
        SUBJECTS.set(Some(BTreeSet::new()));
        Interning
    }
}

impl Drop for Interning {
    fn drop(&mut self) {
        SUBJECTS.set(None);
    }
}

fn encode_state(cell: &Cell) -> Vec<u8> {
    postcard::to_stdvec(cell).expect("encoding a cell into memory does not fail: every type is plainly serializable")
}

impl Cell {
    fn encode(&self, bodies: &BodySection) -> Vec<u8> {
        #[cfg(madsim)]
        let mut body = if crate::mutant::active(crate::mutant::Mutant::DedupNotInSnapshot) {
            encode_state(&self.without_dedup())
        } else {
            encode_state(self)
        };
        #[cfg(not(madsim))]
        let mut body = encode_state(self);
        body.extend(postcard::to_stdvec(bodies).expect("encoding bodies into memory does not fail"));
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    /// The whole state with every retained message's body, versioned and checksummed: what a replica that has
    /// nothing needs. `Cell::restore(&cell.snapshot()?)` equals `cell` (pending effects aside, which are not state).
    /// Fails if the body store cannot give back a body the state refers to.
    pub fn snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let bodies = self
            .body_refs()
            .into_iter()
            .map(|body| {
                let bytes =
                    self.bodies().read(&body).map_err(|reason| SnapshotError::Body { key: body.key, reason })?;
                Ok((body.key, bytes))
            })
            .collect::<Result<Vec<_>, SnapshotError>>()?;
        Ok(self.encode(&Some(bodies)))
    }

    /// The state without the bodies, for a host whose body store keeps them durably: it restores with
    /// [`Cell::restore_with`] over that store.
    pub fn snapshot_state(&self) -> Vec<u8> {
        self.encode(&None)
    }

    /// Rebuilds a cell from [`Cell::snapshot`] bytes, its bodies in a fresh [`crate::MemoryBodies`], refusing
    /// anything damaged or unknown.
    pub fn restore(bytes: &[u8]) -> Result<Cell, SnapshotError> {
        Self::restore_whole_with(bytes, Bodies::in_memory())
    }

    /// Rebuilds a cell from [`Cell::snapshot`] bytes, putting its bodies into `bodies`. Refuses a state-only
    /// snapshot whose state refers to any body ([`SnapshotError::NoBodies`]): what it needs is not in it.
    pub fn restore_whole_with(bytes: &[u8], bodies: Bodies) -> Result<Cell, SnapshotError> {
        let (cell, section) = Self::decode(bytes)?;
        if section.is_none() && !cell.body_refs().is_empty() {
            return Err(SnapshotError::NoBodies);
        }
        Self::attach(cell, section, bodies)
    }

    /// Rebuilds a cell whose bodies live in `bodies`. A whole snapshot's bodies are checked against the state and put
    /// into the store; a state-only one trusts the store to hold them (each read verifies its body).
    pub fn restore_with(bytes: &[u8], bodies: Bodies) -> Result<Cell, SnapshotError> {
        let (cell, section) = Self::decode(bytes)?;
        Self::attach(cell, section, bodies)
    }

    fn decode(bytes: &[u8]) -> Result<(Cell, BodySection), SnapshotError> {
        if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
            return Err(SnapshotError::NotASnapshot);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::UnsupportedVersion { version });
        }
        let stored = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        let body = &bytes[HEADER_BYTES..];
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(SnapshotError::ChecksumMismatch { stored, computed });
        }
        let malformed = |error: postcard::Error| SnapshotError::Malformed { reason: error.to_string() };
        let interning = Interning::start();
        let (cell, rest) = postcard::take_from_bytes::<Cell>(body).map_err(malformed)?;
        drop(interning);
        let (section, rest) = postcard::take_from_bytes::<BodySection>(rest).map_err(malformed)?;
        if !rest.is_empty() {
            return Err(SnapshotError::Malformed {
                reason: format!("{} bytes after the end of the state", rest.len()),
            });
        }
        Ok((cell, section))
    }

    fn attach(mut cell: Cell, section: BodySection, bodies: Bodies) -> Result<Cell, SnapshotError> {
        if let Some(section) = section {
            let refs = cell.body_refs();
            if refs.len() != section.len() {
                return Err(SnapshotError::Malformed {
                    reason: format!("the state refers to {} bodies, the snapshot holds {}", refs.len(), section.len()),
                });
            }
            for (body, (key, bytes)) in refs.iter().zip(&section) {
                if body.key != *key {
                    return Err(SnapshotError::Body {
                        key: body.key,
                        reason: format!("found body {key} in its place"),
                    });
                }
                body.verify(bytes).map_err(|reason| SnapshotError::Body { key: *key, reason })?;
            }
            for (key, bytes) in section {
                bodies.store().put(key, bytes);
            }
        }
        cell.attach_bodies(bodies);
        Ok(cell)
    }

    /// SHA-256 of the state's encoding: equal digests mean equal states.
    pub fn digest(&self) -> StateDigest {
        StateDigest(Sha256::digest(encode_state(self)).into())
    }
}
