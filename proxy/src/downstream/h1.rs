//! One client connection's life: reading requests off it, handing each to the proxy, writing
//! the responses back, and closing, lingering or parking it.
//!
//! pinlb serves clients with its own codec (`http1`) rather than hyper's server, for the same
//! reasons it talks to backends without hyper's client: a proxy needs less than a general server, and
//! the difference is what pinlb costs. hyper's server was about 7.7k of the 17.7k user-space
//! instructions per proxied request (benches/callgrind.sh), and it keeps two 8 KiB buffers per
//! connection for as long as the connection is open, idle or not. Here an idle keep-alive
//! connection holds no buffer at all (its read buffer is freed between requests), and a request
//! is parsed in place with `httparse`, the parser hyper uses.
//!
//! Per request: one read for the head (and whatever body came with it), the exchange with the
//! backend, and one write for the response head together with the part of the body the backend
//! sent with its own head. Request heads are parsed and checked by `http1::request`.

use std::cell::Cell;
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode, Version};
use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::debug;

use crate::config::Limits;
use crate::downstream::h2;
use crate::downstream::idle::{self, Wait};
use crate::downstream::pipeline;
use crate::downstream::session::{Ending, Forwarding, Session};
use crate::downstream::stream::{DownstreamStream, Refused, Stir, StreamIo, TlsState};
use crate::downstream::tunnel::{self, Dir, End};
use crate::http1::body::{Decoder, Framing};
use crate::http1::client::UpstreamError;
use crate::http1::common::{
    ERROR_PAGE_TYPE, Reply, RequestFraming, chunk_size_line, content_length_line, error_page,
    prepend_status_line, status_line,
};
use crate::http1::request::{ClientError, HeadEnd, RequestHead, parse_request};
use crate::http1::timer::Timer;
use crate::proxy::accesslog::{Batch, Logged};
use crate::proxy::body::{ProxyBody, Upgraded};
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::route::decision::{KnownClient, Plan, Route};
use crate::sys::head_bufs::Spare;
use crate::sys::socket::poll_read_tcp;
use crate::sys::summed::summed_warn;
use crate::tls::client_identity::ClientIdentity;
use crate::upstream::counters::{ListenerStats, Source};

/// After a response that ends the connection with client bytes left unread, how long and how
/// much pinlb goes on reading (and discarding) before it closes, so that the close does not
/// turn into a reset that destroys the response before the client reads it (nginx's
/// `lingering_close`).
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

/// A worker's open client connections, which park here when idle.
pub(crate) type Connections = idle::Connections<Parked>;
/// A connection's slot among its worker's [`Connections`].
pub(crate) type Slot = idle::Slot<Parked>;

/// What a client connection holds until it closes, however its task ends (dropped before its
/// first poll included): its `limits.max_connections` permit, and its count as an open
/// connection.
pub(crate) struct Held {
    _slot: OwnedSemaphorePermit,
    _closed: Closed,
    /// Its place in its client address's count under the listener's `conn_limit`, once
    /// admitted; given back when the connection ends, however it ends.
    /// Boxed: most listeners have no limit, and this rides in every connection's future.
    client: Option<Box<crate::modules::conn_limit::table::ClientSlot>>,
}

impl Held {
    /// Counts the connection open on `stats` (when metrics are on) until it is dropped.
    pub(crate) fn new(slot: OwnedSemaphorePermit, stats: Option<Arc<ListenerStats>>) -> Held {
        if let Some(s) = &stats {
            s.accepted.fetch_add(1, Ordering::Relaxed);
        }
        Held {
            _slot: slot,
            _closed: Closed(stats),
            client: None,
        }
    }
}

/// The listener's `conn_limit` for a connection from `peer` (the real client's address, after
/// any PROXY protocol header): `false` when the address has its connections open already, and
/// the connection is to be closed before a byte is read from it (HAProxy's `tcp-request
/// connection reject`). One `Option` test for a listener without a limit.
#[inline]
fn admitted(route: &Route, peer: SocketAddr, held: &mut Held) -> bool {
    let plan = route.plan();
    match &plan.conn_limit {
        None => true,
        Some(_) if held.client.is_some() => true,
        Some(gate) => held.admit(gate, peer, route.stats.as_deref()),
    }
}

impl Held {
    /// Takes a place for `peer`'s address under the listener's `conn_limit` (`gate`):
    /// `false`, counted on `stats` and logged, when it has its connections open already.
    #[cold]
    #[inline(never)]
    pub(crate) fn admit(
        &mut self,
        gate: &crate::modules::conn_limit::table::ConnGate,
        peer: SocketAddr,
        stats: Option<&ListenerStats>,
    ) -> bool {
        use crate::modules::conn_limit::table::Refused;
        let client = peer.ip();
        match gate.admit(client) {
            Ok(slot) => {
                self.client = Some(Box::new(slot));
                return true;
            }
            Err(Refused::Over) => {
                summed_warn!(client = %peer; "conn_limit: {client} has {} connections open already, closed a new one", gate.max);
            }
            Err(Refused::Full) => {
                summed_warn!(client = %peer; "conn_limit: no room to count {client}'s connections (every slot it may use counts other addresses'; raise conn_limit.keys), closed a new one");
            }
        }
        if let Some(s) = stats {
            s.refuse(crate::upstream::counters::Refusal::ConnLimit);
        }
        false
    }
}

/// Counts a client connection closed when dropped.
struct Closed(Option<Arc<ListenerStats>>);

impl Drop for Closed {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.closed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Reads what the client sent into the spare room of `buf`; `Ok(0)` is the end of the stream.
#[inline]
fn poll_read_buf(
    stream: &DownstreamStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    stream.poll_read_buf(buf, cx)
}

/// Writes all of `bufs`, waiting for room in the socket as needed. Not an `async fn` of its
/// own: a layer of future around the stream's would cost every response a copy of it.
fn write_all<'a>(
    stream: &'a DownstreamStream,
    bufs: &'a mut [IoSlice<'_>],
) -> impl Future<Output = io::Result<()>> + 'a {
    stream.write_all(bufs)
}

