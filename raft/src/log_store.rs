//! openraft's log storage over a [`Storage`]: entries, the vote, the committed and last purged log ids.
//!
//! Every append is written and synced before openraft is told it is flushed, so an entry this node acknowledges to
//! a leader is on its disk. The write happens in `append` (so the entries are readable when it returns, as openraft
//! requires); the sync happens after, in the store's [`Flusher`], which syncs once for every append written before it
//! and then reports each of them flushed, in order. So Raft prepares, replicates and appends the next entries while
//! the disk syncs the last ones (group commit), and [`crate::CellNode`] packs concurrent proposals into each entry.
//!
//! The store keeps the stored size of every entry in the log ([`LogSizes`]), so that the node can bound the bytes of
//! log kept behind a snapshot as well as their count.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{EntryPayload, LogState, OptionalSend, RaftLogReader, StorageIOError, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::runtime::off_the_workers;
use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};
use crate::types::{Entry, LogId, NodeId, RaftStorageError, TypeConfig};

/// The log half of a node's storage.
#[derive(Clone, Debug)]
pub struct LogStore<S> {
    storage: S,
    sizes: LogSizes,
    flusher: Flusher,
    recent: Recent,
    committed: CommittedHint,
}

/// The commit index Raft last saved, until the next append writes it: a hint (see [`LogStore::save_committed`]) that
/// rides in the next append's batch rather than costing a write of its own, which on a leader sits between an entry's
/// commit and its apply, and on a follower in every heartbeat that moves the commit index.
#[derive(Clone, Debug, Default)]
struct CommittedHint(Arc<Mutex<Option<Option<LogId>>>>);

impl CommittedHint {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Option<LogId>>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The most bytes of log (as stored) [`Recent`] keeps.
const RECENT_BYTES: u64 = 32 << 20;

/// The newest entries of the log as they were appended, so that what Raft reads back of what it just wrote (to apply
/// it, and on a leader once more for each follower it sends it to) is not read, verified and decoded from storage
/// again. Always the log's tail, contiguous: every append, truncation and purge goes through the store and changes
/// it too, and a node starts with it empty. Older entries, and every read reaching before it, come from storage.
#[derive(Clone, Debug, Default)]
struct Recent(Arc<Mutex<RecentEntries>>);

#[derive(Debug, Default)]
struct RecentEntries {
    /// Contiguous by index, each with its stored size.
    entries: std::collections::VecDeque<(Entry, u64)>,
    bytes: u64,
}

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, RecentEntries> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes entries appended after a truncation to `first` (what was kept from `first` on is gone).
    fn appended(&self, first: u64, appended: Vec<(Entry, u64)>) {
        let mut recent = self.lock();
        recent.truncate(first);
        let follows = recent.entries.back().is_none_or(|(last, _)| last.log_id.index.checked_add(1) == Some(first));
        if !follows {
            // A gap (a snapshot installed past the log's end): the tail starts again here.
            recent.entries.clear();
            recent.bytes = 0;
        }
        for (entry, size) in appended {
            recent.bytes += size;
            recent.entries.push_back((entry, size));
        }
        while recent.bytes > RECENT_BYTES {
            let Some((_, size)) = recent.entries.pop_front() else { break };
            recent.bytes -= size;
        }
    }

    /// The entries of `range` if they are all held, or the log's end comes first.
    fn read(&self, range: &std::ops::Range<u64>) -> Option<Vec<Entry>> {
        let recent = self.lock();
        let first = recent.entries.front()?.0.log_id.index;
        if range.start < first {
            return None;
        }
        let skip = usize::try_from(range.start - first).ok()?;
        let take = usize::try_from(range.end.saturating_sub(range.start)).unwrap_or(usize::MAX);
        Some(recent.entries.iter().skip(skip).take(take).map(|(entry, _)| entry.clone()).collect())
    }
}

impl RecentEntries {
    /// Forgets the entries from `index` on.
    fn truncate(&mut self, index: u64) {
        while let Some((last, size)) = self.entries.back() {
            if last.log_id.index < index {
                break;
            }
            self.bytes -= size;
            self.entries.pop_back();
        }
    }

