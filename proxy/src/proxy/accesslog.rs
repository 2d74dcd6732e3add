//! The access log (`[log] access`, `format`): one line per request, written off the request path.
//!
//! A worker fills an [`Entry`] from what it already has (the request head's method, target and
//! two headers, the status, the backend, two clock readings) and, when the response body ends,
//! adds it to its own [`Batch`]. A full batch (or, every [`FLUSH`], whatever is there) goes over a
//! bounded channel to the log thread, which formats it and writes it in one buffered write. So
//! the log thread wakes once per batch, not per request: on a machine where it shares a core
//! with a worker, a wake-up per request would cost more than the logging itself. That thread is
//! started from the control thread, so it is pinned to `runtime.cpus` like everything else.
//!
//! If the log thread falls behind so far that the queue is full, lines are dropped and counted
//! rather than slowing requests; the count is logged as a warning. Lines reach the file within
//! about [`FLUSH`] of their request's end, as with nginx's `access_log ... buffer= flush=`.
//!
//! SIGUSR1 reopens the file, for logrotate: the old file gets everything queued before the signal.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant, SystemTime};

use http::header::HeaderValue;
use http::{Method, Version};
use tracing::{error, warn};

use crate::backend_address::BackendAddress;
use crate::config::log_format::{Field, Part, Span};
use crate::config::{AccessFormat, AccessTarget};
use crate::http1::request::RequestHead;
use crate::modules::cache::CacheStatus;
use crate::modules::request_id::id::RequestId;
use crate::proxy::timing::Timing;
use crate::tls::client_identity::ClientIdentity;

/// Entries a worker collects before handing them to the log thread.
const BATCH: usize = 64;
/// How often a worker hands over a batch that is not full.
pub const FLUSH: Duration = Duration::from_millis(200);
/// Batches the channel holds before lines are dropped: 64 Ki entries, a second or more at full
/// speed.
const QUEUE: usize = 1024;

/// What the proxy tells the log about a response that came from a backend.
#[derive(Debug, Clone)]
pub struct Upstreamed {
    pub backend: BackendAddress,
    /// Where the time went up to the response head.
    pub timing: Timing,
    /// The attempts before the answering one, each backend with the status it came to (its
    /// answer's, for a retry on a status; pinlb's 502 or 504, for a failure); `None` for a
    /// request answered at its first attempt.
    pub tried: Option<Box<[(BackendAddress, u16)]>>,
}

impl Upstreamed {
    /// The record of `backend`'s answer, which took `timing`.
    pub fn answered(backend: BackendAddress, timing: Timing) -> Upstreamed {
        Upstreamed {
            backend,
            timing,
            tried: None,
        }
    }

    /// The attempts before the answering one.
    fn tried(&self) -> &[(BackendAddress, u16)] {
        self.tried.as_deref().unwrap_or_default()
    }
}

/// What a format reads of a request beyond what every entry takes: decided once from the
/// format, so a line that names no header costs no header lookup.
#[derive(Debug, Default)]
struct Capture {
    /// `{host}`.
    host: bool,
    /// `{http_NAME}`, in the template's order.
    headers: Vec<String>,
}

impl Captured {
    fn of(req: &RequestHead, capture: &Capture) -> Captured {
        let value = |v: Option<&[u8]>| v.and_then(|v| HeaderValue::from_bytes(v).ok());
        let host = capture
            .host
            .then(|| value(req.host().map(crate::http1::request::host_without_port)))
            .flatten();
        let headers = capture
            .headers
            .iter()
            .map(|name| match name.as_str() {
                // Not among the lines: the parser keeps them apart.
                "host" => value(req.host()),
                "x-forwarded-for" => value(req.forwarded_for.as_deref()),
                name => value(req.header_values(name).next()),
            })
            .collect();
        Captured {
            host,
            headers,
            client: None,
        }
    }
}

impl Capture {
    fn of(format: &AccessFormat) -> Capture {
        match format {
            AccessFormat::Template(t) => Capture {
                host: t.parts.contains(&Part::Field(Field::Host)),
                headers: t.headers(),
            },
            _ => Capture::default(),
        }
    }
}

/// One request's line, before formatting.
#[derive(Debug)]
pub struct Entry {
    client: SocketAddr,
    method: Method,
    /// The request target as the client sent it.
    target: String,
    version: Version,
    referer: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    start: Instant,
    status: u16,
    /// Out of the proxy's box, which is freed here on the worker: memory freed by another
    /// thread than the one that took it costs more.
    upstream: Option<Upstreamed>,
    /// Response body bytes sent to the client; for a tunnel, every byte relayed to it.
    bytes: u64,
    /// For a tunnel (after a 101) only: the bytes relayed from the client to the backend.
    received: Option<u64>,
    /// From the request head to the end of the response; for a tunnel, to its close.
    total: Duration,
    /// From the response head to the end of the response, for a backend's.
    response: Duration,
    /// `[request_id]`: the request's ID and trace id, shared with the request.
    id: Option<Arc<RequestId>>,
    /// What only some formats read; `None` for the others.
    captured: Option<Box<Captured>>,
    /// A TCP listener's connection or a UDP listener's session (`target` is the listener's
    /// address): how it ended.
    ended: Option<&'static str>,
    /// A UDP listener's session rather than a TCP listener's connection.
    datagrams: bool,
    /// What its route's cache did (nginx's `$upstream_cache_status`).
    cache: Option<CacheStatus>,
}

