//! The Raft log in append-only segment files: a log is only ever appended to, cut at its tail and dropped from its
//! head, so it is kept as a journal of its own rather than as keys of a database that flushes and compacts it.
//!
//! A directory holds numbered segments (`00000000000000000001.seg`, …) of up to [`SEGMENT_BYTES`] each (a record
//! larger than that gets a segment of its own), preallocated [`PREALLOCATE_BYTES`] at a time ahead of the writes, so
//! that a sync rarely has a file's size or its blocks to record. A segment is a sequence of records:
//!
//! ```text
//! crc32c u32 | body length u32 | key u64 | kind u8 | 3 zero bytes | body
//! ```
//!
//! The crc covers the segment's number and the header after it, so a header torn, zeroed (the preallocated tail)
//! or written into the wrong segment does not verify. The body of an entry is the framed record ([`super::frame`]),
//! whose own crc is checked when it is read, so a flipped bit in a body is a typed `Corrupt` for that one key (which
//! the log store's recovery repairs), never a lost tail. Kinds:
//! - an entry: the record under `key` (replacing one written before under it);
//! - a delete: every record from `key` to the end the body holds (a `u64`, excluded) is gone: a cut of the tail, a
//!   purge of the head;
//! - a seal: the segment ended here, cleanly (written before the next segment starts);
//! - a small record of its own under `key` beside the log (the store keeps there what an append writes with its
//!   entries, so that an append is durable with one sync), or its deletion. The newest of each key counts.
//!
//! Opening replays the records of every segment in order into an index in memory (key → where its body is). The
//! last segment ends at the first record header that does not verify. When that is what a torn write leaves (part
//! of the header never written, or a body running past the file), the tail is cut off and zeroed: the file is cut
//! there and preallocated again, so nothing written before it can verify later. Anything else (a header damaged
//! after it was written, or a sealed segment that stops before its seal) would silently lose the records after it,
//! which may have been acknowledged, and which the marks beside the log would no longer show as missing: opening
//! fails with `Corrupt`, and the node does not start until its store is moved aside (it then repairs from a leader
//! before it votes, as after a lost disk).
//!
//! A segment holding no live record is deleted once it is the oldest and the records that left it are durable (at
//! the next [`SegmentLog::sync`]), so a purge frees whole files. Only the oldest go: a cut or purge in a segment may
//! be what keeps an older record gone.
//!
//! Written by hand because the format is the durability promise itself: every byte of it is checked here, and the
//! recovery rules (what is torn, what is damaged, what may be deleted) are the log store's, not a library's.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{FRAME_BYTES, Space, StorageError};

/// Bytes a segment holds before the next one starts (64 MiB).
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Bytes a segment is preallocated by, ahead of its writes (4 MiB): a node's idle log costs little disk, and a sync
/// records the file's new blocks once per this many bytes written.
pub const PREALLOCATE_BYTES: u64 = 4 * 1024 * 1024;

/// Bytes of a record's header.
const HEADER_BYTES: usize = 20;

/// What a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Entry = 1,
    Delete = 2,
    Seal = 3,
    Meta = 4,
    MetaDelete = 5,
}

impl Kind {
    fn of(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Entry,
            2 => Kind::Delete,
            3 => Kind::Seal,
            4 => Kind::Meta,
            5 => Kind::MetaDelete,
            _ => return None,
        })
    }
}

/// A change to the log, in the order written (its records borrowed from the batch that holds them, or owned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogWrite<'a> {
    /// The framed record under a key.
    Put(u64, Cow<'a, [u8]>),
    /// Every record in a range: a cut (`from..u64::MAX`), a purge (`0..below`), or any other.
    Delete(Range<u64>),
    /// A framed record beside the log, under its own key.
    PutMeta(u64, Cow<'a, [u8]>),
    /// No record beside the log under a key any more.
    DeleteMeta(u64),
}

/// Where a record's body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    segment: u64,
    offset: u64,
    len: u32,
}

