//! warmpath-proto: the agent -> router protocol, `warmpath.v1`, compiled from
//! `proto/warmpath/v1/cache_events.proto` (the source of truth for every field's
//! semantics) with `protox` (no system `protoc`), plus the helpers both sides
//! share: bearer tokens, snapshot chunks, error chains, DNS, credential files
//! and logging.

/// Generated code for package `warmpath.v1`.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod v1 {
    tonic::include_proto!("warmpath.v1");
}

pub mod dns;
pub mod files;
pub mod logging;

pub use v1::cache_events_client::CacheEventsClient;
pub use v1::cache_events_server::{CacheEvents, CacheEventsServer};

/// gRPC metadata key carrying the shared agent token.
pub const AUTHORIZATION: &str = "authorization";

/// The most blocks an agent puts in one [`v1::SnapshotChunk`] (about 160 KiB
/// encoded), far below tonic's default 4 MiB message limit.
pub const MAX_SNAPSHOT_CHUNK_BLOCKS: usize = 8192;

/// A snapshot of `blocks` at `seq` as the chunks an agent sends: at most
/// [`MAX_SNAPSHOT_CHUNK_BLOCKS`] each, one empty chunk for an empty set, and
/// `prefix_closed` on the final chunk only (the .proto's "Prefix closure").
pub fn snapshot_chunks(
    seq: u64,
    blocks: &[v1::Block],
    prefix_closed: bool,
) -> Vec<v1::SnapshotChunk> {
    let total = blocks.len() as u64;
    let mut parts: Vec<&[v1::Block]> = blocks.chunks(MAX_SNAPSHOT_CHUNK_BLOCKS).collect();
    if parts.is_empty() {
        parts.push(&[]);
    }
    let n = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| v1::SnapshotChunk {
            seq,
            chunk_index: i as u32,
            first: i == 0,
            last: i + 1 == n,
            blocks: part.to_vec(),
            total_blocks: total,
            prefix_closed: prefix_closed && i + 1 == n,
        })
        .collect()
}

