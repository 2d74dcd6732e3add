//! Shared helpers for the integration tests: real backends, real clients, the proxy run in
//! process (library) or as the `pinlb` binary.
//!
//! Everything talks real TCP on `127.0.0.1` with kernel-chosen ports, so tests can run in
//! parallel without sharing anything.

// Each test crate (`proxy.rs`, `cli.rs`) uses a different part of this module.
#![allow(dead_code)]

pub mod framing;

use std::convert::Infallible;
use std::error::Error as StdError;
use std::io::{BufRead, BufReader as StdBufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

pub type BoxError = Box<dyn StdError + Send + Sync>;
/// The body type of every request the test clients send.
pub type ClientBody = BoxBody<Bytes, BoxError>;

/// Upper bound for any single wait on an event in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Cores and configuration
// ---------------------------------------------------------------------------------------------

/// The cores this test process may run on.
pub fn allowed() -> Vec<usize> {
    pinlb::cpus::allowed_cpus().expect("read this process's allowed cores")
}

/// The first allowed core: a one-worker proxy runs there.
pub fn first_core() -> usize {
    allowed()[0]
}

/// A port that refuses connections: a socket is bound to it but not listening, so the port
/// stays reserved (no other test can get it) while every connect is refused.
pub struct Refusing {
    pub addr: SocketAddr,
    sock: socket2::Socket,
}

impl Refusing {
    pub fn new() -> Refusing {
        use socket2::{Domain, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        sock.bind(&any.into()).expect("bind a port to refuse on");
        let addr = sock.local_addr().unwrap().as_socket().unwrap();
        Refusing { addr, sock }
    }

    /// Starts listening on the same port: from now on connections are accepted.
    pub fn listen(self) -> TcpListener {
        self.sock.listen(128).expect("listen");
        self.sock.set_nonblocking(true).unwrap();
        TcpListener::from_std(self.sock.into()).expect("tokio listener")
    }
}

/// A proxy configuration with one listener on a kernel-chosen port and one upstream `app`.
#[derive(Debug, Clone)]
pub struct Setup {
    pub cpus: Vec<usize>,
    pub algorithm: &'static str,
    pub backends: Vec<(SocketAddr, u32)>,
    pub keepalive: usize,
    pub connect_timeout: &'static str,
    pub response_timeout: &'static str,
    pub client_idle: &'static str,
    pub shutdown_timeout: &'static str,
    /// More TOML appended to the file, e.g. `[upstream.app.health]` and its keys.
    pub extra: String,
    /// More keys of the `[upstream.app]` table itself, e.g. `max_conns = 1`, one per line.
    pub upstream_keys: String,
    /// More keys for each backend's inline table, by position in `backends`, e.g.
    /// `max_conns = 1` (several joined with ", "). Missing entries add nothing.
    pub backend_keys: Vec<String>,
}

impl Setup {
    /// Round robin through one worker on the first allowed core.
    pub fn new(backends: &[(SocketAddr, u32)]) -> Setup {
        Setup {
            cpus: vec![first_core()],
            algorithm: "round_robin",
            backends: backends.to_vec(),
            keepalive: 64,
            connect_timeout: "1s",
            response_timeout: "10s",
            client_idle: "30s",
            shutdown_timeout: "3s",
            extra: String::new(),
            upstream_keys: String::new(),
            backend_keys: Vec::new(),
        }
    }

    /// Equal weights.
    pub fn with(backends: &[SocketAddr]) -> Setup {
        Setup::new(&backends.iter().map(|&a| (a, 1)).collect::<Vec<_>>())
    }

    pub fn toml(&self) -> String {
        let cpus = self
            .cpus
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let backends = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, (a, w))| match self.backend_keys.get(i) {
                Some(k) if !k.is_empty() => {
                    format!("  {{ address = \"{a}\", weight = {w}, {k} }},\n")
                }
                _ => format!("  {{ address = \"{a}\", weight = {w} }},\n"),
            })
            .collect::<String>();
        format!(
            r#"[runtime]
cpus = [{cpus}]
shutdown_timeout = "{shutdown}"

[[listener]]
address = "127.0.0.1:0"
upstream = "app"

[upstream.app]
algorithm = "{algorithm}"
keepalive = {keepalive}
{upstream_keys}
backends = [
{backends}]

[upstream.app.timeouts]
connect = "{connect}"
response = "{response}"
client_idle = "{client_idle}"

{extra}"#,
            shutdown = self.shutdown_timeout,
            algorithm = self.algorithm,
            keepalive = self.keepalive,
            connect = self.connect_timeout,
            response = self.response_timeout,
            client_idle = self.client_idle,
            extra = self.extra,
            upstream_keys = self.upstream_keys,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

/// What a backend saw of one request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub version: http::Version,
    pub uri: String,
    pub headers: HeaderMap,
    /// Every body byte was counted...
    pub body_len: u64,
    /// ...and the first 64 KiB kept.
    pub body_start: Vec<u8>,
}

struct BackendState {
    id: String,
    delay: Duration,
    /// Requests that have arrived (counted when the head is read, before any delay); pinlb's
    /// health probes are counted in `probes` instead.
    hits: watch::Sender<usize>,
    /// Requests (not probes) whose handler finished: the response was handed to hyper.
    answered: AtomicUsize,
    /// Health probes that have arrived (requests with `User-Agent: pinlb-health`).
    probes: watch::Sender<usize>,
    probe_requests: Mutex<Vec<Recorded>>,
    /// The status `/health` answers.
    health: AtomicU16,
    /// Set by [`Backend::kill`]: every connection task ends at once.
    killed: watch::Sender<bool>,
    /// TCP connections accepted.
    accepts: AtomicUsize,
    /// TCP connections finished (closed by either side).
    closed: watch::Sender<usize>,
    requests: Mutex<Vec<Recorded>>,
    /// Download body bytes handed to hyper so far.
    produced: Arc<AtomicU64>,
    /// `/gated` requests wait for this to be open before reading their body.
    gate: watch::Sender<bool>,
}

/// A small hyper HTTP/1.1 server on a kernel-chosen port, running as tasks on the test's tokio
/// runtime. It answers by path:
///
/// - `/download/N` streams N generated bytes with Content-Length, `/download/N?chunked` without;
/// - `/status/NNN` answers that status;
/// - `/sleep/MS` answers after MS milliseconds;
/// - `/close` answers with `Connection: close` and closes the connection;
/// - `/gated` waits for the gate ([`Backend::set_gate`]) before reading the body;
/// - `/hop` answers with hop-by-hop headers that a proxy must not pass on;
/// - `/health` answers the status set with [`Backend::set_health`] (200 at first);
/// - anything else answers `hello from ID` with an explicit Content-Length.
///
/// Requests with `User-Agent: pinlb-health` (pinlb's active health probes) are counted as
/// probes ([`Backend::probes`]), not hits, and recorded apart ([`Backend::probe_requests`]);
/// the backend's delay does not hold them up.
///
/// Every response carries `x-backend: ID`. Every request body is read to the end, counted and
/// discarded (the first 64 KiB are recorded), and the count is reported in `x-body-bytes`.
/// With a delay, the response waits that long after the body was read.
pub struct Backend {
    pub addr: SocketAddr,
    state: Arc<BackendState>,
    stop: Option<oneshot::Sender<()>>,
    /// The accept loop; it owns the listener.
    accept: Option<tokio::task::JoinHandle<()>>,
}

impl Backend {
    pub async fn start(id: &str) -> Backend {
        Backend::start_with_delay(id, Duration::ZERO).await
    }

    pub async fn start_with_delay(id: &str, delay: Duration) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        Backend::serve(listener, id, delay)
    }

    /// A backend that closes keep-alive connections idle for longer than `idle`.
    pub async fn start_with_idle_timeout(id: &str, idle: Duration) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        Backend::serve_with(listener, id, Duration::ZERO, Some(idle))
    }

    /// Serves on an already bound listener (e.g. on a port that refused connections before).
    pub fn serve(listener: TcpListener, id: &str, delay: Duration) -> Backend {
        Backend::serve_with(listener, id, delay, None)
    }

    fn serve_with(
        listener: TcpListener,
        id: &str,
        delay: Duration,
        idle: Option<Duration>,
    ) -> Backend {
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(BackendState {
            id: id.to_string(),
            delay,
            hits: watch::Sender::new(0),
            answered: AtomicUsize::new(0),
            probes: watch::Sender::new(0),
            probe_requests: Mutex::new(Vec::new()),
            health: AtomicU16::new(200),
            killed: watch::Sender::new(false),
            accepts: AtomicUsize::new(0),
            closed: watch::Sender::new(0),
            requests: Mutex::new(Vec::new()),
            produced: Arc::new(AtomicU64::new(0)),
            gate: watch::Sender::new(true),
        });
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = &mut stop_rx => return,
                    a = listener.accept() => match a {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                };
                st.accepts.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                tokio::spawn(async move {
                    let service = {
                        let st = st.clone();
                        service_fn(move |req| backend_handle(st.clone(), req))
                    };
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    if let Some(idle) = idle {
                        builder
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(idle);
                    }
                    let mut killed = st.killed.subscribe();
                    // A kill drops the connection wherever it is, a request in flight included.
                    tokio::select! {
                        _ = builder.serve_connection(TokioIo::new(stream), service) => {}
                        _ = killed.wait_for(|k| *k) => {}
                    }
                    st.closed.send_modify(|c| *c += 1);
                });
            }
        });
        Backend {
            addr,
            state,
            stop: Some(stop_tx),
            accept: Some(accept),
        }
    }

    /// Kills the backend as a crash would: the listener is closed first (connections to the
    /// port are refused from then on), then every open connection is dropped at once, requests
    /// in flight included, before any byte of their response. Returns how many requests were
    /// in flight and so never answered.
    pub async fn kill(&mut self) -> usize {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(accept) = self.accept.take() {
            tokio::time::timeout(WAIT, accept)
                .await
                .expect("the accept loop ends when told")
                .expect("accept loop");
        }
        self.state.killed.send_replace(true);
        self.wait_for_closed(self.accepts()).await;
        self.hits() - self.state.answered.load(Ordering::SeqCst)
    }

    /// Sets the status `/health` answers from now on.
    pub fn set_health(&self, status: u16) {
        self.state.health.store(status, Ordering::SeqCst);
    }

    /// Health probes that have arrived so far.
    pub fn probes(&self) -> usize {
        *self.state.probes.borrow()
    }

    /// Every health probe recorded so far.
    pub fn probe_requests(&self) -> Vec<Recorded> {
        self.state.probe_requests.lock().unwrap().clone()
    }

    /// Waits (bounded) until at least `n` health probes have arrived.
    pub async fn wait_for_probes(&self, n: usize) {
        let mut rx = self.state.probes.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|p| *p >= n))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "backend {} never saw {n} health probes (saw {})",
                    self.state.id,
                    self.probes()
                )
            })
            .expect("backend probe counter closed");
    }

    /// Requests that have arrived so far.
    pub fn hits(&self) -> usize {
        *self.state.hits.borrow()
    }

    /// TCP connections accepted so far.
    pub fn accepts(&self) -> usize {
        self.state.accepts.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until at least `n` connections have ended.
    pub async fn wait_for_closed(&self, n: usize) {
        let mut rx = self.state.closed.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("backend {}: {n} connections never closed", self.state.id))
            .expect("backend close counter closed");
    }

    /// Everything recorded so far, in arrival order of completed bodies.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Download body bytes this backend has produced so far.
    pub fn produced(&self) -> Arc<AtomicU64> {
        self.state.produced.clone()
    }

    /// Opens or closes the gate that `/gated` requests wait at before reading their body.
    pub fn set_gate(&self, open: bool) {
        self.state.gate.send_replace(open);
    }

    /// The gate itself, to open it from another task.
    pub fn gate_handle(&self) -> watch::Sender<bool> {
        self.state.gate.clone()
    }

    /// Waits (bounded) until at least `n` requests have arrived.
    pub async fn wait_for_hits(&self, n: usize) {
        let mut rx = self.state.hits.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|h| *h >= n))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "backend {} never saw {n} requests (saw {})",
                    self.state.id,
                    self.hits()
                )
            })
            .expect("backend hit counter closed");
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

