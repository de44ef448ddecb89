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
    ///
    /// Each is sorted by the first [`SORT_PREFIX`] bytes of its id (zero-padded), held beside it, then by the whole
    /// id, so that most comparisons read no id through its pointer (encoding 200 000 messages with ids measured a
    /// tenth faster). The order is the ids' own: two padded prefixes that differ order as their ids do (where one id
    /// ended, the other goes on with a byte above the padding's zero, or holds zeros up to where they differ, so the
    /// shorter is a prefix of the longer).
    fn sorted(&self) -> Vec<(&Arc<str>, &DedupEntry)> {
        let ids = self.ids.iter(); // order-free: sorted next
        let mut keyed: Vec<_> = ids.map(|(id, entry)| (sort_prefix(id), id, entry)).collect();
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
    }
}
