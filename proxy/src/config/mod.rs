//! Configuration: the TOML file, in two stages.
//!
//! 1. **Raw** types (`raw.rs`) mirror the file. They deny unknown keys and keep the byte span of
//!    every value that validation may need to point at.
//! 2. [`Config`] is the validated plan (`validate.rs`, one function per section): addresses parsed,
//!    durations resolved, cores checked against the process's allowed set, upstreams referenced by
//!    index. Nothing downstream re-parses a string.
//!
//! Every default is written once: a section's in its validated type's `Default` impl, and a key
//! of a table that also has required keys (an upstream's `keepalive`, a backend's `weight`) in a
//! named serde default function in `raw.rs`.
//!
//! Every error is a [`ConfigError`] that reads `file:line:col: key: what was expected`; a file's
//! errors are reported all at once, in file order, as [`ConfigErrors`].
//!
//! - [`log_format`]: `[log] format`'s template of named fields.
//! - [`raw`]: the file's types as serde reads them, with the spans of their values, and writes
//!   them back (what `pinlb import` builds).
//! - [`edge_limits`]: the listeners' and routes' `rate_limit` and `conn_limit`, validated by
//!   their modules and set on the listeners.
//! - [`pattern`]: a regular expression from the file, compiled once and compared by pattern.
//! - [`routes`]: `[[listener.route]]`'s matches and actions checked, unreachable routes refused.
//! - [`proxy_protocol`]: the PROXY protocol's keys, on listeners and upstreams.
//! - [`outlier`]: `[upstream.NAME.outlier]`: when a backend is ejected for its answers.
//! - [`retry`]: `[upstream.NAME.retry]`: when a request moves on to the next backend, on a
//!   failure or a listed status, and the budget of retries on a status.
//! - [`tcp`]: TCP listeners (`mode = "tcp"`): the keys that apply to them and to their
//!   upstreams.
//! - [`fastcgi`]: `[upstream.NAME.fastcgi]`: a FastCGI upstream's script rules and params.
//! - [`unix_backend`]: a `unix:/path` backend's socket file checked.
//! - [`validate`]: the raw types turned into the plan, one function per section.

mod edge_limits;
mod fastcgi;
pub mod log_format;
mod outlier;
mod pattern;
mod proxy_protocol;
pub mod raw;
mod retry;
mod routes;
mod tcp;
#[cfg(test)]
mod tests;
mod unix_backend;
mod validate;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use crate::modules::buffering::Buffering;
pub use crate::modules::conn_limit::{ConnLimit, MAX_CONNS_PER_CLIENT};
pub use crate::modules::error_pages::{MAX_PAGE_BYTES, content_type_for};
pub use crate::modules::rate_limit::{RateLimit, RateZone};
pub use crate::modules::sticky::{SameSite, Sticky, is_cookie_name};
use crate::syntax::error::Source;
pub use crate::syntax::error::{ConfigError, ConfigErrors};
pub use crate::syntax::request_key::HashKey;
pub use crate::syntax::template::{Template, TemplatePart, Variable};
pub use fastcgi::Fastcgi;
pub use log_format::AccessTemplate;
pub use outlier::Outlier;
pub use pattern::Pattern;
use raw::RawConfig;
pub use retry::Retry;

use crate::backend_address::BackendAddress;
use crate::http1::request::RequestLimits;
use crate::tls::client::BackendTls;
use crate::tls::server::Terminator;

/// Balancing rule for an upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Algorithm {
    /// nginx's smooth weighted round robin.
    #[default]
    RoundRobin,
    /// Fewest in-flight requests per unit of weight, across all workers.
    LeastConn,
    /// Power of two choices: two backends drawn at random by weight, the one with fewer
    /// in-flight requests per unit of weight wins (nginx's `random two least_conn`).
    RandomTwo,
    /// Power of two choices on peak-EWMA response time × (in-flight + 1), as Finagle and
    /// Linkerd balance: a slow backend loses to a fast one until the fast one is that busy.
    Ewma,
    /// Consistent (rendezvous) hashing on [`Upstream::hash`]'s key: a key keeps its backend,
    /// and removing one of N backends moves only that backend's keys.
    Hash,
}

impl Algorithm {
    const NAMES: &'static str = "round_robin, least_conn, random_two, ewma, hash";

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round_robin",
            Algorithm::LeastConn => "least_conn",
            Algorithm::RandomTwo => "random_two",
            Algorithm::Ewma => "ewma",
            Algorithm::Hash => "hash",
        }
    }
}

/// The protocol an upstream's backends speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 on pooled keep-alive connections, through pinlb's own codec.
    #[default]
    Http1,
    /// Cleartext HTTP/2 with prior knowledge, multiplexed: what gRPC servers behind a proxy
    /// usually speak (nginx's `grpc_pass grpc://`).
    H2c,
    /// HTTP/2 over TLS (`[upstream.NAME.tls]`), chosen by ALPN, multiplexed (nginx's
    /// `grpc_pass grpcs://`).
    H2,
    /// FastCGI to a responder such as php-fpm (nginx's `fastcgi_pass`), one request at a time
    /// on each pooled connection, with the `[upstream.NAME.fastcgi]` table's script rules.
    Fastcgi,
}

