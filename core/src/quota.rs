//! What a tenant, and the cell as a whole, may hold: streams, retained messages and their bytes.
//!
//! A stream's own limits bound one stream; these bound everything a tenant's principals can create, so that one
//! tenant cannot grow every replica's memory (a message's subject, key and headers are held in RAM) and disk until
//! the cell dies. A quota is replicated state, set by a cluster admin ([`crate::Command::SetQuotas`]), and enforced
//! where a command is applied: a publish, a transaction's commit or a stream's creation that would pass one is
//! refused with [`crate::Rejection::QuotaExceeded`] naming it, and writes nothing.
//!
//! The bytes counted are a message's accounted size (payload, subject, key and headers: what the stream's
//! `max_bytes` counts). What a tenant holds is kept in a [`Ledger`] derived from the streams, updated from the effects
//! of each apply (every change to a stream's counts names the stream in an effect), so a check costs a lookup rather
//! than a pass over the streams.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::Effect;
use crate::error::{Quota, Rejection};
use crate::stream::Stream;
use crate::subject::tenant_of;

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
}

impl Quotas {
    /// Whether nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        *self == Quotas::default()
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
}

/// The messages and bytes each tenant and the cell hold: derived from the streams, never encoded, rebuilt on decode.
/// (Streams are counted where one is created, which is rare, by a pass over the tenant's.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ledger {
    /// Each stream holding messages: its counts as last entered.
    counted: BTreeMap<Arc<str>, (u64, u64)>,
    tenants: BTreeMap<Arc<str>, (u64, u64)>,
    cell: (u64, u64),
}

impl Ledger {
    /// The ledger of `streams`.
    pub(crate) fn of<'a>(streams: impl IntoIterator<Item = (&'a Arc<str>, &'a Stream)>) -> Self {
        let mut ledger = Ledger::default();
        for (name, stream) in streams {
            ledger.enter(name, Some(stream));
        }
        ledger
    }

    /// Enters `name`'s counts as `stream` holds them now (`None`: it no longer exists).
    fn enter(&mut self, name: &Arc<str>, stream: Option<&Stream>) {
        let before = self.counted.get(name).copied().unwrap_or_default();
        let after = stream.map_or((0, 0), |s| (s.n_messages(), s.n_bytes()));
        if before == after {
            return;
        }
        let change = |held: &mut (u64, u64)| {
            held.0 = held.0 + after.0 - before.0;
            held.1 = held.1 + after.1 - before.1;
        };
        change(&mut self.cell);
        // Looked up before inserting: a publish enters its stream, and its tenant, on every apply, and a key that is
        // already there needs no allocation.
        if let Some(tenant) = tenant_of(name) {
            match self.tenants.get_mut(tenant) {
                Some(held) => change(held),
                None => {
                    let mut held = (0, 0);
                    change(&mut held);
                    self.tenants.insert(Arc::from(tenant), held);
                }
            }
            if self.tenants.get(tenant) == Some(&(0, 0)) {
                self.tenants.remove(tenant);
            }
        }
        match (after == (0, 0), self.counted.get_mut(name)) {
            (true, _) => {
                self.counted.remove(name);
            }
            (false, Some(counted)) => *counted = after,
            (false, None) => {
                self.counted.insert(name.clone(), after);
            }
        }
    }

    /// Enters the streams an apply's effects name: every change to a stream's counts names it in one.
    pub(crate) fn follow(&mut self, effects: &[Effect], streams: &BTreeMap<Arc<str>, Stream>) {
        let mut last: Option<&Arc<str>> = None;
        for effect in effects {
            let name = match effect {
                Effect::Appended { stream, .. }
                | Effect::Removed { stream, .. }
                | Effect::Recalled { stream, .. }
                | Effect::StreamDeleted { stream } => stream,
                _ => continue,
            };
            // A batch names the same stream many times in a row: enter it once per run.
            if last.is_some_and(|l| l == name) {
                continue;
            }
            last = Some(name);
            self.enter(name, streams.get(name));
        }
    }

    /// The (messages, bytes) `tenant` holds (the cell's own total with `None`).
    pub(crate) fn held(&self, tenant: Option<&str>) -> (u64, u64) {
        match tenant {
            Some(tenant) => self.tenants.get(tenant).copied().unwrap_or_default(),
            None => self.cell,
        }
    }
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

/// Refuses `more` messages and bytes in stream `stream` (a stored name) when they would pass its tenant's quotas or
/// the cell's.
pub(crate) fn check_growth(
    book: &QuotaBook,
    ledger: &Ledger,
    stream: &str,
    messages: u64,
    bytes: u64,
) -> Result<(), Rejection> {
    if messages == 0 && bytes == 0 {
        return Ok(());
    }
    let more = Held { streams: 0, messages, bytes };
    let held = |tenant| {
        let (messages, bytes) = ledger.held(tenant);
        Held { streams: 0, messages, bytes }
    };
    if let Some(tenant) = tenant_of(stream)
        && let Some(quotas) = book.tenants.get(tenant)
    {
        check(quotas, held(Some(tenant)), more, true)?;
    }
    if !book.cell.is_unlimited() {
        check(&book.cell, held(None), more, false)?;
    }
    Ok(())
}

/// Refuses a batch of messages, each `(stream, accounted size)`, that would together pass a tenant's quotas or the
/// cell's.
pub(crate) fn check_batch<'a>(
    book: &QuotaBook,
    ledger: &Ledger,
    batch: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), Rejection> {
    let mut by_tenant: BTreeMap<Option<&str>, (u64, u64)> = BTreeMap::new();
    for (stream, size) in batch {
        for holder in [tenant_of(stream), None].into_iter().collect::<std::collections::BTreeSet<_>>() {
            let growth = by_tenant.entry(holder).or_default();
            growth.0 += 1;
            growth.1 += size;
        }
    }
    for (holder, (messages, bytes)) in by_tenant {
        let quotas = match holder {
            Some(tenant) => book.of(tenant),
            None => book.cell,
        };
        if quotas.is_unlimited() {
            continue;
        }
        let (held_messages, held_bytes) = ledger.held(holder);
        let held = Held { streams: 0, messages: held_messages, bytes: held_bytes };
        check(&quotas, held, Held { streams: 0, messages, bytes }, holder.is_some())?;
    }
    Ok(())
}