async fn backend_handle(
    st: Arc<BackendState>,
    req: Request<Incoming>,
) -> Result<Response<ClientBody>, Infallible> {
    let probe = req
        .headers()
        .get(http::header::USER_AGENT)
        .is_some_and(|v| v == "pinlb-health");
    if !probe {
        st.hits.send_modify(|h| *h += 1);
    }
    let (parts, mut body) = req.into_parts();
    if parts.uri.path() == "/gated" {
        let _ = st.gate.subscribe().wait_for(|open| *open).await;
    }
    let mut body_len = 0u64;
    let mut body_start = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            body_len += data.len() as u64;
            if body_start.len() < 64 * 1024 {
                let room = 64 * 1024 - body_start.len();
                body_start.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
    }
    let recorded = Recorded {
        method: parts.method.clone(),
        version: parts.version,
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body_len,
        body_start,
    };
    if probe {
        st.probe_requests.lock().unwrap().push(recorded);
        // Counted once recorded, and before `/health` reads the status it answers.
        st.probes.send_modify(|p| *p += 1);
    } else {
        st.requests.lock().unwrap().push(recorded);
    }
    if !probe && !st.delay.is_zero() {
        tokio::time::sleep(st.delay).await;
    }
    if let Some(ms) = parts.uri.path().strip_prefix("/sleep/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().expect("sleep ms"))).await;
    }

    let path = parts.uri.path();
    let mut resp = if let Some(n) = path.strip_prefix("/download/") {
        let n: u64 = n.parse().expect("download length");
        let exact = parts.uri.query() != Some("chunked");
        let mut r = Response::new(GenBody::counted(n, exact, st.produced.clone()).boxed());
        if exact {
            r.headers_mut()
                .insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        r
    } else if let Some(code) = path.strip_prefix("/status/") {
        let mut r = text(format!("status {code} from {}\n", st.id));
        *r.status_mut() = StatusCode::from_u16(code.parse().unwrap()).unwrap();
        r
    } else if path == "/health" {
        let status = st.health.load(Ordering::SeqCst);
        let mut r = text(format!("health {status} from {}\n", st.id));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    } else if path == "/close" {
        let mut r = text(format!("closing, from {}\n", st.id));
        r.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        r
    } else if path == "/hop" {
        let mut r = text("hop\n".to_string());
        let h = r.headers_mut();
        for (k, v) in [
            ("connection", "x-backend-secret"),
            ("keep-alive", "timeout=5, max=100"),
            ("x-backend-secret", "hidden"),
            ("proxy-connection", "keep-alive"),
            ("upgrade", "h2c"),
            ("trailer", "x-checksum"),
            ("te", "trailers"),
            ("x-backend-visible", "yes"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        r
    } else {
        text(format!("hello from {}\n", st.id))
    };
    let h = resp.headers_mut();
    h.insert("x-backend", HeaderValue::from_str(&st.id).unwrap());
    h.insert("x-body-bytes", HeaderValue::from(body_len));
    if !probe {
        st.answered.fetch_add(1, Ordering::SeqCst);
    }
    Ok(resp)
}

fn text(s: String) -> Response<ClientBody> {
    let len = s.len();
    let mut r = Response::new(full(s));
    r.headers_mut()
        .insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    r
}

// ---------------------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------------------

pub fn full(s: impl Into<Bytes>) -> ClientBody {
    Full::new(s.into())
        .map_err(|e: Infallible| match e {})
        .boxed()
}

pub fn empty() -> ClientBody {
    Empty::new().map_err(|e: Infallible| match e {}).boxed()
}

/// A body of `len` bytes produced on the fly in 64 KiB slices of one shared buffer, so even
/// hundreds of MiB never sit in memory. With `exact`, it reports its length (hyper then frames it
/// with Content-Length); without, hyper sends it chunked.
pub struct GenBody {
    remaining: u64,
    exact: bool,
    chunk: Bytes,
    /// Bytes produced so far, for tests that watch back-pressure.
    produced: Option<Arc<AtomicU64>>,
}

impl GenBody {
    pub fn new(len: u64, exact: bool) -> GenBody {
        let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
        GenBody {
            remaining: len,
            exact,
            chunk: Bytes::from(chunk),
            produced: None,
        }
    }

    /// Like [`GenBody::new`], adding every byte it produces to `produced`.
    pub fn counted(len: u64, exact: bool, produced: Arc<AtomicU64>) -> GenBody {
        GenBody {
            produced: Some(produced),
            ..GenBody::new(len, exact)
        }
    }

    pub fn boxed(self) -> ClientBody {
        BodyExt::boxed(self)
    }
}

impl Body for GenBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let n = self.remaining.min(self.chunk.len() as u64) as usize;
        self.remaining -= n as u64;
        if let Some(p) = &self.produced {
            p.fetch_add(n as u64, Ordering::SeqCst);
        }
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

/// One client connection (hyper's HTTP/1.1 client), reusable for keep-alive requests.
pub struct Conn {
    sender: SendRequest<ClientBody>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender }
    }

    /// Sends a request; the error, if the connection fails, is the caller's to judge.
    pub async fn try_send(
        &mut self,
        req: Request<ClientBody>,
    ) -> hyper::Result<Response<Incoming>> {
        self.sender.ready().await?;
        self.sender.send_request(req).await
    }

    /// Sends a request and returns the response with its body still streaming.
    pub async fn send(&mut self, req: Request<ClientBody>) -> Response<Incoming> {
        tokio::time::timeout(WAIT, async {
            self.sender.ready().await.expect("connection ready");
            self.sender.send_request(req).await.expect("send request")
        })
        .await
        .expect("no response within the wait limit")
    }

    /// Sends a request and reads the whole response.
    pub async fn fetch(&mut self, req: Request<ClientBody>) -> Reply {
        let resp = self.send(req).await;
        Reply::read(resp).await
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.fetch(request(Method::GET, path, empty())).await
    }
}

pub fn request(method: Method, path: &str, body: ClientBody) -> Request<ClientBody> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "pinlb.test")
        .body(body)
        .unwrap()
}