/// What a template reads of a request beyond every entry's fields.
#[derive(Debug, Default)]
struct Captured {
    /// `{host}`: the Host without its port.
    host: Option<HeaderValue>,
    /// The format's `{http_NAME}` headers, in its order.
    headers: Vec<Option<HeaderValue>>,
    /// On a listener with `client_ca`: the client's certificate, for `{ssl_client_*}` and
    /// the JSON's `ssl_client_*` keys.
    client: Option<Arc<ClientIdentity>>,
}

impl Entry {
    /// Taken when the request head arrived, `at`.
    fn start(
        req: &RequestHead,
        client: SocketAddr,
        at: Instant,
        id: Option<&Arc<RequestId>>,
        capture: &Capture,
    ) -> Box<Entry> {
        let value = |v: Option<&[u8]>| v.and_then(|v| HeaderValue::from_bytes(v).ok());
        let captured = (capture.host || !capture.headers.is_empty())
            .then(|| Box::new(Captured::of(req, capture)));
        Box::new(Entry {
            client,
            method: req.method.clone(),
            target: String::from_utf8_lossy(req.target()).into_owned(),
            version: req.version,
            referer: value(req.referer()),
            user_agent: value(req.user_agent()),
            start: at,
            status: 0,
            upstream: None,
            bytes: 0,
            received: None,
            total: Duration::ZERO,
            response: Duration::ZERO,
            id: id.cloned(),
            captured,
            ended: None,
            datagrams: false,
            cache: None,
        })
    }

    /// A TCP listener's connection from `client`, accepted `at` on `listener`.
    fn connection(client: SocketAddr, listener: SocketAddr, at: Instant) -> Box<Entry> {
        Box::new(Entry {
            client,
            // A token, so never an error; `CONNECT` is never written for it.
            method: Method::from_bytes(b"TCP").unwrap_or(Method::CONNECT),
            target: listener.to_string(),
            version: Version::HTTP_11,
            referer: None,
            user_agent: None,
            start: at,
            status: 0,
            upstream: None,
            bytes: 0,
            received: Some(0),
            total: Duration::ZERO,
            response: Duration::ZERO,
            id: None,
            captured: None,
            // Until it ends: a connection the worker's stop cuts is logged as cut.
            ended: Some("cut"),
            datagrams: false,
            cache: None,
        })
    }

    /// Records the response's status, and the backend that sent it.
    fn responded(&mut self, status: http::StatusCode, upstream: Option<Upstreamed>) {
        self.status = status.as_u16();
        self.upstream = upstream;
    }
}

/// An [`Entry`] whose response has not been produced yet. If the request is abandoned first
/// (the client went away while pinlb waited on a backend), it is logged as nginx does, with
/// status 499.
pub struct Pending(Option<(Box<Entry>, Rc<Batch>)>);

impl Pending {
    /// The entry of a request whose head arrived `at`.
    pub fn start(
        req: &RequestHead,
        client: SocketAddr,
        batch: &Rc<Batch>,
        at: Instant,
        id: Option<&Arc<RequestId>>,
    ) -> Pending {
        let entry = Entry::start(req, client, at, id, &batch.handle.capture);
        Pending(Some((entry, batch.clone())))
    }

    /// The client certificate of the connection, on a listener with `client_ca`.
    #[cold]
    pub fn client_cert(&mut self, client: Option<&Arc<ClientIdentity>>) {
        if let (Some((e, _)), Some(c)) = (&mut self.0, client) {
            e.captured.get_or_insert_with(Box::default).client = Some(c.clone());
        }
    }

    /// What the request's route's cache did for it.
    #[cold]
    pub fn cache(&mut self, status: CacheStatus) {
        if let Some((e, _)) = &mut self.0 {
            e.cache = Some(status);
        }
    }

    /// The response is here: the entry goes on with the response body.
    pub fn responded(
        mut self,
        status: http::StatusCode,
        upstream: Option<Box<Upstreamed>>,
    ) -> Option<(Box<Entry>, Rc<Batch>)> {
        let (mut e, batch) = self.0.take()?;
        e.responded(status, upstream.map(|u| *u));
        Some((e, batch))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some((mut e, batch)) = self.0.take() {
            e.status = 499;
            batch.push(e);
        }
    }
}

enum Msg {
    Entries(Vec<Entry>),
    Reopen,
    Stop,
}

/// What a worker holds to hand entries to the log thread.
#[derive(Clone)]
pub struct AccessHandle {
    tx: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
    /// What the format reads of each request.
    capture: Arc<Capture>,
}

