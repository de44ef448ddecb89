//! A stream's index of message ids, for deduplication: a hash map keyed by the host ([`IdKey`]).
//!
//! The one place in the cell that holds a hash map. Nothing iterates it in hash order, which differs between replicas
//! (their keys differ): a line here that iterates it ends with `// order-free`, and says why, and the tidy test
//! counts them. It encodes and prints in id order.

use std::hash::BuildHasher;
use std::sync::Arc;

use serde::{Serialize, Serializer};
use siphasher::sip::SipHasher13;

use crate::index::DedupEntry;
/// The key of the hash behind every message-id index ([`DedupIndex`]). Message ids come from clients, so the hash is
/// keyed (SipHash-1-3, as std's maps): without the key, no one can choose ids that collide and make every lookup slow.
/// The host draws it ([`crate::Cell::key_ids`]); the cell draws nothing of its own. Not state: replicas may hold
/// different keys, since what an index answers never depends on it.
#[derive(Clone, Copy, Debug)]
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

impl BuildHasher for IdKey {
    type Hasher = SipHasher13;

    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.0, self.1)
    }
}

/// A stream's remembered message ids: a hash map, since a publish with an id looks it up and (when it is new) adds
/// it, and a B-tree of strings made that most of the cost of such a publish.
///
/// It answers lookups only, and encodes and prints in id order, so a snapshot holds exactly what a sorted map held.
#[derive(Clone, Default)]
pub(crate) struct DedupIndex {
    #[allow(clippy::disallowed_types, reason = "never iterated in hash order: see the type's doc")]
    ids: std::collections::HashMap<Arc<str>, DedupEntry, IdKey>,
}

impl DedupIndex {
    /// An empty index hashing with `key`.
    pub fn new(key: IdKey) -> Self {
        #[allow(clippy::disallowed_types, reason = "never iterated in hash order: see the type's doc")]
        let ids = std::collections::HashMap::with_hasher(key);
        DedupIndex { ids }
    }

    /// The index of `entries`, hashing with the default key until [`DedupIndex::rekey`].
    pub fn from_entries(entries: impl IntoIterator<Item = (Arc<str>, DedupEntry)>) -> Self {
        let mut index = DedupIndex::new(IdKey::default());
        index.ids.extend(entries);
        index
    }

    /// The same ids, hashed with `key`.
    pub fn rekey(&mut self, key: IdKey) {
        let mut ids = DedupIndex::new(key);
        ids.ids.reserve(self.ids.len());
        ids.ids.extend(self.ids.drain()); // order-free: into another map
        *self = ids;
    }

    pub fn get(&self, id: &str) -> Option<&DedupEntry> {
        self.ids.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut DedupEntry> {
        self.ids.get_mut(id)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.ids.contains_key(id)
    }

    pub fn insert(&mut self, id: Arc<str>, entry: DedupEntry) {
        self.ids.insert(id, entry);
    }

    pub fn remove(&mut self, id: &str) {
        self.ids.remove(id);
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    #[cfg(madsim)]
    pub fn clear(&mut self) {
        self.ids.clear();
    }

    /// The entries in id order.
    fn sorted(&self) -> Vec<(&Arc<str>, &DedupEntry)> {
        let mut entries: Vec<_> = self.ids.iter().collect(); // order-free: sorted next
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        entries
    }
}

impl PartialEq for DedupIndex {
    /// The same ids with the same entries, whatever the keys.
    fn eq(&self, other: &Self) -> bool {
        self.ids == other.ids
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