/// A whole response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub async fn read(resp: Response<Incoming>) -> Reply {
        let (parts, body) = resp.into_parts();
        let bytes = tokio::time::timeout(WAIT, body.collect())
            .await
            .expect("body not complete within the wait limit")
            .expect("read body")
            .to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    /// The `x-backend` header: which backend answered.
    pub fn backend(&self) -> &str {
        self.headers
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    }
}

/// GET on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    Conn::open(addr).await.get(path).await
}

/// A backend that answers every connection by reading one request head, writing `parts` as
/// raw bytes, one write each, and closing: for responses hyper would refuse to produce.
pub async fn raw_backend(parts: Vec<Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let parts = parts.clone();
            tokio::spawn(async move {
                let mut s = tokio::io::BufReader::new(s);
                let mut line = String::new();
                while s.read_line(&mut line).await.unwrap_or(0) > 2 {
                    line.clear();
                }
                let mut s = s.into_inner();
                for part in parts {
                    if tokio::io::AsyncWriteExt::write_all(&mut s, &part)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One request as a [`RawServer`] read it.
#[derive(Debug, Clone)]
pub struct RawSeen {
    /// Which connection it came on: 1 for the first one accepted.
    pub conn: usize,
    /// Its place on that connection: 1 for the first request.
    pub nth: usize,
    /// The request line and header lines.
    pub head: String,
    pub body: Vec<u8>,
    /// Whether it is one of pinlb's health probes (`User-Agent: pinlb-health`).
    pub probe: bool,
    /// When it was read completely.
    pub at: Instant,
}

/// What a [`RawServer`] does with a request it has read completely, head and body.
#[derive(Debug, Clone)]
pub enum RawAction {
    /// Writes these bytes and waits for the next request on the connection.
    Respond(Vec<u8>),
    /// Writes these bytes and closes the connection (FIN).
    RespondAndClose(Vec<u8>),
    /// Waits this long, then responds as [`RawAction::Respond`] does.
    RespondAfter(Duration, Vec<u8>),
    /// Closes the connection (FIN) without a response byte.
    Close,
    /// Resets the connection (RST, by SO_LINGER 0) without a response byte.
    Reset,
    /// Keeps the connection open this long without answering, then closes it.
    HoldThenClose(Duration),
}

struct RawState {
    accepts: AtomicUsize,
    /// Requests that were not health probes.
    requests: watch::Sender<usize>,
    probes: watch::Sender<usize>,
    seen: Mutex<Vec<RawSeen>>,
}

/// A backend that speaks HTTP/1.1 by hand, for failures hyper would not produce: it reads each
/// request completely (Content-Length or chunked body) and then does what `script` says.
pub struct RawServer {
    pub addr: SocketAddr,
    state: Arc<RawState>,
    stop: Option<oneshot::Sender<()>>,
    accept: Option<tokio::task::JoinHandle<Option<TcpListener>>>,
}

type Script = Arc<dyn Fn(&RawSeen) -> RawAction + Send + Sync>;

impl RawServer {
    pub async fn start(script: impl Fn(&RawSeen) -> RawAction + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        RawServer::serve(listener, script)
    }

    /// Serves on an already bound listener (e.g. the port of a backend that was killed).
    pub fn serve(
        listener: TcpListener,
        script: impl Fn(&RawSeen) -> RawAction + Send + Sync + 'static,
    ) -> Self {
        let addr = listener.local_addr().unwrap();
        let script: Script = Arc::new(script);
        let state = Arc::new(RawState {
            accepts: AtomicUsize::new(0),
            requests: watch::Sender::new(0),
            probes: watch::Sender::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = &mut stop_rx => return Some(listener),
                    a = listener.accept() => match a {
                        Ok((s, _)) => s,
                        Err(_) => continue,
                    },
                };
                let conn = st.accepts.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(raw_connection(stream, conn, st.clone(), script.clone()));
            }
        });
        RawServer {
            addr,
            state,
            stop: Some(stop_tx),
            accept: Some(accept),
        }
    }

    /// Stops accepting and hands the listener back, still bound and listening (connections
    /// already accepted run on).
    pub async fn into_listener(mut self) -> TcpListener {
        let _ = self.stop.take().unwrap().send(());
        let accept = self.accept.take().unwrap();
        tokio::time::timeout(WAIT, accept)
            .await
            .expect("the accept loop ends when told")
            .expect("accept loop")
            .expect("the listener")
    }

    /// TCP connections accepted, probes' included.
    pub fn accepts(&self) -> usize {
        self.state.accepts.load(Ordering::SeqCst)
    }

    /// Requests read that were not health probes.
    pub fn requests(&self) -> usize {
        *self.state.requests.borrow()
    }

    /// Health probes read.
    pub fn probes(&self) -> usize {
        *self.state.probes.borrow()
    }

    /// Every request read that was not a health probe, in order.
    pub fn seen(&self) -> Vec<RawSeen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.state.requests.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|r| *r >= n))
            .await
            .unwrap_or_else(|_| panic!("never saw {n} requests (saw {})", self.requests()))
            .expect("request counter closed");
    }

    pub async fn wait_for_probes(&self, n: usize) {
        let mut rx = self.state.probes.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|p| *p >= n))
            .await
            .unwrap_or_else(|_| panic!("never saw {n} health probes (saw {})", self.probes()))
            .expect("probe counter closed");
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A complete `200 OK` response with `x-backend: id` and `body`, keeping the connection open.
pub fn raw_ok(id: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nx-backend: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A complete response with `status`, `x-backend: id` and a short body.
pub fn raw_status(id: &str, status: u16) -> Vec<u8> {
    let body = format!("status {status} from {id}\n");
    format!(
        "HTTP/1.1 {status} X\r\nx-backend: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn raw_connection(stream: TcpStream, conn: usize, st: Arc<RawState>, script: Script) {
    let _ = stream.set_nodelay(true);
    let mut s = tokio::io::BufReader::new(stream);
    for nth in 1.. {
        let Some(seen) = raw_read_request(&mut s, conn, nth).await else {
            return;
        };
        if seen.probe {
            st.probes.send_modify(|p| *p += 1);
        } else {
            st.seen.lock().unwrap().push(seen.clone());
            st.requests.send_modify(|r| *r += 1);
        }
        match script(&seen) {
            RawAction::Respond(bytes) => {
                if tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            RawAction::RespondAfter(delay, bytes) => {
                tokio::time::sleep(delay).await;
                if tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            RawAction::RespondAndClose(bytes) => {
                let _ = tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes).await;
                return;
            }
            RawAction::Close => return,
            RawAction::Reset => {
                let _ = socket2::SockRef::from(s.get_ref()).set_linger(Some(Duration::ZERO));
                return;
            }
            RawAction::HoldThenClose(d) => {
                tokio::time::sleep(d).await;
                return;
            }
        }
    }
}

/// Reads one request, head and body; `None` when the connection ends first.
async fn raw_read_request(
    s: &mut tokio::io::BufReader<TcpStream>,
    conn: usize,
    nth: usize,
) -> Option<RawSeen> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        let end = line == "\r\n" || line == "\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let probe = header("user-agent").is_some_and(|v| v == "pinlb-health");
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            s.read_line(&mut size).await.ok()?;
            let size =
                usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            s.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = header("content-length") {
        body = vec![0; len.parse().ok()?];
        s.read_exact(&mut body).await.ok()?;
    }
    Some(RawSeen {
        conn,
        nth,
        head,
        body,
        probe,
        at: Instant::now(),
    })
}

/// Reads a response body to the end, counting bytes without keeping them.
pub async fn count_body(mut body: Incoming) -> u64 {
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("body frame").into_data() {
            n += data.len() as u64;
        }
    }
    n
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP over a socket, for byte-level control of what is sent and seen
// ---------------------------------------------------------------------------------------------

/// A response as it came off the wire.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The status line and header lines, as received.
    pub head: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.header(name).is_some()
    }
}