/// A request's body, read from the client connection as the proxy sends it on.
pub struct BodyReader<'a> {
    stream: &'a DownstreamStream,
    buf: &'a mut BytesMut,
    framing: RequestFraming,
    decoder: Decoder,
    /// `Expect: 100-continue` not yet answered.
    expect_continue: bool,
    /// Told when the body is complete, for the connection to see while the proxy holds it.
    watch: &'a Watch,
}

impl<'a> BodyReader<'a> {
    fn new(
        stream: &'a DownstreamStream,
        buf: &'a mut BytesMut,
        framing: RequestFraming,
        expect_continue: bool,
        watch: &'a Watch,
    ) -> Self {
        let decoder = Decoder::new(match framing {
            RequestFraming::None => Framing::Empty,
            RequestFraming::Length(n) => Framing::Length(n),
            RequestFraming::Chunked => Framing::Chunked,
        });
        let body = BodyReader {
            stream,
            buf,
            framing,
            decoder,
            expect_continue,
            watch,
        };
        body.check_done();
        body
    }

    /// Once the body is complete, whatever is left in the buffer belongs to a next request.
    fn check_done(&self) {
        if self.decoder.is_done() {
            self.watch.body_done.set(true);
            if !self.buf.is_empty() {
                self.watch.pipelined.set(true);
            }
        }
    }
}

impl DownstreamBody for BodyReader<'_> {
    fn framing(&self) -> RequestFraming {
        self.framing
    }

    fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// The next piece of the body; `None` once it is complete. Errors are the client's: a
    /// malformed chunk, or the connection ending mid-body.
    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        let broke_off = |e: io::Error| ClientError::BodyBrokeOff(e.to_string().into());
        // Bounded: every pass decodes, or reads at least one byte, or ends.
        loop {
            let decoded = self.decoder.decode(self.buf).map_err(ClientError::Body)?;
            self.check_done();
            if decoded.is_some() || self.decoder.is_done() {
                return Ok(decoded);
            }
            if self.expect_continue {
                // The client waits for this before it sends the body; a client that sent it
                // anyway has it in the buffer, and the answer is skipped.
                self.expect_continue = false;
                write_all(
                    self.stream,
                    &mut [IoSlice::new(b"HTTP/1.1 100 Continue\r\n\r\n")],
                )
                .await
                .map_err(broke_off)?;
            }
            let n = std::future::poll_fn(|cx| poll_read_buf(self.stream, self.buf, cx))
                .await
                .map_err(broke_off)?;
            if n == 0 {
                return Err(ClientError::BodyBrokeOff(
                    "client closed the connection mid-body".into(),
                ));
            }
        }
    }
}

/// What the connection watches while the proxy holds the request body.
#[derive(Default)]
struct Watch {
    /// The whole request body has been read.
    body_done: Cell<bool>,
    /// Bytes of a next request have arrived: in the buffer, or waiting in the socket.
    pipelined: Cell<bool>,
}

/// Completes when the client closes its connection (or it breaks) while its request is with a
/// backend, so that the request is abandoned, as hyper and nginx do. Watches only once the
/// request body has been read, and not once a next request has begun to arrive: those bytes are
/// not read until the response is out, and a client that pipelines and then closes its side
/// still gets every answer.
fn poll_client_gone(stream: &DownstreamStream, watch: &Watch, cx: &mut Context<'_>) -> Poll<()> {
    if !watch.body_done.get() || watch.pipelined.get() {
        return Poll::Pending;
    }
    match ready!(stream.poll_stir(cx)) {
        Stir::Gone => Poll::Ready(()),
        Stir::Sent => {
            watch.pipelined.set(true);
            Poll::Pending
        }
    }
}

/// The request head `buf` holds whole, parsed; or, for a partial head or one to refuse, where
/// `read_head` is to take up the search for its end. A head that came whole with the read before
/// (nearly every one) is parsed here, in the pipeline's own future (`Session::head`), not in
/// `read_head`: returned out of that future, it was moved three times more (about 90
/// instructions per request, benches/callgrind.sh). A refused head is parsed again there, to be
/// answered.
#[inline(always)]
fn parse_whole(buf: &mut BytesMut, limits: &Limits) -> Result<RequestHead, HeadEnd> {
    if buf.is_empty() {
        return Err(HeadEnd::default());
    }
    match parse_request(buf, &limits.request()) {
        Ok(Some(head)) => Ok(head),
        // Part of a head: `read_head` reads on, and looks for the end only in what is new.
        Ok(None) => Err(HeadEnd::searched(buf.len())),
        Err(_) => Err(HeadEnd::default()),
    }
}

/// A timer made on first need and armed for each later wait (`http1::timer`, the backend
/// connection's kind): waits that never block (most do not) cost no timer, and those that do
/// share one.
#[derive(Default)]
struct Deadline(Timer);