impl Protocol {
    const NAMES: &'static str = "http1, h2c, h2, fastcgi";

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::H2c => "h2c",
            Protocol::H2 => "h2",
            Protocol::Fastcgi => "fastcgi",
        }
    }

    /// HTTP/2, over TLS or not.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::H2c | Protocol::H2)
    }
}

/// The validated plan pinlb runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub runtime: Runtime,
    /// What a client request may be, for every listener.
    pub limits: Limits,
    /// HTTP/2 client connections, on every listener that speaks it.
    pub http2: Http2,
    /// Peers whose X-Forwarded-For is kept (the client's address is appended); from everyone
    /// else it is replaced by the client's address, so a client cannot spoof it.
    pub trusted: Vec<ipnet::IpNet>,
    pub listeners: Vec<Listener>,
    pub upstreams: Vec<Upstream>,
    /// The admin listener (`/metrics`, `/status`, runtime control, `/reload`); `None` keeps it
    /// off, and then nothing on the request path counts metrics either.
    pub admin: Option<Admin>,
    /// Where the access log goes; `None` keeps it off.
    pub access_log: Option<AccessLog>,
    /// `[request_id]`: on (`Some`) by default while the access log is on, so that a line can be
    /// found in the backend's log by its ID; `enabled` turns it on without the log or off.
    pub request_ids: Option<crate::modules::request_id::RequestIds>,
    /// Non-fatal findings (a backend pinned to a proxy core), shown by `check` and logged at start.
    pub warnings: Vec<String>,
    /// Where backends' DNS names are looked up.
    pub resolver: Resolver,
    /// `[limit.NAME]`, in name order.
    pub rate_zones: Vec<RateZone>,
    /// `[cache.NAME]`, in name order.
    pub cache_zones: Vec<crate::modules::cache::zone::ZoneConfig>,
}

/// `[resolver]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    /// `nameservers`: these (UDP, then TCP for a truncated answer) instead of
    /// `/etc/resolv.conf`'s; empty = the system's.
    pub nameservers: Vec<SocketAddr>,
}

/// A backend given by a DNS name, which the control thread looks up at start and again every
/// [`Resolve`] interval: each address it gives becomes a backend with this entry's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedBackend {
    pub name: DnsName,
    /// Every address's weight for a host name; for SRV, the records' own weights are used.
    pub weight: u32,
    pub cpus: Option<Vec<usize>>,
    pub max_conns: usize,
    pub slow_start: Duration,
    /// `backup`, for every address the name gives.
    pub backup: bool,
}

/// What a [`NamedBackend`] looks up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DnsName {
    /// `address = "NAME:PORT"`: A and AAAA records, each address at `port`.
    Host { host: String, port: u16 },
    /// `srv = "_service._proto.NAME"`: SRV records, their targets' addresses at their ports.
    Srv(String),
}

impl std::fmt::Display for DnsName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DnsName::Host { host, port } => write!(f, "{host}:{port}"),
            DnsName::Srv(name) => write!(f, "srv {name}"),
        }
    }
}

/// `[upstream.NAME.resolve]`: when names are looked up again. The next lookup comes after the
/// answer's TTL, but no later than `interval` and no sooner than `min_interval`; after a failed
/// one, `min_interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolve {
    pub interval: Duration,
    pub min_interval: Duration,
}

impl Default for Resolve {
    fn default() -> Self {
        Resolve {
            interval: Duration::from_secs(5),
            min_interval: Duration::from_secs(1),
        }
    }
}

/// `[admin]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    pub address: SocketAddr,
    /// When set, every admin request needs `Authorization: Bearer <token>`. Required for an
    /// address other than loopback: the admin API can take backends out and reload the config.
    pub token: Option<String>,
}

impl Admin {
    pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9901";
}

/// `[log] access` and `format`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLog {
    pub target: AccessTarget,
    pub format: AccessFormat,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessTarget {
    Stdout,
    File(std::path::PathBuf),
}

/// The access log's line format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessFormat {
    /// nginx's and Apache's `combined`, with the backend and the two times appended.
    Combined,
    /// One JSON object per line, with every timing field.
    Json,
    /// A template of named fields (`log_format`), see [`log_format`].
    Template(Arc<AccessTemplate>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// One worker thread per entry, pinned to that core. Sorted, no duplicates.
    pub cpus: Vec<usize>,
    /// How long in-flight requests may run on after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// Where the running process listens for `pinlb upgrade` (a unix socket, mode 0600); no
    /// upgrades without one.
    pub upgrade_socket: Option<std::path::PathBuf>,
}

/// The defaults but `cpus`, which is empty here: it defaults to the cores the process may run on,
/// known only when the file is validated.
impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            cpus: Vec::new(),
            shutdown_timeout: Duration::from_secs(30),
            upgrade_socket: None,
        }
    }
}

/// Bounds on what one client may send, so that a malicious or broken client costs a bounded
/// amount of memory and time and gets a clear status instead of a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Request line plus headers; over it → 431.
    pub max_header_bytes: usize,
    /// Header lines per request; over it → 431.
    pub max_headers: usize,
    /// The request target as sent; over it → 414.
    pub max_uri_bytes: usize,
    /// Request body bytes; over it → 413. 0 = unlimited.
    pub max_body: u64,
    /// A request head must arrive whole within this long of its first byte (or of the accept,
    /// for a connection's first request); else 408 and close.
    pub header_timeout: Duration,
    /// Between two reads of a request body (nginx's `client_body_timeout`): a client that sends
    /// none of its body for this long gets 408 and the connection is closed; the backend never
    /// sees that request complete.
    pub body_timeout: Duration,
    /// Client connections open at once, per process. At the limit pinlb stops accepting (new
    /// connections wait in the kernel's backlog) and closes idle keep-alive connections to make
    /// room, as nginx does when `worker_connections` run out.
    pub max_connections: usize,
    /// Whether the file set `max_connections`. The default is lowered at start to what the
    /// open file limit has room for; a value the user set is kept, and warned about when it
    /// does not fit (`sys::limits::fit_nofile`).
    pub max_connections_given: bool,
}

