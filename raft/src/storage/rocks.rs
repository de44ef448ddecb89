//! The production store: the Raft log in segment files of its own ([`SegmentLog`], under `segments/`), and every
//! other space in RocksDB, one column family per space, keys as big-endian `u64` so that key order is numeric order.
//! What an append writes beside its entries (the `SyncedLog` mark and the `Committed` hint) is kept in the segments
//! too, so an append is durable with one `fdatasync` of its segment. RocksDB writes go to its WAL without waiting;
//! `sync` syncs the segments written and, when RocksDB was written through its WAL since, fsyncs the WAL. Unlogged
//! writes skip the WAL and live in their column family's memtable until `persist` flushes it to a table file (which
//! RocksDB syncs, with the manifest that names it).
//!
//! Builds before kept the log in RocksDB's `log` column family: opening such a directory moves it into segments
//! first (copied and synced, then deleted from RocksDB in one synced write, so a crash midway copies it again).

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};

use super::segments::{LogWrite, SegmentLog};
use super::{Batch, MetaKey, Space, Storage, StorageError, Write};

/// The meta records an append writes with its entries: kept in the segments beside the log.
const BESIDE_THE_LOG: [u64; 2] = [MetaKey::Committed as u64, MetaKey::SyncedLog as u64];

fn beside_the_log(space: Space, key: u64) -> bool {
    space == Space::Meta && BESIDE_THE_LOG.contains(&key)
}

/// A RocksDB database under a directory.
pub struct RocksStorage {
    db: DB,
    /// The Raft log, and the meta records written with it.
    log: SegmentLog,
    /// Whether RocksDB was written through its WAL since the last sync.
    wal_written: AtomicBool,
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

/// Whether `keys` ascend and span at most twice as many keys as they are: read faster by one pass over their range
/// than by looking each up (see `RocksStorage::read_range`).
fn dense(keys: &[u64]) -> bool {
    let ascending = keys.windows(2).all(|pair| pair[0] < pair[1]);
    match (keys.first(), keys.last()) {
        (Some(first), Some(last)) if keys.len() > 1 && ascending => {
            last - first < 2 * u64::try_from(keys.len()).unwrap_or(u64::MAX / 2)
        }
        _ => false,
    }
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
        let log = SegmentLog::open(&path.join("segments"))?;
        let storage = RocksStorage {
            db,
            log,
            wal_written: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            unlogged: AtomicU8::new(0),
        };
        storage.move_the_log_out()?;
        Ok(storage)
    }

