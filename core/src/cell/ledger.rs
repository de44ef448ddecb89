//! The ledger of what each tenant and the cell hold, kept beside the streams while a quota is set, and the checks
//! that read it (see [`crate::quota`]). It lives with the cell, which owns the streams and the effects it follows;
//! the quotas themselves are plain data in `quota.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::Rejection;
use crate::quota::{Held, QuotaBook, check};
use crate::stream::Stream;
use crate::subject::tenant_of;

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

    /// Enters the streams an apply changed (see [`crate::effect::Effects::changed_streams`]): every change to a
    /// stream's counts is followed there, a run of one stream once.
    pub(crate) fn follow(&mut self, changed: &[Arc<str>], streams: &BTreeMap<Arc<str>, Stream>) {
        for name in changed {
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
    let more = Held { streams: 0, messages, bytes, in_flight: 0 };
    let held = |tenant| {
        let (messages, bytes) = ledger.held(tenant);
        Held { streams: 0, messages, bytes, in_flight: 0 }
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
        let held = Held { streams: 0, messages: held_messages, bytes: held_bytes, in_flight: 0 };
        check(&quotas, held, Held { streams: 0, messages, bytes, in_flight: 0 }, holder.is_some())?;
    }
    Ok(())
}
