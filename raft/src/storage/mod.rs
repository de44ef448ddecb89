//! The one durable-storage trait a node writes through, the checksummed record format on top of it, and its two
//! implementations: RocksDB for production and [`SimDisk`] for tests and simulation.
//!
//! Records live in four key spaces ([`Space`]) keyed by `u64`. An implementation stores and returns bytes; it
//! promises nothing about durability until [`Storage::sync`] returns. Every record is framed with a crc32c over its
//! space, its key and its payload ([`frame`]), so a flipped bit, a torn write or a record written under the wrong key
//! is a typed [`StorageError::Corrupt`] on read, never wrong data.

use std::ops::Range;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

#[cfg(feature = "rocksdb")]
mod rocks;
#[cfg(feature = "rocksdb")]
pub mod segments;
mod sim_disk;

#[cfg(feature = "rocksdb")]
pub use rocks::RocksStorage;
pub use sim_disk::{DiskFaults, SimDisk};

/// A key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Space {
    /// Raft log entries, by index.
    Log,
    /// Small records: the vote, the committed log id, the last purged log id, repair marks ([`MetaKey`]).
    Meta,
    /// The state machine's snapshot.
    State,
    /// Message bodies.
    Bodies,
}

impl Space {
    /// Every space, in a fixed order.
    pub const ALL: [Space; 4] = [Space::Log, Space::Meta, Space::State, Space::Bodies];

    /// A stable one-byte tag, part of every record's checksum.
    pub fn tag(self) -> u8 {
        match self {
            Space::Log => 1,
            Space::Meta => 2,
            Space::State => 3,
            Space::Bodies => 4,
        }
    }

    /// The column family or table name.
    pub fn name(self) -> &'static str {
        match self {
            Space::Log => "log",
            Space::Meta => "meta",
            Space::State => "state",
            Space::Bodies => "bodies",
        }
    }
}

/// Keys of the [`Space::Meta`] space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum MetaKey {
    /// The last vote.
    Vote = 1,
    /// The last committed log id this node has seen.
    Committed = 2,
    /// The last purged log id.
    LastPurged = 3,
    /// After a corrupt log suffix was cut off: the last index this node once held, which it must hold again before
    /// it votes or campaigns.
    RepairTarget = 4,
    /// The last log index an append wrote, synced together with that append. A damaged record past it was never
    /// synced (a torn write); one at or before it was synced, maybe acknowledged, and damaged since.
    SyncedLog = 5,
    /// A message body failed to read back (see [`crate::bodies`]): the next start drops the state and takes a whole
    /// snapshot from the leader.
    BodiesDamaged = 6,
    /// The storage format the directory is written in (see [`crate::format`]).
    Format = 7,
    /// The bodies space may hold bodies the stored state does not refer to: a snapshot was being received, or
    /// deletes waited while one was sent (see [`crate::snapshot_transfer`]). The next start deletes them.
    BodiesUnswept = 8,
    /// The cell's id ([`crate::network::CellId`]): made by the node that founded the cell, learned by the others.
    CellId = 9,
    /// While a node repairs after its state was dropped beside a log that verified whole: the last log id it held
    /// (see [`crate::recovery`]). Until it is repaired it votes for a candidate whose log reaches this one, as Raft
    /// asks of the log it no longer has, and for no other.
    VoteFloor = 10,
}

/// What can go wrong in storage.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The device or the database failed.
    #[error("storage I/O failed: {reason}")]
    Io {
        /// The underlying error.
        reason: String,
    },
    /// A stored record does not verify: its checksum, length or key is wrong.
    #[error("corrupt record in {space:?} at key {key}: {reason}")]
    Corrupt {
        /// The space.
        space: Space,
        /// The key.
        key: u64,
        /// What does not verify.
        reason: String,
    },
    /// A record is larger than any store here holds ([`MAX_RECORD_BYTES`]): its batch was refused whole and nothing of
    /// it written. The store stays usable.
    #[error("a record of {size} bytes in {space:?} at key {key} is larger than the {max} bytes a record may hold")]
    TooLarge {
        /// The space.
        space: Space,
        /// The key.
        key: u64,
        /// The record's payload size.
        size: usize,
        /// The most a record holds.
        max: usize,
    },
    /// The store holds a format or an encoding this build does not read (written by a newer build, or by one too
    /// old to upgrade from). Nothing is dropped: the node refuses to start.
    #[error("unsupported storage: {reason}")]
    Unsupported {
        /// What is not supported, and what to do.
        reason: String,
    },
    /// An earlier write or sync failed, so what is on disk is unknown: the store refuses every further write.
    #[error("storage is poisoned by an earlier failure and refuses writes")]
    Poisoned,
}

