//! Message bodies: the cell keeps references, the host keeps the bytes.
//!
//! The cell keeps, per message, a [`BodyRef`]: the key its body is stored under, its length and its crc32c. Keys come
//! from a counter in the cell's state, so every replica stores the same body under the same key and a key is never
//! used twice. The cell never holds, reads or writes body bytes after `apply` returns: a new body leaves `apply` as
//! [`BodyOp::BodyStored`] (with its bytes), a dead letter's copy as [`BodyOp::BodyCopied`], and a body no message
//! refers to any more as [`BodyOp::BodyReleased`]. The host must act on every one of them, in order, in the same
//! storage batch as the entry that produced them (raft-rs' `Ready`): [`crate::Cell::apply`] refuses to run while
//! effects of an earlier apply are still queued.
//!
//! Records and deliveries carry [`BodyRef`]s; the node that answers a client reads the bytes after the apply, outside
//! the replica's lock, and checks them with [`BodyRef::verify`].
//!
//! [`crate::MemoryBodies`] is a host's body store in memory (tests, benchmarks, a cell without durable storage). A replicated
//! node keeps bodies in its storage's bodies space instead.

use serde::{Deserialize, Serialize};

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

impl From<crate::snapshot::v3::BodyRef> for BodyRef {
    fn from(body: crate::snapshot::v3::BodyRef) -> Self {
        BodyRef { key: body.key, len: body.len, crc: body.crc }
    }
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
