//! HTTP/2 client connections: hyper's HTTP/2 server on the connection, and each stream sent
//! through the same request path as an HTTP/1.1 request.
//!
//! A connection speaks HTTP/2 when ALPN chose `h2` on a TLS listener, or when it begins with
//! the HTTP/2 preface on a plain listener with `h2c = true` (`downstream::h1` decides, and hands
//! the connection over with the bytes it already read; one that begins with neither an HTTP/1.x
//! request line nor the preface gets [`PREFACE_REFUSED`]). HTTP/1.1 keeps pinlb's own codec; HTTP/2's
//! framing, HPACK, flow control and its defences (rapid reset, CONTINUATION floods, SETTINGS
//! floods, header list size) are hyper's and its `h2` crate's, which h2spec checks upstream.
//!
//! Each stream's request is written out as the HTTP/1.1 head it stands for (RFC 9113 §8.3:
//! `:authority` becomes Host, split Cookie fields are joined, the body is framed by its
//! Content-Length or chunked) and parsed by `http1::request` as a client's head would be, so
//! every rule about what reaches a backend lives in one place. The proxy then picks, forwards,
//! retries and counts it exactly as it does an HTTP/1.1 request; the response's header lines
//! become the stream's headers, without the connection-specific ones (RFC 9113 §8.2.2).
//!
//! A connection never parks (hyper holds its state), but it has its slot among the worker's
//! client connections like any other: it is closed after `timeouts.client_idle` with no stream
//! open (`limits.header_timeout` before its first), to make room at `limits.max_connections`,
//! and at a stop, which sends GOAWAY and lets open streams finish. A graceful close that hyper
//! does not end (its client never answers the PING) is cut `GRACEFUL_CLOSE` after it began
//! with no stream open, or at once when room is needed, with the final GOAWAY that h2 would
//! have sent (the last stream the client opened). Room is taken only from a connection past
//! its handshake, or one accepted `idle::ROOM_AFTER` ago or more: never one just accepted.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, COOKIE, DATE, HOST};
use http::{HeaderValue, Method, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tracing::debug;

use std::os::fd::AsFd;

use crate::config::{Http2, Limits};
use crate::downstream::idle;
use crate::downstream::pipeline;
use crate::downstream::session::{Ending, Forwarding, Session};
use crate::downstream::stream::{DownstreamStream, StreamIo};
use crate::http1::client::UpstreamError;
use crate::http1::common::{ERROR_PAGE_TYPE, Reply, RequestFraming, error_page, header_map};
use crate::http1::request::{ClientError, RequestHead, parse_request};
use crate::proxy::accesslog::{Batch, Logged};
use crate::proxy::body::ProxyBody;
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::route::decision::{KnownClient, Plan, Route};
use crate::sys::exec::LocalExec;
use crate::sys::summed::summed_warn;
use crate::tls::client_identity::ClientIdentity;
use crate::upstream::counters::{ListenerStats, Source};

/// Per stream, the most response bytes hyper buffers for a client that is not reading them:
/// past this the stream waits (and so does the backend, by TCP), so a client that never reads
/// holds this much per stream and no more.
const MAX_SEND_BUF: usize = 64 * 1024;

/// What a connection's streams share.
struct Shared {
    route: Rc<Route>,
    peer: SocketAddr,
    batch: Option<Rc<Batch>>,
    /// The client's identity (over TLS or not: `X-Forwarded-Proto`), worked out under the
    /// rules it was made for, as an HTTP/1.1 connection keeps it.
    downstream: KnownClient,
    /// What the client's certificate says, on a listener with `client_ca`.
    client: Option<Arc<ClientIdentity>>,
    /// The `Date` value of the worker's last tick.
    date: Rc<dyn Fn() -> HeaderValue>,
    /// Streams open: from the request's arrival to the end of its response.
    open: Cell<usize>,
    /// A stream has come: the connection's idle time now counts from its last one.
    served: Cell<bool>,
    /// The connection's task, woken when its last open stream ends, so its idle time begins.
    task: RefCell<Option<Waker>>,
    /// The streams' waits for the client to take their responses.
    stalls: RefCell<Vec<Weak<Stall>>>,
}

/// A stream's wait for the client to take the last piece of its response: for flow-control
/// window (a WINDOW_UPDATE) or room in the socket. hyper asks the body for the next piece only
/// once the last one went, so the wait runs from a piece handed over to the next ask. It may
/// last `timeouts.client_idle`, as an HTTP/1.1 response's wait for room in the client's
/// socket may (nginx's `send_timeout`); past that the connection is closed. Otherwise a client
/// that reads nothing, or never opens its window, would hold the stream, its backend
/// connection and the client connection (never idle with a stream open) for ever.
struct Stall {
    since: Cell<Option<tokio::time::Instant>>,
    limit: Duration,
}

/// One stream's request, as the request pipeline's session: its head written out as HTTP/1.1
/// and parsed as such, its body read from the stream, and the answer handed to hyper as the
/// stream's response.
struct Exchange {
    shared: Rc<Shared>,
    parts: http::request::Parts,
    /// Its framing is the head's, set once the head is parsed.
    body: RequestBody,
    /// Moved into the response, which keeps the stream counted open until it is done.
    open: Option<Open>,
}

impl Exchange {
    fn new(shared: Rc<Shared>, parts: http::request::Parts, body: Incoming, open: Open) -> Self {
        let done = body.is_end_stream();
        Exchange {
            shared,
            parts,
            body: RequestBody {
                body,
                framing: RequestFraming::None,
                done,
                trailers: None,
            },
            open: Some(open),
        }
    }
}

impl Session for Exchange {
    /// hyper's service future's: never an error.
    type Out = Result<Response<ResponseBody>, Infallible>;
    type Partial = ClientError;
    type Body<'s>
        = &'s mut RequestBody
    where
        Self: 's;
    // A client abandons a request by resetting its stream: hyper drops the exchange.
    type Gone<'s>
        = std::future::Pending<Self::Out>
    where
        Self: 's;
    type Sent = Response<ResponseBody>;

    fn plan(&self, route: &Route) -> Rc<Plan> {
        self.open
            .as_ref()
            .map_or_else(|| route.plan(), |o| o.plan.clone())
    }

    fn head(&mut self, plan: &Plan) -> Result<RequestHead, ClientError> {
        let limits = &plan.rules.limits;
        let mut text = http1_head(&self.parts, self.body.done, limits);
        match parse_request(&mut text, &limits.request()) {
            Ok(Some(mut head)) => {
                head.version = Version::HTTP_2;
                Ok(head)
            }
            Ok(None) => Err(ClientError::HeadTooLarge(
                "request head over limits.max_header_bytes",
            )),
            Err(e) => Err(e),
        }
    }

    /// Nothing more to read: the head came whole, and this one can't be served.
    async fn read_head(&mut self, plan: &Plan, e: ClientError) -> Result<RequestHead, Self::Out> {
        let open = self.open.take();
        Err(Ok(self.shared.refuse(plan, &self.parts.method, e, open)))
    }

    fn started(&self, _: &Plan) -> Option<std::time::Instant> {
        self.open.as_ref().and_then(|o| o.started)
    }

    fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    fn client(&self, plan: &Plan) -> Rc<Downstream> {
        self.shared.downstream.under(&plan.rules)
    }

    fn batch(&self) -> Option<&Rc<Batch>> {
        self.shared.batch.as_ref()
    }

    fn client_identity(&self) -> Option<&Arc<ClientIdentity>> {
        self.shared.client.as_ref()
    }

    fn forwarding(&mut self, head: &RequestHead) -> Forwarding<'_, Self> {
        self.body.framing = head.body;
        Forwarding {
            body: &mut self.body,
            gone: std::future::pending(),
            // A stream's own task would register with a timer of its own anew each time; the
            // backend connection's serves as well.
            waiter: None,
        }
    }

    /// Handed to hyper as the stream's response, which sends it.
    fn send<'a>(
        &'a mut self,
        response: Reply<ProxyBody>,
        logged: Logged,
        e: &Ending<'a>,
    ) -> impl Future<Output = Response<ResponseBody>> + 'a {
        let (method, timeout) = (&e.head.method, e.timeouts.response);
        let open = self.open.take();
        let response = (self.shared).respond(e.plan, response, method, logged, timeout, open);
        std::future::ready(response)
    }

    fn sent(&mut self, response: Response<ResponseBody>, _: &Ending<'_>) -> Self::Out {
        Ok(response)
    }

    /// Never asked for (no HTTP/2 request head asks to upgrade): sent as it is, which hyper
    /// refuses as a stream error.
    async fn upgrade(
        &mut self,
        response: Reply<ProxyBody>,
        logged: Logged,
        e: Ending<'_>,
    ) -> Self::Out {
        Ok(self.send(response, logged, &e).await)
    }
}

