//! The backend side of HTTP/1.1: writing a request on a pooled connection and reading the
//! response head and body back, on the worker's own task.
//!
//! The client side is `downstream::h1`. For the backend side pinlb uses this small codec instead of
//! hyper's client because a proxy needs far less than a general client: the request is already
//! parsed and validated, and the response body goes straight to the client side. Doing
//! it here removes a spawned connection task, two channels and a oneshot per request (29% of
//! pinlb's user-space instructions per request, by benches/callgrind.sh), and lets the proxy see
//! exactly how the backend framed its response (RFC 9112 §6.3).
//!
//! A connection is plain TCP or TLS ([`BackendStream`]). The plain path keeps its own calls
//! (`try_write` first, readiness without a read for the idle check); TLS goes through
//! tokio-rustls's stream, which holds what it encrypted until the socket takes it, so every
//! write to it ends with a flush.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

use super::body::{BodyError, Decoder, Framing};
use super::common::{
    ConnectionTokens, ContentLength, Hop, Reply, RequestFraming, chunk_size_line,
    content_length_line, final_coding_chunked,
};
use super::request::ClientError;
use super::timer::Timer;
use crate::backend_address::BackendAddress;
use crate::sys::socket::{poll_read_tcp, try_send};
use crate::tls::client::{Connector, Stream, poll_flush_tls};

/// Largest response head accepted from a backend.
const MAX_HEAD: usize = 64 * 1024;
/// Most header lines accepted in a response head.
const MAX_HEADERS: usize = 128;
/// Read buffer size; most responses a backend sends fit in one read.
const READ_CHUNK: usize = 16 * 1024;

/// A backend connection's socket: plain TCP, or TLS on it. A TLS backend that closes without a
/// close_notify alert ends the stream as a TCP close would, as nginx takes it.
pub type BackendStream = Stream<true>;

/// Whether an idle TLS connection can take a request. Records that arrived while idle (a
/// session ticket, a key update) are taken in here; data or a close means the connection is
/// done. No read of the socket while it has no pending event.
#[inline(never)]
fn is_usable_idle_tls(t: &mut TlsStream<TcpStream>, cx: &mut Context<'_>) -> bool {
    let mut probe = [0u8; 1];
    let mut rb = ReadBuf::new(&mut probe);
    Pin::new(t).poll_read(cx, &mut rb).is_pending()
}

