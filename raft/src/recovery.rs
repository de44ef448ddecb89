//! Opening a node's storage: every record is verified before the node serves, votes or acknowledges anything.
//!
//! A log suffix that does not verify (a flipped bit, a torn or misdirected write, a hole) is cut off, and one past
//! the last index the node held is recorded as its *repair target*: until its log reaches that index from a leader,
//! the node must neither vote nor campaign, because it may have acknowledged entries it no longer has. (A damaged
//! last record past the last synced append is a torn write of an unsynced entry and is cut without a target.) A snapshot
//! that does not verify, or that stops short of where the log was purged, is dropped; if the log no longer reaches back
//! to the start, the log goes too and the node gets everything from the leader. A vote that does not verify is dropped and the node repairs: it may have
//! voted in a term it no longer knows, so it votes in none until a leader has brought its log past everything it
//! held, and past the commit index a leader of that leader's own term told it (see `node::repair_goal`): what it held is
//! what the damage may have hidden from it. A node whose log goes only because its state was dropped for a damaged
//! body (the log, the vote, the purge record and the snapshot's own file verified) still knows what it held: its last log id is recorded as its *vote floor*, and
//! while it repairs it votes for a candidate whose log reaches that id, as Raft's rule asks of the log it no longer
//! has, and for no other. So a cell whose other node repairs too still has a majority to elect the node that holds
//! everything. A message body that failed to read back while the node ran ([`MetaKey::BodiesDamaged`])
//! counts as a damaged snapshot: the state and every body are dropped, and the node gets them again from the log or
//! from the leader's snapshot. Bodies are otherwise verified when read, not here, so that a restart does not read
//! every retained byte, unless the start found damage to a record the node had written (a log entry that was synced,
//! the vote, a repair, commit, sync or purge record): a disk that damaged one record may have damaged others the node has not read
//! since, and a body of the kept state damaged unseen would stop the node later, when it leads and sends a snapshot,
//! and perhaps while another node repairs. So that start verifies every body the kept state refers to, and one that
//! is missing or does not verify counts as a body found damaged while the node ran.

use crate::log_store::{LogSizes, LogStore, decode_entry, read_meta};
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
    /// The stored vote did not verify and was dropped.
    pub vote_dropped: bool,
    /// The stored snapshot did not verify, or a body had failed to read back, and the state was dropped.
    pub snapshot_dropped: bool,
    /// A body had failed to read back while the node ran.
    pub bodies_damaged: bool,
    /// The node must hold the log up to this index again before it votes or campaigns.
    pub repair_target: Option<u64>,
    /// While it repairs, the node votes for a candidate whose last log id is at least this one (see the module doc);
    /// without one it votes for nobody.
    pub vote_floor: Option<LogId>,
    /// Log entries verified.
    pub n_entries_verified: u64,
    /// The storage format the directory held, when it was migrated to the current one.
    pub format_migrated_from: Option<u32>,
}

/// What a scan of the log found.
struct LogScan {
    /// The first index that does not verify or is missing, and why.
    first_bad: Option<(u64, String)>,
    /// The first bad record is the last one stored and is damaged (not missing): what a torn write leaves.
    torn_tail: bool,
    /// Entries verified before it.
    n_verified: u64,
    /// The last stored index.
    last: Option<u64>,
    /// The log id of the last entry that verified.
    last_verified: Option<LogId>,
}

