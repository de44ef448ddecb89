//! A snapshot on its way to a follower, streamed out of one store and into another: whatever the bodies add up to,
//! memory holds the cell's state (which the running node holds anyway) and at most one batch of bodies.
//!
//! The stream (integers little-endian):
//!
//! ```text
//! MAGIC (8 bytes) | TRANSFER_VERSION (u32) | file length (u64) | file
//! then, for every body the state refers to, in key order: key (u64) | length (u32) | bytes
//! ```
//!
//! The file is the stored snapshot file as the sender stored it: the cell's state without bodies (versioned and
//! checksummed on its own), its last log id and its membership. The sender reads each body from its store when the
//! stream reaches it, checked against the reference the state holds (key, length, crc32c); one that does not verify
//! is repaired from a peer's copy while the stream waits ([`BodySource::repair`]), or fails the stream. The receiver learns the
//! references from the file before any body arrives, checks each body against its reference as it arrives, and writes
//! the bodies to its own store in batches of about [`TRANSFER_BATCH_BYTES`], unsynced. Only when every body is in
//! does the state machine install the state, and that install is what it syncs.
//!
//! Bodies are keyed by a counter in the replicated state, so a body a receiver already holds under a key is the same
//! body the stream brings under it: writing the stream's bodies over the receiver's own changes nothing its current
//! state reads. What the new state no longer refers to is deleted when it is installed. A receiver that stops half way
//! leaves bodies its stored state does not refer to; the [`MetaKey::BodiesUnswept`] mark, written and synced before
//! the first of them, makes the next start delete them.
//!
//! A sender holds its store's bodies ([`Holds`]) while it reads them: no body is deleted meanwhile, even if a newer
//! snapshot is stored or installed (its deletes wait for a later one).
//!
//! Written by hand rather than with a file on disk: the stream is computed from the store on the fly and checked as it
//! arrives, and the same code must run in simulation, where there is no file system.

use std::io::{self, SeekFrom};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use cellog_core::BodyRef;
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;

use crate::storage::{Batch, MetaKey, Space, Storage};

/// The first bytes of every transfer stream.
pub const MAGIC: [u8; 8] = *b"CELLSNAP";
/// The layout of the stream this build sends and reads.
pub const TRANSFER_VERSION: u32 = 1;
/// Bodies a receiver gathers before it writes them to its store.
pub const TRANSFER_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Bytes before the file: magic, version, file length.
const PREAMBLE_BYTES: usize = 8 + 4 + 8;
/// Bytes before each body: key and length.
const BODY_HEADER_BYTES: usize = 8 + 4;

fn invalid(reason: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason.into())
}

fn record_len(body: &BodyRef) -> u64 {
    BODY_HEADER_BYTES as u64 + u64::from(body.len)
}

/// How many transfers are reading a store's bodies; while any is, no body is deleted.
#[derive(Clone, Debug, Default)]
pub struct Holds(Arc<AtomicUsize>);

impl Holds {
    /// Holds the bodies in place until the returned guard is dropped.
    pub fn hold(&self) -> Hold {
        self.0.fetch_add(1, Ordering::SeqCst);
        Hold(self.0.clone())
    }