/// Reads a status line and headers.
/// Sends `bytes` as they are on a new connection and reads one response (`no_body` for HEAD).
pub async fn raw_request(addr: SocketAddr, bytes: &[u8], no_body: bool) -> RawResponse {
    let mut s = tokio::io::BufReader::new(TcpStream::connect(addr).await.unwrap());
    raw_exchange(&mut s, bytes, no_body).await
}

/// Sends `bytes` as they are on an open connection and reads one response (`no_body` for HEAD).
pub async fn raw_exchange(
    s: &mut tokio::io::BufReader<TcpStream>,
    bytes: &[u8],
    no_body: bool,
) -> RawResponse {
    tokio::io::AsyncWriteExt::write_all(s.get_mut(), bytes)
        .await
        .unwrap();
    read_response(s, no_body).await
}

pub async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> RawResponse {
    let mut head = String::new();
    let mut headers = Vec::new();
    let mut status_line = true;
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, r.read_line(&mut line))
            .await
            .expect("response head within the wait limit")
            .expect("read response head");
        assert!(
            n > 0,
            "connection closed inside a response head; got so far: {head:?}"
        );
        head.push_str(&line);
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        if std::mem::take(&mut status_line) {
            continue;
        }
        let (k, v) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("bad header line {line:?}"));
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    RawResponse {
        status,
        head,
        headers,
        body: Vec::new(),
    }
}

