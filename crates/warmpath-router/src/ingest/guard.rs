//! What the ingest does before it knows who a peer is: credential shape, caps
//! on unauthenticated streams, and peer strings escaped and cut in logs.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Streams one HTTP/2 connection may have open at once (an agent opens one per worker).
pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 64;

/// Streams one peer address (an IPv6 /64) may hold before their Hello.
pub(crate) const MAX_UNAUTHENTICATED_PER_PEER: usize = 16;

/// Streams every peer together may hold before authentication.
pub(crate) const MAX_UNAUTHENTICATED: usize = 256;

/// Characters of a peer-chosen string a log line or refusal shows.
pub(crate) const SHOWN_CHARS: usize = 64;

/// Whether `t` has the shape of a worker credential (`wp1-` and 64 lowercase hex).
pub(crate) fn is_worker_token(t: &str) -> bool {
    t.strip_prefix("wp1-").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A peer-chosen string as logs show it: cut, quoted and escaped (no forged lines).
pub(crate) fn shown(s: &str) -> String {
    let cut = s
        .char_indices()
        .nth(SHOWN_CHARS)
        .map_or(s.len(), |(i, _)| i);
    if cut == s.len() {
        format!("{s:?}")
    } else {
        format!("{:?}… ({} bytes)", &s[..cut], s.len())
    }
}

/// The address a cap counts under: IPv4 as it is, IPv6 by its /64.
fn peer_key(remote: Option<SocketAddr>) -> Option<IpAddr> {
    let ip = remote?.ip();
    Some(match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    })
}

/// Streams not yet authenticated, by peer address.
#[derive(Debug)]
pub(crate) struct Admission {
    per_peer: usize,
    total: usize,
    open: Mutex<(HashMap<Option<IpAddr>, usize>, usize)>,
}

/// Why a stream was not admitted: its peer address, or every peer together,
/// holds its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Full {
    #[error("too many agent streams from this address are waiting for their Hello (at most {0}); retry later")]
    Peer(usize),
    #[error("too many agent streams are waiting for their Hello (at most {0}); retry later")]
    All(usize),
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(MAX_UNAUTHENTICATED_PER_PEER, MAX_UNAUTHENTICATED)
    }
}

impl Admission {
    pub(crate) fn new(per_peer: usize, total: usize) -> Self {
        Admission {
            per_peer,
            total,
            open: Mutex::new((HashMap::new(), 0)),
        }
    }

    /// Holds a place for a stream from `remote` until the ticket is dropped.
    pub(crate) fn admit(self: &Arc<Self>, remote: Option<SocketAddr>) -> Result<Ticket, Full> {
        let key = peer_key(remote);
        let mut open = self.open.lock();
        if open.1 >= self.total {
            return Err(Full::All(self.total));
        }
        let n = open.0.entry(key).or_insert(0);
        if *n >= self.per_peer {
            return Err(Full::Peer(self.per_peer));
        }
        *n += 1;
        open.1 += 1;
        Ok(Ticket {
            admission: Arc::clone(self),
            key,
        })
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.open.lock().1
    }
}

/// A place among the unauthenticated streams; given back on drop.
#[derive(Debug)]
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    key: Option<IpAddr>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock();
        open.1 = open.1.saturating_sub(1);
        if let Some(n) = open.0.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.0.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_edge::LogEvery;

    #[test]
    fn only_the_shape_worker_token_prints_passes() {
        assert!(is_worker_token(&warmpath_proto::worker_token("s", "w")));
        for bad in [
            "",
            "wp1-",
            "wp1-garbage",
            &format!("wp1-{}", "0".repeat(63)),
            &format!("wp1-{}", "0".repeat(65)),
            &format!("wp1-{}", "A".repeat(64)),
            &format!("wp2-{}", "0".repeat(64)),
        ] {
            assert!(!is_worker_token(bad), "{bad}");
        }
    }

    #[test]
    fn shown_strings_are_escaped_and_cut() {
        assert_eq!(shown("w1"), "\"w1\"");
        let s = shown(&format!("a\nb{}", "é".repeat(1000)));
        assert!(s.starts_with("\"a\\nb"), "{s}");
        assert!(!s.contains('\n'));
        assert!(s.ends_with(&format!("({} bytes)", 3 + 2000)), "{s}");
        assert!(s.chars().count() < SHOWN_CHARS + 40, "{s}");
    }

    #[test]
    fn log_every_lets_one_line_through_every_10_s_and_counts_the_rest() {
        use std::time::{Duration, Instant};
        let l = LogEvery::default();
        let t0 = Instant::now();
        assert_eq!(l.ready_at(t0), Some(0));
        assert_eq!((l.ready(), l.ready()), (None, None));
        assert_eq!(l.ready_at(t0 + Duration::from_secs(10)), Some(2));
    }

    #[test]
    fn admission_caps_each_peer_and_all_and_gives_places_back() {
        let a = Arc::new(Admission::new(2, 3));
        let p = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        let t1 = a.admit(p("10.0.0.1:1")).unwrap();
        let _t2 = a.admit(p("10.0.0.1:2")).unwrap();
        assert_eq!(a.admit(p("10.0.0.1:3")).unwrap_err(), Full::Peer(2));
        // Another address is not affected; the global cap is.
        let _t3 = a.admit(p("10.0.0.2:1")).unwrap();
        assert_eq!(a.admit(p("10.0.0.3:1")).unwrap_err(), Full::All(3));
        drop(t1);
        assert_eq!(a.held(), 2);
        let _t4 = a.admit(p("10.0.0.1:4")).unwrap();
        // One IPv6 /64 counts as one peer; a mapped IPv4 as its IPv4.
        let b = Arc::new(Admission::new(1, 10));
        let _v6 = b.admit(p("[2001:db8::1]:1")).unwrap();
        assert!(b.admit(p("[2001:db8::2]:1")).is_err());
        let _v4 = b.admit(p("10.0.0.9:1")).unwrap();
        assert!(b.admit(p("[::ffff:10.0.0.9]:1")).is_err());
    }
}