impl Deadline {
    /// `fut`'s output, or `None` if it was pending for `limit`.
    async fn within<T>(&mut self, limit: Duration, fut: impl Future<Output = T>) -> Option<T> {
        let mut fut = std::pin::pin!(fut);
        let mut armed = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(v));
            }
            if !armed {
                armed = true;
                self.0.arm(limit);
            }
            if self.0.poll_expired(cx) {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// Most bytes of a body of unknown length (chunked, or delimited by the backend's close) read
/// ahead for an HTTP/1.0 keep-alive client, so that it can go out with a Content-Length: the
/// size of nginx's default `proxy_buffers` (8 × 8 KiB).
const READ_AHEAD_BYTES: usize = 64 * 1024;
/// Longest the read-ahead waits, in all, for the rest of such a body (or `timeouts.response`,
/// if shorter). A backend that answers at once (Node's `res.end(body)`) is done well within
/// it; a slow stream (server-sent events) holds its first bytes back for at most this long,
/// then streams as it would have.
const READ_AHEAD_TIME: Duration = Duration::from_millis(10);

/// A response body's beginning, read ahead (see [`read_ahead`]).
struct Ahead {
    /// The body's bytes so far, at most `READ_AHEAD_BYTES`.
    data: BytesMut,
    /// What the body gave after `data`, if the read-ahead took it: its end (`None`), an error,
    /// or the piece that would have gone over the bound. `None` when the time ran out.
    then: Option<Option<Result<Bytes, UpstreamError>>>,
}

impl Ahead {
    /// Whether `data` is the whole body.
    fn complete(&self) -> bool {
        matches!(self.then, Some(None))
    }

    /// The pieces read ahead, in order, before the body is read on; `None` once they are out.
    fn next(&mut self) -> Option<Option<Result<Bytes, UpstreamError>>> {
        if !self.data.is_empty() {
            return Some(Some(Ok(self.data.split().freeze())));
        }
        self.then.take()
    }
}

/// Reads a body of unknown length ahead until it ends, passes `READ_AHEAD_BYTES`, breaks, or
/// `READ_AHEAD_TIME` (at most `limit`) is over. A body that is already there costs no timer.
async fn read_ahead(body: &mut ProxyBody, limit: Duration) -> Ahead {
    let mut data = BytesMut::new();
    let mut deadline = Deadline::default();
    let until = Instant::now() + READ_AHEAD_TIME.min(limit);
    // Bounded by READ_AHEAD_BYTES and the time: every pass takes a piece of the body, or ends.
    loop {
        let next = std::future::poll_fn(|cx| body.poll_data(cx));
        let left = until.saturating_duration_since(Instant::now());
        let then = match deadline.within(left, next).await {
            None => None,
            Some(Some(Ok(d))) if data.len() + d.len() <= READ_AHEAD_BYTES => {
                data.extend_from_slice(&d);
                continue;
            }
            Some(piece) => Some(piece),
        };
        return Ahead { data, then };
    }
}

/// What happens to a connection after an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
    /// Close, reading and discarding what the client still sends for a while first.
    Linger,
    /// Reset: a response broke off, and the client must not take what it got for the whole.
    Abort,
    /// The connection began with the HTTP/2 preface on an `h2c` listener: HTTP/2 serves it
    /// from here, with the bytes read so far.
    Http2,
}

/// How a response went out.
enum Written {
    /// Whole; with whether the connection may carry another request.
    Whole { keep_alive: bool },
    /// Cut short: the backend failed or stalled mid-body.
    Aborted,
}

/// One client connection, for as long as it is open.
struct Connection {
    stream: DownstreamStream,
    peer: SocketAddr,
    slot: Slot,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    /// The header timeout of the connection's first request runs from here.
    accepted: Instant,
    /// The rules the connection's client identity was worked out under, and that identity;
    /// recomputed only after a reload changed the rules (`forwarded.trusted` above all).
    downstream: KnownClient,
}

/// A connection parked while idle (see `idle`): what it needs to start again.
pub struct Parked {
    pub socket: std::net::TcpStream,
    /// A TLS connection's rustls state.
    tls: Option<TlsState>,
    peer: SocketAddr,
    slot: Slot,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    held: Held,
    /// No request has come on it yet: its first head is still timed from `accepted`.
    first: bool,
    accepted: Instant,
}

impl AsFd for Parked {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// Starts parked connections again as their clients send something, until the worker ends.
pub(crate) async fn unparker(clients: Rc<Connections>) {
    loop {
        for parked in clients.unparked().await {
            let Parked {
                socket,
                tls,
                peer,
                slot,
                route,
                batch,
                held,
                first,
                accepted,
            } = *parked;
            match TcpStream::from_std(socket) {
                Ok(stream) => {
                    let stream = DownstreamStream::from_parts(stream, tls);
                    let start = Start { first, accepted };
                    tokio::task::spawn_local(serve(stream, peer, slot, route, batch, held, start));
                }
                // Dropped: closed.
                Err(e) => debug!(client = %peer, "cannot take a parked connection back: {e}"),
            }
        }
    }
}

/// Where a connection's service starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// No request has come on it yet.
    pub first: bool,
    /// When it was accepted: the header timeout of its first request runs from here.
    pub accepted: Instant,
}

impl Start {
    /// A connection just accepted.
    pub fn accepted() -> Start {
        Start {
            first: true,
            accepted: Instant::now(),
        }
    }
}