/// Finds the first log index that does not verify (or is missing), from the one after the last purged entry (or
/// the first stored entry when nothing was purged), and records the size of each entry that verifies in `sizes`.
fn scan_log<S: Storage>(storage: &S, last_purged: Option<LogId>, sizes: &LogSizes) -> Result<LogScan, StorageError> {
    let Some((first, last)) = storage.key_bounds(Space::Log)? else {
        return Ok(LogScan { first_bad: None, torn_tail: false, n_verified: 0, last: None, last_verified: None });
    };
    let mut scan = LogScan { first_bad: None, torn_tail: false, n_verified: 0, last: Some(last), last_verified: None };
    let mut expected = last_purged.map_or(first, |purged| purged.index + 1);
    while expected <= last {
        let records = storage.scan_framed(Space::Log, expected..last.saturating_add(1), SCAN_CHUNK)?;
        if records.is_empty() {
            break;
        }
        for (index, framed) in records {
            if index != expected {
                scan.first_bad = Some((expected, format!("missing entry (next stored is {index})")));
                return Ok(scan);
            }
            let verified =
                crate::storage::unframe(Space::Log, index, &framed).and_then(|payload| decode_entry(index, payload));
            match verified {
                Ok(entry) => scan.last_verified = Some(entry.log_id),
                Err(error) => {
                    scan.first_bad = Some((index, error.to_string()));
                    scan.torn_tail = index == last;
                    return Ok(scan);
                }
            }
            sizes.insert(index, framed.len() as u64);
            scan.n_verified += 1;
            expected += 1;
        }
    }
    Ok(scan)
}

fn encoded<T: serde::Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("encoding into memory does not fail")
}

/// A meta record, or `None` with `damaged` set when it does not verify.
fn meta_or_damaged<S: Storage, T: serde::de::DeserializeOwned>(
    storage: &S,
    key: MetaKey,
    damaged: &mut bool,
) -> Result<Option<T>, StorageError> {
    match read_meta(storage, key) {
        Ok(value) => Ok(value),
        Err(StorageError::Corrupt { .. }) => {
            *damaged = true;
            Ok(None)
        }
        Err(other) => Err(other),
    }
}

/// Verifies a node's storage, repairs what it can, and opens the log and state-machine stores. Every repair is
/// written in one batch and synced before anything is opened, so a crash during recovery leaves either the old state
/// (found damaged again next time) or the repaired one.
pub fn open_stores<S: Storage + Clone>(
    storage: S,
) -> Result<(LogStore<S>, StateMachineStore<S>, Recovery), StorageError> {
    // A repair is itself a write, which a failing disk can damage too: verify again until a pass finds nothing to
    // repair. What each pass found adds up.
    let format = crate::format::check_format(&storage)?;
    let mut recovery = Recovery { format_migrated_from: format.migrated_from, ..Recovery::default() };
    let sizes = LogSizes::default();
    for _ in 0..MAX_REPAIR_PASSES {
        sizes.clear();
        let (pass, repaired, state_machine) = repair_pass(&storage, &sizes)?;
        recovery.log_cut_from = match (recovery.log_cut_from, pass.log_cut_from) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        recovery.log_cut_reason = recovery.log_cut_reason.or(pass.log_cut_reason);
        recovery.vote_dropped |= pass.vote_dropped;
        recovery.snapshot_dropped |= pass.snapshot_dropped;
        recovery.bodies_damaged |= pass.bodies_damaged;
        recovery.repair_target = recovery.repair_target.max(pass.repair_target);
        // The floor the last pass found stored and kept: a pass that found the log or the vote damaged dropped it.
        recovery.vote_floor = pass.vote_floor;
        recovery.n_entries_verified = pass.n_entries_verified;
        if !repaired {
            // Opened by this pass, which wrote nothing.
            let state_machine = match state_machine {
                Some(state_machine) => state_machine,
                None => StateMachineStore::open(storage.clone())?,
            };
            return Ok((LogStore::new(storage, sizes), state_machine, recovery));
        }
    }
    Err(StorageError::Io { reason: format!("storage still needs repair after {MAX_REPAIR_PASSES} passes") })
}

/// Bodies read per batch while a start verifies them all.
const SCRUB_CHUNK: usize = 1024;

