//! Response buffering (nginx's `proxy_buffering on`, `fastcgi_buffering on`): an HTTP/1.1 or
//! FastCGI backend's response body is
//! read as fast as the backend sends it, by a task of its own on the worker (a drain), into a
//! [`Channel`] that the client's [`SpooledBody`] reads from. The backend connection goes back
//! to the pool, and the request's in-flight count (its `max_conns` slot, and so the queue's
//! next request) is released, at the backend's last byte, while a slow client is still
//! reading.
//!
//! What stays streamed, and why:
//! - a `101` (WebSocket and other upgrades): a tunnel, not a body;
//! - `Content-Type: text/event-stream` (server-sent events): each event must reach the client
//!   when it is sent, and the stream may never end;
//! - a backend's `X-Accel-Buffering: no` (nginx's switch for one response); `yes` buffers a
//!   response of an upstream whose table has `response = false`. The header is removed either
//!   way, as nginx removes it;
//! - bodiless answers (HEAD, 204, 304, a zero length): nothing to hold;
//! - HTTP/2 upstreams (gRPC among them): `check` refuses `response = true` there, as nginx's
//!   `grpc_pass` has no buffering.
//!
//! What one response holds: at most `buffering.memory` bytes in memory (one piece more when a
//! single piece is larger) and `max_temp` in its temporary file. Past both, the drain waits for
//! the client to read, and the backend is held as without buffering (nginx's behaviour past
//! `proxy_max_temp_file_size`). When the client goes away the drain stops, the backend
//! connection is closed as an unfinished exchange is, and the file vanishes with the channel.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::config::Buffering;
use crate::http1::client;
use crate::http1::common::Reply;
use crate::proxy::body::ProxyBody;
use crate::proxy::spool::{Channel, SpooledBody};

/// The reply to the client for a backend's HTTP/1.1 answer at an upstream with a `[buffering]`
/// table: its body drained into a spool when this response is buffered (see the module's
/// list), streamed otherwise. `body` is the backend's (`ProxyBody::Upstream`).
#[inline(never)]
pub(crate) fn reply(
    buffering: &Arc<Buffering>,
    mut reply: Reply<ProxyBody>,
    method: &Method,
) -> Reply<ProxyBody> {
    let buffered = reply.status != StatusCode::SWITCHING_PROTOCOLS && {
        let seen = strip_accel(&mut reply.headers);
        let wanted = match seen.accel {
            Some(on) => on,
            None => buffering.response,
        };
        let bodiless = method == Method::HEAD
            || reply.status == StatusCode::NO_CONTENT
            || reply.status == StatusCode::NOT_MODIFIED
            || reply.body.remaining() == Some(0);
        wanted && !seen.event_stream && !bodiless
    };
    if buffered {
        let body = std::mem::replace(&mut reply.body, ProxyBody::Local(None));
        let channel = Channel::new(buffering);
        let spooled = SpooledBody::new(
            channel.clone(),
            body.remaining(),
            body.has_date(),
            body.answered_by(),
        );
        tokio::task::spawn_local(drain(body, channel, buffering.clone()));
        reply.body = ProxyBody::Spooled(Box::new(spooled));
    }
    reply
}

/// Reads the backend's body into the channel until it ends, breaks, or the client goes away;
/// past the spool's bounds it waits for the client to make room.
async fn drain(mut body: ProxyBody, channel: Rc<RefCell<Channel>>, buffering: Arc<Buffering>) {
    let mut pending: Option<Bytes> = None;
    std::future::poll_fn(|cx| poll_drain(&mut body, &channel, &buffering, &mut pending, cx)).await;
}

