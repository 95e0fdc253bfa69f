//! Paces the index work an agent's message does not bound (a snapshot, a
//! `Cleared`): one per [`REPLACE_EVERY`] per worker after a [`BURST`].

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use warmpath_proto::v1::{agent_message::Msg, delta::Op, AgentMessage};

/// The least time between two replacements of one worker's set, past the burst.
pub(crate) const REPLACE_EVERY: Duration = Duration::from_secs(1);

/// Replacements a worker may make at once before the pace applies.
const BURST: u64 = 8;

/// A delta touching at least this many blocks is applied on the blocking pool too.
const BIG_DELTA: usize = 4096;

/// What a message asks of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Bounded and quick: applied on the stream's task.
    Light,
    /// Bounded but long: on the blocking pool.
    Big,
    /// Replaces the worker's set (paced, on the blocking pool); its metric label.
    Replace(&'static str),
}

pub(crate) fn work(m: &AgentMessage) -> Work {
    match &m.msg {
        Some(Msg::Snapshot(c)) if c.last => Work::Replace("snapshot"),
        Some(Msg::Snapshot(c)) if c.blocks.len() >= BIG_DELTA => Work::Big,
        Some(Msg::Hello(_)) => Work::Replace("hello"),
        Some(Msg::Delta(d)) => match &d.op {
            Some(Op::Cleared(_)) => Work::Replace("cleared"),
            Some(Op::Stored(s)) if s.hashes.len() >= BIG_DELTA => Work::Big,
            Some(Op::Removed(r)) if r.hashes.len() >= BIG_DELTA => Work::Big,
            _ => Work::Light,
        },
        _ => Work::Light,
    }
}

/// How long a replacement waits, given the pace clock `tat` (a generic cell rate algorithm).
pub(crate) fn wait_for(tat: Option<u64>, now_ms: u64) -> Option<Duration> {
    let every = REPLACE_EVERY.as_millis() as u64;
    let ahead = tat?.saturating_sub(now_ms);
    let slack = (BURST - 1) * every;
    (ahead > slack).then(|| Duration::from_millis(ahead - slack))
}

/// The pace clock after a replacement at `now_ms` (after its wait).
pub(crate) fn next_tat(tat: Option<u64>, now_ms: u64) -> u64 {
    let every = REPLACE_EVERY.as_millis() as u64;
    tat.unwrap_or(0).max(now_ms).saturating_add(every)
}

/// One gate per pool: index jobs that may compact run one at a time.
#[derive(Debug, Default)]
pub(crate) struct Gates {
    by_pool: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Gates {
    pub(crate) fn of(&self, model: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(self.by_pool.lock().entry(model.to_owned()).or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warmpath_proto::v1::{Cleared, Delta, SnapshotChunk, Stored};

    #[test]
    fn replacements_pass_in_a_burst_then_one_a_second() {
        assert_eq!(wait_for(None, 5), None);
        // Eight at once pass; the ninth waits a second, the tenth two.
        let (mut tat, now) = (None, 10_000);
        for _ in 0..BURST {
            assert_eq!(wait_for(tat, now), None);
            tat = Some(next_tat(tat, now));
        }
        assert_eq!(wait_for(tat, now), Some(Duration::from_secs(1)));
        tat = Some(next_tat(tat, now + 1_000));
        assert_eq!(wait_for(tat, now + 1_000), Some(Duration::from_secs(1)));
        assert_eq!(wait_for(tat, now + 2_000), None);
        // Idle for long enough, the whole burst is back.
        assert_eq!(wait_for(tat, now + 60_000), None);
        assert_eq!(next_tat(tat, now + 60_000), now + 61_000);
    }

    #[test]
    fn what_replaces_or_is_big_is_told_apart() {
        let m = |msg| AgentMessage { msg: Some(msg) };
        let chunk = |last, n: usize| {
            m(Msg::Snapshot(SnapshotChunk {
                last,
                blocks: vec![Default::default(); n],
                ..Default::default()
            }))
        };
        let delta = |op| {
            m(Msg::Delta(Delta {
                seq: 1,
                op: Some(op),
                observed_unix_micros: 0,
                prefix_closed: false,
            }))
        };
        assert_eq!(work(&chunk(true, 1)), Work::Replace("snapshot"));
        assert_eq!(work(&chunk(false, 1)), Work::Light);
        assert_eq!(work(&chunk(false, BIG_DELTA)), Work::Big);
        assert_eq!(
            work(&delta(Op::Cleared(Cleared {}))),
            Work::Replace("cleared")
        );
        let stored = |n| {
            Op::Stored(Stored {
                parent: None,
                hashes: vec![1; n],
                tier: 0,
            })
        };
        assert_eq!(work(&delta(stored(3))), Work::Light);
        assert_eq!(work(&delta(stored(BIG_DELTA))), Work::Big);
        assert_eq!(work(&AgentMessage { msg: None }), Work::Light);
    }
}