    /// Whether a transfer is reading the bodies.
    pub fn held(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

/// A transfer's hold on a store's bodies, released when dropped.
#[derive(Debug)]
pub struct Hold(Arc<AtomicUsize>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The answer to a repair: the repaired body, or why there is none.
pub type Repaired = oneshot::Receiver<Result<Bytes, String>>;

/// Where a sender reads bodies from: each one checked against its reference.
pub trait BodySource: Send + Sync {
    /// The body `body` refers to, verified, or why it cannot be read (damage).
    fn body(&self, body: &BodyRef) -> Result<Bytes, String>;

    /// Damage [`BodySource::body`] found (`reason`): a repair whose answer the stream waits for, or `None` when there
    /// is none to wait for (the source has recorded the damage, and the stream fails).
    fn repair(&self, body: &BodyRef, reason: &str) -> Option<Repaired>;
}

/// The data of a snapshot as openraft hands it around.
pub enum SnapshotData {
    /// Nothing: the stored snapshot's meta, answered at start without reading anything. It reads as an empty stream,
    /// which no receiver installs.
    Empty,
    /// The stored snapshot, read from the store as it is sent.
    Outgoing(Outgoing),
    /// A snapshot being received into the store.
    Incoming(Incoming),
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotData::Empty => f.write_str("SnapshotData::Empty"),
            SnapshotData::Outgoing(out) => write!(f, "SnapshotData::Outgoing({} bytes, at {})", out.len, out.pos),
            SnapshotData::Incoming(incoming) => write!(f, "SnapshotData::Incoming(at {})", incoming.taken),
        }
    }
}

/// The stream of a stored snapshot, read on demand: the file is in memory, each body is read from the store when
/// the stream reaches it. Seeks anywhere (a chunk is sent again after a network error) without reading the bodies
/// it passes.
pub struct Outgoing {
    /// Preamble and file.
    head: Vec<u8>,
    /// The bodies the file's state refers to, in key order.
    bodies: Vec<BodyRef>,
    source: Arc<dyn BodySource>,
    len: u64,
    pos: u64,
    /// The record being read: its index in `bodies`, where it starts in the stream, and its bytes.
    current: Option<(usize, u64, Vec<u8>)>,
    /// A record's index and where it starts, so that reading forward walks from there.
    walk: (usize, u64),
    /// The repair of a damaged body the stream has reached: its key, and the answer to come.
    repairing: Option<(u64, Repaired)>,
    /// A repaired body, by key, for the record being read.
    repaired: Option<(u64, Bytes)>,
    _hold: Hold,
}

impl Outgoing {
    /// The stream of `file` (a stored snapshot file) whose state refers to `bodies`, read from `source`; `hold` keeps
    /// the bodies in place until the stream is dropped.
    pub fn new(file: &[u8], mut bodies: Vec<BodyRef>, source: Arc<dyn BodySource>, hold: Hold) -> Self {
        bodies.sort_by_key(|body| body.key);
        let mut head = Vec::with_capacity(PREAMBLE_BYTES + file.len());
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&TRANSFER_VERSION.to_le_bytes());
        head.extend_from_slice(&(file.len() as u64).to_le_bytes());
        head.extend_from_slice(file);
        let len = head.len() as u64 + bodies.iter().map(record_len).sum::<u64>();
        let walk = (0, head.len() as u64);
        Outgoing {
            head,
            bodies,
            source,
            len,
            pos: 0,
            current: None,
            walk,
            repairing: None,
            repaired: None,
            _hold: hold,
        }
    }

