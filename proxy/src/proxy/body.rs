//! The body of a response to a client, whoever made it: streamed from an HTTP/1.1 or HTTP/2
//! backend (holding the request's in-flight count and its connection until it ends), or made by
//! pinlb itself (`local_reply`, which routes use too); and a backend connection taken out of a
//! `101` response to become a tunnel.

use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};

use crate::http1::client::{BackendStream, Finished, UpstreamBody, UpstreamError};
use crate::http1::common::{ERROR_PAGE_TYPE, Reply, content_length_line, header_lines};
use crate::modules::{Answer, BodyFilter, Filter};
use crate::proxy::spool::SpooledBody;
use crate::upstream::counters::{BackendStats, ListenerStats};
use crate::upstream::in_flight::InFlight;
use crate::upstream::local::WorkerUpstream;

/// A response pinlb makes itself: `status`, a `content-type` line, `lines` more header lines,
/// and `page` as the body (none for HEAD, which still gets the page's length).
pub fn local_reply(
    status: StatusCode,
    content_type: &[u8],
    page: Bytes,
    lines: &[u8],
    method: &Method,
) -> Reply<ProxyBody> {
    let len = page.len();
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        page
    };
    let mut headers = Vec::with_capacity(content_type.len() + lines.len() + 24);
    headers.extend_from_slice(content_type);
    headers.extend_from_slice(lines);
    if method == Method::HEAD {
        // The length of the page a GET would have had; the client side writes the framing of
        // every other response from its body.
        content_length_line(&mut headers, len as u64);
    }
    Reply {
        status,
        headers,
        body: ProxyBody::Local(Some(body)),
    }
}

/// A module's own answer to a request (`access`'s 401 or 403, `rate_limit`'s 429,
/// `redirect_https`'s 301) as pinlb's answers go, text in its body; a refusal is counted on
/// the listener's `stats` by its cause, where it is decided.
#[cold]
pub(crate) fn module_reply(
    answer: Answer,
    method: &Method,
    stats: Option<&ListenerStats>,
) -> Reply<ProxyBody> {
    if let (Some(s), Some(cause)) = (stats, answer.refused) {
        s.refuse(cause);
    }
    local_reply(
        answer.status,
        ERROR_PAGE_TYPE,
        answer.body,
        &answer.lines,
        method,
    )
}

/// An HTTP/2 backend's response as the client side takes it: its fields as header lines
/// without the framing ones pinlb writes itself (Content-Length stays on a HEAD's or a 304's
/// answer, which has no body to count), and its body with its trailers.
pub fn h2_reply(
    response: http::Response<hyper::body::Incoming>,
    method: &Method,
    held: (InFlight, crate::upstream::h2::Stream),
) -> Reply<ProxyBody> {
    let (parts, body) = response.into_parts();
    let keep_length = method == Method::HEAD || parts.status == StatusCode::NOT_MODIFIED;
    let mut headers = Vec::with_capacity(256);
    header_lines(
        &parts.headers,
        |name| name == http::header::CONTENT_LENGTH && !keep_length,
        &mut headers,
    );
    Reply {
        status: parts.status,
        headers,
        body: ProxyBody::Http2(Box::new(Http2Body {
            body,
            has_date: parts.headers.contains_key(http::header::DATE),
            trailers: None,
            held: Some(held),
        })),
    }
}

/// What to do when an upstream response body is over.
pub struct Release {
    _guard: InFlight,
    /// Whether the backend's response allows the connection to carry another exchange.
    keep_alive: bool,
    upstream: Rc<WorkerUpstream>,
    backend: usize,
}

impl Release {
    pub fn new(
        guard: InFlight,
        keep_alive: bool,
        upstream: Rc<WorkerUpstream>,
        backend: usize,
    ) -> Self {
        Release {
            _guard: guard,
            keep_alive,
            upstream,
            backend,
        }
    }
}

