//! The frozen shape of a version 12 snapshot's state: version 11's, with two more quotas per holder (the most
//! deliveries awaiting an ack, and the most of one subject at one consumer). Every type of versions 3 to 11 is used as
//! it is (they never change); the types here mirror the in-memory types of the same name as they were when version 12
//! was current. Nothing here may change: a change to the encoding is a new version (see [`super`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v6, v7, v8, v9, v10, v11};

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
    pub auth: v11::Auth,
    pub groups: v7::Groups,
    pub directory: v8::Directory,
    pub ownership: BTreeMap<Arc<str>, v8::Ownership>,
    pub mirroring: v9::Mirroring,
    pub quotas: QuotaBook,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct QuotaBook {
    pub cell: Quotas,
    pub tenants: BTreeMap<Arc<str>, Quotas>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Quotas {
    pub max_streams: Option<u64>,
    pub max_messages: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_in_flight: Option<u64>,
    pub max_in_flight_per_subject: Option<u32>,
}

impl Cell {
    /// Its version 11 part (the quotas' older limits) and the quotas whole.
    pub fn split(self) -> (v11::Cell, crate::quota::QuotaBook) {
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
            quotas,
        } = self;
        let quotas: crate::quota::QuotaBook = quotas.into();
        let older = |quotas: &crate::quota::Quotas| v10::Quotas {
            max_streams: quotas.max_streams,
            max_messages: quotas.max_messages,
            max_bytes: quotas.max_bytes,
        };
        let v10_quotas = v10::QuotaBook {
            cell: older(&quotas.cell),
            tenants: quotas.tenants.iter().map(|(tenant, q)| (tenant.clone(), older(q))).collect(),
        };
        let state = v11::Cell {
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
            quotas: v10_quotas,
        };
        (state, quotas)
    }
}

impl From<Quotas> for crate::quota::Quotas {
    fn from(quotas: Quotas) -> Self {
        let Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject } = quotas;
        crate::quota::Quotas { max_streams, max_messages, max_bytes, max_in_flight, max_in_flight_per_subject }
    }
}

impl From<QuotaBook> for crate::quota::QuotaBook {
    fn from(book: QuotaBook) -> Self {
        crate::quota::QuotaBook {
            cell: book.cell.into(),
            tenants: book.tenants.into_iter().map(|(tenant, quotas)| (tenant, quotas.into())).collect(),
        }
    }
}
