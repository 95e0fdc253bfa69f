//! An accept loop's backoff when accepting fails, and its cap on open connections.

use crate::throttle::LogEvery;
use std::time::Duration;

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