/// Whether an idle plain connection (TCP or Unix socket) can take a request: nothing arrived
/// and the peer has not closed. `try_read` reads only when tokio holds a pending read event for
/// the socket, so a quiet connection costs no system call; an event that left nothing to read
/// (`WouldBlock`, the readiness then cleared) is no reason to drop it. Unlike
/// `poll_read_ready`, it registers no waker and takes none of the task's budget: nothing waits
/// on the answer.
#[inline(always)]
fn is_quiet(try_read: impl FnOnce(&mut [u8]) -> io::Result<usize>) -> bool {
    let mut probe = [0u8; 1];
    matches!(try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// An open connection to a backend, with whatever it has sent that hasn't been consumed.
///
/// Boxed once, when it is opened, and kept boxed in the pool: a response carries its
/// connection (in the body that streams from it) through several moves between the attempt
/// and the client's write, and each move copies a pointer instead of the connection's fields
/// (memcpy about 530 instructions per request fewer, benches/callgrind.sh).
#[derive(Debug)]
pub struct Conn(Box<ConnState>);

impl std::ops::Deref for Conn {
    type Target = ConnState;

    fn deref(&self) -> &ConnState {
        &self.0
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut ConnState {
        &mut self.0
    }
}

/// What a [`Conn`] holds, and its codec.
#[derive(Debug)]
pub struct ConnState {
    pub stream: BackendStream,
    buf: BytesMut,
    /// Request heads are built here; kept to reuse its allocation for every request.
    out: Vec<u8>,
    /// Whether this connection already carried an exchange (taken from the pool).
    pub reused: bool,
    /// The request on it asked to upgrade: a `101 Switching Protocols` is its answer, not an
    /// error.
    upgrading: bool,
    /// The timer of the response timeout and of the send timeout, one for every wait on this
    /// connection (see `http1::timer`).
    timer: Timer,
    /// The client and listener addresses its PROXY protocol header named, on a connection
    /// that began with one: it may carry only that client's requests. `None` (a null pointer)
    /// on every other.
    pub origin: Option<Box<(SocketAddr, SocketAddr)>>,
}

/// A request as it goes to a backend.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub method: &'a Method,
    /// Origin-form.
    pub path: &'a [u8],
    pub host: &'a [u8],
    /// The end-to-end header lines, `name: value\r\n` each, without Host, the framing headers
    /// and the X-Forwarded ones.
    pub lines: &'a [u8],
    /// More lines: Forwarded and X-Real-IP, from a trusted client only.
    pub trusted_lines: &'a [u8],
    /// The X-Forwarded-For value to send.
    pub forwarded_for: &'a [u8],
    /// pinlb's own lines (a request ID, a traceparent it started); usually empty.
    pub added: &'a [u8],
    /// The client came over TLS: `X-Forwarded-Proto: https`.
    pub https: bool,
}

/// Why an exchange with a backend failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("backend closed the connection before responding")]
    ClosedBeforeResponse,
    #[error("invalid response from backend: {0}")]
    Invalid(&'static str),
    #[error("response head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("no response headers in time")]
    Timeout,
    /// The backend took no more of the request for the send timeout.
    #[error("the backend took no request data in time")]
    SendTimeout,
    /// The backend framed its response body wrongly.
    #[error("invalid response from backend: {0}")]
    Body(#[from] BodyError),
    /// The client's request body failed while it was being sent: not the backend's fault.
    #[error("{0}")]
    Client(ClientError),
}

impl UpstreamError {
    /// True when nothing of a response arrived: on a reused connection this is the race with
    /// the backend closing an idle keep-alive connection.
    pub fn is_stale(&self) -> bool {
        match self {
            UpstreamError::ClosedBeforeResponse => true,
            UpstreamError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

impl Conn {
    pub fn new(stream: BackendStream) -> Self {
        Conn(Box::new(ConnState {
            stream,
            buf: BytesMut::new(),
            out: Vec::new(),
            reused: false,
            upgrading: false,
            timer: Timer::default(),
            origin: None,
        }))
    }

    /// The socket and what the backend sent after the head just read: a connection that
    /// switched protocols leaves HTTP, and its bytes are relayed as they are.
    pub fn into_parts(self) -> (BackendStream, BytesMut) {
        let ConnState { stream, buf, .. } = *self.0;
        (stream, buf)
    }
}

impl ConnState {
    /// Says whether the request about to be written asks to upgrade (its lines carry
    /// `Connection: upgrade` and Upgrade): only then is a `101` its answer.
    pub fn expect_upgrade(&mut self, upgrade: bool) {
        self.upgrading = upgrade;
    }

    /// Whether an idle pooled connection can take a request: the backend has not closed it or
    /// sent anything unasked. Costs no system call while the socket has no pending event.
    /// Inlined into the pool's checkout, as when it had that one caller: the PROXY protocol's
    /// private checkout (out of line) calls it too.
    #[inline(always)]
    pub fn is_usable_idle(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        match &mut self.stream {
            BackendStream::Plain(s) => is_quiet(|b| s.try_read(b)),
            BackendStream::Tls(t) => is_usable_idle_tls(t, cx),
            BackendStream::Unix(u) => is_quiet(|b| u.try_read(b)),
        }
    }

    /// Writes a request head, framed as `body` says: `Content-Length` for a body of known length
    /// (`req.lines` carry no framing header of their own), `Transfer-Encoding: chunked` for one
    /// that streams without. A wait for room in the socket is bounded by `timeout`.
    #[inline(always)]
    pub async fn write_head(
        &mut self,
        req: &Outgoing<'_>,
        body: RequestFraming,
        timeout: Duration,
    ) -> Result<(), UpstreamError> {
        // Taken out while it is written, so the write can borrow the connection; put back after,
        // to keep its allocation.
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.extend_from_slice(req.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(req.path);
        out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        out.extend_from_slice(req.host);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(req.lines);
        out.extend_from_slice(req.trusted_lines);
        out.extend_from_slice(req.added);
        out.extend_from_slice(b"x-forwarded-for: ");
        out.extend_from_slice(req.forwarded_for);
        out.extend_from_slice(if req.https {
            b"\r\nx-forwarded-proto: https\r\n"
        } else {
            b"\r\nx-forwarded-proto: http\r\n"
        });
        match body {
            RequestFraming::None => {}
            RequestFraming::Length(n) => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        }
        out.extend_from_slice(b"\r\n");
        let plain = match &self.stream {
            BackendStream::Plain(s) => s,
            BackendStream::Tls(_) | BackendStream::Unix(_) => {
                let written = self
                    .write_request(&mut [IoSlice::new(&out)], timeout, None)
                    .await;
                self.out = out;
                return written.map(|_| ());
            }
        };
        // Most heads go out whole at once; only the rest, if any, needs the bounded wait.
        let written = match try_send(plain, &out) {
            Ok(n) if n == out.len() => Ok(None),
            Ok(n) => {
                let rest = out.get(n..).unwrap_or_default();
                self.write_request(&mut [IoSlice::new(rest)], timeout, None)
                    .await
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.write_request(&mut [IoSlice::new(&out)], timeout, None)
                    .await
            }
            Err(e) => Err(e.into()),
        };
        self.out = out;
        written.map(|_| ())
    }

    /// Writes one piece of request body, chunk-encoded when `chunked`, as
    /// [`ConnState::write_request`] does with `answer` to watch for.
    pub async fn write_body(
        &mut self,
        data: &[u8],
        chunked: bool,
        timeout: Duration,
        answer: &Method,
    ) -> Result<Option<Head>, UpstreamError> {
        if data.is_empty() {
            return Ok(None);
        }
        if chunked {
            let mut line = [0u8; 18];
            let size = chunk_size_line(&mut line, data.len());
            // One system call, and nothing copied.
            let mut out = [
                IoSlice::new(size),
                IoSlice::new(data),
                IoSlice::new(b"\r\n"),
            ];
            self.write_request(&mut out, timeout, Some(answer)).await
        } else {
            self.write_request(&mut [IoSlice::new(data)], timeout, Some(answer))
                .await
        }
    }

    /// Ends a chunked request body, as [`ConnState::write_body`] writes a piece of it.
    pub async fn finish_chunked(
        &mut self,
        timeout: Duration,
        answer: &Method,
    ) -> Result<Option<Head>, UpstreamError> {
        self.write_request(&mut [IoSlice::new(b"0\r\n\r\n")], timeout, Some(answer))
            .await
    }

    /// Writes all of `bufs`. Each wait for room in the socket is bounded by `timeout` (nginx's
    /// `proxy_send_timeout`): a backend that stops reading fails with
    /// [`UpstreamError::SendTimeout`] instead of holding the request forever.
    ///
    /// With `answer` (the request's method), a final response head that arrives while the write
    /// waits ends it early and is returned: a backend that answers before it has read the whole
    /// request (a 413 or a 401 to an upload) may never read the rest. Interim 1xx heads are
    /// skipped. A write that never waits costs nothing more than the write: no clock read, no
    /// timer, no read.
    async fn write_request(
        &mut self,
        mut bufs: &mut [IoSlice<'_>],
        timeout: Duration,
        answer: Option<&Method>,
    ) -> Result<Option<Head>, UpstreamError> {
        let mut left: usize = bufs.iter().map(|b| b.len()).sum();
        let mut armed = false;
        std::future::poll_fn(|cx| {
            // Bounded: every pass writes something, or returns.
            while left > 0 {
                let written = match &*bufs {
                    [one] => Pin::new(&mut self.stream).poll_write(cx, one),
                    _ => Pin::new(&mut self.stream).poll_write_vectored(cx, bufs),
                };
                match written {
                    Poll::Ready(Ok(0)) => {
                        return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                    }
                    Poll::Ready(Ok(n)) => {
                        left -= n;
                        IoSlice::advance_slices(&mut bufs, n);
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => return self.poll_write_wait(cx, timeout, answer, &mut armed),
                }
            }
            // What TLS encrypted and the socket has not taken yet goes out before the write is
            // done; a plain socket holds nothing back.
            if let BackendStream::Tls(t) = &mut self.stream {
                match poll_flush_tls(t, cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                    Poll::Pending => return self.poll_write_wait(cx, timeout, answer, &mut armed),
                }
            }
            Poll::Ready(Ok(None))
        })
        .await
    }

    /// A write that must wait for room in the socket: ends early with a final head the backend
    /// sent meanwhile (see [`ConnState::write_request`]), or with [`UpstreamError::SendTimeout`] once
    /// the wait has lasted `timeout`.
    fn poll_write_wait(
        &mut self,
        cx: &mut Context<'_>,
        timeout: Duration,
        answer: Option<&Method>,
        armed: &mut bool,
    ) -> Poll<Result<Option<Head>, UpstreamError>> {
        if let Some(method) = answer {
            if let Poll::Ready(head) = self.poll_response_head(cx, method) {
                return Poll::Ready(head.map(Some));
            }
        }
        // The timer is set once per wait, when the write first has to wait.
        if !*armed {
            *armed = true;
            self.timer.arm(timeout);
        }
        if self.timer.poll_expired(cx) {
            Poll::Ready(Err(UpstreamError::SendTimeout))
        } else {
            Poll::Pending
        }
    }

    /// Reads more bytes into the buffer; `Ok(0)` is end of stream. Inlined as it was before
    /// TLS: its callers on the plain path then cost what they did (benches/callgrind.sh).
    #[inline]
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_CHUNK);
        }
        if let BackendStream::Plain(s) = &self.stream {
            return poll_read_tcp(s, &mut self.buf, cx);
        }
        let spare = self.buf.spare_capacity_mut();
        let mut rb = ReadBuf::uninit(spare);
        ready!(Pin::new(&mut self.stream).poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity.
        unsafe { self.buf.set_len(self.buf.len() + n) };
        Poll::Ready(Ok(n))
    }

    /// What the backend sent that has not been consumed: another protocol's codec (FastCGI)
    /// decodes its records from here, filled by [`ConnState::poll_fill`].
    pub(crate) fn read_buf(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Writes all of `bufs` for another protocol's codec, each wait for room bounded by
    /// `timeout`, as [`ConnState::write_request`] does with no answer to watch for.
    pub(crate) async fn write_all_within(
        &mut self,
        bufs: &mut [IoSlice<'_>],
        timeout: Duration,
    ) -> Result<(), UpstreamError> {
        self.write_request(bufs, timeout, None).await.map(|_| ())
    }

    /// Reads the response head, skipping interim 1xx responses.
    pub async fn read_head(&mut self, method: &Method) -> Result<Head, UpstreamError> {
        self.next_head(method, None).await
    }

    /// [`ConnState::read_head`], failing with [`UpstreamError::Timeout`] when no final head has arrived
    /// within `timeout`. The timer is `waiter`'s, the waiting client connection's, or else the
    /// backend connection's own, rather than a new one per request (as `tokio::time::timeout`
    /// would make): a new timer is inserted into tokio's wheel and removed from it on every
    /// request, about 600 instructions each time (benches/callgrind.sh). The client's is the
    /// cheaper: it is polled by the same task request after request (see `http1::timer`).
    #[inline(always)]
    pub async fn read_head_within(
        &mut self,
        method: &Method,
        timeout: Duration,
        waiter: Option<&mut Timer>,
    ) -> Result<Head, UpstreamError> {
        if let Some(timer) = waiter {
            timer.arm(timeout);
            return self.next_head(method, Some(timer)).await;
        }
        let mut timer = std::mem::take(&mut self.timer);
        timer.arm(timeout);
        let head = self.next_head(method, Some(&mut timer)).await;
        self.timer = timer;
        head
    }

    async fn next_head(
        &mut self,
        method: &Method,
        mut timer: Option<&mut Timer>,
    ) -> Result<Head, UpstreamError> {
        std::future::poll_fn(|cx| match self.poll_response_head(cx, method) {
            Poll::Pending => {
                let expired = timer.as_mut().is_some_and(|t| t.poll_expired(cx));
                if expired {
                    Poll::Ready(Err(UpstreamError::Timeout))
                } else {
                    Poll::Pending
                }
            }
            done => done,
        })
        .await
    }

    /// The backend's final response head to a request with `method`, skipping interim 1xx
    /// heads, once it has arrived.
    pub fn poll_response_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
    ) -> Poll<Result<Head, UpstreamError>> {
        // Bounded: each pass consumes a head from the buffer, or returns.
        loop {
            let head = ready!(self.poll_head(cx))?;
            if head.status == StatusCode::SWITCHING_PROTOCOLS {
                if !self.upgrading {
                    // Upgrade was not asked for (or not passed on), so a 101 is a confused
                    // backend.
                    return Poll::Ready(Err(UpstreamError::Invalid(
                        "unexpected 101 Switching Protocols",
                    )));
                }
                // RFC 9110 §15.2.2: a 101 says what it switches to; `parse_head` wrote the
                // Upgrade line out, lowercase, as a line of its own.
                if !head.headers.starts_with(b"upgrade: ")
                    && !head.headers.windows(11).any(|w| w == b"\r\nupgrade: ")
                {
                    return Poll::Ready(Err(UpstreamError::Invalid(
                        "101 Switching Protocols without Upgrade",
                    )));
                }
                // The end of HTTP on this connection: what follows is the new protocol's.
                return Poll::Ready(Ok(Head {
                    keep_alive: false,
                    ..head
                }));
            }
            if head.status.is_informational() {
                continue;
            }
            // Set in place: a new `Head` made from this one cost a copy of it.
            let mut head = head;
            head.framing = framing_of(method, &head)?;
            return Poll::Ready(Ok(head));
        }
    }

    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Head, UpstreamError>> {
        let mut got_any = !self.buf.is_empty();
        loop {
            if !self.buf.is_empty() {
                if let Some(head) = parse_head(&mut self.buf)? {
                    return Poll::Ready(Ok(head));
                }
                if self.buf.len() > MAX_HEAD {
                    return Poll::Ready(Err(UpstreamError::HeadTooLarge));
                }
            }
            let n = ready!(self.poll_fill(cx))?;
            if n == 0 {
                return Poll::Ready(Err(if got_any {
                    UpstreamError::Invalid("connection closed inside the response head")
                } else {
                    UpstreamError::ClosedBeforeResponse
                }));
            }
            got_any = true;
        }
    }
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    /// The end-to-end header lines, `name: value\r\n` each, as they go to the client:
    /// hop-by-hop headers (and those Connection names) are consumed by the parser, and so is
    /// Content-Length, which the client side writes from the framing it sends.
    pub headers: Vec<u8>,
    /// Whether the response lets the connection carry another exchange (HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`).
    pub keep_alive: bool,
    /// With Transfer-Encoding present: whether its final coding is chunked.
    pub chunked_last: Option<bool>,
    /// What the Content-Length headers said.
    pub content_length: ContentLength,
    /// Whether the backend sent a Date header; the client side adds one when it did not.
    pub has_date: bool,
    pub framing: Framing,
}

/// Parses a complete head off the front of `buf`, or returns `None` if more bytes are needed.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, UpstreamError> {
    let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut slots)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(UpstreamError::Invalid("too many headers"));
        }
        Err(_) => return Err(UpstreamError::Invalid("malformed status line or header")),
    };
    // A head that came in one read is complete before the size check in `poll_head` sees it.
    if len > MAX_HEAD {
        return Err(UpstreamError::HeadTooLarge);
    }
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(UpstreamError::Invalid("bad status code"))?;
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Hop-by-hop headers are handled here and never reach the client: only what they say about
    // this connection is kept.
    let connection = ConnectionTokens::scan(resp.headers);
    // The end-to-end headers are written out as they go to the client, in room for the whole
    // head the client gets (see `common::prepend_status_line`): what the backend's head took,
    // and a Date and a Connection line more. The buffer is one of the thread's spares
    // (`sys::head_bufs`); the client side gives it back once the head is written. A plain
    // `Vec` from here on: a reply's lines may be dropped elsewhere (an HTTP/2 client's
    // response), where it is simply freed.
    let mut headers = crate::sys::head_bufs::take(len + 64).into_vec();
    let mut chunked_last: Option<bool> = None;
    let mut content_length = ContentLength::Absent;
    let mut has_date = false;
    for h in resp.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        match Hop::of(name) {
            Some(Hop::TransferEncoding) => {
                chunked_last = final_coding_chunked(chunked_last, value);
                continue;
            }
            // A 101's Upgrade says what the connection became, and goes to the client; the
            // client side adds `Connection: upgrade`.
            Some(Hop::Upgrade) if status == StatusCode::SWITCHING_PROTOCOLS => {
                headers.extend_from_slice(b"upgrade: ");
                headers.extend_from_slice(value);
                headers.extend_from_slice(b"\r\n");
                continue;
            }
            Some(Hop::Connection | Hop::Other | Hop::Upgrade) => continue,
            None => {}
        }
        if super::name::is(name, b"content-length") {
            // Read even when Connection names it: it still frames the body on this connection
            // (and a backend cannot dodge the CL-with-TE check that way). The client side
            // writes the framing it sends.
            content_length = content_length.add(value, true);
            continue;
        }
        if connection.names(name) {
            continue;
        }
        // httparse has checked the name's token characters and the value's bytes (HTAB,
        // visible ASCII, space, obs-text), so the line can be copied as it is.
        has_date |= super::name::is(name, b"date");
        headers.extend_from_slice(name);
        headers.extend_from_slice(b": ");
        headers.extend_from_slice(value);
        headers.extend_from_slice(b"\r\n");
    }
    // An HTTP/1.0 message with Transfer-Encoding has faulty framing, and the connection must
    // close after it (RFC 9112 §6.1): its body is still read by its coding and passed on, as
    // nginx does, but nothing more goes on that connection.
    let keep_alive = connection.keep_alive(version == Version::HTTP_11)
        && !(version == Version::HTTP_10 && chunked_last.is_some());
    buf.advance(len);
    Ok(Some(Head {
        status,
        headers,
        keep_alive,
        chunked_last,
        content_length,
        has_date,
        framing: Framing::Empty,
    }))
}

/// How a response body is delimited (RFC 9112 §6.3).
fn framing_of(method: &Method, head: &Head) -> Result<Framing, UpstreamError> {
    let s = head.status;
    if method == Method::HEAD
        || s.is_informational()
        || s == StatusCode::NO_CONTENT
        || s == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if let Some(chunked) = head.chunked_last {
        if head.content_length != ContentLength::Absent {
            return Err(UpstreamError::Invalid(
                "both Transfer-Encoding and Content-Length",
            ));
        }
        // Another final coding is delimited by the connection closing.
        return Ok(if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        });
    }
    Ok(match head.content_length {
        ContentLength::Invalid(why) => return Err(UpstreamError::Invalid(why)),
        ContentLength::Valid(0) => Framing::Empty,
        ContentLength::Valid(n) => Framing::Length(n),
        ContentLength::Absent => Framing::Close,
    })
}

/// A response body read from the backend connection as the client side writes it out.
#[derive(Debug)]
pub struct UpstreamBody {
    conn: Option<Conn>,
    decoder: Decoder,
    /// The body ends when the backend closes, so the connection can never be reused.
    close_delimited: bool,
    /// Whether the backend's head carried a Date header.
    has_date: bool,
}

/// What a finished body leaves behind.
pub enum Finished {
    /// The exchange completed and the connection may carry another.
    Reusable(Conn),
    /// The exchange completed but the connection cannot be reused, or it did not complete.
    Closed,
}

impl UpstreamBody {
    pub fn new(conn: Conn, head: &Head) -> Self {
        UpstreamBody {
            conn: Some(conn),
            decoder: Decoder::new(head.framing),
            close_delimited: head.framing == Framing::Close,
            has_date: head.has_date,
        }
    }

    /// The connection, taken for good: after a 101 it carries the new protocol, not a body.
    pub fn take_conn(&mut self) -> Option<Conn> {
        self.conn.take()
    }

    /// Whether the backend sent a Date header.
    pub fn has_date(&self) -> bool {
        self.has_date
    }

    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// The body's length still to come, when the backend framed it by length.
    pub fn remaining(&self) -> Option<u64> {
        self.decoder.remaining()
    }

    /// Takes the connection back once the body is complete; `keep_alive` says whether the
    /// response allowed reuse.
    pub fn finish(&mut self, keep_alive: bool) -> Finished {
        match self.conn.take() {
            Some(conn)
                if self.decoder.is_done()
                    && keep_alive
                    && !self.close_delimited
                    && conn.buf.is_empty() =>
            {
                Finished::Reusable(conn)
            }
            _ => Finished::Closed,
        }
    }

    /// Decodes as much as the buffer holds; `None` means more bytes are needed.
    fn decode(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        match self.conn.as_mut() {
            Some(conn) => Ok(self.decoder.decode(&mut conn.buf)?),
            None => Ok(None),
        }
    }

    /// The next piece of the body; `None` once it is complete. An error means the body was
    /// cut short or malformed: the client must see an aborted response.
    pub fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        loop {
            match self.decode() {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(None) if self.decoder.is_done() => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let n = match ready!(conn.poll_fill(cx)) {
                Ok(n) => n,
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            };
            if n == 0 {
                if self.decoder.at_eof() {
                    return Poll::Ready(None);
                }
                return Poll::Ready(Some(Err(UpstreamError::Invalid(
                    "backend closed the connection mid-body",
                ))));
            }
        }
    }
}

/// Builds the response the client side sends. Only a response without a body keeps the
/// backend's Content-Length among its lines: to a HEAD request, or a 304, it describes the body
/// that was not sent.
#[inline(always)]
pub fn response<B>(head: Head, body: B, method: &Method) -> Reply<B> {
    let mut headers = head.headers;
    if let ContentLength::Valid(n) = head.content_length {
        if method == Method::HEAD || head.status == StatusCode::NOT_MODIFIED {
            content_length_line(&mut headers, n);
        }
    }
    Reply {
        status: head.status,
        headers,
        body,
    }
}

/// Why a connect to a backend failed: the cause as logs and error pages show it, and what it
/// says about the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub cause: String,
    pub kind: ConnectFailure,
}

/// What a failed connect says about the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// Refused, reset, unreachable, a failed TLS handshake: the backend's fault.
    Backend,
    /// No answer within the timeout: a dead host, or a live one whose accept queue is full
    /// and drops SYNs; which, only the backend's other connections can tell (the upstream
    /// side tells, and makes it [`ConnectFailure::Busy`]).
    TimedOut,
    /// Timed out, but the backend took other connections meanwhile, or has requests in
    /// flight on connections it took: it is busy, its accept queue full, not dead. Or the
    /// connect never started: `max_connecting` others were in progress all along.
    Busy,
    /// pinlb's own side ran out (file descriptors, local ports, buffers): not the backend's
    /// fault at all.
    Local,
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cause)
    }
}