/// A segment file.
struct Segment {
    file: Arc<File>,
    /// Records of the index whose bodies are in it.
    live: u64,
}

struct Inner {
    /// Every segment, by number; the last is the one appended to.
    segments: BTreeMap<u64, Segment>,
    /// Where the records are written next in the last segment, how much it may hold, and how far it is preallocated.
    end: u64,
    capacity: u64,
    allocated: u64,
    /// Each record's place.
    index: BTreeMap<u64, Place>,
    /// Each record's beside the log.
    metas: BTreeMap<u64, Place>,
    /// Segments written since the last sync, and whether the directory changed (a segment made or deleted).
    dirty: Vec<u64>,
    directory_dirty: bool,
    /// Whether an earlier write or sync failed.
    poisoned: bool,
}

/// The Raft log of one node, in segment files under a directory. Safe to share between threads: writes are
/// serialized, reads copy a record's place under the lock and read it outside.
pub struct SegmentLog {
    dir: PathBuf,
    segment_bytes: u64,
    inner: Mutex<Inner>,
}

fn io_error(what: &str, path: &Path, error: std::io::Error) -> StorageError {
    StorageError::Io { reason: format!("{what} {}: {error}", path.display()) }
}

fn segment_name(number: u64) -> String {
    format!("{number:020}.seg")
}

fn header_crc(segment: u64, header_tail: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&segment.to_be_bytes()), header_tail)
}

/// A record's header and body, as written to `segment`.
fn header(segment: u64, kind: Kind, key: u64, body: &[u8]) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[4..8].copy_from_slice(&(body.len() as u32).to_le_bytes());
    header[8..16].copy_from_slice(&key.to_le_bytes());
    header[16] = kind as u8;
    let crc = header_crc(segment, &header[4..]);
    header[0..4].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Records to be written at the end of the last segment: each one's header, and its body where it is.
#[derive(Default)]
struct Pending<'a> {
    headers: Vec<[u8; HEADER_BYTES]>,
    bodies: Vec<&'a [u8]>,
    /// Their bytes, headers included.
    len: u64,
    /// Each record's change to the index, applied once it is written.
    applied: Vec<(Kind, u64, Place, u64)>,
}

impl<'a> Pending<'a> {
    fn push(&mut self, segment: u64, kind: Kind, key: u64, body: &'a [u8]) {
        self.headers.push(header(segment, kind, key, body));
        self.bodies.push(body);
        self.len += (HEADER_BYTES + body.len()) as u64;
    }

    fn slices(&self) -> Vec<IoSlice<'_>> {
        self.headers
            .iter()
            .zip(&self.bodies)
            .flat_map(|(header, body)| [IoSlice::new(header), IoSlice::new(body)])
            .filter(|slice| !slice.is_empty())
            .collect()
    }
}

