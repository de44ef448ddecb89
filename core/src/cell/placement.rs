//! Many cells (see [`crate::placement`]): the directory's records, and each stream's ownership epoch on the cell that
//! holds it, which refuses writes to a stream it no longer owns.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Cell;
use super::limits::invalid;
use crate::error::Rejection;
use crate::mirror::Mirroring;
use crate::outcome::Outcome;
use crate::placement::{MAX_CELLS, MAX_PLACEMENTS, OWNED_HERE, Ownership, Placement};

/// Whether this cell accepts writes to `stream`: refused with where it went while it moved away, or while it is
/// still moving here.
pub(super) fn writable(
    ownership: &BTreeMap<Arc<str>, Ownership>,
    mirroring: &Mirroring,
    stream: &str,
) -> Result<(), Rejection> {
    if let Some(mirror) = mirroring.mirrors.get(stream) {
        return Err(Rejection::Mirror {
            stream: stream.to_string(),
            cell: mirror.source.cell.clone(),
            source_stream: mirror.source.stream.clone(),
        });
    }
    #[cfg(madsim)]
    if cellog_planted::active(cellog_planted::Mutant::OldOwnerAcceptsWrites)
        && matches!(ownership.get(stream), Some(Ownership::Moved { .. }))
    {
        return Ok(());
    }
    match ownership.get(stream) {
        None | Some(Ownership::Owned { .. }) => Ok(()),
        Some(Ownership::Moved { epoch, to }) => {
            Err(Rejection::Moved { stream: stream.to_string(), cell: to.to_string(), epoch: *epoch })
        }
        Some(Ownership::Receiving { epoch, from }) => {
            Err(Rejection::StreamMoving { stream: stream.to_string(), from: from.to_string(), epoch: *epoch })
        }
    }
}

fn stale(stream: &str, epoch: u64, current: u64) -> Rejection {
    Rejection::StaleEpoch { stream: stream.to_string(), epoch, current }
}

impl Cell {
    /// A stream's ownership as this cell sees it.
    pub fn ownership(&self, stream: &str) -> &Ownership {
        self.ownership.get(stream).unwrap_or(&OWNED_HERE)
    }

    /// The directory's records (empty unless this cell is a deployment's directory).
    pub fn directory(&self) -> &crate::placement::Directory {
        &self.directory
    }

    pub(super) fn writable(&self, stream: &str) -> Result<(), Rejection> {
        writable(&self.ownership, &self.mirroring, stream)
    }

    pub(super) fn put_cell(&mut self, cell: &str, addresses: Vec<String>) -> Result<Outcome, Rejection> {
        let created = !self.directory.cells.contains_key(cell);
        if created && self.directory.cells.len() >= MAX_CELLS {
            return Err(Rejection::Invalid { reason: format!("the directory holds its limit of {MAX_CELLS} cells") });
        }
        self.directory.cells.insert(Arc::from(cell), addresses);
        Ok(Outcome::CellPut { created })
    }

    fn known_cell(&self, cell: &str) -> Result<Arc<str>, Rejection> {
        self.directory
            .cells
            .get_key_value(cell)
            .map(|(name, _)| name.clone())
            .ok_or_else(|| Rejection::CellNotFound { cell: cell.to_string() })
    }

    fn placement_of(&mut self, stream: &str) -> Result<&mut Placement, Rejection> {
        self.directory.placements.get_mut(stream).ok_or_else(|| Rejection::NotPlaced { stream: stream.to_string() })
    }

    pub(super) fn place_stream(&mut self, stream: &str, cell: &str) -> Result<Outcome, Rejection> {
        let cell = self.known_cell(cell)?;
        if let Some(placement) = self.directory.placements.get(stream) {
            if placement.cell == cell && placement.moving_from.is_none() {
                return Ok(Outcome::Placed(placement.clone()));
            }
            return Err(Rejection::Conflict { what: "placement".to_string(), name: stream.to_string() });
        }
        if self.directory.placements.len() >= MAX_PLACEMENTS {
            return Err(Rejection::Invalid {
                reason: format!("the directory holds its limit of {MAX_PLACEMENTS} placements"),
            });
        }
        let placement = Placement { cell, epoch: 1, moving_from: None };
        self.directory.placements.insert(Arc::from(stream), placement.clone());
        Ok(Outcome::Placed(placement))
    }

    pub(super) fn move_stream(&mut self, stream: &str, to: &str, epoch: u64) -> Result<Outcome, Rejection> {
        let to = self.known_cell(to)?;
        let placement = self.placement_of(stream)?;
        if placement.epoch != epoch {
            // The same move again (a retry whose first answer was lost) is answered as the first was.
            if placement.epoch == epoch + 1 && placement.cell == to && placement.moving_from.is_some() {
                return Ok(Outcome::Placed(placement.clone()));
            }
            return Err(stale(stream, epoch, placement.epoch));
        }
        if let Some(from) = &placement.moving_from {
            return Err(Rejection::Invalid {
                reason: format!(
                    "stream {stream:?} is still moving from cell {from:?} at epoch {}; finish that move first",
                    placement.epoch
                ),
            });
        }
        if placement.cell == to {
            return Err(Rejection::Invalid { reason: format!("stream {stream:?} is already on cell {to:?}") });
        }
        let from = std::mem::replace(&mut placement.cell, to);
        placement.epoch += 1;
        placement.moving_from = Some(from);
        Ok(Outcome::Placed(placement.clone()))
    }

