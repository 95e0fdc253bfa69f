//! "Log at most every N s": a peer that can cause an event at will (a
//! refused stream, a failing accept, an engine reporting too much) must not
//! be able to flood the log, but the line that does get through says how
//! many it stands for. Also an accept loop's backoff and connection cap.

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

/// An accept loop's failures (EMFILE, most likely): the wait doubles from
/// 10 ms to 1 s, the warning is logged at most every 10 s.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    failures: u64,
    delay_ms: u64,
    log: LogEvery,
}

impl AcceptBackoff {
    /// Counts a failure; returns how long to wait before accepting again.
    pub fn failed(&mut self, e: &std::io::Error) -> Duration {
        self.failures += 1;
        if self.log.ready().is_some() {
            tracing::warn!(error = %e, failures = self.failures,
                "accept failed; backing off (logged at most every 10 s)");
        }
        self.delay_ms = (self.delay_ms * 2).clamp(10, 1_000);
        Duration::from_millis(self.delay_ms)
    }

    pub fn succeeded(&mut self) {
        if self.failures > 0 {
            tracing::info!(failures = self.failures, "accept works again");
            (self.failures, self.delay_ms) = (0, 0);
        }
    }
}

/// `percent`% of the soft open-file limit, at least 1: the connections an
/// accept loop keeps open at once, the other descriptors left to the rest.
pub fn open_file_share(percent: u64) -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    ((soft.min(1 << 24) * percent / 100) as usize).max(1)
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

    #[test]
    fn the_open_file_share_stays_below_the_limit() {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        for percent in [40, 80] {
            let n = open_file_share(percent) as u64;
            assert!(n >= 1 && n < soft.max(2), "{n} of {soft}");
        }
        assert!(open_file_share(40) <= open_file_share(80));
    }

    #[test]
    fn accept_backoff_doubles_to_a_second_and_resets_on_success() {
        let (mut b, e) = (AcceptBackoff::default(), std::io::Error::other("EMFILE"));
        let waits: Vec<u64> = (0..9).map(|_| b.failed(&e).as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1_000, 1_000]);
        b.succeeded();
        assert_eq!(b.failed(&e), Duration::from_millis(10));
    }
}
