//! The frozen shape of a version 7 snapshot's state: version 6's and the consumer groups (their members, assignments
//! and owners). Every type of versions 3 to 6 is used as it is (they never change); the types here mirror the
//! in-memory types of the same name as they were when version 7 was current. Nothing here may change: a change to the
//! encoding is a new version (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4, v6};

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
    pub groups: Groups,
}

/// Consumer groups by (stream, group).
pub(crate) type Groups = BTreeMap<(Arc<str>, Arc<str>), Group>;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Strategy {
    Range,
    RoundRobin,
    Sticky,
    CooperativeSticky,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Member {
    pub joined_at: v3::Millis,
    pub session_timeout_ms: u64,
    pub expires_at: v3::Millis,
    pub assigned: BTreeSet<u32>,
    pub owned: BTreeMap<u32, u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Group {
    pub strategy: Strategy,
    pub n_partitions: u32,
    pub generation: u64,
    pub members: BTreeMap<Arc<str>, Member>,
    pub revoking_all: bool,
    pub created_at: v3::Millis,
    pub n_rebalances: u64,
}

impl Cell {
    /// Its version 6 part, and the groups.
    pub fn split(self) -> (v6::Cell, Groups) {
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
        } = self;
        let state = v6::Cell {
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
        };
        (state, groups)
    }
}