/// Reads one whole response; `no_body` for responses to HEAD.
pub async fn read_response<R: AsyncBufRead + Unpin>(r: &mut R, no_body: bool) -> RawResponse {
    let mut resp = read_head(r).await;
    if no_body || resp.status == 204 || resp.status == 304 || resp.status < 200 {
        return resp;
    }
    if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).await.expect("chunk size");
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16)
                .expect("hex chunk size");
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).await.expect("chunk");
            if size == 0 {
                break;
            }
            resp.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = resp.header("content-length") {
        let mut body = vec![0; len.parse().expect("content-length")];
        tokio::time::timeout(WAIT, r.read_exact(&mut body))
            .await
            .expect("body in time")
            .expect("body");
        resp.body = body;
    } else {
        tokio::time::timeout(WAIT, r.read_to_end(&mut resp.body))
            .await
            .expect("body in time")
            .expect("body");
    }
    resp
}

// ---------------------------------------------------------------------------------------------
// The proxy, in process
// ---------------------------------------------------------------------------------------------

/// A `pinlb::Server` running on its own thread until [`Proxy::shutdown`] or drop.
pub struct Proxy {
    /// The first listener's address.
    pub addr: SocketAddr,
    /// Every listener's address, in config order.
    pub addrs: Vec<SocketAddr>,
    /// The admin listener's address, when the config has `[admin]`.
    pub admin: Option<SocketAddr>,
    /// The config file a reload reads, for [`Proxy::start_file`].
    pub config: Option<PathBuf>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), pinlb::ServerError>>>,
}

