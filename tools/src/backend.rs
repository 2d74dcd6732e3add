//! `pinlb backend`: pinned test backends, the hello-world servers people benchmark behind a
//! balancer.
//!
//! One server per listen address, each on a thread of its own with a single-threaded tokio
//! runtime, pinned to one core, all in one process. A server answers every request with the same
//! status and body; `work` burns CPU per request (a busy loop until the thread has used that
//! much CPU time, like a business loop) and `delay` waits without CPU (like a database call).
//! `/health` always answers 200 at once.
//!
//! These servers must never be the bottleneck of a measurement: on one core they serve at least
//! 0.9× the rate of an nginx `return 200` worker (`benches/backend.sh`). So a connection is a
//! hand-written HTTP/1.1 loop rather than hyper: requests are parsed in place with `httparse`,
//! the responses are pre-built bytes copied into one output buffer per batch of pipelined
//! requests, and the request path allocates nothing, reads no clock, takes no lock, touches no
//! cache line another core writes, and keeps connections alive. Request bodies are read and
//! dropped (Content-Length or chunked, with `100 Continue` when asked); a malformed request gets
//! a 400 and the connection closes.
//!
//! A `GET` on any path (but `/health`) with `Upgrade: websocket` and `Connection: upgrade` is a
//! WebSocket echo: it is answered `101 Switching Protocols` with its `Sec-WebSocket-Accept`, and
//! from then on every text or binary message is sent back as it came, pings are answered with
//! pongs and a close with a close. The handshake is parsed here like any request; the frames are
//! `tokio-tungstenite`'s (see [`echo`]). The upgrade counts as one request; the messages don't.
//!
//! A request with an `x-pinlb-accepted` header (any value) gets one back saying how many
//! connections its server has accepted so far, after the server's address:
//! `x-pinlb-accepted: 127.0.0.1:8881 17`. A proxy passes both on, so `pinlb bench`'s fairness
//! checks read through any proxy whether it opens a backend connection per request (no
//! keep-alive). Requests without the header pay one more header-name comparison, no more.
//!
//! Stopping is nginx's fast shutdown (its SIGTERM): the listening sockets close and open
//! connections are dropped, in-flight requests included. A test backend has nothing to finish.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tracing::{debug, error, info, warn};

use crate::bench::wire::{BodyDecoder, Chunked};
use crate::fairness::ACCEPTED;
use pinlb::http1::common::{ConnectionTokens, ContentLength, Hop, final_coding_chunked};
use pinlb::server::Signals;
use pinlb::sys::cpus::{allowed_cpus, format_cpu_list, parse_cpu_list, pin_current_thread};
use pinlb::sys::runtime::{self, PinnedError};

/// What to run: the servers, where they run and how they answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// One server per address, in this order; port 0 gets a free port from the kernel.
    pub listen: Vec<SocketAddr>,
    /// One core for every server, or one per server in `listen` order. Empty: the cores this
    /// process may run on, assigned round robin.
    pub cpus: Vec<usize>,
    /// Response body size in bytes ("hello world\n" repeated and cut to size).
    pub body: usize,
    /// Response status, 200-599; `/health` answers 200 whatever this is.
    pub status: u16,
    /// CPU burnt per request (busy loop).
    pub work: Duration,
    /// Time waited per request without CPU.
    pub delay: Duration,
}

impl Default for BackendSpec {
    fn default() -> Self {
        BackendSpec {
            listen: Vec::new(),
            cpus: Vec::new(),
            body: HELLO.len(),
            status: 200,
            work: Duration::ZERO,
            delay: Duration::ZERO,
        }
    }
}

impl BackendSpec {
    /// The core each server runs on, in `listen` order, checked against the cores this process
    /// may run on.
    pub fn cores(&self) -> Result<Vec<usize>, BackendError> {
        let allowed = allowed_cpus().map_err(BackendError::AllowedCpus)?;
        assign_cores(self.listen.len(), &self.cpus, &allowed)
    }
}

/// Errors that stop the backends from starting.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("no address to listen on")]
    NoListen,
    #[error(
        "{cpus} cores listed for {servers} {}: list one core for all of them, or one per listen address",
        if *servers == 1 { "server" } else { "servers" }
    )]
    CoreCount { cpus: usize, servers: usize },
    #[error("core {core} is not one this process may run on (allowed: {allowed})")]
    CoreNotAllowed { core: usize, allowed: String },
    #[error("cannot read the cores this process may run on: {0}")]
    AllowedCpus(nix::Error),
    #[error("status {0} is not allowed: expected 200-599")]
    Status(u16),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot pin backend {server} to core {core}: {source}")]
    Pin {
        server: usize,
        core: usize,
        source: nix::Error,
    },
    #[error("cannot start backend {server}: {source}")]
    Thread {
        server: usize,
        source: std::io::Error,
    },
    #[error("a backend thread panicked while starting")]
    Panicked,
    #[error("body size {0} bytes does not fit in memory here")]
    BodyTooLarge(u64),
}

/// The default body, and the pattern longer or shorter bodies are cut from.
const HELLO: &[u8] = b"hello world\n";

