//! The frozen shape of a version 11 snapshot's state: version 10's, with each principal's mirror grant (the streams
//! it may mirror) beside its grants and tokens. Every type of versions 3 to 10 is used as it is (they never change);
//! the types here mirror the in-memory types of the same name as they were when version 11 was current. Nothing here
//! may change: a change to the encoding is a new version (see [`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{v3, v4, v6, v7, v8, v9, v10};

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
    pub quotas: v10::QuotaBook,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Auth {
    pub principals: BTreeMap<Arc<str>, Principal>,
    pub producer_owners: BTreeMap<u64, Arc<str>>,
    pub reserved: BTreeSet<String>,
    pub revoked: BTreeMap<Vec<u8>, v10::Revoked>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Principal {
    pub grants: v4::Grants,
    pub tokens: BTreeSet<v4::TokenHash>,
    pub mirror: BTreeSet<String>,
}

/// Each principal's mirror grant, by principal.
pub(crate) type MirrorGrants = BTreeMap<Arc<str>, BTreeSet<String>>;

impl Cell {
    /// Its version 10 part and each principal's mirror grant.
    pub fn split(self) -> (v10::Cell, MirrorGrants) {
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
        let mut mirror_grants = MirrorGrants::new();
        let principals = principals
            .into_iter()
            .map(|(name, Principal { grants, tokens, mirror })| {
                if !mirror.is_empty() {
                    mirror_grants.insert(name.clone(), mirror);
                }
                (name, v4::Principal { grants, tokens })
            })
            .collect();
        let state = v10::Cell {
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
            auth: v10::Auth { principals, producer_owners, reserved, revoked },
            groups,
            directory,
            ownership,
            mirroring,
            quotas,
        };
        (state, mirror_grants)
    }
}
