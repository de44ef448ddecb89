//! An in-memory disk with crash semantics and seeded faults, for tests and simulation.
//!
//! The harness owns a `SimDisk` and hands clones to a node; the clones share one disk, so it survives the node's
//! crash and restart. Writes are visible at once but durable only after `sync`; a crash drops what was not synced.
//! Unlogged writes are durable only after `persist`: a crash drops them however many syncs came between, and so does a
//! restart of the process (they were in its memory), which keeps what was written through the journal.
//! Faults are drawn from a seeded generator, one stream per disk, so a run replays exactly.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Batch, Space, Storage, StorageError, Write};

/// Fault rates, in parts per million per operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskFaults {
    /// A read fails with an I/O error.
    pub read_error_ppm: u32,
    /// At a crash, the last unsynced record reaches the disk torn: only a prefix of it.
    pub torn_write_ppm: u32,
    /// At a sync, a record lands under a neighbouring key instead of its own.
    pub misdirected_write_ppm: u32,
    /// At a sync, one bit of a record flips.
    pub bit_flip_ppm: u32,
}

type Records = BTreeMap<(Space, u64), Vec<u8>>;

#[derive(Debug)]
struct DiskState {
    /// What survives a crash.
    durable: Records,
    /// What reads see: `durable` plus the unsynced writes.
    view: Records,
    /// Writes not yet durable: a sync makes the logged ones durable, a persist all of them.
    unsynced: Unsynced,
    faults: DiskFaults,
    rng: ChaCha8Rng,
    poisoned: bool,
    /// The next write or sync fails (an injected I/O error).
    fail_next: bool,
    n_syncs: u64,
    sync_delay: std::time::Duration,
    /// How many bytes a second the device writes, if a test set it: a sync then also takes the time to write what
    /// went through the journal since the last one.
    write_rate: Option<u64>,
    /// Bytes written through the journal since the last sync.
    unsynced_bytes: u64,
    /// What the disk reports free, if a test set it (it never fills up by itself).
    free_bytes: Option<u64>,
}

/// Writes not yet durable, each numbered in the order it was written. The unlogged ones (puts alone) wait through
/// many syncs until a persist, so they are kept apart and indexed by key: a sync costs its own writes, not a walk of
/// every put still waiting.
#[derive(Debug, Default)]
struct Unsynced {
    next: u64,
    /// Through the journal, in order.
    logged: Vec<(u64, Write)>,
    /// Without it, by number.
    unlogged: BTreeMap<u64, Write>,
    /// The numbers of the unlogged puts on each key.
    unlogged_keys: BTreeMap<(Space, u64), Vec<u64>>,
}

impl Unsynced {
    fn push(&mut self, write: Write, logged: bool) {
        let at = self.next;
        self.next += 1;
        if logged {
            self.logged.push((at, write));
            return;
        }
        if let Write::Put { space, key, .. } = &write {
            self.unlogged_keys.entry((*space, *key)).or_default().push(at);
        }
        self.unlogged.insert(at, write);
    }

    /// Drops the unlogged puts written before `at` on the keys of `space` from `first` to `last`: a logged write there
    /// replaces them, so they never land after it.
    fn replaced(&mut self, space: Space, first: u64, last: u64, at: u64) {
        let mut emptied = Vec::new();
        for (&record, numbers) in self.unlogged_keys.range_mut((space, first)..=(space, last)) {
            numbers.retain(|&number| {
                let earlier = number < at;
                if earlier {
                    self.unlogged.remove(&number);
                }
                !earlier
            });
            if numbers.is_empty() {
                emptied.push(record);
            }
        }
        for record in emptied {
            self.unlogged_keys.remove(&record);
        }
    }