/// A backend connection that switched protocols (a `101`), for the client side to relay bytes
/// to and from until the tunnel closes.
pub struct Upgraded {
    pub stream: BackendStream,
    /// What the backend sent after its 101 head: the first bytes of the new protocol.
    pub early: BytesMut,
    pub open: OpenTunnel,
}

/// Held for a tunnel's life: it counts in flight on its backend (for least_conn and
/// `max_conns`) and as an open tunnel in `/metrics` until dropped. The backend connection is
/// never returned to the pool.
pub struct OpenTunnel {
    release: Release,
}

impl OpenTunnel {
    fn new(release: Release) -> OpenTunnel {
        let tunnel = OpenTunnel { release };
        if let Some(s) = tunnel.stats() {
            s.tunnels_open.fetch_add(1, Ordering::Relaxed);
        }
        tunnel
    }

    /// `timeouts.tunnel_idle` of the tunnel's upstream.
    pub fn idle(&self) -> Duration {
        self.release.upstream.shared.config.upgrade.tunnel_idle
    }

    /// `timeouts.tunnel_fin` of the tunnel's upstream.
    pub fn fin(&self) -> Duration {
        self.release.upstream.shared.config.upgrade.tunnel_fin
    }

    /// The backend's counters, while metrics are on.
    pub fn stats(&self) -> Option<&BackendStats> {
        let shared = &self.release.upstream.shared;
        shared
            .counting
            .then(|| &shared.backends[self.release.backend].stats)
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        if let Some(s) = self.stats() {
            s.tunnels_open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A response body from an HTTP/2 backend.
pub struct Http2Body {
    body: hyper::body::Incoming,
    has_date: bool,
    /// The trailers, once the body is over.
    trailers: Option<http::HeaderMap>,
    /// The in-flight count and the stream's place on its connection, until the body ends.
    held: Option<(InFlight, crate::upstream::h2::Stream)>,
}

impl Http2Body {
    /// The next piece of the body, keeping its trailers. Out of line: `ProxyBody::poll_data`
    /// is inlined into every HTTP/1.1 response's write, and this would make it too large to be.
    #[inline(never)]
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        let Http2Body {
            body,
            trailers,
            held,
            ..
        } = self;
        // Bounded by the body: every pass takes a frame of it, or returns.
        loop {
            let frame = match ready!(http_body::Body::poll_frame(Pin::new(&mut *body), cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    *held = None;
                    let e = std::io::Error::other(format!("HTTP/2: {e}"));
                    return Poll::Ready(Some(Err(UpstreamError::Io(e))));
                }
                None => {
                    *held = None;
                    return Poll::Ready(None);
                }
            };
            match frame.into_data() {
                Ok(data) => {
                    // Released with the last piece, as an HTTP/1.1 body is.
                    if http_body::Body::is_end_stream(body) {
                        *held = None;
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        *trailers = Some(t);
                    }
                }
            }
        }
    }
}

/// The body of a response to a client.
pub enum ProxyBody {
    /// Streamed from a backend.
    Upstream {
        body: UpstreamBody,
        release: Option<Release>,
    },
    /// Streamed from an HTTP/2 backend, with the trailers that end it. Boxed: every HTTP/1.1
    /// response moves a `ProxyBody` several times, and a larger one costs each move a copy
    /// (benches/callgrind.sh: about 300 instructions per request unboxed).
    Http2(Box<Http2Body>),
    /// Made by pinlb (an error page).
    Local(Option<Bytes>),
    /// A backend's body buffered for a slow client (`[upstream.NAME.buffering]`), read from
    /// the spool its drain fills. Boxed, as `Http2` is, so that `ProxyBody` stays its size.
    Spooled(Box<SpooledBody>),
    /// Streamed from a FastCGI application's FCGI_STDOUT. Boxed, as `Http2`.
    Fastcgi(Box<crate::proxy::fastcgi_body::FastcgiBody>),
    /// Another body through a feature module's filter (`modules`: `compress`, `limit_rate`'s
    /// pacing). Boxed, as `Http2` is.
    Filtered(Box<Filtered>),
}

impl ProxyBody {
    /// Drops the in-flight count and, after a complete exchange, returns the connection to the
    /// pool; an unfinished one is closed with the body.
    fn release(&mut self) {
        if let ProxyBody::Upstream { body, release } = self {
            if let Some(r) = release.take() {
                if let Finished::Reusable(conn) = body.finish(r.keep_alive) {
                    r.upstream.checkin(r.backend, conn);
                }
            }
        }
    }
}

impl ProxyBody {
    /// The backend connection of a `101` response, taken out to become a tunnel.
    pub fn upgrade(&mut self) -> Option<Upgraded> {
        let ProxyBody::Upstream { body, release } = self else {
            return None;
        };
        let release = release.take()?;
        let (stream, early) = body.take_conn()?.into_parts();
        Some(Upgraded {
            stream,
            early,
            open: OpenTunnel::new(release),
        })
    }

    /// The body's length still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            ProxyBody::Upstream { body, .. } => body.remaining(),
            ProxyBody::Http2(h) => http_body::Body::size_hint(&h.body).exact(),
            ProxyBody::Local(data) => Some(data.as_ref().map_or(0, |d| d.len() as u64)),
            ProxyBody::Spooled(s) => s.remaining(),
            ProxyBody::Fastcgi(f) => f.remaining(),
            ProxyBody::Filtered(f) => f.filter.keeps_length().then(|| f.inner.remaining())?,
        }
    }

