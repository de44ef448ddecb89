//! Message headers: the map a publish carries, the packed pairs a partition keeps, and the names only the node writes.
//!
//! A leaf of the model (it imports nothing of it), so that both the in-memory partition and the snapshot format that
//! decodes into it can name [`Packed`] without importing each other.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::snapshot::intern::interned;

/// Message headers; ordered, so that encodings and traces are deterministic.
pub type Headers = BTreeMap<String, String>;

/// The header every message a principal publishes carries: the principal's name, set by the cell over any value the
/// caller sent, so that a reader can tell who published it.
pub const SENDER_HEADER: &str = "Cellog-Sender";
/// The prefix of every header the node writes (the sender, pins, a dead letter's origin), compared without regard to
/// case: a caller's message carrying one is refused, so that no reader (folding case or not) can take a caller's
/// header for the node's.
pub const NODE_HEADER_PREFIX: &str = "Cellog-";

/// Whether `name` is a header only the node writes: it starts with [`NODE_HEADER_PREFIX`] in any case.
pub fn is_node_header(name: &str) -> bool {
    let prefix = NODE_HEADER_PREFIX.as_bytes();
    name.as_bytes().get(..prefix.len()).is_some_and(|start| start.eq_ignore_ascii_case(prefix))
}

/// A message's headers as a partition keeps them: their pairs in name order, in one boxed slice. A `Headers` map of one
/// pair (the stamped sender) allocates a B-tree node of eleven slots, about 540 bytes, for every retained message.
/// Serialized as the map it was made from, so snapshots and digests do not change; decoded from that map directly,
/// with the names and the values of the cell's own headers (`Cellog-*`: the stamped sender) shared between messages,
/// since a million messages hold a handful of distinct ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Packed(Box<[(Arc<str>, Arc<str>)]>);

impl From<Headers> for Packed {
    fn from(headers: Headers) -> Self {
        Packed(headers.into_iter().map(|(name, value)| (Arc::from(name), Arc::from(value))).collect())
    }
}

impl Packed {
    /// The pairs, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(name, value)| (&**name, &**value))
    }

    /// The headers as a map of their own, for a record or a copy.
    pub fn to_headers(&self) -> Headers {
        self.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }

    /// The bytes of their names and values.
    pub fn bytes(&self) -> usize {
        header_bytes(self.iter())
    }
}

/// The bytes of headers' names and values, as limits count them: one sum for a publish's map and a stored message's
/// pairs, which must agree.
pub(crate) fn header_bytes<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> usize {
    pairs.map(|(name, value)| name.len() + value.len()).sum()
}

impl Serialize for Packed {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Packed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = Packed;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of header names to values")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Packed, A::Error> {
                // Capped: a damaged length must not reserve gigabytes before the pairs run out.
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
                while let Some(name) = map.next_key_seed(Text { shared: true })? {
                    let value = map.next_value_seed(Text { shared: name.starts_with(NODE_HEADER_PREFIX) })?;
                    pairs.push((name, value));
                }
                // A map decodes as a `BTreeMap` would: in name order, the last of equal names kept.
                if !pairs.is_sorted_by(|a, b| a.0 < b.0) {
                    pairs.reverse();
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                    pairs.dedup_by(|later, earlier| later.0 == earlier.0);
                }
                Ok(Packed(pairs.into_boxed_slice()))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

/// A header's name or value as decoded: `shared` with equal strings of the same decode (see
/// [`interned`]), or a string of its own.
struct Text {
    shared: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for Text {
    type Value = Arc<str>;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Arc<str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl serde::de::Visitor<'_> for Text {
    type Value = Arc<str>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a header name or value")
    }
    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Arc<str>, E> {
        Ok(if self.shared { interned(text) } else { Arc::from(text) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_headers_encode_as_the_map_they_were_made_from() {
        let headers: Headers = [("b", "2"), ("Cellog-Sender", "alice"), ("a", "")]
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let packed = Packed::from(headers.clone());
        assert_eq!(postcard::to_allocvec(&packed).unwrap(), postcard::to_allocvec(&headers).unwrap());
        assert_eq!(packed.to_headers(), headers);
        assert_eq!(packed.bytes(), "b2Cellog-Senderalicea".len());
        let none = Packed::from(Headers::new());
        assert_eq!(postcard::to_allocvec(&none).unwrap(), postcard::to_allocvec(&Headers::new()).unwrap());
        assert_eq!(postcard::from_bytes::<Packed>(&postcard::to_allocvec(&packed).unwrap()).unwrap(), packed);
    }

    /// A map on the wire decodes into the pairs a `BTreeMap` of it would hold, whatever order the pairs came in.
    #[test]
    fn packed_headers_decode_as_a_map_would() {
        struct Written(&'static [(&'static str, &'static str)]);
        impl Serialize for Written {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_map(self.0.iter().copied())
            }
        }
        let cases: [&[(&str, &str)]; 3] =
            [&[("a", "1"), ("b", "2")], &[("z", "1"), ("Cellog-Sender", "bob"), ("a", "3")], &[("x", "1"), ("x", "2")]];
        for pairs in cases {
            let bytes = postcard::to_allocvec(&Written(pairs)).unwrap();
            let as_map: Headers = postcard::from_bytes(&bytes).unwrap();
            let packed: Packed = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(packed, Packed::from(as_map.clone()), "{pairs:?}");
            assert_eq!(packed.to_headers(), as_map);
        }
    }
}
