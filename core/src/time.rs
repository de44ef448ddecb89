//! Time as the cell sees it: milliseconds stamped by the leader on every command.

use serde::{Deserialize, Serialize};

/// A point in cell time, in milliseconds.
///
/// The leader stamps every command with `max(previous stamp, leader clock)`, so within a cell this value never goes
/// backwards. The core never reads a clock of its own: every timer (ack wait, transaction timeout, retention age,
/// TTL, delayed delivery, token refill) is evaluated against this value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Millis(pub u64);

impl Millis {
    /// The origin of cell time.
    pub const ZERO: Millis = Millis(0);
    /// The end of cell time.
    pub const MAX: Millis = Millis(u64::MAX);

    /// This instant plus `duration_ms`, saturating at the end of time rather than wrapping.
    pub fn plus(self, duration_ms: u64) -> Millis {
        Millis(self.0.saturating_add(duration_ms))
    }

    /// Milliseconds from `earlier` to `self`, or zero if `earlier` is later.
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl From<crate::snapshot::v3::Millis> for Millis {
    fn from(millis: crate::snapshot::v3::Millis) -> Self {
        Millis(millis.0)
    }
}

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Millis;

    #[test]
    fn a_time_reads_as_milliseconds_and_adds_without_wrapping() {
        assert_eq!(Millis(1_500).to_string(), "1500ms");
        assert_eq!(Millis(10).plus(5), Millis(15));
        assert_eq!(Millis::MAX.plus(1), Millis::MAX);
        assert_eq!((Millis(10).since(Millis(4)), Millis(4).since(Millis(10))), (6, 0));
    }
}