impl Limits {
    /// Bounds on `max_header_bytes`: below 1 KiB ordinary browsers' heads fail; above 64 KiB a
    /// slow client could make each connection hold that much while its head trickles in.
    pub const HEADER_BYTES: (usize, usize) = (1024, 64 * 1024);

    /// The bounds the HTTP/1.1 codec holds each request to.
    #[inline]
    pub fn request(&self) -> RequestLimits {
        RequestLimits {
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            max_uri_bytes: self.max_uri_bytes,
            max_body: self.max_body,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        let request = RequestLimits::default();
        Limits {
            max_header_bytes: request.max_header_bytes,
            max_headers: request.max_headers,
            max_uri_bytes: request.max_uri_bytes,
            max_body: request.max_body,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            max_connections_given: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: SocketAddr,
    /// `mode`: what its connections carry.
    pub mode: ListenerMode,
    /// A UDP listener's sessions (`responses`, `session_idle`); `None` for the others.
    pub udp: Option<UdpSessions>,
    /// `[[listener.sni]]`: a TCP listener's upstreams by the TLS server name its clients ask
    /// for; empty for none (no ClientHello is read).
    pub sni: Vec<SniRoute>,
    /// Index into [`Config::upstreams`]; unused by a listener that only redirects.
    pub upstream: usize,
    /// TLS termination, its certificates read and checked; `None` for plain HTTP.
    pub tls: Option<Arc<Terminator>>,
    /// `h2c`: a plain listener also takes cleartext HTTP/2 with prior knowledge (a connection
    /// that begins with the HTTP/2 preface); every other connection is HTTP/1.1.
    pub h2c: bool,
    /// `[[listener.route]]`, in file order: the first that matches a request decides; a request
    /// no route matches goes to `upstream`, or gets 404 when the listener has none.
    pub routes: Vec<RouteRule>,
    /// Whether the listener named an `upstream` for requests no route matches.
    pub has_default: bool,
    /// `backlog`: how many connections the kernel queues, handshake done, before pinlb accepts
    /// them (`listen(2)`; nginx's `listen … backlog=`, HAProxy's `backlog`). By default the
    /// kernel's own ceiling, `net.core.somaxconn`, read when the file is validated.
    pub backlog: u32,
    /// `rate_limit`: the zones its requests must pass (a route's own list replaces it).
    pub rate_limits: Vec<RateLimit>,
    /// `conn_limit`: open connections per client address; `None`: no limit but the process's.
    pub conn_limit: Option<ConnLimit>,
    /// `proxy_protocol = true`: the networks (`proxy_protocol_from`) whose connections must
    /// begin with a PROXY protocol header naming the real client; a connection from anywhere
    /// else is refused. `None`: the listener reads no header.
    pub proxy_protocol: Option<Arc<Vec<ipnet::IpNet>>>,
    /// The feature modules that are on for its requests (`modules`).
    pub modules: crate::modules::Configs,
}

/// What a listener's connections carry (`mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListenerMode {
    /// HTTP/1.1, and HTTP/2 where the listener offers it.
    #[default]
    Http,
    /// Bytes, relayed to a backend of its upstream without being read (nginx's `stream`,
    /// HAProxy's `mode tcp`).
    Tcp,
    /// Datagrams, relayed per client address and port (nginx's `listen … udp`).
    Udp,
}

/// A UDP listener's sessions: when one ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpSessions {
    /// `responses`: the backend's answers per client datagram after which a session ends
    /// (nginx's `proxy_responses`); `None`: only `idle` ends it.
    pub responses: Option<u32>,
    /// `session_idle`: no datagram either way this long ends a session.
    pub idle: Duration,
}

impl Default for UdpSessions {
    fn default() -> Self {
        UdpSessions {
            responses: None,
            idle: Duration::from_secs(30),
        }
    }
}

/// One `[[listener.sni]]`: a TCP listener's connections whose ClientHello names one of
/// `names` (and offers one of `alpn`, when set) go to `upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniRoute {
    pub names: Vec<HostPattern>,
    /// ALPN protocols; empty: any.
    pub alpn: Vec<Vec<u8>>,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
}

/// One `[[listener.route]]`: what it matches and what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRule {
    /// Host names it matches (the Host header without its port, case-insensitive); empty: any.
    pub hosts: Vec<HostPattern>,
    /// The normalised path it matches.
    pub path: PathMatch,
    /// Methods it matches; empty: any.
    pub methods: Vec<http::Method>,
    /// Headers that must be present with exactly this value (name lower-case); all of them.
    pub headers: Vec<(String, String)>,
    pub action: RouteAction,
    /// `timeouts`: the upstream's `connect`, `response` and `send` timeouts this route changes.
    pub timeouts: RouteTimeouts,
    /// `rate_limit`: this route's own zones; `None` takes the listener's.
    pub rate_limits: Option<Vec<RateLimit>>,
    /// The feature modules that are on for its requests: its own keys over the listener's.
    pub modules: crate::modules::Configs,
}

