//! The snapshot encoding of a cell and the state digest that compares replicas.
//!
//! Layout: 8 bytes of magic, a little-endian `u32` version, a little-endian `u32` crc32c of the body, then the body:
//! the cell encoded with postcard, then the message bodies (postcard `Option<Vec<(key, bytes)>>`, in key order).
//! [`Cell::snapshot_whole`] includes the bodies the host hands it, so the bytes are the whole state;
//! [`Cell::snapshot`] leaves them out (the section is `None`) for a host whose body store is durable on its own.
//! Every map in the cell is a `BTreeMap`, so the same state always encodes to the same bytes, which is what makes the digest (SHA-256 of the state's encoding, which holds each
//! body's length and crc32c) comparable across replicas.
//!
//! # Versions
//! The in-memory types encode themselves (`Serialize`, no copy), but nothing decodes into them: each version's state
//! decodes into that version's frozen wire types ([`v3`]), which convert into the in-memory ones (each type's module
//! holds its conversion). A change to an in-memory type therefore cannot change how an old snapshot reads; it can
//! only change what the current build writes, and [`Cell::reencode_snapshot`] (checked by the tests on the committed
//! fixture and on generated histories) catches that. To change the encoding:
//! 1. copy the new shape into `v4.rs` (plain data, all of it, API types included) and write
//!    `impl From<v3::Cell> for v4::Cell`: the migration;
//! 2. convert `v4::Cell` into the in-memory [`Cell`], bump [`SNAPSHOT_VERSION`], and add version 4 to `format`;
//!    `read_v3` then goes `v3::Cell` → `v4::Cell` → [`Cell`];
//! 3. keep the version 3 fixture (it must still restore) and commit a version 4 one.
//!
//! `v3.rs` itself never changes.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::body::BodyRef;
use crate::cell::Cell;
use crate::dedup::IdKey;
use crate::error::SnapshotError;

pub(crate) mod intern;
pub(crate) mod v10;
pub(crate) mod v11;
pub(crate) mod v12;
pub(crate) mod v3;
pub(crate) mod v4;
pub(crate) mod v5;
pub(crate) mod v6;
pub(crate) mod v7;
pub(crate) mod v8;
pub(crate) mod v9;

const MAGIC: &[u8; 8] = b"CELLOGSN";
/// The encoding version this build writes.
/// Version 2 added pins (messages that keep others from retention); version 3 moved message bodies out of the state
/// into their own section; version 4 added principals, their tokens and grants (a version 3 state migrates to the
/// root principal alone); version 5 added when each transactional producer was last active (an earlier state's
/// producers count as active at its time); version 6 moved the payloads of staged transactional messages out of the
/// state into the body store (a message an earlier state staged keeps its payload until its transaction ends); version
/// 7 added consumer groups (an earlier state has none); version 8 added the directory's records of cells and placements,
/// and each moved stream's ownership epoch (an earlier state has none: it owns every stream at epoch 0); version 9
/// added mirrors and the recall logs kept for them (an earlier state has none); version 10 added revoked certificates and
/// quotas (an earlier state has neither); version 11 added each principal's mirror grant (an earlier state's principals
/// have none); version 12 added the quotas on deliveries awaiting an ack (an earlier state's holders have none). Versions
/// before 3 are refused as unsupported.
pub const SNAPSHOT_VERSION: u32 = 12;
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

/// Checks a body section against the references of the state it goes with: the same keys in the same order, each
/// body verifying against its reference.
fn check_bodies(refs: &[BodyRef], section: &[(u64, Bytes)]) -> Result<(), SnapshotError> {
    if refs.len() != section.len() {
        return Err(SnapshotError::Malformed {
            reason: format!("the state refers to {} bodies, the snapshot holds {}", refs.len(), section.len()),
        });
    }
    for (body, (key, bytes)) in refs.iter().zip(section) {
        if body.key != *key {
            return Err(SnapshotError::Body { key: body.key, reason: format!("found body {key} in its place") });
        }
        body.verify(bytes).map_err(|reason| SnapshotError::Body { key: *key, reason })?;
    }
    Ok(())
}

fn encode_state(cell: &Cell) -> Vec<u8> {
    postcard::serialize_with_flavor(cell, Growing(Vec::new()))
        .expect("encoding a cell into memory does not fail: every type is plainly serializable")
}

/// postcard's output into a growing `Vec`, as its own `AllocVec`, except that the short writes (a varint, a short
/// string: most of a state's writes) are copied at a length the compiler knows rather than through a `memcpy` call
/// each: encoding 200 000 messages without ids measured 30 % faster. The bytes are the same.
struct Growing(Vec<u8>);

impl postcard::ser_flavors::Flavor for Growing {
    type Output = Vec<u8>;

