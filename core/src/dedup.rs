//! A stream's index of message ids, for deduplication: a hash map keyed by the host ([`IdKey`]).
//!
//! The one place in the cell that holds a hash map. Nothing iterates it in hash order, which differs between replicas
//! (their keys differ): a line here that iterates it ends with `// order-free`, and says why, and the tidy test
//! counts them. It encodes and prints in id order.

use std::hash::Hasher;
use std::sync::Arc;

use serde::{Serialize, Serializer};
use siphasher::sip::SipHasher13;

use crate::index::DedupEntry;

/// The key of the hash behind every message-id index ([`DedupIndex`]). Message ids come from clients, so the hash is
/// keyed (SipHash-1-3, as std's maps): without the key, no one can choose ids that collide and make every lookup slow.
/// The host draws it ([`crate::Cell::key_ids`]); the cell draws nothing of its own. Not state: replicas may hold
/// different keys, since what an index answers never depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdKey(u64, u64);

impl IdKey {
    /// A key of two 64-bit halves.
    pub fn new(k0: u64, k1: u64) -> Self {
        IdKey(k0, k1)
    }
}

impl Default for IdKey {
    /// A fixed key, for cells no host keys (tests, tools that read snapshots).
    fn default() -> Self {
        IdKey(0x6365_6c6c_6f67_2d69, 0x642d_696e_6465_7821)
    }
}

thread_local! {
    /// While [`restoring_with`] runs: the key the indexes it decodes hash with.
    static RESTORING: std::cell::Cell<Option<IdKey>> = const { std::cell::Cell::new(None) };
}

/// Runs `decode` with every message-id index it builds hashed with `key` (see [`restoring_key`]): a cell restored for
/// a host that keys it (`Cell::restore_keyed`) does not hash a million ids twice.
pub(crate) fn restoring_with<T>(key: IdKey, decode: impl FnOnce() -> T) -> T {
    struct Restoring;
    impl Drop for Restoring {
        fn drop(&mut self) {
            RESTORING.set(None);
        }
    }
    RESTORING.set(Some(key));
    let _restoring = Restoring;
    decode()
}

/// The key an index decoded now hashes with: the one [`restoring_with`] was given, or the default one.
pub(crate) fn restoring_key() -> IdKey {
    RESTORING.get().unwrap_or_default()
}

/// A stream's remembered message ids: a hash table, since a publish with an id looks it up and (when it is new) adds
/// it, and a B-tree of strings made that most of the cost of such a publish.
///
/// The table is hashbrown's, whose caller hashes, so that each id is held beside its hash: growing the table then
/// reads no id through its pointer (std's map hashes every id again, each a cache miss on the heap). Publishing
/// 200 000 messages with ids measured a sixth to a quarter faster for it.
///
/// It answers lookups only, and encodes and prints in id order, so a snapshot holds exactly what a sorted map held.
#[derive(Clone)]
pub(crate) struct DedupIndex {
    key: IdKey,
    ids: hashbrown::HashTable<Held>,
}

/// An id's hash, the id, and its entry.
type Held = (u64, Arc<str>, DedupEntry);

/// The hash a held id is placed by.
fn held_hash(held: &Held) -> u64 {
    held.0
}

/// Whether a held id is `id`, whose hash is `hash`: the hashes first, so that most mismatches read no id.
fn is(hash: u64, id: &str) -> impl Fn(&Held) -> bool + '_ {
    move |held| held.0 == hash && *held.1 == *id
}

impl Default for DedupIndex {
    fn default() -> Self {
        DedupIndex::new(IdKey::default())
    }
}

impl IdKey {
    /// The hash of `id` under this key: one SipHash write of its bytes.
    fn hash(&self, id: &str) -> u64 {
        let mut hasher = SipHasher13::new_with_keys(self.0, self.1);
        hasher.write(id.as_bytes());
        hasher.finish()
    }
}

impl DedupIndex {
    /// An empty index hashing with `key`.
    pub fn new(key: IdKey) -> Self {
        DedupIndex { key, ids: hashbrown::HashTable::new() }
    }

    /// The index of `entries`, hashing with `key`.
    pub fn from_entries(key: IdKey, entries: impl IntoIterator<Item = (Arc<str>, DedupEntry)>) -> Self {
        let entries = entries.into_iter(); // order-free: its length is read here, its items go into the table below
        let mut index = DedupIndex::new(key);
        index.ids.reserve(entries.size_hint().0, held_hash);
        entries.into_iter().for_each(|(id, entry)| index.insert(id, entry)); // order-free: into the table
        index
    }

    /// The same ids, hashed with `key`.
    pub fn rekey(&mut self, key: IdKey) {
        if key == self.key {
            return;
        }
        let mut ids = hashbrown::HashTable::with_capacity(self.ids.len());
        let entries = self.ids.drain(); // order-free: into another table
        entries.for_each(|(_, id, entry)| {
            let hash = key.hash(&id);
            ids.insert_unique(hash, (hash, id, entry), held_hash);
        });
        *self = DedupIndex { key, ids };
    }