/// A route's own timeouts; each `None` keeps the upstream's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteTimeouts {
    pub connect: Option<Duration>,
    pub response: Option<Duration>,
    pub send: Option<Duration>,
}

impl RouteTimeouts {
    /// The upstream's timeouts with this route's in their place; `None` when it changes none.
    pub fn over(&self, upstream: Timeouts) -> Option<Timeouts> {
        (*self != RouteTimeouts::default()).then(|| Timeouts {
            connect: self.connect.unwrap_or(upstream.connect),
            response: self.response.unwrap_or(upstream.response),
            send: self.send.unwrap_or(upstream.send),
            ..upstream
        })
    }
}

/// A route's `host` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostPattern {
    /// `example.com`, lower-case.
    Exact(String),
    /// `*.example.com`, kept as the suffix `.example.com`: one label or more before it.
    Suffix(String),
}

impl HostPattern {
    /// Whether a lower-case host name (no port) matches.
    pub fn matches(&self, host: &[u8]) -> bool {
        match self {
            HostPattern::Exact(h) => h.as_bytes() == host,
            HostPattern::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_bytes()),
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Suffix(s) => write!(f, "*{s}"),
        }
    }
}

/// A route's `path` (a prefix, as nginx's `location /api/`), `path_exact` (nginx's
/// `location = /old`) or `path_regex` (nginx's `location ~ \.php$`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    Prefix(String),
    Exact(String),
    /// Boxed: a compiled regex is large, and the plain variants stay the size they were.
    Regex(Box<Pattern>),
}

impl PathMatch {
    /// Whether a normalised path (no query) matches.
    pub fn matches(&self, path: &[u8]) -> bool {
        match self {
            PathMatch::Prefix(p) => path.starts_with(p.as_bytes()),
            PathMatch::Exact(p) => path == p.as_bytes(),
            PathMatch::Regex(r) => r.0.is_match(path),
        }
    }
}

impl fmt::Display for PathMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathMatch::Prefix(p) => write!(f, "{p}*"),
            PathMatch::Exact(p) => write!(f, "= {p}"),
            PathMatch::Regex(r) => write!(f, "~ {}", r.0.as_str()),
        }
    }
}

/// What a matched route does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteAction {
    /// Proxy to `upstream` (an index into [`Config::upstreams`]); with `rewrite_prefix`, the
    /// matched `path` prefix is replaced by it (nginx's `proxy_pass http://app/v2/;`).
    Proxy {
        upstream: usize,
        rewrite_prefix: Option<String>,
    },
    /// Answer `status` (301, 302, 303, 307 or 308) with a Location from a template.
    Redirect { status: u16, location: Template },
    /// Answer `status` with a fixed body (nginx's `return 403;`).
    Respond { status: u16, body: String },
}

/// `[http2]`: HTTP/2 client connections (ALPN `h2` on TLS listeners, `h2c` on plain ones).
/// The header list a stream may send is bounded by `limits.max_header_bytes`, the same limit
/// as an HTTP/1.1 head's, so one key bounds both (and an HPACK header bomb).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2 {
    /// Streams one connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); nginx's
    /// `http2_max_concurrent_streams`, 128.
    pub max_concurrent_streams: u32,
    /// The flow-control window each request stream starts with: how much of a request body a
    /// client may send before pinlb has passed it on.
    pub initial_stream_window: u32,
    /// The window for all of a connection's streams together.
    pub initial_connection_window: u32,
    /// How often an idle-looking connection is sent a PING; `None`: never (as nginx and
    /// HAProxy). Idle connections are closed by `timeouts.client_idle` either way.
    pub ping_interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub ping_timeout: Duration,
}

impl Default for Http2 {
    fn default() -> Self {
        Http2 {
            max_concurrent_streams: 128,
            initial_stream_window: 256 * 1024,
            initial_connection_window: 1024 * 1024,
            ping_interval: None,
            ping_timeout: Duration::from_secs(20),
        }
    }
}

