//! Founding a cell without handing a vote to a node that lost its disk.
//!
//! A node that starts on an empty store cannot tell, on its own, whether it is new or lost its disk, when the file
//! that said it was a member went with the disk. A new node's vote is harmless; a node that lost its disk may have
//! acknowledged entries it no longer holds, and its vote could elect a candidate without them (an acknowledged
//! write lost). So every node of a founding cell that starts on an empty store starts *repairing* ([`crate::node::Past::Founding`]):
//! it neither votes nor campaigns until a leader has brought its log up to the leader's commit index, as a node that
//! is known to have lost its disk does.
//!
//! A new cell has no leader to repair from, so its founder (the founding node of lowest id) asks every other founder
//! first whether it holds anything (a log entry, a vote, a snapshot, a cell id). Only when every one answers that it
//! holds nothing does the founder found the cell and tell each of them, and itself, to vote: then no node holds
//! anything, so no vote can lose anything. If any founder holds something, the cell exists and the founder is the
//! node that lost its disk: it founds nothing and repairs from the cell's leader. A founder that is unreachable is
//! asked again; the founding waits for it, as the cell could not commit without it anyway.
//!
//! A founder that stopped after founding and before every other founder was told asks again when it starts, as long
//! as no election has happened (its term is 0): a node told to vote holds nothing then either.

use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::storage::{MetaKey, Space, Storage, StorageError};
use crate::types::{NodeAddrs, NodeId};

/// How long the founder waits for one founder's answer.
pub(crate) const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// The founder's question to another founder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundingRequest {
    /// Every founder holds nothing and the cell is founded: vote, unless you hold something now.
    pub vote: bool,
}

/// A founder's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundingAnswer {
    /// It holds something of a cell (a log entry, a vote, a snapshot or a cell id).
    pub holds: bool,
}

/// Asks a peer about founding, over the transport the node was started with.
pub trait AskFounding: Send + Sync + 'static {
    /// Sends `request` to peer `target`, reached at `addrs`, and returns its answer, or why there is none.
    fn ask(
        &self,
        target: NodeId,
        addrs: &NodeAddrs,
        request: FoundingRequest,
    ) -> BoxFuture<'static, Result<FoundingAnswer, String>>;
}

/// Whether `storage` holds nothing of a cell: no log entry, no state, no body, no vote and no cell id (its format mark
/// and a repair target it was started with are not of a cell).
pub(crate) fn holds_nothing<S: Storage>(storage: &S) -> Result<bool, StorageError> {
    for space in [Space::Log, Space::State, Space::Bodies] {
        if storage.key_bounds(space)?.is_some() {
            return Ok(false);
        }
    }
    for key in [MetaKey::Vote, MetaKey::CellId, MetaKey::Committed, MetaKey::LastPurged] {
        if storage.get(Space::Meta, key as u64)?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Batch, SimDisk};

    #[test]
    fn a_store_holds_nothing_until_it_holds_an_entry_a_vote_or_a_cell_id() {
        let disk = SimDisk::new(1);
        assert!(holds_nothing(&disk).unwrap());
        let mut batch = Batch::new();
        batch.put(Space::Meta, MetaKey::Format as u64, b"1");
        batch.put(Space::Meta, MetaKey::RepairTarget as u64, b"1");
        disk.write(batch).unwrap();
        assert!(holds_nothing(&disk).unwrap(), "a format mark and a repair target are not of a cell");
        for (space, key) in
            [(Space::Log, 1), (Space::Meta, MetaKey::Vote as u64), (Space::Meta, MetaKey::CellId as u64)]
        {
            let disk = SimDisk::new(1);
            let mut batch = Batch::new();
            batch.put(space, key, b"x");
            disk.write(batch).unwrap();
            assert!(!holds_nothing(&disk).unwrap(), "{space:?} {key}");
        }
    }
}
