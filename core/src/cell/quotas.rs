//! Quotas: setting them, and the checks that keep a tenant (and the cell) within them (see [`crate::quota`]).

use std::sync::Arc;

use super::Cell;
use super::ledger::Ledger;
use crate::command::Outcome;
use crate::error::Rejection;
use crate::quota::{self, Held, QuotaBook, Quotas};
use crate::subject::{TENANT_SEPARATOR, tenant_of};

impl Cell {
    pub(super) fn set_quotas(&mut self, tenant: Option<&str>, quotas: Quotas) -> Result<Outcome, Rejection> {
        self.quotas.set(tenant, quotas)?;
        // The ledger is kept while any quota is set: made when the first one is, dropped with the last.
        match (self.quotas.is_limited(), self.ledger.is_some()) {
            (true, false) => self.ledger = Some(Ledger::of(&self.streams)),
            (false, true) => self.ledger = None,
            _ => {}
        }
        Ok(Outcome::QuotasSet)
    }

    /// How many streams `tenant` holds (every stream of the cell with `None`).
    fn streams_of(&self, tenant: Option<&str>) -> u64 {
        match tenant {
            None => self.streams.len() as u64,
            Some(tenant) => {
                let prefix = format!("{tenant}{TENANT_SEPARATOR}");
                let from: Arc<str> = Arc::from(prefix.as_str());
                self.streams.range(from..).take_while(|(name, _)| name.starts_with(&prefix)).count() as u64
            }
        }
    }

    /// Refuses one more stream named `name` (stored) past its tenant's quota or the cell's.
    pub(super) fn check_stream_quota(&self, name: &str) -> Result<(), Rejection> {
        let one = Held { streams: 1, messages: 0, bytes: 0 };
        let held = |tenant| Held { streams: self.streams_of(tenant), messages: 0, bytes: 0 };
        if let Some(tenant) = tenant_of(name)
            && let Some(quotas) = self.quotas.tenants.get(tenant)
        {
            quota::check(quotas, held(Some(tenant)), one, true)?;
        }
        quota::check(&self.quotas.cell, held(None), one, false)
    }

    /// The quotas the cell keeps.
    pub fn quotas(&self) -> &QuotaBook {
        &self.quotas
    }

    /// What `tenant` holds now (the whole cell with `None`).
    pub fn held(&self, tenant: Option<&str>) -> Held {
        let (messages, bytes) = match &self.ledger {
            Some(ledger) => ledger.held(tenant),
            None => Ledger::of(&self.streams).held(tenant),
        };
        Held { streams: self.streams_of(tenant), messages, bytes }
    }

    /// Whether the derived ledger, if kept, agrees with a count from scratch (a test's check of
    /// the ledger, `cell/ledger.rs`).
    pub fn ledger_agrees(&self) -> bool {
        self.ledger.as_ref().is_none_or(|ledger| *ledger == Ledger::of(&self.streams))
    }
}
