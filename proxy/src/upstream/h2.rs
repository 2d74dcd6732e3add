//! The backend side of HTTP/2 (`protocol = "h2c"`, or `"h2"` over TLS): hyper's HTTP/2 client
//! on connections that each worker multiplexes, and the request and response as they cross it.
//!
//! Each worker keeps, per backend, the connections it opened: a stream goes on the least busy
//! one that carries fewer than `max_streams`, and a new connection opens only when all are that
//! busy, so a worker holds one connection per backend until its load needs more. A connection
//! the backend closed (or sent GOAWAY on) leaves the pool when next looked at.
//!
//! The request body reaches hyper through a slot of one piece: the proxy sends a piece when
//! hyper has taken the last, which is when HTTP/2 flow control lets it go, so a backend that
//! stops reading stalls the proxy's send (bounded by `timeouts.send`) rather than filling memory.
//! A body the proxy abandons (the backend answered early, the client broke off) resets the
//! stream instead of ending it, so the backend never takes a part for the whole.

use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, TE};
use http::{HeaderMap, HeaderValue, Request};
use http_body::{Body, Frame};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpStream, UnixStream};
use tracing::debug;

use crate::backend_address::BackendAddress;
use crate::http1::client::{ConnectError, Outgoing, describe_io};
use crate::http1::common::header_map;
use crate::sys::exec::LocalExec;
use crate::tls::client::Connector;

/// A worker's HTTP/2 connections to one backend.
#[derive(Default)]
pub struct Pool {
    conns: RefCell<Vec<Multiplexed>>,
}

/// One connection and the streams open on it.
struct Multiplexed {
    send: SendRequest<Outbound>,
    streams: Rc<Cell<usize>>,
}

/// Counts one stream on its connection until dropped (its response is over, or abandoned),
/// and holds its request body's feed: a body the backend answered before it had whole stays
/// open (neither ended nor reset) until then.
pub struct Stream {
    streams: Rc<Cell<usize>>,
    feed: Option<Feed>,
}

impl Stream {
    /// The stream, holding `feed` for as long as it lives.
    pub fn with_feed(mut self, feed: Feed) -> Stream {
        self.feed = Some(feed);
        self
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.streams.set(self.streams.get().saturating_sub(1));
    }
}

/// A place for one more stream to a backend.
pub struct Opened {
    pub send: SendRequest<Outbound>,
    pub stream: Stream,
    /// The connection is new (for the connection counters).
    pub new: bool,
}

impl Pool {
    /// A connection to `addr` with room for one more stream: the least busy open one below
    /// `max_streams`, or a new one, its handshake bounded by `connect`.
    pub async fn open(
        &self,
        addr: BackendAddress,
        connect: Duration,
        max_streams: usize,
        tls: Option<&Connector>,
    ) -> Result<Opened, String> {
        {
            let mut conns = self.conns.borrow_mut();
            conns.retain(|m| !m.send.is_closed());
            if let Some(m) = conns
                .iter()
                .filter(|m| m.streams.get() < max_streams)
                .min_by_key(|m| m.streams.get())
            {
                m.streams.set(m.streams.get() + 1);
                return Ok(Opened {
                    send: m.send.clone(),
                    stream: Stream {
                        streams: m.streams.clone(),
                        feed: None,
                    },
                    new: false,
                });
            }
        }
        let send = handshake(addr, connect, tls).await?;
        let streams = Rc::new(Cell::new(1));
        self.conns.borrow_mut().push(Multiplexed {
            send: send.clone(),
            streams: streams.clone(),
        });
        Ok(Opened {
            send,
            stream: Stream {
                streams,
                feed: None,
            },
            new: true,
        })
    }
}

/// Opens an HTTP/2 connection: over TLS with `tls` (the backend must choose `h2` by ALPN),
/// else cleartext with prior knowledge; and starts its driver on the worker. The TCP connect and
/// the TLS handshake are each bounded by `timeout`, as for HTTP/1.1 backends.
async fn handshake(
    addr: BackendAddress,
    timeout: Duration,
    tls: Option<&Connector>,
) -> Result<SendRequest<Outbound>, String> {
    let timed_out = || format!("connect timed out after {timeout:?}");
    let addr = match addr {
        BackendAddress::Tcp(a) => a,
        // h2c on a socket; TLS on one is refused when the config is read.
        BackendAddress::Unix(path) => {
            let unix = tokio::time::timeout(timeout, UnixStream::connect(path))
                .await
                .map_err(|_| timed_out())?
                .map_err(|e| ConnectError::unix(path, &e).cause)?;
            return tokio::time::timeout(timeout, start(addr, TokioIo::new(unix)))
                .await
                .map_err(|_| timed_out())?;
        }
    };
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out())?
        .map_err(|e| describe_io(&e))?;
    // Small frames (HEADERS, WINDOW_UPDATE) must not wait for Nagle.
    let _ = tcp.set_nodelay(true);
    match tls {
        None => tokio::time::timeout(timeout, start(addr.into(), TokioIo::new(tcp)))
            .await
            .map_err(|_| timed_out())?,
        Some(connector) => {
            let opened = async {
                let stream = connector.handshake(tcp).await?;
                if stream.get_ref().1.alpn_protocol() != Some(crate::tls::server::H2) {
                    return Err("the backend did not choose h2 by ALPN (protocol = \"h2\")".into());
                }
                start(addr.into(), TokioIo::new(stream)).await
            };
            tokio::time::timeout(timeout, opened)
                .await
                .map_err(|_| format!("TLS handshake not done within {timeout:?}"))?
        }
    }
}