impl From<String> for ConnectError {
    /// A cause that blames the backend.
    fn from(cause: String) -> Self {
        ConnectError {
            cause,
            kind: ConnectFailure::Backend,
        }
    }
}

impl ConnectError {
    pub(crate) fn timed_out(cause: String) -> Self {
        ConnectError {
            cause,
            kind: ConnectFailure::TimedOut,
        }
    }

    pub(crate) fn busy(cause: String) -> Self {
        ConnectError {
            cause,
            kind: ConnectFailure::Busy,
        }
    }

    pub(crate) fn io(e: &std::io::Error) -> Self {
        use nix::errno::Errno;
        let local = e.raw_os_error().map(Errno::from_raw).is_some_and(|n| {
            matches!(
                n,
                Errno::EMFILE
                    | Errno::ENFILE
                    | Errno::EADDRNOTAVAIL
                    | Errno::ENOBUFS
                    | Errno::ENOMEM
            )
        });
        let kind = match (local, e.kind()) {
            (true, _) => ConnectFailure::Local,
            (false, std::io::ErrorKind::TimedOut) => ConnectFailure::TimedOut,
            _ => ConnectFailure::Backend,
        };
        let mut cause = describe_io(e);
        if local && !cause.starts_with(OUT_OF_DESCRIPTORS) {
            cause.push_str(" (on pinlb's side, not the backend's)");
        }
        ConnectError { cause, kind }
    }