impl Http2 {
    /// HTTP/2's largest flow-control window (RFC 9113 §6.9.1).
    pub const MAX_WINDOW: u64 = (1 << 31) - 1;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub name: String,
    pub algorithm: Algorithm,
    /// Idle connections kept per backend, per worker.
    pub keepalive: usize,
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
    /// Active health checks; `None` when the file has no `health` table (off, as in nginx).
    pub health: Option<Health>,
    pub passive: Passive,
    pub retry: Retry,
    /// `[outlier]`: backends ejected for their answers; `None` without the table.
    pub outlier: Option<Outlier>,
    pub upgrade: Upgrade,
    /// TLS to the backends, its CA and client certificates read and checked; `None` for plain
    /// TCP.
    pub tls: Option<Arc<BackendTls>>,
    /// `protocol`: what the backends speak.
    pub protocol: Protocol,
    /// `max_streams`: for an HTTP/2 upstream, the streams one backend connection carries at
    /// once before the worker opens another to that backend.
    pub max_streams: usize,
    /// `hash`: the key of a `hash` upstream; `None` for every other algorithm.
    pub hash: Option<HashKey>,
    /// `ewma_decay`: how fast an `ewma` upstream forgets a response time (the time constant of
    /// the moving average; see [`Upstream::EWMA_DECAY`]).
    pub ewma_decay: Duration,
    /// `queue`: most requests that wait, in arrival order, for a backend with room when every
    /// one is at its `max_conns` or learned limit (HAProxy's `maxqueue`); 0 = none: such a
    /// request gets a 503 at once, as in nginx. How long one may wait is `timeouts.queue`.
    /// Its default is `limits.max_connections`: over HTTP/1.1 no more requests can wait than
    /// pinlb holds connections.
    pub queue: usize,
    /// `adaptive`, `adaptive_min`, `adaptive_max`: the bounds of the concurrency limit each
    /// backend without a `max_conns` learns (`upstream::adaptive`); `None` with
    /// `adaptive = false`.
    pub adaptive: Option<Adaptive>,
    /// `max_connecting`: most connects in progress to one backend at once, across workers; the
    /// rest wait for one to finish, within their own connect timeout. 0 = unbounded.
    pub max_connecting: usize,
    /// Backends given by DNS names. `backends` holds the IP ones from the file and, once the
    /// control thread has looked them up, the addresses these gave (see `dns`).
    pub names: Vec<NamedBackend>,
    pub resolve: Resolve,
    /// `[upstream.NAME.spawn]`: pinlb runs the backends itself. `backends` then lists each
    /// process's first address (`port_base + i`) and core, which is what `check` shows; the
    /// running pool holds only the processes that answer (see `supervisor`).
    pub spawn: Option<Spawn>,
    /// `proxy_protocol`: the PROXY protocol header written first on every new backend
    /// connection; `None` for none.
    pub proxy_protocol: Option<ProxyVersion>,
    /// `[upstream.NAME.buffering]`; `None` without the table: both bodies stream, and the
    /// request path tests only this `Option`.
    pub buffering: Option<Arc<Buffering>>,
    /// `sticky`: the cookie that keeps a client on one backend; `None` without.
    pub sticky: Option<Sticky>,
    /// `[upstream.NAME.fastcgi]`: the script rules of a `protocol = "fastcgi"` upstream;
    /// `None` for every other protocol.
    pub fastcgi: Option<Arc<Fastcgi>>,
    /// Named by TCP listeners (`mode = "tcp"`): its connections are relayed, and its active
    /// check is a connect (`health.send`, `health.receive`).
    pub tcp: bool,
    /// Named by UDP listeners (`mode = "udp"`): its sessions are relayed.
    pub udp: bool,
}

/// A PROXY protocol version, as an upstream's `proxy_protocol` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyVersion {
    /// The text header (`PROXY TCP4 …`).
    V1,
    /// The binary header.
    V2,
}

/// `[upstream.NAME.spawn]`: `count` processes of `command`, process `i` pinned to
/// `cpus[i % cpus.len()]` and listening on `port_base + i` (or, after a rolling restart, on
/// `port_base + count + i`: the new process must bind while the old one still listens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spawn {
    /// argv; every `{port}` in it is replaced by the process's port.
    pub command: Vec<String>,
    pub count: usize,
    /// The cores the processes are spread over, round robin, in the order written.
    pub cpus: Vec<usize>,
    pub port_base: u16,
    /// The address the processes listen on and pinlb connects to; 127.0.0.1 unless set.
    pub host: std::net::IpAddr,
    /// Added to pinlb's own environment, after `PORT`, so a user's `PORT` wins.
    pub env: Vec<(String, String)>,
    /// Working directory; pinlb's own when unset.
    pub cwd: Option<std::path::PathBuf>,
    /// After SIGTERM, how long a process may take to exit before it gets SIGKILL
    /// (systemd's `TimeoutStopSec`, docker's `--time`).
    pub grace: Duration,
    /// How long a started process may take to answer before it counts as a failed start and
    /// is killed and started again.
    pub ready_timeout: Duration,
    /// The upstream's `max_conns` and `slow_start`, for each process's backend.
    pub max_conns: usize,
    pub slow_start: Duration,
    /// With `{socket}` in `command`: the processes listen on Unix sockets, process `i` of port
    /// range `bank` on `PREFIX-i-bank.sock`, and this is `PREFIX` (the upstream's name in
    /// [`Spawn::socket_dir`]). Their ports still tell the ranges apart, and are in `PORT`.
    pub socket: Option<std::path::PathBuf>,
}

impl Spawn {
    /// `grace`'s default: what systemd and docker give a service to stop.
    pub const GRACE: Duration = Duration::from_secs(10);
    /// `ready_timeout`'s default.
    pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

    /// The core of process `i`.
    pub fn core(&self, i: usize) -> usize {
        self.cpus[i % self.cpus.len()]
    }

    /// Process `i`'s address in port range `bank` (0 or 1). Validation keeps both ranges below
    /// 65536.
    pub fn address(&self, i: usize, bank: usize) -> SocketAddr {
        let port = usize::from(self.port_base) + bank * self.count + i;
        SocketAddr::new(self.host, u16::try_from(port).unwrap_or(u16::MAX))
    }

    /// The directory of spawned processes' sockets: this pinlb process's own,
    /// `$XDG_RUNTIME_DIR/pinlb-PID` (systemd's per-user runtime directory, as its services'
    /// sockets go), else `pinlb-PID` in the system's temporary directory (`$TMPDIR`, `/tmp`).
    /// Created mode 0700 when the first process starts, removed when pinlb stops.
    pub fn socket_dir() -> std::path::PathBuf {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(std::path::PathBuf::from)
            .filter(|d| d.is_absolute() && d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("pinlb-{}", std::process::id()))
    }