    /// Moves a log that a build before kept in RocksDB into the segments, with the meta records kept beside it. Left
    /// alone in a directory of a newer format, which the format check refuses.
    fn move_the_log_out(&self) -> Result<(), StorageError> {
        let family = self.family(Space::Log);
        let in_rocks = self.db.iterator_cf(family, IteratorMode::Start).next().is_some();
        let mut beside = Vec::new();
        for key in BESIDE_THE_LOG {
            if let Some(framed) = self.db.get_cf(self.family(Space::Meta), key_bytes(key)).map_err(io)? {
                beside.push(LogWrite::PutMeta(key, Cow::Owned(framed)));
            }
        }
        if !in_rocks && beside.is_empty() {
            return Ok(());
        }
        let format = self.db.get_cf(self.family(Space::Meta), key_bytes(MetaKey::Format as u64)).map_err(io)?;
        let format = format.and_then(|framed| {
            let payload = super::unframe(Space::Meta, MetaKey::Format as u64, &framed).ok()?;
            postcard::from_bytes::<u32>(payload).ok()
        });
        if format.is_some_and(|format| format > crate::format::STORE_FORMAT) {
            return Ok(());
        }
        // A move cut short left a copy of some of it: copied again whole.
        self.log.write(&[LogWrite::Delete(0..u64::MAX)])?;
        let mut next = Some(0u64);
        while let Some(from) = next {
            let records = self.scan_rocks(Space::Log, from..u64::MAX, 1024)?;
            next = records.last().and_then(|(key, _)| key.checked_add(1)).filter(|_| records.len() == 1024);
            let writes: Vec<LogWrite> =
                records.into_iter().map(|(key, framed)| LogWrite::Put(key, Cow::Owned(framed))).collect();
            self.log.write(&writes)?;
        }
        self.log.write(&beside)?;
        self.log.sync()?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(family, key_bytes(0), key_bytes(u64::MAX));
        batch.delete_cf(family, key_bytes(u64::MAX));
        for key in BESIDE_THE_LOG {
            batch.delete_cf(self.family(Space::Meta), key_bytes(key));
        }
        let mut options = WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(batch, &options).map_err(io)?;
        tracing::info!(path = %self.db.path().display(), "the Raft log moved from RocksDB to segment files");
        Ok(())
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

    /// The segments failed: the store is poisoned too (unless they refused a write before writing anything).
    fn poison_for(&self, error: StorageError) -> StorageError {
        if !matches!(error, StorageError::Unsupported { .. }) {
            self.poisoned.store(true, Ordering::Release);
        }
        error
    }

    fn poison(&self, error: rocksdb::Error) -> StorageError {
        self.poisoned.store(true, Ordering::Release);
        io(error)
    }
}

impl RocksStorage {
    /// Writes a checked batch, through the WAL or not.
    fn write_checked(&self, batch: &Batch, logged: bool) -> Result<(), StorageError> {
        let mut log = Vec::new();
        let mut rocks_batch = WriteBatch::default();
        for write in &batch.writes {
            match write {
                Write::Put { space: Space::Log, key, framed } => log.push(LogWrite::Put(*key, Cow::Borrowed(framed))),
                Write::DeleteRange { space: Space::Log, keys } => log.push(LogWrite::Delete(keys.clone())),
                Write::Put { space, key, framed } if beside_the_log(*space, *key) => {
                    log.push(LogWrite::PutMeta(*key, Cow::Borrowed(framed)));
                }
                Write::DeleteRange { space: Space::Meta, keys } if BESIDE_THE_LOG.iter().any(|k| keys.contains(k)) => {
                    log.extend(BESIDE_THE_LOG.iter().filter(|&&k| keys.contains(&k)).map(|&k| LogWrite::DeleteMeta(k)));
                    rocks_batch.delete_range_cf(self.family(Space::Meta), key_bytes(keys.start), key_bytes(keys.end));
                }
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
        // The segments first: the entries of an append before the marks that say they were written.
        if !log.is_empty() {
            self.log.write(&log).map_err(|error| self.poison_for(error))?;
        }
        if rocks_batch.is_empty() {
            return Ok(());
        }
        let mut options = WriteOptions::default();
        // Durability comes from `sync`, which fsyncs the WAL once for many batches (group commit), or, for unlogged
        // writes, from `persist`.
        options.set_sync(false);
        options.disable_wal(!logged);
        if logged {
            self.wal_written.store(true, Ordering::Release);
        }
        self.db.write_opt(rocks_batch, &options).map_err(|error| self.poison(error))
    }

    /// Up to `limit` records of RocksDB's column family for `space` with keys in `keys`, in key order.
    fn scan_rocks(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
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

    /// The records under `keys` (ascending, see [`dense`]) by one iterator over their range: one seek, then a step
    /// per record in the range. Each lookup of a batched read searches the memtable again from its top, which costs a
    /// fetch of small messages more than reading their bodies.
    fn read_range(&self, space: Space, keys: &[u64]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        let (Some(&first), Some(&last)) = (keys.first(), keys.last()) else { return Ok(Vec::new()) };
        let mut options = rocksdb::ReadOptions::default();
        if let Some(end) = last.checked_add(1) {
            options.set_iterate_upper_bound(key_bytes(end));
        }
        let mut records = self.db.raw_iterator_cf_opt(self.family(space), options);
        records.seek(key_bytes(first));
        let mut read = Vec::with_capacity(keys.len());
        for &key in keys {
            let mut found = None;
            while let Some(at) = records.key() {
                let at = key_of(at, space)?;
                if at > key {
                    break;
                }
                if at == key {
                    found = records.value().map(<[u8]>::to_vec);
                }
                records.next();
            }
            read.push(found);
        }
        records.status().map_err(io)?;
        Ok(read)
    }

    fn rocks_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
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
        match space {
            Space::Log => self.log.read(key),
            _ if beside_the_log(space, key) => self.log.read_meta(key),
            _ => self.db.get_cf(self.family(space), key_bytes(key)).map_err(io),
        }
    }

    fn read_part(&self, space: Space, key: u64, within: Range<usize>) -> Result<Option<Vec<u8>>, StorageError> {
        match space {
            Space::Log => self.log.read_part(key, within),
            _ => self.read_framed(space, key)?.map(|framed| super::part_of(space, key, &framed, within)).transpose(),
        }
    }

    /// Keys close together (a fetch's bodies, stored one after another) in one pass of an iterator over their range;
    /// others in one batched lookup (RocksDB sorts the keys and reads each block once), instead of a lookup per key.
    fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>> {
        if space == Space::Log || keys.iter().any(|&key| beside_the_log(space, key)) {
            return keys.iter().map(|&key| self.read_framed(space, key)).collect();
        }
        if dense(keys) {
            // An iterator's error fails every key alike: the batched lookup below tells them apart.
            if let Ok(read) = self.read_range(space, keys) {
                return read.into_iter().map(Ok).collect();
            }
        }
        let keys: Vec<[u8; 8]> = keys.iter().map(|&key| key_bytes(key)).collect();
        self.db
            .batched_multi_get_cf(self.family(space), keys.iter(), false)
            .into_iter()
            .map(|read| read.map(|found| found.map(|bytes| bytes.to_vec())).map_err(io))
            .collect()
    }

    fn scan_framed(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        match space {
            Space::Log => self.log.scan(keys, limit),
            Space::Meta => {
                let mut records = self.scan_rocks(space, keys.clone(), limit)?;
                for key in self.log.meta_keys().into_iter().filter(|key| keys.contains(key)) {
                    if let Some(framed) = self.log.read_meta(key)? {
                        records.push((key, framed));
                    }
                }
                records.sort_by_key(|(key, _)| *key);
                records.truncate(limit);
                Ok(records)
            }
            _ => self.scan_rocks(space, keys, limit),
        }
    }

    fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
        match space {
            Space::Log => Ok(self.log.bounds()),
            Space::Meta => {
                let beside = self.log.meta_keys();
                let beside = beside.first().copied().zip(beside.last().copied());
                Ok(match (self.rocks_bounds(space)?, beside) {
                    (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
                    (one, other) => one.or(other),
                })
            }
            _ => self.rocks_bounds(space),
        }
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.check_writable()?;
        self.log.sync().map_err(|error| self.poison_for(error))?;
        // Taken before the flush: a write that lands meanwhile marks it again for the next sync.
        if self.wal_written.swap(false, Ordering::AcqRel) {
            self.db.flush_wal(true).map_err(|error| self.poison(error))?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &RocksStorage, writes: &[(Space, u64, &str)]) {
        let mut batch = Batch::new();
        for (space, key, text) in writes {
            batch.put(*space, *key, text.as_bytes());
        }
        store.write(batch).expect("written");
    }

    fn text(store: &RocksStorage, space: Space, key: u64) -> Option<String> {
        store.get(space, key).expect("read").map(|bytes| String::from_utf8(bytes).expect("utf-8"))
    }

    const SYNCED: u64 = MetaKey::SyncedLog as u64;
    const VOTE: u64 = MetaKey::Vote as u64;

    #[test]
    fn a_log_kept_in_rocksdb_by_a_build_before_moves_to_segments_when_opened() {
        let dir = tempfile::tempdir().expect("a temp dir");
        {
            let mut options = Options::default();
            options.create_if_missing(true);
            options.create_missing_column_families(true);
            let db = DB::open_cf(&options, dir.path(), Space::ALL.map(Space::name)).expect("opened");
            for key in 1..=3 {
                let framed = super::super::frame(Space::Log, key, format!("entry {key}").as_bytes());
                db.put_cf(db.cf_handle("log").expect("a family"), key_bytes(key), framed).expect("put");
            }
            let meta = db.cf_handle("meta").expect("a family");
            db.put_cf(meta, key_bytes(SYNCED), super::super::frame(Space::Meta, SYNCED, b"3")).expect("put");
            db.put_cf(meta, key_bytes(VOTE), super::super::frame(Space::Meta, VOTE, b"a vote")).expect("put");
        }
        let store = RocksStorage::open(dir.path()).expect("opened");
        assert_eq!(text(&store, Space::Log, 2).as_deref(), Some("entry 2"));
        assert_eq!(store.key_bounds(Space::Log), Ok(Some((1, 3))));
        assert_eq!(text(&store, Space::Meta, SYNCED).as_deref(), Some("3"));
        assert_eq!(text(&store, Space::Meta, VOTE).as_deref(), Some("a vote"));
        assert_eq!(store.key_bounds(Space::Meta), Ok(Some((VOTE, SYNCED))));
        let metas: Vec<u64> =
            store.scan(Space::Meta, 0..u64::MAX, 10).expect("scanned").into_iter().map(|r| r.0).collect();
        assert_eq!(metas, vec![VOTE, SYNCED]);
        assert_eq!(store.rocks_bounds(Space::Log), Ok(None), "nothing of the log is left in RocksDB");
        assert_eq!(store.db.get_cf(store.family(Space::Meta), key_bytes(SYNCED)), Ok(None));
        put(&store, &[(Space::Log, 4, "entry 4"), (Space::Meta, SYNCED, "4")]);
        store.sync().expect("synced");
        drop(store);
        let store = RocksStorage::open(dir.path()).expect("reopened");
        assert_eq!(store.key_bounds(Space::Log), Ok(Some((1, 4))));
        assert_eq!(text(&store, Space::Log, 1).as_deref(), Some("entry 1"));
        assert_eq!(text(&store, Space::Meta, SYNCED).as_deref(), Some("4"));
    }

    #[test]
    fn an_append_with_its_marks_does_not_touch_the_rocksdb_wal() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = RocksStorage::open(dir.path()).expect("opened");
        put(
            &store,
            &[(Space::Log, 1, "entry 1"), (Space::Meta, SYNCED, "1"), (Space::Meta, MetaKey::Committed as u64, "c")],
        );
        assert!(!store.wal_written.load(Ordering::Acquire), "only the segments were written");
        store.sync().expect("synced");
        put(&store, &[(Space::Meta, VOTE, "a vote")]);
        assert!(store.wal_written.load(Ordering::Acquire), "the vote goes through RocksDB's WAL");
        store.sync().expect("synced");
        assert!(!store.wal_written.load(Ordering::Acquire));
        let mut batch = Batch::new();
        batch.delete_range(Space::Meta, SYNCED..SYNCED + 1);
        store.write(batch).expect("deleted");
        assert_eq!(text(&store, Space::Meta, SYNCED), None, "a mark beside the log is deleted there");
    }
}