impl Proxy {
    pub fn start(setup: &Setup) -> Proxy {
        Proxy::start_toml(&setup.toml())
    }

    pub fn start_toml(toml: &str) -> Proxy {
        let config = pinlb::Config::parse("test.toml", toml, &allowed())
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        Proxy::run_server(pinlb::Server::bind(config).expect("bind proxy"), None)
    }

    /// Like [`Proxy::start_toml`], from a file that `POST /reload` reads again; rewrite it with
    /// [`Proxy::rewrite`].
    pub fn start_file(toml: &str) -> Proxy {
        let path = temp_config(toml);
        let config = pinlb::Config::load(&path).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let server = pinlb::Server::bind(config)
            .expect("bind proxy")
            .reload_from(path.clone());
        Proxy::run_server(server, Some(path))
    }

    /// Replaces the config file's text (for a reload).
    pub fn rewrite(&self, toml: &str) {
        std::fs::write(self.config.as_ref().expect("started from a file"), toml)
            .expect("rewrite config");
    }

    /// A request to the admin listener; `token` adds `Authorization: Bearer`.
    pub async fn admin(&self, method: Method, path: &str, token: Option<&str>) -> Reply {
        let addr = self.admin.expect("the config has [admin]");
        let mut req = request(method, path, empty());
        if let Some(t) = token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Conn::open(addr).await.fetch(req).await
    }

