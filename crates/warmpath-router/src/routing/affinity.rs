//! Which backend stored which `/v1/responses` response, learned from the
//! answers ([`IdTap`]): vLLM keeps one only on the instance that made it.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use warmpath_core::request::surface::{is_response_id_byte, MAX_RESPONSE_ID};

/// Bytes of an answer read for its id (the response object's first field).
pub(crate) const TAP_BYTES: usize = 64 * 1024;

/// Stored `/v1/responses` ids a pool remembers, the oldest forgotten first.
pub(crate) const RESPONSE_IDS: usize = 65_536;

/// Response id → worker id, at most `cap` ids; and the recent misses.
#[derive(Debug)]
pub(crate) struct ResponseHomes {
    cap: usize,
    inner: Mutex<Fifo<String>>,
    /// Ids no backend had → when the miss expires (monotonic ms): a retried
    /// unknown id costs no fan-out.
    misses: Mutex<Fifo<u64>>,
    /// Look-ups asking every backend at once (a flood of unknown ids is bounded).
    lookups: tokio::sync::Semaphore,
}

/// How long a miss is remembered.
const MISS_TTL_MS: u64 = 10_000;
/// Misses remembered at once.
const MISSES: usize = 4096;
/// Fan-out look-ups in flight at once, per pool.
const LOOKUPS: usize = 16;

/// Values by id, at most a cap of them, the oldest id forgotten first.
#[derive(Debug, Default)]
struct Fifo<V> {
    by_id: HashMap<String, V>,
    order: VecDeque<String>,
}

impl<V> Fifo<V> {
    /// Sets `id`'s value; a new id past `cap` forgets the oldest.
    fn insert(&mut self, id: &str, v: V, cap: usize) {
        if self.by_id.insert(id.to_owned(), v).is_some() {
            return;
        }
        self.order.push_back(id.to_owned());
        while self.order.len() > cap {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

impl ResponseHomes {
    /// Remembers at most `cap` ids (at least 1).
    pub(crate) fn new(cap: usize) -> Self {
        ResponseHomes {
            cap: cap.max(1),
            inner: Mutex::default(),
            misses: Mutex::default(),
            lookups: tokio::sync::Semaphore::new(LOOKUPS),
        }
    }

    pub(crate) fn remember(&self, id: &str, worker: &str) {
        self.inner.lock().insert(id, worker.to_owned(), self.cap);
    }

    /// Whether `id` was looked for lately and no backend had it.
    pub(crate) fn missed(&self, id: &str, now_ms: u64) -> bool {
        self.misses
            .lock()
            .by_id
            .get(id)
            .is_some_and(|&t| t > now_ms)
    }

    pub(crate) fn miss(&self, id: &str, now_ms: u64) {
        self.misses.lock().insert(id, now_ms + MISS_TTL_MS, MISSES);
    }

    /// A turn to ask every backend, waiting at most `wait`.
    pub(crate) async fn lookup_turn(
        &self,
        wait: std::time::Duration,
    ) -> Option<tokio::sync::SemaphorePermit<'_>> {
        tokio::time::timeout(wait, self.lookups.acquire())
            .await
            .ok()?
            .ok()
    }

    pub(crate) fn holder(&self, id: &str) -> Option<String> {
        self.inner.lock().by_id.get(id).cloned()
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.lock().order.len()
    }
}

/// Reads an answer's first bytes for its response id.
#[derive(Debug)]
pub(crate) struct IdTap {
    pub worker: String,
    seen: Vec<u8>,
}

/// What one more piece of an answer told an [`IdTap`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tapped {
    Found(String),
    /// Not yet: more bytes may tell.
    More,
    /// [`TAP_BYTES`] read without an id, or a malformed one: stop looking.
    GiveUp,
}

impl IdTap {
    pub(crate) fn new(worker: String) -> Self {
        IdTap {
            worker,
            seen: Vec::new(),
        }
    }

    pub(crate) fn feed(&mut self, data: &[u8]) -> Tapped {
        let room = TAP_BYTES.saturating_sub(self.seen.len());
        self.seen.extend_from_slice(&data[..data.len().min(room)]);
        match first_id(&self.seen) {
            Some(Ok(id)) => Tapped::Found(id),
            Some(Err(())) => Tapped::GiveUp,
            None if self.seen.len() >= TAP_BYTES => Tapped::GiveUp,
            None => Tapped::More,
        }
    }
}

/// The first `"id"` in `buf`: `None` until complete, `Err` when not a plain string.
fn first_id(buf: &[u8]) -> Option<Result<String, ()>> {
    const KEY: &[u8] = b"\"id\"";
    let at = memchr::memmem::find(buf, KEY)?;
    let mut i = at + KEY.len();
    // `: "`, whitespace allowed before each.
    for want in [b':', b'"'] {
        while buf.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if *buf.get(i)? != want {
            return Some(Err(()));
        }
        i += 1;
    }
    let rest = &buf[i..];
    let end = memchr::memchr(b'"', rest)?;
    let id = &rest[..end];
    let plain = !id.is_empty()
        && id.len() <= MAX_RESPONSE_ID
        && id.iter().copied().all(is_response_id_byte);
    if !plain {
        return Some(Err(()));
    }
    Some(Ok(String::from_utf8_lossy(id).into_owned()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn homes_forget_the_oldest_first() {
        let h = ResponseHomes::new(2);
        h.remember("a", "w0");
        h.remember("b", "w1");
        h.remember("a", "w2");
        assert_eq!(h.holder("a").as_deref(), Some("w2"));
        h.remember("c", "w0");
        assert_eq!(h.holder("a"), None, "the oldest id goes first");
        assert_eq!(h.holder("b").as_deref(), Some("w1"));
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn the_tap_finds_the_first_id_across_pieces() {
        let answer = br#"{"id": "resp_0a9f", "object":"response","output":[{"id":"msg_1"}]}"#;
        for cut in 0..answer.len() {
            let mut t = IdTap::new("w0".into());
            let first = t.feed(&answer[..cut]);
            let got = match first {
                Tapped::Found(id) => id,
                Tapped::More => match t.feed(&answer[cut..]) {
                    Tapped::Found(id) => id,
                    other => panic!("cut {cut}: {other:?}"),
                },
                Tapped::GiveUp => panic!("cut {cut}: gave up"),
            };
            assert_eq!(got, "resp_0a9f", "cut {cut}");
        }
        let sse = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_7\"";
        assert_eq!(
            IdTap::new("w".into()).feed(sse),
            Tapped::Found("resp_7".into())
        );
    }

    #[test]
    fn the_tap_gives_up_on_odd_ids_and_long_answers() {
        for bad in [
            &br#"{"id": 5}"#[..],
            br#"{"id": ""}"#,
            br#"{"id": "a\"b"}"#,
            br#"{"id": "a/b"}"#,
            br#"{"id" x}"#,
        ] {
            let got = IdTap::new("w".into()).feed(bad);
            assert_eq!(got, Tapped::GiveUp, "{}", String::from_utf8_lossy(bad));
        }
        let mut t = IdTap::new("w".into());
        assert_eq!(t.feed(&vec![b' '; TAP_BYTES - 1]), Tapped::More);
        assert_eq!(t.feed(b"  \"id\": \"late\""), Tapped::GiveUp);
    }
}