impl Shared {
    /// The earliest end of a stream's wait for the client, forgetting the streams gone.
    fn stalled_until(&self) -> Option<tokio::time::Instant> {
        let mut stalls = self.stalls.borrow_mut();
        stalls.retain(|w| w.strong_count() > 0);
        stalls
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|s| s.since.get().and_then(|t| t.checked_add(s.limit)))
            .min()
    }
}

/// Counts a stream open until its response has gone (or the stream was reset), and times it
/// for `pinlb_request_duration_seconds` while metrics are on. It holds the plan the stream
/// took when it came: one generation for the whole request.
struct Open {
    shared: Rc<Shared>,
    started: Option<std::time::Instant>,
    plan: Rc<Plan>,
}

impl Open {
    fn new(shared: &Rc<Shared>) -> Open {
        shared.open.set(shared.open.get() + 1);
        shared.served.set(true);
        let plan = shared.route.plan();
        Open {
            shared: shared.clone(),
            // The clock is read only when something reads what it measures (`Plan::timed`).
            started: plan.timed.then(std::time::Instant::now),
            plan,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let shared = &self.shared;
        if let (Some(s), Some(t)) = (&shared.route.stats, self.started) {
            s.request_time.observe(t.elapsed());
        }
        let n = shared.open.get().saturating_sub(1);
        shared.open.set(n);
        if n == 0 {
            if let Some(w) = shared.task.borrow_mut().take() {
                w.wake();
            }
        }
    }
}

/// Serves an HTTP/2 connection until it closes. `early` is what was already read off it (the
/// start of an h2c preface); `slot` is its place among the worker's connections.
pub(crate) async fn serve<P: AsFd + 'static>(
    stream: DownstreamStream,
    early: Bytes,
    peer: SocketAddr,
    slot: idle::Slot<P>,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
) {
    let rules = route.plan().rules.clone();
    let h2 = rules.http2;
    let limits = rules.limits;
    let tls = stream.is_tls();
    let downstream = KnownClient::new(rules, peer, tls, route.local);
    let clients = slot.connections_rc();
    let reloads = clients.reloads();
    let stats = route.stats.clone();
    if let Some(s) = &stats {
        s.http2_connections.fetch_add(1, Ordering::Relaxed);
    }
    let shared = Rc::new(Shared {
        route,
        peer,
        batch,
        client: stream.client_identity().cloned(),
        downstream,
        date: Rc::new(move || clients.date()),
        open: Cell::new(0),
        served: Cell::new(false),
        task: RefCell::new(None),
        stalls: RefCell::new(Vec::new()),
    });
    let wire = Rc::new(Wire::default());
    // Shared with hyper's side, for the final GOAWAY of a hard close.
    let stream = Rc::new(stream);
    let io = TokioIo::new(Replay {
        early,
        io: StreamIo(stream.clone()),
        flood: Flood::new(wire.clone()),
        out: Outgoing::default(),
    });
    let service = {
        let shared = shared.clone();
        hyper::service::service_fn(move |req| {
            // Counted open here, as hyper accepts the stream inside the connection's poll, and
            // not in the stream's task, which runs later: the connection's idle check in the
            // same poll must see it, or an idle time begun before it closes the connection
            // under it.
            let open = Open::new(&shared);
            let (parts, body) = req.into_parts();
            let exchange = Exchange::new(shared.clone(), parts, body, open);
            // The pipeline's future is hyper's service future itself.
            pipeline::run(shared.route.clone(), exchange)
        })
    };
    let conn = builder(&h2, &limits).serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut closing: Option<Closing> = None;
    let mut stall_timer: Option<Pin<Box<Sleep>>> = None;
    // Bounded by the connection: it ends when the client closes it, after the GOAWAY that an
    // idle timeout or a stop sends once its open streams are done, when a stream waited too
    // long for the client to take its response, or `GRACEFUL_CLOSE` after that GOAWAY with no
    // stream open.
    let ended = std::future::poll_fn(|cx| {
        let polled = conn.as_mut().poll(cx);
        if let Poll::Ready(r) = polled {
            return Poll::Ready(Ended::Conn(r));
        }
        if let Some(at) = shared.stalled_until() {
            if at <= tokio::time::Instant::now() {
                return Poll::Ready(Ended::Stalled);
            }
            let timer = stall_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if timer.deadline() != at {
                timer.as_mut().reset(at);
            }
            if timer.as_mut().poll(cx).is_ready() {
                // Checked again at once: that wait may have ended meanwhile.
                cx.waker().wake_by_ref();
            }
        }
        *shared.task.borrow_mut() = Some(cx.waker().clone());
        if closing.is_none()
            && slot
                .poll_close(
                    shared.open.get() == 0,
                    !shared.served.get(),
                    wire.greeted.get(),
                    reloads,
                    cx,
                )
                .is_ready()
        {
            debug!(client = %peer, "closing HTTP/2 connection (GOAWAY): idle, or making room, or a reload, or stopping");
            conn.as_mut().graceful_shutdown();
            slot.closing_began();
            if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                return Poll::Ready(Ended::Conn(r));
            }
            closing = Some(Closing { grace: None });
        }
        let idle = shared.open.get() == 0;
        let shaken = wire.greeted.get();
        if closing
            .as_mut()
            .is_some_and(|c| c.poll_over(idle, shaken, &slot, cx))
        {
            return Poll::Ready(Ended::Dropped);
        }
        Poll::Pending
    })
    .await;
    match ended {
        Ended::Conn(Ok(())) => {}
        Ended::Conn(Err(e)) => ended_with(&e, wire.flooded.get(), peer, stats.as_deref()),
        Ended::Stalled => {
            summed_warn!(client = %peer; "HTTP/2 connection closed: a stream's response waited longer than timeouts.client_idle for the client to take it");
        }
        Ended::Dropped => hard_close(&stream, &wire, peer).await,
    }
}