    /// Whether the response carries a Date header of its own: a backend's may.
    pub fn has_date(&self) -> bool {
        match self {
            ProxyBody::Upstream { body, .. } => body.has_date(),
            ProxyBody::Http2(h) => h.has_date,
            ProxyBody::Local(_) => false,
            ProxyBody::Spooled(s) => s.has_date(),
            ProxyBody::Fastcgi(f) => f.has_date(),
            ProxyBody::Filtered(f) => f.inner.has_date(),
        }
    }

    /// Whether the body is known to be over without being polled again: its last piece is
    /// taken and what ends it already read (a FastCGI body whose FCGI_END_REQUEST came with its
    /// last FCGI_STDOUT, a local one, a length-framed one with nothing left). A chunked
    /// response then sends its last chunk with that piece, in one write (nginx's does).
    pub fn is_end(&self) -> bool {
        match self {
            ProxyBody::Upstream { body, .. } => body.is_done(),
            ProxyBody::Local(data) => data.is_none(),
            ProxyBody::Fastcgi(f) => f.is_end(),
            // The filter's end went out with the piece just read (a compressor's trailer): the
            // response is written with its last chunk in one write.
            ProxyBody::Filtered(f) => f.ended && f.filter.is_empty(),
            ProxyBody::Http2(_) | ProxyBody::Spooled(_) => false,
        }
    }

    /// The next piece of the body; `None` once it is complete. An error means it broke off.
    pub fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        match self {
            ProxyBody::Upstream { body, .. } => {
                let polled = body.poll_data(cx);
                // Released with the body's last piece, before it is written to the client: a
                // client that has its whole response may send its next request at once, and it
                // must find the backend's in-flight count and pooled connection back.
                let ended = match &polled {
                    Poll::Ready(Some(Ok(_))) => body.is_done(),
                    Poll::Ready(_) => true,
                    Poll::Pending => false,
                };
                if ended {
                    self.release();
                }
                polled
            }
            ProxyBody::Http2(h) => h.poll_data(cx),
            ProxyBody::Local(data) => Poll::Ready(data.take().map(Ok)),
            ProxyBody::Spooled(s) => s.poll_data(cx),
            ProxyBody::Fastcgi(f) => f.poll_data(cx),
            ProxyBody::Filtered(f) => f.poll_data(cx),
        }
    }

    /// The trailers an HTTP/2 backend sent after the body, once it is over. An HTTP/1.1 client
    /// does not get them (as nginx's `grpc_pass` to an HTTP/1.1 client): its response is not
    /// framed for trailers.
    pub fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        match self {
            ProxyBody::Http2(h) => h.trailers.take(),
            ProxyBody::Filtered(f) => f.inner.take_trailers(),
            _ => None,
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // A body that is empty (HEAD, 204, 304, Content-Length: 0) is dropped without being
        // polled; that exchange is complete, and `finish` sees that.
        self.release();
    }
}