/// The first body the state kept in `state_machine` refers to that is missing or does not verify, and why.
fn first_damaged_body<S: Storage + Clone>(state_machine: &StateMachineStore<S>) -> Option<(u64, String)> {
    let refs = state_machine.replica().lock().map(|replica| replica.cell.body_refs()).unwrap_or_default();
    let bodies = state_machine.bodies();
    refs.chunks(SCRUB_CHUNK).find_map(|chunk| {
        let chunk: Vec<_> = chunk.iter().collect();
        let reads = bodies.read_many(&chunk);
        chunk.iter().zip(reads).find_map(|(body, read)| read.err().map(|error| (body.key, error.to_string())))
    })
}

/// Verification passes before a node gives up on its storage.
const MAX_REPAIR_PASSES: usize = 8;

/// One verification pass: what it found, whether it wrote a repair, and the state machine it opened. The size of
/// each log entry that verified is in `sizes`.
#[allow(clippy::type_complexity)]
fn repair_pass<S: Storage + Clone>(
    storage: &S,
    sizes: &LogSizes,
) -> Result<(Recovery, bool, Option<StateMachineStore<S>>), StorageError> {
    let storage = storage.clone();
    let mut recovery = Recovery::default();
    let mut batch = Batch::new();
    let log_bounds = storage.key_bounds(Space::Log)?;
    let highest_held = log_bounds.map(|(_, last)| last);
    let vote: Option<openraft::Vote<NodeId>> = meta_or_damaged(&storage, MetaKey::Vote, &mut recovery.vote_dropped)?;

    let mut target_damaged = false;
    let mut repair_target: Option<u64> = meta_or_damaged(&storage, MetaKey::RepairTarget, &mut target_damaged)?;
    let stored_target = repair_target.filter(|_| !target_damaged);
    let mut floor_damaged = false;
    let stored_floor: Option<LogId> = meta_or_damaged(&storage, MetaKey::VoteFloor, &mut floor_damaged)?;
    let floor_stored = stored_floor.is_some() || floor_damaged;
    let stored_target = if floor_stored && repair_target.is_none() && !target_damaged {
        // A floor is only ever stored beside a repair target: one without it lost its target to the disk.
        target_damaged = true;
        None
    } else {
        stored_target
    };
    if recovery.vote_dropped {
        // See the module doc: the node may have voted in a term it no longer knows, so it votes in none until a
        // leader has brought it up to date (and so taught it the current term).
        batch.delete_range(Space::Meta, MetaKey::Vote as u64..MetaKey::Vote as u64 + 1);
        repair_target = Some(repair_target.unwrap_or(0).max(highest_held.map_or(0, |last| last + 1)));
    }
    if target_damaged {
        // The node was repairing and no longer knows how far it must get: at least one entry past all it holds.
        repair_target = Some(highest_held.map_or(0, |last| last + 1));
    }
    let mut committed_damaged = false;
    let _: Option<Option<LogId>> = meta_or_damaged(&storage, MetaKey::Committed, &mut committed_damaged)?;
    let mut synced_damaged = false;
    let synced: Option<u64> = meta_or_damaged(&storage, MetaKey::SyncedLog, &mut synced_damaged)?;
    let mut purged_damaged = false;
    let mut last_purged: Option<LogId> = meta_or_damaged(&storage, MetaKey::LastPurged, &mut purged_damaged)?;
    // Damage to a record the node wrote (not a start that lost only what was never synced): the disk is suspect.
    let mut disk_damaged = recovery.vote_dropped
        || target_damaged
        || floor_damaged
        || committed_damaged
        || synced_damaged
        || purged_damaged;
    // Without a purge record the log must start at index 0. One that starts later lost that record (its write went
    // astray or was torn after the entries it covered were deleted), or never had it (a snapshot installed, and the
    // purge it implies not yet recorded): either way it is handled as a damaged purge record.
    if last_purged.is_none() && log_bounds.is_some_and(|(first, _)| first > 0) {
        purged_damaged = true;
    }

    recovery.bodies_damaged = match storage.get(Space::Meta, MetaKey::BodiesDamaged as u64) {
        Ok(mark) => mark.is_some(),
        Err(StorageError::Corrupt { .. }) => true,
        Err(other) => return Err(other),
    };
    let mut wipe = false;
    let mut opened = None;
    // A damaged body is a damaged state: it is dropped as a snapshot that does not verify is.
    let opening =
        if recovery.bodies_damaged { Err(None) } else { StateMachineStore::open(storage.clone()).map_err(Some) };
    // The state must reach the purged log: what lies between is in neither. A snapshot that stops short of the purge
    // record, or an empty state beside one, lost its own records to the disk (a batch gone astray as a whole), and
    // is damaged as one that does not verify.
    let short_of_the_log = |last: Option<LogId>| match (last_purged, last) {
        (Some(purged), Some(last)) => last.index < purged.index,
        (Some(_), None) => true,
        (None, _) => false,
    };
    let opening = opening.and_then(|state_machine| {
        let last = state_machine.replica().lock().map(|r| r.last_applied).unwrap_or(None);
        if short_of_the_log(last) { Err(None) } else { Ok((state_machine, last)) }
    });
    // What the snapshot covers, when that is known: a snapshot dropped because it does not verify (or lost records)
    // may have been installed from a leader past everything the log says, so only its own file can tell.
    let snapshot_known: Option<Option<LogId>>;
    let snapshot_last = match opening {
        Ok((state_machine, last)) => {
            opened = Some(state_machine);
            snapshot_known = Some(last);
            last
        }
        Err(None | Some(StorageError::Corrupt { .. })) => {
            // Dropped for a damaged body alone, its file may still verify and reach the log.
            snapshot_known = if recovery.bodies_damaged {
                match crate::state_machine::stored_last_applied(&storage) {
                    Ok(last) => Some(last).filter(|last| !short_of_the_log(*last)),
                    Err(StorageError::Corrupt { .. }) => None,
                    Err(other) => return Err(other),
                }
            } else {
                None
            };
            recovery.snapshot_dropped = true;
            batch.delete_range(Space::State, 0..u64::MAX);
            batch.delete_range(Space::Bodies, 0..u64::MAX);
            batch.delete_range(Space::Meta, MetaKey::BodiesDamaged as u64..MetaKey::BodiesDamaged as u64 + 1);
            // Without the snapshot the log cannot rebuild the state if it no longer reaches back to the start.
            wipe = last_purged.is_some() || purged_damaged;
            None
        }
        Err(Some(other)) => return Err(other),
    };
    if purged_damaged && !wipe {
        // Nothing before the snapshot is needed: purge up to it again and record that.
        match snapshot_last {
            Some(snapshot_last) => {
                batch.delete_range(Space::Log, 0..snapshot_last.index + 1);
                batch.put(Space::Meta, MetaKey::LastPurged as u64, &encoded(&snapshot_last));
                last_purged = Some(snapshot_last);
            }
            None => wipe = true,
        }
    }

    // What the node knows it held, if it can know: its vote, its repair target and its purge record are intact, and
    // it either was not repairing or kept the floor it repairs with.
    let floor_known = !(recovery.vote_dropped || target_damaged || floor_damaged || purged_damaged)
        && (stored_target.is_none() || stored_floor.is_some());
    let mut vote_floor = None;
    if wipe {
        // Take everything from the leader; until then the node votes only as what it held allows. The log goes
        // because the state cannot be rebuilt from it; if every entry of it verifies, and the snapshot says what it
        // covered, the last id the node held is known.
        if floor_known && let Some(snapshot) = snapshot_known {
            let scan = scan_log(&storage, last_purged, &LogSizes::default())?;
            if scan.first_bad.is_none() {
                vote_floor = stored_floor.max(scan.last_verified).max(last_purged).max(snapshot);
            }
        }
        batch.delete_range(Space::Log, 0..u64::MAX);
        batch.delete_range(Space::Bodies, 0..u64::MAX);
        batch.delete_range(Space::Meta, MetaKey::LastPurged as u64..MetaKey::LastPurged as u64 + 1);
        let held = highest_held.or(last_purged.map(|id| id.index)).unwrap_or(0);
        repair_target = Some(repair_target.unwrap_or(0).max(held + 1));
    } else {
        let scan = scan_log(&storage, last_purged, sizes)?;
        recovery.n_entries_verified = scan.n_verified;
        if let (Some((index, reason)), Some(last)) = (scan.first_bad, scan.last) {
            batch.delete_range(Space::Log, index..u64::MAX);
            recovery.log_cut_from = Some(index);
            recovery.log_cut_reason = Some(reason);
            // A damaged last record is what a torn write leaves, and a torn write only ever hits a write that was
            // never synced, so never acknowledged: cutting it costs nothing. Damage anywhere else may have taken
            // acknowledged entries, and a misdirected write may have moved the last one: the node must get at least
            // one entry past everything it held before it votes again.
            // A damaged last record is torn only if no synced append reached it: a synced record that fails to
            // verify was damaged after the fact (a flipped bit, a write that went astray) and may have been
            // acknowledged.
            let never_synced = !synced_damaged && synced.is_some_and(|synced| index > synced);
            if !(scan.torn_tail && never_synced) {
                repair_target = Some(repair_target.unwrap_or(0).max(last + 1));
                disk_damaged = true;
            }
        }
    }
    if disk_damaged
        && !recovery.bodies_damaged
        && let Some(state_machine) = &opened
        && let Some((key, reason)) = first_damaged_body(state_machine)
    {
        // See the module doc: the damage found may not be all there is. A body of the kept state that does not
        // verify is marked as one found damaged while the node ran, and the next pass drops the state for it.
        tracing::error!(key, reason, "a message body does not verify; the state is dropped and taken from the leader");
        batch.put(Space::Meta, MetaKey::BodiesDamaged as u64, &key.to_le_bytes());
    }

    if !wipe && floor_known && !recovery.snapshot_dropped && recovery.log_cut_from.is_none() {
        // Still repairing as it was: whatever it holds now past the floor, Raft's own rule checks against.
        vote_floor = stored_floor;
    }
    let vote_floor = vote_floor.filter(|_| repair_target.is_some());
    if vote_floor != stored_floor || floor_damaged {
        match vote_floor {
            Some(floor) => batch.put(Space::Meta, MetaKey::VoteFloor as u64, &encoded(&floor)),
            None => batch.delete_range(Space::Meta, MetaKey::VoteFloor as u64..MetaKey::VoteFloor as u64 + 1),
        };
    }

    if wipe || recovery.log_cut_from.is_some() || recovery.snapshot_dropped || committed_damaged {
        // What was committed may no longer be in this node's log; the leader will say again.
        batch.put(Space::Meta, MetaKey::Committed as u64, &encoded(&None::<LogId>));
    }
    if let Some(target) = repair_target {
        if repair_target != stored_target {
            batch.put(Space::Meta, MetaKey::RepairTarget as u64, &encoded(&target));
        }
        // A node that led with the entries it lost must not come back as leader of that term: it would hand out
        // the lost indexes again. An uncommitted vote makes it start as a follower.
        if let Some(vote) = vote.filter(|vote| vote.committed) {
            batch.put(Space::Meta, MetaKey::Vote as u64, &encoded(&openraft::Vote { committed: false, ..vote }));
        }
    }
    let repaired = !batch.is_empty();
    if repaired {
        storage.write(batch)?;
        storage.sync()?;
    }
    recovery.repair_target = repair_target;
    recovery.vote_floor = vote_floor;
    Ok((recovery, repaired, opened))
}

/// Records that the node holds its log up to its repair target again: it may vote and campaign.
pub fn clear_repair_target<S: Storage>(storage: &S) -> Result<(), StorageError> {
    let mut batch = Batch::new();
    batch.delete_range(Space::Meta, MetaKey::RepairTarget as u64..MetaKey::RepairTarget as u64 + 1);
    batch.delete_range(Space::Meta, MetaKey::VoteFloor as u64..MetaKey::VoteFloor as u64 + 1);
    storage.write(batch)?;
    storage.sync()
}
