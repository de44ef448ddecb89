//! The frozen shape of a version 6 snapshot's state: version 5's, each staged transactional message with the
//! reference of its body, which the host stores with the other bodies (a message staged before version 6 keeps its
//! payload in its request and has none). Every type of versions 3 to 5 is used as it is (they never change); the
//! types here mirror the in-memory types of the same name as they were when version 6 was current. Nothing here may
//! change: a change to the encoding is a new version (see [`super`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4, v5};

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
    pub transaction: Option<Transaction>,
    pub next_transaction_number: u64,
    pub last_end: Option<v3::TransactionEnd>,
    pub last_active: v3::Millis,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Transaction {
    pub number: u64,
    pub state: v3::TransactionState,
    pub begun_at: v3::Millis,
    pub deadline: v3::Millis,
    pub staged: Vec<Staged>,
    pub staged_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Staged {
    pub stream: Arc<str>,
    pub stream_id: u64,
    pub partition: u32,
    pub size: u64,
    pub request: v3::PublishRequest,
    pub body: Option<v3::BodyRef>,
}

/// Each open transaction's staged bodies, by producer, in staging order.
pub(crate) type StagedBodies = BTreeMap<u64, Vec<Option<v3::BodyRef>>>;

impl Cell {
    /// Its version 5 part, and the body of each staged message.
    pub fn split(self) -> (v5::Cell, StagedBodies) {
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
        let mut bodies = StagedBodies::new();
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
                    last_active,
                } = producer;
                let transaction = transaction.map(|transaction| {
                    let Transaction { number, state, begun_at, deadline, staged, staged_bytes } = transaction;
                    let (staged, refs): (Vec<v3::Staged>, Vec<Option<v3::BodyRef>>) = staged
                        .into_iter()
                        .map(|Staged { stream, stream_id, partition, size, request, body }| {
                            (v3::Staged { stream, stream_id, partition, size, request }, body)
                        })
                        .unzip();
                    bodies.insert(id, refs);
                    v3::Transaction { number, state, begun_at, deadline, staged, staged_bytes }
                });
                let producer = v5::Producer {
                    transactional_id,
                    epoch,
                    timeout_ms,
                    transaction,
                    next_transaction_number,
                    last_end,
                    last_active,
                };
                (id, producer)
            })
            .collect();
        let state = v5::Cell {
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
        (state, bodies)
    }
}
