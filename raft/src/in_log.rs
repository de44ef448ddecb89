//! Payloads read where the log wrote them: a message's bytes reach the disk once, in the entry that carries them.
//!
//! When the log store encodes an entry it notes where each run of bytes of at least [`IN_LOG_MIN_BYTES`] landed in the
//! encoding ([`encode_placing`]), and the entry in memory keeps those places ([`Placed`]). Applying the entry, the
//! state machine looks up each body the cell asks it to store ([`Placed::find`]): a body found there is not written
//! again, its [`InLog`] place (the entry's index and the offset in its stored record) is what the node keeps, and a
//! read of the body reads those bytes of the log (checked against the cell's reference, as every body read is). A body
//! is copied into the body store only when the log may let it go: a snapshot that still refers to it copies it before
//! it is stored (see [`crate::bodies`]), so a message consumed and removed before the next snapshot is written once.
//!
//! A body is found by the address and length of its bytes: the cell moves a publish's payload (a [`Bytes`], shared by
//! the entry's clones) into its body effect without copying it, and the entry holds those bytes alive while it is
//! applied, so the same address and length are the same bytes. An entry read back from the store (a restart's replay)
//! or whose payload the cell copied finds nothing, and its bodies are written to the body store as before.

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

/// The smallest body kept in the log rather than written again: below it, reading the body from the log costs more
/// than the write it saves.
pub const IN_LOG_MIN_BYTES: usize = 4096;

/// Where a body is in the log: the bytes `offset..offset + len` of the stored record of entry `index` (after its
/// frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InLog {
    /// The entry's index.
    pub index: u64,
    /// Where the body starts in the entry's encoding.
    pub offset: u32,
}

/// One run of bytes in an entry's encoding.
#[derive(Clone, Copy, Debug)]
struct Run {
    /// The address of the bytes encoded (identity only: never dereferenced).
    addr: usize,
    len: u32,
    offset: u32,
}

/// Where an entry's long runs of bytes (its payloads) are in its stored encoding: set by the log store as it encodes
/// the entry, shared by the entry's clones, and never stored nor sent.
#[derive(Clone, Default)]
pub struct Placed(Option<Arc<[Run]>>);

impl Placed {
    /// Where `bytes` are in the entry's encoding, if they are bytes the entry encoded.
    pub fn find(&self, bytes: &Bytes) -> Option<u32> {
        let runs = self.0.as_deref()?;
        let addr = bytes.as_ptr() as usize;
        let at = runs.binary_search_by_key(&addr, |run| run.addr).ok()?;
        let run = runs[at];
        (run.len as usize == bytes.len()).then_some(run.offset)
    }

    /// Whether nothing is placed.
    pub fn is_empty(&self) -> bool {
        self.0.as_deref().is_none_or(<[Run]>::is_empty)
    }
}

impl PartialEq for Placed {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Placed {}

impl std::fmt::Debug for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Placed({})", self.0.as_deref().map_or(0, <[Run]>::len))
    }
}

/// A postcard output that notes where each long run of bytes lands (from `base`, where the value starts in `out`).
/// Written here because postcard's flavors are the one place an encoding's offsets can be seen without encoding
/// twice.
struct Placing {
    out: Vec<u8>,
    base: usize,
    runs: Vec<Run>,
}

impl postcard::ser_flavors::Flavor for Placing {
    type Output = (Vec<u8>, Vec<Run>);

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if data.len() >= IN_LOG_MIN_BYTES
            && let (Ok(len), Ok(offset)) = (u32::try_from(data.len()), u32::try_from(self.out.len() - self.base))
        {
            self.runs.push(Run { addr: data.as_ptr() as usize, len, offset });
        }
        self.out.extend_from_slice(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.out.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Self::Output> {
        Ok((self.out, self.runs))
    }
}

/// `value` encoded as postcard encodes it (the same bytes), appended to `out`, and where its long runs of bytes are in
/// the encoding (counted from where it starts in `out`).
pub fn encode_placing<T: Serialize>(value: &T, out: Vec<u8>) -> (Vec<u8>, Placed) {
    let base = out.len();
    let placing = Placing { out, base, runs: Vec::new() };
    let (out, mut runs) = postcard::serialize_with_flavor(value, placing).expect("encoding into memory does not fail");
    if runs.is_empty() {
        return (out, Placed::default());
    }
    runs.sort_unstable_by_key(|run| run.addr);
    // The same bytes encoded twice (one payload in two commands) are one body: either place holds them.
    runs.dedup_by_key(|run| run.addr);
    (out, Placed(Some(runs.into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Two {
        name: String,
        first: Bytes,
        small: Bytes,
        second: Bytes,
    }

    #[test]
    fn long_runs_are_found_at_their_place_in_the_same_encoding() {
        let two = Two {
            name: "n".repeat(10),
            first: Bytes::from(vec![1u8; IN_LOG_MIN_BYTES]),
            small: Bytes::from(vec![2u8; 10]),
            second: Bytes::from(vec![3u8; IN_LOG_MIN_BYTES * 3]),
        };
        let (encoded, placed) = encode_placing(&two, b"head".to_vec());
        assert_eq!(encoded[4..], postcard::to_stdvec(&two).unwrap());
        let encoded = &encoded[4..];
        for bytes in [&two.first, &two.second] {
            let offset = placed.find(bytes).expect("placed") as usize;
            assert_eq!(&encoded[offset..offset + bytes.len()], &bytes[..]);
        }
        assert_eq!(placed.find(&two.small), None, "short runs are not placed");
        // The same bytes elsewhere, or a part of them, are not found.
        assert_eq!(placed.find(&Bytes::from(vec![1u8; IN_LOG_MIN_BYTES])), None);
        assert_eq!(placed.find(&two.second.slice(0..IN_LOG_MIN_BYTES)), None);
        assert!(encode_placing(&"x".repeat(10), Vec::new()).1.is_empty());
    }
}