    /// Forgets the entries up to `index`.
    fn purge(&mut self, index: u64) {
        while let Some((first, size)) = self.entries.front() {
            if first.log_id.index > index {
                break;
            }
            self.bytes -= size;
            self.entries.pop_front();
        }
    }
}

/// Appends written and waiting for a sync, and the task that syncs them: started by the first append (on the node's
/// runtime), it takes every append waiting, syncs once, and reports each flushed in the order they were written.
/// (A thread of its own blocked in the sync, sparing the hop through the blocking pool, measured no faster.)
///
/// Written by hand rather than with a crate: the group commit's correctness (a report only after a sync that began
/// after the write) is the durability promise, and under simulation the task must run on the node's runtime.
#[derive(Clone, Debug, Default)]
struct Flusher(Arc<Mutex<Option<mpsc::UnboundedSender<Callback>>>>);

type Callback = LogFlushed<TypeConfig>;

impl Flusher {
    /// Hands over the callback of an append already written to `storage`, starting the task that syncs if it is not
    /// running.
    fn flushed_later<S: Storage + Clone>(&self, storage: &S, callback: Callback) {
        let mut waiting = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let callback = match waiting.as_ref() {
            Some(running) => match running.send(callback) {
                Ok(()) => return,
                // The task is gone (its node's runtime stopped it): a new one takes over.
                Err(mpsc::error::SendError(callback)) => callback,
            },
            None => callback,
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        sender.send(callback).expect("the receiver is held");
        *waiting = Some(sender);
        tokio::spawn(flush(storage.clone(), receiver));
    }
}

/// Syncs `storage` for the appends whose callbacks arrive on `waiting`, many per sync, until every sender is gone.
async fn flush<S: Storage + Clone>(storage: S, mut waiting: mpsc::UnboundedReceiver<Callback>) {
    let mut callbacks = Vec::new();
    while waiting.recv_many(&mut callbacks, usize::MAX).await > 0 {
        let delay = storage.sync_delay();
        let result = if delay.is_zero() {
            let storage = storage.clone();
            off_the_workers(move || storage.sync()).await
        } else {
            // A simulated device: the sync takes the disk's time on the runtime's clock and covers what was written
            // before it ends.
            tokio::time::sleep(delay).await;
            while let Ok(callback) = waiting.try_recv() {
                callbacks.push(callback);
            }
            storage.sync()
        };
        for callback in callbacks.drain(..) {
            callback.log_io_completed(result.clone().map_err(|error| std::io::Error::other(error.to_string())));
        }
    }
}

/// The stored size of each entry in a node's log, by index: filled when the log is verified at start, kept as
/// entries are appended, truncated and purged.
///
/// Each entry also holds the running total of the sizes through it, so that the bytes between two indexes are two
/// lookups rather than a walk: the node asks every 200 ms, for its log budget, and appends wait for the same lock.
#[derive(Clone, Debug, Default)]
pub struct LogSizes(Arc<Mutex<BTreeMap<u64, Size>>>);

/// An entry's stored size, and the sizes of the held entries through it added to those of the entries purged before
/// them (since the map was last empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size {
    bytes: u64,
    total: u64,
}

