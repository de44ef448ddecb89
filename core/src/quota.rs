//! What a tenant, and the cell as a whole, may hold: streams, retained messages and their bytes.
//!
//! A stream's own limits bound one stream; these bound everything a tenant's principals can create, so that one
//! tenant cannot grow every replica's memory (a message's subject, key and headers are held in RAM) and disk until
//! the cell dies. A quota is replicated state, set by a cluster admin ([`crate::Command::SetQuotas`]), and enforced
//! where a command is applied: a publish, a transaction's commit or a stream's creation that would pass one is
//! refused with [`crate::Rejection::QuotaExceeded`] naming it, and writes nothing.
//!
//! The bytes counted are a message's accounted size (payload, subject, key and headers: what the stream's
//! `max_bytes` counts). What a tenant holds is kept in a ledger derived from the streams (`cell/ledger.rs`), updated from the
//! effects of each apply (every change to a stream's counts names the stream in an effect), so a check costs a lookup rather
//! than a pass over the streams.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Quota, Rejection};

/// Most tenants with a quota of their own.
pub const MAX_TENANT_QUOTAS: usize = 10_000;

/// Limits on what one holder (a tenant, or the whole cell) keeps. `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    /// Most streams.
    pub max_streams: Option<u64>,
    /// Most retained messages, across its streams.
    pub max_messages: Option<u64>,
    /// Most retained bytes (accounted sizes), across its streams.
    pub max_bytes: Option<u64>,
    /// Most deliveries awaiting an ack, across every consumer of its streams (each consumer's own `max_in_flight`
    /// still holds): at it, fetches and subscriptions deliver nothing more, first or again, until acks (or expired
    /// deadlines) make room. Counted when a fetch is applied, by a pass over the holder's consumers.
    pub max_in_flight: Option<u64>,
    /// Most deliveries of one subject awaiting an ack at one consumer of its streams: a message of a subject at it is
    /// held back, in order, while the consumer's other subjects go on (see [`crate::Consumer::fetch`]).
    pub max_in_flight_per_subject: Option<u32>,
}

impl Quotas {
    /// Whether nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        *self == Quotas::default()
    }

    /// Refuses caps on deliveries that no delivery could meet: each is at least 1. (The other limits' zero is refused
    /// where a request is taken, as it was before these caps existed, so that an older log applies as it did.)
    pub fn check(&self) -> Result<(), Rejection> {
        let zero = [
            ("max_in_flight", self.max_in_flight),
            ("max_in_flight_per_subject", self.max_in_flight_per_subject.map(u64::from)),
        ]
        .into_iter()
        .find(|(_, limit)| *limit == Some(0));
        match zero {
            Some((what, _)) => Err(Rejection::Invalid { reason: format!("{what} must be at least 1 (or none)") }),
            None => Ok(()),
        }
    }
}

/// The quotas the cell keeps: its own, over every stream, and each tenant's, over the tenant's streams.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaBook {
    /// Over every stream of the cell, tenants' included.
    pub cell: Quotas,
    /// Over each tenant's streams, by tenant.
    pub tenants: BTreeMap<Arc<str>, Quotas>,
}

impl QuotaBook {
    /// Sets the quotas of `tenant` (the cell's own with `None`); an unlimited tenant's entry is dropped.
    pub(crate) fn set(&mut self, tenant: Option<&str>, quotas: Quotas) -> Result<(), Rejection> {
        quotas.check()?;
        let Some(tenant) = tenant else {
            self.cell = quotas;
            return Ok(());
        };
        if quotas.is_unlimited() {
            self.tenants.remove(tenant);
            return Ok(());
        }
        if !self.tenants.contains_key(tenant) && self.tenants.len() >= MAX_TENANT_QUOTAS {
            return Err(Rejection::Invalid { reason: format!("at most {MAX_TENANT_QUOTAS} tenants have quotas") });
        }
        self.tenants.insert(Arc::from(tenant), quotas);
        Ok(())
    }

    /// Whether any quota is set (the cell's, or a tenant's).
    pub fn is_limited(&self) -> bool {
        !self.cell.is_unlimited() || !self.tenants.is_empty()
    }

    /// The quotas of `tenant` (unlimited when it has none).
    pub fn of(&self, tenant: &str) -> Quotas {
        self.tenants.get(tenant).copied().unwrap_or_default()
    }

    /// The cap per subject on a consumer of stream `stream` (a stored name): its tenant's or the cell's, the lower.
    pub(crate) fn in_flight_per_subject(&self, stream: &str) -> Option<u32> {
        let tenant = crate::subject::tenant_of(stream).and_then(|tenant| self.tenants.get(tenant));
        [tenant.and_then(|quotas| quotas.max_in_flight_per_subject), self.cell.max_in_flight_per_subject]
            .into_iter()
            .flatten()
            .min()
    }
}

/// What one holder keeps now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Streams.
    pub streams: u64,
    /// Retained messages.
    pub messages: u64,
    /// Their accounted bytes.
    pub bytes: u64,
    /// Deliveries awaiting an ack across the consumers of its streams.
    pub in_flight: u64,
}

/// Refuses a growth of `more` for a holder that holds `held` under `quotas`: the first quota it would pass.
pub(crate) fn check(quotas: &Quotas, held: Held, more: Held, tenant: bool) -> Result<(), Rejection> {
    let [streams, messages, bytes] = if tenant {
        [Quota::TenantStreams, Quota::TenantMessages, Quota::TenantBytes]
    } else {
        [Quota::CellStreams, Quota::CellMessages, Quota::CellBytes]
    };
    let checks = [
        (streams, quotas.max_streams, held.streams, more.streams),
        (messages, quotas.max_messages, held.messages, more.messages),
        (bytes, quotas.max_bytes, held.bytes, more.bytes),
    ];
    for (quota, limit, now, more) in checks {
        if more > 0
            && let Some(limit) = limit
            && now.saturating_add(more) > limit
        {
            return Err(Rejection::QuotaExceeded { quota, limit });
        }
    }
    Ok(())
}
