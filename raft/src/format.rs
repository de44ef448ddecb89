//! The version of a node's storage layout, checked before anything else is read, and the migrations from every older
//! version to the current one.
//!
//! A data directory records the layout it was written in ([`MetaKey::Format`]). Opening it:
//! - an empty store gets the current format;
//! - an older format is brought to the current one by the migrations below, each written in one batch and synced
//!   with the new format mark, so a crash during an upgrade leaves the old format (migrated again next time) or the
//!   new one;
//! - a newer format is refused with [`StorageError::Unsupported`]: the node does not start, and nothing is dropped.
//!   (Before this check, a record a build could not decode counted as damage and was dropped.)
//!
//! Within a format, the encodings of what it stores are frozen: committed fixtures of a snapshot, a log record and a
//! Raft message must keep decoding (`core/tests/suite/snapshot.rs`, `raft/tests/formats.rs`), and a data directory written
//! by an earlier build must keep opening (`cli/tests/upgrade.rs`). Changing any of them is a new format and a
//! migration here.

use crate::log_store::read_meta;
use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};

/// The storage format this build writes, and the newest it reads.
///
/// History:
/// - 1: log entries (postcard `Entry` of a leader-stamped `Command`), the meta records of [`MetaKey`], the state as one
///   record (a snapshot file around a core snapshot of version 3, bodies by reference) at key 0 of `Space::State`,
///   bodies by key in `Space::Bodies`. Directories written before the format was recorded hold this layout.
/// - 2: the state snapshot in chunks ([`crate::stored_snapshot`]): a header at key 0, the bytes at keys 1, 2, …, so
///   that no record grows with the cell. Migrated from 1 by rewriting the one record as chunks.
/// - 3: log entries may carry commands run as a principal and the commands that manage principals, and the state is
///   a core snapshot of version 4 (principals). Migrated from 2 without a rewrite: every record of format 2 reads as
///   it is; the mark keeps a build that reads only format 2 from opening a directory it could no longer read.
/// - 4: the production store keeps the Raft log, with the `SyncedLog` and `Committed` meta records, in segment files
///   beside RocksDB instead of in it (`storage::segments`). Every record reads as it did through [`Storage`]; the
///   store moves them when it opens a directory of an earlier format, and the mark keeps a build that looks for the
///   log in RocksDB from opening a directory whose log it would not find.
pub const STORE_FORMAT: u32 = 4;

/// One migration: from the format named to the next, adding its writes to the batch.
type Migration<S> = fn(&S, &mut Batch) -> Result<(), StorageError>;

/// The migration from `from` to `from + 1`, for every format this build upgrades.
fn migration<S: Storage>(from: u32) -> Option<Migration<S>> {
    match from {
        // Written before the format was recorded: the layout of format 1, so there is nothing to rewrite.
        0 => Some(|_, _| Ok(())),
        1 => Some(chunk_the_snapshot),
        // Format 2's records read as they are in format 3.
        2 => Some(|_, _| Ok(())),
        // The production store moved the log when it opened the directory; through `Storage` nothing changed.
        3 => Some(|_, _| Ok(())),
        _ => None,
    }
}

/// 1 → 2: the one snapshot record becomes chunks. A record that does not verify is left as it is: it does not
/// decode as a header either, so recovery drops it as the damaged snapshot it is.
fn chunk_the_snapshot<S: Storage>(storage: &S, batch: &mut Batch) -> Result<(), StorageError> {
    match storage.get(Space::State, crate::stored_snapshot::HEADER_KEY) {
        Ok(Some(bytes)) => {
            crate::stored_snapshot::put(batch, &bytes, crate::stored_snapshot::SNAPSHOT_CHUNK_BYTES);
            Ok(())
        }
        Ok(None) | Err(StorageError::Corrupt { .. }) => Ok(()),
        Err(other) => Err(other),
    }
}