    /// A failed connect to a Unix socket. A socket pinlb may not open (EACCES, EPERM: the
    /// socket's or a directory's permissions, or a security module) is pinlb's side: the
    /// backend may be serving, so it is not counted against it, and the cause names the fix.
    /// No file there, or a file nobody listens on, is the backend's: it is not running.
    #[cold]
    pub(crate) fn unix(path: &Path, e: &std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let (cause, kind) = match e.kind() {
            PermissionDenied => (
                format!(
                    "permission denied opening the socket {} ({}): pinlb's user may not connect to it; check the socket's mode and owner, and its directories' (on pinlb's side, not the backend's)",
                    path.display(),
                    e
                ),
                ConnectFailure::Local,
            ),
            NotFound => (
                format!(
                    "no socket at {}: the backend is not running",
                    path.display()
                ),
                ConnectFailure::Backend,
            ),
            ConnectionRefused => (
                format!("connection refused: nothing listens on {}", path.display()),
                ConnectFailure::Backend,
            ),
            // A listener whose accept queue is full makes a non-blocking connect fail at once
            // (EAGAIN) where TCP would drop the SYN: busy, not dead.
            WouldBlock => (
                format!("the backend's accept queue on {} is full", path.display()),
                ConnectFailure::Busy,
            ),
            _ => return ConnectError::io(e),
        };
        ConnectError { cause, kind }
    }
}