    /// Every write, in the order written.
    fn take_all(&mut self) -> Vec<Write> {
        let logged = std::mem::take(&mut self.logged);
        let mut unlogged = std::mem::take(&mut self.unlogged).into_iter().peekable();
        self.unlogged_keys.clear();
        let mut all = Vec::with_capacity(logged.len() + unlogged.len());
        for (at, write) in logged {
            while let Some((_, earlier)) = unlogged.next_if(|(number, _)| *number < at) {
                all.push(earlier);
            }
            all.push(write);
        }
        all.extend(unlogged.map(|(_, write)| write));
        all
    }
}

/// A simulated disk. Clones share the same disk.
#[derive(Clone, Debug)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

fn apply(records: &mut Records, write: &Write) {
    match write {
        Write::Put { space, key, framed } => {
            records.insert((*space, *key), framed.clone());
        }
        // `write` refuses a batch that holds one.
        Write::Refused { .. } => {}
        Write::DeleteRange { space, keys } => {
            if keys.start < keys.end {
                let doomed: Vec<(Space, u64)> =
                    records.range((*space, keys.start)..(*space, keys.end)).map(|(k, _)| *k).collect();
                for key in doomed {
                    records.remove(&key);
                }
            }
        }
    }
}

fn chance(rng: &mut ChaCha8Rng, ppm: u32) -> bool {
    ppm > 0 && rng.gen_range(0..1_000_000) < ppm
}