    pub(super) fn finish_move(&mut self, stream: &str, epoch: u64) -> Result<Outcome, Rejection> {
        let placement = self.placement_of(stream)?;
        if placement.epoch != epoch {
            return Err(stale(stream, epoch, placement.epoch));
        }
        placement.moving_from = None;
        Ok(Outcome::Placed(placement.clone()))
    }

    pub(super) fn unplace(&mut self, stream: &str) -> Result<Outcome, Rejection> {
        match self.directory.placements.remove(stream) {
            Some(_) => Ok(Outcome::Unplaced),
            None => Err(Rejection::NotPlaced { stream: stream.to_string() }),
        }
    }

    /// The last sequence of each partition of `stream`, if this cell holds it.
    pub(super) fn last_seqs(&self, stream: &str) -> Vec<u64> {
        self.streams.get(stream).map(|s| s.partitions().iter().map(|p| p.last_seq()).collect()).unwrap_or_default()
    }

    /// Whether `stream` may go to `next` at `epoch`: `Ok(true)` when it is there already (the same step again),
    /// `Ok(false)` when the step is a change that may be made.
    fn check_ownership_step(&self, stream: &str, epoch: u64, next: &Ownership) -> Result<bool, Rejection> {
        let current = self.ownership(stream);
        if current == next {
            return Ok(true);
        }
        // Accepting is the one step at the epoch already held: from receiving to owning.
        let accepting = matches!(
            (current, &next),
            (Ownership::Receiving { epoch: held, .. }, Ownership::Owned { epoch: asked }) if held == asked
        );
        if !accepting && epoch <= current.epoch() {
            return Err(stale(stream, epoch, current.epoch()));
        }
        if !self.ownership.contains_key(stream) && self.ownership.len() >= MAX_PLACEMENTS {
            return Err(Rejection::Invalid {
                reason: format!("the cell records the ownership of its limit of {MAX_PLACEMENTS} moved streams"),
            });
        }
        Ok(false)
    }

    /// Records `next` for `stream` if `epoch` is past the one held; the same step again (same epoch, same state) is
    /// answered as before; anything else at or below the held epoch is stale.
    fn set_ownership(&mut self, stream: &str, epoch: u64, next: Ownership) -> Result<Outcome, Rejection> {
        if !self.check_ownership_step(stream, epoch, &next)? {
            self.ownership.insert(Arc::from(stream), next.clone());
        }
        Ok(Outcome::Ownership { ownership: next, last_seqs: self.last_seqs(stream) })
    }

    pub(super) fn fence_stream(&mut self, stream: &str, epoch: u64, to: &str) -> Result<Outcome, Rejection> {
        self.set_ownership(stream, epoch, Ownership::Moved { epoch, to: Arc::from(to) })
    }

    pub(super) fn receive_stream(
        &mut self,
        at: crate::time::Millis,
        stream: &str,
        epoch: u64,
        from: &str,
        config: Option<crate::config::StreamConfig>,
    ) -> Result<Outcome, Rejection> {
        let next = Ownership::Receiving { epoch, from: Arc::from(from) };
        // The step is checked before the stream is created, so a refusal changes nothing.
        if !self.check_ownership_step(stream, epoch, &next)?
            && let Some(config) = config.filter(|_| !self.streams.contains_key(stream))
        {
            self.create_stream(at, stream.to_string(), config)?;
        }
        self.set_ownership(stream, epoch, next)
    }

    pub(super) fn accept_stream(&mut self, stream: &str, epoch: u64, through: &[u64]) -> Result<Outcome, Rejection> {
        match self.ownership(stream) {
            Ownership::Receiving { epoch: held, .. } if *held == epoch => {
                let held = self.last_seqs(stream);
                if through.len() > held.len() && through[held.len()..].iter().any(|&seq| seq > 0) {
                    return Err(invalid(format!(
                        "stream {stream:?} has {} partitions here; the cell it moves from has messages in more",
                        held.len()
                    )));
                }
                if let Some((partition, (have, need))) =
                    held.iter().zip(through).enumerate().find(|(_, (have, need))| have < need)
                {
                    return Err(invalid(format!(
                        "stream {stream:?} is not caught up: partition {partition} holds through sequence {have} here, \
                         the cell it moves from through {need}"
                    )));
                }
            }
            Ownership::Owned { epoch: held } if *held == epoch => {}
            current if current.epoch() < epoch => {
                return Err(Rejection::Invalid {
                    reason: format!(
                        "stream {stream:?} was not received at epoch {epoch}; a cell accepts only a stream it is \
                         receiving"
                    ),
                });
            }
            current => return Err(stale(stream, epoch, current.epoch())),
        }
        self.set_ownership(stream, epoch, Ownership::Owned { epoch })
    }

    /// Refused unless this cell receives `stream` at `epoch`: the one state messages are copied in.
    pub(super) fn check_receiving(&self, stream: &str, epoch: u64) -> Result<(), Rejection> {
        match self.ownership(stream) {
            Ownership::Receiving { epoch: held, .. } if *held == epoch => Ok(()),
            current if current.epoch() > epoch => Err(stale(stream, epoch, current.epoch())),
            current => Err(invalid(format!(
                "stream {stream:?} is {current} here, not receiving at epoch {epoch}; messages are copied only into \
                 a stream this cell receives"
            ))),
        }
    }
}