    /// The stream's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the stream is empty (it never is: the preamble is always there).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads from the current position into `out`: how much (0 at the end), or pending while a damaged body the
    /// stream has reached is repaired.
    fn poll_read_into(&mut self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        loop {
            if let Some((key, answer)) = &mut self.repairing {
                let key = *key;
                let repaired = match Pin::new(answer).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(repaired)) => repaired,
                    Poll::Ready(Err(_)) => Err("the node's repairs stopped".to_string()),
                };
                self.repairing = None;
                match repaired {
                    Ok(bytes) => self.repaired = Some((key, bytes)),
                    Err(reason) => {
                        return Poll::Ready(Err(io::Error::other(format!("the snapshot's body {key}: {reason}"))));
                    }
                }
            }
            match self.read_into(out) {
                Ok(Some(n)) => return Poll::Ready(Ok(n)),
                Ok(None) => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    /// Reads from the current position into `out`: how much (0 at the end), or `None` when a damaged body is to be
    /// repaired first (`repairing` is set).
    fn read_into(&mut self, out: &mut [u8]) -> io::Result<Option<usize>> {
        if self.pos >= self.len || out.is_empty() {
            return Ok(Some(0));
        }
        let head_len = self.head.len() as u64;
        if self.pos < head_len {
            let from = &self.head[self.pos as usize..];
            let n = from.len().min(out.len());
            out[..n].copy_from_slice(&from[..n]);
            self.pos += n as u64;
            return Ok(Some(n));
        }
        let covers =
            |&(_, start, ref bytes): &(usize, u64, Vec<u8>)| start <= self.pos && self.pos < start + bytes.len() as u64;
        if !self.current.as_ref().is_some_and(covers) {
            if self.walk.1 > self.pos {
                self.walk = (0, head_len);
            }
            while self.walk.1 + record_len(&self.bodies[self.walk.0]) <= self.pos {
                self.walk = (self.walk.0 + 1, self.walk.1 + record_len(&self.bodies[self.walk.0]));
            }
            let (index, start) = self.walk;
            let body = self.bodies[index];
            let bytes = match self.repaired.take() {
                Some((key, bytes)) if key == body.key => bytes,
                _ => match self.source.body(&body) {
                    Ok(bytes) => bytes,
                    Err(reason) => match self.source.repair(&body, &reason) {
                        Some(answer) => {
                            self.repairing = Some((body.key, answer));
                            return Ok(None);
                        }
                        None => return Err(io::Error::other(format!("the snapshot's body {}: {reason}", body.key))),
                    },
                },
            };
            let mut record = Vec::with_capacity(BODY_HEADER_BYTES + bytes.len());
            record.extend_from_slice(&body.key.to_le_bytes());
            record.extend_from_slice(&body.len.to_le_bytes());
            record.extend_from_slice(&bytes);
            self.current = Some((index, start, record));
        }
        let (_, start, record) = self.current.as_ref().expect("set above");
        let from = &record[(self.pos - start) as usize..];
        let n = from.len().min(out.len());
        out[..n].copy_from_slice(&from[..n]);
        self.pos += n as u64;
        Ok(Some(n))
    }
}

/// What a receiver has taken so far.
enum Phase {
    /// Magic, version and file length.
    Preamble,
    /// The file, `len` bytes long.
    File { len: usize },
    /// The bodies: the next one expected is `bodies[next]`.
    Bodies { next: usize },
}

/// A snapshot stream being received: the file kept in memory, the bodies written to the store as they arrive.
pub struct Incoming {
    storage: Arc<dyn Storage>,
    /// The references of a file's state, or why the file is not one this node can install.
    references: fn(&[u8]) -> Result<Vec<BodyRef>, String>,
    phase: Phase,
    /// The part of the current item (preamble, file, body record) taken so far.
    item: Vec<u8>,
    file: Vec<u8>,
    bodies: Vec<BodyRef>,
    batch: Batch,
    batch_bytes: usize,
    /// Whether the store carries the unswept mark for this stream's bodies.
    marked: bool,
    /// Bytes of the stream taken.
    taken: u64,
    /// Bytes to drop before taking more: a range sent again after this receiver took it.
    skip: u64,
    /// The first error: a stream that went wrong once is never installed.
    failed: Option<String>,
    /// The whole stream, once it ended with every body in.
    received: Option<Received>,
}

/// A received snapshot, every body written to the store (unsynced): the file for the state machine to install.
#[derive(Debug)]
pub struct Received {
    /// The stored snapshot file the sender sent.
    pub file: Vec<u8>,
    /// The bodies its state refers to, in key order, every one of them in the store.
    pub bodies: Vec<BodyRef>,
}

impl Incoming {
    /// A receiver writing into `storage`; `references` reads the body references of the state in a file.
    pub fn new(storage: Arc<dyn Storage>, references: fn(&[u8]) -> Result<Vec<BodyRef>, String>) -> Self {
        Incoming {
            storage,
            references,
            phase: Phase::Preamble,
            item: Vec::new(),
            file: Vec::new(),
            bodies: Vec::new(),
            batch: Batch::new(),
            batch_bytes: 0,
            marked: false,
            taken: 0,
            skip: 0,
            failed: None,
            received: None,
        }
    }

    fn fail<T>(&mut self, error: io::Error) -> io::Result<T> {
        self.failed.get_or_insert_with(|| error.to_string());
        Err(error)
    }

