//! A loopback relay in front of each engine event endpoint that ends a
//! connection announcing an oversized ZMTP frame or message before `zeromq`
//! reads the header: `zeromq` 0.7 reserves any announced length at once, so
//! one 9-byte header could abort the agent (docs/hostile-edges-agent.md).

use std::io;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Most frames in one multipart message (vLLM sends 2 or 3).
pub const MAX_PARTS: u32 = 1024;

/// What a multipart message may add over `max_frame` (topic, seq, and the
/// replay's framing).
const MESSAGE_SLACK: u64 = 1 << 20;

/// How long a dial to the engine is retried while it is down, as `zeromq`
/// would (its connect timeout).
const DIAL_FOR: Duration = Duration::from_secs(30);

/// Why the engine's byte stream was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes announced (at most {max})")]
    TooLong { len: u64, max: u64 },
    #[error("multipart message over {max} bytes")]
    MessageTooLong { max: u64 },
    #[error("multipart message of more than {MAX_PARTS} frames")]
    TooManyParts,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Bytes still to pass unread (the greeting, a frame's body).
    Skip(u64),
    /// Next byte: a frame's flags.
    Flags,
    /// Reading a length: bytes still due, value so far, a command's?
    Length { due: u8, value: u64, command: bool },
}

/// The engine-to-agent ZMTP stream's frame checker.
#[derive(Debug)]
pub struct FrameCheck {
    state: State,
    max_frame: u64,
    /// Bytes and frames of the multipart message so far.
    message: u64,
    parts: u32,
    /// Whether the frame being read has MORE set.
    more: bool,
}

impl FrameCheck {
    /// A checker for a new connection, frames capped at `max_frame` bytes.
    pub fn new(max_frame: u64) -> Self {
        FrameCheck {
            state: State::Skip(64),
            max_frame,
            message: 0,
            parts: 0,
            more: false,
        }
    }

    /// Checks the next bytes of the stream; an error ends it.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), FrameError> {
        while let Some((&b, _)) = bytes.split_first() {
            match self.state {
                State::Skip(due) => {
                    let n = (bytes.len() as u64).min(due);
                    bytes = &bytes[n as usize..];
                    self.state = match due - n {
                        0 => State::Flags,
                        left => State::Skip(left),
                    };
                    continue;
                }
                State::Flags => {
                    let long = b & 0x02 != 0;
                    let command = b & 0x04 != 0;
                    if !command {
                        self.more = b & 0x01 != 0;
                    }
                    self.state = State::Length {
                        due: if long { 8 } else { 1 },
                        value: 0,
                        command,
                    };
                }
                State::Length {
                    due,
                    value,
                    command,
                } => {
                    let value = (value << 8) | u64::from(b);
                    self.state = if due > 1 {
                        State::Length {
                            due: due - 1,
                            value,
                            command,
                        }
                    } else {
                        self.frame(value, command)?
                    };
                }
            }
            bytes = &bytes[1..];
        }
        Ok(())
    }

    /// A frame header ended announcing `len` bytes: checked, then its body.
    fn frame(&mut self, len: u64, command: bool) -> Result<State, FrameError> {
        if len > self.max_frame {
            return Err(FrameError::TooLong {
                len,
                max: self.max_frame,
            });
        }
        if !command {
            let max = self.max_frame.saturating_add(MESSAGE_SLACK);
            self.message = self.message.saturating_add(len);
            self.parts += 1;
            if self.message > max {
                return Err(FrameError::MessageTooLong { max });
            }
            if self.parts > MAX_PARTS {
                return Err(FrameError::TooManyParts);
            }
            if !self.more {
                (self.message, self.parts) = (0, 0);
            }
        }
        Ok(match len {
            0 => State::Flags,
            n => State::Skip(n),
        })
    }
}

