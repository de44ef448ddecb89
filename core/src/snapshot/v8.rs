//! The frozen shape of a version 8 snapshot's state: version 7's, the directory's records (cells and placements) and
//! each moved stream's ownership. Every type of versions 3 to 7 is used as it is (they never change); the types here
//! mirror the in-memory types of the same name as they were when version 8 was current. Nothing here may change: a
//! change to the encoding is a new version (see [`super`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4, v6, v7};

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Cell {
    pub last_at: v3::Millis,
    pub n_applied: u64,
    pub streams: BTreeMap<Arc<str>, v3::Stream>,
    pub stream_names: BTreeMap<u64, Arc<str>>,
    pub next_stream_id: u64,
    pub producers: BTreeMap<u64, v6::Producer>,
    pub transactional_ids: BTreeMap<Arc<str>, u64>,
    pub next_producer_id: u64,
    pub timers: v3::Timers,
    pub pinned_by: BTreeMap<v3::MessageRef, v3::MessageRef>,
    pub next_body: u64,
    pub auth: v4::Auth,
    pub groups: v7::Groups,
    pub directory: Directory,
    pub ownership: BTreeMap<Arc<str>, Ownership>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Placement {
    pub cell: Arc<str>,
    pub epoch: u64,
    pub moving_from: Option<Arc<str>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Directory {
    pub cells: BTreeMap<Arc<str>, Vec<String>>,
    pub placements: BTreeMap<Arc<str>, Placement>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Ownership {
    Owned { epoch: u64 },
    Receiving { epoch: u64, from: Arc<str> },
    Moved { epoch: u64, to: Arc<str> },
}

impl Cell {
    /// Its version 7 part, the directory and the ownership records.
    pub fn split(self) -> (v7::Cell, Directory, BTreeMap<Arc<str>, Ownership>) {
        let Cell {
            last_at,
            n_applied,
            streams,
            stream_names,
            next_stream_id,
            producers,
            transactional_ids,
            next_producer_id,
            timers,
            pinned_by,
            next_body,
            auth,
            groups,
            directory,
            ownership,
        } = self;
        let state = v7::Cell {
            last_at,
            n_applied,
            streams,
            stream_names,
            next_stream_id,
            producers,
            transactional_ids,
            next_producer_id,
            timers,
            pinned_by,
            next_body,
            auth,
            groups,
        };
        (state, directory, ownership)
    }
}
