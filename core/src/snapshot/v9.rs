//! The frozen shape of a version 9 snapshot's state: version 8's, and the mirrors and recall logs. Every type of
//! versions 3 to 8 is used as it is (they never change); the types here mirror the in-memory types of the same name as
//! they were when version 9 was current. Nothing here may change: a change to the encoding is a new version (see
//! [`super`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4, v6, v7, v8};

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
    pub directory: v8::Directory,
    pub ownership: BTreeMap<Arc<str>, v8::Ownership>,
    pub mirroring: Mirroring,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MirrorSource {
    pub cell: String,
    pub stream: String,
    pub addresses: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Mirror {
    pub source: MirrorSource,
    pub recalls_applied: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct LoggedRecall {
    pub number: u64,
    pub partition: u32,
    pub seq: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RecallLog {
    pub next: u64,
    pub pending: VecDeque<LoggedRecall>,
    pub mirrors: BTreeMap<Arc<str>, u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Mirroring {
    pub mirrors: BTreeMap<Arc<str>, Mirror>,
    pub recalls: BTreeMap<Arc<str>, RecallLog>,
}

impl Cell {
    /// Its version 8 part, and the mirrors and recall logs.
    pub fn split(self) -> (v8::Cell, Mirroring) {
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
            mirroring,
        } = self;
        let state = v8::Cell {
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
        };
        (state, mirroring)
    }
}