/// Opens a new connection to a backend, with a TLS handshake when `tls` is given. The connect
/// and the handshake are each bounded by `timeout`, as nginx bounds both by
/// `proxy_connect_timeout`.
///
/// `first` (a PROXY protocol header, or empty) is written before anything else, the TLS
/// handshake included.
pub async fn connect(
    addr: BackendAddress,
    timeout: Duration,
    tls: Option<&Connector>,
    first: &[u8],
) -> Result<Conn, ConnectError> {
    let addr = match addr {
        BackendAddress::Tcp(a) => a,
        BackendAddress::Unix(path) => return Box::pin(connect_unix(path, timeout, first)).await,
    };
    let mut stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(ConnectError::io(&e)),
        Err(_) => {
            return Err(ConnectError::timed_out(format!(
                "connect timed out after {timeout:?}"
            )));
        }
    };
    // Small requests and responses must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    if !first.is_empty() {
        write_first(&mut stream, first, timeout).await?;
    }
    let Some(tls) = tls else {
        return Ok(Conn::new(BackendStream::Plain(stream)));
    };
    // Boxed: the handshake's state (rustls's, about a kilobyte) would otherwise make every
    // request's future larger, plain ones included.
    match tokio::time::timeout(timeout, Box::pin(tls.handshake(stream))).await {
        Ok(Ok(t)) => {
            let stream = BackendStream::Tls(Box::new(t));
            tracing::debug!(backend = %addr, resumed = stream.is_resumed(), "TLS handshake done");
            Ok(Conn::new(stream))
        }
        Ok(Err(cause)) => Err(cause.into()),
        Err(_) => Err(format!("TLS handshake timed out after {timeout:?}").into()),
    }
}

