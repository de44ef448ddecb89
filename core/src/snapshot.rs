//! The snapshot encoding of a cell and the state digest that compares replicas.
//!
//! Layout: 8 bytes of magic, a little-endian `u32` version, a little-endian `u32` crc32c of the body, then the body:
//! the cell encoded with postcard. Every map in the cell is a `BTreeMap`, so the same state always encodes to the
//! same bytes, which is what makes the digest (SHA-256 of the encoding) comparable across replicas.

use sha2::{Digest, Sha256};

use crate::cell::Cell;
use crate::error::SnapshotError;

const MAGIC: &[u8; 8] = b"CELLOGSN";
/// The encoding version this build writes and reads.
/// Version 2 added pins (messages that keep others from retention); a version 1 snapshot is refused as unsupported.
pub const SNAPSHOT_VERSION: u32 = 2;
const HEADER_BYTES: usize = 16;

/// A SHA-256 digest of a cell's whole state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateDigest(pub [u8; 32]);

impl std::fmt::Display for StateDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

fn encode_body(cell: &Cell) -> Vec<u8> {
    postcard::to_stdvec(cell).expect("encoding a cell into memory does not fail: every type is plainly serializable")
}

impl Cell {
    /// The whole state, versioned and checksummed. `Cell::restore(&cell.snapshot())` equals `cell` (pending effects
    /// aside, which are not state).
    pub fn snapshot(&self) -> Vec<u8> {
        #[cfg(madsim)]
        let body = if crate::mutant::active(crate::mutant::Mutant::DedupNotInSnapshot) {
            encode_body(&self.without_dedup())
        } else {
            encode_body(self)
        };
        #[cfg(not(madsim))]
        let body = encode_body(self);
        let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    /// Rebuilds a cell from [`Cell::snapshot`] bytes, refusing anything damaged or unknown.
    pub fn restore(bytes: &[u8]) -> Result<Cell, SnapshotError> {
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
        let (cell, rest) = postcard::take_from_bytes::<Cell>(body)
            .map_err(|error| SnapshotError::Malformed { reason: error.to_string() })?;
        if !rest.is_empty() {
            return Err(SnapshotError::Malformed {
                reason: format!("{} bytes after the end of the state", rest.len()),
            });
        }
        Ok(cell)
    }

    /// SHA-256 of the state's encoding: equal digests mean equal states.
    pub fn digest(&self) -> StateDigest {
        StateDigest(Sha256::digest(encode_body(self)).into())
    }
}