/// One write of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Store a framed record.
    Put {
        /// The space.
        space: Space,
        /// The key.
        key: u64,
        /// The framed bytes.
        framed: Vec<u8>,
    },
    /// A record too large to store (over [`MAX_RECORD_BYTES`]): the whole batch is refused with
    /// [`StorageError::TooLarge`] and nothing of it is written.
    Refused {
        /// The space.
        space: Space,
        /// The key.
        key: u64,
        /// The payload's size.
        size: usize,
    },
    /// Delete every key in a range.
    DeleteRange {
        /// The space.
        space: Space,
        /// The keys.
        keys: Range<u64>,
    },
}

/// Writes applied together, in order. Records are framed as they are added.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The writes.
    pub writes: Vec<Write>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// Adds a record, framed for its space and key; one over [`MAX_RECORD_BYTES`] makes the whole batch refused.
    pub fn put(&mut self, space: Space, key: u64, payload: &[u8]) -> &mut Self {
        if payload.len() > MAX_RECORD_BYTES {
            self.writes.push(Write::Refused { space, key, size: payload.len() });
        } else {
            self.writes.push(Write::Put { space, key, framed: frame(space, key, payload) });
        }
        self
    }

    /// Puts a payload already encoded into `buffer` after [`FRAME_BYTES`] reserved bytes, framing it in place (the
    /// bytes [`frame`] makes, without copying the payload).
    pub fn put_encoded(&mut self, space: Space, key: u64, mut buffer: Vec<u8>) -> &mut Self {
        let payload = buffer.len().saturating_sub(FRAME_BYTES);
        if payload > MAX_RECORD_BYTES || buffer.len() < FRAME_BYTES {
            self.writes.push(Write::Refused { space, key, size: payload });
        } else {
            let crc = checksum(space, key, &buffer[FRAME_BYTES..]);
            buffer[0..4].copy_from_slice(&crc.to_le_bytes());
            buffer[4..8].copy_from_slice(&(payload as u32).to_le_bytes());
            self.writes.push(Write::Put { space, key, framed: buffer });
        }
        self
    }

    /// Whether every record fits: [`Storage::write`] implementations call this first and write nothing otherwise.
    pub fn check(&self) -> Result<(), StorageError> {
        match self.writes.iter().find(|write| matches!(write, Write::Refused { .. })) {
            Some(&Write::Refused { space, key, size }) => {
                Err(StorageError::TooLarge { space, key, size, max: MAX_RECORD_BYTES })
            }
            _ => Ok(()),
        }
    }

    /// Refuses a batch for [`Storage::write_unlogged`] unless it only puts.
    pub fn check_unlogged(&self) -> Result<(), StorageError> {
        self.check()?;
        if self.writes.iter().any(|write| matches!(write, Write::DeleteRange { .. })) {
            return Err(StorageError::Unsupported {
                reason: "a batch written without the journal may only put records".to_string(),
            });
        }
        Ok(())
    }

    /// Deletes the keys in a range.
    pub fn delete_range(&mut self, space: Space, keys: Range<u64>) -> &mut Self {
        self.writes.push(Write::DeleteRange { space, keys });
        self
    }

    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

