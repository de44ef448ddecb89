//! The stored state snapshot, in chunks: no single record grows with the cell.
//!
//! [`Space::State`] holds a header at key 0 (the snapshot's length as a `u64` and its number of chunks) and the
//! snapshot's bytes in chunks of at most [`SNAPSHOT_CHUNK_BYTES`] at keys 1, 2, …. Each is a framed, checksummed
//! record of its own. A snapshot is written in one batch that first deletes the whole space, so no chunk of an
//! older, longer snapshot survives, and read back whole or not at all: a missing chunk, or lengths that do not add
//! up, or chunks without a header, is a [`StorageError::Corrupt`] at the header's key, which recovery treats as a damaged snapshot.

use serde::{Deserialize, Serialize};

use crate::storage::{Batch, Space, Storage, StorageError};

/// The key of the header; chunks follow at 1, 2, ….
pub const HEADER_KEY: u64 = 0;
/// Largest chunk of a stored snapshot (16 MiB).
pub const SNAPSHOT_CHUNK_BYTES: usize = 16 * 1024 * 1024;
/// Chunks read per scan.
const CHUNKS_PER_SCAN: usize = 4;

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    length: u64,
    chunks: u64,
}

/// Adds the writes that store `bytes` as the snapshot, replacing whatever was stored, in chunks of `chunk_bytes`.
pub fn put(batch: &mut Batch, bytes: &[u8], chunk_bytes: usize) {
    let chunk_bytes = chunk_bytes.max(1);
    let chunks = bytes.len().div_ceil(chunk_bytes) as u64;
    batch.delete_range(Space::State, 0..u64::MAX);
    let header = Header { length: bytes.len() as u64, chunks };
    batch.put(Space::State, HEADER_KEY, &postcard::to_stdvec(&header).expect("encoding into memory does not fail"));
    for (index, chunk) in bytes.chunks(chunk_bytes).enumerate() {
        batch.put(Space::State, index as u64 + 1, chunk);
    }
}

/// The stored snapshot's bytes, if one is stored; every chunk verified and accounted for.
pub fn get<S: Storage + ?Sized>(storage: &S) -> Result<Option<Vec<u8>>, StorageError> {
    let corrupt = |reason: String| StorageError::Corrupt { space: Space::State, key: HEADER_KEY, reason };
    let Some(header) = storage.get(Space::State, HEADER_KEY)? else {
        // Chunks without their header: the header's write went astray or was lost, which is damage, not "no snapshot".
        return match storage.key_bounds(Space::State)? {
            None => Ok(None),
            Some((first, _)) => Err(corrupt(format!("the header is missing and chunk {first} is stored"))),
        };
    };
    let header: Header =
        postcard::from_bytes(&header).map_err(|error| corrupt(format!("snapshot header does not decode: {error}")))?;
    // Not damage: a snapshot this host cannot hold now is kept, and the node does not start.
    let no_room = |length: u64| StorageError::Io { reason: format!("no memory for a snapshot of {length} bytes") };
    let length = usize::try_from(header.length).map_err(|_| no_room(header.length))?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(length).map_err(|_| no_room(header.length))?;
    let mut next = 1u64;
    while next <= header.chunks {
        let end = header.chunks.saturating_add(1);
        let chunks = storage.scan(Space::State, next..end, CHUNKS_PER_SCAN)?;
        if chunks.is_empty() {
            return Err(corrupt(format!("chunk {next} of {} is missing", header.chunks)));
        }
        for (key, chunk) in chunks {
            if key != next {
                return Err(corrupt(format!("chunk {next} of {} is missing", header.chunks)));
            }
            if bytes.len() + chunk.len() > length {
                return Err(corrupt(format!("chunks hold more than the {length} bytes the header says")));
            }
            bytes.extend_from_slice(&chunk);
            next += 1;
        }
    }
    if bytes.len() != length {
        return Err(corrupt(format!("chunks hold {} bytes, the header says {length}", bytes.len())));
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SimDisk;

    fn stored(bytes: &[u8], chunk: usize) -> SimDisk {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        put(&mut batch, bytes, chunk);
        disk.write(batch).unwrap();
        disk
    }

    #[test]
    fn a_snapshot_comes_back_whole_from_its_chunks() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        for chunk in [1, 7, 999, 1000, 1001, SNAPSHOT_CHUNK_BYTES] {
            assert_eq!(get(&stored(&bytes, chunk)), Ok(Some(bytes.clone())), "chunks of {chunk}");
        }
        assert_eq!(get(&stored(&[], 7)), Ok(Some(Vec::new())));
        assert_eq!(get(&SimDisk::new(1)), Ok(None));
    }

    #[test]
    fn a_shorter_snapshot_leaves_no_chunk_of_a_longer_one() {
        let disk = stored(&[1; 100], 10);
        let mut batch = Batch::new();
        put(&mut batch, &[2; 15], 10);
        disk.write(batch).unwrap();
        assert_eq!(get(&disk), Ok(Some(vec![2; 15])));
        assert_eq!(disk.keys(Space::State), vec![0, 1, 2]);
    }

    #[test]
    fn a_missing_or_extra_chunk_is_damage() {
        let disk = stored(&[3; 100], 10);
        let mut batch = Batch::new();
        batch.delete_range(Space::State, 4..5);
        disk.write(batch).unwrap();
        let damaged = get(&disk).unwrap_err();
        assert!(
            matches!(&damaged, StorageError::Corrupt { reason, .. } if reason.contains("chunk 4 of 10")),
            "{damaged}"
        );

        let disk = stored(&[3; 100], 10);
        let mut batch = Batch::new();
        batch.delete_range(Space::State, HEADER_KEY..HEADER_KEY + 1);
        disk.write(batch).unwrap();
        let damaged = get(&disk).unwrap_err();
        assert!(
            matches!(&damaged, StorageError::Corrupt { reason, .. } if reason.contains("header is missing")),
            "{damaged}"
        );

        let disk = stored(&[3; 100], 10);
        let mut batch = Batch::new();
        batch.put(Space::State, 5, &[3; 11]);
        disk.write(batch).unwrap();
        assert!(matches!(get(&disk), Err(StorageError::Corrupt { .. })));
    }
}