impl AccessHandle {
    fn send(&self, entries: Vec<Entry>) {
        let n = entries.len() as u64;
        match self.tx.try_send(Msg::Entries(entries)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(n, Ordering::Relaxed);
            }
            // The log thread is gone (shutting down): nothing to do.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// One worker's finished entries, not yet handed over. Worker-local: no lock, no atomic.
pub struct Batch {
    handle: AccessHandle,
    entries: RefCell<Vec<Entry>>,
}

impl Batch {
    pub fn new(handle: AccessHandle) -> Rc<Batch> {
        Rc::new(Batch {
            handle,
            entries: RefCell::new(Vec::with_capacity(BATCH)),
        })
    }

    fn push(&self, mut e: Box<Entry>) {
        let now = Instant::now();
        e.total = now.saturating_duration_since(e.start);
        if let Some(u) = &e.upstream {
            e.response = now.saturating_duration_since(u.timing.responded);
        }
        let mut entries = self.entries.borrow_mut();
        entries.push(*e);
        if entries.len() >= BATCH {
            let full = std::mem::replace(&mut *entries, Vec::with_capacity(BATCH));
            self.handle.send(full);
        }
    }

    /// Hands over whatever is collected; the worker calls it every [`FLUSH`] and at the end.
    pub fn flush(&self) {
        let mut entries = self.entries.borrow_mut();
        if !entries.is_empty() {
            self.handle.send(std::mem::take(&mut *entries));
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The running access log: its thread and the handle workers clone.
pub struct AccessLog {
    handle: AccessHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AccessLog {
    /// Opens the target (so a bad path fails at start, not at the first request) and starts the
    /// log thread, which inherits the calling thread's cores.
    pub fn start(config: &crate::config::AccessLog) -> io::Result<AccessLog> {
        let out = Output::open(&config.target)?;
        let (tx, rx) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let format = config.format.clone();
        let capture = Arc::new(Capture::of(&format));
        let counted = dropped.clone();
        let thread = std::thread::Builder::new()
            .name("pinlb-log".into())
            .spawn(move || write_loop(rx, out, format, counted))?;
        Ok(AccessLog {
            handle: AccessHandle {
                tx,
                dropped,
                capture,
            },
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> AccessHandle {
        self.handle.clone()
    }

    /// Closes and opens the file again (after logrotate moved it).
    pub fn reopen(&self) {
        let _ = self.handle.tx.send(Msg::Reopen);
    }

    /// Writes what is queued and ends the thread.
    pub fn stop(mut self) {
        let _ = self.handle.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Output {
    Stdout(io::Stdout),
    File(PathBuf, BufWriter<File>),
}

impl Output {
    fn open(target: &AccessTarget) -> io::Result<Output> {
        Ok(match target {
            AccessTarget::Stdout => Output::Stdout(io::stdout()),
            AccessTarget::File(path) => {
                let f = OpenOptions::new().create(true).append(true).open(path)?;
                Output::File(path.clone(), BufWriter::with_capacity(64 * 1024, f))
            }
        })
    }

    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().write_all(b),
            Output::File(_, w) => w.write_all(b),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(s) => s.lock().flush(),
            Output::File(_, w) => w.flush(),
        }
    }

    fn reopen(&mut self) -> io::Result<()> {
        if let Output::File(path, w) = self {
            w.flush()?;
            let f = OpenOptions::new().create(true).append(true).open(&*path)?;
            *w = BufWriter::with_capacity(64 * 1024, f);
        }
        Ok(())
    }
}

fn write_loop(rx: Receiver<Msg>, mut out: Output, format: AccessFormat, dropped: Arc<AtomicU64>) {
    let mut line = String::with_capacity(512);
    let mut clock = Clock::default();
    let mut reported = 0;
    // Blocks for the first message, then takes everything already queued before one flush.
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        let mut stop = false;
        while let Some(msg) = next.take() {
            match msg {
                Msg::Entries(entries) => {
                    let now = SystemTime::now();
                    for e in entries {
                        line.clear();
                        format_entry(&mut line, &e, &format, now, &mut clock);
                        if let Err(err) = out.write_all(line.as_bytes()) {
                            error!("access log: write failed: {err}");
                        }
                    }
                }
                Msg::Reopen => {
                    if let Err(err) = out.reopen() {
                        error!("access log: cannot reopen: {err}");
                    }
                }
                Msg::Stop => stop = true,
            }
            next = rx.try_recv().ok();
        }
        if let Err(err) = out.flush() {
            error!("access log: write failed: {err}");
        }
        let d = dropped.load(Ordering::Relaxed);
        if d > reported {
            warn!(
                "access log: {} line(s) dropped, the log thread fell behind",
                d - reported
            );
            reported = d;
        }
        if stop {
            return;
        }
    }
}

/// What the log thread formats once and reuses: the time (once per second), and the addresses
/// it has written (a busy log sees the same few clients and backends again and again).
#[derive(Default)]
struct Clock {
    second: u64,
    clf: String,
    ips: Formatted<std::net::IpAddr>,
    addrs: Formatted<BackendAddress>,
}

/// Most distinct addresses each cache keeps before starting over.
const CACHED: usize = 4096;

/// Addresses as text, formatted once each: the last one asked for is kept apart, since lines
/// in a row mostly name the same client and backend, and looking it up again would cost a hash.
struct Formatted<K> {
    map: std::collections::HashMap<K, String>,
    last: Option<K>,
    text: String,
}

impl<K> Default for Formatted<K> {
    fn default() -> Self {
        Formatted {
            map: std::collections::HashMap::new(),
            last: None,
            text: String::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Copy + std::fmt::Display> Formatted<K> {
    fn get(&mut self, k: K) -> &str {
        if self.last != Some(k) {
            if self.map.len() >= CACHED && !self.map.contains_key(&k) {
                self.map.clear();
            }
            let text = self.map.entry(k).or_insert_with(|| k.to_string());
            self.text.clear();
            self.text.push_str(text);
            self.last = Some(k);
        }
        &self.text
    }
}

impl Clock {
    fn ip(&mut self, ip: std::net::IpAddr) -> &str {
        self.ips.get(ip)
    }

    fn addr(&mut self, addr: BackendAddress) -> &str {
        self.addrs.get(addr)
    }

    fn clf(&mut self, now: SystemTime) -> &str {
        let second = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if second != self.second || self.clf.is_empty() {
            self.second = second;
            self.clf = clf_time(now);
        }
        &self.clf
    }
}

/// One line, newline included. The time is when the log thread writes the line (within about
/// [`FLUSH`] of the request's end).
///
/// The combined format is written by hand, integers through `itoa`, and addresses from a small
/// cache: `core::fmt` for two addresses and two floats cost more than the rest of a request's
/// logging together.
fn format_entry(
    out: &mut String,
    e: &Entry,
    format: &AccessFormat,
    now: SystemTime,
    clock: &mut Clock,
) {
    let target = e.target.as_str();
    match format {
        AccessFormat::Combined => {
            // nginx's combined format, then the backend and the two times (seconds, ms
            // resolution, as nginx's $upstream_response_time and $request_time).
            out.push_str(clock.ip(e.client.ip()));
            out.push_str(" - - [");
            out.push_str(clock.clf(now));
            out.push_str("] \"");
            escape_into(out, e.method.as_str().as_bytes());
            out.push(' ');
            escape_into(out, target.as_bytes());
            if e.ended.is_none() {
                out.push(' ');
                out.push_str(version(e.version));
            }
            out.push_str("\" ");
            out.push_str(itoa::Buffer::new().format(e.status));
            out.push(' ');
            out.push_str(itoa::Buffer::new().format(e.bytes));
            out.push_str(" \"");
            header_into(out, e.referer.as_ref());
            out.push_str("\" \"");
            header_into(out, e.user_agent.as_ref());
            out.push_str("\" ");
            match &e.upstream {
                Some(u) => {
                    out.push_str(clock.addr(u.backend));
                    out.push(' ');
                    seconds_into(out, u.timing.upstream());
                }
                None => out.push_str("- -"),
            }
            out.push(' ');
            seconds_into(out, e.total);
            if let Some(n) = e.received {
                // A tunnel's line: the bytes it carried from the client, after its duration.
                out.push(' ');
                out.push_str(itoa::Buffer::new().format(n));
            }
            if let Some(u) = e.upstream.as_ref().filter(|u| !u.timing.queue.is_zero()) {
                // A request that waited in the upstream's queue: named, since only those
                // have it.
                out.push_str(" queue=");
                seconds_into(out, u.timing.queue);
            }
            if let Some(u) = e.upstream.as_ref().filter(|u| u.tried.is_some()) {
                // A request that went to other backends first: each, with what it came to.
                out.push_str(" tried=");
                for (i, (backend, status)) in u.tried().iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(clock.addr(*backend));
                    out.push('(');
                    out.push_str(itoa::Buffer::new().format(*status));
                    out.push(')');
                }
            }
            if let Some(id) = &e.id {
                out.push_str(" id=");
                out.push_str(id.id());
            }
            if let Some(end) = e.ended {
                out.push_str(" end=");
                out.push_str(end);
            }
            out.push('\n');
        }
        AccessFormat::Json => json_into(out, e, now),
        AccessFormat::Template(t) => template_into(out, e, t, now, clock),
    }
}

/// A JSON line: every field, the timings in seconds and in microseconds. Out of line: the
/// combined format's lines do not carry its code.
#[inline(never)]
fn json_into(out: &mut String, e: &Entry, now: SystemTime) {
    let target = e.target.as_str();
    let text =
        |v: Option<&HeaderValue>| v.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let t = e.upstream.as_ref().map(|u| u.timing);
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    let us = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let v = serde_json::json!({
        "time": humantime::format_rfc3339_millis(now).to_string(),
        "client": e.client.ip().to_string(),
        "method": e.method.as_str(),
        "path": target,
        "protocol": protocol(e),
        "status": e.status,
        "bytes": e.bytes,
        "backend": e.upstream.as_ref().map(|u| u.backend.to_string()),
        "upstream_time": secs(t.map(|t| t.upstream())),
        "queue_time": secs(t.map(|t| t.queue)),
        "total_time": e.total.as_secs_f64(),
        "bytes_received": e.received,
        "referer": text(e.referer.as_ref()),
        "user_agent": text(e.user_agent.as_ref()),
        "request_id": e.id.as_ref().map(|i| i.id()),
        "trace_id": e.id.as_ref().and_then(|i| i.trace_id()),
        "upstream_connect_time": secs(t.map(|t| t.connect.unwrap_or_default())),
        "upstream_header_time": secs(t.map(|t| t.attempt())),
        "upstream_response_time": secs(t.map(|t| t.upstream() + e.response)),
        "upstream_reused": t.map(|t| t.connect.is_none()),
        "proxy_time": secs(t.map(|t| t.proxy())),
        "queue_us": us(t.map(|t| t.queue)),
        "connect_us": us(t.map(|t| t.connect.unwrap_or_default())),
        "header_us": us(t.map(|t| t.header())),
        "response_us": us(t.map(|_| e.response)),
        "total_us": us(Some(e.total)),
        "proxy_us": us(t.map(|t| t.proxy())),
        "end": e.ended,
    });
    let mut v = v;
    if let Some(c) = e.cache {
        v["cache_status"] = c.as_str().into();
    }
    if let Some(c) = e.captured.as_ref().and_then(|c| c.client.as_ref()) {
        let or_null = |s: &str| (!s.is_empty()).then(|| s.to_string());
        v["ssl_client_verify"] = c.verify.into();
        v["ssl_client_s_dn"] = or_null(&c.subject).into();
        v["ssl_client_i_dn"] = or_null(&c.issuer).into();
        v["ssl_client_serial"] = or_null(&c.serial).into();
    }
    let _ = writeln!(out, "{v}");
}

/// A `{ssl_client_*}` field: `-` without a certificate.
fn client_cert_into(out: &mut String, e: &Entry, f: crate::config::log_format::ClientCertField) {
    use crate::config::log_format::ClientCertField as F;
    let Some(c) = e.captured.as_ref().and_then(|c| c.client.as_ref()) else {
        out.push('-');
        return;
    };
    let v = match f {
        F::Subject => c.subject.as_str(),
        F::Issuer => c.issuer.as_str(),
        F::Verify => c.verify,
        F::Serial => c.serial.as_str(),
    };
    // Printable ASCII already (`tls::client_identity`); a `"` or `\\` escaped as every field.
    escape_into(out, if v.is_empty() { b"-" } else { v.as_bytes() });
}

/// A template's line. Out of line, as [`json_into`].
#[inline(never)]
fn template_into(
    out: &mut String,
    e: &Entry,
    t: &crate::config::AccessTemplate,
    now: SystemTime,
    clock: &mut Clock,
) {
    let mut headers = e.captured.iter().flat_map(|c| &c.headers);
    for part in &t.parts {
        match part {
            Part::Text(s) => out.push_str(s),
            Part::Field(f) => field_into(out, e, f, &mut headers, now, clock),
        }
    }
    out.push('\n');
}

/// One `{field}` of a template line; `-` where the request has no such value.
fn field_into<'a>(
    out: &mut String,
    e: &'a Entry,
    field: &Field,
    headers: &mut impl Iterator<Item = &'a Option<HeaderValue>>,
    now: SystemTime,
    clock: &mut Clock,
) {
    let t = e.upstream.as_ref().map(|u| u.timing);
    let opt_secs = |out: &mut String, d: Option<Duration>| match d {
        Some(d) => seconds_into(out, d),
        None => out.push('-'),
    };
    let opt_us = |out: &mut String, d: Option<Duration>| match d {
        Some(d) => out.push_str(itoa::Buffer::new().format(d.as_micros())),
        None => out.push('-'),
    };
    match field {
        Field::ClientIp => out.push_str(clock.ip(e.client.ip())),
        Field::ClientPort => out.push_str(itoa::Buffer::new().format(e.client.port())),
        Field::TimeLocal => out.push_str(clock.clf(now)),
        Field::TimeIso8601 => {
            let _ = write!(out, "{}", humantime::format_rfc3339_millis(now));
        }
        Field::Msec => {
            let d = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            let _ = write!(out, "{}.{:03}", d.as_secs(), d.subsec_millis());
        }
        Field::Request => {
            escape_into(out, e.method.as_str().as_bytes());
            out.push(' ');
            escape_into(out, e.target.as_bytes());
            if e.ended.is_none() {
                out.push(' ');
                out.push_str(version(e.version));
            }
        }
        Field::Method => escape_into(out, e.method.as_str().as_bytes()),
        Field::Uri => escape_into(out, e.target.as_bytes()),
        Field::Protocol => out.push_str(protocol(e)),
        Field::Host => header_into(out, e.captured.as_ref().and_then(|c| c.host.as_ref())),
        Field::Status => out.push_str(itoa::Buffer::new().format(e.status)),
        Field::Bytes => out.push_str(itoa::Buffer::new().format(e.bytes)),
        Field::Header(_) => header_into(out, headers.next().and_then(Option::as_ref)),
        Field::RequestId => out.push_str(e.id.as_ref().map_or("-", |i| i.id())),
        Field::TraceId => out.push_str(e.id.as_ref().and_then(|i| i.trace_id()).unwrap_or("-")),
        Field::RequestTime => seconds_into(out, e.total),
        // nginx's lists: every attempt, the answering one last.
        Field::UpstreamAddr => match &e.upstream {
            Some(u) => {
                for (backend, _) in u.tried() {
                    out.push_str(clock.addr(*backend));
                    out.push_str(", ");
                }
                out.push_str(clock.addr(u.backend));
            }
            None => out.push('-'),
        },
        Field::UpstreamStatus => match &e.upstream {
            Some(u) => {
                for (_, status) in u.tried() {
                    out.push_str(itoa::Buffer::new().format(*status));
                    out.push_str(", ");
                }
                out.push_str(itoa::Buffer::new().format(e.status));
            }
            None => out.push('-'),
        },
        Field::UpstreamConnectTime => opt_secs(out, t.map(|t| t.connect.unwrap_or_default())),
        Field::UpstreamHeaderTime => opt_secs(out, t.map(|t| t.attempt())),
        Field::UpstreamResponseTime => opt_secs(out, t.map(|t| t.upstream() + e.response)),
        Field::UpstreamReused => match t {
            Some(t) => out.push(if t.connect.is_none() { '1' } else { '0' }),
            None => out.push('-'),
        },
        Field::QueueTime => opt_secs(out, t.map(|t| t.queue)),
        Field::ProxyTime => opt_secs(out, t.map(|t| t.proxy())),
        Field::ClientCert(f) => client_cert_into(out, e, *f),
        Field::CacheStatus => out.push_str(e.cache.map_or("-", CacheStatus::as_str)),
        Field::Micros(span) => opt_us(
            out,
            match span {
                Span::Queue => t.map(|t| t.queue),
                Span::Connect => t.map(|t| t.connect.unwrap_or_default()),
                Span::Header => t.map(|t| t.header()),
                Span::Response => t.map(|_| e.response),
                Span::Total => Some(e.total),
                Span::Proxy => t.map(|t| t.proxy()),
            },
        ),
    }
}

/// The request's HTTP version, or `TCP` for a TCP listener's connection.
fn protocol(e: &Entry) -> &'static str {
    match (e.ended, e.datagrams) {
        (Some(_), true) => "UDP",
        (Some(_), false) => "TCP",
        (None, _) => version(e.version),
    }
}

fn version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/?",
    }
}

/// Seconds with millisecond resolution, rounded to nearest: `0.002`, `12.345`.
fn seconds_into(out: &mut String, d: Duration) {
    // In u64: `as_micros`'s u128 would divide through a library call, twice per line.
    let ms = d.as_secs() * 1000 + u64::from(d.subsec_micros() + 500) / 1000;
    out.push_str(itoa::Buffer::new().format(ms / 1000));
    out.push('.');
    let frac = ms % 1000;
    if frac < 100 {
        out.push('0');
    }
    if frac < 10 {
        out.push('0');
    }
    out.push_str(itoa::Buffer::new().format(frac));
}

fn header_into(out: &mut String, v: Option<&HeaderValue>) {
    match v {
        Some(v) => escape_into(out, v.as_bytes()),
        None => out.push('-'),
    }
}

/// As nginx escapes log variables: `"`, `\`, control and non-ASCII bytes become `\xHH`, so a
/// client cannot forge a line or break the quoting.
fn escape_into(out: &mut String, bytes: &[u8]) {
    let plain = |b: &u8| *b != b'"' && *b != b'\\' && (0x20..0x7f).contains(b);
    if bytes.iter().all(plain) {
        // All printable ASCII, so valid UTF-8.
        out.push_str(std::str::from_utf8(bytes).unwrap_or_default());
        return;
    }
    for &b in bytes {
        if b == b'"' || b == b'\\' || !(0x20..0x7f).contains(&b) {
            let _ = write!(out, "\\x{b:02X}");
        } else {
            out.push(char::from(b));
        }
    }
}

/// The common log format's time, in UTC: `29/Nov/2026:23:47:26 +0000`.
const CLF_TIME: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[day]/[month repr:short]/[year]:[hour]:[minute]:[second] +0000"
);

/// `t` in [`CLF_TIME`]'s form. Out of line: it runs once a second, and `time`'s formatting
/// inlined into the line's formatting made every line dearer (its callees stopped being inlined).
#[inline(never)]
fn clf_time(t: SystemTime) -> String {
    // Formatting a date and time with every component this description names cannot fail.
    time::OffsetDateTime::from(t)
        .format(CLF_TIME)
        .unwrap_or_default()
}

/// A response on its way to the client: it counts the body bytes sent and hands its [`Entry`]
/// to the log when dropped, whether the body went out whole or the client went away.
pub struct Logged(Option<(Box<Entry>, Rc<Batch>)>);

impl Logged {
    pub fn new(log: Option<(Box<Entry>, Rc<Batch>)>) -> Self {
        Logged(log)
    }

    /// `n` more body bytes went out.
    pub fn sent(&mut self, n: usize) {
        if let Some((e, _)) = self.0.as_mut() {
            e.bytes += n as u64;
        }
    }

    /// A tunnel closed, having relayed `up` bytes from the client and `down` to it.
    pub fn tunnelled(&mut self, up: u64, down: u64) {
        if let Some((e, _)) = self.0.as_mut() {
            e.bytes += down;
            e.received = Some(up);
        }
    }
}

/// A TCP listener's connection on its way: handed to the log when dropped, with what it
/// came to. One line per connection, as nginx's `stream` log: the client, the listener, the
/// status (200 relayed; 403 refused by `access`; 502 no backend connected; 503 none to
/// connect to, or the queue's wait over), the bytes each way, the backend and its connect
/// time, the duration, and how it ended.
pub struct Session(Option<(Box<Entry>, Rc<Batch>)>);

impl Session {
    /// A connection from `client` accepted `at` on `listener`; nothing is logged without a
    /// `batch` (no access log).
    pub fn start(
        client: SocketAddr,
        listener: SocketAddr,
        at: Instant,
        batch: Option<&Rc<Batch>>,
    ) -> Session {
        Session(batch.map(|b| (Entry::connection(client, listener, at), b.clone())))
    }

    /// It is a UDP listener's session.
    pub fn datagrams(&mut self) {
        if let Some((e, _)) = self.0.as_mut() {
            e.datagrams = true;
            e.method = Method::from_bytes(b"UDP").unwrap_or(Method::CONNECT);
        }
    }

    /// It ends with `status`, before or without a relay (`end=not_relayed`).
    pub fn status(&mut self, status: u16) {
        if let Some((e, _)) = self.0.as_mut() {
            e.status = status;
            e.ended = Some("not_relayed");
        }
    }

    /// It reached a backend: relayed from now on.
    pub fn connected(&mut self, upstream: Upstreamed) {
        if let Some((e, _)) = self.0.as_mut() {
            e.status = 200;
            e.upstream = Some(upstream);
        }
    }

    /// The relay ended (`end`: `closed`, `idle`, `client_closed`, `backend_closed`,
    /// `reset_client_to_backend`, `reset_backend_to_client`), having carried `up` bytes from
    /// the client and `down` to it.
    pub fn relayed(&mut self, up: u64, down: u64, end: &'static str) {
        if let Some((e, _)) = self.0.as_mut() {
            e.bytes = down;
            e.received = Some(up);
            e.ended = Some(end);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some((e, batch)) = self.0.take() {
            batch.push(e);
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some((e, batch)) = self.0.take() {
            batch.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        let mut buf = bytes::BytesMut::from(
            &b"GET /a?b=c HTTP/1.1\r\nHost: a\r\nUser-Agent: curl \"8\"\r\n\r\n"[..],
        );
        let req = crate::http1::request::parse_request(&mut buf, &Default::default())
            .unwrap()
            .unwrap();
        let client = "10.0.0.7:5555".parse().unwrap();
        let mut e = *Entry::start(&req, client, Instant::now(), None, &Capture::default());
        e.status = 200;
        e.bytes = 12;
        // 20 µs to the attempt, a 180 µs connect, 10 µs writing, 1,310 µs to the head.
        let at = Instant::now();
        let us = Duration::from_micros;
        let started = at + us(20);
        let sent = started + us(190);
        let attempt = (started, started, Some(us(180)), Some(sent));
        e.upstream = Some(Upstreamed {
            backend: "127.0.0.1:8881".parse().unwrap(),
            timing: Timing::measured(at, Duration::ZERO, attempt, sent + us(1310)),
            tried: None,
        });
        e.total = Duration::from_micros(2400);
        e.response = Duration::from_micros(900);
        e
    }

    #[test]
    fn combined_lines_read_like_nginx_with_backend_and_times_appended() {
        let mut s = String::new();
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        format_entry(
            &mut s,
            &entry(),
            &AccessFormat::Combined,
            t,
            &mut Clock::default(),
        );
        assert_eq!(
            s,
            "10.0.0.7 - - [30/Nov/2026:00:53:20 +0000] \"GET /a?b=c HTTP/1.1\" 200 12 \"-\" \"curl \\x228\\x22\" 127.0.0.1:8881 0.002 0.002\n"
        );
    }

    #[test]
    fn a_request_that_waited_in_the_queue_has_its_queue_time_in_both_formats() {
        let mut e = entry();
        if let Some(u) = &mut e.upstream {
            u.timing.queue = Duration::from_millis(250);
            u.timing.at -= Duration::from_millis(250);
        }
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_000_000);
        let mut s = String::new();
        format_entry(
            &mut s,
            &e,
            &AccessFormat::Combined,
            t,
            &mut Clock::default(),
        );
        assert!(s.ends_with(" 0.002 0.002 queue=0.250\n"), "{s}");
        let mut j = String::new();
        format_entry(&mut j, &e, &AccessFormat::Json, t, &mut Clock::default());
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["queue_time"], 0.25);
    }

    #[test]
    fn the_common_log_time_is_utc_with_the_month_by_name() {
        let at = |secs| clf_time(SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "01/Jan/1970:00:00:00 +0000");
        // The common log format's own example, 10/Oct/2000:13:55:36 -0700, in UTC.
        assert_eq!(at(971_211_336), "10/Oct/2000:20:55:36 +0000");
        assert_eq!(at(951_782_399), "28/Feb/2000:23:59:59 +0000");
        assert_eq!(at(951_782_400), "29/Feb/2000:00:00:00 +0000");
        assert_eq!(at(1_798_761_599), "31/Dec/2026:23:59:59 +0000");
        // A second's fraction is cut, not rounded.
        let late = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_000_000_999);
        assert_eq!(clf_time(late), "30/Nov/2026:00:53:20 +0000");
    }

    #[test]
    fn seconds_have_millisecond_resolution_rounded_to_nearest() {
        let s = |us| {
            let mut out = String::new();
            seconds_into(&mut out, Duration::from_micros(us));
            out
        };
        assert_eq!(s(0), "0.000");
        assert_eq!(s(499), "0.000");
        assert_eq!(s(500), "0.001");
        assert_eq!(s(42_000), "0.042");
        assert_eq!(s(12_345_678), "12.346");
        assert_eq!(s(59_999_999), "60.000");
    }

    #[test]
    fn quotes_backslashes_and_control_bytes_are_escaped() {
        let mut out = String::new();
        escape_into(&mut out, b"a\"b\\c\n\xffd");
        assert_eq!(out, "a\\x22b\\x5Cc\\x0A\\xFFd");
    }

    #[test]
    fn json_lines_carry_every_field() {
        let mut s = String::new();
        format_entry(
            &mut s,
            &entry(),
            &AccessFormat::Json,
            SystemTime::UNIX_EPOCH,
            &mut Clock::default(),
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["client"], "10.0.0.7");
        assert_eq!(v["method"], "GET");
        assert_eq!(v["path"], "/a?b=c");
        assert_eq!(v["user_agent"], "curl \"8\"");
        assert_eq!(v["status"], 200);
        assert_eq!(v["bytes"], 12);
        assert_eq!(v["backend"], "127.0.0.1:8881");
        assert_eq!(v["upstream_time"], 0.0015);
        assert_eq!(v["total_time"], 0.0024);
        assert_eq!(v["referer"], serde_json::Value::Null);
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["queue_us"], 0);
        assert_eq!(v["connect_us"], 180);
        assert_eq!(v["upstream_reused"], false);
        assert_eq!(v["header_us"], 1310);
        assert_eq!(v["response_us"], 900);
        assert_eq!(v["total_us"], 2400);
        assert_eq!(v["proxy_us"], 30);
        assert_eq!(v["upstream_header_time"], 0.0015);
        assert_eq!(v["request_id"], serde_json::Value::Null);
    }

    #[test]
    fn a_template_writes_its_fields_in_nginx_units_and_dashes_for_what_is_missing() {
        let t = crate::config::AccessTemplate::parse(
            "{remote_addr} \"{request}\" {status} {request_time} {upstream_connect_time} \
             {upstream_header_time} {upstream_response_time} {proxy_us} {upstream_reused} \
             {request_id} {http_user_agent} {http_x_nope} {{}}",
        )
        .unwrap();
        let mut s = String::new();
        let mut e = entry();
        e.captured = Some(Box::new(Captured {
            host: None,
            headers: vec![None, None],
            client: None,
        }));
        let t = AccessFormat::Template(Arc::new(t));
        let mut line = |e: &Entry| {
            s.clear();
            format_entry(&mut s, e, &t, SystemTime::UNIX_EPOCH, &mut Clock::default());
            s.clone()
        };
        assert_eq!(
            line(&e),
            "10.0.0.7 \"GET /a?b=c HTTP/1.1\" 200 0.002 0.000 0.002 0.002 30 0 - - - {}\n"
        );
        e.upstream = None;
        assert_eq!(
            line(&e),
            "10.0.0.7 \"GET /a?b=c HTTP/1.1\" 200 0.002 - - - - - - - - {}\n"
        );
    }

    #[test]
    fn a_client_certificate_is_in_the_template_fields_and_the_json_keys() {
        let t = crate::config::AccessTemplate::parse(
            "{ssl_client_verify} {ssl_client_serial} {ssl_client_s_dn} {ssl_client_i_dn}",
        )
        .unwrap();
        let t = AccessFormat::Template(Arc::new(t));
        let line = |e: &Entry, f: &AccessFormat| {
            let mut s = String::new();
            format_entry(&mut s, e, f, SystemTime::UNIX_EPOCH, &mut Clock::default());
            s
        };
        let mut e = entry();
        // A listener without client_ca: dashes, and no keys.
        assert_eq!(line(&e, &t), "- - - -\n");
        let v: serde_json::Value = serde_json::from_str(&line(&e, &AccessFormat::Json)).unwrap();
        assert!(v.get("ssl_client_verify").is_none(), "{v}");

        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let batch = Batch::new(AccessHandle {
            tx,
            dropped: Arc::default(),
            capture: Arc::default(),
        });
        let mut pending = Pending(Some((Box::new(entry()), batch)));
        let none = Arc::new(ClientIdentity::none());
        pending.client_cert(Some(&none));
        let (got, _) = pending.0.take().unwrap();
        assert_eq!(line(&got, &t), "NONE - - -\n");

        e.captured = Some(Box::new(Captured {
            client: Some(Arc::new(ClientIdentity {
                verify: "SUCCESS",
                subject: "CN=alice,O=Ex".into(),
                issuer: "CN=CA".into(),
                san: String::new(),
                serial: "1F".into(),
            })),
            ..Captured::default()
        }));
        assert_eq!(line(&e, &t), "SUCCESS 1F CN=alice,O=Ex CN=CA\n");
        let v: serde_json::Value = serde_json::from_str(&line(&e, &AccessFormat::Json)).unwrap();
        assert_eq!(v["ssl_client_verify"], "SUCCESS");
        assert_eq!(v["ssl_client_s_dn"], "CN=alice,O=Ex");
        assert_eq!(v["ssl_client_i_dn"], "CN=CA");
        assert_eq!(v["ssl_client_serial"], "1F");
    }
}