/// Durable storage of framed records.
///
/// ### To ensure correctness
/// - A batch is applied in order and is visible to reads as soon as [`Storage::write`] returns; one that
///   [`Batch::check`] refuses writes nothing and fails with [`StorageError::TooLarge`] (and poisons nothing).
/// - Nothing is durable until [`Storage::sync`] returns `Ok`; after that, everything written before the call with
///   [`Storage::write`] survives a crash or power failure.
/// - What [`Storage::write_unlogged`] wrote is durable only once [`Storage::persist`] returns `Ok`: a sync does not
///   make it durable, and a crash, a power failure or a restart of the process before then may drop it. Reads see
///   it at once, as they see every write, in the order of all writes.
/// - After a failed write or sync, the store is poisoned: every later write and sync fails with
///   [`StorageError::Poisoned`], since what reached the disk is unknown.
/// - Records are returned as stored; verifying them is [`open`]'s job (the provided methods do it).
pub trait Storage: Send + Sync + 'static {
    /// Applies a batch (not yet durable).
    fn write(&self, batch: Batch) -> Result<(), StorageError>;

    /// Applies a batch of puts that no journal records (not yet durable, and not made durable by [`Storage::sync`]):
    /// for records the caller can write again from what is durable, so that they cost no journal write and no sync.
    /// A batch that deletes is refused with [`StorageError::Unsupported`], and nothing of it is written.
    fn write_unlogged(&self, batch: Batch) -> Result<(), StorageError>;

    /// Makes everything written so far durable, what [`Storage::write_unlogged`] wrote included.
    fn persist(&self) -> Result<(), StorageError>;

    /// The stored bytes under a key.
    fn read_framed(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError>;

    /// The stored bytes under each of `keys`, in their order, each read on its own (a failed read fails only its
    /// key), batched where the store can look many up at once. Required, so that a wrapper cannot lose the
    /// batching by forgetting to forward it.
    fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>>;

    /// The bytes `within` of the payload of the record under a key (after its frame), not verified: the caller checks
    /// them against a checksum of its own (a body in the log, see [`crate::in_log`]). A record too short to hold them
    /// is [`StorageError::Corrupt`]. Required, so that a wrapper cannot make it read the whole record by forgetting to
    /// forward it.
    fn read_part(&self, space: Space, key: u64, within: Range<usize>) -> Result<Option<Vec<u8>>, StorageError>;

    /// Up to `limit` stored records with keys in `keys`, in key order.
    fn scan_framed(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError>;

    /// The smallest and largest key in a space, if any.
    fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError>;

    /// Makes everything written so far durable.
    fn sync(&self) -> Result<(), StorageError>;

    /// How long a sync takes on a simulated device, for the caller to wait out on the runtime's clock. A real device
    /// returns zero: its `sync` blocks for the real time.
    ///
    /// Required, as is [`Storage::checkpoint`], so that a wrapper cannot drop it by forgetting to forward it.
    fn sync_delay(&self) -> std::time::Duration;

    /// Called after a snapshot was stored and synced: a store that replays a journal when it opens may move what it
    /// holds into its long-term files now, so that a restart replays little. Changes nothing that reads see and
    /// nothing about durability.
    fn checkpoint(&self) -> Result<(), StorageError>;

    /// Bytes free for the store on its device, if the store can tell (a simulated disk reports what a test set):
    /// what a node's free-disk watermark compares. Required, as is [`Storage::sync_delay`], so that a wrapper cannot
    /// drop it by forgetting to forward it.
    fn free_bytes(&self) -> Option<u64>;

    /// A verified record.
    fn get(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        match self.read_framed(space, key)? {
            Some(framed) => unframe(space, key, &framed).map(|payload| Some(payload.to_vec())),
            None => Ok(None),
        }
    }

    /// Verified records under each of `keys`, in their order; each that does not verify is an error of its own. Each
    /// payload is the record as read, past its frame: not copied again.
    fn get_many(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Bytes>, StorageError>> {
        self.read_many_framed(space, keys)
            .into_iter()
            .zip(keys)
            .map(|(read, &key)| {
                read.and_then(|framed| framed.map(|framed| unframe_owned(space, key, framed)).transpose())
            })
            .collect()
    }

    /// Verified records in key order; the first one that does not verify is an error.
    fn scan(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        self.scan_framed(space, keys, limit)?
            .into_iter()
            .map(|(key, framed)| unframe(space, key, &framed).map(|payload| (key, payload.to_vec())))
            .collect()
    }
}

impl<S: Storage + ?Sized> Storage for std::sync::Arc<S> {
    fn write(&self, batch: Batch) -> Result<(), StorageError> {
        (**self).write(batch)
    }
    fn write_unlogged(&self, batch: Batch) -> Result<(), StorageError> {
        (**self).write_unlogged(batch)
    }
    fn persist(&self) -> Result<(), StorageError> {
        (**self).persist()
    }
    fn read_framed(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        (**self).read_framed(space, key)
    }
    fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>> {
        (**self).read_many_framed(space, keys)
    }
    fn read_part(&self, space: Space, key: u64, within: Range<usize>) -> Result<Option<Vec<u8>>, StorageError> {
        (**self).read_part(space, key, within)
    }
    fn scan_framed(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        (**self).scan_framed(space, keys, limit)
    }
    fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
        (**self).key_bounds(space)
    }
    fn sync(&self) -> Result<(), StorageError> {
        (**self).sync()
    }
    fn free_bytes(&self) -> Option<u64> {
        (**self).free_bytes()
    }
    fn sync_delay(&self) -> std::time::Duration {
        (**self).sync_delay()
    }
    fn checkpoint(&self) -> Result<(), StorageError> {
        (**self).checkpoint()
    }
}

/// Bytes a framed record adds to its payload: a crc32c and the payload length.
pub const FRAME_BYTES: usize = 8;

/// Largest record payload a store takes (256 MiB). Well above anything legitimate (payloads are at most 8 MiB, a log
/// entry's batch a few MiB, snapshot chunks 16 MiB) and far below what the 32-bit length of a frame, or RocksDB,
/// can hold: a record over it is refused with a typed error instead of being truncated or silently dropped.
pub const MAX_RECORD_BYTES: usize = 256 * 1024 * 1024;

fn checksum(space: Space, key: u64, payload: &[u8]) -> u32 {
    let mut header = [0u8; 9];
    header[0] = space.tag();
    header[1..].copy_from_slice(&key.to_be_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&header), payload)
}

