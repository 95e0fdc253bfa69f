//! The members a discovery provider no longer names, each since when: the
//! bookkeeping [`super::grace`] acts on.

use crate::routing::backend::Backend;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Intervals a vanished member waits out of rotation before its drain.
pub(crate) const GRACE_ROUNDS: u32 = 3;

/// A member out of rotation since `since`: its provider's answers lack it.
#[derive(Debug)]
struct Gone {
    since: Instant,
    member: Arc<Backend>,
}

/// One provider's members waiting out their grace, by worker id.
#[derive(Debug, Default)]
pub(crate) struct Vanished {
    by_id: Mutex<HashMap<String, Gone>>,
}

impl Vanished {
    /// When `id` left the answers, if it waits out its grace now.
    pub(crate) fn since(&self, id: &str) -> Option<Instant> {
        self.by_id.lock().get(id).map(|g| g.since)
    }

    /// `id` is no longer this provider's to bring back.
    pub(crate) fn forget(&self, id: &str) {
        self.by_id.lock().remove(id);
    }

    pub(super) fn mark(&self, b: &Arc<Backend>, now: Instant) {
        self.by_id.lock().insert(
            b.endpoint.id().to_owned(),
            Gone {
                since: now,
                member: Arc::clone(b),
            },
        );
    }

    /// Takes `b`'s mark when it is still the member that was set aside.
    pub(super) fn take(&self, b: &Arc<Backend>) -> bool {
        let gone = self.by_id.lock().remove(b.endpoint.id());
        gone.is_some_and(|g| Arc::ptr_eq(&g.member, b))
    }

    /// When `b`'s grace began, if `b` itself was set aside.
    pub(super) fn since_of(&self, b: &Arc<Backend>) -> Option<Instant> {
        let mut m = self.by_id.lock();
        match m.get(b.endpoint.id()) {
            Some(g) if Arc::ptr_eq(&g.member, b) => Some(g.since),
            Some(_) => {
                m.remove(b.endpoint.id());
                None
            }
            None => None,
        }
    }
}
