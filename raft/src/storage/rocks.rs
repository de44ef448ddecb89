//! The production store: RocksDB, one column family per space, keys as big-endian `u64` so that key order is
//! numeric order. Writes go to the WAL without waiting; `sync` fsyncs the WAL, which is what makes a batch durable.
//! Unlogged writes skip the WAL and live in their column family's memtable until `persist` flushes it to a table
//! file (which RocksDB syncs, with the manifest that names it).

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};

use super::{Batch, Space, Storage, StorageError, Write};

/// A RocksDB database under a directory.
pub struct RocksStorage {
    db: DB,
    poisoned: AtomicBool,
    /// The spaces written without the WAL since their last flush, one bit per [`Space::tag`].
    unlogged: AtomicU8,
}

impl std::fmt::Debug for RocksStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStorage").field("path", &self.db.path()).finish()
    }
}

fn io(error: rocksdb::Error) -> StorageError {
    StorageError::Io { reason: error.into_string() }
}

fn key_bytes(key: u64) -> [u8; 8] {
    key.to_be_bytes()
}

fn key_of(bytes: &[u8], space: Space) -> Result<u64, StorageError> {
    let bytes: [u8; 8] = bytes.try_into().map_err(|_| StorageError::Corrupt {
        space,
        key: 0,
        reason: format!("a key of {} bytes; keys are 8", bytes.len()),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// The most write-ahead log a restart replays.
const MAX_WAL_BYTES: u64 = 64 << 20;

impl RocksStorage {
    /// Opens (creating if needed) the database under `path`.
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        // A record torn by a crash at the WAL's tail was never synced and may go; damage anywhere before it must be
        // an error, not (as with the default point-in-time mode) a silent end of replay that drops every synced
        // write after it.
        options.set_wal_recovery_mode(rocksdb::DBRecoveryMode::TolerateCorruptedTailRecords);
        // Column families are flushed once the write-ahead log holds this much, so a restart replays at most this
        // much (the default allows several times every memtable, which makes a restart take seconds).
        options.set_max_total_wal_size(MAX_WAL_BYTES);
        let families = Space::ALL.iter().map(|space| ColumnFamilyDescriptor::new(space.name(), Options::default()));
        let db = DB::open_cf_descriptors(&options, path, families).map_err(io)?;
        Ok(RocksStorage { db, poisoned: AtomicBool::new(false), unlogged: AtomicU8::new(0) })
    }

    fn family(&self, space: Space) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(space.name()).expect("every column family is created at open")
    }

    fn check_writable(&self) -> Result<(), StorageError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StorageError::Poisoned);
        }
        Ok(())
    }

    fn poison(&self, error: rocksdb::Error) -> StorageError {
        self.poisoned.store(true, Ordering::Release);
        io(error)
    }
}

impl RocksStorage {
    /// Writes a checked batch, through the WAL or not.
    fn write_checked(&self, batch: &Batch, logged: bool) -> Result<(), StorageError> {
        let mut rocks_batch = WriteBatch::default();
        for write in &batch.writes {
            match write {
                Write::Put { space, key, framed } => rocks_batch.put_cf(self.family(*space), key_bytes(*key), framed),
                // Checked above: the batch holds none.
                Write::Refused { .. } => {}
                Write::DeleteRange { space, keys } => {
                    if keys.start.checked_add(1) == Some(keys.end) {
                        // A point delete: range tombstones are for ranges, and many of them slow reads.
                        rocks_batch.delete_cf(self.family(*space), key_bytes(keys.start));
                    } else if keys.start < keys.end {
                        rocks_batch.delete_range_cf(self.family(*space), key_bytes(keys.start), key_bytes(keys.end));
                    }
                }
            }
        }
        let mut options = WriteOptions::default();
        // Durability comes from `sync`, which fsyncs the WAL once for many batches (group commit), or, for unlogged
        // writes, from `persist`.
        options.set_sync(false);
        options.disable_wal(!logged);
        self.db.write_opt(rocks_batch, &options).map_err(|error| self.poison(error))
    }
}

impl Storage for RocksStorage {
    fn write(&self, batch: Batch) -> Result<(), StorageError> {
        self.check_writable()?;
        batch.check()?;
        self.write_checked(&batch, true)
    }

    fn write_unlogged(&self, batch: Batch) -> Result<(), StorageError> {
        self.check_writable()?;
        batch.check_unlogged()?;
        for write in &batch.writes {
            if let Write::Put { space, .. } = write {
                self.unlogged.fetch_or(1 << space.tag(), Ordering::AcqRel);
            }
        }
        self.write_checked(&batch, false)
    }

    /// Flushes the memtables that hold unlogged writes (each flush writes and syncs a table file and the manifest),
    /// then syncs the WAL.
    fn persist(&self) -> Result<(), StorageError> {
        self.check_writable()?;
        // Taken before the flushes: a write that lands meanwhile marks its space again for the next persist.
        let unlogged = self.unlogged.swap(0, Ordering::AcqRel);
        for space in Space::ALL {
            if unlogged & (1 << space.tag()) != 0 {
                self.db.flush_cf(self.family(space)).map_err(|error| self.poison(error))?;
            }
        }
        self.sync()
    }

    fn read_framed(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        self.db.get_cf(self.family(space), key_bytes(key)).map_err(io)
    }

    /// One batched lookup (RocksDB sorts the keys and reads each block once), instead of a lookup per key.
    fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>> {
        let keys: Vec<[u8; 8]> = keys.iter().map(|&key| key_bytes(key)).collect();
        self.db
            .batched_multi_get_cf(self.family(space), keys.iter(), false)
            .into_iter()
            .map(|read| read.map(|found| found.map(|bytes| bytes.to_vec())).map_err(io))
            .collect()
    }

    fn scan_framed(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let mut records = Vec::new();
        if keys.start >= keys.end {
            return Ok(records);
        }
        let start = key_bytes(keys.start);
        for item in self.db.iterator_cf(self.family(space), IteratorMode::From(&start, Direction::Forward)) {
            let (key, value) = item.map_err(io)?;
            let key = key_of(&key, space)?;
            if key >= keys.end || records.len() >= limit {
                break;
            }
            records.push((key, value.into_vec()));
        }
        Ok(records)
    }

    fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
        let first = self.db.iterator_cf(self.family(space), IteratorMode::Start).next();
        let last = self.db.iterator_cf(self.family(space), IteratorMode::End).next();
        match (first, last) {
            (Some(first), Some(last)) => {
                let (first, _) = first.map_err(io)?;
                let (last, _) = last.map_err(io)?;
                Ok(Some((key_of(&first, space)?, key_of(&last, space)?)))
            }
            _ => Ok(None),
        }
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.check_writable()?;
        self.db.flush_wal(true).map_err(|error| self.poison(error))
    }

    /// A real device: `sync` blocks for the real time.
    fn sync_delay(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Flushes every column family's memtable, so the write-ahead log a restart replays is empty: a snapshot is one
    /// large record, and replaying it (with the bodies written since the last flush) took most of a restart.
    fn checkpoint(&self) -> Result<(), StorageError> {
        self.check_writable()?;
        for space in Space::ALL {
            self.db.flush_cf(self.family(space)).map_err(|error| self.poison(error))?;
        }
        Ok(())
    }

    /// What `statvfs` says an unprivileged writer may still use on the filesystem holding the database.
    fn free_bytes(&self) -> Option<u64> {
        let stat = rustix::fs::statvfs(self.db.path()).ok()?;
        Some(stat.f_bavail.saturating_mul(stat.f_frsize))
    }
}