/// Ends a connection whose graceful close hyper did not end: the final GOAWAY, if no frame of
/// hyper's is cut short on the wire (it would land inside it), and the close (the caller drops
/// the connection).
async fn hard_close(stream: &Rc<DownstreamStream>, wire: &Wire, peer: SocketAddr) {
    let last = wire.last_stream.get();
    let sent = wire.whole.get() && final_goaway(stream, last).await;
    debug!(client = %peer, final_goaway = sent, last_stream = last, "HTTP/2 connection closed: no stream open {GRACEFUL_CLOSE:?} after its GOAWAY (its client never answered the PING), or room needed, or a stop");
}

/// The GOAWAY that ends a graceful close hyper did not end itself: with the real last stream
/// (the highest the client opened), `NO_ERROR`, as h2 sends once the PING's ACK came. Written
/// without waiting (a client that does not read cannot hold the close up): whether it went.
async fn final_goaway(stream: &Rc<DownstreamStream>, last: u32) -> bool {
    let mut frame = [0u8; 17];
    frame[2] = 8; // length
    frame[3] = GOAWAY_FRAME;
    frame[9..13].copy_from_slice(&(last & 0x7fff_ffff).to_be_bytes());
    let mut io = StreamIo(stream.clone());
    std::future::poll_fn(|cx| {
        let wrote = Pin::new(&mut io).poll_write(cx, &frame);
        let whole = matches!(wrote, Poll::Ready(Ok(n)) if n == frame.len());
        // A TLS record waiting for room is dropped with the connection.
        let _ = Pin::new(&mut io).poll_flush(cx);
        Poll::Ready(whole)
    })
    .await
}

