//! The time a leader stamps on commands: its wall clock, never before the cell's last time nor before its own last
//! stamp plus the steady time elapsed since, and slewed (never stepped more than [`MAX_CLOCK_STEP_MS`]) towards a wall
//! clock that was set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellog_core::Millis;

/// Where a leader reads the time it stamps on commands.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds on this node's wall clock (which may be set, or jump).
    fn now(&self) -> Millis;
    /// Time elapsed since some fixed point, from a clock that only ever runs forward at a steady rate.
    fn elapsed(&self) -> Duration;
}

/// The wall clock, in milliseconds since the Unix epoch (madsim's simulated clock under `--cfg madsim`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods, reason = "the leader's clock is where cell time comes from")]
    fn now(&self) -> Millis {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Millis(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }

    #[cfg(not(madsim))]
    #[allow(clippy::disallowed_methods, reason = "the steady clock that keeps cell time moving")]
    fn elapsed(&self) -> Duration {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed()
    }

    /// Simulated time since this simulation began. Not a process-wide start: simulations run one after another (and
    /// side by side) in one process, each on a clock of its own, and a start taken in one would make another's
    /// readings depend on which ran first.
    #[cfg(madsim)]
    fn elapsed(&self) -> Duration {
        madsim::time::TimeHandle::current().elapsed()
    }
}

/// How far a stamp may run ahead of the cell's last time plus the steady time elapsed since this node saw it.
pub const MAX_CLOCK_STEP_MS: u64 = 1_000;
/// While cell time is behind a node's wall clock, it may run faster than the steady clock by the steady time elapsed
/// divided by this (a tenth): it slews towards the wall clock, as NTP slews a clock instead of stepping it.
pub const CLOCK_SLEW_DIVISOR: u32 = 10;

/// The time a node stamps on what it proposes: its wall clock, within bounds the steady clock sets.
///
/// - Never earlier than the cell's last time, nor than this node's last stamp plus the steady time elapsed since. A
///   wall clock set back therefore cannot freeze cell time (and with it ack deadlines, transaction timeouts and
///   retention).
/// - Never later than its ceiling: a cell time this node saw (its anchor), plus the steady time elapsed since it saw
///   it, plus a tenth of that ([`CLOCK_SLEW_DIVISOR`]), plus [`MAX_CLOCK_STEP_MS`]. A wall clock set forward (a year,
///   say) therefore does not expire every TTL, age limit and dedup window at once: cell time slews towards it. The
///   node's own stamps never move the anchor (else each would add another step); a cell time past the ceiling, which
///   another leader stamped, does. The price: after the whole cell was down, cell time resumes where it stopped and
///   catches up with the wall clock at a tenth of real time.
///
/// A new cell (no time yet) takes the wall clock as it is.
pub(crate) struct CellClock {
    clock: Arc<dyn Clock>,
    state: Mutex<ClockState>,
}

#[derive(Default)]
struct ClockState {
    /// The last stamp, and the steady clock's reading when it was made.
    last: Option<(Millis, Duration)>,
    /// The anchor of the ceiling: a cell time this node saw, and the steady clock's reading when it saw it.
    anchor: Option<(Millis, Duration)>,
}

fn plus_ms(at: Millis, elapsed: Duration) -> Millis {
    Millis(at.0.saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)))
}

impl CellClock {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        CellClock { clock, state: Mutex::new(ClockState::default()) }
    }

    pub(crate) fn now(&self, cell_last_at: Millis) -> Millis {
        let (wall, steady) = (self.clock.now(), self.clock.elapsed());
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let carried = state.last.map_or(Millis::ZERO, |(at, then)| plus_ms(at, steady.saturating_sub(then)));
        let ceiling_of = |(at, then): (Millis, Duration)| {
            let since = steady.saturating_sub(then);
            plus_ms(at, since + since / CLOCK_SLEW_DIVISOR + Duration::from_millis(MAX_CLOCK_STEP_MS))
        };
        if state.anchor.is_none_or(|anchor| cell_last_at > ceiling_of(anchor)) {
            state.anchor = Some((cell_last_at, steady));
        }
        let ceiling = match state.anchor {
            Some(anchor) if cell_last_at > Millis::ZERO => ceiling_of(anchor),
            _ => Millis(u64::MAX),
        };
        #[cfg(madsim)]
        if cellog_planted::active(cellog_planted::Mutant::LeaderTimeNotMonotonic) {
            return wall;
        }
        let now = wall.min(ceiling).max(cell_last_at).max(carried);
        state.last = Some((now, steady));
        if cell_last_at == Millis::ZERO {
            // The cell's first time: the anchor from here on.
            state.anchor = Some((now, steady));
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock the test sets: wall time and steady time, in milliseconds.
    #[derive(Default)]
    struct SetClock(Mutex<(u64, u64)>);

    impl SetClock {
        fn pass(&self, ms: u64) {
            let mut now = self.0.lock().unwrap();
            *now = (now.0 + ms, now.1 + ms);
        }

        fn jump(&self, ms: i64) {
            let mut now = self.0.lock().unwrap();
            now.0 = now.0.saturating_add_signed(ms);
        }
    }

    impl Clock for Arc<SetClock> {
        fn now(&self) -> Millis {
            Millis(self.0.lock().unwrap().0)
        }
        fn elapsed(&self) -> Duration {
            Duration::from_millis(self.0.lock().unwrap().1)
        }
    }

    const START: u64 = 1_700_000_000_000;

    /// A cell clock over a set clock at [`START`], with one stamp made (the cell's first).
    fn started() -> (Arc<SetClock>, CellClock) {
        let set = Arc::new(SetClock::default());
        set.jump(START as i64);
        let clock = CellClock::new(Arc::new(set.clone()));
        // A new cell takes the wall clock as it is.
        assert_eq!(clock.now(Millis::ZERO), Millis(START));
        (set, clock)
    }

    #[test]
    fn cell_time_follows_a_true_clock() {
        let (set, clock) = started();
        let mut cell = Millis(START);
        for _ in 0..100 {
            set.pass(100);
            cell = clock.now(cell);
        }
        assert_eq!(cell, Millis(START + 10_000));
    }

    #[test]
    fn cell_time_slews_towards_a_clock_set_forward_and_never_runs_back() {
        let (set, clock) = started();
        set.jump(365 * 24 * 3_600_000);
        // Stamp after stamp, each its own entry: a second of step once, then a tenth faster than the steady clock.
        let mut cell = Millis(START);
        for _ in 0..100 {
            set.pass(100);
            cell = clock.now(cell);
        }
        assert_eq!(cell, Millis(START + 10_000 + 1_000 + MAX_CLOCK_STEP_MS));

        // Set back: cell time goes on at the steady rate from the last stamp.
        set.jump(-2 * 365 * 24 * 3_600_000);
        set.pass(500);
        assert_eq!(clock.now(cell), Millis(cell.0 + 500));
    }

    #[test]
    fn a_cell_time_past_the_ceiling_moves_the_anchor() {
        let (set, clock) = started();
        // Another leader stamped an entry a minute ahead of this node's clock: never earlier than that.
        set.pass(100);
        assert_eq!(clock.now(Millis(START + 60_000)), Millis(START + 60_000));
        // And this node's clock two minutes ahead is followed from there, within the bound.
        set.jump(120_000);
        set.pass(100);
        assert_eq!(clock.now(Millis(START + 60_000)), Millis(START + 60_000 + 100 + 10 + MAX_CLOCK_STEP_MS));
    }
}
