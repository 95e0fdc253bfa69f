//! "Log at most every N s": a peer that can cause an event at will (a
//! refused stream, a failing accept, an engine reporting too much) must not
//! be able to flood the log, but the line that does get through says how
//! many it stands for.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Lets one line through every `every` and counts the ones it held back.
/// Shared by reference (`&self`), so one throttle can serve many tasks.
#[derive(Debug)]
pub struct LogEvery {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When a line last went through.
    last: Option<Instant>,
    /// Lines held back since.
    suppressed: u64,
}

impl LogEvery {
    /// The interval every site uses today.
    pub const TEN_SECONDS: Duration = Duration::from_secs(10);

    /// A throttle that lets one line through every `every`.
    pub fn new(every: Duration) -> Self {
        LogEvery {
            every,
            state: Mutex::new(State::default()),
        }
    }

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
            .is_some_and(|t| now.saturating_duration_since(t) < self.every)
        {
            s.suppressed += 1;
            return None;
        }
        s.last = Some(now);
        Some(std::mem::take(&mut s.suppressed))
    }
}

impl Default for LogEvery {
    /// Every 10 s.
    fn default() -> Self {
        LogEvery::new(LogEvery::TEN_SECONDS)
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
        assert_eq!(l.ready_at(later + LogEvery::TEN_SECONDS), Some(1));
    }

    #[test]
    fn the_interval_is_the_callers() {
        let l = LogEvery::new(Duration::from_millis(50));
        let t0 = Instant::now();
        assert_eq!(l.ready_at(t0), Some(0));
        assert_eq!(l.ready_at(t0 + Duration::from_millis(49)), None);
        assert_eq!(l.ready_at(t0 + Duration::from_millis(50)), Some(1));
        // An instant before the last line (another thread's clock read) is
        // within the interval, not a wrap-around.
        assert_eq!(l.ready_at(t0), None);
    }
}
