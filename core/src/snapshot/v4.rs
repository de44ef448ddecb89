//! The frozen shape of a version 4 snapshot's state: version 3's, then the cell's principals. Every type of version 3
//! is used as it is (it never changes); the types here mirror the in-memory types of the same name as they were when
//! version 4 was current. Nothing here may change: a change to the encoding is a new version (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::v3;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Cell {
    pub last_at: v3::Millis,
    pub n_applied: u64,
    pub streams: BTreeMap<Arc<str>, v3::Stream>,
    pub stream_names: BTreeMap<u64, Arc<str>>,
    pub next_stream_id: u64,
    pub producers: BTreeMap<u64, v3::Producer>,
    pub transactional_ids: BTreeMap<Arc<str>, u64>,
    pub next_producer_id: u64,
    pub timers: v3::Timers,
    pub pinned_by: BTreeMap<v3::MessageRef, v3::MessageRef>,
    pub next_body: u64,
    pub auth: Auth,
}

impl Cell {
    /// Its version 3 part, and its principals.
    pub fn split(self) -> (v3::Cell, Auth) {
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
        } = self;
        let state = v3::Cell {
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
        };
        (state, auth)
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Auth {
    pub principals: BTreeMap<Arc<str>, Principal>,
    pub producer_owners: BTreeMap<u64, Arc<str>>,
    pub reserved: BTreeSet<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Principal {
    pub grants: Grants,
    pub tokens: BTreeSet<TokenHash>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Grants {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    pub consume: Vec<String>,
    pub admin: bool,
    pub cluster_admin: bool,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct TokenHash(pub [u8; 32]);
