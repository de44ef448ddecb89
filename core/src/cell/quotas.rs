//! Quotas: setting them, and the checks that keep a tenant (and the cell) within them (see [`crate::quota`]).

use std::sync::Arc;

use super::Cell;
use super::ledger::Ledger;
use crate::error::Rejection;
use crate::outcome::Outcome;
use crate::quota::{self, Held, QuotaBook, Quotas};
use crate::stream::Stream;
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

    /// The streams `tenant` holds (every stream of the cell with `None`).
    fn streams_held_by<'a>(&'a self, tenant: Option<&str>) -> Box<dyn Iterator<Item = &'a Stream> + 'a> {
        match tenant {
            None => Box::new(self.streams.values()),
            Some(tenant) => {
                let prefix = format!("{tenant}{TENANT_SEPARATOR}");
                let from: Arc<str> = Arc::from(prefix.as_str());
                Box::new(
                    self.streams
                        .range(from..)
                        .take_while(move |(name, _)| name.starts_with(&prefix))
                        .map(|(_, stream)| stream),
                )
            }
        }
    }

    /// How many streams `tenant` holds (every stream of the cell with `None`).
    fn streams_of(&self, tenant: Option<&str>) -> u64 {
        match tenant {
            None => self.streams.len() as u64,
            Some(_) => self.streams_held_by(tenant).count() as u64,
        }
    }

    /// Deliveries awaiting an ack across the consumers of `tenant`'s streams (every stream's with `None`).
    fn in_flight_of(&self, tenant: Option<&str>) -> u64 {
        self.streams_held_by(tenant).flat_map(Stream::consumers).map(|consumer| u64::from(consumer.n_pending())).sum()
    }

    /// How many more deliveries may await an ack in stream `stream` (a stored name) under its tenant's
    /// `max_in_flight` and the cell's; `u64::MAX` when neither is set. A pass over the holder's consumers, made only
    /// when its quota is set.
    fn in_flight_room(&self, stream: &str) -> u64 {
        let mut room = u64::MAX;
        if let Some(tenant) = tenant_of(stream)
            && let Some(max) = self.quotas.tenants.get(tenant).and_then(|quotas| quotas.max_in_flight)
        {
            room = room.min(max.saturating_sub(self.in_flight_of(Some(tenant))));
        }
        if let Some(max) = self.quotas.cell.max_in_flight {
            room = room.min(max.saturating_sub(self.in_flight_of(None)));
        }
        room
    }

    /// The caps on deliveries awaiting an ack in stream `stream` (a stored name): the room left under its tenant's and
    /// the cell's `max_in_flight` (`u64::MAX` for none), and the lower `max_in_flight_per_subject` of the two.
    pub(super) fn in_flight_caps(&self, stream: &str) -> (u64, Option<u32>) {
        if self.quotas.is_limited() {
            (self.in_flight_room(stream), self.quotas.in_flight_per_subject(stream))
        } else {
            (u64::MAX, None)
        }
    }

    /// Refuses one more stream named `name` (stored) past its tenant's quota or the cell's.
    pub(super) fn check_stream_quota(&self, name: &str) -> Result<(), Rejection> {
        let one = Held { streams: 1, ..Held::default() };
        let held = |tenant| Held { streams: self.streams_of(tenant), ..Held::default() };
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
        Held { streams: self.streams_of(tenant), messages, bytes, in_flight: self.in_flight_of(tenant) }
    }

    /// Whether the derived ledger, if kept, agrees with a count from scratch (a test's check of
    /// the ledger, `cell/ledger.rs`).
    pub fn ledger_agrees(&self) -> bool {
        self.ledger.as_ref().is_none_or(|ledger| *ledger == Ledger::of(&self.streams))
    }
}