    /// `GET /metrics`, without a token.
    pub async fn metrics(&self) -> Metrics {
        let r = self.admin(Method::GET, "/metrics", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        Metrics(r.body)
    }

    /// `GET /status` as JSON, without a token.
    pub async fn status(&self) -> serde_json::Value {
        let r = self.admin(Method::GET, "/status", None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        serde_json::from_str(&r.body).expect("status is JSON")
    }

    fn run_server(server: pinlb::Server, config: Option<PathBuf>) -> Proxy {
        let admin = server.admin_addr();
        let addrs = server.local_addrs().to_vec();
        let addr = addrs[0];
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            server.run(async move {
                let _ = rx.await;
            })
        });
        Proxy {
            addr,
            addrs,
            admin,
            config,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Asks the server to stop; it drains in the background.
    pub fn trigger_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Waits (bounded) for `run` to return, and returns its result.
    pub async fn join(mut self, limit: Duration) -> Result<(), pinlb::ServerError> {
        self.trigger_shutdown();
        let thread = self.thread.take().unwrap();
        // A plain thread rather than spawn_blocking: if `run` never returns, the test fails
        // instead of its runtime waiting forever for the blocking task on the way out.
        let (tx, rx) = oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(thread.join());
        });
        tokio::time::timeout(limit, rx)
            .await
            .unwrap_or_else(|_| panic!("Server::run did not return within {limit:?}"))
            .unwrap()
            .expect("server thread panicked")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The thread drains on its own; the test does not wait for it.
        self.trigger_shutdown();
    }
}

