//! Many cells: which cell owns a stream, at which ownership epoch.
//!
//! A deployment of many cells has a *directory*: a cell like any other whose state records each cell's addresses
//! and each stream's placement (its owning cell and ownership epoch). Any cell holds a [`Directory`] (empty unless it
//! is the deployment's directory), and every cell holds an [`Ownership`] per stream: how it sees its own right to
//! accept writes to that stream.
//!
//! A move of a stream from cell A to cell B, at epoch `e + 1`:
//! 1. the directory records B as owner at `e + 1`, with A as where it is moving from ([`Command::MoveStream`],
//!    compare-and-set on `e`, so two movers cannot both win);
//! 2. B is told it receives the stream at `e + 1` ([`Command::ReceiveStream`]): it refuses writes until step 4;
//! 3. A is fenced at `e + 1` ([`Command::FenceStream`]): from that entry on it refuses every write with
//!    [`Rejection::Moved`] naming B, and answers with its last position in each partition;
//! 4. B catches up to those positions, copying A's messages at the positions they hold there
//!    ([`Command::Ingest`]), then accepts at `e + 1` ([`Command::AcceptStream`], refused until B holds every
//!    partition through A's positions);
//! 5. the directory records the move done ([`Command::FinishMove`]).
//!
//! Epochs only rise, on both sides: a fence, receive or accept at an epoch below the one a cell holds is refused with
//! [`Rejection::StaleEpoch`], and the same one again is answered as before (a retried step changes nothing). So no
//! epoch has two cells accepting writes: A accepts only below `e + 1`, B only from it.
//!
//! [`Command::MoveStream`]: crate::Command::MoveStream
//! [`Command::ReceiveStream`]: crate::Command::ReceiveStream
//! [`Command::FenceStream`]: crate::Command::FenceStream
//! [`Command::AcceptStream`]: crate::Command::AcceptStream
//! [`Command::Ingest`]: crate::Command::Ingest
//! [`Command::FinishMove`]: crate::Command::FinishMove
//! [`Rejection::Moved`]: crate::Rejection::Moved
//! [`Rejection::StaleEpoch`]: crate::Rejection::StaleEpoch

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::snapshot::v8;

/// Most cells one directory records.
pub const MAX_CELLS: usize = 1024;
/// Most addresses one cell is recorded with (one per node, usually three or five).
pub const MAX_CELL_ADDRESSES: usize = 9;
/// Longest address of a cell's node.
pub const MAX_ADDRESS_BYTES: usize = 256;
/// Most streams one directory places.
pub const MAX_PLACEMENTS: usize = 100_000;

/// Where a stream lives, as the directory records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The cell that owns it (or receives it, while it moves).
    pub cell: Arc<str>,
    /// Its ownership epoch: 1 when placed, one more at every move.
    pub epoch: u64,
    /// While a move is under way: the cell it moves from.
    pub moving_from: Option<Arc<str>>,
}

/// The directory's state: cells and their addresses, and streams' placements.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Directory {
    pub(crate) cells: BTreeMap<Arc<str>, Vec<String>>,
    pub(crate) placements: BTreeMap<Arc<str>, Placement>,
}

impl Directory {
    /// A cell's recorded addresses.
    pub fn cell(&self, name: &str) -> Option<&[String]> {
        self.cells.get(name).map(Vec::as_slice)
    }

    /// Every cell with its addresses, in name order.
    pub fn cells(&self) -> impl Iterator<Item = (&Arc<str>, &[String])> {
        self.cells.iter().map(|(name, addresses)| (name, addresses.as_slice()))
    }

    /// A stream's placement.
    pub fn placement(&self, stream: &str) -> Option<&Placement> {
        self.placements.get(stream)
    }

    /// Every placement, in stream name order.
    pub fn placements(&self) -> impl Iterator<Item = (&Arc<str>, &Placement)> {
        self.placements.iter()
    }

    /// Whether nothing is recorded (every cell but a directory).
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty() && self.placements.is_empty()
    }
}

/// A stream's ownership as the cell that holds it sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ownership {
    /// This cell accepts writes at `epoch`. A stream no directory ever moved is owned at epoch 0.
    Owned {
        /// The epoch it owns the stream at.
        epoch: u64,
    },
    /// Moving here at `epoch` from `from`: writes are refused until the cell has caught up and accepts.
    Receiving {
        /// The epoch it will own the stream at.
        epoch: u64,
        /// The cell it moves from.
        from: Arc<str>,
    },
    /// Moved away at `epoch` to `to`: every write is refused, naming `to`.
    Moved {
        /// The epoch it moved at.
        epoch: u64,
        /// The cell that owns it from `epoch`.
        to: Arc<str>,
    },
}

impl Ownership {
    /// Its epoch.
    pub fn epoch(&self) -> u64 {
        match self {
            Ownership::Owned { epoch } | Ownership::Receiving { epoch, .. } | Ownership::Moved { epoch, .. } => *epoch,
        }
    }
}

impl std::fmt::Display for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ownership::Owned { epoch } => write!(f, "owned at epoch {epoch}"),
            Ownership::Receiving { epoch, from } => write!(f, "receiving at epoch {epoch} from cell {from:?}"),
            Ownership::Moved { epoch, to } => write!(f, "moved at epoch {epoch} to cell {to:?}"),
        }
    }
}

/// The ownership of a stream this cell never heard of a move for.
pub(crate) const OWNED_HERE: Ownership = Ownership::Owned { epoch: 0 };

impl From<v8::Directory> for Directory {
    fn from(directory: v8::Directory) -> Self {
        let v8::Directory { cells, placements } = directory;
        let placements = placements
            .into_iter()
            .map(|(stream, v8::Placement { cell, epoch, moving_from })| {
                (stream, Placement { cell, epoch, moving_from })
            })
            .collect();
        Directory { cells, placements }
    }
}

impl From<v8::Ownership> for Ownership {
    fn from(ownership: v8::Ownership) -> Self {
        match ownership {
            v8::Ownership::Owned { epoch } => Ownership::Owned { epoch },
            v8::Ownership::Receiving { epoch, from } => Ownership::Receiving { epoch, from },
            v8::Ownership::Moved { epoch, to } => Ownership::Moved { epoch, to },
        }
    }
}