/// GOAWAY's frame type (RFC 9113 §6.8).
const GOAWAY_FRAME: u8 = 0x7;

/// How long a connection in its graceful close may stay open with no stream, after the GOAWAY
/// or after its last stream ended, before it is dropped. hyper's graceful close sends GOAWAY
/// and a PING, and ends the connection once the PING's ACK came and the open streams are done;
/// a client that never answers (or never reads) would hold the connection, and its place
/// under `limits.max_connections`, for ever. The ACK takes one round trip: 2 s is many times
/// any real one, and it leaves hyper room to flush the last responses.
pub(crate) const GRACEFUL_CLOSE: Duration = Duration::from_secs(2);

/// How [`serve`]'s connection ended.
enum Ended {
    /// hyper ended it (the client closed it, or after the graceful close, or an error).
    Conn(Result<(), hyper::Error>),
    /// A stream's response waited too long for the client to take it.
    Stalled,
    /// Its graceful close did not end in time with no stream open, or room was needed, or a
    /// stop began.
    Dropped,
}

/// A connection past its GOAWAY.
struct Closing {
    /// Armed while no stream is open: `GRACEFUL_CLOSE` from the GOAWAY or the last stream's end.
    grace: Option<Pin<Box<Sleep>>>,
}

impl Closing {
    /// Whether to drop the connection now: no stream open (`idle`), and the grace is over or
    /// the slot says to close (room needed under `max_connections`, or a stop, as for any idle
    /// connection).
    fn poll_over<P: AsFd>(
        &mut self,
        idle: bool,
        shaken: bool,
        slot: &idle::Slot<P>,
        cx: &mut Context<'_>,
    ) -> bool {
        let close = slot.poll_closing(idle, shaken, cx).is_ready();
        if !idle {
            self.grace = None;
            return false;
        }
        let grace = self
            .grace
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(GRACEFUL_CLOSE)));
        close || grace.as_mut().poll(cx).is_ready()
    }
}

/// hyper's HTTP/2 server as the listener's `[listener.http2]` and `[limits]` set it.
fn builder(h2: &Http2, limits: &Limits) -> hyper::server::conn::http2::Builder<LocalExec> {
    let mut builder = hyper::server::conn::http2::Builder::new(LocalExec);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(h2.max_concurrent_streams)
        .initial_stream_window_size(h2.initial_stream_window)
        .initial_connection_window_size(h2.initial_connection_window)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_send_buf_size(MAX_SEND_BUF)
        .keep_alive_interval(h2.ping_interval)
        .keep_alive_timeout(h2.ping_timeout);
    builder
}

/// Logs and counts how a connection ended with an error: a protocol error of the client's, for
/// which hyper sent GOAWAY, is counted (a flood of SETTINGS or PING too); a connection that
/// broke is the network's.
fn ended_with(e: &hyper::Error, flooded: bool, peer: SocketAddr, stats: Option<&ListenerStats>) {
    let protocol = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<h2::Error>())
        .is_some_and(|h| !h.is_io());
    if flooded {
        summed_warn!(client = %peer; "HTTP/2 connection closed (GOAWAY): over {FLOOD_FRAMES} SETTINGS or PING frames within {FLOOD_WINDOW:?}");
    } else if protocol {
        summed_warn!(client = %peer; "HTTP/2 connection closed (GOAWAY): {e}");
    } else {
        debug!(client = %peer, "HTTP/2 connection ended: {e}");
        return;
    }
    if let Some(s) = stats {
        s.http2_errors.fetch_add(1, Ordering::Relaxed);
    }
}

impl Shared {
    /// A stream whose head pinlb can't serve (malformed, too large): answered, counted and
    /// not logged, as a broken HTTP/1.1 head is; the connection and its other streams go on.
    fn refuse(
        &self,
        plan: &Plan,
        method: &Method,
        e: ClientError,
        open: Option<Open>,
    ) -> Response<ResponseBody> {
        let status = e.status();
        summed_warn!(client = %self.peer; "answered {}: {e}", status.as_u16());
        let page = Bytes::from(error_page(status, &e));
        let mut headers = ERROR_PAGE_TYPE.to_vec();
        if method == Method::HEAD {
            crate::http1::common::content_length_line(&mut headers, page.len() as u64);
        }
        let mut reply = Reply {
            status,
            headers,
            body: ProxyBody::Local(Some(if method == Method::HEAD {
                Bytes::new()
            } else {
                page
            })),
        };
        // The listener's page: no route has seen the request.
        plan.error_page(&mut reply, None, method);
        if let Some(s) = &self.route.stats {
            s.response(status, Source::Pinlb);
        }
        self.respond(plan, reply, method, Logged::new(None), Duration::MAX, open)
    }

