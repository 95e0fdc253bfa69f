//! ZMQ framing shared by the publisher and the subscriber: sequence frames,
//! replay requests and replies, and vLLM's endpoint spelling.

use bytes::Bytes;

/// The sequence number of the replay end marker (its payload is empty).
pub const END_OF_REPLAY: u64 = u64::MAX;

/// Reads an 8-byte big-endian sequence frame.
pub fn parse_seq(frame: &[u8]) -> Option<u64> {
    let arr: [u8; 8] = frame.try_into().ok()?;
    Some(u64::from_be_bytes(arr))
}

/// Parses a replay request as the ROUTER sees it after the identity frame:
/// `["", start_seq]` (a DEALER's delimiter frame, then the seq).
pub fn parse_replay_request(frames: &[Bytes]) -> Option<u64> {
    match frames {
        [empty, seq] if empty.is_empty() => parse_seq(seq),
        [seq] => parse_seq(seq),
        _ => None,
    }
}

/// One replay reply as a DEALER receives it: `["", seq, payload]` (vLLM <= 0.24)
/// or `["", topic, seq, payload]` (>= 0.26). Returns `(seq, payload)`.
pub fn parse_replay_reply(frames: &[Bytes]) -> Option<(u64, Bytes)> {
    match frames {
        [empty, topic @ .., seq, payload] if empty.is_empty() && topic.len() <= 1 => {
            Some((parse_seq(seq)?, payload.clone()))
        }
        _ => None,
    }
}

/// One live message: `[topic, seq, payload]`. Returns `(seq, payload)`.
pub fn parse_live(frames: &[Bytes]) -> Option<(u64, Bytes)> {
    match frames {
        [_topic, seq, payload] => Some((parse_seq(seq)?, payload.clone())),
        _ => None,
    }
}

/// vLLM writes `tcp://*:5557` for "every interface"; the `zeromq` crate wants an
/// address, so `*` becomes `0.0.0.0`.
pub fn endpoint_for_bind(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

/// The endpoint a subscriber connects to for data-parallel `rank`: vLLM
/// publishes rank r on `port + r`. Returns `None` for a non-TCP endpoint with
/// rank > 0 or a port overflow.
pub fn endpoint_for_rank(endpoint: &str, rank: u16) -> Option<String> {
    if rank == 0 {
        return Some(endpoint.to_owned());
    }
    let (head, port) = endpoint.rsplit_once(':')?;
    if !endpoint.starts_with("tcp://") {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    Some(format!("{head}:{}", port.checked_add(rank)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_reply_both_layouts() {
        let seq = Bytes::copy_from_slice(&7u64.to_be_bytes());
        let p = Bytes::from_static(b"x");
        let three = [Bytes::new(), seq.clone(), p.clone()];
        let four = [Bytes::new(), Bytes::from_static(b"kv"), seq, p.clone()];
        assert_eq!(parse_replay_reply(&three), Some((7, p.clone())));
        assert_eq!(parse_replay_reply(&four), Some((7, p)));
        assert_eq!(parse_replay_reply(&[Bytes::from_static(b"junk")]), None);
    }

    #[test]
    fn seq_frames_must_be_8_bytes() {
        assert_eq!(parse_seq(&[0, 0, 0, 0, 0, 0, 1, 0]), Some(256));
        assert_eq!(parse_seq(&[1, 2, 3]), None);
    }

    #[test]
    fn endpoints() {
        assert_eq!(endpoint_for_bind("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(
            endpoint_for_rank("tcp://127.0.0.1:5557", 2).as_deref(),
            Some("tcp://127.0.0.1:5559")
        );
        assert_eq!(endpoint_for_rank("ipc:///tmp/x", 1), None);
        assert_eq!(endpoint_for_rank("tcp://h:65535", 1), None);
    }
}