/// The format a directory whose mark does not verify is in, from what it holds: only format 2 stores anything past
/// key 0 of the state space (snapshot chunks), and a snapshot file is never empty, so a lone record at key 0 is a
/// format 1 snapshot. Formats 0 and 1 have the same layout.
fn inferred_format<S: Storage>(storage: &S) -> Result<u32, StorageError> {
    Ok(match storage.key_bounds(Space::State)? {
        Some((_, last)) if last >= 1 => 2,
        Some(_) => 1,
        None => STORE_FORMAT,
    })
}

/// What opening found about the format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormatCheck {
    /// The format the directory held, when it was migrated.
    pub migrated_from: Option<u32>,
    /// The format mark did not verify. The format is inferred from what the directory holds (see `inferred_format`),
    /// migrated if need be, and marked again.
    pub mark_damaged: bool,
}

/// Whether a store holds nothing but, at most, its format mark: a new store, or one whose disk was lost.
pub(crate) fn holds_nothing_but_its_mark<S: Storage>(storage: &S) -> Result<bool, StorageError> {
    let mark = MetaKey::Format as u64;
    for space in Space::ALL {
        let bounds = storage.key_bounds(space)?;
        if bounds.is_some_and(|bounds| !(space == Space::Meta && bounds == (mark, mark))) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Checks the format of a node's storage and migrates it to [`STORE_FORMAT`], before anything else reads it.
pub fn check_format<S: Storage>(storage: &S) -> Result<FormatCheck, StorageError> {
    let mut mark_damaged = false;
    let stored: Option<u32> = match read_meta(storage, MetaKey::Format) {
        Ok(stored) => stored,
        Err(StorageError::Corrupt { .. }) => {
            mark_damaged = true;
            Some(inferred_format(storage)?)
        }
        Err(other) => return Err(other),
    };
    let found = match stored {
        Some(version) => version,
        None if holds_nothing_but_its_mark(storage)? => {
            let mut batch = Batch::new();
            batch.put(Space::Meta, MetaKey::Format as u64, &encode(STORE_FORMAT));
            storage.write(batch)?;
            storage.sync()?;
            return Ok(FormatCheck::default());
        }
        None => 0,
    };
    if found > STORE_FORMAT {
        return Err(StorageError::Unsupported {
            reason: format!(
                "the data directory is in storage format {found}, written by a newer cellog; this build reads \
                 formats up to {STORE_FORMAT}"
            ),
        });
    }
    if found == STORE_FORMAT {
        if mark_damaged {
            let mut batch = Batch::new();
            batch.put(Space::Meta, MetaKey::Format as u64, &encode(STORE_FORMAT));
            storage.write(batch)?;
            storage.sync()?;
        }
        return Ok(FormatCheck { migrated_from: None, mark_damaged });
    }
    for from in found..STORE_FORMAT {
        let step = migration::<S>(from).ok_or_else(|| StorageError::Unsupported {
            reason: format!("this build cannot upgrade storage format {from}; upgrade through an earlier release"),
        })?;
        let mut batch = Batch::new();
        step(storage, &mut batch)?;
        batch.put(Space::Meta, MetaKey::Format as u64, &encode(from + 1));
        storage.write(batch)?;
        storage.sync()?;
    }
    Ok(FormatCheck { migrated_from: Some(found), mark_damaged })
}

fn encode(version: u32) -> Vec<u8> {
    postcard::to_stdvec(&version).expect("encoding into memory does not fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::SimDisk;

    #[test]
    fn an_empty_store_gets_the_current_format() {
        let disk = SimDisk::new(1);
        assert_eq!(check_format(&disk), Ok(FormatCheck::default()));
        assert_eq!(read_meta::<_, u32>(&disk, MetaKey::Format), Ok(Some(STORE_FORMAT)));
        assert_eq!(check_format(&disk), Ok(FormatCheck::default()));
    }

    #[test]
    fn an_unmarked_store_is_format_one_and_gets_marked() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        batch.put(Space::Log, 1, b"an entry");
        disk.write(batch).unwrap();
        assert_eq!(check_format(&disk), Ok(FormatCheck { migrated_from: Some(0), mark_damaged: false }));
        assert_eq!(read_meta::<_, u32>(&disk, MetaKey::Format), Ok(Some(STORE_FORMAT)));
        assert_eq!(disk.get(Space::Log, 1), Ok(Some(b"an entry".to_vec())), "the migration keeps what was stored");
    }

    #[test]
    fn a_newer_format_is_refused_and_nothing_is_dropped() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::Format as u64, &encode(STORE_FORMAT + 1));
        batch.put(Space::State, 0, b"a state");
        disk.write(batch).unwrap();
        let refused = check_format(&disk).unwrap_err();
        assert!(
            matches!(&refused, StorageError::Unsupported { reason } if reason.contains("newer cellog")),
            "{refused}"
        );
        assert_eq!(disk.get(Space::State, 0), Ok(Some(b"a state".to_vec())));
    }

    /// A format mark that does not verify.
    fn damage_the_mark(batch: &mut Batch) {
        let framed = b"not a framed record".to_vec();
        batch.writes.push(crate::storage::Write::Put { space: Space::Meta, key: MetaKey::Format as u64, framed });
    }

    #[test]
    fn a_damaged_mark_is_written_again() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        damage_the_mark(&mut batch);
        disk.write(batch).unwrap();
        assert_eq!(check_format(&disk), Ok(FormatCheck { migrated_from: None, mark_damaged: true }));
        assert_eq!(read_meta::<_, u32>(&disk, MetaKey::Format), Ok(Some(STORE_FORMAT)));
    }

    #[test]
    fn format_one_snapshots_become_chunks() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::Format as u64, &encode(1));
        batch.put(Space::State, 0, b"a whole snapshot file");
        disk.write(batch).unwrap();
        assert_eq!(check_format(&disk), Ok(FormatCheck { migrated_from: Some(1), mark_damaged: false }));
        assert_eq!(crate::stored_snapshot::get(&disk), Ok(Some(b"a whole snapshot file".to_vec())));
        assert_eq!(read_meta::<_, u32>(&disk, MetaKey::Format), Ok(Some(STORE_FORMAT)));
    }

    #[test]
    fn format_two_is_format_three_without_a_rewrite() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::Format as u64, &encode(2));
        crate::stored_snapshot::put(&mut batch, b"chunked snapshot", 4);
        disk.write(batch).unwrap();
        assert_eq!(check_format(&disk), Ok(FormatCheck { migrated_from: Some(2), mark_damaged: false }));
        assert_eq!(crate::stored_snapshot::get(&disk), Ok(Some(b"chunked snapshot".to_vec())));
        assert_eq!(read_meta::<_, u32>(&disk, MetaKey::Format), Ok(Some(STORE_FORMAT)));
    }

    #[test]
    fn a_damaged_format_one_snapshot_stays_damage() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::Format as u64, &encode(1));
        batch.writes.push(crate::storage::Write::Put { space: Space::State, key: 0, framed: b"garbage".to_vec() });
        disk.write(batch).unwrap();
        assert_eq!(check_format(&disk), Ok(FormatCheck { migrated_from: Some(1), mark_damaged: false }));
        assert!(matches!(crate::stored_snapshot::get(&disk), Err(StorageError::Corrupt { .. })));
    }

    #[test]
    fn a_damaged_mark_over_a_format_one_snapshot_still_migrates_it() {
        let disk = SimDisk::new(1);
        let mut batch = Batch::new();
        damage_the_mark(&mut batch);
        batch.put(Space::State, 0, b"a whole snapshot file");
        disk.write(batch).unwrap();
        assert_eq!(check_format(&disk), Ok(FormatCheck { migrated_from: Some(1), mark_damaged: true }));
        assert_eq!(crate::stored_snapshot::get(&disk), Ok(Some(b"a whole snapshot file".to_vec())));
        assert_eq!(read_meta::<_, u32>(&disk, MetaKey::Format), Ok(Some(STORE_FORMAT)));
    }
}