/// Writes every byte of `slices` at `offset`, in as few calls as the system allows (at most `IOV_MAX`, 1 024 on
/// Linux, slices a call).
fn write_all_vectored_at(file: &File, slices: &[IoSlice<'_>], mut offset: u64) -> std::io::Result<()> {
    const IOV_MAX: usize = 1024;
    let mut owned: Vec<IoSlice<'_>> = slices.to_vec();
    let mut slices = &mut owned[..];
    while !slices.is_empty() {
        let n = rustix::io::pwritev(file, &slices[..slices.len().min(IOV_MAX)], offset)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        offset += n as u64;
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// A header that verifies: its kind, key and body length.
fn decode(segment: u64, header: &[u8; HEADER_BYTES]) -> Option<(Kind, u64, u32)> {
    let crc = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    if crc != header_crc(segment, &header[4..]) || header[17..20] != [0, 0, 0] {
        return None;
    }
    let len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let key = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    Some((Kind::of(header[16])?, key, len))
}

impl Inner {
    fn empty() -> Inner {
        Inner {
            segments: BTreeMap::new(),
            end: 0,
            capacity: 0,
            allocated: 0,
            index: BTreeMap::new(),
            metas: BTreeMap::new(),
            dirty: Vec::new(),
            directory_dirty: false,
            poisoned: false,
        }
    }

    /// Removes from the index every record in `keys`, counting them out of their segments.
    fn remove(&mut self, keys: Range<u64>) {
        let removed: Vec<u64> = self.index.range(keys).map(|(&key, _)| key).collect();
        for key in removed {
            let place = self.index.remove(&key).expect("listed above");
            if let Some(segment) = self.segments.get_mut(&place.segment) {
                segment.live -= 1;
            }
        }
    }

    /// Applies one record to the index, as written or replayed (`end`: a delete's end).
    fn apply(&mut self, kind: Kind, key: u64, place: Place, end: u64) {
        match kind {
            Kind::Entry => {
                self.remove(key..key.saturating_add(1));
                self.index.insert(key, place);
                self.segments.get_mut(&place.segment).expect("the segment is open").live += 1;
            }
            Kind::Delete => self.remove(key..end),
            Kind::Seal => {}
            Kind::Meta | Kind::MetaDelete => {
                if let Some(old) = self.metas.remove(&key)
                    && let Some(segment) = self.segments.get_mut(&old.segment)
                {
                    segment.live -= 1;
                }
                if kind == Kind::Meta {
                    self.metas.insert(key, place);
                    self.segments.get_mut(&place.segment).expect("the segment is open").live += 1;
                }
            }
        }
    }

    fn last_segment(&self) -> u64 {
        *self.segments.keys().next_back().expect("a log has a segment")
    }
}

/// A write of at least this many bytes is not followed by zeros ahead of it (see [`preallocate`]): the zeros would
/// double the bytes large appends write (measured: a quarter of a node's time in a pipelined publish of 64 KiB
/// payloads), to spare their syncs the recording of the file's new size, which costs them little beside their own
/// bytes. Smaller appends, whose sync latency is what the zeros are for, zero ahead as before.
const ZERO_AHEAD_BELOW: u64 = 1 << 20;

/// Bytes of zeros written at a time when a segment is preallocated.
const ZEROS_BYTES: usize = 1 << 20;

/// Preallocates `file` from `from` to `to` by writing zeros there, best effort (a failure leaves the file to grow as
/// it is written, which the next write reports if the disk is full).
///
/// Zeros written, not `fallocate`: a filesystem records fallocated blocks as unwritten, and a write into them changes
/// that record, so every fdatasync of an append in them commits the filesystem's journal as well (measured on ext4:
/// an fdatasync of a 4 KiB write costs about as much into fallocated blocks as at the file's end, and a third to a
/// half less into blocks written before). Once per [`PREALLOCATE_BYTES`], the sync after this one flushes the zeros
/// and the file's new size; every other sync flushes only the records.
fn preallocate(file: &File, from: u64, to: u64) {
    let zeros = vec![0u8; ZEROS_BYTES];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS_BYTES as u64) as usize;
        if file.write_all_at(&zeros[..n], at).is_err() {
            return;
        }
        at += n as u64;
    }
}

impl SegmentLog {
    /// Opens the log under `dir` (made if missing), replaying its segments; a torn tail is cut off.
    pub fn open(dir: &Path) -> Result<SegmentLog, StorageError> {
        SegmentLog::open_with(dir, SEGMENT_BYTES)
    }

    /// [`SegmentLog::open`] with segments of `segment_bytes` (small ones in tests, to exercise rotation).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<SegmentLog, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
        let mut numbers = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))? {
            let item = item.map_err(|e| io_error("listing", dir, e))?;
            let name = item.file_name();
            let Some(number) = name.to_str().and_then(|n| n.strip_suffix(".seg")).and_then(|n| n.parse().ok()) else {
                continue;
            };
            numbers.push(number);
        }
        numbers.sort_unstable();
        let log = SegmentLog { dir: dir.to_path_buf(), segment_bytes, inner: Mutex::new(Inner::empty()) };
        let mut inner = Inner::empty();
        let mut sealed_last = false;
        for (position, &number) in numbers.iter().enumerate() {
            let path = log.path(number);
            let file =
                OpenOptions::new().read(true).write(true).open(&path).map_err(|e| io_error("opening", &path, e))?;
            let file = Arc::new(file);
            inner.segments.insert(number, Segment { file: file.clone(), live: 0 });
            let (end, sealed) = replay(&mut inner, number, &file, &path)?;
            let last = position + 1 == numbers.len();
            if sealed {
                // A sealed last segment: the process stopped between the seal and the next segment.
                sealed_last = last;
                continue;
            }
            // The end of the log. Only a torn write may end it: damage would lose the records after it (maybe
            // acknowledged) without a trace, so the node does not start over it.
            if !last {
                return Err(damaged(&path, end, "it stops before its seal, and later segments follow it"));
            }
            if !torn_at(&file, number, end).map_err(|e| io_error("reading", &path, e))? {
                return Err(damaged(
                    &path,
                    end,
                    "a record header there does not verify, and no part of it is unwritten",
                ));
            }
            // Torn: what follows is cut off and the file preallocated again, so that nothing written before can
            // verify later.
            file.set_len(end).map_err(|e| io_error("cutting", &path, e))?;
            file.sync_all().map_err(|e| io_error("syncing", &path, e))?;
            inner.end = end;
            inner.capacity = end.max(segment_bytes);
            inner.allocated = end + PREALLOCATE_BYTES;
            preallocate(&file, end, inner.allocated);
        }
        if inner.segments.is_empty() || sealed_last {
            let next = inner.segments.keys().next_back().map_or(1, |last| last + 1);
            log.start_segment(&mut inner, next, segment_bytes)?;
        }
        if inner.directory_dirty {
            log.sync_directory()?;
            inner.directory_dirty = false;
        }
        *log.lock() = inner;
        Ok(log)
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(segment_name(number))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes segment `number`, preallocated to `capacity`, the one appended to.
    fn start_segment(&self, inner: &mut Inner, number: u64, capacity: u64) -> Result<(), StorageError> {
        let path = self.path(number);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error("making", &path, e))?;
        inner.allocated = capacity.min(PREALLOCATE_BYTES);
        preallocate(&file, 0, inner.allocated);
        inner.segments.insert(number, Segment { file: Arc::new(file), live: 0 });
        inner.end = 0;
        inner.capacity = capacity;
        inner.directory_dirty = true;
        Ok(())
    }

    fn sync_directory(&self) -> Result<(), StorageError> {
        File::open(&self.dir).and_then(|dir| dir.sync_all()).map_err(|e| io_error("syncing", &self.dir, e))
    }

    /// Applies `writes` in order (readable at once, durable after [`SegmentLog::sync`]).
    pub fn write(&self, writes: &[LogWrite<'_>]) -> Result<(), StorageError> {
        let ends: Vec<[u8; 8]> = writes
            .iter()
            .map(|write| match write {
                LogWrite::Delete(keys) => keys.end.to_le_bytes(),
                _ => [0; 8],
            })
            .collect();
        let records: Vec<(Kind, u64, &[u8])> = writes
            .iter()
            .zip(&ends)
            .filter(|(write, _)| !matches!(write, LogWrite::Delete(keys) if keys.is_empty()))
            .map(|(write, end)| match write {
                LogWrite::Put(key, framed) => (Kind::Entry, *key, framed.as_ref()),
                LogWrite::Delete(keys) => (Kind::Delete, keys.start, &end[..]),
                LogWrite::PutMeta(key, framed) => (Kind::Meta, *key, framed.as_ref()),
                LogWrite::DeleteMeta(key) => (Kind::MetaDelete, *key, &[][..]),
            })
            .collect();
        let mut inner = self.lock();
        if inner.poisoned {
            return Err(StorageError::Poisoned);
        }
        let result = self.append(&mut inner, &records);
        if result.is_err() {
            inner.poisoned = true;
        }
        result
    }

    fn append(&self, inner: &mut Inner, records: &[(Kind, u64, &[u8])]) -> Result<(), StorageError> {
        let mut pending = Pending::default();
        for &(kind, key, body) in records {
            let size = (HEADER_BYTES + body.len()) as u64;
            // Room for this record and a seal after it, or a new segment.
            if inner.end + pending.len + size + HEADER_BYTES as u64 > inner.capacity
                && (inner.end > 0 || pending.len > 0)
            {
                let number = inner.last_segment();
                pending.push(number, Kind::Seal, 0, &[]);
                self.flush(inner, &mut pending)?;
                self.start_segment(inner, number + 1, self.segment_bytes.max(size + HEADER_BYTES as u64))?;
            }
            let number = inner.last_segment();
            let offset = inner.end + pending.len + HEADER_BYTES as u64;
            pending.push(number, kind, key, body);
            pending.applied.push((
                kind,
                key,
                Place { segment: number, offset, len: body.len() as u32 },
                delete_end(kind, body),
            ));
        }
        self.flush(inner, &mut pending)
    }

    /// Writes what is pending at the end of the last segment, headers and records in one vectored write (the
    /// records are not copied into a buffer first), and applies its records to the index.
    fn flush(&self, inner: &mut Inner, pending: &mut Pending<'_>) -> Result<(), StorageError> {
        let number = inner.last_segment();
        if pending.len > 0 {
            let file = inner.segments[&number].file.clone();
            let end = inner.end + pending.len;
            write_all_vectored_at(&file, &pending.slices(), inner.end)
                .map_err(|e| io_error("writing", &self.path(number), e))?;
            if end > inner.allocated {
                if pending.len < ZERO_AHEAD_BELOW {
                    inner.allocated = (end + PREALLOCATE_BYTES).min(inner.capacity).max(end);
                    preallocate(&file, end, inner.allocated);
                } else {
                    // Zeros ahead of a large append would double what it writes, for a sync that costs little
                    // beside the bytes it carries anyway.
                    inner.allocated = end;
                }
            }
            inner.end = end;
            if inner.dirty.last() != Some(&number) {
                inner.dirty.push(number);
            }
        }
        pending.headers.clear();
        pending.bodies.clear();
        pending.len = 0;
        for (kind, key, place, end) in pending.applied.drain(..) {
            inner.apply(kind, key, place, end);
        }
        Ok(())
    }

    /// Makes everything written so far durable, then deletes the oldest segments no record was left in when it
    /// began (what took their records out is durable now).
    pub fn sync(&self) -> Result<(), StorageError> {
        let (files, directory, empty) = {
            let mut inner = self.lock();
            if inner.poisoned {
                return Err(StorageError::Poisoned);
            }
            let dirty = std::mem::take(&mut inner.dirty);
            let files: Vec<(u64, Arc<File>)> =
                dirty.into_iter().filter_map(|n| inner.segments.get(&n).map(|s| (n, s.file.clone()))).collect();
            let last = inner.last_segment();
            let empty: Vec<u64> =
                inner.segments.iter().take_while(|(n, s)| **n != last && s.live == 0).map(|(n, _)| *n).collect();
            (files, std::mem::take(&mut inner.directory_dirty), empty)
        };
        let synced = files
            .iter()
            .try_for_each(|(number, file)| file.sync_data().map_err(|e| io_error("syncing", &self.path(*number), e)))
            .and_then(|()| if directory { self.sync_directory() } else { Ok(()) })
            .and_then(|()| self.delete(&empty));
        if synced.is_err() {
            self.lock().poisoned = true;
        }
        synced
    }

    /// Deletes segments `empty` (oldest first, none the one appended to, none holding a live record).
    fn delete(&self, empty: &[u64]) -> Result<(), StorageError> {
        if empty.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        for number in empty {
            // Another sync may have deleted it meanwhile.
            if inner.segments.remove(number).is_none() {
                continue;
            }
            inner.dirty.retain(|n| n != number);
            let path = self.path(*number);
            std::fs::remove_file(&path).map_err(|e| io_error("deleting", &path, e))?;
        }
        drop(inner);
        self.sync_directory()
    }

    /// The framed record under `key`.
    pub fn read(&self, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let found = {
            let inner = self.lock();
            inner.index.get(&key).map(|place| (*place, inner.segments[&place.segment].file.clone()))
        };
        found.map(|(place, file)| self.read_at(place, &file)).transpose()
    }

    /// The bytes `within` of the payload of the framed record under `key` (after its frame), not verified: one read of
    /// those bytes alone.
    pub fn read_part(&self, key: u64, within: Range<usize>) -> Result<Option<Vec<u8>>, StorageError> {
        let found = {
            let inner = self.lock();
            inner.index.get(&key).map(|place| (*place, inner.segments[&place.segment].file.clone()))
        };
        let Some((place, file)) = found else { return Ok(None) };
        let payload = (place.len as usize).saturating_sub(FRAME_BYTES);
        if within.start > within.end || within.end > payload {
            return Err(StorageError::Corrupt {
                space: Space::Log,
                key,
                reason: format!("bytes {within:?} asked of a {payload}-byte record"),
            });
        }
        let mut part = vec![0u8; within.end - within.start];
        let at = place.offset + (FRAME_BYTES + within.start) as u64;
        file.read_exact_at(&mut part, at).map_err(|e| io_error("reading", &self.path(place.segment), e))?;
        Ok(Some(part))
    }

    /// The framed record beside the log under `key`.
    pub fn read_meta(&self, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let found = {
            let inner = self.lock();
            inner.metas.get(&key).map(|place| (*place, inner.segments[&place.segment].file.clone()))
        };
        found.map(|(place, file)| self.read_at(place, &file)).transpose()
    }

    /// The keys of the records beside the log.
    pub fn meta_keys(&self) -> Vec<u64> {
        self.lock().metas.keys().copied().collect()
    }

    fn read_at(&self, place: Place, file: &File) -> Result<Vec<u8>, StorageError> {
        let mut framed = vec![0u8; place.len as usize];
        file.read_exact_at(&mut framed, place.offset).map_err(|e| io_error("reading", &self.path(place.segment), e))?;
        Ok(framed)
    }

    /// Up to `limit` framed records with keys in `keys`, in key order.
    pub fn scan(&self, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let places: Vec<(u64, Place, Arc<File>)> = {
            let inner = self.lock();
            inner
                .index
                .range(keys)
                .take(limit)
                .map(|(&key, place)| (key, *place, inner.segments[&place.segment].file.clone()))
                .collect()
        };
        places.into_iter().map(|(key, place, file)| Ok((key, self.read_at(place, &file)?))).collect()
    }

    /// The smallest and largest key held.
    pub fn bounds(&self) -> Option<(u64, u64)> {
        let inner = self.lock();
        Some((*inner.index.keys().next()?, *inner.index.keys().next_back()?))
    }

    /// The segment files on disk now, by number (for tests and the node's status).
    pub fn segments(&self) -> Vec<u64> {
        self.lock().segments.keys().copied().collect()
    }
}