/// Serves one client connection until it closes or is parked. `held` is kept until then: the
/// connection's `limits.max_connections` permit and its counters.
pub(crate) async fn serve(
    stream: DownstreamStream,
    peer: SocketAddr,
    slot: Slot,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    mut held: Held,
    start: Start,
) {
    if !admitted(&route, peer, &mut held) {
        return;
    }
    let rules = route.plan().rules.clone();
    let downstream = KnownClient::new(rules, peer, stream.is_tls(), route.local);
    let conn = Connection {
        stream,
        peer,
        slot,
        route,
        batch,
        accepted: start.accepted,
        downstream,
    };
    let mut buf = BytesMut::new();
    let mut first = start.first;
    // The timer of each request's wait for its response head: the connection's, so that one
    // task polls it request after request (see `http1::timer`), made at the first wait and
    // dropped when the connection parks.
    let mut waiter = Timer::default();
    // Bounded by the client: every pass serves one request, or ends.
    let next = loop {
        if buf.is_empty() {
            // Idle until the first bytes of a request are in the buffer (or the client closed):
            // a readiness without bytes behind it keeps the connection idle, with no buffer.
            let wait = std::future::poll_fn(|cx| {
                conn.slot.poll_wait(first, cx, |cx| {
                    if buf.capacity() == 0 {
                        buf = conn.slot.connections().take_buffer();
                    }
                    let read = poll_read_buf(&conn.stream, &mut buf, cx);
                    if read.is_pending() && buf.is_empty() {
                        conn.slot
                            .connections()
                            .give_buffer(std::mem::take(&mut buf));
                    }
                    read.map(|r| r.map(drop))
                })
            })
            .await;
            match wait {
                Wait::Readable => {}
                Wait::Close => {
                    debug!(client = %conn.peer, "closing client connection: idle, or making room, or stopping");
                    break Next::Close;
                }
                Wait::Park => {
                    park(conn, held, first);
                    return;
                }
            }
        }
        // Out of the task: the exchange's state (about 3 KB, most of it the proxy's) exists
        // only while a request does, so that a connection waiting for its next request keeps a
        // small task. Inside it saved about 500 instructions per request (an allocation and a
        // copy of the state), but the memory of 10,000 connections that had just gone idle
        // (before they park) stayed with the allocator, and benches/idle.sh measured 571 bytes
        // per parked connection instead of 391. It is made in a block the worker keeps from an
        // exchange before (`sys::recycle`): no allocation, and no copy.
        let exchanges = conn.slot.connections().exchanges();
        let next = exchanges
            .make(|| {
                let exchange = Exchange {
                    conn: &conn,
                    buf: &mut buf,
                    first,
                    waiter: &mut waiter,
                    watch: Watch::default(),
                };
                pipeline::run(&*conn.route, exchange)
            })
            .await;
        if next != Next::KeepAlive {
            break next;
        }
        // Nothing pipelined: the idle wait above gives the buffer back if the next request is
        // not there yet.
        first = false;
    };
    if next == Next::Http2 {
        let Connection {
            stream,
            peer,
            slot,
            route,
            batch,
            ..
        } = conn;
        Box::pin(h2::serve(stream, buf.freeze(), peer, slot, route, batch)).await;
        drop(held);
        return;
    }
    // Boxed: rarely needed (a lingering close holds a buffer and a timer), and kept out of the
    // task's own state, which every open connection pays for.
    Box::pin(conn.close(next)).await;
    drop(held);
}

/// Whether `buf`, whose head failed to parse, begins with a whole request line of HTTP/1.x,
/// which is then answered as HTTP/1.1 (400): only a line that names another protocol, or
/// none, is taken for a wrong HTTP/2 preface on an `h2c` listener.
fn http1_request_line(buf: &[u8]) -> bool {
    match memchr::memchr(b'\n', buf) {
        Some(end) => memchr::memmem::find(&buf[..end], b" HTTP/1.").is_some(),
        // No whole line (a head over the size limit): HTTP/1.1's answer, as before.
        None => true,
    }
}

/// What an h2c connection begins with: the first line of the HTTP/2 client preface (RFC 9113
/// §3.4) and the empty line after it.
const H2C_START: &[u8] = b"PRI * HTTP/2.0\r\n\r\n";

/// Serves a connection accepted on a TLS listener: the handshake first, within
/// `limits.header_timeout` of the accept (the time its first request head would have). Plain
/// HTTP gets a 400 that says so, as nginx answers; a failed handshake is counted and closed.
pub(crate) async fn serve_tls(
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    mut held: Held,
    start: Start,
) {
    if !admitted(&route, peer, &mut held) {
        return;
    }
    // The certificates of the generation running now: a reload that comes during the
    // handshake applies to the next one.
    let plan = route.plan();
    let Some(tls) = plan.tls.clone() else {
        drop(plan);
        let stream = DownstreamStream::Plain(tcp);
        return serve(stream, peer, slot, route, batch, held, start).await;
    };
    let limit = plan.rules.limits.header_timeout;
    drop(plan);
    let shaken = tokio::time::timeout_at(
        start.accepted + limit,
        crate::downstream::stream::handshake(tcp, &tls),
    )
    .await;
    drop(tls);
    crate::downstream::stream::count_handshake(route.stats.as_deref(), &shaken);
    match shaken {
        Ok(Ok(stream)) => {
            if stream.is_h2() {
                Box::pin(h2::serve(stream, Bytes::new(), peer, slot, route, batch)).await;
                drop(held);
                return;
            }
            serve(stream, peer, slot, route, batch, held, start).await;
        }
        Ok(Err(Refused::PlainHttp(tcp))) => {
            debug!(client = %peer, "answered 400: plain HTTP on a TLS listener");
            let plan = route.plan();
            let downstream = KnownClient::new(plan.rules.clone(), peer, false, route.local);
            let conn = Connection {
                stream: DownstreamStream::Plain(tcp),
                peer,
                slot,
                route,
                batch,
                accepted: start.accepted,
                downstream,
            };
            conn.write_local(
                &plan,
                StatusCode::BAD_REQUEST,
                &"The plain HTTP request was sent to HTTPS port",
            )
            .await;
            Box::pin(conn.close(Next::Linger)).await;
            drop(held);
        }
        Ok(Err(Refused::ClientCert(why))) => {
            // The address without its port: each connection has another, and the cause is
            // written once per client per second.
            let ip = peer.ip();
            summed_warn!(client = %peer; "refused the TLS handshake of {ip}: {why}");
        }
        Ok(Err(Refused::Failed(_, why))) => {
            debug!(client = %peer, "TLS handshake failed: {why}");
        }
        Err(_) => {
            debug!(client = %peer, "TLS handshake not done within {limit:?} (limits.header_timeout)");
        }
    }
}

/// Parks an idle connection: its socket leaves the reactor for the worker's parking set.
fn park(conn: Connection, held: Held, first: bool) {
    let Connection {
        stream,
        peer,
        slot,
        route,
        batch,
        accepted,
        ..
    } = conn;
    let clients = slot.connections_rc();
    let (stream, tls) = stream.into_parts();
    match stream.into_std() {
        Ok(socket) => {
            let parked = Box::new(Parked {
                socket,
                tls,
                peer,
                slot,
                route,
                batch,
                held,
                first,
                accepted,
            });
            if let Err(parked) = clients.park(parked.slot.index(), parked) {
                debug!(client = %peer, "closing idle client connection: it could not be parked");
                drop(parked);
            }
        }
        Err(e) => debug!(client = %peer, "closing idle client connection: {e}"),
    }
}