/// Opens a connection to a Unix-domain socket, bounded by `timeout` (a listener whose accept
/// queue is full makes `connect(2)` wait). No TLS: config validation refuses it on a socket.
/// Boxed by its caller: its state does not make the TCP connect's future larger.
#[cold]
#[inline(never)]
async fn connect_unix(
    path: &'static Path,
    timeout: Duration,
    first: &[u8],
) -> Result<Conn, ConnectError> {
    let mut stream = match tokio::time::timeout(timeout, UnixStream::connect(path)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(ConnectError::unix(path, &e)),
        Err(_) => {
            return Err(ConnectError::timed_out(format!(
                "connect timed out after {timeout:?}"
            )));
        }
    };
    if !first.is_empty() {
        write_first(&mut stream, first, timeout).await?;
    }
    Ok(Conn::new(BackendStream::Unix(Box::new(stream))))
}

/// Writes a connection's first bytes (its PROXY protocol header) within `timeout`. Out of
/// line: a connection without them never runs it.
#[cold]
#[inline(never)]
async fn write_first<S: AsyncWrite + Unpin>(
    stream: &mut S,
    first: &[u8],
    timeout: Duration,
) -> Result<(), ConnectError> {
    use tokio::io::AsyncWriteExt;
    match tokio::time::timeout(timeout, stream.write_all(first)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ConnectError::io(&e)),
        Err(_) => Err(ConnectError::timed_out(format!(
            "writing the PROXY protocol header timed out after {timeout:?}"
        ))),
    }
}

