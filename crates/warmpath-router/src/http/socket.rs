//! The client socket: tells the connection's [`Activity`] when bytes move, and
//! gives hyper's bare answer to an unparsable head the OpenAI error shape.

use crate::http::conn::Activity;
use crate::http::error::ApiError;
use axum::http::StatusCode;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A client socket that reports to its connection's [`Activity`].
#[derive(Debug)]
pub(crate) struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
    rewrite: Option<Rewrite>,
}

/// An answer written in place of hyper's.
#[derive(Debug)]
struct Rewrite {
    bytes: Vec<u8>,
    at: usize,
    /// The length of hyper's bytes it replaces.
    replaces: usize,
}

/// The status of `out` when it is hyper's automatic answer to a head it could
/// not parse: a lone 4xx head without content type (the router's all have one).
fn hyper_parse_error(activity: &Activity, out: &[u8]) -> Option<StatusCode> {
    if !activity.head_pending() {
        return None;
    }
    let status = out.strip_prefix(b"HTTP/1.1 4")?;
    let end = memchr::memmem::find(out, b"\r\n\r\n")?;
    let head = out.to_ascii_lowercase();
    if end + 4 != out.len()
        || memchr::memmem::find(&head, b"content-type").is_some()
        || memchr::memmem::find(&head, b"content-length: 0\r\n").is_none()
    {
        return None;
    }
    let code = std::str::from_utf8(status.get(..2)?).ok()?;
    StatusCode::from_u16(400 + code.parse::<u16>().ok()?).ok()
}

/// The JSON answer given in place of hyper's bare `status`.
fn parse_error_answer(status: StatusCode) -> Vec<u8> {
    let message = match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "the request head is too large",
        StatusCode::URI_TOO_LONG => "the request URI is too long",
        _ => "the request head could not be parsed (a malformed line, or a control character in a header)",
    };
    ApiError::new(status, "invalid_request_head", message).raw_http1()
}

impl Watched {
    pub(crate) fn new(io: TcpStream, activity: Arc<Activity>) -> Self {
        Watched {
            io,
            activity,
            rewrite: None,
        }
    }

    /// Writes the rewrite under way, if any; `Some` when it has settled.
    fn poll_rewrite(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<usize>>> {
        let r = self.rewrite.as_mut()?;
        while r.at < r.bytes.len() {
            match Pin::new(&mut self.io).poll_write(cx, &r.bytes[r.at..]) {
                Poll::Ready(Ok(0)) => {
                    return Some(Poll::Ready(Err(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(n)) => r.at += n,
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        let replaced = r.replaces;
        self.rewrite = None;
        Some(Poll::Ready(Ok(replaced)))
    }

    /// Tells the activity whether the client takes what is written.
    fn report(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.activity.write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.activity.wrote(),
            Poll::Ready(_) => {}
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read_some();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.rewrite.is_none() {
            if let Some(status) = hyper_parse_error(&this.activity, buf) {
                this.rewrite = Some(Rewrite {
                    bytes: parse_error_answer(status),
                    at: 0,
                    replaces: buf.len(),
                });
            }
        }
        if let Some(done) = this.poll_rewrite(cx) {
            return done;
        }
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.report(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs.iter().find(|b| !b.is_empty());
        if let Some(first) = first {
            if self.rewrite.is_some() || hyper_parse_error(&self.activity, first).is_some() {
                return self.poll_write(cx, first);
            }
        }
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.report(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::http::conn::{ConnLimits, Conns};
    use std::time::Duration;

    #[test]
    fn only_hypers_bare_parse_error_answer_is_rewritten() {
        let slot = Conns::new(ConnLimits {
            header_timeout: Duration::from_millis(100),
            keepalive_idle: Duration::from_millis(100),
            max_connections: 10,
            send_timeout: Duration::from_millis(100),
        })
        .admit()
        .unwrap();
        let a = &slot.activity;
        let bare = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(hyper_parse_error(a, bare), None, "no head under way");
        a.read_some();
        assert_eq!(hyper_parse_error(a, bare), Some(StatusCode::BAD_REQUEST));
        let big = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            hyper_parse_error(a, big),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(hyper_parse_error(a, ours), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx";
        assert_eq!(hyper_parse_error(a, with_body), None);
        let busy = a.begin();
        a.read_some();
        assert_eq!(
            hyper_parse_error(a, bare),
            None,
            "a request is being answered"
        );
        drop(busy);
        let answer = String::from_utf8(parse_error_answer(StatusCode::BAD_REQUEST)).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{answer}"
        );
        assert!(
            answer.contains(r#""code":"invalid_request_head""#),
            "{answer}"
        );
    }
}