    /// Takes the next bytes of the stream.
    fn take(&mut self, mut data: &[u8]) -> io::Result<()> {
        if let Some(reason) = &self.failed {
            return Err(invalid(format!("the snapshot stream already failed: {reason}")));
        }
        let resent = usize::try_from(self.skip).unwrap_or(usize::MAX).min(data.len());
        self.skip -= resent as u64;
        data = &data[resent..];
        while !data.is_empty() {
            let step = self.step(data);
            match step {
                Ok(used) => {
                    self.taken += used as u64;
                    data = &data[used..];
                }
                Err(error) => return self.fail(error),
            }
        }
        Ok(())
    }

    /// Takes what the current item still needs from `data`, and acts on the item once it is whole.
    fn step(&mut self, data: &[u8]) -> io::Result<usize> {
        let want = match self.phase {
            Phase::Preamble => PREAMBLE_BYTES,
            Phase::File { len } => len,
            Phase::Bodies { next } => match self.bodies.get(next) {
                Some(body) => {
                    if self.item.len() < BODY_HEADER_BYTES {
                        BODY_HEADER_BYTES
                    } else {
                        BODY_HEADER_BYTES + body.len as usize
                    }
                }
                None => return Err(invalid("bytes past the last body of the snapshot")),
            },
        };
        let used = (want - self.item.len()).min(data.len());
        self.item.extend_from_slice(&data[..used]);
        if self.item.len() < want {
            return Ok(used);
        }
        match self.phase {
            Phase::Preamble => {
                if self.item[..8] != MAGIC {
                    return Err(invalid("not a snapshot stream of this cell's nodes"));
                }
                let version = u32::from_le_bytes(self.item[8..12].try_into().expect("4 bytes"));
                if version != TRANSFER_VERSION {
                    return Err(invalid(format!(
                        "a snapshot stream of version {version}; this build reads version {TRANSFER_VERSION}"
                    )));
                }
                let len = u64::from_le_bytes(self.item[12..20].try_into().expect("8 bytes"));
                let no_room = || invalid(format!("no memory for a snapshot file of {len} bytes"));
                let len = usize::try_from(len).map_err(|_| no_room())?;
                self.item = Vec::new();
                self.item.try_reserve_exact(len).map_err(|_| no_room())?;
                self.phase = Phase::File { len };
            }
            Phase::File { .. } => {
                self.file = std::mem::take(&mut self.item);
                self.bodies = (self.references)(&self.file).map_err(invalid)?;
                self.phase = Phase::Bodies { next: 0 };
            }
            Phase::Bodies { next } => {
                if self.item.len() == BODY_HEADER_BYTES {
                    let expected = self.bodies[next];
                    let key = u64::from_le_bytes(self.item[..8].try_into().expect("8 bytes"));
                    let len = u32::from_le_bytes(self.item[8..12].try_into().expect("4 bytes"));
                    if (key, len) != (expected.key, expected.len) {
                        return Err(invalid(format!(
                            "the snapshot's body {next} is key {key} of {len} bytes; its state says key {} of {} bytes",
                            expected.key, expected.len
                        )));
                    }
                    if len > 0 {
                        return Ok(used);
                    }
                }
                let body = &self.item[BODY_HEADER_BYTES..];
                self.bodies[next].verify(body).map_err(invalid)?;
                self.batch.put(Space::Bodies, self.bodies[next].key, body);
                self.batch_bytes += body.len();
                self.item.clear();
                self.phase = Phase::Bodies { next: next + 1 };
                if self.batch_bytes >= TRANSFER_BATCH_BYTES {
                    self.write_batch()?;
                }
            }
        }
        Ok(used)
    }

    /// Writes the gathered bodies (unsynced), after the unswept mark (synced) the first time.
    fn write_batch(&mut self) -> io::Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        if batch.is_empty() {
            return Ok(());
        }
        let storage_error = |error: crate::storage::StorageError| io::Error::other(error.to_string());
        if !self.marked {
            let mut mark = Batch::new();
            mark.put(Space::Meta, MetaKey::BodiesUnswept as u64, &[]);
            self.storage.write(mark).and_then(|()| self.storage.sync()).map_err(storage_error)?;
            self.marked = true;
        }
        self.storage.write(batch).map_err(storage_error)
    }