    #[inline(always)]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        let out = &mut self.0;
        match *data {
            [] => {}
            [a] => out.push(a),
            [a, b] => out.extend_from_slice(&[a, b]),
            [a, b, c] => out.extend_from_slice(&[a, b, c]),
            [a, b, c, d] => out.extend_from_slice(&[a, b, c, d]),
            [a, b, c, d, e] => out.extend_from_slice(&[a, b, c, d, e]),
            [a, b, c, d, e, f] => out.extend_from_slice(&[a, b, c, d, e, f]),
            [a, b, c, d, e, f, g] => out.extend_from_slice(&[a, b, c, d, e, f, g]),
            [a, b, c, d, e, f, g, h] => out.extend_from_slice(&[a, b, c, d, e, f, g, h]),
            _ => out.extend_from_slice(data),
        }
        Ok(())
    }

    #[inline(always)]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// Puts the header of `version` before `body`.
fn frame(version: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Reads the state from the front of a snapshot's body into a cell; what is left (the body section) follows.
type ReadState = fn(&[u8]) -> Result<(Cell, &[u8]), SnapshotError>;

/// How this build reads one version.
#[derive(Clone, Copy)]
struct Format {
    /// Its state, through the version's wire types.
    read: ReadState,
    /// Decodes a snapshot's body into the version's wire types and encodes them again.
    reencode: fn(&[u8]) -> Result<Vec<u8>, SnapshotError>,
}

/// Every version this build reads.
fn format(version: u32) -> Option<Format> {
    match version {
        3 => Some(Format { read: read_v3, reencode: reencode::<v3::Cell> }),
        4 => Some(Format { read: read_v4, reencode: reencode::<v4::Cell> }),
        5 => Some(Format { read: read_v5, reencode: reencode::<v5::Cell> }),
        6 => Some(Format { read: read_v6, reencode: reencode::<v6::Cell> }),
        7 => Some(Format { read: read_v7, reencode: reencode::<v7::Cell> }),
        8 => Some(Format { read: read_v8, reencode: reencode::<v8::Cell> }),
        9 => Some(Format { read: read_v9, reencode: reencode::<v9::Cell> }),
        10 => Some(Format { read: read_v10, reencode: reencode::<v10::Cell> }),
        11 => Some(Format { read: read_v11, reencode: reencode::<v11::Cell> }),
        12 => Some(Format { read: read_v12, reencode: reencode::<v12::Cell> }),
        _ => None,
    }
}

fn read_v3(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v3::Cell>(body)?;
    Ok((Cell::from_v3(state), rest))
}

fn read_v4(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v4::Cell>(body)?;
    Ok((Cell::from_v4(state), rest))
}

fn read_v5(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v5::Cell>(body)?;
    Ok((Cell::from_v5(state), rest))
}

fn read_v6(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v6::Cell>(body)?;
    Ok((Cell::from_v6(state), rest))
}

fn read_v7(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v7::Cell>(body)?;
    Ok((Cell::from_v7(state), rest))
}

fn read_v8(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v8::Cell>(body)?;
    Ok((Cell::from_v8(state), rest))
}

fn read_v9(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v9::Cell>(body)?;
    Ok((Cell::from_v9(state), rest))
}

fn read_v10(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v10::Cell>(body)?;
    Ok((Cell::from_v10(state), rest))
}

fn read_v11(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v11::Cell>(body)?;
    Ok((Cell::from_v11(state), rest))
}

fn read_v12(body: &[u8]) -> Result<(Cell, &[u8]), SnapshotError> {
    let (state, rest) = take_state::<v12::Cell>(body)?;
    Ok((Cell::from_v12(state), rest))
}

fn reencode<State: Serialize + DeserializeOwned>(body: &[u8]) -> Result<Vec<u8>, SnapshotError> {
    let (state, rest) = take_state::<State>(body)?;
    let bodies = take_bodies(rest)?;
    let mut body = postcard::to_stdvec(&state).expect("encoding a snapshot's state into memory does not fail");
    body.extend(postcard::to_stdvec(&bodies).expect("encoding bodies into memory does not fail"));
    Ok(body)
}

/// Checks the header and the checksum; returns the version, its format, and the body.
fn open(bytes: &[u8]) -> Result<(u32, Format, &[u8]), SnapshotError> {
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let format = format(version).ok_or(SnapshotError::UnsupportedVersion { version })?;
    let stored = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
    let body = &bytes[HEADER_BYTES..];
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(SnapshotError::ChecksumMismatch { stored, computed });
    }
    Ok((version, format, body))
}

fn malformed(error: postcard::Error) -> SnapshotError {
    SnapshotError::Malformed { reason: error.to_string() }
}

/// Decodes a version's state from the front of `body`, sharing subjects (see [`intern`]).
fn take_state<T: DeserializeOwned>(body: &[u8]) -> Result<(T, &[u8]), SnapshotError> {
    let _interning = intern::Interning::start();
    postcard::take_from_bytes::<T>(body).map_err(malformed)
}