/// Running servers, one pinned thread each. Dropping it stops them, like [`Backends::stop`].
pub struct Backends {
    /// Bound addresses, port 0 resolved, in `listen` order.
    addrs: Vec<SocketAddr>,
    /// The core of each server.
    cores: Vec<usize>,
    /// Requests answered by each server. One per server, each on its own cache line, so that two
    /// servers on two cores never write the same line.
    counters: Vec<Arc<Counter>>,
    /// Set to true to stop every server. A watch wakes receivers on any runtime, so one send
    /// reaches all the servers' threads.
    stop: watch::Sender<bool>,
    /// Emptied by the first stop; `Drop` then has nothing left to join.
    threads: Vec<JoinHandle<()>>,
    /// Each server's thread ID, in `listen` order: what `pinlb demo` reads its CPU time by.
    tids: Vec<u32>,
}

/// A request counter alone on its cache line (128 bytes: adjacent-line prefetchers pair lines).
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicU64);

impl Counter {
    /// Only the server's own thread writes its counter, so a plain load and store is exact and
    /// avoids a locked read-modify-write on every request.
    fn bump(&self) {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store(n + 1, Ordering::Relaxed);
    }
}

impl Backends {
    /// Binds every address first, so a taken port fails before any thread starts; then starts one
    /// thread per server and returns once each is pinned to its core and accepting.
    pub fn start(spec: &BackendSpec) -> Result<Backends, BackendError> {
        if spec.listen.is_empty() {
            return Err(BackendError::NoListen);
        }
        let status = match StatusCode::from_u16(spec.status) {
            Ok(s) if (200..=599).contains(&spec.status) => s,
            _ => return Err(BackendError::Status(spec.status)),
        };
        let cores = spec.cores()?;
        let mut listeners = Vec::with_capacity(spec.listen.len());
        let mut addrs = Vec::with_capacity(spec.listen.len());
        for &address in &spec.listen {
            let bound = listen(address).and_then(|l| Ok((l.local_addr()?, l)));
            let (addr, listener) =
                bound.map_err(|source| BackendError::Bind { address, source })?;
            addrs.push(addr);
            listeners.push(listener);
        }

        let (stop, stopped) = watch::channel(false);
        let mut backends = Backends {
            addrs,
            cores: cores.clone(),
            counters: Vec::with_capacity(listeners.len()),
            stop,
            threads: Vec::with_capacity(listeners.len()),
            tids: vec![0; listeners.len()],
        };
        // Each thread reports once it is pinned and serving (or why it is not), so that `start`
        // returning Ok means every server is up on its core.
        let (ready_tx, ready_rx) = mpsc::channel();
        for (server, (listener, core)) in listeners.into_iter().zip(cores).enumerate() {
            let counter = Arc::new(Counter::default());
            backends.counters.push(counter.clone());
            let answer = Answer {
                status,
                body: body_of(spec.body),
                work: spec.work,
                delay: spec.delay,
                counter,
            };
            let stopped = stopped.clone();
            let ready = ready_tx.clone();
            // Linux keeps 15 bytes of a thread's name: `pinlb-be` leaves room for 7 digits.
            let spawned = std::thread::Builder::new()
                .name(format!("pinlb-be{server}"))
                .spawn(move || server_main(server, core, listener, answer, stopped, ready));
            match spawned {
                Ok(t) => backends.threads.push(t),
                // Dropping `backends` stops and joins the threads already started.
                Err(source) => return Err(BackendError::Thread { server, source }),
            }
        }
        drop(ready_tx);
        for _ in 0..backends.threads.len() {
            match ready_rx.recv() {
                Ok(Ok((server, tid))) => backends.tids[server] = tid,
                Ok(Err(e)) => return Err(e),
                // Every sender is gone without a report: a thread panicked while starting.
                Err(_) => return Err(BackendError::Panicked),
            }
        }
        Ok(backends)
    }

    /// The bound addresses, port 0 resolved, in `listen` order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The core of each server, in `listen` order.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }

    /// The thread ID of each server, in `listen` order: its CPU time is its thread's.
    pub fn tids(&self) -> &[u32] {
        &self.tids
    }

    /// Requests answered so far by all servers, `/health` not counted.
    pub fn requests(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Stops accepting, closes every connection and joins the threads. A server busy with `work`
    /// finishes that request's loop first; one waiting out `delay` stops at once.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        for (server, t) in self.threads.drain(..).enumerate() {
            if t.join().is_err() {
                error!("backend {server} panicked");
            }
        }
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Which core each of `servers` servers runs on: `cpus[0]` for all, `cpus[i]` for server i, or,
/// with `cpus` empty, the allowed cores round robin.
fn assign_cores(
    servers: usize,
    cpus: &[usize],
    allowed: &[usize],
) -> Result<Vec<usize>, BackendError> {
    let allowed_list = || format_cpu_list(allowed);
    if let Some(&core) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(BackendError::CoreNotAllowed {
            core,
            allowed: allowed_list(),
        });
    }
    let pool = if cpus.is_empty() { allowed } else { cpus };
    if pool.is_empty() {
        return Err(BackendError::CoreNotAllowed {
            core: 0,
            allowed: allowed_list(),
        });
    }
    if !cpus.is_empty() && cpus.len() != 1 && cpus.len() != servers {
        return Err(BackendError::CoreCount {
            cpus: cpus.len(),
            servers,
        });
    }
    Ok((0..servers).map(|i| pool[i % pool.len()]).collect())
}

