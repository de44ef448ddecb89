//! The history of a run, recorded in simulated time as its clients call the cell; the types of a history, its
//! recorder and its checkers are `cellog-check`'s.

pub use cellog_check::history::{Completion, Event, EventKind, Fingerprint, Op, OpId, Operation, Seen, Value};
pub use cellog_check::record::{History, completion};

/// An empty history timed in simulated time from now.
#[cfg(madsim)]
pub fn simulated() -> History {
    History::new(std::sync::Arc::new(crate::trace::simulated_elapsed))
}