/// A `/metrics` scrape.
pub struct Metrics(pub String);

impl Metrics {
    /// The value of the sample `name{labels}` (`labels` exactly as rendered, e.g.
    /// `upstream="app",backend="127.0.0.1:1"`, or empty for none); `None` when absent.
    pub fn get(&self, name: &str, labels: &str) -> Option<f64> {
        let key = if labels.is_empty() {
            format!("{name} ")
        } else {
            format!("{name}{{{labels}}} ")
        };
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .map(|v| v.trim().parse().expect("a number"))
    }

    /// Like [`Metrics::get`], failing the test when the sample is missing.
    pub fn value(&self, name: &str, labels: &str) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{{{labels}}} in:\n{}", self.0))
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy, as the binary
// ---------------------------------------------------------------------------------------------

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pinlb")
}

/// Writes `text` to a fresh file under cargo's scratch directory for integration tests.
pub fn temp_config(text: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pinlb-{}-{}.toml",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::write(&path, text).expect("write config");
    path
}

/// `pinlb serve` as a child process; its stderr is collected line by line.
pub struct BinProxy {
    pub child: Child,
    pub pid: i32,
    pub addr: SocketAddr,
    log: watch::Receiver<Vec<String>>,
    config: PathBuf,
}

impl BinProxy {
    /// Starts the binary and waits until it logs its listening address.
    pub async fn spawn(setup: &Setup) -> BinProxy {
        let config = temp_config(&setup.toml());
        let mut child = Command::new(bin())
            .args(["serve", "-c"])
            .arg(&config)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pinlb");
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = watch::channel(Vec::new());
        // Keep draining stderr so pinlb never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in StdBufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                tx.send_modify(|v| v.push(line));
            }
        });
        let pid = child.id() as i32;
        let mut p = BinProxy {
            child,
            pid,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
            config,
        };
        let line = p.wait_for_log("listening on ").await;
        let rest = &line[line.find("listening on ").unwrap() + "listening on ".len()..];
        p.addr = rest
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .expect("listening address");
        p
    }

    /// Waits (bounded) for a stderr line containing `needle` and returns it.
    pub async fn wait_for_log(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(
            WAIT,
            self.log
                .wait_for(|lines| lines.iter().any(|l| l.contains(needle))),
        )
        .await
        .ok()
        .and_then(|r| r.ok())
        .and_then(|lines| lines.iter().find(|l| l.contains(needle)).cloned());
        found.unwrap_or_else(|| {
            panic!(
                "pinlb never logged {needle:?}; stderr so far:\n{}",
                self.log().join("\n")
            )
        })
    }

    pub fn log(&self) -> Vec<String> {
        self.log.borrow().clone()
    }

    /// The config file it was started with (rewrite it, then SIGHUP).
    pub fn config_path(&self) -> &PathBuf {
        &self.config
    }

    /// The admin listener's address, from its start-up log line.
    pub async fn admin_addr(&mut self) -> SocketAddr {
        let line = self.wait_for_log("admin listening on http://").await;
        let rest = &line[line.find("http://").unwrap() + "http://".len()..];
        rest.trim_end_matches('/')
            .split('/')
            .next()
            .unwrap()
            .parse()
            .expect("admin address")
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), signal).expect("kill");
    }

    /// Peak resident memory (VmHWM) in KiB.
    pub fn vm_hwm_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc status")
    }

    /// Waits (bounded: 250 polls of 20 ms) for the process to exit.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        for _ in 0..250 {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "pinlb still running {:?} after it was asked to stop; stderr:\n{}",
            start.elapsed(),
            self.log().join("\n")
        );
    }
}

impl Drop for BinProxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Waits until `counter` stops moving (unchanged over 4 polls 50 ms apart; at most 200 polls)
/// and returns its value: how far a producer got before back-pressure stopped it.
pub async fn settle(counter: &AtomicU64) -> u64 {
    let mut last = counter.load(Ordering::SeqCst);
    let mut still = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = counter.load(Ordering::SeqCst);
        if now == last {
            still += 1;
            if still == 4 {
                return now;
            }
        } else {
            still = 0;
            last = now;
        }
    }
    panic!("the producer never stopped: {last} bytes and counting");
}