/// Frames a payload for its place: `crc32c(space, key, payload)` and the payload's length, then the payload. The
/// place is part of the checksum, so a record written under the wrong key does not verify.
pub fn frame(space: Space, key: u64, payload: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(FRAME_BYTES + payload.len());
    framed.extend_from_slice(&checksum(space, key, payload).to_le_bytes());
    framed.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    framed.extend_from_slice(payload);
    framed
}

/// The bytes `within` of a framed record's payload, not verified (see [`Storage::read_part`]).
pub fn part_of(space: Space, key: u64, framed: &[u8], within: Range<usize>) -> Result<Vec<u8>, StorageError> {
    let (start, end) = (within.start.saturating_add(FRAME_BYTES), within.end.saturating_add(FRAME_BYTES));
    match framed.get(start..end) {
        Some(part) => Ok(part.to_vec()),
        _ => Err(StorageError::Corrupt {
            space,
            key,
            reason: format!("bytes {within:?} asked of a {}-byte record", framed.len().saturating_sub(FRAME_BYTES)),
        }),
    }
}

/// Verifies a framed record read from `space` at `key` and returns its payload.
pub fn unframe(space: Space, key: u64, framed: &[u8]) -> Result<&[u8], StorageError> {
    let corrupt = |reason: String| StorageError::Corrupt { space, key, reason };
    if framed.len() < FRAME_BYTES {
        return Err(corrupt(format!("{} bytes is shorter than a record header", framed.len())));
    }
    let stored = u32::from_le_bytes(framed[0..4].try_into().expect("4 bytes"));
    let length = u32::from_le_bytes(framed[4..8].try_into().expect("4 bytes")) as usize;
    let payload = &framed[FRAME_BYTES..];
    if payload.len() != length {
        return Err(corrupt(format!("length says {length} bytes, {} are stored", payload.len())));
    }
    let computed = checksum(space, key, payload);
    #[cfg(madsim)]
    if cellog_planted::active(cellog_planted::Mutant::CrcNotChecked) && matches!(space, Space::Log | Space::Bodies) {
        return Ok(payload);
    }
    if stored != computed {
        return Err(corrupt(format!("checksum {stored:08x} stored, {computed:08x} computed")));
    }
    Ok(payload)
}

/// [`unframe`] of a record read into a buffer of its own: its payload, sharing the buffer.
pub fn unframe_owned(space: Space, key: u64, framed: Vec<u8>) -> Result<Bytes, StorageError> {
    let length = unframe(space, key, &framed)?.len();
    Ok(Bytes::from(framed).slice(FRAME_BYTES..FRAME_BYTES + length))
}