/// A body of `len` bytes: "hello world\n" repeated and cut.
fn body_of(len: usize) -> Bytes {
    HELLO
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect::<Vec<u8>>()
        .into()
}

fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    // Not SO_REUSEPORT: two backends must never share a port unnoticed. The backlog is that of
    // benches/peers/backend-nginx.conf, the server this one is measured against.
    pinlb::process::listen::listener(addr, false, 4096)
}

/// How one server answers, as `start` hands it to the server's thread, which turns it into its
/// [`Replies`].
struct Answer {
    status: StatusCode,
    /// Built once per server, not once for all: cloning bumps a reference count, and a count
    /// shared by servers on different cores would bounce its cache line between them.
    body: Bytes,
    work: Duration,
    delay: Duration,
    counter: Arc<Counter>,
}

fn server_main(
    server: usize,
    core: usize,
    listener: std::net::TcpListener,
    answer: Answer,
    mut stopped: watch::Receiver<bool>,
    ready: mpsc::Sender<Result<(usize, u32), BackendError>>,
) {
    let rt = match runtime::pinned(core) {
        Ok(rt) => rt,
        Err(PinnedError::Pin(source)) => {
            let _ = ready.send(Err(BackendError::Pin {
                server,
                core,
                source,
            }));
            return;
        }
        Err(PinnedError::Runtime(source)) => {
            let _ = ready.send(Err(BackendError::Thread { server, source }));
            return;
        }
    };
    let address = listener.local_addr().ok();
    let listener = {
        let _entered = rt.enter();
        match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(source) => {
                let _ = ready.send(Err(BackendError::Thread { server, source }));
                return;
            }
        }
    };
    let tid = u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0);
    let _ = ready.send(Ok((server, tid)));
    drop(ready);

    // Connections are spawned onto the runtime; the accept loop ends at stop, and dropping the
    // runtime then drops (closes) every connection.
    let replies = Rc::new(Replies::new(answer, address));
    rt.block_on(async move {
        tokio::select! {
            biased;
            // Err: the `Backends` is gone, which means stop too.
            _ = stopped.wait_for(|s| *s) => {}
            () = accept_loop(listener, replies.clone()) => {}
            () = keep_date(replies.clone()) => {}
        }
    });
    debug!("backend {server} stopped");
}

async fn accept_loop(listener: TcpListener, replies: Rc<Replies>) {
    loop {
        let (stream, peer) = pinlb::process::listen::accept(&listener).await;
        replies.accepted.set(replies.accepted.get() + 1);
        let replies = replies.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = serve(stream, &replies).await {
                debug!(client = %peer, "connection ended: {e}");
            }
        });
    }
}

/// Each connection's read buffer to start with; a request head that does not fit doubles it, up
/// to [`MAX_HEAD`].
const READ_BUF: usize = 4 * 1024;
/// Largest request head accepted (nginx's `large_client_header_buffers` is 4 × 8 KiB).
const MAX_HEAD: usize = 32 * 1024;
/// Most header lines accepted in a request head.
const MAX_HEADERS: usize = 64;
/// Bodies up to this size are copied into the connection's output buffer with their heads, so a
/// batch of pipelined responses goes out in one write; larger ones are written from the server's
/// one copy.
const COPY_BODY: usize = 16 * 1024;
/// `date: ` plus an IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`.
const DATE_LEN: usize = 29;

/// How one server answers, shared by its connections (on its one thread, hence `Rc` and `Cell`).
///
/// Every answer is the same bytes except the date, so the heads are built once and each
/// response is a few copies into the connection's output buffer: no allocation, no header map,
/// no per-request clock read.
struct Replies {
    /// `HTTP/1.1 {status}\r\ncontent-length: {len}\r\n` (no length for 204 and 304).
    head: Vec<u8>,
    body: Bytes,
    /// The same for `/health`: 200, `ok\n`.
    health_head: Vec<u8>,
    health_body: Bytes,
    /// The current HTTP date, rewritten once a second by [`keep_date`], not read per request.
    date: Cell<[u8; DATE_LEN]>,
    work: Duration,
    delay: Duration,
    counter: Arc<Counter>,
    /// Connections accepted so far, for `x-pinlb-accepted` (see the module's doc).
    accepted: Cell<u64>,
    /// The server's bound address, as `x-pinlb-accepted` names the server.
    address: String,
}

impl Replies {
    fn new(answer: Answer, address: Option<SocketAddr>) -> Replies {
        let no_body = matches!(answer.status.as_u16(), 204 | 304);
        let head = status_head(answer.status, (!no_body).then_some(answer.body.len()));
        Replies {
            head,
            body: if no_body { Bytes::new() } else { answer.body },
            health_head: status_head(StatusCode::OK, Some(3)),
            health_body: Bytes::from_static(b"ok\n"),
            date: Cell::new(http_date(SystemTime::now())),
            work: answer.work,
            delay: answer.delay,
            counter: answer.counter,
            accepted: Cell::new(0),
            address: address.map_or_else(|| "?".into(), |a| a.to_string()),
        }
    }