fn poll_drain(
    body: &mut ProxyBody,
    channel: &RefCell<Channel>,
    buffering: &Buffering,
    pending: &mut Option<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    // Bounded: every pass keeps a piece, waits, or ends.
    loop {
        {
            let mut ch = channel.borrow_mut();
            if ch.gone {
                return Poll::Ready(());
            }
            if let Some(data) = pending.take() {
                if !ch.spool.has_room(data.len()) {
                    *pending = Some(data);
                    ch.drain = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                let kept = ch.spool.push(data, &buffering.temp_dir);
                ch.wake_reader();
                if let Err(e) = kept {
                    let e = std::io::Error::new(
                        e.kind(),
                        format!(
                            "buffering the response in {}: {e}",
                            buffering.temp_dir.display()
                        ),
                    );
                    ch.error = Some(client::UpstreamError::Io(e));
                    ch.done = true;
                    return Poll::Ready(());
                }
            }
        }
        // `ProxyBody::poll_data` returns the connection to the pool and drops the in-flight
        // count with the body's last piece, before that piece is kept.
        match body.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => *pending = Some(data),
            Poll::Ready(end) => {
                let mut ch = channel.borrow_mut();
                ch.error = end.and_then(Result::err);
                ch.done = true;
                ch.wake_reader();
                return Poll::Ready(());
            }
            Poll::Pending => {
                // The client going away wakes the drain too, while it waits on the backend.
                channel.borrow_mut().drain = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
    }
}

/// What a response's header lines say about buffering it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    /// `X-Accel-Buffering`: `yes` or `no`; any other value is ignored, as nginx ignores it.
    accel: Option<bool>,
    /// `Content-Type: text/event-stream`.
    event_stream: bool,
}

/// Reads `X-Accel-Buffering` and the content type from `name: value\r\n` lines, and removes
/// the `X-Accel-Buffering` lines: the header is for pinlb, not for the client.
fn strip_accel(headers: &mut Vec<u8>) -> Seen {
    let mut seen = Seen::default();
    let mut kept = Vec::with_capacity(headers.len());
    for line in headers.split_inclusive(|&b| b == b'\n') {
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => (&line[..i], line[i + 1..].trim_ascii()),
            None => (line, &b""[..]),
        };
        if name.eq_ignore_ascii_case(b"x-accel-buffering") {
            if value.eq_ignore_ascii_case(b"yes") {
                seen.accel = Some(true);
            } else if value.eq_ignore_ascii_case(b"no") {
                seen.accel = Some(false);
            }
            continue;
        }
        if name.eq_ignore_ascii_case(b"content-type") {
            let media = value.split(|&b| b == b';').next().unwrap_or_default();
            seen.event_stream = media
                .trim_ascii()
                .eq_ignore_ascii_case(b"text/event-stream");
        }
        kept.extend_from_slice(line);
    }
    *headers = kept;
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_accel_buffering_is_read_and_removed() {
        let mut h = b"content-type: text/html\r\nX-Accel-Buffering: no\r\nx-a: 1\r\n".to_vec();
        let seen = strip_accel(&mut h);
        assert_eq!(
            seen,
            Seen {
                accel: Some(false),
                event_stream: false
            }
        );
        assert_eq!(h, b"content-type: text/html\r\nx-a: 1\r\n");
        let mut h = b"x-accel-buffering:  YES \r\n".to_vec();
        assert_eq!(strip_accel(&mut h).accel, Some(true));
        assert!(h.is_empty());
        let mut h = b"x-accel-buffering: maybe\r\n".to_vec();
        assert_eq!(strip_accel(&mut h).accel, None, "only yes and no count");
        assert!(h.is_empty(), "removed whatever it says");
    }

    #[test]
    fn an_event_stream_is_seen_with_or_without_parameters() {
        for ct in [
            &b"Content-Type: text/event-stream\r\n"[..],
            b"content-type: Text/Event-Stream; charset=utf-8\r\n",
        ] {
            let mut h = ct.to_vec();
            assert!(strip_accel(&mut h).event_stream);
            assert_eq!(h, ct, "the content type stays");
        }
        let mut h = b"content-type: text/plain\r\nx-note: text/event-stream\r\n".to_vec();
        assert!(!strip_accel(&mut h).event_stream);
    }
}
