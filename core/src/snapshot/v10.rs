//! The frozen shape of a version 10 snapshot's state: version 9's, the revoked certificates (beside the principals)
//! and the quotas. Every type of versions 3 to 9 is used as it is (they never change); the types here mirror the
//! in-memory types of the same name as they were when version 10 was current. Nothing here may change: a change to the
//! encoding is a new version (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4, v6, v7, v8, v9};

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
    pub auth: Auth,
    pub groups: v7::Groups,
    pub directory: v8::Directory,
    pub ownership: BTreeMap<Arc<str>, v8::Ownership>,
    pub mirroring: v9::Mirroring,
    pub quotas: QuotaBook,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Auth {
    pub principals: BTreeMap<Arc<str>, v4::Principal>,
    pub producer_owners: BTreeMap<u64, Arc<str>>,
    pub reserved: BTreeSet<String>,
    pub revoked: BTreeMap<Vec<u8>, Revoked>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Revoked {
    pub subject: String,
    pub until: v3::Millis,
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
}

impl Cell {
    /// Its version 9 part, the revoked certificates and the quotas.
    pub fn split(self) -> (v9::Cell, BTreeMap<Vec<u8>, Revoked>, QuotaBook) {
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
        let Auth { principals, producer_owners, reserved, revoked } = auth;
        let state = v9::Cell {
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
            auth: v4::Auth { principals, producer_owners, reserved },
            groups,
            directory,
            ownership,
            mirroring,
        };
        (state, revoked, quotas)
    }
}

impl From<Revoked> for crate::auth::Revoked {
    fn from(revoked: Revoked) -> Self {
        crate::auth::Revoked { subject: revoked.subject, until: revoked.until.into() }
    }
}

impl From<Quotas> for crate::quota::Quotas {
    fn from(quotas: Quotas) -> Self {
        let Quotas { max_streams, max_messages, max_bytes } = quotas;
        crate::quota::Quotas { max_streams, max_messages, max_bytes, ..crate::quota::Quotas::default() }
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