    /// Appends the response to `req` to `out`, and returns the body when it is too large to copy
    /// and must be written after `out`.
    fn append(&self, req: &Request, out: &mut Vec<u8>) -> Option<Bytes> {
        let (head, body) = if req.health {
            (&self.health_head, &self.health_body)
        } else {
            (&self.head, &self.body)
        };
        out.extend_from_slice(head);
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&self.date.get());
        out.extend_from_slice(b"\r\n");
        if req.report_accepted {
            let line = format!("{ACCEPTED}: {} {}\r\n", self.address, self.accepted.get());
            out.extend_from_slice(line.as_bytes());
        }
        match req.persist {
            Persist::KeepAlive => {}
            Persist::KeepAlive10 => out.extend_from_slice(b"connection: keep-alive\r\n"),
            Persist::Close => out.extend_from_slice(b"connection: close\r\n"),
        }
        out.extend_from_slice(b"\r\n");
        if req.head_only || body.is_empty() {
            None
        } else if body.len() <= COPY_BODY {
            out.extend_from_slice(body);
            None
        } else {
            Some(body.clone())
        }
    }
}

/// `HTTP/1.1 200 OK\r\ncontent-length: 12\r\n`: a status line and the length, if any.
fn status_head(status: StatusCode, len: Option<usize>) -> Vec<u8> {
    let reason = status.canonical_reason().unwrap_or("");
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", status.as_u16());
    if let Some(len) = len {
        head.push_str(&format!("content-length: {len}\r\n"));
    }
    head.into_bytes()
}

/// Rewrites the server's date at every second boundary: one timer per server, not per request.
async fn keep_date(replies: Rc<Replies>) {
    // Ends with the server: `server_main`'s select drops it at stop.
    loop {
        let into_second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let to_next = Duration::from_nanos(u64::from(1_000_000_000 - into_second.min(999_999_999)));
        tokio::time::sleep(to_next).await;
        replies.date.set(http_date(SystemTime::now()));
    }
}

/// `t` as an IMF-fixdate (RFC 9110 §5.6.7): `Sun, 06 Nov 1994 08:49:37 GMT`, by `httpdate`.
fn http_date(t: SystemTime) -> [u8; DATE_LEN] {
    let mut out = [b' '; DATE_LEN];
    let text = httpdate::fmt_http_date(t);
    // An IMF-fixdate is always DATE_LEN bytes; a date `httpdate` can't write that way is left
    // blank rather than cut.
    if text.len() == DATE_LEN {
        out.copy_from_slice(text.as_bytes());
    }
    out
}

/// Whether the connection stays open after a response, and what the response must say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Persist {
    /// HTTP/1.1 without `Connection: close`: open, nothing to say.
    KeepAlive,
    /// HTTP/1.0 with `Connection: keep-alive`: open, and the response must say so.
    KeepAlive10,
    /// Closed after the response, which says so.
    Close,
}

/// What the answer to one request depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    /// Bytes of the head, up to and including the empty line.
    len: usize,
    /// `/health`, whatever the query.
    health: bool,
    /// HEAD: the response has no body.
    head_only: bool,
    persist: Persist,
    /// Where the request body ends; `Length(0)` when there is none.
    body: BodyDecoder,
    /// `Expect: 100-continue`: the client waits for an interim response before sending the body.
    expect_continue: bool,
    /// A WebSocket handshake: the `Sec-WebSocket-Accept` its `101` carries.
    websocket: Option<[u8; ACCEPT_LEN]>,
    /// `x-pinlb-accepted`: the response says how many connections the server accepted.
    report_accepted: bool,
}

/// A `Sec-WebSocket-Accept` value: a SHA-1 digest in base64.
const ACCEPT_LEN: usize = 28;

/// A request that cannot be answered: `400`, or `431` for a head too large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadRequest {
    Malformed,
    TooLarge,
}

impl BadRequest {
    fn response(self) -> &'static [u8] {
        match self {
            BadRequest::Malformed => {
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            }
            BadRequest::TooLarge => {
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            }
        }
    }
}