/// Starts a guard for `target` (`tcp://host:port`) on 127.0.0.1, frames
/// capped at `max_frame` bytes, running until `cancel` fires; returns the
/// endpoint to give `zeromq` instead (`tcp://127.0.0.1:P`). An endpoint that
/// is not `tcp://` is an error (the caller connects directly).
pub async fn start(target: &str, max_frame: u64, cancel: CancellationToken) -> io::Result<String> {
    let Some(addr) = target.strip_prefix("tcp://").map(str::to_owned) else {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "only tcp:// endpoints are guarded",
        ));
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("tcp://{}", listener.local_addr()?);
    // Owned through `cancel`: it ends, with every pump, when that fires.
    tokio::spawn(async move {
        let mut pumps = JoinSet::new();
        loop {
            while pumps.try_join_next().is_some() {}
            let local = tokio::select! {
                () = cancel.cancelled() => break,
                a = listener.accept() => match a {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::debug!(error = %e, "event guard accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            pumps.spawn(pump(local, addr.clone(), max_frame, cancel.clone()));
        }
        pumps.shutdown().await;
    });
    Ok(endpoint)
}

/// Dials `addr`, retrying for [`DIAL_FOR`] as `zeromq` would.
async fn dial(addr: &str, cancel: &CancellationToken) -> Option<TcpStream> {
    let until = tokio::time::Instant::now() + DIAL_FOR;
    let mut wait = Duration::from_millis(50);
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        tokio::select! {
            () = cancel.cancelled() => return None,
            r = tokio::time::timeout(left, TcpStream::connect(addr)) => match r {
                Ok(Ok(s)) => return Some(s),
                Ok(Err(_)) if !left.is_zero() => {}
                _ => return None,
            },
        }
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(Duration::from_secs(1));
    }
}

/// One `zeromq` connection to the engine, through the check.
async fn pump(local: TcpStream, addr: String, max_frame: u64, cancel: CancellationToken) {
    let Some(remote) = dial(&addr, &cancel).await else {
        return;
    };
    // Event batches are small writes: no Nagle delay on the extra hop.
    let _ = local.set_nodelay(true);
    let _ = remote.set_nodelay(true);
    let (mut from_agent, mut to_agent) = local.into_split();
    let (mut from_engine, mut to_engine) = remote.into_split();
    let up = tokio::io::copy(&mut from_agent, &mut to_engine);
    let down = async {
        let mut check = FrameCheck::new(max_frame);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = from_engine.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            if let Err(e) = check.feed(&buf[..n]) {
                metrics::counter!("warmpath_agent_bad_messages_total", "reason" => "frame_too_long")
                    .increment(1);
                tracing::warn!(%addr, error = %e,
                    "engine event stream refused: a frame over the cap; reconnecting");
                return Ok(());
            }
            to_agent.write_all(&buf[..n]).await?;
        }
    };
    // Either side ending ends both: ZMTP has no half-open use.
    let ended: io::Result<()> = tokio::select! {
        () = cancel.cancelled() => Ok(()),
        r = up => r.map(drop),
        r = down => r,
    };
    if let Err(e) = ended {
        tracing::debug!(%addr, error = %e, "event guard connection ended");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
        g.extend_from_slice(b"NULL");
        g.resize(64, 0);
        g
    }

    #[test]
    fn frames_under_the_cap_pass_in_any_split() {
        let mut wire = greeting();
        wire.extend_from_slice(&[0x04, 5, 5, b'R', b'E', b'A', b'D']); // a command
        wire.extend_from_slice(&[0x01, 2, b'k', b'v']); // topic, MORE
        wire.extend_from_slice(&[0x03, 0, 0, 0, 0, 0, 0, 1, 0]); // long, MORE
        wire.extend(std::iter::repeat_n(7u8, 256));
        wire.extend_from_slice(&[0x00, 0]); // empty last part
        for split in [1, 2, 7, 63, 64, 65, 100, wire.len()] {
            let mut c = FrameCheck::new(1000);
            for chunk in wire.chunks(split) {
                c.feed(chunk).unwrap();
            }
            assert!(matches!(c.state, State::Flags), "split {split}");
            assert_eq!((c.message, c.parts), (0, 0));
        }
    }

    #[test]
    fn a_huge_announced_frame_is_refused_at_its_header() {
        let mut wire = greeting();
        wire.push(0x02);
        wire.extend_from_slice(&(1u64 << 62).to_be_bytes());
        let mut c = FrameCheck::new(64 << 20);
        assert_eq!(
            c.feed(&wire),
            Err(FrameError::TooLong {
                len: 1 << 62,
                max: 64 << 20
            })
        );
        let mut c = FrameCheck::new(10);
        assert!(c.feed(&greeting()).is_ok());
        assert!(c.feed(&[0x04, 11]).is_err(), "commands too");
    }

    #[test]
    fn multipart_messages_are_bounded_in_bytes_and_parts() {
        let mut c = FrameCheck::new(1 << 20);
        c.feed(&greeting()).unwrap();
        let part = |c: &mut FrameCheck| {
            let mut f = vec![0x03];
            f.extend_from_slice(&(1u64 << 20).to_be_bytes());
            c.feed(&f)?;
            c.feed(&vec![0u8; 1 << 20])
        };
        part(&mut c).unwrap();
        part(&mut c).unwrap();
        assert_eq!(
            part(&mut c),
            Err(FrameError::MessageTooLong {
                max: (1 << 20) + MESSAGE_SLACK
            })
        );
        let mut c = FrameCheck::new(10);
        c.feed(&greeting()).unwrap();
        for _ in 0..MAX_PARTS {
            c.feed(&[0x01, 0]).unwrap();
        }
        assert_eq!(c.feed(&[0x01, 0]), Err(FrameError::TooManyParts));
    }

    #[tokio::test]
    async fn bytes_pass_both_ways_and_a_huge_frame_ends_both_connections() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let engine = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!("tcp://{}", engine.local_addr().unwrap());
        let cancel = CancellationToken::new();
        let g = start(&target, 1000, cancel.clone()).await.unwrap();
        let mut agent = TcpStream::connect(g.strip_prefix("tcp://").unwrap())
            .await
            .unwrap();
        let (mut e, _) = engine.accept().await.unwrap();
        agent.write_all(b"from the agent").await.unwrap();
        let mut buf = [0u8; 14];
        e.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"from the agent");
        let mut wire = greeting();
        wire.extend_from_slice(&[0x00, 2, b'o', b'k']);
        e.write_all(&wire).await.unwrap();
        let mut got = vec![0u8; wire.len()];
        agent.read_exact(&mut got).await.unwrap();
        assert_eq!(got, wire);
        let mut huge = vec![0x02];
        huge.extend_from_slice(&(1u64 << 62).to_be_bytes());
        e.write_all(&huge).await.unwrap();
        let mut rest = Vec::new();
        agent.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the header never reached the agent");
        assert_eq!(
            e.read(&mut buf).await.unwrap(),
            0,
            "the engine side is closed"
        );
        cancel.cancel();
    }
}
