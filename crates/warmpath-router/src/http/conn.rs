//! Client connections: how many are open and what each is doing, for its
//! watchdog. All polled on the connection's own task, so `Relaxed` atomics.

use crate::http::clock::monotonic_ms;
use crate::http::layer::Layer;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Share of `max_connections` above which idle connections are closed early.
const PRESSURE_PERCENT: usize = 90;
/// The keep-alive an idle connection gets while the limit is near.
const PRESSURE_IDLE_MS: u64 = 1_000;

/// The `server:` limits a connection lives under.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnLimits {
    /// From a request head's first byte to its end (and from accept to it).
    pub header_timeout: Duration,
    pub keepalive_idle: Duration,
    pub max_connections: usize,
    /// Longest a write to the client may wait (it reads nothing).
    pub send_timeout: Duration,
}

/// Every open connection, counted.
#[derive(Debug)]
pub(crate) struct Conns {
    pub(crate) limits: ConnLimits,
    open: AtomicUsize,
    pressure_at: usize,
    /// Wakes the watchdogs to look again: the open count crossed `pressure_at`,
    /// or accept ran out of descriptors.
    pub(crate) pressure: Notify,
    /// Woken when a connection closes (for [`Conns::all_closed`]).
    closed: Notify,
    open_gauge: metrics::Gauge,
    refused: metrics::Counter,
}

impl Conns {
    pub(crate) fn new(limits: ConnLimits) -> Arc<Self> {
        Arc::new(Conns {
            limits,
            open: AtomicUsize::new(0),
            pressure_at: limits.max_connections * PRESSURE_PERCENT / 100,
            pressure: Notify::new(),
            closed: Notify::new(),
            open_gauge: metrics::gauge!("warmpath_connections_open"),
            refused: metrics::counter!("warmpath_connections_refused_total"),
        })
    }

    /// Counts one more connection, or refuses it when `max_connections` are open.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Slot> {
        let n = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        if n > self.limits.max_connections {
            self.open.fetch_sub(1, Ordering::Relaxed);
            self.refused.increment(1);
            return None;
        }
        self.open_gauge.set(n as f64);
        if n == self.pressure_at + 1 {
            // Idle connections shorten their keep-alive now.
            self.pressure.notify_waiters();
        }
        Some(Slot {
            conns: Arc::clone(self),
            activity: Arc::new(Activity::new()),
        })
    }

    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Whether the limit is near: idle connections get a short keep-alive.
    pub(crate) fn under_pressure(&self) -> bool {
        self.open() > self.pressure_at
    }

    pub(crate) async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            if self.open() == 0 {
                return;
            }
            closed.await;
        }
    }
}

/// One admitted connection; dropping it uncounts it.
#[derive(Debug)]
pub(crate) struct Slot {
    pub conns: Arc<Conns>,
    pub activity: Arc<Activity>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let n = self.conns.open.fetch_sub(1, Ordering::Relaxed) - 1;
        self.conns.open_gauge.set(n as f64);
        self.conns.closed.notify_waiters();
    }
}

