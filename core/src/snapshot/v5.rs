//! The frozen shape of a version 5 snapshot's state: version 4's, each transactional producer with the time it was
//! last active (so that an idle one expires). Every type of versions 3 and 4 is used as it is (they never change);
//! the types here mirror the in-memory types of the same name as they were when version 5 was current. Nothing here
//! may change: a change to the encoding is a new version (see [`super`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4};

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Cell {
    pub last_at: v3::Millis,
    pub n_applied: u64,
    pub streams: BTreeMap<Arc<str>, v3::Stream>,
    pub stream_names: BTreeMap<u64, Arc<str>>,
    pub next_stream_id: u64,
    pub producers: BTreeMap<u64, Producer>,
    pub transactional_ids: BTreeMap<Arc<str>, u64>,
    pub next_producer_id: u64,
    pub timers: v3::Timers,
    pub pinned_by: BTreeMap<v3::MessageRef, v3::MessageRef>,
    pub next_body: u64,
    pub auth: v4::Auth,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Producer {
    pub transactional_id: Arc<str>,
    pub epoch: u32,
    pub timeout_ms: u64,
    pub transaction: Option<v3::Transaction>,
    pub next_transaction_number: u64,
    pub last_end: Option<v3::TransactionEnd>,
    pub last_active: v3::Millis,
}

impl Cell {
    /// Its version 4 part, and when each producer was last active.
    pub fn split(self) -> (v4::Cell, BTreeMap<u64, v3::Millis>) {
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
        let mut last_active = BTreeMap::new();
        let producers = producers
            .into_iter()
            .map(|(id, producer)| {
                let Producer {
                    transactional_id,
                    epoch,
                    timeout_ms,
                    transaction,
                    next_transaction_number,
                    last_end,
                    last_active: at,
                } = producer;
                last_active.insert(id, at);
                let producer = v3::Producer {
                    transactional_id,
                    epoch,
                    timeout_ms,
                    transaction,
                    next_transaction_number,
                    last_end,
                };
                (id, producer)
            })
            .collect();
        let state = v4::Cell {
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
        (state, last_active)
    }
}