/// How a connect that failed for want of a descriptor is described: pinlb's fault, not the
/// backend's, so the retry loop does not count it against the backend.
pub(crate) const OUT_OF_DESCRIPTORS: &str = "pinlb is out of file descriptors";

/// A short cause for a failed connect or exchange, as the logs and error pages show it.
pub(crate) fn describe_io(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    // EMFILE: the process's open file limit; ENFILE: the system's.
    match e.raw_os_error() {
        Some(24) => {
            return format!(
                "{OUT_OF_DESCRIPTORS} (EMFILE: the open file limit, RLIMIT_NOFILE, is reached), no socket for the backend"
            );
        }
        Some(23) => {
            return format!(
                "{OUT_OF_DESCRIPTORS} (ENFILE: the system's file table is full), no socket for the backend"
            );
        }
        _ => {}
    }
    match e.kind() {
        ConnectionRefused => "connection refused".into(),
        ConnectionReset => "connection reset".into(),
        TimedOut => "connect timed out".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<Head>, UpstreamError> {
        parse_head(&mut BytesMut::from(text))
    }

    fn framing(method: Method, text: &str) -> Result<Framing, UpstreamError> {
        let h = head(text)?.expect("complete head");
        framing_of(&method, &h)
    }

    #[test]
    fn a_connect_without_a_descriptor_says_pinlb_ran_out() {
        let emfile = describe_io(&io::Error::from_raw_os_error(24));
        assert!(emfile.starts_with(OUT_OF_DESCRIPTORS), "{emfile}");
        assert!(emfile.contains("RLIMIT_NOFILE"), "{emfile}");
        let enfile = describe_io(&io::Error::from_raw_os_error(23));
        assert!(enfile.starts_with(OUT_OF_DESCRIPTORS), "{enfile}");
        let refused = describe_io(&io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(refused, "connection refused");
    }

    #[test]
    fn a_socket_pinlb_may_not_open_is_pinlb_s_side_and_a_missing_one_the_backend_s() {
        let path = Path::new("/run/app.sock");
        let denied = ConnectError::unix(path, &io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(denied.kind, ConnectFailure::Local);
        assert!(
            denied
                .cause
                .contains("permission denied opening the socket /run/app.sock")
        );
        assert!(denied.cause.contains("on pinlb's side"), "{}", denied.cause);
        let gone = ConnectError::unix(path, &io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(gone.kind, ConnectFailure::Backend);
        assert_eq!(
            gone.cause,
            "no socket at /run/app.sock: the backend is not running"
        );
        let refused = ConnectError::unix(path, &io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(refused.kind, ConnectFailure::Backend);
        let full = ConnectError::unix(path, &io::Error::from(io::ErrorKind::WouldBlock));
        assert_eq!(full.kind, ConnectFailure::Busy);
    }

    #[test]
    fn a_partial_head_asks_for_more() {
        assert!(head("HTTP/1.1 200 OK\r\nContent-Len").unwrap().is_none());
    }

    #[test]
    fn a_head_is_parsed_and_leaves_the_body_in_the_buffer() {
        let mut buf = BytesMut::from("HTTP/1.1 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\n\r\nbody");
        let h = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!(h.status, 404);
        assert_eq!(h.headers, b"X-A: 1\r\nx-a: 2\r\n");
        assert!(!h.has_date);
        assert_eq!(&buf[..], b"body");
    }

    #[test]
    fn garbage_instead_of_a_status_line_is_invalid() {
        assert!(matches!(
            head("SSH-2.0-OpenSSH\r\n\r\n"),
            Err(UpstreamError::Invalid(_))
        ));
    }

    #[test]
    fn framing_follows_rfc_9112() {
        use Framing::*;
        assert_eq!(
            framing(Method::GET, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").unwrap(),
            Length(5)
        );
        assert_eq!(
            framing(Method::HEAD, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").unwrap(),
            Empty
        );
        assert_eq!(
            framing(Method::GET, "HTTP/1.1 204 No Content\r\n\r\n").unwrap(),
            Empty
        );
        assert_eq!(
            framing(
                Method::GET,
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n"
            )
            .unwrap(),
            Empty
        );
        assert_eq!(
            framing(
                Method::GET,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
            )
            .unwrap(),
            Chunked
        );
        assert_eq!(
            framing(
                Method::GET,
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
            )
            .unwrap(),
            Close
        );
        assert_eq!(
            framing(Method::GET, "HTTP/1.1 200 OK\r\n\r\n").unwrap(),
            Close
        );
        assert_eq!(
            framing(
                Method::GET,
                "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n"
            )
            .unwrap(),
            Length(3)
        );
        // A Content-Length that Connection names still frames the body; it is not passed on.
        let text = "HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 3\r\n\r\n";
        assert_eq!(framing(Method::GET, text).unwrap(), Length(3));
        let h = head(text).unwrap().unwrap();
        assert!(h.headers.is_empty());
    }

    #[test]
    fn ambiguous_framing_is_rejected() {
        let bad = [
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 3,,3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nCONTENT-LENGTH: 5\r\n\r\n",
            // Naming Content-Length in Connection does not hide it from the framing check.
            "HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        ];
        for b in bad {
            assert!(
                matches!(framing(Method::GET, b), Err(UpstreamError::Invalid(_))),
                "{b:?}"
            );
        }
    }

    #[test]
    fn keep_alive_follows_version_and_connection() {
        let ka = |text: &str| head(text).unwrap().unwrap().keep_alive;
        assert!(ka("HTTP/1.1 200 OK\r\n\r\n"));
        assert!(!ka("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"));
        assert!(!ka("HTTP/1.0 200 OK\r\n\r\n"));
        assert!(ka("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\n\r\n"));
        assert!(!ka(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n\r\n"
        ));
    }

    #[test]
    fn a_101_keeps_its_upgrade_for_the_client() {
        let h = head(
            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Accept: a\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            h.headers,
            b"upgrade: websocket\r\nSec-WebSocket-Accept: a\r\n"
        );
    }

    #[test]
    fn hop_by_hop_headers_never_reach_the_client() {
        let h = head(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\n\
             Proxy-Connection: x\r\nTE: trailers\r\nTrailer: x-sum\r\nUpgrade: h2c\r\n\
             Transfer-Encoding: chunked\r\nX-Hop: 1\r\nX-Kept: 2\r\nDate: d\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.headers, b"X-Kept: 2\r\nDate: d\r\n");
        assert!(h.has_date);
        assert_eq!(h.chunked_last, Some(true));
        assert!(h.keep_alive);
    }

    #[test]
    fn kept_lines_go_out_in_order_as_name_colon_space_value_however_the_backend_spaced_them() {
        let h = head(
            "HTTP/1.1 200 OK\r\nServer: a\r\nX-One:1\r\nX-Two:  2 \t\r\nDate: d\r\n\
             Connection: keep-alive\r\nX-Three: 3\r\nX-Empty: \r\nX-Bare:\r\n\
             Content-Length: 0\r\nX-Four: 4\r\nX-Five: 5\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&h.headers),
            "Server: a\r\nX-One: 1\r\nX-Two: 2\r\nDate: d\r\nX-Three: 3\r\nX-Empty: \r\n\
             X-Bare: \r\nX-Four: 4\r\nX-Five: 5\r\n"
        );
        // A 101's Upgrade line, written by pinlb, keeps its place among the others.
        let h = head(
            "HTTP/1.1 101 Switching Protocols\r\nX-A: 1\r\nUpgrade: websocket\r\n\
             Connection: upgrade\r\nX-B: 2\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&h.headers),
            "X-A: 1\r\nupgrade: websocket\r\nX-B: 2\r\n"
        );
    }
}
