//! "Log at most every N s": a peer that can cause an event at will (a
//! refused stream, a failing accept, an engine reporting too much) must not
//! be able to flood the log, but the line that does get through says how
//! many it stands for.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Lets one line through every [`LogEvery::TEN_SECONDS`] and counts the ones
/// it held back. Shared by reference (`&self`), so one throttle can serve many tasks.
#[derive(Debug, Default)]
pub struct LogEvery {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When a line last went through.
    last: Option<Instant>,
    suppressed: u64,
}

impl LogEvery {
    /// The interval.
    pub const TEN_SECONDS: Duration = Duration::from_secs(10);

    /// `Some(lines suppressed since the last one)` when a line may be logged
    /// now (the first always may); `None`, counted, when not.
    pub fn ready(&self) -> Option<u64> {
        self.ready_at(Instant::now())
    }

    /// [`LogEvery::ready`] at `now` (tests pass a later instant instead of
    /// waiting).
    pub fn ready_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        if s.last
            .is_some_and(|t| now.saturating_duration_since(t) < Self::TEN_SECONDS)
        {
            s.suppressed += 1;
            return None;
        }
        s.last = Some(now);
        Some(std::mem::take(&mut s.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_goes_through_per_interval_and_counts_the_rest() {
        let l = LogEvery::default();
        let t0 = Instant::now();
        assert_eq!(l.ready_at(t0), Some(0));
        let almost = t0 + LogEvery::TEN_SECONDS - Duration::from_millis(1);
        assert_eq!((l.ready_at(t0), l.ready_at(almost)), (None, None));
        let later = t0 + LogEvery::TEN_SECONDS;
        assert_eq!(l.ready_at(later), Some(2));
        assert_eq!(l.ready_at(later), None);
        // An instant before the last line (another thread's clock read) is
        // within the interval, not a wrap-around.
        assert_eq!(l.ready_at(t0), None);
        assert_eq!(l.ready_at(later + LogEvery::TEN_SECONDS), Some(2));
    }
}