    /// Moves the position back to `offset` (a range sent again); forward past what was taken is a gap.
    fn seek(&mut self, offset: u64) -> io::Result<u64> {
        if offset > self.taken {
            return self.fail(invalid(format!(
                "the snapshot stream jumps to byte {offset}; only {} were received",
                self.taken
            )));
        }
        self.skip = self.taken - offset;
        Ok(offset)
    }

    /// Ends the stream: every body must be in. Writes the last bodies and keeps the file for
    /// [`Incoming::into_received`]. Called when the last chunk arrives, before openraft hands the snapshot to the state
    /// machine: a stream that is not whole fails here, as an answer to its sender, and never reaches the install.
    fn finish(&mut self) -> io::Result<()> {
        if let Some(reason) = &self.failed {
            return Err(invalid(format!("the snapshot stream failed: {reason}")));
        }
        let complete = matches!(self.phase, Phase::Bodies { next } if next == self.bodies.len());
        if !complete || self.skip > 0 {
            return self.fail(invalid(format!("the snapshot stream ended early, after {} bytes", self.taken)));
        }
        if let Err(error) = self.write_batch() {
            return self.fail(error);
        }
        self.received =
            Some(Received { file: std::mem::take(&mut self.file), bodies: std::mem::take(&mut self.bodies) });
        Ok(())
    }

    /// Takes the whole of `stream` from where it stands, as if it came over the network, and ends it: a snapshot
    /// handed over within a process still goes through the same checks and the same bounded batches.
    /// A damaged body is not waited for here: the stream fails, and its repair goes on.
    pub fn take_all(&mut self, stream: &mut Outgoing) -> io::Result<()> {
        let mut chunk = vec![0; 64 * 1024];
        loop {
            let n = stream.read_into(&mut chunk)?.ok_or_else(|| {
                let key = stream.repairing.as_ref().map_or(0, |(key, _)| *key);
                io::Error::other(format!("the snapshot's body {key} is damaged, and being repaired"))
            })?;
            if n == 0 {
                return self.finish();
            }
            self.take(&chunk[..n])?;
        }
    }

    /// The received snapshot, if the stream ended whole.
    pub fn into_received(self) -> Option<Received> {
        self.received
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            SnapshotData::Empty => Poll::Ready(Ok(())),
            SnapshotData::Outgoing(out) => {
                out.poll_read_into(cx, buf.initialize_unfilled()).map(|read| read.map(|n| buf.advance(n)))
            }
            SnapshotData::Incoming(_) => Poll::Ready(Err(io::Error::other("a snapshot being received is not read"))),
        }
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let result = match self.get_mut() {
            SnapshotData::Incoming(incoming) => incoming.take(data).map(|()| data.len()),
            _ => Err(io::Error::other("only a snapshot being received is written")),
        };
        Poll::Ready(result)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(match self.get_mut() {
            SnapshotData::Incoming(incoming) => incoming.finish(),
            _ => Ok(()),
        })
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match self.get_mut() {
            SnapshotData::Empty => Ok(()),
            SnapshotData::Outgoing(out) => {
                let target = match position {
                    SeekFrom::Start(offset) => Some(offset),
                    SeekFrom::End(delta) => out.len.checked_add_signed(delta),
                    SeekFrom::Current(delta) => out.pos.checked_add_signed(delta),
                };
                match target {
                    Some(target) if target <= out.len => {
                        out.pos = target;
                        Ok(())
                    }
                    _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "a seek outside the snapshot stream")),
                }
            }
            SnapshotData::Incoming(incoming) => match position {
                SeekFrom::Start(offset) => incoming.seek(offset).map(drop),
                _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "a received snapshot seeks from its start only")),
            },
        }
    }

    fn poll_complete(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(match self.get_mut() {
            SnapshotData::Empty => 0,
            SnapshotData::Outgoing(out) => out.pos,
            SnapshotData::Incoming(incoming) => incoming.taken - incoming.skip,
        }))
    }
}