impl LogSizes {
    fn sizes(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Size>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the stored size of the entry at `index`.
    pub fn insert(&self, index: u64, bytes: u64) {
        let mut sizes = self.sizes();
        // Entries are appended after the last, or after a truncation; one written again in place moves the totals of
        // those after it.
        let mut after = BTreeMap::new();
        if sizes.last_key_value().is_some_and(|(&last, _)| last >= index) {
            after = sizes.split_off(&index);
            after.remove(&index);
        }
        let before = sizes.last_key_value().map_or_else(|| base(&after), |(_, size)| size.total);
        let mut total = before.saturating_add(bytes);
        sizes.insert(index, Size { bytes, total });
        for (index, size) in after {
            total = total.saturating_add(size.bytes);
            sizes.insert(index, Size { bytes: size.bytes, total });
        }
    }

    /// Forgets every entry at `index` and after.
    fn remove_from(&self, index: u64) {
        self.sizes().split_off(&index);
    }

    /// Forgets every entry up to `index`, inclusive.
    fn remove_up_to(&self, index: u64) {
        let mut sizes = self.sizes();
        *sizes = sizes.split_off(&index.saturating_add(1));
    }

    /// Forgets everything.
    pub fn clear(&self) {
        self.sizes().clear();
    }

    /// The stored bytes of the entries from `from` to `to`, inclusive.
    pub fn bytes_between(&self, from: u64, to: u64) -> u64 {
        if from > to {
            return 0;
        }
        let sizes = self.sizes();
        let through = |end: std::ops::Bound<u64>| {
            let before = sizes.range((std::ops::Bound::Unbounded, end)).next_back();
            before.map_or_else(|| base(&sizes), |(_, size)| size.total)
        };
        through(std::ops::Bound::Included(to)).saturating_sub(through(std::ops::Bound::Excluded(from)))
    }

    /// The index to purge up to (inclusive) so that the entries kept at or before `snapshot` add up to at most
    /// `budget` bytes; `None` when they already do.
    pub fn purge_for(&self, snapshot: u64, budget: u64) -> Option<u64> {
        let mut kept = 0u64;
        for (&index, size) in self.sizes().range(..=snapshot).rev() {
            kept = kept.saturating_add(size.bytes);
            if kept > budget {
                return Some(index);
            }
        }
        None
    }
}

/// The total before the first entry of `sizes`: the sizes of the entries purged before it.
fn base(sizes: &BTreeMap<u64, Size>) -> u64 {
    sizes.first_key_value().map_or(0, |(_, size)| size.total.saturating_sub(size.bytes))
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("encoding into memory does not fail")
}

fn decode<T: DeserializeOwned>(space: Space, key: u64, bytes: &[u8]) -> Result<T, StorageError> {
    postcard::from_bytes(bytes).map_err(|error| StorageError::Corrupt {
        space,
        key,
        reason: format!("verified record does not decode: {error}"),
    })
}

/// Reads and decodes a meta record.
pub(crate) fn read_meta<S: Storage, T: DeserializeOwned>(storage: &S, key: MetaKey) -> Result<Option<T>, StorageError> {
    storage.get(Space::Meta, key as u64)?.map(|bytes| decode(Space::Meta, key as u64, &bytes)).transpose()
}

/// Decodes the log entry stored at `index` (the payload of its framed record), refusing one that holds another
/// index's entry.
pub fn decode_entry(index: u64, bytes: &[u8]) -> Result<Entry, StorageError> {
    let entry: Entry = decode(Space::Log, index, bytes)?;
    if entry.log_id.index != index {
        return Err(StorageError::Corrupt {
            space: Space::Log,
            key: index,
            reason: format!("holds the entry of index {}", entry.log_id.index),
        });
    }
    Ok(entry)
}

fn range_of(range: impl RangeBounds<u64>) -> std::ops::Range<u64> {
    let start = match range.start_bound() {
        Bound::Included(start) => *start,
        Bound::Excluded(start) => start.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(end) => end.saturating_add(1),
        Bound::Excluded(end) => *end,
        Bound::Unbounded => u64::MAX,
    };
    start..end
}

fn read_error(error: StorageError) -> RaftStorageError {
    StorageIOError::read_logs(openraft::AnyError::new(&error)).into()
}

fn write_error(error: StorageError) -> RaftStorageError {
    StorageIOError::write_logs(openraft::AnyError::new(&error)).into()
}

impl<S: Storage + Clone> LogStore<S> {
    /// The log store over `storage`, whose log entries have the stored `sizes`.
    pub fn new(storage: S, sizes: LogSizes) -> Self {
        LogStore {
            storage,
            sizes,
            flusher: Flusher::default(),
            recent: Recent::default(),
            committed: CommittedHint::default(),
        }
    }