    /// The proxy's answer as an HTTP/2 response. A body that can't have content (HEAD, 204,
    /// 304) is dropped at once, which releases its backend connection.
    fn respond(
        &self,
        plan: &Plan,
        reply: Reply<ProxyBody>,
        method: &Method,
        logged: Logged,
        timeout: Duration,
        open: Option<Open>,
    ) -> Response<ResponseBody> {
        let Reply {
            status,
            headers,
            body,
        } = reply;
        let bodiless = method == Method::HEAD
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let mut map = header_map(&headers);
        if !body.has_date() {
            map.insert(DATE, self.slot_date());
        }
        let body = if bodiless {
            drop(body);
            None
        } else {
            if let Some(n) = body.remaining() {
                map.insert(CONTENT_LENGTH, HeaderValue::from(n));
            }
            Some(body)
        };
        let stall = Rc::new(Stall {
            since: Cell::new(None),
            limit: plan.upstream.shared.config.timeouts.client_idle,
        });
        if body.is_some() {
            self.stalls.borrow_mut().push(Rc::downgrade(&stall));
        }
        let mut response = Response::new(ResponseBody {
            body,
            logged,
            timeout,
            timer: None,
            armed: false,
            peer: self.peer,
            stall,
            _open: open,
        });
        *response.status_mut() = status;
        *response.headers_mut() = map;
        response
    }

    fn slot_date(&self) -> HeaderValue {
        (self.date)()
    }
}

/// The HTTP/1.1 head an HTTP/2 request stands for (RFC 9113 §8.3.1): the request line from
/// `:method` and `:path`, Host from `:authority` (or the Host field), the header fields as
/// they came with the Cookie fields joined into one (§8.2.3), and the framing: the client's
/// Content-Length, or chunked for a body of unknown length. `http1::request` then checks it
/// and drops what does not go upstream, as for any client's head.
fn http1_head(parts: &http::request::Parts, ended: bool, limits: &Limits) -> BytesMut {
    let mut out = BytesMut::with_capacity(512.min(limits.max_header_bytes));
    out.put_slice(parts.method.as_str().as_bytes());
    out.put_u8(b' ');
    let target = match parts.uri.path_and_query() {
        Some(p) if !p.as_str().is_empty() => p.as_str(),
        // A CONNECT names only an authority (RFC 9113 §8.5), refused as HTTP/1.1's is: pinlb
        // does not tunnel to where a client asks.
        _ if parts.method == Method::CONNECT => parts.uri.authority().map_or("", |a| a.as_str()),
        _ => "/",
    };
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    // Without `:authority` the Host field, if any, stands (§8.3.1).
    if let Some(a) = authority {
        out.put_slice(b"host: ");
        out.put_slice(a);
        out.put_slice(b"\r\n");
    }
    let mut cookies = parts.headers.get_all(COOKIE).iter().peekable();
    if cookies.peek().is_some() {
        out.put_slice(b"cookie: ");
        for (i, c) in cookies.enumerate() {
            if i > 0 {
                out.put_slice(b"; ");
            }
            out.put_slice(c.as_bytes());
        }
        out.put_slice(b"\r\n");
    }
    let mut length = false;
    for (name, value) in &parts.headers {
        if name == COOKIE || (name == HOST && authority.is_some()) {
            continue;
        }
        length |= name == CONTENT_LENGTH;
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    if !ended && !length {
        out.put_slice(b"transfer-encoding: chunked\r\n");
    }
    out.put_slice(b"\r\n");
    out
}

/// A stream's request body, as the proxy reads it.
struct RequestBody {
    body: Incoming,
    framing: RequestFraming,
    done: bool,
    /// The client's trailers, for an HTTP/2 backend.
    trailers: Option<http::HeaderMap>,
}

impl DownstreamBody for RequestBody {
    fn framing(&self) -> RequestFraming {
        self.framing
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        self.trailers.take()
    }

    /// The next piece of the body. Its trailers are kept for an HTTP/2 backend; an HTTP/1.1
    /// backend does not get them (pinlb sends no trailer section in a chunked body).
    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        use http_body_util::BodyExt;
        // Bounded by the body: every pass takes a frame of it, or ends.
        loop {
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                None => {
                    self.done = true;
                    return Ok(None);
                }
                Some(Ok(frame)) => {
                    match frame.into_data() {
                        Ok(data) if !data.is_empty() => return Ok(Some(data)),
                        Ok(_) => {}
                        Err(frame) => self.trailers = frame.into_trailers().ok(),
                    }
                    if self.body.is_end_stream() {
                        self.done = true;
                        return Ok(None);
                    }
                }
                Some(Err(e)) => {
                    return Err(ClientError::BodyBrokeOff(
                        format!("HTTP/2 stream: {e}").into(),
                    ));
                }
            }
        }
    }
}