/// What one connection is doing, in monotonic milliseconds + 1 (0: not set).
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests being answered (more than one on HTTP/2).
    busy: AtomicU32,
    /// Whether a request was answered (then idle waits `keepalive_idle`).
    served: AtomicBool,
    /// When the connection last became idle (accepted, or an answer ended).
    idle_since: AtomicU64,
    /// The first byte read since then: a head is under way (on HTTP/2, any frame).
    head_started: AtomicU64,
    /// Since when a write to the client has been waiting for it to read.
    write_blocked: AtomicU64,
    /// Wakes the watchdog when its deadline may have moved earlier.
    pub(crate) changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            busy: AtomicU32::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(monotonic_ms() + 1),
            head_started: AtomicU64::new(0),
            write_blocked: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    /// A request began (its head is in); the returned guard ends it.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.head_started.store(0, Ordering::Relaxed);
        Busy(Arc::clone(self))
    }

    /// Bytes arrived (see [`crate::http::socket`]).
    pub(crate) fn read_some(&self) {
        if self.busy.load(Ordering::Relaxed) == 0 && self.head_started.load(Ordering::Relaxed) == 0
        {
            self.head_started
                .store(monotonic_ms() + 1, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    /// A write could not go out: the client's receive window is full.
    pub(crate) fn write_blocked(&self) {
        if self.write_blocked.load(Ordering::Relaxed) == 0 {
            self.write_blocked
                .store(monotonic_ms() + 1, Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    /// A write went out: the client reads.
    pub(crate) fn wrote(&self) {
        if self.write_blocked.load(Ordering::Relaxed) != 0 {
            self.write_blocked.store(0, Ordering::Relaxed);
        }
    }

    /// Whether a head is under way while none is answered (hyper's parse error).
    pub(crate) fn head_pending(&self) -> bool {
        self.busy.load(Ordering::Relaxed) == 0 && self.head_started.load(Ordering::Relaxed) != 0
    }

    /// When the connection is to be closed (monotonic ms); `None` while busy.
    pub(crate) fn close_at(&self, limits: &ConnLimits, pressure: bool) -> Option<u64> {
        let blocked = self.write_blocked.load(Ordering::Relaxed);
        if blocked != 0 {
            return Some(blocked - 1 + limits.send_timeout.as_millis() as u64);
        }
        if self.busy.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let header = limits.header_timeout.as_millis() as u64;
        let head = self.head_started.load(Ordering::Relaxed);
        if head != 0 {
            return Some(head - 1 + header);
        }
        let mut idle = if self.served.load(Ordering::Relaxed) {
            limits.keepalive_idle.as_millis() as u64
        } else {
            header
        };
        if pressure {
            idle = idle.min(PRESSURE_IDLE_MS);
        }
        Some(self.idle_since.load(Ordering::Relaxed) - 1 + idle)
    }
}

/// A request being answered on a connection; dropping it makes it idle again.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.0;
        a.served.store(true, Ordering::Relaxed);
        a.idle_since.store(monotonic_ms() + 1, Ordering::Relaxed);
        a.busy.fetch_sub(1, Ordering::Relaxed);
        a.changed.notify_one();
    }
}

/// Keeps the request counted as busy until its answer's body is dropped.
impl Layer for Busy {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn limits(max: usize) -> ConnLimits {
        ConnLimits {
            header_timeout: Duration::from_millis(100),
            keepalive_idle: Duration::from_millis(5_000),
            max_connections: max,
            send_timeout: Duration::from_millis(700),
        }
    }

    #[test]
    fn admission_stops_at_the_limit_and_slots_give_back() {
        let c = Conns::new(limits(2));
        let a = c.admit().unwrap();
        let b = c.admit().unwrap();
        assert!(c.admit().is_none());
        assert_eq!(c.open(), 2);
        assert!(c.under_pressure(), "2 > 90% of 2");
        drop(a);
        assert!(c.admit().is_some());
        drop(b);
    }

    #[test]
    fn deadlines_follow_what_the_connection_does() {
        let l = limits(100);
        let slot = Conns::new(l).admit().unwrap();
        let a = &slot.activity;
        let start = a.idle_since.load(Ordering::Relaxed) - 1;
        // New and silent: the header timeout.
        assert_eq!(a.close_at(&l, false), Some(start + 100));
        // Busy: no deadline.
        let busy = a.begin();
        assert_eq!(a.close_at(&l, false), None);
        a.read_some();
        assert_eq!(a.head_started.load(Ordering::Relaxed), 0, "body bytes");
        drop(busy);
        let idle = a.idle_since.load(Ordering::Relaxed) - 1;
        // Served and idle: the keep-alive, shortened near the limit.
        assert_eq!(a.close_at(&l, false), Some(idle + 5_000));
        assert_eq!(a.close_at(&l, true), Some(idle + PRESSURE_IDLE_MS));
        // A head under way: the header timeout from its first byte.
        a.read_some();
        let head = a.head_started.load(Ordering::Relaxed) - 1;
        assert_eq!(a.close_at(&l, false), Some(head + 100));
        // Busy with a client that reads nothing: the send timeout, until it
        // reads again.
        let busy = a.begin();
        a.write_blocked();
        let blocked = a.write_blocked.load(Ordering::Relaxed) - 1;
        assert_eq!(a.close_at(&l, false), Some(blocked + 700));
        a.wrote();
        assert_eq!(a.close_at(&l, false), None);
        drop(busy);
    }
}