    /// Process `i`'s socket in port range `bank`, when the processes listen on sockets.
    pub fn socket_path(&self, i: usize, bank: usize) -> Option<std::path::PathBuf> {
        let prefix = self.socket.as_ref()?;
        Some(std::path::PathBuf::from(format!(
            "{}-{i}-{bank}.sock",
            prefix.display()
        )))
    }

    /// Process `i`'s backend address in port range `bank`: its socket, else its TCP address.
    pub fn backend_address(&self, i: usize, bank: usize) -> BackendAddress {
        match self.socket_path(i, bank) {
            Some(p) => BackendAddress::Unix(crate::backend_address::intern(&p)),
            None => self.address(i, bank).into(),
        }
    }

    /// Whether `other` runs the same processes: the same program, arguments, environment,
    /// cores and ports. Only a change there restarts them; `grace`, `ready_timeout`,
    /// `max_conns` and `slow_start` apply to the running ones.
    pub fn same_processes(&self, other: &Spawn) -> bool {
        (
            &self.command,
            self.count,
            &self.cpus,
            self.port_base,
            self.host,
            &self.env,
            &self.cwd,
            &self.socket,
        ) == (
            &other.command,
            other.count,
            &other.cpus,
            other.port_base,
            other.host,
            &other.env,
            &other.cwd,
            &other.socket,
        )
    }

    /// The backend process `i` is in the pool as, on port range `bank`.
    pub fn backend(&self, i: usize, bank: usize) -> Backend {
        Backend {
            address: self.backend_address(i, bank),
            weight: 1,
            cpus: Some(vec![self.core(i)]),
            max_conns: self.max_conns,
            slow_start: self.slow_start,
            backup: false,
        }
    }

    /// The argv for process `i` of port range `bank`: `{port}` replaced by its port, and
    /// `{socket}` by its socket's path.
    pub fn argv(&self, i: usize, bank: usize) -> Vec<String> {
        let port = self.address(i, bank).port().to_string();
        let socket = self
            .socket_path(i, bank)
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        self.command
            .iter()
            .map(|a| a.replace("{port}", &port).replace("{socket}", &socket))
            .collect()
    }
}

/// The bounds of a learned concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adaptive {
    pub min: usize,
    pub max: usize,
}

impl Adaptive {
    /// The defaults: a floor of 2 lets a one-at-a-time backend be sent its next request while
    /// it answers one; the ceiling is Envoy's `max_concurrency_limit` default.
    pub const DEFAULT: Adaptive = Adaptive { min: 2, max: 1000 };
}

impl Upstream {
    /// `max_connecting`'s default: a quarter of the listen backlog Node.js and nginx ask for
    /// (511). A backend whose accept queue is full drops SYNs, and each dropped one waits a
    /// second for its retransmission; past this many connects in progress, more cannot get in
    /// sooner, so the rest wait for one of them instead of adding to the pile.
    pub const MAX_CONNECTING: usize = 128;
    /// `ewma_decay`'s default: 1 s, not Finagle's and Linkerd's 10 s. The peak EWMA holds a
    /// backend's worst recent response for about this long, and backends on the same machine
    /// answer thousands of requests a second each in well under a millisecond: with 10 s, one
    /// scheduling hiccup on a fast backend made it look as slow as a 5 ms-slow one for seconds,
    /// and `benches/balance.sh` sent 1.1% of requests to that slow backend (p99 0.89× round
    /// robin's); with 1 s, 0.5% (p99 0.11×). A backend that turns slow is still avoided from its
    /// first slow answer: a peak replaces the average at once, whatever the decay.
    pub const EWMA_DECAY: Duration = Duration::from_secs(1);

    /// `max_streams`' default: the least an HTTP/2 server should allow (RFC 9113 §6.5.2
    /// recommends no fewer than 100), and what most advertise.
    pub const MAX_STREAMS: usize = 100;
}

/// Upgrades (WebSocket) and the tunnels they become. Kept out of [`Timeouts`], which every
/// request copies into its state: a longer copy there costs every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upgrade {
    /// `upgrade`: whether a request that asks to upgrade goes to the backend with its `Upgrade`
    /// and `Connection: upgrade`, so that a `101` turns the connection into a tunnel. On by
    /// default: nginx users add those two lines for every WebSocket app, and a proxy that
    /// breaks socket.io until told otherwise surprises more than one that passes an upgrade the
    /// client asked for.
    pub enabled: bool,
    /// `timeouts.tunnel_idle`: a tunnel that carries no byte either way for this long is
    /// closed, as HAProxy's `timeout tunnel`.
    pub tunnel_idle: Duration,
    /// `timeouts.tunnel_fin`: once one side of a tunnel has closed its sending half (a FIN
    /// passed on to the other), how long the other side has to close its own before the
    /// tunnel is closed: HAProxy's `timeout client-fin` and `timeout server-fin` in one key.
    pub tunnel_fin: Duration,
}