    /// The stored size of each entry, shared with the store as it changes.
    pub fn sizes(&self) -> LogSizes {
        self.sizes.clone()
    }

    /// Writes and syncs, off the runtime's workers on a real device, waiting out a simulated device's sync time on
    /// the runtime's clock.
    async fn write_synced(&self, batch: Batch) -> Result<(), StorageError> {
        let delay = self.storage.sync_delay();
        if delay.is_zero() {
            let storage = self.storage.clone();
            return off_the_workers(move || storage.write(batch).and_then(|()| storage.sync())).await;
        }
        self.storage.write(batch)?;
        tokio::time::sleep(delay).await;
        self.storage.sync()
    }

    /// The commit index last saved: the hint the next append writes, or else the one stored (`None` if there is none).
    fn saved_committed(&self) -> Result<Option<Option<LogId>>, StorageError> {
        match *self.committed.lock() {
            Some(committed) => Ok(Some(committed)),
            None => read_meta(&self.storage, MetaKey::Committed),
        }
    }

    /// The id of the last entry in the log, if any.
    pub fn last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        match self.storage.key_bounds(Space::Log)? {
            Some((_, last)) => {
                let bytes = self.storage.get(Space::Log, last)?.expect("the last key exists");
                Ok(Some(decode_entry(last, &bytes)?.log_id))
            }
            None => Ok(None),
        }
    }
}

impl<S: Storage + Clone> RaftLogReader<TypeConfig> for LogStore<S> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        // In place: Raft reads what it just wrote (applying, replicating), which the store serves from memory; a hop to
        // a blocking thread per read cost more than it saved (consume at R1 was about a fifth slower).
        self.read_entries(range_of(range))
    }
}

impl<S: Storage + Clone> LogStore<S> {
    /// The entries in `range`, contiguous: the recent ones as appended, older ones read and verified.
    fn read_entries(&self, range: std::ops::Range<u64>) -> Result<Vec<Entry>, RaftStorageError> {
        if let Some(entries) = self.recent.read(&range) {
            return Ok(entries);
        }
        let records = self.storage.scan(Space::Log, range.clone(), usize::MAX).map_err(read_error)?;
        // Entries come back contiguous from the start of the range, or from the first stored entry when the range
        // reaches back into the purged part (a shorter tail is fine: the log may end sooner).
        // A hole is damage (a write that went astray), never something to skip: an entry applied or replicated past
        // a hole would make this replica differ from the others without any checksum failing.
        if records.is_empty()
            && range.start < range.end
            && let Some((first, last)) = self.storage.key_bounds(Space::Log).map_err(read_error)?
            && (first..=last).contains(&range.start)
        {
            let reason = format!("entry {} is missing (the log holds {first} to {last})", range.start);
            return Err(read_error(StorageError::Corrupt { space: Space::Log, key: range.start, reason }));
        }
        let mut start = range.start;
        if let Some(&(first, _)) = records.first()
            && first > start
            && self.storage.key_bounds(Space::Log).map_err(read_error)?.is_some_and(|(stored, _)| stored == first)
        {
            // What comes before the first stored entry was purged: the entries start there.
            start = first;
        }
        let mut entries = Vec::with_capacity(records.len());
        for (expected, (index, bytes)) in (start..).zip(records) {
            if index != expected {
                let reason = format!("entry {expected} is missing (the next stored is {index})");
                return Err(read_error(StorageError::Corrupt { space: Space::Log, key: expected, reason }));
            }
            entries.push(decode_entry(index, &bytes).map_err(read_error)?);
        }
        Ok(entries)
    }
}