/// Now in microseconds since the Unix epoch, the wire's clock
/// (`Delta.observed_unix_micros`, the ingest's receive time); 0 before 1970.
pub fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The metadata value for `token`: `Bearer <token>`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// The token of `authorization: Bearer <token>` in `metadata`, if any.
pub fn bearer_token(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    metadata
        .get(AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Compares in constant time over the bytes, so a check does not leak how
/// much of a guess was right.
pub fn same_token(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

/// [`same_token`] over bytes.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// HMAC-SHA256 of `parts`, in order, under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    use hmac::{Hmac, Mac};
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// The credential of one worker's agent under the router's `agent_secret`:
/// `wp1-` and the hex HMAC-SHA256 of the worker id. The router derives it
/// from the secret and the Hello's worker id, so it needs one secret for the
/// fleet, and an agent's token names its worker: it cannot publish for
/// another. `warmpath-router --print-agent-token WORKER` prints it.
pub fn worker_token(secret: &str, worker_id: &str) -> String {
    use std::fmt::Write;
    let tag = hmac_sha256(
        secret.as_bytes(),
        &[b"warmpath agent v1\0", worker_id.as_bytes()],
    );
    let mut out = String::from("wp1-");
    for b in tag {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The key router replicas sign their decision facts with
/// ([`v1::Decided::mac`]): an HMAC-SHA256 of a fixed label under the fleet's
/// `agent_secret`, so every replica derives the same key and no agent, which
/// holds only its own worker's credential, can.
pub fn fact_key(secret: &str) -> [u8; 32] {
    hmac_sha256(secret.as_bytes(), &[b"warmpath decision facts v1\0"])
}

/// The mac of `fact` under `key`: HMAC-SHA256 of the fact encoded with its
/// `mac` empty (prost encodes fields in tag order, so equal facts encode
/// alike in every build).
pub fn fact_mac(key: &[u8; 32], fact: &v1::Decided) -> Vec<u8> {
    use prost::Message;
    let bare = v1::Decided {
        mac: Vec::new(),
        ..fact.clone()
    };
    hmac_sha256(key, &[&bare.encode_to_vec()]).to_vec()
}

/// Whether `fact` carries its mac under `key` (compared in constant time).
pub fn fact_signed(key: &[u8; 32], fact: &v1::Decided) -> bool {
    same_bytes(&fact_mac(key, fact), &fact.mac)
}

/// `e` and its sources, joined by `: ` (tonic's own text is often just
/// "transport error"; the why is in the sources).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        // io::Error repeats its inner error's text; say it once.
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::v1::{agent_message, delta, AgentMessage, Delta, Stored, Tier};

    #[test]
    fn a_fact_is_signed_only_under_the_fleets_key_and_as_it_was_sent() {
        use super::v1::{decided::Phase, Decided};
        use super::{fact_key, fact_mac, fact_signed};
        let key = fact_key("fleet secret");
        assert_ne!(key, fact_key("another secret"));
        let mut d = Decided {
            router: 7,
            request: 42,
            phase: Phase::Start as i32,
            model: "m".into(),
            prefix_key: 99,
            chain_blocks: 500,
            prefill_blocks: 500,
            home: "w1".into(),
            copies: vec!["w2".into()],
            mac: Vec::new(),
        };
        assert!(!fact_signed(&key, &d), "unsigned");
        d.mac = fact_mac(&key, &d);
        assert_eq!(d.mac.len(), 32);
        assert!(fact_signed(&key, &d));
        assert!(!fact_signed(&fact_key("another secret"), &d));
        // Any field changed after signing: refused.
        for change in [
            |d: &mut Decided| d.home = "w3".into(),
            |d: &mut Decided| d.prefill_blocks = u64::MAX,
            |d: &mut Decided| d.copies.push("w4".into()),
            |d: &mut Decided| d.router = 8,
        ] {
            let mut forged = d.clone();
            change(&mut forged);
            assert!(!fact_signed(&key, &forged), "{forged:?}");
        }
        // The mac itself cut or empty: refused.
        let mut cut = d.clone();
        cut.mac.pop();
        assert!(!fact_signed(&key, &cut));
    }

    /// Pinned: agents and routers of different builds must agree. Computed
    /// independently with Python's `hmac` module.
    #[test]
    fn worker_tokens_are_pinned_and_name_their_worker() {
        assert_eq!(
            super::worker_token("the-router-secret", "gpu-node-5"),
            "wp1-19db69097759e3e03389f5d6edfb20727752891c3a00ed472afa92fc6192f879"
        );
        assert_ne!(super::worker_token("s", "a"), super::worker_token("s", "b"));
        assert_ne!(super::worker_token("s", "a"), super::worker_token("t", "a"));
        assert!(super::same_token("abc", "abc") && !super::same_token("abc", "abd"));
        assert!(!super::same_token("abc", "abcd"));
    }
    use super::*;
    use prost::Message;

    #[test]
    fn bearer_token_reads_only_a_bearer_header() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(bearer_token(&md), None, "missing header");
        md.insert(AUTHORIZATION, bearer("s3cret").parse().unwrap());
        assert_eq!(bearer_token(&md), Some("s3cret"));
        md.insert(AUTHORIZATION, "Basic s3cret".parse().unwrap());
        assert_eq!(bearer_token(&md), None);
    }

    #[test]
    fn snapshots_are_cut_into_bounded_chunks_with_the_claim_on_the_last() {
        let empty = snapshot_chunks(3, &[], true);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].first && empty[0].last && empty[0].prefix_closed);
        let b = v1::Block {
            hash: 1,
            parent: None,
            tier: Tier::Gpu as i32,
        };
        let blocks = vec![b; MAX_SNAPSHOT_CHUNK_BLOCKS + 1];
        let cs = snapshot_chunks(7, &blocks, true);
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0].blocks.len(), MAX_SNAPSHOT_CHUNK_BLOCKS);
        assert!(cs[0].first && !cs[0].last && !cs[0].prefix_closed);
        assert!(!cs[1].first && cs[1].last && cs[1].prefix_closed);
        assert!(cs
            .iter()
            .all(|c| c.seq == 7 && c.total_blocks == blocks.len() as u64));
        assert!(!snapshot_chunks(7, &blocks, false)[1].prefix_closed);
    }

    #[test]
    fn delta_round_trips_and_parent_presence_survives() {
        let msg = AgentMessage {
            msg: Some(agent_message::Msg::Delta(Delta {
                seq: 7,
                op: Some(delta::Op::Stored(Stored {
                    parent: None,
                    hashes: vec![u64::MAX, 1],
                    tier: Tier::Cpu as i32,
                })),
                observed_unix_micros: 0,
                prefix_closed: false,
            })),
        };
        let back = AgentMessage::decode(msg.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, msg);
        let Some(agent_message::Msg::Delta(d)) = back.msg else {
            panic!("not a delta")
        };
        let Some(delta::Op::Stored(s)) = d.op else {
            panic!("not stored")
        };
        assert_eq!(s.parent, None, "absent parent stays absent, not 0");
    }
}
