//! Opening a node's storage: every record is verified before the node serves, votes or acknowledges anything.
//!
//! A log suffix that does not verify (a flipped bit, a torn or misdirected write, a hole) is cut off, and the last
//! index the node held is recorded as its *repair target*: until its log reaches that index again from the leader,
//! the node must neither vote nor campaign, because it may have acknowledged entries it no longer has. A snapshot
//! that does not verify is dropped; if the log no longer reaches back to the start, the log goes too and the node
//! gets everything from the leader. A vote that does not verify stops the node: starting without knowing what it
//! voted could let it vote twice in one term.

use crate::log_store::{LogStore, decode_entry, read_meta};
use crate::state_machine::StateMachineStore;
use crate::storage::{Batch, MetaKey, Space, Storage, StorageError};
use crate::types::{LogId, NodeId};

/// Log records verified per read while scanning.
const SCAN_CHUNK: usize = 4096;

/// What opening found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The log was cut from this index on, because the entry there did not verify.
    pub log_cut_from: Option<u64>,
    /// Why, when it was cut.
    pub log_cut_reason: Option<String>,
    /// The stored snapshot did not verify and was dropped.
    pub snapshot_dropped: bool,
    /// The node must hold the log up to this index again before it votes or campaigns.
    pub repair_target: Option<u64>,
    /// Log entries verified.
    pub n_entries_verified: u64,
}

/// What a scan of the log found.
struct LogScan {
    /// The first index that does not verify or is missing, and why.
    first_bad: Option<(u64, String)>,
    /// Entries verified before it.
    n_verified: u64,
    /// The last stored index.
    last: Option<u64>,
}

/// Finds the first log index that does not verify (or is missing), scanning from the first stored entry.
fn scan_log<S: Storage>(storage: &S) -> Result<LogScan, StorageError> {
    let Some((first, last)) = storage.key_bounds(Space::Log)? else {
        return Ok(LogScan { first_bad: None, n_verified: 0, last: None });
    };
    let mut scan = LogScan { first_bad: None, n_verified: 0, last: Some(last) };
    let mut expected = first;
    while expected <= last {
        let records = storage.scan_sealed(Space::Log, expected..last.saturating_add(1), SCAN_CHUNK)?;
        if records.is_empty() {
            scan.first_bad = Some((expected, "missing entry".to_string()));
            return Ok(scan);
        }
        for (index, sealed) in records {
            if index != expected {
                scan.first_bad = Some((expected, format!("missing entry (next stored is {index})")));
                return Ok(scan);
            }
            let verified =
                crate::storage::open(Space::Log, index, &sealed).and_then(|payload| decode_entry(index, payload));
            if let Err(error) = verified {
                scan.first_bad = Some((index, error.to_string()));
                return Ok(scan);
            }
            scan.n_verified += 1;
            expected += 1;
        }
    }
    Ok(scan)
}

/// Verifies a node's storage, repairs what it can, and opens the log and state-machine stores.
pub fn open_stores<S: Storage + Clone>(
    storage: S,
) -> Result<(LogStore<S>, StateMachineStore<S>, Recovery), StorageError> {
    // The vote must verify: see the module doc.
    let _vote: Option<openraft::Vote<NodeId>> = read_meta(&storage, MetaKey::Vote)?;
    let mut recovery = Recovery::default();
    let mut repair_target: Option<u64> = match read_meta(&storage, MetaKey::RepairTarget) {
        Ok(target) => target,
        // A damaged repair mark is replaced by the conservative one computed below.
        Err(StorageError::Corrupt { .. }) => None,
        Err(other) => return Err(other),
    };
    let mut batch = Batch::new();

    let scan = scan_log(&storage)?;
    recovery.n_entries_verified = scan.n_verified;
    if let (Some((index, reason)), Some(last)) = (scan.first_bad, scan.last) {
        batch.delete_range(Space::Log, index..u64::MAX);
        recovery.log_cut_from = Some(index);
        recovery.log_cut_reason = Some(reason);
        repair_target = Some(repair_target.unwrap_or(0).max(last));
    }

    let state_machine = match StateMachineStore::open(storage.clone()) {
        Ok(state_machine) => state_machine,
        Err(StorageError::Corrupt { .. }) => {
            recovery.snapshot_dropped = true;
            batch.delete_range(Space::State, 0..u64::MAX);
            let last_purged: Option<LogId> = read_meta(&storage, MetaKey::LastPurged).unwrap_or(None);
            if last_purged.is_some() {
                // Without the snapshot the log cannot rebuild the state from its start: take both from the leader.
                let last = storage.key_bounds(Space::Log)?.map(|(_, last)| last).or(last_purged.map(|id| id.index));
                batch.delete_range(Space::Log, 0..u64::MAX);
                batch.delete_range(Space::Meta, MetaKey::LastPurged as u64..MetaKey::LastPurged as u64 + 1);
                repair_target = Some(repair_target.unwrap_or(0).max(last.unwrap_or(0)));
            }
            storage.write(std::mem::take(&mut batch))?;
            storage.sync()?;
            StateMachineStore::open(storage.clone())?
        }
        Err(other) => return Err(other),
    };

    if recovery.log_cut_from.is_some() || recovery.snapshot_dropped {
        // What was committed may no longer be in this node's log; the leader will say again.
        let none: Option<LogId> = None;
        batch.put(Space::Meta, MetaKey::Committed as u64, &postcard::to_stdvec(&none).expect("in memory"));
    }
    if let Some(target) = repair_target {
        batch.put(Space::Meta, MetaKey::RepairTarget as u64, &postcard::to_stdvec(&target).expect("in memory"));
    }
    if !batch.is_empty() {
        storage.write(batch)?;
        storage.sync()?;
    }
    recovery.repair_target = repair_target;
    Ok((LogStore::new(storage), state_machine, recovery))
}

/// Records that the node holds its log up to its repair target again: it may vote and campaign.
pub fn clear_repair_target<S: Storage>(storage: &S) -> Result<(), StorageError> {
    let mut batch = Batch::new();
    batch.delete_range(Space::Meta, MetaKey::RepairTarget as u64..MetaKey::RepairTarget as u64 + 1);
    storage.write(batch)?;
    storage.sync()
}