/// Decodes the body section, which must end the snapshot.
fn take_bodies(rest: &[u8]) -> Result<BodySection, SnapshotError> {
    let (section, rest) = postcard::take_from_bytes::<BodySection>(rest).map_err(malformed)?;
    if !rest.is_empty() {
        return Err(SnapshotError::Malformed { reason: format!("{} bytes after the end of the state", rest.len()) });
    }
    Ok(section)
}

impl Cell {
    fn encode(&self, bodies: &BodySection) -> Vec<u8> {
        #[cfg(madsim)]
        let mut body = if cellog_planted::active(cellog_planted::Mutant::DedupNotInSnapshot) {
            encode_state(&self.without_dedup())
        } else {
            encode_state(self)
        };
        #[cfg(not(madsim))]
        let mut body = encode_state(self);
        body.extend(postcard::to_stdvec(bodies).expect("encoding bodies into memory does not fail"));
        frame(SNAPSHOT_VERSION, &body)
    }

    /// The state without the bodies, versioned and checksummed, for a host whose body store keeps them:
    /// `Cell::restore(&cell.snapshot())` equals `cell` (pending effects aside, which are not state).
    pub fn snapshot(&self) -> Vec<u8> {
        self.encode(&None)
    }

    /// The whole state with every retained message's body, for a replica that has nothing. `bodies` are the host's
    /// bytes for [`Cell::body_refs`], in the same order; each is checked against its reference.
    pub fn snapshot_whole(&self, bodies: Vec<(u64, Bytes)>) -> Result<Vec<u8>, SnapshotError> {
        check_bodies(&self.body_refs(), &bodies)?;
        Ok(self.encode(&Some(bodies)))
    }

    /// Rebuilds a cell from [`Cell::snapshot`] bytes (or [`Cell::snapshot_whole`] bytes, whose bodies are checked and
    /// left out), refusing anything damaged or unknown. The host's body store must hold the bodies it refers to.
    pub fn restore(bytes: &[u8]) -> Result<Cell, SnapshotError> {
        let (cell, section) = Self::decode(bytes)?;
        if let Some(section) = &section {
            check_bodies(&cell.body_refs(), section)?;
        }
        Ok(cell)
    }

    /// [`Cell::restore`], keyed with `key` as [`Cell::key_ids`] keys a cell, and with its message-id indexes hashed
    /// with that key as they are decoded rather than hashed again afterwards.
    pub fn restore_keyed(bytes: &[u8], key: IdKey) -> Result<Cell, SnapshotError> {
        let mut cell = crate::dedup::restoring_with(key, || Self::restore(bytes))?;
        cell.key_ids(key);
        Ok(cell)
    }

    /// Rebuilds a cell and its bodies from [`Cell::snapshot_whole`] bytes, each body checked against the state; the
    /// host stores them. Refuses a state-only snapshot whose state refers to any body ([`SnapshotError::NoBodies`]):
    /// what it needs is not in it.
    pub fn restore_whole(bytes: &[u8]) -> Result<(Cell, Vec<(u64, Bytes)>), SnapshotError> {
        let (cell, section) = Self::decode(bytes)?;
        let refs = cell.body_refs();
        let section = match section {
            Some(section) => section,
            None if refs.is_empty() => Vec::new(),
            None => return Err(SnapshotError::NoBodies),
        };
        check_bodies(&refs, &section)?;
        Ok((cell, section))
    }

    fn decode(bytes: &[u8]) -> Result<(Cell, BodySection), SnapshotError> {
        let (_, format, body) = open(bytes)?;
        let (mut cell, rest) = (format.read)(body)?;
        cell.rebuild_derived();
        Ok((cell, take_bodies(rest)?))
    }

    /// Decodes a snapshot into its version's frozen wire types and encodes them again. The result is the same bytes
    /// for every snapshot this build writes or reads: anything else means the in-memory types no longer encode as
    /// the version they write says (the change needs a new version), or a frozen version's wire types changed. For
    /// tests.
    #[doc(hidden)]
    pub fn reencode_snapshot(bytes: &[u8]) -> Result<Vec<u8>, SnapshotError> {
        let (version, format, body) = open(bytes)?;
        Ok(frame(version, &(format.reencode)(body)?))
    }

    /// SHA-256 of the state's encoding: equal digests mean equal states.
    pub fn digest(&self) -> StateDigest {
        StateDigest(Sha256::digest(encode_state(self)).into())
    }
}

/// SHA-256 of one part of a state's encoding ([`Cell::digest_parts`]).
pub(crate) fn digest_of(part: &impl Serialize) -> StateDigest {
    let bytes = postcard::to_stdvec(part).expect("encoding a part of a cell into memory does not fail");
    StateDigest(Sha256::digest(bytes).into())
}