/// How a response to one client is framed.
struct ResponseFraming {
    /// The response has no body (HEAD, 1xx, 204, 304), whatever its lines say.
    bodiless: bool,
    /// Its Content-Length, when known.
    length: Option<u64>,
    chunked: bool,
    keep_alive: bool,
}

/// The error of a client that took none of a response for `timeouts.client_idle`.
fn stalled() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "client took no data")
}

/// Whether a response to `method` with `status` has no body (RFC 9112 §6.3).
fn is_bodiless(method: &Method, status: StatusCode) -> bool {
    method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
}

/// One request of a connection, as the request pipeline's session: read off the connection's
/// buffer, answered, and its response written, all under one generation's plan, taken before
/// the head (a reload while it arrives applies to the next).
struct Exchange<'c> {
    conn: &'c Connection,
    buf: &'c mut BytesMut,
    /// The connection's first request: its head is timed from the accept.
    first: bool,
    waiter: &'c mut Timer,
    watch: Watch,
}

impl<'c> Session for Exchange<'c> {
    type Out = Next;
    type Partial = HeadEnd;
    type Body<'s>
        = BodyReader<'s>
    where
        Self: 's;
    type Gone<'s>
        = ClientGone<'s>
    where
        Self: 's;
    type Sent = io::Result<Written>;

    #[inline(always)]
    fn plan(&self, route: &Route) -> Rc<Plan> {
        route.plan()
    }

    #[inline(always)]
    fn head(&mut self, plan: &Plan) -> Result<RequestHead, HeadEnd> {
        parse_whole(self.buf, &plan.rules.limits)
    }

    async fn read_head(&mut self, plan: &Plan, end: HeadEnd) -> Result<RequestHead, Next> {
        self.conn.read_head(self.buf, self.first, plan, end).await
    }

    #[inline(always)]
    fn started(&self, plan: &Plan) -> Option<std::time::Instant> {
        plan.timed.then(std::time::Instant::now)
    }

    #[inline(always)]
    fn peer(&self) -> SocketAddr {
        self.conn.peer
    }

    #[inline(always)]
    fn client(&self, plan: &Plan) -> Rc<Downstream> {
        self.conn.downstream.under(&plan.rules)
    }

    #[inline(always)]
    fn batch(&self) -> Option<&Rc<Batch>> {
        self.conn.batch.as_ref()
    }

    #[inline(always)]
    fn client_identity(&self) -> Option<&Arc<ClientIdentity>> {
        self.conn.stream.client_identity()
    }

    #[inline(always)]
    fn forwarding(&mut self, head: &RequestHead) -> Forwarding<'_, Self> {
        let stream = &self.conn.stream;
        Forwarding {
            body: BodyReader::new(
                stream,
                self.buf,
                head.body,
                head.expect_continue,
                &self.watch,
            ),
            gone: ClientGone {
                conn: self.conn,
                watch: &self.watch,
            },
            waiter: Some(self.waiter),
        }
    }

    /// Written, and the connection kept when both sides allow it and nothing of the request
    /// is left unread.
    #[inline(always)]
    fn send<'a>(
        &'a mut self,
        response: Reply<ProxyBody>,
        logged: Logged,
        e: &Ending<'a>,
    ) -> impl Future<Output = io::Result<Written>> + 'a {
        let (conn, head) = (self.conn, e.head);
        let keep_alive = head.keep_alive
            && !head.ambiguous
            && !e.close
            && e.body_read
            && !conn.slot.connections().is_draining();
        let (method, version) = (&head.method, head.version);
        conn.write_response(response, method, version, keep_alive, logged, e.timeouts)
    }

    #[inline(always)]
    fn sent(&mut self, written: io::Result<Written>, e: &Ending<'_>) -> Next {
        if let (Some(s), Some(t)) = (&self.conn.route.stats, e.at) {
            s.request_time.observe(t.elapsed());
        }
        match written {
            Ok(Written::Whole { keep_alive: true }) => Next::KeepAlive,
            Ok(Written::Whole { .. })
                if e.body_read && self.buf.is_empty() && !self.watch.pipelined.get() =>
            {
                Next::Close
            }
            // Bytes the client sent are left unread.
            Ok(Written::Whole { .. }) => Next::Linger,
            Ok(Written::Aborted) | Err(_) => Next::Abort,
        }
    }

    /// Only a request that asked to upgrade gets a 101 this far (http1::client).
    async fn upgrade(&mut self, response: Reply<ProxyBody>, logged: Logged, e: Ending<'_>) -> Next {
        // Boxed: a tunnel's state is needed by few connections.
        Box::pin(self.conn.tunnel(response, self.buf, logged, e.timeouts)).await
    }
}

/// Completes when the client closes its connection (or it breaks) while its request is with a
/// backend (`poll_client_gone`): the connection closes, and the request is abandoned.
struct ClientGone<'a> {
    conn: &'a Connection,
    watch: &'a Watch,
}

impl Future for ClientGone<'_> {
    type Output = Next;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Next> {
        ready!(poll_client_gone(&self.conn.stream, self.watch, cx));
        debug!(client = %self.conn.peer, "client closed the connection while its request was with a backend");
        Poll::Ready(Next::Close)
    }
}