impl Default for Upgrade {
    fn default() -> Self {
        Upgrade {
            enabled: true,
            // An hour, as HAProxy's documentation suggests for `timeout tunnel`: far longer than
            // any application heartbeat (socket.io pings every 25 s), so that a quiet but live
            // WebSocket is not cut, while a peer that vanished is still let go in the end.
            tunnel_idle: Duration::from_secs(3600),
            // nginx's `lingering_timeout`: a peer that is closing answers a FIN within a round
            // trip or two; one that has not after 5 s is not closing, and without this bound it
            // would hold its connection (and its backend's count in flight) for `tunnel_idle`.
            tunnel_fin: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// `IP:PORT`, or `unix:/path` for a Unix socket.
    pub address: BackendAddress,
    pub weight: u32,
    /// Cores the backend is pinned to, if the user said so; used only for warnings and the plan.
    pub cpus: Option<Vec<usize>>,
    /// Most requests in flight to this backend across all workers; 0 = unlimited.
    pub max_conns: usize,
    /// After the backend comes back up, its weight ramps from ~0 to `weight` over this long;
    /// zero = at once.
    pub slow_start: Duration,
    /// `backup`: picked only while no primary (non-backup) backend is available (nginx's
    /// `backup`).
    pub backup: bool,
}

/// Active health checks, with HAProxy's semantics: `fall` consecutive failed probes take a
/// backend down, `rise` consecutive passing ones bring it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Path of the `GET` probe, origin-form.
    pub path: String,
    /// Time between two probes of one backend.
    pub interval: Duration,
    /// Budget for one probe, from connect to the end of the response body; less than `interval`.
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// Statuses that pass.
    pub expect: StatusSet,
    /// Host header of the probe; the backend's address when unset.
    pub host: Option<String>,
    /// A TCP upstream's probe (`send`, `receive`); `None` for an HTTP upstream's `GET`.
    pub tcp: Option<TcpCheck>,
}

/// A TCP upstream's active check, HAProxy's `tcp-check`: a connect, then, when set, `send`
/// written and the first bytes of the answer compared with `receive` (Redis: `PING\r\n` and
/// `+PONG`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpCheck {
    pub send: Vec<u8>,
    pub receive: Vec<u8>,
    /// `check = "mysql"` (HAProxy's `mysql-check`): the server's greeting is read, and passes
    /// when it is a handshake (protocol 10), not an error packet ("Too many connections",
    /// "Host is blocked").
    pub mysql: bool,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            path: "/".to_string(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
            expect: StatusSet(vec![(200, 399)]),
            host: None,
            tcp: None,
        }
    }
}

/// Passive failure detection, with nginx's semantics: `max_fails` failed attempts within
/// `fail_timeout` make the backend skipped for `fail_timeout`; then one request is let through as
/// a trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passive {
    /// 0 turns passive detection off.
    pub max_fails: u32,
    pub fail_timeout: Duration,
    /// Backend responses with these statuses count as failed attempts too (they are still passed
    /// to the client, not retried).
    pub fail_on_status: StatusSet,
}

impl Default for Passive {
    fn default() -> Self {
        Passive {
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
            fail_on_status: StatusSet::default(),
        }
    }
}

/// A set of HTTP statuses, written `"200-399"`, `204`, or a list of those.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusSet(Vec<(u16, u16)>);

impl StatusSet {
    pub fn contains(&self, status: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= status && status <= hi)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Budget for one TCP connect to a backend.
    pub connect: Duration,
    /// From the end of the request (its body fully sent) until the backend's response headers
    /// arrive, like nginx's proxy_read_timeout for the first byte; a slow upload is not cut off.
    pub response: Duration,
    /// The longest wait for room to write the request to a backend that takes no data (nginx's
    /// proxy_send_timeout): a backend that stops reading an upload cannot hold it forever.
    pub send: Duration,
    /// An idle client keep-alive connection is closed after this.
    pub client_idle: Duration,
    /// The longest a request waits in the upstream's `queue` before it gets a 503.
    pub queue: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            // Slightly above 3 s, as HAProxy's documentation advises: a SYN that a busy
            // backend's full accept queue dropped is sent again after 1 s and 3 s, so 5 s lets
            // two retransmissions through. At 1 s, one dropped SYN failed the connect, and a
            // busy backend looked dead.
            connect: Duration::from_secs(5),
            response: Duration::from_secs(60),
            send: Duration::from_secs(60),
            client_idle: Duration::from_secs(60),
            // As long as common clients wait for an answer (ab's and many HTTP libraries'
            // 30 s): a request still queued past that has most likely been given up on, and
            // its 503 with Retry-After says when to come back.
            queue: Duration::from_secs(30),
        }
    }
}

impl Config {
    /// Descriptors this configuration keeps open beside its proxied connections (see
    /// [`crate::sys::limits::reserved_descriptors`]).
    pub fn reserved_descriptors(&self) -> u64 {
        crate::sys::limits::reserved_descriptors(
            self.runtime.cpus.len(),
            self.listeners.len(),
            self.upstreams.iter().map(|u| u.backends.len()).sum(),
            self.runtime.upgrade_socket.is_some(),
        )
    }