impl<S: Storage + Clone> RaftLogStorage<TypeConfig> for LogStore<S> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let last_purged_log_id: Option<LogId> = read_meta(&self.storage, MetaKey::LastPurged).map_err(read_error)?;
        let last_log_id = self.last_log_id().map_err(read_error)?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), RaftStorageError> {
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::Vote as u64, &encode(vote));
        self.write_synced(batch)
            .await
            .map_err(|error| StorageIOError::write_vote(openraft::AnyError::new(&error)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, RaftStorageError> {
        read_meta(&self.storage, MetaKey::Vote)
            .map_err(|error| StorageIOError::read_vote(openraft::AnyError::new(&error)).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        // A hint that lets a restarted node re-apply committed entries at once. It needs no sync of its own, since it
        // never runs ahead of what the next synced append makes durable, nor a write of its own: the next append
        // writes it in its batch, so a restart finds it at most one append behind, or not at all (the node then
        // learns the rest at the next commit: a follower from its leader, a leader from its own first entry).
        *self.committed.lock() = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        match self.saved_committed() {
            Ok(committed) => Ok(committed.flatten()),
            // Only a hint: without it the node waits for the leader to say what is committed.
            Err(StorageError::Corrupt { .. }) => Ok(None),
            Err(error) => Err(read_error(error)),
        }
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = Batch::new();
        let mut appended = Vec::new();
        for mut entry in entries {
            // Encoded once, into the record as it is stored (sized first: a payload is not copied again as the buffer
            // grows). Where the entry's payloads land is kept with it, so that applying it can leave them in the log.
            let encoded = postcard::serialize_with_flavor(&entry, postcard::ser_flavors::Size::default())
                .expect("sizing an encoding does not fail");
            let mut record = Vec::with_capacity(crate::storage::FRAME_BYTES + encoded);
            record.resize(crate::storage::FRAME_BYTES, 0);
            let (record, placed) = crate::in_log::encode_placing(&entry, record);
            if let EntryPayload::Normal(request) = &mut entry.payload {
                request.placed = placed;
            }
            let size = record.len() as u64;
            self.sizes.insert(entry.log_id.index, size);
            batch.put_encoded(Space::Log, entry.log_id.index, record);
            appended.push((entry, size));
        }
        let first = appended.first().map(|(entry, _)| entry.log_id.index);
        if let Some((last, _)) = appended.last() {
            batch.put(Space::Meta, MetaKey::SyncedLog as u64, &encode(&last.log_id.index));
        }
        // Taken before the write: if it fails, the store is poisoned, and a hint is only a hint.
        if let Some(committed) = self.committed.lock().take() {
            batch.put(Space::Meta, MetaKey::Committed as u64, &encode(&committed));
        }
        // Written now, so that the entries are readable when this returns; flushed once a sync after the write ends.
        if let Err(error) = self.storage.write(batch) {
            if let Some(first) = first {
                self.recent.lock().truncate(first);
            }
            callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
            return Err(write_error(error));
        }
        if let Some(first) = first {
            self.recent.appended(first, appended);
        }
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::AckBeforeFsync) {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.flusher.flushed_later(&self.storage, callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        self.sizes.remove_from(log_id.index);
        self.recent.lock().truncate(log_id.index);
        let mut batch = Batch::new();
        batch.delete_range(Space::Log, log_id.index..u64::MAX);
        match log_id.index.checked_sub(1) {
            Some(last) => batch.put(Space::Meta, MetaKey::SyncedLog as u64, &encode(&last)),
            None => batch.delete_range(Space::Meta, MetaKey::SyncedLog as u64..MetaKey::SyncedLog as u64 + 1),
        };
        self.write_synced(batch).await.map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::LastPurged as u64, &encode(&log_id));
        #[cfg(madsim)]
        let up_to = if cellog_planted::active(cellog_planted::Mutant::PurgePastDurable) {
            let committed = self.saved_committed().ok().flatten().flatten();
            committed.map_or(log_id.index, |committed| committed.index.max(log_id.index))
        } else {
            log_id.index
        };
        #[cfg(not(madsim))]
        let up_to = log_id.index;
        batch.delete_range(Space::Log, 0..up_to.saturating_add(1));
        self.sizes.remove_up_to(up_to);
        self.recent.lock().purge(up_to);
        self.write_synced(batch).await.map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn entry(term: u64, index: u64) -> (Entry, u64) {
        (Entry { log_id: LogId::new(CommittedLeaderId::new(term, 1), index), payload: EntryPayload::Blank }, 1 << 20)
    }

    fn held(recent: &Recent, range: std::ops::Range<u64>) -> Option<Vec<(u64, u64)>> {
        recent
            .read(&range)
            .map(|entries| entries.iter().map(|entry| (entry.log_id.leader_id.term, entry.log_id.index)).collect())
    }

    #[test]
    fn the_recent_entries_follow_appends_truncations_and_purges_and_stay_bounded() {
        let recent = Recent::default();
        assert_eq!(held(&recent, 1..3), None, "empty: everything from storage");
        recent.appended(1, (1..=5).map(|index| entry(1, index)).collect());
        assert_eq!(held(&recent, 2..4), Some(vec![(1, 2), (1, 3)]));
        assert_eq!(held(&recent, 4..100), Some(vec![(1, 4), (1, 5)]), "the log ends at 5");
        assert_eq!(held(&recent, 6..100), Some(vec![]), "nothing past the end");
        // A new leader's entries replace 4 and 5.
        recent.appended(4, vec![entry(2, 4)]);
        assert_eq!(held(&recent, 1..100), Some(vec![(1, 1), (1, 2), (1, 3), (2, 4)]));
        recent.lock().truncate(3);
        assert_eq!(held(&recent, 1..100), Some(vec![(1, 1), (1, 2)]));
        recent.lock().purge(1);
        assert_eq!(held(&recent, 1..100), None, "1 is before the held entries: read from storage");
        assert_eq!(held(&recent, 2..3), Some(vec![(1, 2)]));
        // A snapshot installed past the end: the tail starts again.
        recent.appended(10, vec![entry(3, 10)]);
        assert_eq!(held(&recent, 2..3), None);
        assert_eq!(held(&recent, 10..11), Some(vec![(3, 10)]));
        // Bounded: the oldest go first.
        let n = RECENT_BYTES / (1 << 20) + 5;
        recent.appended(11, (11..11 + n).map(|index| entry(3, index)).collect());
        let lock = recent.lock();
        assert_eq!(lock.bytes, RECENT_BYTES);
        assert_eq!(lock.entries.front().map(|(entry, _)| entry.log_id.index), Some(11 + n - RECENT_BYTES / (1 << 20)));
        assert_eq!(lock.entries.back().map(|(entry, _)| entry.log_id.index), Some(10 + n));
    }

    proptest::proptest! {
        /// Appends, entries written again, truncations, purges and clears, against a plain map of sizes: after every
        /// step, the bytes between any two indexes are the sum of the held sizes between them, and a purge for a
        /// budget picks the same index.
        #[test]
        fn log_sizes_add_up_as_a_walk_of_the_held_sizes_does(
            steps in proptest::collection::vec((0..5u8, 0..40u64, 0..1000u64), 0..120),
        ) {
            let sizes = LogSizes::default();
            let mut reference: BTreeMap<u64, u64> = BTreeMap::new();
            for (step, index, bytes) in steps {
                match step {
                    0 | 1 => {
                        sizes.insert(index, bytes);
                        reference.insert(index, bytes);
                    }
                    2 => {
                        sizes.remove_from(index);
                        reference.split_off(&index);
                    }
                    3 => {
                        sizes.remove_up_to(index);
                        reference = reference.split_off(&(index + 1));
                    }
                    _ if index == 0 => {
                        sizes.clear();
                        reference.clear();
                    }
                    _ => {}
                }
                for from in 0..42 {
                    for to in [from, from + 3, from + 17, 41] {
                        let walked: u64 = reference.range(from..=to).map(|(_, bytes)| bytes).sum();
                        proptest::prop_assert_eq!(sizes.bytes_between(from, to), walked, "{}..={}", from, to);
                    }
                }
                let walked = |snapshot: u64, budget: u64| {
                    let mut kept = 0;
                    reference.range(..=snapshot).rev().find(|(_, bytes)| {
                        kept += **bytes;
                        kept > budget
                    }).map(|(index, _)| *index)
                };
                proptest::prop_assert_eq!(sizes.purge_for(index, bytes), walked(index, bytes));
            }
        }
    }
}