/// Bytes of a disk sector: a write reaches the disk whole sectors at a time, or not at all.
const SECTOR_BYTES: u64 = 512;

/// Whether the record header at `end` of segment `number`, which stopped its replay, is what a write torn by a crash
/// leaves: a header that verifies but whose body runs past the file, a file that ends inside the header, or a header
/// with a part in a sector that was never written (zeros, as the preallocated file holds). A flipped bit or a write
/// gone astray leaves none of these.
fn torn_at(file: &File, number: u64, end: u64) -> std::io::Result<bool> {
    let len = file.metadata()?.len();
    if end + HEADER_BYTES as u64 > len {
        return Ok(true);
    }
    let mut header = [0u8; HEADER_BYTES];
    file.read_exact_at(&mut header, end)?;
    if decode(number, &header).is_some() {
        return Ok(true);
    }
    let mut at = end;
    while at < end + HEADER_BYTES as u64 {
        let sector_end = ((at / SECTOR_BYTES) + 1) * SECTOR_BYTES;
        let part = &header[(at - end) as usize..(sector_end.min(end + HEADER_BYTES as u64) - end) as usize];
        if part.iter().all(|byte| *byte == 0) {
            return Ok(true);
        }
        at = sector_end;
    }
    Ok(false)
}

fn damaged(path: &Path, at: u64, why: &str) -> StorageError {
    StorageError::Corrupt {
        space: super::Space::Log,
        key: 0,
        reason: format!(
            "log segment {} is damaged at byte {at}: {why}. The node does not start rather than lose the records after \
             it: move the node's store (DATA_DIR/store) aside and start it again; it repairs from a leader before it \
             votes",
            path.display()
        ),
    }
}