/// HTTP/2's own handshake on `io`, and its driver spawned on the worker.
async fn start<T>(addr: BackendAddress, io: T) -> Result<SendRequest<Outbound>, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let (send, conn) = hyper::client::conn::http2::Builder::new(LocalExec)
        .timer(TokioTimer::new())
        .handshake(io)
        .await
        .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    tokio::task::spawn_local(async move {
        if let Err(e) = conn.await {
            debug!(backend = %addr, "HTTP/2 backend connection ended: {e}");
        }
    });
    Ok(send)
}

/// The request as it goes to an HTTP/2 backend: `:authority` from Host, the end-to-end lines as
/// fields, X-Forwarded-For and -Proto, Content-Length when the client gave one, and
/// `te: trailers`, which gRPC servers look for (pinlb passes trailers through).
pub fn request(
    req: &Outgoing<'_>,
    length: Option<u64>,
    tls: bool,
    body: Outbound,
) -> Result<Request<Outbound>, String> {
    let authority = std::str::from_utf8(req.host).unwrap_or_default();
    let path = std::str::from_utf8(req.path).unwrap_or("/");
    let uri = http::Uri::builder()
        .scheme(if tls { "https" } else { "http" })
        .authority(authority)
        .path_and_query(path)
        .build()
        .map_err(|e| format!("cannot send {authority:?}{path:?} over HTTP/2: {e}"))?;
    let mut headers: HeaderMap = header_map(req.lines);
    headers.remove(HOST);
    for lines in [req.trusted_lines, req.added] {
        for (name, value) in &header_map(lines) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_bytes(req.forwarded_for) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert(
        "x-forwarded-proto",
        HeaderValue::from_static(if req.https { "https" } else { "http" }),
    );
    headers.insert(TE, HeaderValue::from_static("trailers"));
    if let Some(n) = length {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
    }
    let mut request = Request::new(body);
    *request.method_mut() = req.method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// The request body as hyper reads it: pieces the proxy sends through [`Feed`]. `None` for a
/// request without a body.
pub struct Outbound(Option<Rc<RefCell<Slot>>>);

/// Where the proxy sends the request body: a piece at a time, then the end (with the client's
/// trailers, if any). Dropped without [`Feed::end`], the body is abandoned and the stream reset.
pub struct Feed(Rc<RefCell<Slot>>);

/// The one piece between the proxy and hyper. Both ends are on the worker's thread.
#[derive(Default)]
struct Slot {
    piece: Option<Bytes>,
    trailers: Option<HeaderMap>,
    ended: bool,
    /// The feed was dropped before the end.
    abandoned: bool,
    /// hyper no longer reads (the stream is over).
    closed: bool,
    /// Waiting for a piece: hyper's task.
    reader: Option<Waker>,
    /// Waiting for room: the proxy's task.
    writer: Option<Waker>,
}

/// The request body was abandoned before its end, or hyper stopped reading it.
#[derive(Debug, thiserror::Error)]
#[error("the request body was abandoned before its end")]
pub struct Abandoned;

/// A body channel; `empty` for a request without a body (END_STREAM on its HEADERS).
pub fn channel(empty: bool) -> (Feed, Outbound) {
    let slot = Rc::new(RefCell::new(Slot::default()));
    let outbound = Outbound((!empty).then(|| slot.clone()));
    (Feed(slot), outbound)
}

impl Feed {
    /// Room for the next piece: hyper has taken the last one.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<Result<(), Abandoned>> {
        let mut s = self.0.borrow_mut();
        if s.closed {
            return Poll::Ready(Err(Abandoned));
        }
        if s.piece.is_none() {
            return Poll::Ready(Ok(()));
        }
        s.writer = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Sends a piece; call when [`Feed::poll_room`] said there is room.
    pub fn send(&self, data: Bytes) {
        let mut s = self.0.borrow_mut();
        s.piece = Some(data);
        if let Some(w) = s.reader.take() {
            w.wake();
        }
    }

    /// Ends the body, with the client's trailers when it sent some.
    pub fn end(&self, trailers: Option<HeaderMap>) {
        let mut s = self.0.borrow_mut();
        s.trailers = trailers;
        s.ended = true;
        if let Some(w) = s.reader.take() {
            w.wake();
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut s = self.0.borrow_mut();
        if !s.ended {
            s.abandoned = true;
            if let Some(w) = s.reader.take() {
                w.wake();
            }
        }
    }
}

impl Body for Outbound {
    type Data = Bytes;
    type Error = Abandoned;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Abandoned>>> {
        let Some(slot) = self.0.as_ref() else {
            return Poll::Ready(None);
        };
        let mut s = slot.borrow_mut();
        if let Some(data) = s.piece.take() {
            if let Some(w) = s.writer.take() {
                w.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(t) = s.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if s.ended {
            return Poll::Ready(None);
        }
        if s.abandoned {
            return Poll::Ready(Some(Err(Abandoned)));
        }
        s.reader = Some(cx.waker().clone());
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(|s| {
            let s = s.borrow();
            s.ended && s.piece.is_none() && s.trailers.is_none()
        })
    }
}

impl Drop for Outbound {
    fn drop(&mut self) {
        if let Some(slot) = &self.0 {
            let mut s = slot.borrow_mut();
            s.closed = true;
            if let Some(w) = s.writer.take() {
                w.wake();
            }
        }
    }
}