/// Parses a request head at the start of `buf`: `Ok(None)` until it is complete.
///
/// Body framing follows RFC 9112 §6.3 for requests: `Transfer-Encoding` ending in `chunked` is
/// chunked (and wins over `Content-Length`, after which the connection closes, as the RFC
/// requires of such a message); any other transfer coding, or a bad or conflicting
/// `Content-Length`, is a 400; otherwise `Content-Length`; otherwise no body. HTTP/1.0 closes
/// unless it says `keep-alive`; HTTP/1.1 stays open unless it says `close`.
fn parse_request(buf: &[u8]) -> Result<Option<Request>, BadRequest> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(BadRequest::TooLarge),
        Err(_) => return Err(BadRequest::Malformed),
    };
    let http10 = req.version == Some(0);
    let connection = ConnectionTokens::scan(req.headers);
    let mut close = connection.close;
    let mut length = ContentLength::Absent;
    let mut chunked = None;
    let mut expect_continue = false;
    let mut upgrade_websocket = false;
    let mut ws_key = None;
    let mut ws_version_13 = false;
    let mut report_accepted = false;
    for h in req.headers.iter() {
        let name = h.name;
        match Hop::of(name.as_bytes()) {
            Some(Hop::TransferEncoding) => chunked = final_coding_chunked(chunked, h.value),
            None if name.eq_ignore_ascii_case("content-length") => {
                length = length.add(h.value, false);
            }
            None if name.eq_ignore_ascii_case("expect") => {
                expect_continue = h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
            }
            Some(Hop::Upgrade) => {
                upgrade_websocket |= h
                    .value
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"websocket"));
            }
            None if name.eq_ignore_ascii_case("sec-websocket-key") => {
                ws_key = Some(h.value.trim_ascii());
            }
            None if name.eq_ignore_ascii_case("sec-websocket-version") => {
                ws_version_13 = h.value.trim_ascii() == b"13";
            }
            None if name.eq_ignore_ascii_case(ACCEPTED) => report_accepted = true,
            _ => {}
        }
    }
    let length = match length {
        ContentLength::Absent => None,
        ContentLength::Valid(n) => Some(n),
        ContentLength::Invalid(_) => return Err(BadRequest::Malformed),
    };
    let body = match (chunked, length) {
        (Some(false), _) => return Err(BadRequest::Malformed),
        (Some(true), l) => {
            close |= l.is_some();
            BodyDecoder::Chunked(Chunked::Size { size: 0, digits: 0 })
        }
        (None, l) => BodyDecoder::Length(l.unwrap_or(0)),
    };
    let persist = if close || (http10 && !connection.keep_alive) {
        Persist::Close
    } else if http10 {
        Persist::KeepAlive10
    } else {
        Persist::KeepAlive
    };
    let path = req.path.unwrap_or_default();
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let health = path == "/health";
    // RFC 6455 §4.2.1: a GET over HTTP/1.1 with both Upgrade and Connection naming the upgrade,
    // a key and version 13. One that asks for websocket but lacks the rest is a 400; an Upgrade
    // to anything else is ignored, as RFC 9110 §7.8 lets a server do.
    let websocket = if upgrade_websocket && connection.names(b"upgrade") && !health {
        match (ws_key, ws_version_13, req.method, http10) {
            (Some(key), true, Some("GET"), false) if !key.is_empty() => {
                let accept = derive_accept_key(key);
                let mut out = [0; ACCEPT_LEN];
                if accept.len() != ACCEPT_LEN {
                    return Err(BadRequest::Malformed);
                }
                out.copy_from_slice(accept.as_bytes());
                Some(out)
            }
            _ => return Err(BadRequest::Malformed),
        }
    } else {
        None
    };
    Ok(Some(Request {
        len,
        health,
        head_only: req.method == Some("HEAD"),
        persist,
        body,
        expect_continue,
        websocket,
        report_accepted,
    }))
}

/// One client connection: its stream, the bytes read and not yet used, and the responses not yet
/// written.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// `buf[start..end]` is read and not yet used.
    start: usize,
    end: usize,
    out: Vec<u8>,
}

impl Conn {
    /// Writes the responses gathered so far, in one write when the socket takes them.
    async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Reads more: first writes what is gathered (the client may be waiting for it before it
    /// sends more), then moves the unused bytes to the front. `Ok(false)` at end of stream.
    async fn fill(&mut self) -> io::Result<bool> {
        self.flush().await?;
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            let grown = (self.buf.len() * 2).min(MAX_HEAD);
            if grown <= self.buf.len() {
                return Err(io::Error::other("request head too large"));
            }
            self.buf.resize(grown, 0);
        }
        let n = self.stream.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n > 0)
    }
}

/// Serves one connection: parses every request already read, gathers their responses, and writes
/// them in one go before it waits to read more, so a batch of pipelined requests costs one read
/// and one write. hyper did the same work with a task wake-up, a header map and a body poll per
/// request; this loop is the part of that a fixed answer needs, which is what lets one core keep
/// up with an nginx worker (`benches/backend.sh`).
async fn serve(stream: TcpStream, replies: &Replies) -> io::Result<()> {
    let mut c = Conn {
        stream,
        buf: vec![0; READ_BUF],
        start: 0,
        end: 0,
        out: Vec::with_capacity(512),
    };
    loop {
        let req = loop {
            match parse_request(&c.buf[c.start..c.end]) {
                Ok(Some(req)) => break req,
                Ok(None) if c.end - c.start < MAX_HEAD => {
                    if !c.fill().await? {
                        return c.flush().await;
                    }
                }
                Ok(None) => return refuse(&mut c, BadRequest::TooLarge).await,
                Err(bad) => return refuse(&mut c, bad).await,
            }
        };
        c.start += req.len;
        skip_body(&mut c, &req).await?;
        if let Some(accept) = req.websocket {
            replies.counter.bump();
            c.out.extend_from_slice(
                b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-accept: ",
            );
            c.out.extend_from_slice(&accept);
            c.out.extend_from_slice(b"\r\n\r\n");
            c.flush().await?;
            // A client may send its first frames right behind the handshake.
            let read = c.buf[c.start..c.end].to_vec();
            return echo(c.stream, read).await;
        }
        if !req.health {
            if !replies.delay.is_zero() {
                // Responses already gathered don't wait out this request's delay.
                c.flush().await?;
                tokio::time::sleep(replies.delay).await;
            }
            if !replies.work.is_zero() {
                burn(replies.work);
            }
            replies.counter.bump();
        }
        if let Some(body) = replies.append(&req, &mut c.out) {
            c.flush().await?;
            c.stream.write_all(&body).await?;
        }
        if req.persist == Persist::Close {
            c.flush().await?;
            return c.stream.shutdown().await;
        }
    }
}