    /// Reads and validates `path` against the cores this process may run on.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let allowed = crate::sys::cpus::allowed_cpus().unwrap_or_default();
        Config::load_for(path, &allowed)
    }

    /// Reads and validates `path` against `allowed` cores: a reload runs on a thread pinned to
    /// `runtime.cpus`, so it passes the set the process had at start.
    pub fn load_for(path: &Path, allowed: &[usize]) -> Result<Config, ConfigErrors> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::unreadable(&name, &e))?;
        Config::parse(&name, &text, allowed)
    }

    /// Parses and validates `text`; `file` is only used in messages. `allowed` is the set of cores
    /// the process may run on (the default for `runtime.cpus`).
    ///
    /// Syntax errors stop at themselves: nothing after one can be read reliably. Unknown keys and
    /// values of the wrong type are all reported ([`RawConfig::parse`]), and the rest of the
    /// file is validated without them: every section, every upstream and every listener, and
    /// every error is reported, in file order. An error that only follows from a key left out
    /// (its table's, or about its value) is not reported again. A check that depends on a section that failed is skipped rather
    /// than reported as a second, confusing error: a listener may name an upstream that failed,
    /// and the spawned ports are checked only once every upstream is valid.
    pub fn parse(file: &str, text: &str, allowed: &[usize]) -> Result<Config, ConfigErrors> {
        let src = Source { file, text };
        let raw::Parsed {
            raw,
            errors: wrong_keys,
            dropped,
        } = RawConfig::parse(&src)?;
        let mut errors = Vec::new();
        let e = &mut errors;
        let runtime = kept(e, validate::runtime(&src, &raw.runtime, allowed));
        let limits = kept(e, validate::limits(&src, &raw.limits));
        let http2 = kept(e, validate::http2(&src, &raw.http2));
        let mut warnings = Vec::new();
        // Without valid cores, no backend can be found to overlap the workers'.
        let worker_cpus = runtime.as_ref().map_or(&[][..], |r| &r.cpus[..]);
        let mut upstreams = Vec::with_capacity(raw.upstream.len());
        for (name, up) in &raw.upstream {
            let max_connections = limits
                .as_ref()
                .map_or(Limits::default().max_connections, |l| l.max_connections);
            let u = validate::upstream(
                &src,
                name,
                up,
                worker_cpus,
                allowed,
                max_connections,
                &mut warnings,
            );
            upstreams.push(kept(e, u));
        }
        let names: Vec<&str> = raw.upstream.keys().map(String::as_str).collect();
        let caches: Vec<&str> = raw.cache.keys().map(String::as_str).collect();
        let cache_zones = kept(e, crate::modules::cache::zone::zones(&src, &raw.cache));
        let listeners = kept(
            e,
            validate::listeners(&src, &raw.listeners, &names, &caches),
        );
        let trusted = kept(e, validate::forwarded(&src, &raw.forwarded));
        // The addresses of the listeners that give a valid one, whatever else they get wrong.
        let mut taken: Vec<SocketAddr> = raw
            .listeners
            .iter()
            .filter_map(|l| l.address.get_ref().parse().ok())
            .collect();
        let admin = raw
            .admin
            .as_ref()
            .map(|a| kept(e, validate::admin(&src, a, &taken)));
        let access_log = kept(e, validate::log(&src, &raw.log));
        let logging = access_log.as_ref().is_some_and(Option::is_some);
        let request_ids = kept(
            e,
            crate::modules::request_id::validate(&src, raw.request_id.as_ref(), logging),
        );
        let resolver = kept(e, validate::resolver(&src, &raw.resolver));
        let mut listeners = listeners;
        let rate_zones = kept(e, crate::modules::rate_limit::zones(&src, &raw.limit));
        if let (Some(ls), Some(zones)) = (&mut listeners, &rate_zones) {
            kept(e, edge_limits::attach(&src, &raw.listeners, ls, zones));
        }
        taken.extend(admin.iter().flatten().map(|a| a.address));
        let mut upstreams: Option<Vec<Upstream>> = upstreams.into_iter().collect();
        if let Some(upstreams) = &upstreams {
            kept(
                e,
                validate::spawn_ports(&src, &raw.upstream, upstreams, &taken),
            );
        }
        if let (Some(ls), Some(ups)) = (&listeners, &mut upstreams) {
            kept(
                e,
                tcp::upstreams(&src, &raw.listeners, ls, &raw.upstream, ups),
            );
        }
        errors.retain(|e| !dropped.iter().any(|d| raw::follows_from(&e.key, d)));
        errors.extend(wrong_keys);
        if let Some(errors) = ConfigErrors::new(errors) {
            return Err(errors);
        }
        let (
            Some(runtime),
            Some(limits),
            Some(http2),
            Some(upstreams),
            Some(listeners),
            Some(trusted),
            Some(access_log),
            Some(request_ids),
            Some(resolver),
            Some(rate_zones),
            Some(cache_zones),
        ) = (
            runtime,
            limits,
            http2,
            upstreams,
            listeners,
            trusted,
            access_log,
            request_ids,
            resolver,
            rate_zones,
            cache_zones,
        )
        else {
            unreachable!("a section that failed left an error");
        };
        let admin = admin.map(|a| a.expect("an [admin] that failed left an error"));
        Ok(Config {
            runtime,
            limits,
            http2,
            trusted,
            listeners,
            upstreams,
            admin,
            access_log,
            request_ids,
            warnings,
            resolver,
            rate_zones,
            cache_zones,
        })
    }
}

/// `r`'s value, or `None` with its errors added to `errors`.
fn kept<T, E: Into<ConfigErrors>>(
    errors: &mut Vec<ConfigError>,
    r: std::result::Result<T, E>,
) -> Option<T> {
    r.map_err(|e| errors.extend(e.into().into_errors())).ok()
}