/// A body through a module's filter: the inner body's pieces go in as they come, and out
/// when the filter lets them. The inner body keeps its own release, done when its last piece
/// is read.
pub struct Filtered {
    inner: ProxyBody,
    filter: Filter,
    /// The inner body ended (its end was pushed into the filter).
    ended: bool,
}

impl ProxyBody {
    /// This body, through `filter`.
    pub(crate) fn filtered(self, filter: Filter) -> ProxyBody {
        ProxyBody::Filtered(Box::new(Filtered {
            inner: self,
            filter,
            ended: false,
        }))
    }
}

impl Filtered {
    /// The filter's next piece, reading the inner body when the filter holds nothing for now.
    /// Out of line: only filtered responses come here.
    #[inline(never)]
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        // At most 64 pieces of the inner body a call, then the task yields.
        for _ in 0..64 {
            if self.ended || !self.filter.is_empty() {
                match self.filter.poll_out(cx) {
                    Poll::Ready(Some(piece)) => return Poll::Ready(Some(Ok(piece))),
                    Poll::Ready(None) if self.ended => return Poll::Ready(None),
                    // All that came out; the inner body is read on below.
                    Poll::Ready(None) => {}
                    Poll::Pending => return Poll::Pending,
                }
            }
            let taken = match self.inner.poll_data(cx) {
                Poll::Ready(Some(Ok(piece))) => self.filter.push(Some(piece)),
                Poll::Ready(Some(Err(e))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    self.ended = true;
                    self.filter.push(None)
                }
                Poll::Pending => match self.filter.idle() {
                    // Nothing held back: the task waits for the inner body.
                    Ok(()) if self.filter.is_empty() => return Poll::Pending,
                    taken => taken,
                },
            };
            if let Err(e) = taken {
                self.ended = true;
                return Poll::Ready(Some(Err(UpstreamError::Io(e))));
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl ProxyBody {
    /// The address of the backend whose response this is; `None` for pinlb's own. Read once
    /// per response, and only for a sticky upstream (`forward::sticky_forward`).
    #[cold]
    pub fn answered_by(&self) -> Option<crate::backend_address::BackendAddress> {
        match self {
            ProxyBody::Upstream {
                release: Some(r), ..
            } => r.upstream.shared.backends.get(r.backend).map(|b| b.address),
            ProxyBody::Http2(b) => b.held.as_ref().map(|(guard, _)| guard.address()),
            ProxyBody::Spooled(s) => s.answered_by(),
            ProxyBody::Fastcgi(f) => f.held.as_ref().map(|_| f.addr),
            ProxyBody::Filtered(f) => f.inner.answered_by(),
            ProxyBody::Upstream { release: None, .. } | ProxyBody::Local(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain path moves `ProxyBody`s: the boxed variants (a filtered body, an HTTP/2
    /// backend's) must leave it the size of its backend variant, the tag in that variant's
    /// niche.
    #[test]
    fn the_boxed_bodies_leave_proxy_body_the_size_of_its_upstream_variant() {
        use std::mem::size_of;
        let upstream = size_of::<UpstreamBody>() + size_of::<Option<Release>>();
        assert_eq!(size_of::<ProxyBody>(), upstream);
    }
}
