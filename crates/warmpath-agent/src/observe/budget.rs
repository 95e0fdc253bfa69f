//! A byte budget shared by tasks: what holds bytes counts them in, and
//! gives them back when its [`Held`] is dropped.
//!
//! Observe mode keeps two: the bodies queued for hashing (a queue of 1,024
//! bodies of up to 64 MiB each would hold gigabytes) and the request bodies
//! the proxy is still reading or forwarding (each connection may send one
//! of up to 64 MiB over 30 s, and their number is not bounded).

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use warmpath_core::Expect;

/// At most `max` bytes held at once, over every [`Held`] it gave out.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    used: Arc<AtomicUsize>,
    max: usize,
}

/// Bytes counted in a [`ByteBudget`] until this is dropped.
#[derive(Debug)]
pub struct Held {
    used: Arc<AtomicUsize>,
    bytes: usize,
    max: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl ByteBudget {
    /// At most `max` bytes held.
    pub fn new(max: usize) -> Self {
        ByteBudget {
            used: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// `bytes` counted in, or `None` (nothing held) when they do not fit.
    pub fn hold(&self, bytes: usize) -> Option<Held> {
        let mut held = Held {
            used: Arc::clone(&self.used),
            bytes: 0,
            max: self.max,
        };
        held.grow(bytes).then_some(held)
    }
}

impl Held {
    /// `more` bytes counted in too; `false` when the budget is then over
    /// its bound (they stay counted until this is dropped, which the caller
    /// does at once).
    pub fn grow(&mut self, more: usize) -> bool {
        let before = self.used.fetch_add(more, Ordering::Relaxed);
        self.bytes += more;
        before.saturating_add(more) <= self.max
    }

    /// Bytes this holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One request the engine accepted, to be mirrored.
#[derive(Debug)]
pub struct Observed {
    /// The request body as forwarded.
    pub body: Bytes,
    /// Chat or completion endpoint.
    pub expect: Expect,
    /// Its bytes in the queue's budget, given back when it is dropped.
    _held: Held,
}

impl Observed {
    /// `body` as an observation counted in `queue`, the byte budget of
    /// bodies waiting to be hashed, or `None` when it does not fit.
    pub fn within(queue: &ByteBudget, body: Bytes, expect: Expect) -> Option<Observed> {
        queue.hold(body.len()).map(|held| Observed {
            body,
            expect,
            _held: held,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_holds_its_bytes_in_the_queue_budget_until_dropped() {
        let q = ByteBudget::new(100);
        let body = |n: usize| Bytes::from(vec![b'x'; n]);
        let first = Observed::within(&q, body(60), Expect::Chat).unwrap();
        assert!(Observed::within(&q, body(60), Expect::Chat).is_none());
        assert_eq!(q.used(), 60);
        let second = Observed::within(&q, body(40), Expect::Chat).unwrap();
        assert_eq!(q.used(), 100);
        drop(first);
        drop(second);
        assert_eq!(q.used(), 0);
        assert!(Observed::within(&q, body(100), Expect::Completion).is_some());
        assert_eq!(q.used(), 0, "given back once dropped");
    }

    #[test]
    fn bytes_are_held_until_dropped_and_never_past_the_bound() {
        let b = ByteBudget::new(100);
        let first = b.hold(60).unwrap();
        assert!(b.hold(60).is_none());
        assert_eq!(b.used(), 60, "a refused hold gives its bytes back");
        let mut second = b.hold(10).unwrap();
        assert!(second.grow(30));
        assert_eq!((b.used(), second.bytes()), (100, 40));
        assert!(!second.grow(1), "one byte past the bound");
        drop(second);
        assert_eq!(b.used(), 60);
        drop(first);
        assert_eq!(b.used(), 0);
        assert!(b.hold(100).is_some());
        assert_eq!(b.used(), 0);
    }
}