/// A stream's response body: the proxy's, each wait for its next piece bounded by
/// `timeouts.response`, as an HTTP/1.1 response's is. An error resets the stream, as a
/// response cut short resets an HTTP/1.1 connection.
pub(crate) struct ResponseBody {
    body: Option<ProxyBody>,
    logged: Logged,
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// The timer runs for the current wait.
    armed: bool,
    peer: SocketAddr,
    stall: Rc<Stall>,
    /// The stream counted open until the response is done (`None` only for a second answer
    /// to one request, which the pipeline never makes).
    _open: Option<Open>,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = UpstreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamError>>> {
        let this = self.get_mut();
        // Asked again: the last piece went.
        this.stall.since.set(None);
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        match body.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => {
                this.armed = false;
                this.logged.sent(data.len());
                this.stall.since.set(Some(tokio::time::Instant::now()));
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(e))) => {
                summed_warn!(client = %this.peer; "response aborted: {e}");
                this.body = None;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                // Dropped now: the backend connection goes back to the pool. The trailers of an
                // HTTP/2 backend (a gRPC status) end the stream.
                let trailers = body.take_trailers();
                this.body = None;
                Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))))
            }
            Poll::Pending => {
                if !this.armed {
                    this.armed = true;
                    let now = tokio::time::Instant::now();
                    let at = now.checked_add(this.timeout).unwrap_or(now + YEARS);
                    match this.timer.as_mut() {
                        Some(t) => t.as_mut().reset(at),
                        None => this.timer = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                match this.timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                    Some(Poll::Ready(())) => {
                        summed_warn!(client = %this.peer; "response aborted: the backend sent no more of the body within {:?} (timeouts.response)", this.timeout);
                        this.body = None;
                        Poll::Ready(Some(Err(UpstreamError::Timeout)))
                    }
                    _ => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.body.as_ref().map(ProxyBody::remaining) {
            None => SizeHint::with_exact(0),
            Some(Some(n)) => SizeHint::with_exact(n),
            Some(None) => SizeHint::default(),
        }
    }
}

/// A timeout too large to add is as good as none.
const YEARS: Duration = Duration::from_secs(86_400 * 365 * 30);

/// A connection's byte stream, with what was read off it before it was known to be HTTP/2
/// replayed first, and the client's frames watched for a flood on the way in.
struct Replay<S> {
    early: Bytes,
    io: S,
    flood: Flood,
    out: Outgoing,
}

/// What a connection's byte stream has shown of its frames, for [`serve`].
struct Wire {
    /// Over [`FLOOD_FRAMES`] SETTINGS or PING frames came within [`FLOOD_WINDOW`].
    flooded: Cell<bool>,
    /// A whole frame header came after the client's preface (its SETTINGS): the handshake is
    /// done, and pinlb's SETTINGS went before (h2 sends them before it reads the preface).
    greeted: Cell<bool>,
    /// The highest stream the client opened (its HEADERS frames'), for the final GOAWAY.
    last_stream: Cell<u32>,
    /// pinlb's frames went out whole: a frame written now would not land inside another.
    whole: Cell<bool>,
}

impl Default for Wire {
    fn default() -> Wire {
        Wire {
            flooded: Cell::new(false),
            greeted: Cell::new(false),
            last_stream: Cell::new(0),
            whole: Cell::new(true),
        }
    }
}

/// Follows the frames hyper writes (their headers' lengths) to know where one ends.
#[derive(Default)]
struct Outgoing {
    /// Header bytes of the current frame seen so far, and its length's bytes.
    have: usize,
    len: [u8; 3],
    /// Payload bytes of the current frame still to go.
    skip: usize,
}

impl Outgoing {
    /// Follows `bytes`, written: whether the last frame in them ended.
    fn wrote(&mut self, mut bytes: &[u8]) -> bool {
        // Bounded by `bytes`: every pass takes at least one byte of it.
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            if self.have < 3 {
                self.len[self.have] = bytes[0];
            }
            self.have += 1;
            bytes = &bytes[1..];
            if self.have == 9 {
                self.have = 0;
                self.skip = usize::from(self.len[0]) << 16
                    | usize::from(self.len[1]) << 8
                    | usize::from(self.len[2]);
            }
        }
        self.have == 0 && self.skip == 0
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let from = out.filled().len();
        if !self.early.is_empty() {
            let n = self.early.len().min(out.remaining());
            let early = self.early.split_to(n);
            out.put_slice(&early);
        } else {
            std::task::ready!(Pin::new(&mut self.io).poll_read(cx, out))?;
        }
        self.flood.watch(&mut out.filled_mut()[from..]);
        Poll::Ready(Ok(()))
    }
}

/// SETTINGS and PING frames (not ACKs) a client may send within [`FLOOD_WINDOW`]. A client
/// sends SETTINGS once or twice and PINGs seconds apart (gRPC keep-alive: 10 s at the
/// least); h2 answers each with an ACK before it reads on, so a flood costs an answer per
/// frame and no memory, but it has no limit of its own (hyper's SETTINGS flood test showed
/// 100,000 ACKed).
const FLOOD_FRAMES: u32 = 100;
const FLOOD_WINDOW: Duration = Duration::from_secs(1);