/// A WebSocket connection after its `101`: every text and binary message goes back as it came,
/// one message per frame (a fragmented message is echoed whole, once its last fragment is in).
///
/// tungstenite does the protocol: unmasking, reassembly, UTF-8 checks, limits, and the replies
/// to pings and to a close, which it queues and writes on the next read. Per message that costs
/// one read, one frame parse, one payload allocation and one write, no more than the HTTP loop
/// above costs per request, so the echo is no bottleneck for a proxy in front of it either. Its
/// read buffer is this server's `READ_BUF`, not tungstenite's 128 KiB, so idle tunnels stay cheap.
async fn echo(stream: TcpStream, read: Vec<u8>) -> io::Result<()> {
    let config = WebSocketConfig::default().read_buffer_size(READ_BUF);
    let mut ws =
        WebSocketStream::from_partially_read(stream, read, Role::Server, Some(config)).await;
    while let Some(msg) = ws.next().await {
        match msg.map_err(io::Error::other)? {
            m @ (Message::Text(_) | Message::Binary(_)) => {
                ws.send(m).await.map_err(io::Error::other)?;
            }
            // Pongs and closes are tungstenite's to write; a raw frame is never read.
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) | Message::Frame(_) => {}
        }
    }
    Ok(())
}

/// Reads the request body to its end, dropping it, so the next request starts where it ends.
async fn skip_body(c: &mut Conn, req: &Request) -> io::Result<()> {
    let mut body = req.body;
    if body == BodyDecoder::Length(0) {
        return Ok(());
    }
    let mut continued = !req.expect_continue;
    loop {
        let fed = body
            .feed(&c.buf[c.start..c.end])
            .map_err(|_| io::Error::other("malformed chunked request body"))?;
        c.start += fed.used;
        if fed.done {
            return Ok(());
        }
        if !continued {
            c.out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            continued = true;
        }
        if !c.fill().await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// Answers a request that cannot be served, after the responses before it, and closes.
async fn refuse(c: &mut Conn, bad: BadRequest) -> io::Result<()> {
    c.out.extend_from_slice(bad.response());
    c.flush().await?;
    c.stream.shutdown().await
}

/// Keeps the core busy until this thread has run for `d` more of CPU time, as a request's own
/// computation would: on a core shared with other work it takes longer on the wall clock, not
/// less CPU. It blocks the server's thread on purpose: that is what a request that needs CPU
/// does to a single-threaded server. Without the thread's CPU clock (never on Linux), it spins
/// for `d` on the monotonic clock.
fn burn(d: Duration) {
    let cpu = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
            .ok()
            .map(Duration::from)
    };
    match cpu() {
        Some(start) => {
            // Bounded: the thread's CPU time grows while it spins.
            while cpu().is_some_and(|now| now.saturating_sub(start) < d) {
                std::hint::spin_loop();
            }
        }
        None => {
            let end = Instant::now() + d;
            while Instant::now() < end {
                std::hint::spin_loop();
            }
        }
    }
}

/// `pinlb backend`'s flags.
#[derive(Debug, clap::Args)]
pub struct BackendArgs {
    /// Address to serve on (IP:PORT; port 0 picks a free port). Repeat for more servers.
    #[arg(long, value_name = "ADDR", required = true)]
    pub listen: Vec<SocketAddr>,
    /// Cores: one for every server, or one per --listen in order ("1,2", "1-2").
    /// Default: the cores this process may run on, round robin.
    #[arg(long, value_name = "LIST", value_parser = parse_cpus)]
    pub cpus: Option<std::vec::Vec<usize>>,
    /// Response body size ("12", "1KiB", "1MB").
    #[arg(long, value_name = "SIZE", default_value = "12")]
    pub body: bytesize::ByteSize,
    /// Response status (200-599); /health answers 200 regardless.
    #[arg(long, value_name = "NNN", default_value_t = 200)]
    pub status: u16,
    /// CPU burnt per request, busy ("200us", "1ms").
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub work: humantime::Duration,
    /// Time waited per request without CPU ("5ms").
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub delay: humantime::Duration,
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    parse_cpu_list(s)
}

impl BackendArgs {
    /// The spec these flags describe.
    pub fn spec(&self) -> Result<BackendSpec, BackendError> {
        let body = usize::try_from(self.body.as_u64())
            .map_err(|_| BackendError::BodyTooLarge(self.body.as_u64()))?;
        Ok(BackendSpec {
            listen: self.listen.clone(),
            cpus: self.cpus.clone().unwrap_or_default(),
            body,
            status: self.status,
            work: self.work.into(),
            delay: self.delay.into(),
        })
    }
}

/// Runs `pinlb backend` until SIGTERM or SIGINT; exits 0 then, 1 if the servers cannot start.
pub fn main(args: BackendArgs) -> ExitCode {
    let spec = match args.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pinlb backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let control = match pinlb::server::control_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pinlb backend: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Registered before the ports open: a SIGTERM sent once a port answers must stop the servers
    // cleanly, not kill the process with the default action.
    let signals = match control.block_on(async { Signals::register() }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pinlb backend: cannot listen for SIGTERM/SIGINT: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The main thread only waits for signals, but it is the one `/proc/PID/status` describes:
    // pinning it to the servers' cores makes the process's allowed cores (what `pinlb check`
    // and `taskset -p` show) the cores it really uses. The server threads it starts inherit
    // this mask, so none runs outside it even before it narrows to its own core.
    match spec.cores() {
        Ok(cores) => {
            if let Err(e) = pin_current_thread(&cores) {
                warn!(
                    "cannot pin the main thread to cores {}: {e}",
                    format_cpu_list(&cores)
                );
            }
        }
        Err(e) => {
            eprintln!("pinlb backend: {e}");
            return ExitCode::FAILURE;
        }
    }
    let backends = match Backends::start(&spec) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("pinlb backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    // stdout is for scripts that wait for the ports: one line per server, flushed per line.
    for (i, (addr, core)) in backends.addrs().iter().zip(backends.cores()).enumerate() {
        println!("backend {i} listening on {addr} (core {core})");
    }
    info!(
        "answering {} with {} body bytes, work {}, delay {}; /health answers 200",
        spec.status,
        spec.body,
        humantime::format_duration(spec.work),
        humantime::format_duration(spec.delay)
    );
    control.block_on(signals.wait());
    info!(
        "stopping after {} requests (not counting /health)",
        backends.requests()
    );
    backends.stop();
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_serves_every_server() {
        assert_eq!(assign_cores(3, &[1], &[0, 1, 2]).unwrap(), vec![1, 1, 1]);
    }

    #[test]
    fn one_core_per_server_goes_in_listen_order() {
        assert_eq!(assign_cores(2, &[2, 1], &[0, 1, 2]).unwrap(), vec![2, 1]);
    }

    #[test]
    fn no_cores_means_the_allowed_ones_round_robin() {
        assert_eq!(
            assign_cores(5, &[], &[0, 2, 3]).unwrap(),
            vec![0, 2, 3, 0, 2]
        );
    }

    #[test]
    fn a_core_count_that_fits_neither_rule_is_an_error() {
        let e = assign_cores(3, &[0, 1], &[0, 1, 2]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "2 cores listed for 3 servers: list one core for all of them, or one per listen address"
        );
    }

    #[test]
    fn a_core_outside_the_allowed_set_is_an_error() {
        let e = assign_cores(1, &[7], &[0, 1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "core 7 is not one this process may run on (allowed: 0-1)"
        );
    }

    #[test]
    fn bodies_are_hello_world_cut_to_size() {
        assert_eq!(body_of(12), Bytes::from_static(b"hello world\n"));
        assert_eq!(body_of(5), Bytes::from_static(b"hello"));
        assert_eq!(body_of(15), Bytes::from_static(b"hello world\nhel"));
        assert!(body_of(0).is_empty());
    }

    #[test]
    fn informational_and_out_of_range_statuses_are_refused() {
        for status in [100, 199, 600, 1000] {
            let spec = BackendSpec {
                listen: vec!["127.0.0.1:0".parse().unwrap()],
                status,
                ..BackendSpec::default()
            };
            assert!(
                matches!(Backends::start(&spec), Err(BackendError::Status(s)) if s == status),
                "{status}"
            );
        }
    }

    #[test]
    fn http_dates_are_imf_fixdates() {
        let at = |secs| http_date(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(&at(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        // RFC 9110's example.
        assert_eq!(&at(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        // A leap day, and the last second of a year.
        assert_eq!(&at(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&at(1_798_761_599), b"Thu, 31 Dec 2026 23:59:59 GMT");
    }

    fn parse(s: &str) -> Result<Option<Request>, BadRequest> {
        parse_request(s.as_bytes())
    }

    #[test]
    fn a_bodiless_get_stays_open_and_an_incomplete_head_asks_for_more() {
        let req = parse("GET /x HTTP/1.1\r\nHost: b\r\n\r\nGET")
            .unwrap()
            .unwrap();
        assert_eq!(req.len, 28);
        assert_eq!(req.persist, Persist::KeepAlive);
        assert_eq!(req.body, BodyDecoder::Length(0));
        assert!(!req.health && !req.head_only && !req.expect_continue);
        assert_eq!(parse("GET /x HTTP/1.1\r\nHost: b\r\n"), Ok(None));
    }

    #[test]
    fn health_is_the_path_whatever_the_query() {
        assert!(
            parse("GET /health?x=1 HTTP/1.1\r\n\r\n")
                .unwrap()
                .unwrap()
                .health
        );
        assert!(
            !parse("GET /healthz HTTP/1.1\r\n\r\n")
                .unwrap()
                .unwrap()
                .health
        );
    }

    #[test]
    fn connection_headers_and_versions_decide_persistence() {
        let persist = |s: &str| parse(s).unwrap().unwrap().persist;
        assert_eq!(
            persist("GET / HTTP/1.1\r\nConnection: Keep-Alive, CLOSE\r\n\r\n"),
            Persist::Close
        );
        assert_eq!(persist("GET / HTTP/1.0\r\n\r\n"), Persist::Close);
        assert_eq!(
            persist("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"),
            Persist::KeepAlive10
        );
    }

    #[test]
    fn bodies_are_framed_by_chunked_then_content_length() {
        let req = |s: &str| parse(s).unwrap().unwrap();
        let post = req("POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
        assert_eq!(post.body, BodyDecoder::Length(5));
        assert!(post.expect_continue);
        let chunked = req("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        assert!(matches!(chunked.body, BodyDecoder::Chunked(_)));
        assert_eq!(chunked.persist, Persist::KeepAlive);
        // Both: chunked wins, and the connection closes after the response.
        let both =
            req("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(matches!(both.body, BodyDecoder::Chunked(_)));
        assert_eq!(both.persist, Persist::Close);
        assert!(req("HEAD / HTTP/1.1\r\n\r\n").head_only);
    }

    #[test]
    fn bad_framing_and_bad_heads_are_refused() {
        for bad in [
            "POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            assert_eq!(parse(bad), Err(BadRequest::Malformed), "{bad:?}");
        }
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert_eq!(parse(&many), Err(BadRequest::TooLarge));
    }

    #[test]
    fn a_websocket_handshake_gets_the_accept_key_of_rfc_6455() {
        let req = parse(
            "GET /chat HTTP/1.1\r\nHost: b\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(req.websocket, Some(*b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
    }

    #[test]
    fn other_upgrades_are_ignored_and_incomplete_websocket_ones_refused() {
        let ws = |s: &str| parse(s).map(|r| r.unwrap().websocket);
        let key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        // Not an upgrade to websocket, or not named in Connection: an ordinary request.
        assert_eq!(
            ws("GET / HTTP/1.1\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n"),
            Ok(None)
        );
        assert_eq!(
            ws(&format!(
                "GET / HTTP/1.1\r\nUpgrade: websocket\r\n{key}Sec-WebSocket-Version: 13\r\n\r\n"
            )),
            Ok(None)
        );
        for bad in [
            // No key, another version, a POST, HTTP/1.0.
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n".to_string(),
            format!("GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n{key}Sec-WebSocket-Version: 8\r\n\r\n"),
            format!("POST / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n{key}Sec-WebSocket-Version: 13\r\n\r\n"),
            format!("GET / HTTP/1.0\r\nUpgrade: websocket\r\nConnection: upgrade\r\n{key}Sec-WebSocket-Version: 13\r\n\r\n"),
        ] {
            assert_eq!(ws(&bad), Err(BadRequest::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn replies_are_the_status_length_date_and_body() {
        let replies = Replies::new(
            Answer {
                status: StatusCode::ACCEPTED,
                body: body_of(12),
                work: Duration::ZERO,
                delay: Duration::ZERO,
                counter: Arc::default(),
            },
            None,
        );
        replies.date.set(*b"Sun, 06 Nov 1994 08:49:37 GMT");
        let req = parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        assert!(replies.append(&req, &mut out).is_none());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 202 Accepted\r\ncontent-length: 12\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             connection: keep-alive\r\n\r\nhello world\n"
        );
        let no_content = Replies::new(
            Answer {
                status: StatusCode::NO_CONTENT,
                body: body_of(12),
                work: Duration::ZERO,
                delay: Duration::ZERO,
                counter: Arc::default(),
            },
            None,
        );
        let mut out = Vec::new();
        let get = parse("GET / HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert!(no_content.append(&get, &mut out).is_none());
        assert!(out.starts_with(b"HTTP/1.1 204 No Content\r\ndate: "));
        assert!(out.ends_with(b" GMT\r\n\r\n"));
    }

    #[test]
    fn a_request_that_asks_is_told_the_connections_accepted_and_others_are_not() {
        let replies = Replies::new(
            Answer {
                status: StatusCode::OK,
                body: body_of(12),
                work: Duration::ZERO,
                delay: Duration::ZERO,
                counter: Arc::default(),
            },
            Some("127.0.0.1:8881".parse().unwrap()),
        );
        replies.accepted.set(17);
        let asks = parse("GET / HTTP/1.1\r\nX-Pinlb-Accepted: ?\r\n\r\n")
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        replies.append(&asks, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("\r\nx-pinlb-accepted: 127.0.0.1:8881 17\r\n"),
            "{text}"
        );
        let plain = parse("GET / HTTP/1.1\r\n\r\n").unwrap().unwrap();
        let mut out = Vec::new();
        replies.append(&plain, &mut out);
        assert!(!String::from_utf8(out).unwrap().contains(ACCEPTED));
    }

    #[test]
    fn no_listen_address_is_an_error() {
        assert!(matches!(
            Backends::start(&BackendSpec::default()),
            Err(BackendError::NoListen)
        ));
    }
}