    pub fn get(&self, id: &str) -> Option<&DedupEntry> {
        let hash = self.key.hash(id);
        self.ids.find(hash, is(hash, id)).map(|(.., entry)| entry)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut DedupEntry> {
        let hash = self.key.hash(id);
        self.ids.find_mut(hash, is(hash, id)).map(|(.., entry)| entry)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.get(id).is_some()
    }

    /// Remembers `id` with `entry`, in place of what it was remembered with.
    pub fn insert(&mut self, id: Arc<str>, entry: DedupEntry) {
        let hash = self.key.hash(&id);
        match self.ids.entry(hash, is(hash, &id), held_hash) {
            hashbrown::hash_table::Entry::Occupied(mut held) => held.get_mut().2 = entry,
            hashbrown::hash_table::Entry::Vacant(vacant) => {
                vacant.insert((hash, id, entry));
            }
        }
    }

    pub fn remove(&mut self, id: &str) {
        let hash = self.key.hash(id);
        if let Ok(held) = self.ids.find_entry(hash, is(hash, id)) {
            held.remove();
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    #[cfg(madsim)]
    pub fn clear(&mut self) {
        self.ids.clear();
    }

    /// The entries in id order.
    ///
    /// Each is sorted by the first [`SORT_PREFIX`] bytes of its id (zero-padded), held beside it, then by the whole
    /// id, so that most comparisons read no id through its pointer (encoding 200 000 messages with ids measured a
    /// tenth faster). The order is the ids' own: two padded prefixes that differ order as their ids do (where one id
    /// ended, the other goes on with a byte above the padding's zero, or holds zeros up to where they differ, so the
    /// shorter is a prefix of the longer).
    fn sorted(&self) -> Vec<(&Arc<str>, &DedupEntry)> {
        let ids = self.ids.iter(); // order-free: sorted next
        let mut keyed: Vec<_> = ids.map(|(_, id, entry)| (sort_prefix(id), id, entry)).collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        keyed.into_iter().map(|(_, id, entry)| (id, entry)).collect() // order-free: the sorted copy, not the map
    }
}

/// How many leading bytes of an id [`DedupIndex::sorted`] compares before the whole id.
const SORT_PREFIX: usize = 16;

/// The first [`SORT_PREFIX`] bytes of `id`, zero-padded.
fn sort_prefix(id: &str) -> [u8; SORT_PREFIX] {
    let mut prefix = [0; SORT_PREFIX];
    let bytes = &id.as_bytes()[..id.len().min(SORT_PREFIX)];
    prefix[..bytes.len()].copy_from_slice(bytes);
    prefix
}

impl PartialEq for DedupIndex {
    /// The same ids with the same entries, whatever the keys.
    fn eq(&self, other: &Self) -> bool {
        let mut entries = self.ids.iter(); // order-free: each is looked up in the other index
        self.len() == other.len() && entries.all(|(_, id, entry)| other.get(id) == Some(entry))
    }
}

impl Eq for DedupIndex {}

impl std::fmt::Debug for DedupIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

impl Serialize for DedupIndex {
    /// As a map in id order: the encoding of the `BTreeMap` it replaced, byte for byte.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.sorted())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Ids of any length around the sorted prefix's, sharing prefixes, holding zero bytes: the index encodes as
        /// the `BTreeMap` of the same entries does, whatever key hashes it.
        #[test]
        fn encodes_as_the_sorted_map_of_its_entries(
            ids in proptest::collection::btree_set("(msg-|ab\u{0}|ab)?[a\u{0}-]{0,24}", 0..64),
            k0 in any::<u64>(),
        ) {
            let entries: Vec<(Arc<str>, DedupEntry)> = ids
                .iter() // order-free: a BTreeSet
                .enumerate()
                .map(|(n, id)| (Arc::from(id.as_str()), DedupEntry { partition: 0, seq: n as u64, window_open: true }))
                .collect();
            let mut index = DedupIndex::new(IdKey::new(k0, !k0));
            for (id, entry) in entries.iter().cloned() { // order-free: a Vec
                index.insert(id, entry);
            }
            let reference: BTreeMap<Arc<str>, DedupEntry> = entries.into_iter().collect(); // order-free: a Vec
            prop_assert_eq!(
                postcard::to_stdvec(&index).expect("encodes"),
                postcard::to_stdvec(&reference).expect("encodes")
            );
        }

        /// Inserts (an id again replaces its entry), removals, lookups and a change of key, against a `BTreeMap`: after
        /// every step the index answers each id as the map does, and holds as many.
        #[test]
        fn answers_as_a_map_through_inserts_removals_and_rekeying(
            steps in proptest::collection::vec((0..4u8, "[ab]{0,3}", any::<u64>()), 0..200),
        ) {
            let mut index = DedupIndex::new(IdKey::new(1, 2));
            let mut reference: BTreeMap<String, DedupEntry> = BTreeMap::new();
            for (step, id, n) in steps { // order-free: a Vec
                let entry = DedupEntry { partition: (n % 3) as u32, seq: n, window_open: n % 2 == 0 };
                match step {
                    0 | 1 => {
                        index.insert(Arc::from(id.as_str()), entry.clone());
                        reference.insert(id.clone(), entry);
                    }
                    2 => {
                        index.remove(&id);
                        reference.remove(&id);
                    }
                    _ => index.rekey(IdKey::new(n, !n)),
                }
                prop_assert_eq!(index.len(), reference.len());
                prop_assert_eq!(index.get(&id), reference.get(&id));
                prop_assert_eq!(index.contains_key(&id), reference.contains_key(&id));
            }
            for (id, entry) in &reference { // order-free: a BTreeMap
                prop_assert_eq!(index.get(id), Some(entry));
            }
            let entries = reference.iter().map(|(id, e)| (Arc::from(id.as_str()), e.clone())); // order-free: a BTreeMap
            let rebuilt = DedupIndex::from_entries(IdKey::new(7, 11), entries);
            prop_assert_eq!(&rebuilt, &index);
        }
    }
}