/// Watches the client's frame headers go by (RFC 9113 §4.1) for more than [`FLOOD_FRAMES`]
/// SETTINGS or PING frames within [`FLOOD_WINDOW`]. The frame that goes over is handed to h2
/// with its stream id made non-zero, which h2 answers as the protocol error that is (§6.5,
/// §6.7): GOAWAY with PROTOCOL_ERROR, and the connection closes through h2's own path, its
/// frames whole, counted in `pinlb_http2_protocol_errors`.
struct Flood {
    /// Preface bytes still to pass before the first frame.
    preface: usize,
    /// The current frame header, as far as it has come.
    head: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
    /// The current frame goes over the limit: its stream id is rewritten as it passes.
    poison: bool,
    window: Option<tokio::time::Instant>,
    count: u32,
    /// Where a flood, the end of the handshake and the streams opened are told.
    wire: Rc<Wire>,
}

impl Flood {
    fn new(wire: Rc<Wire>) -> Flood {
        Flood {
            preface: PREFACE_LEN,
            head: [0; 9],
            have: 0,
            skip: 0,
            poison: false,
            window: None,
            count: 0,
            wire,
        }
    }

    fn watch(&mut self, mut bytes: &mut [u8]) {
        // Bounded by `bytes`: every pass takes at least one byte of it.
        while !bytes.is_empty() {
            let pass = if self.preface > 0 {
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                n
            } else if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                n
            } else {
                self.header_byte(&mut bytes[0]);
                1
            };
            bytes = &mut bytes[pass..];
        }
    }

    fn header_byte(&mut self, b: &mut u8) {
        const SETTINGS: u8 = 0x4;
        const PING: u8 = 0x6;
        const ACK: u8 = 0x1;
        if self.have == 8 && self.poison {
            *b |= 1;
        }
        self.head[self.have] = *b;
        self.have += 1;
        match self.have {
            5 => {
                let (kind, flags) = (self.head[3], self.head[4]);
                if (kind == SETTINGS || kind == PING) && flags & ACK == 0 {
                    self.poison = self.over();
                }
            }
            9 => {
                const HEADERS: u8 = 0x1;
                self.wire.greeted.set(true);
                if self.head[3] == HEADERS {
                    let id = u32::from_be_bytes([
                        self.head[5],
                        self.head[6],
                        self.head[7],
                        self.head[8],
                    ]) & 0x7fff_ffff;
                    if id > self.wire.last_stream.get() {
                        self.wire.last_stream.set(id);
                    }
                }
                self.skip = usize::from(self.head[0]) << 16
                    | usize::from(self.head[1]) << 8
                    | usize::from(self.head[2]);
                self.have = 0;
                self.poison = false;
            }
            _ => {}
        }
    }

    /// Counts one SETTINGS or PING: whether it goes over the limit.
    fn over(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        match self.window {
            Some(start) if now.duration_since(start) < FLOOD_WINDOW => self.count += 1,
            _ => (self.window, self.count) = (Some(now), 1),
        }
        let over = self.count > FLOOD_FRAMES;
        if over {
            self.wire.flooded.set(true);
        }
        over
    }
}

/// The client connection preface (RFC 9113 §3.4).
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The client preface's length.
const PREFACE_LEN: usize = PREFACE.len();

/// What a connection whose preface is wrong gets before it is closed. RFC 9113 §3.4 makes that
/// a connection error of type PROTOCOL_ERROR: pinlb's SETTINGS (the server's preface, which
/// comes first), then a GOAWAY with last stream 0 and PROTOCOL_ERROR (1). h2, which reads the
/// preface of the connections hyper serves, closes without the GOAWAY (the RFC allows it);
/// pinlb says why, as HAProxy does, so h2spec's 3.5/2 passes over h2c too.
pub(crate) const PREFACE_REFUSED: [u8; 26] = [
    0,
    0,
    0,
    SETTINGS_FRAME,
    0,
    0,
    0,
    0,
    0, // SETTINGS, empty
    0,
    0,
    8,
    GOAWAY_FRAME,
    0,
    0,
    0,
    0,
    0, // GOAWAY on stream 0, 8 bytes:
    0,
    0,
    0,
    0, // last stream 0
    0,
    0,
    0,
    1, // PROTOCOL_ERROR
];