impl SimDisk {
    /// An empty disk whose faults (none until [`SimDisk::set_faults`]) draw from `seed`.
    pub fn new(seed: u64) -> Self {
        SimDisk {
            state: Arc::new(Mutex::new(DiskState {
                durable: Records::new(),
                view: Records::new(),
                unsynced: Unsynced::default(),
                faults: DiskFaults::default(),
                rng: ChaCha8Rng::seed_from_u64(seed),
                poisoned: false,
                fail_next: false,
                n_syncs: 0,
                sync_delay: std::time::Duration::ZERO,
                write_rate: None,
                unsynced_bytes: 0,
                free_bytes: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        // A panic while holding the lock leaves the disk as consistent as a crash would; keep going.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets the random fault rates.
    pub fn set_faults(&self, faults: DiskFaults) {
        self.lock().faults = faults;
    }

    /// The machine loses power: everything not synced is gone (the last unsynced record may survive torn), and the
    /// store is usable again, as after a reboot.
    pub fn crash(&self) {
        let mut state = self.lock();
        let state = &mut *state;
        let torn = chance(&mut state.rng, state.faults.torn_write_ppm);
        if torn
            && let Some((_, Write::Put { space, key, framed })) =
                state.unsynced.logged.iter().rev().find(|(_, w)| matches!(w, Write::Put { .. })).cloned()
        {
            let keep = state.rng.gen_range(0..framed.len().max(1));
            state.durable.insert((space, key), framed[..keep].to_vec());
        }
        state.unsynced = Unsynced::default();
        state.unsynced_bytes = 0;
        state.view = state.durable.clone();
        state.poisoned = false;
        state.fail_next = false;
    }

    /// The process restarts on a disk that kept power: unsynced writes stay (they are in the page cache), and the
    /// store is usable again.
    pub fn reopen(&self) {
        let mut state = self.lock();
        let state = &mut *state;
        if !state.unsynced.unlogged.is_empty() {
            // The process's memory is gone, and the unlogged writes with it.
            state.unsynced.unlogged.clear();
            state.unsynced.unlogged_keys.clear();
            state.view = state.durable.clone();
            for (_, write) in &state.unsynced.logged {
                apply(&mut state.view, write);
            }
        }
        state.poisoned = false;
        state.fail_next = false;
    }

    /// The disk is replaced by an empty one: a data directory lost whole, with everything that said what the node was.
    pub fn lose_everything(&self) {
        let mut state = self.lock();
        state.durable = Records::new();
        state.view = Records::new();
        state.unsynced = Unsynced::default();
        state.unsynced_bytes = 0;
        state.poisoned = false;
        state.fail_next = false;
    }

    /// Flips one bit of a stored record, durably. Returns whether the record exists.
    pub fn flip_bit(&self, space: Space, key: u64, bit: usize) -> bool {
        let mut state = self.lock();
        let state = &mut *state;
        let mut flipped = false;
        for records in [&mut state.durable, &mut state.view] {
            if let Some(bytes) = records.get_mut(&(space, key))
                && !bytes.is_empty()
            {
                let bit = bit % (bytes.len() * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
                flipped = true;
            }
        }
        flipped
    }

    /// Reports `free` bytes free from now on (`None`: unknown, as before any call).
    pub fn set_free_bytes(&self, free: Option<u64>) {
        self.lock().free_bytes = free;
    }

    /// Sets how long a sync takes (simulated device latency; zero by default).
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        self.lock().sync_delay = delay;
    }

    /// Sets how many bytes a second the device writes (`None`: instantly, as by default): a sync takes its delay plus
    /// the time to write the bytes that went through the journal since the last sync.
    pub fn set_write_rate(&self, bytes_per_second: Option<u64>) {
        self.lock().write_rate = bytes_per_second.filter(|rate| *rate > 0);
    }

    /// Makes the next write or sync fail, as a failing device would.
    pub fn fail_next_io(&self) {
        self.lock().fail_next = true;
    }

    /// How many syncs have completed.
    pub fn n_syncs(&self) -> u64 {
        self.lock().n_syncs
    }

    /// Keys present in a space, as reads see them.
    pub fn keys(&self, space: Space) -> Vec<u64> {
        self.lock().view.range((space, 0)..=(space, u64::MAX)).map(|((_, key), _)| *key).collect()
    }
}

impl DiskState {
    fn check_writable(&mut self) -> Result<(), StorageError> {
        if self.poisoned {
            return Err(StorageError::Poisoned);
        }
        if self.fail_next {
            self.fail_next = false;
            self.poisoned = true;
            return Err(StorageError::Io { reason: "injected device failure".to_string() });
        }
        Ok(())
    }

    /// Applies a batch to what reads see, pending until a sync (`logged`) or a persist, unless the store is
    /// poisoned, the batch failed its check (`checked`), or the device fails now.
    fn accept(&mut self, batch: Batch, checked: Result<(), StorageError>, logged: bool) -> Result<(), StorageError> {
        if self.poisoned {
            return Err(StorageError::Poisoned);
        }
        checked?;
        self.check_writable()?;
        for write in batch.writes {
            apply(&mut self.view, &write);
            if logged && let Write::Put { framed, .. } = &write {
                self.unsynced_bytes += framed.len() as u64;
            }
            self.unsynced.push(write, logged);
        }
        Ok(())
    }

    /// Makes the pending writes durable, in order: those through the journal, or (`all`, a persist) every one. Each
    /// may land faulted (misdirected, or with a bit flipped), as the disk's faults say.
    fn make_durable(&mut self, all: bool) {
        let mut faulted = false;
        if all {
            for write in self.unsynced.take_all() {
                faulted |= self.land(write);
            }
        } else {
            for (at, write) in std::mem::take(&mut self.unsynced.logged) {
                // What this write replaces, an unlogged put before it on the same key, is gone: it never lands
                // after it.
                match &write {
                    Write::Put { space, key, .. } => self.unsynced.replaced(*space, *key, *key, at),
                    Write::DeleteRange { space, keys } if keys.start < keys.end => {
                        self.unsynced.replaced(*space, keys.start, keys.end - 1, at);
                    }
                    Write::DeleteRange { .. } | Write::Refused { .. } => {}
                }
                faulted |= self.land(write);
            }
        }
        if faulted {
            // Reads see what landed, and the writes still pending over it.
            self.view = self.durable.clone();
            for write in self.unsynced.unlogged.values() {
                apply(&mut self.view, write);
            }
        }
        self.n_syncs += 1;
        if !all {
            self.unsynced_bytes = 0;
        }
    }

    /// One write reaches the platter, faulted (misdirected, or with a bit flipped) as the disk's faults say: whether
    /// it was.
    fn land(&mut self, write: Write) -> bool {
        let mut faulted = false;
        let write = match write {
            Write::Put { space, key, mut framed } => {
                let mut key = key;
                if chance(&mut self.rng, self.faults.misdirected_write_ppm) {
                    key ^= 1;
                    faulted = true;
                }
                if !framed.is_empty() && chance(&mut self.rng, self.faults.bit_flip_ppm) {
                    let bit = self.rng.gen_range(0..framed.len() * 8);
                    framed[bit / 8] ^= 1 << (bit % 8);
                    faulted = true;
                }
                Write::Put { space, key, framed }
            }
            other => other,
        };
        apply(&mut self.durable, &write);
        faulted
    }

    fn check_readable(&mut self, space: Space, key: u64) -> Result<(), StorageError> {
        if chance(&mut self.rng, self.faults.read_error_ppm) {
            return Err(StorageError::Io { reason: format!("injected read error in {space:?} at key {key}") });
        }
        Ok(())
    }
}

impl Storage for SimDisk {
    fn write(&self, batch: Batch) -> Result<(), StorageError> {
        let checked = batch.check();
        self.lock().accept(batch, checked, true)
    }

    fn write_unlogged(&self, batch: Batch) -> Result<(), StorageError> {
        let checked = batch.check_unlogged();
        self.lock().accept(batch, checked, false)
    }

    fn persist(&self) -> Result<(), StorageError> {
        let mut state = self.lock();
        state.check_writable()?;
        state.make_durable(true);
        Ok(())
    }

    fn read_framed(&self, space: Space, key: u64) -> Result<Option<Vec<u8>>, StorageError> {
        let mut state = self.lock();
        state.check_readable(space, key)?;
        Ok(state.view.get(&(space, key)).cloned())
    }

    fn read_part(&self, space: Space, key: u64, within: Range<usize>) -> Result<Option<Vec<u8>>, StorageError> {
        let mut state = self.lock();
        state.check_readable(space, key)?;
        state.view.get(&(space, key)).map(|framed| super::part_of(space, key, framed, within)).transpose()
    }

    /// One by one, as a device without batched lookups would: each draws its own read error.
    fn read_many_framed(&self, space: Space, keys: &[u64]) -> Vec<Result<Option<Vec<u8>>, StorageError>> {
        keys.iter().map(|&key| self.read_framed(space, key)).collect()
    }

    fn scan_framed(&self, space: Space, keys: Range<u64>, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let mut state = self.lock();
        state.check_readable(space, keys.start)?;
        if keys.start >= keys.end {
            return Ok(Vec::new());
        }
        Ok(state
            .view
            .range((space, keys.start)..(space, keys.end))
            .take(limit)
            .map(|((_, key), bytes)| (*key, bytes.clone()))
            .collect())
    }

    fn key_bounds(&self, space: Space) -> Result<Option<(u64, u64)>, StorageError> {
        let state = self.lock();
        let mut keys = state.view.range((space, 0)..=(space, u64::MAX)).map(|((_, key), _)| *key);
        let first = keys.next();
        let last = keys.next_back().or(first);
        Ok(first.zip(last))
    }

    fn sync(&self) -> Result<(), StorageError> {
        let mut state = self.lock();
        state.check_writable()?;
        state.make_durable(false);
        Ok(())
    }

    fn sync_delay(&self) -> std::time::Duration {
        let state = self.lock();
        let writing = match state.write_rate {
            Some(rate) => {
                let nanos = u128::from(state.unsynced_bytes) * 1_000_000_000 / u128::from(rate);
                std::time::Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            }
            None => std::time::Duration::ZERO,
        };
        state.sync_delay + writing
    }

    /// The simulated disk keeps no journal: nothing to move.
    fn checkpoint(&self) -> Result<(), StorageError> {
        Ok(())
    }

    fn free_bytes(&self) -> Option<u64> {
        self.lock().free_bytes
    }
}