/// Where a delete record ends (the `u64` its body holds); 0 for other kinds.
fn delete_end(kind: Kind, body: &[u8]) -> u64 {
    match (kind, <[u8; 8]>::try_from(body)) {
        (Kind::Delete, Ok(bytes)) => u64::from_le_bytes(bytes),
        _ => 0,
    }
}

/// Replays segment `number` into `inner`'s index: where its records end, and whether it ended with a seal.
fn replay(inner: &mut Inner, number: u64, file: &File, path: &Path) -> Result<(u64, bool), StorageError> {
    let len = file.metadata().map_err(|e| io_error("reading", path, e))?.len();
    let mut window = Window { file, len, start: 0, bytes: Vec::new() };
    let mut offset = 0u64;
    loop {
        let Some(header) = window.get(offset, HEADER_BYTES).map_err(|e| io_error("reading", path, e))? else {
            return Ok((offset, false));
        };
        let header: &[u8; HEADER_BYTES] = header.try_into().expect("HEADER_BYTES long");
        let Some((kind, key, body)) = decode(number, header) else { return Ok((offset, false)) };
        let body_at = offset + HEADER_BYTES as u64;
        if body_at + u64::from(body) > len {
            return Ok((offset, false));
        }
        let end = match kind {
            Kind::Seal => return Ok((body_at, true)),
            Kind::Delete => match window.get(body_at, 8).map_err(|e| io_error("reading", path, e))? {
                Some(bytes) if body == 8 => u64::from_le_bytes(bytes.try_into().expect("8 bytes")),
                _ => return Ok((offset, false)),
            },
            _ => 0,
        };
        inner.apply(kind, key, Place { segment: number, offset: body_at, len: body }, end);
        offset = body_at + u64::from(body);
    }
}

/// Bytes of a segment read ahead while it is replayed: the headers of many small records come with one read, and the
/// body of a large one is skipped, never read.
const REPLAY_READ_BYTES: usize = 1 << 20;

/// A window on a segment's file, for its replay.
struct Window<'a> {
    file: &'a File,
    len: u64,
    start: u64,
    bytes: Vec<u8>,
}

impl Window<'_> {
    /// The `n` bytes at `offset`, read ahead if they are not in the window; `None` past the file's end.
    fn get(&mut self, offset: u64, n: usize) -> std::io::Result<Option<&[u8]>> {
        if offset + n as u64 > self.len {
            return Ok(None);
        }
        let inside = offset >= self.start && offset + n as u64 <= self.start + self.bytes.len() as u64;
        if !inside {
            let read = (self.len - offset).min(REPLAY_READ_BYTES as u64) as usize;
            self.bytes.resize(read.max(n), 0);
            self.file.read_exact_at(&mut self.bytes, offset)?;
            self.start = offset;
        }
        let at = (offset - self.start) as usize;
        Ok(Some(&self.bytes[at..at + n]))
    }
}

impl std::fmt::Debug for SegmentLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentLog").field("dir", &self.dir).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