impl Connection {
    /// Reads until `buf` holds a whole request head. A head that can't be served (malformed,
    /// too large, too late) is answered here; `Err` says how the connection ends then, or after
    /// the client closed.
    ///
    /// `end` is where the search for the head's end stands: `HeadEnd::searched` when the
    /// caller already parsed what `buf` holds.
    async fn read_head(
        &self,
        buf: &mut BytesMut,
        first: bool,
        plan: &Plan,
        mut end: HeadEnd,
    ) -> Result<RequestHead, Next> {
        let limits = &plan.rules.limits;
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        // Bounded: each pass reads at least one byte (the head is at most
        // `limits.max_header_bytes`), or ends.
        loop {
            if !buf.is_empty() {
                let parsed = if end.arrived(buf) || buf.len() > limits.max_header_bytes {
                    parse_request(buf, &limits.request())
                } else {
                    Ok(None)
                };
                match parsed {
                    Ok(Some(head)) => return Ok(head),
                    Ok(None) => {}
                    // The preface's first line parses as a head of version HTTP/2.0, which
                    // HTTP/1.1 refuses: looked at only then, so it costs no other head anything.
                    Err(_) if first && plan.h2c && buf.starts_with(H2C_START) => {
                        let whole = buf.len() >= h2::PREFACE.len();
                        if whole && !buf.starts_with(h2::PREFACE) {
                            return Err(self.refuse_preface().await);
                        }
                        return Err(Next::Http2);
                    }
                    // Neither HTTP/1.x nor HTTP/2: answered as HTTP/2 answers a wrong preface.
                    Err(_) if first && plan.h2c && !http1_request_line(buf) => {
                        return Err(self.refuse_preface().await);
                    }
                    Err(e) => {
                        summed_warn!(client = %self.peer; "answered {}: {e}", e.status().as_u16());
                        self.write_local(plan, e.status(), &e).await;
                        return Err(Next::Linger);
                    }
                }
                if timer.is_none() {
                    // Part of a head is here: it must be complete within the header timeout of
                    // its first byte (of the accept, for the first request). The clock is read
                    // only now, when a head needs more than one read.
                    let since = if first { self.accepted } else { Instant::now() };
                    timer = Some(Box::pin(tokio::time::sleep_until(
                        since + limits.header_timeout,
                    )));
                }
            }
            // The timer is polled only when the read has to wait: a head that arrives a byte at
            // a time wakes the task once per byte and polls this twice (the byte, then the wait
            // for the next one), and the timer needs its waker only for the wait. A timer that
            // ran out is seen at the next wait, after at most the bytes already there.
            let read = std::future::poll_fn(|cx| match poll_read_buf(&self.stream, buf, cx) {
                Poll::Ready(r) => Poll::Ready(Some(r)),
                Poll::Pending => match timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(None),
                    _ => Poll::Pending,
                },
            })
            .await;
            match read {
                Some(Ok(0)) => {
                    if !buf.is_empty() {
                        debug!(client = %self.peer, "client closed the connection inside a request head");
                    }
                    return Err(Next::Close);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    debug!(client = %self.peer, "client connection failed: {e}");
                    return Err(Next::Close);
                }
                None => {
                    summed_warn!(client = %self.peer; "answered 408: no complete request head within {:?} (limits.header_timeout)", limits.header_timeout);
                    self.write_local(
                        plan,
                        StatusCode::REQUEST_TIMEOUT,
                        &"no complete request head within limits.header_timeout",
                    )
                    .await;
                    // What arrived of the head is dropped, and what still comes is read and
                    // dropped for a while, so that the client sees the 408 and not a reset.
                    buf.clear();
                    return Err(Next::Linger);
                }
            }
        }
    }

    /// Answers the first bytes of a connection on an `h2c` listener that are neither an
    /// HTTP/1.x request nor the HTTP/2 preface (h2spec's `INVALID CONNECTION PREFACE`) as an
    /// HTTP/2 server answers a wrong preface, a GOAWAY with PROTOCOL_ERROR
    /// ([`h2::PREFACE_REFUSED`]), rather than with an HTTP/1.1 400 that an HTTP/2 client
    /// would read as a broken frame; then closes, lingering so the GOAWAY is not lost.
    async fn refuse_preface(&self) -> Next {
        summed_warn!(client = %self.peer; "closed with GOAWAY(PROTOCOL_ERROR): the connection began with neither an HTTP/1.x request line nor the HTTP/2 preface (h2c listener)");
        let mut out = [IoSlice::new(&h2::PREFACE_REFUSED)];
        let _ = tokio::time::timeout(LINGER_TIME, write_all(&self.stream, &mut out)).await;
        Next::Linger
    }

    /// Writes a response pinlb makes itself before any request reached the proxy, and which
    /// ends the connection. Best effort, for at most `LINGER_TIME`: the connection closes next
    /// anyway.
    async fn write_local(&self, plan: &Plan, status: StatusCode, cause: &dyn std::fmt::Display) {
        self.write_page(plan, status, cause, b"", false).await;
    }

    /// Writes a page pinlb makes itself, with `lines` among its headers; best effort, for at
    /// most `LINGER_TIME`. Whether the connection is kept says `keep_alive`. The page's length
    /// when it went out whole.
    async fn write_page(
        &self,
        plan: &Plan,
        status: StatusCode,
        cause: &dyn std::fmt::Display,
        lines: &[u8],
        keep_alive: bool,
    ) -> Option<usize> {
        if let Some(s) = &self.route.stats {
            s.response(status, Source::Pinlb);
        }
        let page = plan.listener_page(status);
        let (content_type, text) = match &page {
            Some(p) => (&p.content_type[..], p.body.clone()),
            None => (ERROR_PAGE_TYPE, Bytes::from(error_page(status, cause))),
        };
        let mut head = Vec::with_capacity(256 + lines.len());
        status_line(&mut head, status);
        head.extend_from_slice(content_type);
        self.slot.connections().write_date(&mut head);
        content_length_line(&mut head, text.len() as u64);
        head.extend_from_slice(lines);
        if !keep_alive {
            head.extend_from_slice(b"connection: close\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let mut out = [IoSlice::new(&head), IoSlice::new(&text)];
        let written = tokio::time::timeout(LINGER_TIME, write_all(&self.stream, &mut out)).await;
        matches!(written, Ok(Ok(()))).then_some(text.len())
    }

    /// Writes a response and streams its body.
    ///
    /// Each wait is bounded: for the next piece of the body by `timeouts.response` (nginx's
    /// `proxy_read_timeout`), for room in the client's socket by `timeouts.client_idle` (its
    /// `send_timeout`). Either running out cuts the response short.
    async fn write_response(
        &self,
        response: Reply<ProxyBody>,
        method: &Method,
        version: Version,
        keep_alive: bool,
        mut logged: Logged,
        timeouts: crate::config::Timeouts,
    ) -> io::Result<Written> {
        let Reply {
            status,
            headers,
            mut body,
        } = response;
        let bodiless = is_bodiless(method, status);
        let mut length = body.remaining();
        let chunked = !bodiless && length.is_none() && version == Version::HTTP_11;
        // An HTTP/1.0 keep-alive client can't take chunked: a body of unknown length that ends
        // soon enough goes out with its Content-Length and the connection stays; any other is
        // delimited by the close (see `read_ahead`). HTTP/1.1 clients never come here.
        let mut ahead = None;
        if keep_alive && !bodiless && length.is_none() && version == Version::HTTP_10 {
            // Boxed, as the tunnel is: few exchanges need the read-ahead's state, and every
            // one would carry it (and copy it) if it were part of this future.
            let a = Box::pin(read_ahead(&mut body, timeouts.response)).await;
            if a.complete() {
                length = Some(a.data.len() as u64);
            }
            ahead = Some(Box::new(a));
        }
        let keep_alive = keep_alive && (bodiless || length.is_some() || chunked);

        let framing = ResponseFraming {
            bodiless,
            length,
            chunked,
            keep_alive,
        };
        // Its buffer goes back to the thread's spares once written (`sys::head_bufs`).
        let head =
            Spare::from(self.response_head(status, headers, body.has_date(), version, &framing));

        let mut reading = Deadline::default();
        let mut sending = Deadline::default();
        // The head goes out with the first piece of the body when that is already here (the
        // backend usually sends its head and a small body in one packet): one write, not two.
        let mut head = Some(head);
        // Bounded by the body and the timeouts: every pass writes a piece of it, or ends.
        loop {
            let piece = if let Some(piece) = ahead.as_mut().and_then(|a| a.next()) {
                piece
            } else if bodiless {
                None
            } else if head.is_some() {
                match std::future::poll_fn(|cx| Poll::Ready(body.poll_data(cx))).await {
                    Poll::Ready(piece) => piece,
                    Poll::Pending => {
                        if let Some(h) = head.take() {
                            let out = &mut [IoSlice::new(&h)];
                            self.send(&mut sending, out, timeouts.client_idle)
                                .await
                                .ok_or_else(stalled)??;
                        }
                        continue;
                    }
                }
            } else {
                let next = std::future::poll_fn(|cx| body.poll_data(cx));
                match reading.within(timeouts.response, next).await {
                    Some(piece) => piece,
                    None => {
                        summed_warn!(client = %self.peer; "response aborted: the backend sent no more of the body within {:?} (timeouts.response)", timeouts.response);
                        return Ok(Written::Aborted);
                    }
                }
            };
            let h = head.take().unwrap_or_default();
            let write = match piece {
                Some(Ok(data)) => {
                    logged.sent(data.len());
                    // The body knows this piece is its last (`ProxyBody::is_end`; its backend is
                    // released): the response is whole once it is written, without a poll of
                    // the body to hear so. A read-ahead may still hold pieces.
                    let last = body.is_end() && ahead.is_none();
                    let mut size = [0u8; 18];
                    let mut out = framed(&mut size, &h, &data, chunked.then_some(last));
                    let sent = self
                        .send(&mut sending, &mut out, timeouts.client_idle)
                        .await;
                    if last && matches!(sent, Some(Ok(()))) {
                        return Ok(Written::Whole { keep_alive });
                    }
                    sent
                }
                None => {
                    let end: &[u8] = if chunked { b"0\r\n\r\n" } else { b"" };
                    let out = &mut [IoSlice::new(&h), IoSlice::new(end)];
                    self.send(&mut sending, out, timeouts.client_idle)
                        .await
                        .ok_or_else(stalled)??;
                    return Ok(Written::Whole { keep_alive });
                }
                Some(Err(e)) => {
                    if !h.is_empty() {
                        let out = &mut [IoSlice::new(&h)];
                        self.send(&mut sending, out, timeouts.client_idle)
                            .await
                            .ok_or_else(stalled)??;
                    }
                    summed_warn!(client = %self.peer; "response aborted: {e}");
                    return Ok(Written::Aborted);
                }
            };
            if write.is_none() {
                summed_warn!(client = %self.peer; "response aborted: the client took no data for {:?} (timeouts.client_idle)", timeouts.client_idle);
            }
            write.ok_or_else(stalled)??;
        }
    }

    /// Writes `out` whole to the client, each wait for room bounded by `limit`; `None` when
    /// it ran out. Most writes go out whole at once: the bounded wait (a future, and a timer if
    /// it blocks) is made only for what the socket did not take.
    async fn send(
        &self,
        sending: &mut Deadline,
        mut out: &mut [IoSlice<'_>],
        limit: Duration,
    ) -> Option<io::Result<()>> {
        match self.stream.write_now(&mut out) {
            Ok(true) => Some(Ok(())),
            Ok(false) => sending.within(limit, write_all(&self.stream, out)).await,
            Err(e) => Some(Err(e)),
        }
    }

    /// A response's head as it goes to this client: the status line, the backend's (or
    /// pinlb's) lines, a Date unless it has one, and the framing and Connection lines. Built in
    /// the lines' own allocation (see `prepend_status_line`).
    #[inline]
    fn response_head(
        &self,
        status: StatusCode,
        mut head: Vec<u8>,
        has_date: bool,
        version: Version,
        framing: &ResponseFraming,
    ) -> Vec<u8> {
        let &ResponseFraming {
            bodiless,
            length,
            chunked,
            keep_alive,
        } = framing;
        prepend_status_line(&mut head, status);
        if !has_date {
            self.slot.connections().write_date(&mut head);
        }
        if !bodiless {
            match length {
                Some(n) => content_length_line(&mut head, n),
                None if chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
                None => {}
            }
        }
        if !keep_alive {
            head.extend_from_slice(b"connection: close\r\n");
        } else if version == Version::HTTP_10 {
            head.extend_from_slice(b"connection: keep-alive\r\n");
        }
        head.extend_from_slice(b"\r\n");

        head
    }

    /// Writes a `101` and relays bytes between the client and the backend until the tunnel
    /// closes; the connection ends with it. Bytes either side sent after its head go first.
    async fn tunnel(
        &self,
        response: Reply<ProxyBody>,
        buf: &mut BytesMut,
        mut logged: Logged,
        timeouts: crate::config::Timeouts,
    ) -> Next {
        let Reply {
            status,
            headers,
            mut body,
        } = response;
        let Some(Upgraded {
            stream: mut backend,
            early,
            open,
        }) = body.upgrade()
        else {
            return Next::Abort;
        };
        let mut head = Vec::with_capacity(headers.len() + 64);
        status_line(&mut head, status);
        head.extend_from_slice(&headers);
        head.extend_from_slice(b"connection: upgrade\r\n\r\n");
        let wrote = Deadline::default()
            .within(
                timeouts.client_idle,
                write_all(&self.stream, &mut [IoSlice::new(&head)]),
            )
            .await;
        if !matches!(wrote, Some(Ok(()))) {
            debug!(client = %self.peer, "could not write a 101 to the client");
            return Next::Abort;
        }
        // Not held for the tunnel's life.
        drop((head, headers));
        let stats = open.stats();
        let idle = open.idle();
        let fin = open.fin();
        let relayed = tunnel::relay(
            &mut StreamIo(&self.stream),
            &mut backend,
            std::mem::take(buf),
            early,
            // A WebSocket's messages are small: no pipe for them.
            tunnel::Limits {
                idle,
                fin,
                splice: false,
            },
            |dir, n| {
                if let Some(s) = stats {
                    s.tunnel_bytes[dir as usize].fetch_add(n, Ordering::Relaxed);
                }
            },
        )
        .await;
        buf.clear();
        logged.tunnelled(relayed.up, relayed.down);
        let (up, down) = (relayed.up, relayed.down);
        match relayed.end {
            End::Closed => {
                debug!(client = %self.peer, up, down, "tunnel closed");
                Next::Close
            }
            End::Idle => {
                debug!(client = %self.peer, up, down, "tunnel closed: no data either way for {:?} (timeouts.tunnel_idle)", idle);
                let _ = SockRef::from(&backend).shutdown(std::net::Shutdown::Both);
                Next::Close
            }
            End::HalfClosed(dir) => {
                let (closed, open) = if dir == Dir::Up {
                    ("client", "backend")
                } else {
                    ("backend", "client")
                };
                debug!(client = %self.peer, up, down, "tunnel closed: the {closed} closed its side and the {open} did not close its own within {fin:?} (timeouts.tunnel_fin)");
                if let Some(s) = stats {
                    s.tunnel_fin_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                let _ = SockRef::from(&backend).shutdown(std::net::Shutdown::Both);
                Next::Close
            }
            End::Failed(dir, e) => {
                let side = if dir == Dir::Up {
                    "client to backend"
                } else {
                    "backend to client"
                };
                debug!(client = %self.peer, up, down, "tunnel cut ({side}): {e}");
                // Reset both: a cut tunnel must not look like a clean close to either peer.
                let _ = SockRef::from(&backend).set_linger(Some(Duration::ZERO));
                Next::Abort
            }
        }
    }

    /// Ends the connection. After a response the write side closes first, so the client sees
    /// the end of the stream; with `Next::Linger`, what the client still sends is then read
    /// and dropped for a while, so that closing with unread bytes does not reset the connection
    /// before the client has read its answer (nginx's `lingering_close`). `Next::Abort` resets
    /// it instead: a response cut short must not look complete, even one delimited by the close.
    async fn close(&self, next: Next) {
        let sock = SockRef::from(self.stream.tcp());
        if next == Next::Abort {
            let _ = sock.set_linger(Some(Duration::ZERO));
            return;
        }
        self.stream.notify_close();
        let _ = sock.shutdown(std::net::Shutdown::Write);
        if next != Next::Linger {
            return;
        }
        let mut scratch = BytesMut::with_capacity(16 * 1024);
        let mut read = 0;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            // Bounded by `LINGER_BYTES` and the timeout.
            while read < LINGER_BYTES {
                scratch.clear();
                // Over TLS too, what comes now is dropped unread: raw bytes off the socket.
                let tcp = self.stream.tcp();
                match std::future::poll_fn(|cx| poll_read_tcp(tcp, &mut scratch, cx)).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        })
        .await;
    }
}

/// A piece of a body as one write: `head` (the response's, while it is still to go), then the
/// piece as it is, or, with `chunked` (`Some(last)`), as a chunk, and the last chunk after it
/// when `last`. `size` holds the chunk-size line. The last chunk goes with the last piece when
/// the body knows it is over (`ProxyBody::is_end`): one write, and one wake of the client, not
/// two.
#[inline(always)]
fn framed<'a>(
    size: &'a mut [u8; 18],
    head: &'a [u8],
    data: &'a [u8],
    chunked: Option<bool>,
) -> [IoSlice<'a>; 4] {
    let (size, end): (&[u8], &[u8]) = match chunked {
        None => (b"", b""),
        Some(last) => (
            chunk_size_line(size, data.len()),
            if last { b"\r\n0\r\n\r\n" } else { b"\r\n" },
        ),
    };
    [
        IoSlice::new(head),
        IoSlice::new(size),
        IoSlice::new(data),
        IoSlice::new(end),
    ]
}