/// SETTINGS' frame type (RFC 9113 §6.5).
const SETTINGS_FRAME: u8 = 0x4;

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let wrote = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, data));
        if let Ok(n) = wrote {
            let whole = self.out.wrote(data.get(..n).unwrap_or(data));
            self.flood.wire.whole.set(whole);
        }
        Poll::Ready(wrote)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(req: Request<()>) -> http::request::Parts {
        req.into_parts().0
    }

    /// The head `req` stands for, through the HTTP/1.1 parser.
    fn parsed(req: Request<()>) -> Result<RequestHead, ClientError> {
        let mut text = http1_head(&parts(req), true, &Limits::default());
        parse_request(&mut text, &Default::default()).map(|h| h.expect("a whole head"))
    }

    #[test]
    fn authority_becomes_host_and_cookies_are_joined() {
        let req = Request::builder()
            .method("GET")
            .uri("https://example.com:8443/a?b=c")
            .header("cookie", "a=1")
            .header("x-one", "1")
            .header("cookie", "b=2")
            .body(())
            .unwrap();
        let head = http1_head(&parts(req), true, &Limits::default());
        assert_eq!(
            &head[..],
            b"GET /a?b=c HTTP/1.1\r\nhost: example.com:8443\r\ncookie: a=1; b=2\r\nx-one: 1\r\n\r\n"
        );
    }

    #[test]
    fn a_body_without_a_length_goes_chunked_and_one_with_keeps_it() {
        let req = Request::post("http://a/up").body(()).unwrap();
        let head = http1_head(&parts(req), false, &Limits::default());
        assert!(head.ends_with(b"host: a\r\ntransfer-encoding: chunked\r\n\r\n"));
        let req = Request::post("http://a/up")
            .header("content-length", "5")
            .body(())
            .unwrap();
        let mut head = http1_head(&parts(req), false, &Limits::default());
        let parsed = parse_request(&mut head, &Default::default())
            .unwrap()
            .unwrap();
        assert_eq!(parsed.body, RequestFraming::Length(5));
    }

    #[test]
    fn the_head_goes_through_the_http1_rules() {
        // A Host field beside :authority is dropped; hop-by-hop fields never reach a backend.
        let req = Request::get("http://a/")
            .header("host", "evil")
            .header("te", "trailers")
            .header("x-forwarded-for", "1.2.3.4")
            .body(())
            .unwrap();
        let head = parsed(req).unwrap();
        assert_eq!(head.host(), Some(&b"a"[..]));
        assert_eq!(head.lines(), b"");
        assert_eq!(head.forwarded_for.as_deref(), Some(&b"1.2.3.4"[..]));
    }

    #[test]
    fn a_connect_is_refused_as_an_http1_one_is() {
        let mut req = Request::builder().method("CONNECT").body(()).unwrap();
        *req.uri_mut() = "example.com:443".parse().unwrap();
        assert_eq!(parsed(req).unwrap_err().status(), 400);
    }

    #[test]
    fn without_authority_the_host_field_stands() {
        let mut req = Request::get("/x")
            .header("host", "b.test")
            .body(())
            .unwrap();
        *req.uri_mut() = "/x".parse().unwrap();
        assert_eq!(parsed(req).unwrap().host(), Some(&b"b.test"[..]));
    }

    /// A SETTINGS frame (or its ACK), its stream id's last byte at 8.
    fn settings(ack: bool) -> [u8; 15] {
        [0, 0, 6, 4, u8::from(ack), 0, 0, 0, 0, 0, 4, 0, 0, 255, 255]
    }

    #[test]
    fn the_frame_over_the_flood_limit_gets_a_stream_id_whatever_the_reads() {
        for piece in [1, 7, 4096] {
            let seen = Rc::new(Wire::default());
            let mut flood = Flood::new(seen.clone());
            let mut bytes = vec![b'P'; PREFACE_LEN];
            // ACKs do not count, and a DATA payload that looks like SETTINGS is not read as
            // one: were either counted, the 100th would be the one over.
            bytes.extend(settings(true));
            bytes.extend([0, 0, 15, 0, 0, 0, 0, 0, 1]);
            bytes.extend(settings(false));
            for _ in 0..=FLOOD_FRAMES {
                bytes.extend(settings(false));
            }
            let n = FLOOD_FRAMES as usize;
            let at = |n: usize| PREFACE_LEN + 15 + 9 + 15 + n * 15;
            for chunk in bytes.chunks_mut(piece) {
                flood.watch(chunk);
            }
            assert!(seen.flooded.get(), "pieces of {piece}");
            assert_eq!(bytes[at(n - 1) + 8], 0, "the 100th is allowed");
            assert_eq!(bytes[at(n) + 8], 1, "the 101st goes to h2 as an error");
        }
        let seen = Rc::new(Wire::default());
        let mut flood = Flood::new(seen.clone());
        let mut bytes = vec![b'P'; PREFACE_LEN];
        for _ in 0..FLOOD_FRAMES {
            bytes.extend(settings(false));
        }
        assert!(!seen.greeted.get(), "the preface alone is no handshake");
        flood.watch(&mut bytes);
        assert!(!seen.flooded.get());
        assert!(seen.greeted.get(), "a frame after the preface");
    }

    #[test]
    fn the_highest_stream_opened_and_where_written_frames_end_are_followed() {
        let wire = Rc::new(Wire::default());
        let mut flood = Flood::new(wire.clone());
        let mut bytes = vec![b'P'; PREFACE_LEN];
        bytes.extend(settings(false));
        // HEADERS on 5, then on 3 (lower: not the last), then DATA on 7 (no stream opened).
        bytes.extend([0, 0, 1, 1, 4, 0, 0, 0, 5, 0x82]);
        bytes.extend([0, 0, 1, 1, 4, 0, 0, 0, 3, 0x82]);
        bytes.extend([0, 0, 1, 0, 0, 0, 0, 0, 7, 0]);
        for chunk in bytes.chunks_mut(5) {
            flood.watch(chunk);
        }
        assert_eq!(wire.last_stream.get(), 5);
        let mut out = Outgoing::default();
        let goaway = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(!out.wrote(&goaway[..4]), "a header cut short");
        assert!(!out.wrote(&goaway[4..12]), "a payload cut short");
        assert!(out.wrote(&goaway[12..]));
        let mut two = goaway.to_vec();
        two.extend(settings(true));
        assert!(out.wrote(&two));
        assert!(!out.wrote(&two[..20]));
    }
}
