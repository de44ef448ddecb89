//! Strings shared while a cell is decoded: a million messages on a handful of subjects, with the same header names and
//! stamped values, would otherwise each hold copies of their own after a restart. A leaf: it imports nothing of the
//! model, so both the format's types and the in-memory ones it decodes into may use it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserializer;

thread_local! {
    /// While a cell is decoded: the subjects seen so far, and the header names and stamped header values. Every
    /// message on a subject shares one allocation in a running cell; without this, decoding would give each its own
    /// copy, and a million messages would take tens of megabytes more after a restart than before it.
    static SHARED: RefCell<Option<BTreeSet<Arc<str>>>> = const { RefCell::new(None) };
}

/// Decodes a message's subject, shared with every other message on it while a cell is decoded.
pub(crate) fn interned_subject<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Arc<str>, D::Error> {
    struct Subject;
    impl serde::de::Visitor<'_> for Subject {
        type Value = Arc<str>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a subject")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Arc<str>, E> {
            Ok(interned(text))
        }
    }
    deserializer.deserialize_str(Subject)
}

/// `text`, shared with every other string equal to it that was interned while this cell is decoded (outside a
/// decode, a string of its own).
pub(crate) fn interned(text: &str) -> Arc<str> {
    SHARED.with_borrow_mut(|shared| match shared {
        Some(seen) => match seen.get(text) {
            Some(one) => one.clone(),
            None => {
                let one: Arc<str> = Arc::from(text);
                seen.insert(one.clone());
                one
            }
        },
        None => Arc::from(text),
    })
}

/// Shares strings while it lives (see [`interned`]).
pub(crate) struct Interning;

impl Interning {
    pub(crate) fn start() -> Self {
        SHARED.set(Some(BTreeSet::new()));
        Interning
    }
}

impl Drop for Interning {
    fn drop(&mut self) {
        SHARED.set(None);
    }
}
