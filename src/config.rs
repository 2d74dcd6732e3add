//! Configuration: the TOML file, in two stages.
//!
//! 1. **Raw** types mirror the file. They deny unknown keys and keep the byte span of every value
//!    that validation may need to point at.
//! 2. [`Config`] is the validated plan: addresses parsed, durations resolved, cores checked against
//!    the process's allowed set, upstreams referenced by index. Nothing downstream re-parses a
//!    string.
//!
//! Every error is a [`ConfigError`] that reads `file:line:col: key: what was expected`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

use crate::cpus::{format_cpu_list, parse_cpu_list};

/// A configuration error that points at the offending place in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{col}: {}{message}", key_prefix(.key))]
pub struct ConfigError {
    /// The file name as the user gave it.
    pub file: String,
    /// 1-based line of the offending value.
    pub line: usize,
    /// 1-based column (in characters) of the offending value.
    pub col: usize,
    /// Dotted key path, e.g. `upstream.app.algorithm`; empty for syntax errors.
    pub key: String,
    /// What was wrong and what was expected.
    pub message: String,
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{key}: ")
    }
}

/// Balancing rule for an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// nginx's smooth weighted round robin.
    RoundRobin,
    /// Fewest in-flight requests per unit of weight, across all workers.
    LeastConn,
}

impl Algorithm {
    const NAMES: &'static str = "round_robin, least_conn";

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round_robin",
            Algorithm::LeastConn => "least_conn",
        }
    }
}

impl<'de> Deserialize<'de> for Algorithm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "round_robin" => Ok(Algorithm::RoundRobin),
            "least_conn" => Ok(Algorithm::LeastConn),
            other => Err(de::Error::custom(format!(
                "unknown value \"{other}\", expected one of {}",
                Algorithm::NAMES
            ))),
        }
    }
}

/// A duration written as a string with a unit: "250ms", "2s", "1m".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dur(Duration);

impl Dur {
    /// The longest duration any key accepts.
    const MAX: Duration = Duration::from_secs(365 * 86_400);
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string with a unit, such as \"250ms\", \"2s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                let d = humantime::parse_duration(s).map_err(|_| {
                    E::custom(format!(
                        "invalid duration \"{s}\", expected a number with a unit, such as \"250ms\", \"2s\" or \"1m\""
                    ))
                })?;
                // No timeout needs more, and a deadline of now plus any such duration cannot
                // overflow a clock: the request path adds them without checking.
                if d > Dur::MAX {
                    return Err(E::custom(format!(
                        "duration \"{s}\" is too long, expected at most 365 days"
                    )));
                }
                Ok(Dur(d))
            }
        }
        d.deserialize_str(V)
    }
}

/// A list of cores: `[0, 2]`, `"2-5"`, `"0,2-3"` or `[0, "2-5"]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CpuList(Vec<usize>);

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a core id, a range string like \"2-5\", or a list of them";
        impl<'de> Visitor<'de> for V {
            type Value = CpuList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<CpuList, E> {
                usize::try_from(v)
                    .map(|c| CpuList(vec![c]))
                    .map_err(|_| E::custom(format!("invalid core {v}, expected {EXPECTED}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<CpuList, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<CpuList, E> {
                parse_cpu_list(s).map(CpuList).map_err(|e| {
                    E::custom(format!(
                        "invalid core list \"{s}\" ({e}), expected {EXPECTED}"
                    ))
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CpuList, A::Error> {
                let mut out = Vec::new();
                while let Some(CpuList(part)) = seq.next_element::<CpuList>()? {
                    out.extend(part);
                }
                Ok(CpuList(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(default, rename = "listener")]
    listeners: Vec<RawListener>,
    #[serde(default)]
    upstream: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    forwarded: RawForwarded,
    admin: Option<RawAdmin>,
    #[serde(default)]
    log: RawLog,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    address: Option<Spanned<String>>,
    token: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    access: Option<Spanned<String>>,
    format: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawForwarded {
    #[serde(default)]
    trusted: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    max_header_bytes: Option<Spanned<Size>>,
    max_headers: Option<Spanned<usize>>,
    max_uri_bytes: Option<Spanned<Size>>,
    max_body: Option<Spanned<Size>>,
    header_timeout: Option<Spanned<Dur>>,
    body_timeout: Option<Spanned<Dur>>,
    max_connections: Option<Spanned<usize>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    cpus: Option<Spanned<CpuList>>,
    shutdown_timeout: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    address: Spanned<String>,
    upstream: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    #[serde(default = "default_algorithm")]
    algorithm: Algorithm,
    #[serde(default = "default_keepalive")]
    keepalive: usize,
    backends: Spanned<Vec<RawBackend>>,
    #[serde(default)]
    timeouts: RawTimeouts,
    /// Default for every backend's `max_conns`.
    #[serde(default)]
    max_conns: usize,
    /// Default for every backend's `slow_start`.
    slow_start: Option<Dur>,
    health: Option<RawHealth>,
    #[serde(default)]
    passive: RawPassive,
    #[serde(default)]
    retry: RawRetry,
}

fn default_algorithm() -> Algorithm {
    Algorithm::RoundRobin
}

fn default_keepalive() -> usize {
    64
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    address: Spanned<String>,
    #[serde(default = "default_weight")]
    weight: Spanned<u32>,
    cpus: Option<Spanned<CpuList>>,
    max_conns: Option<usize>,
    slow_start: Option<Dur>,
}

fn default_weight() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect: Option<Spanned<Dur>>,
    response: Option<Spanned<Dur>>,
    send: Option<Spanned<Dur>>,
    client_idle: Option<Spanned<Dur>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    path: Option<Spanned<String>>,
    interval: Option<Spanned<Dur>>,
    timeout: Option<Spanned<Dur>>,
    rise: Option<Spanned<u32>>,
    fall: Option<Spanned<u32>>,
    expect: Option<Spanned<StatusSet>>,
    host: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPassive {
    max_fails: Option<u32>,
    fail_timeout: Option<Spanned<Dur>>,
    fail_on_status: Option<StatusSet>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    tries: Option<usize>,
    timeout: Option<Spanned<Dur>>,
    #[serde(default)]
    non_idempotent: bool,
    buffer: Option<Size>,
}

/// The validated plan pinlb runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub runtime: Runtime,
    /// What a client request may be, for every listener.
    pub limits: Limits,
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
    /// Non-fatal findings (a backend pinned to a proxy core), shown by `check` and logged at start.
    pub warnings: Vec<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessFormat {
    /// nginx's and Apache's `combined`, with the backend and the two times appended.
    Combined,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// One worker thread per entry, pinned to that core. Sorted, no duplicates.
    pub cpus: Vec<usize>,
    /// How long in-flight requests may run on after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
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
}

impl Limits {
    /// Bounds on `max_header_bytes`: below 1 KiB ordinary browsers' heads fail; above 64 KiB a
    /// slow client could make each connection hold that much while its head trickles in.
    pub const HEADER_BYTES: (usize, usize) = (1024, 64 * 1024);
    /// Most `max_headers`: the parser keeps room for that many on the stack per request.
    pub const MAX_HEADERS: usize = 1000;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_body: 0,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: SocketAddr,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub address: SocketAddr,
    pub weight: u32,
    /// Cores the backend is pinned to, if the user said so; used only for warnings and the plan.
    pub cpus: Option<Vec<usize>>,
    /// Most requests in flight to this backend across all workers; 0 = unlimited.
    pub max_conns: usize,
    /// After the backend comes back up, its weight ramps from ~0 to `weight` over this long;
    /// zero = at once.
    pub slow_start: Duration,
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

/// When a failed attempt moves on to another backend, with nginx's `proxy_next_upstream` rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Most attempts per request, the first included; 0 = every eligible backend once.
    pub tries: usize,
    /// No new attempt starts once this long has passed since the first.
    pub timeout: Duration,
    /// Whether POST, PATCH and other non-idempotent requests may be sent again after the backend
    /// may have seen them.
    pub non_idempotent: bool,
    /// Request bodies up to this many bytes are kept so they can be sent again.
    pub buffer: usize,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            tries: 0,
            timeout: Duration::from_secs(10),
            non_idempotent: false,
            buffer: 64 * 1024,
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

impl<'de> Deserialize<'de> for StatusSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str =
            "a status such as 200, a range string like \"200-399\", or a list of them";
        fn status<E: de::Error>(v: i64) -> Result<u16, E> {
            u16::try_from(v)
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| E::custom(format!("invalid status {v}, expected 100 to 599")))
        }
        impl<'de> Visitor<'de> for V {
            type Value = StatusSet;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusSet, E> {
                let s = status(v)?;
                Ok(StatusSet(vec![(s, s)]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusSet, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StatusSet, E> {
                let bad =
                    || E::custom(format!("invalid status range \"{s}\", expected {EXPECTED}"));
                let (lo, hi) = s.split_once('-').unwrap_or((s, s));
                let lo = status(lo.trim().parse().map_err(|_| bad())?)?;
                let hi = status(hi.trim().parse().map_err(|_| bad())?)?;
                if lo > hi {
                    return Err(bad());
                }
                Ok(StatusSet(vec![(lo, hi)]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StatusSet, A::Error> {
                let mut out = Vec::new();
                while let Some(StatusSet(part)) = seq.next_element::<StatusSet>()? {
                    out.extend(part);
                }
                Ok(StatusSet(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A size in bytes: `4096`, `"64KiB"`, `"1MiB"`, `"0"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Size(u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a size such as 4096, \"64KiB\" or \"1MiB\"";
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("invalid size {v}, expected {EXPECTED}")))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                s.parse::<bytesize::ByteSize>()
                    .map(|b| Size(b.as_u64()))
                    .map_err(|_| E::custom(format!("invalid size \"{s}\", expected {EXPECTED}")))
            }
        }
        d.deserialize_any(V)
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
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(60),
            send: Duration::from_secs(60),
            client_idle: Duration::from_secs(60),
        }
    }
}

const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

impl Config {
    /// Reads and validates `path` against the cores this process may run on.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let allowed = crate::cpus::allowed_cpus().unwrap_or_default();
        Config::load_for(path, &allowed)
    }

    /// Reads and validates `path` against `allowed` cores: a reload runs on a thread pinned to
    /// `runtime.cpus`, so it passes the set the process had at start.
    pub fn load_for(path: &Path, allowed: &[usize]) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            line: 0,
            col: 0,
            key: String::new(),
            message: format!("cannot read file: {e}"),
        })?;
        Config::parse(&name, &text, allowed)
    }

    /// Parses and validates `text`; `file` is only used in messages. `allowed` is the set of cores
    /// the process may run on (the default for `runtime.cpus`).
    pub fn parse(file: &str, text: &str, allowed: &[usize]) -> Result<Config, ConfigError> {
        let at = |span: std::ops::Range<usize>, key: &str, message: String| {
            let (line, col) = line_col(text, span.start);
            ConfigError {
                file: file.to_string(),
                line,
                col,
                key: key.to_string(),
                message,
            }
        };

        let de = toml::Deserializer::parse(text)
            .map_err(|e| at(e.span().unwrap_or(0..0), "", e.message().to_string()))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            // `Spanned` values deserialize through a private field; users never wrote that key.
            let key = e
                .path()
                .to_string()
                .replace(".$__serde_spanned_private_value", "");
            let inner = e.into_inner();
            let key = if key == "." { String::new() } else { key };
            at(
                inner.span().unwrap_or(0..0),
                &key,
                inner.message().to_string(),
            )
        })?;

        let cpus = match &raw.runtime.cpus {
            None => {
                if allowed.is_empty() {
                    return Err(at(
                        0..0,
                        "runtime.cpus",
                        "cannot read the cores this process may run on; list them explicitly"
                            .into(),
                    ));
                }
                allowed.to_vec()
            }
            Some(list) => {
                let mut cpus = list.get_ref().0.clone();
                cpus.sort_unstable();
                cpus.dedup();
                if cpus.is_empty() {
                    return Err(at(
                        list.span(),
                        "runtime.cpus",
                        "expected at least one core".into(),
                    ));
                }
                if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
                    return Err(at(
                        list.span(),
                        "runtime.cpus",
                        format!(
                            "core {bad} is not in this process's allowed set {}",
                            format_cpu_list(allowed)
                        ),
                    ));
                }
                cpus
            }
        };
        let runtime = Runtime {
            cpus,
            shutdown_timeout: raw
                .runtime
                .shutdown_timeout
                .map_or(DEFAULT_SHUTDOWN_TIMEOUT, |d| d.0),
        };

        // A zero timeout or interval would fail every request or close every connection at once.
        let positive = |v: &Option<Spanned<Dur>>, key: &str| match v {
            None => Ok(None),
            Some(x) if x.get_ref().0.is_zero() => Err(at(
                x.span(),
                key,
                "a duration of 0 is not allowed, expected a positive duration such as \"1s\""
                    .into(),
            )),
            Some(x) => Ok(Some(x.get_ref().0)),
        };

        let limits = {
            let l = &raw.limits;
            let d = Limits::default();
            let (lo, hi) = Limits::HEADER_BYTES;
            let max_header_bytes = match &l.max_header_bytes {
                None => d.max_header_bytes,
                Some(v) => usize::try_from(v.get_ref().0)
                    .ok()
                    .filter(|n| (lo..=hi).contains(n))
                    .ok_or_else(|| {
                        at(
                            v.span(),
                            "limits.max_header_bytes",
                            format!(
                                "{} bytes is out of range, expected \"1KiB\" to \"64KiB\"",
                                v.get_ref().0
                            ),
                        )
                    })?,
            };
            let max_headers = match &l.max_headers {
                None => d.max_headers,
                Some(v) if (1..=Limits::MAX_HEADERS).contains(v.get_ref()) => *v.get_ref(),
                Some(v) => {
                    return Err(at(
                        v.span(),
                        "limits.max_headers",
                        format!(
                            "{} is out of range, expected 1 to {}",
                            v.get_ref(),
                            Limits::MAX_HEADERS
                        ),
                    ));
                }
            };
            let max_uri_bytes = match &l.max_uri_bytes {
                None => d.max_uri_bytes,
                Some(v) if v.get_ref().0 == 0 => {
                    return Err(at(
                        v.span(),
                        "limits.max_uri_bytes",
                        "0 is not allowed, expected a size such as \"8KiB\"".into(),
                    ));
                }
                Some(v) => usize::try_from(v.get_ref().0).unwrap_or(usize::MAX),
            };
            Limits {
                max_header_bytes,
                max_headers,
                max_uri_bytes,
                max_body: l.max_body.as_ref().map_or(d.max_body, |v| v.get_ref().0),
                header_timeout: positive(&l.header_timeout, "limits.header_timeout")?
                    .unwrap_or(d.header_timeout),
                body_timeout: positive(&l.body_timeout, "limits.body_timeout")?
                    .unwrap_or(d.body_timeout),
                max_connections: match &l.max_connections {
                    None => d.max_connections,
                    // tokio's semaphore holds at most usize::MAX >> 3 permits.
                    Some(v) if (1..=1 << 40).contains(v.get_ref()) => *v.get_ref(),
                    Some(v) => {
                        return Err(at(
                            v.span(),
                            "limits.max_connections",
                            format!(
                                "{} is out of range, expected 1 to {}",
                                v.get_ref(),
                                1u64 << 40
                            ),
                        ));
                    }
                },
            }
        };

        let mut warnings = Vec::new();
        let mut upstreams = Vec::with_capacity(raw.upstream.len());
        let mut seen = HashSet::new();
        for (name, up) in &raw.upstream {
            let key = format!("upstream.{name}");
            if up.backends.get_ref().is_empty() {
                return Err(at(
                    up.backends.span(),
                    &format!("{key}.backends"),
                    "an upstream needs at least one backend".into(),
                ));
            }
            let mut backends = Vec::with_capacity(up.backends.get_ref().len());
            for (i, b) in up.backends.get_ref().iter().enumerate() {
                let bkey = format!("{key}.backends[{i}]");
                let address: SocketAddr = b.address.get_ref().parse().map_err(|_| {
                    at(
                        b.address.span(),
                        &format!("{bkey}.address"),
                        format!(
                            "invalid address \"{}\", expected IP:PORT such as \"127.0.0.1:8881\"",
                            b.address.get_ref()
                        ),
                    )
                })?;
                if !seen.insert(address) {
                    return Err(at(
                        b.address.span(),
                        &format!("{bkey}.address"),
                        format!(
                            "duplicate backend address {address}; each backend may appear once"
                        ),
                    ));
                }
                let weight = *b.weight.get_ref();
                if weight == 0 {
                    return Err(at(
                        b.weight.span(),
                        &format!("{bkey}.weight"),
                        "weight 0 is not allowed, expected a positive integer".into(),
                    ));
                }
                let cpus = b.cpus.as_ref().map(|c| {
                    let mut v = c.get_ref().0.clone();
                    v.sort_unstable();
                    v.dedup();
                    v
                });
                if let Some(bcpus) = &cpus {
                    let shared: Vec<usize> = bcpus
                        .iter()
                        .copied()
                        .filter(|c| runtime.cpus.contains(c))
                        .collect();
                    if !shared.is_empty() {
                        warnings.push(format!(
                            "backend {address} (upstream {name}) is pinned to cores {}, which overlap pinlb's cores {}",
                            format_cpu_list(&shared),
                            format_cpu_list(&runtime.cpus)
                        ));
                    }
                }
                backends.push(Backend {
                    address,
                    weight,
                    cpus,
                    max_conns: b.max_conns.unwrap_or(up.max_conns),
                    slow_start: b
                        .slow_start
                        .or(up.slow_start)
                        .map_or(Duration::ZERO, |d| d.0),
                });
            }
            let t = &up.timeouts;
            let d = Timeouts::default();
            let tkey = |field: &str| format!("{key}.timeouts.{field}");
            let timeouts = Timeouts {
                connect: positive(&t.connect, &tkey("connect"))?.unwrap_or(d.connect),
                response: positive(&t.response, &tkey("response"))?.unwrap_or(d.response),
                send: positive(&t.send, &tkey("send"))?.unwrap_or(d.send),
                client_idle: positive(&t.client_idle, &tkey("client_idle"))?
                    .unwrap_or(d.client_idle),
            };
            let health = match &up.health {
                None => None,
                Some(h) => {
                    let hkey = format!("{key}.health");
                    let interval = positive(&h.interval, &format!("{hkey}.interval"))?
                        .unwrap_or(Duration::from_secs(2));
                    let timeout = positive(&h.timeout, &format!("{hkey}.timeout"))?
                        .unwrap_or(Duration::from_secs(1));
                    const DAY: Duration = Duration::from_secs(24 * 3600);
                    if interval > DAY {
                        let span = h.interval.as_ref().map_or(0..0, |d| d.span());
                        return Err(at(
                            span,
                            &format!("{hkey}.interval"),
                            format!("{interval:?} is too long, expected at most 1 day"),
                        ));
                    }
                    if timeout >= interval {
                        let span = h
                            .timeout
                            .as_ref()
                            .or(h.interval.as_ref())
                            .map_or(0..0, |d| d.span());
                        return Err(at(
                            span,
                            &hkey,
                            format!(
                                "timeout ({timeout:?}) must be less than interval ({interval:?})"
                            ),
                        ));
                    }
                    let count = |v: &Option<Spanned<u32>>, field: &str, default: u32| match v {
                        None => Ok(default),
                        Some(x) if *x.get_ref() == 0 => Err(at(
                            x.span(),
                            &format!("{hkey}.{field}"),
                            "0 is not allowed, expected a positive number of checks".into(),
                        )),
                        Some(x) => Ok(*x.get_ref()),
                    };
                    let path = match &h.path {
                        None => "/".to_string(),
                        Some(p) => {
                            let v = p.get_ref();
                            // A fragment is never sent on the wire.
                            if !v.starts_with('/')
                                || v.contains('#')
                                || http::uri::PathAndQuery::try_from(v.as_str()).is_err()
                            {
                                return Err(at(
                                    p.span(),
                                    &format!("{hkey}.path"),
                                    format!(
                                        "invalid path \"{v}\", expected an origin-form path such as \"/health\""
                                    ),
                                ));
                            }
                            v.clone()
                        }
                    };
                    let host = match &h.host {
                        None => None,
                        Some(v) => {
                            if v.get_ref().is_empty()
                                || http::HeaderValue::from_str(v.get_ref()).is_err()
                                || v.get_ref().contains([' ', '\t'])
                            {
                                return Err(at(
                                    v.span(),
                                    &format!("{hkey}.host"),
                                    format!(
                                        "invalid host \"{}\", expected a host name such as \"app.local\"",
                                        v.get_ref()
                                    ),
                                ));
                            }
                            Some(v.get_ref().clone())
                        }
                    };
                    Some(Health {
                        path,
                        interval,
                        timeout,
                        rise: count(&h.rise, "rise", 2)?,
                        fall: count(&h.fall, "fall", 3)?,
                        expect: match &h.expect {
                            None => StatusSet(vec![(200, 399)]),
                            // Nothing would pass: every backend would go down after `fall`.
                            Some(e) if e.get_ref().is_empty() => {
                                return Err(at(
                                    e.span(),
                                    &format!("{hkey}.expect"),
                                    "an empty list passes no probe, expected a status such as 200, a range such as \"200-399\", or a list of them".into(),
                                ));
                            }
                            Some(e) => e.get_ref().clone(),
                        },
                        host,
                    })
                }
            };
            let p = &up.passive;
            let passive = Passive {
                max_fails: p.max_fails.unwrap_or(1),
                fail_timeout: positive(&p.fail_timeout, &format!("{key}.passive.fail_timeout"))?
                    .unwrap_or(Duration::from_secs(10)),
                fail_on_status: p.fail_on_status.clone().unwrap_or_default(),
            };
            let r = &up.retry;
            let d = Retry::default();
            let retry = Retry {
                tries: r.tries.unwrap_or(d.tries),
                timeout: positive(&r.timeout, &format!("{key}.retry.timeout"))?
                    .unwrap_or(d.timeout),
                non_idempotent: r.non_idempotent,
                buffer: r
                    .buffer
                    .map_or(d.buffer, |b| usize::try_from(b.0).unwrap_or(usize::MAX)),
            };
            upstreams.push(Upstream {
                name: name.clone(),
                algorithm: up.algorithm,
                keepalive: up.keepalive,
                backends,
                timeouts,
                health,
                passive,
                retry,
            });
        }

        if raw.listeners.is_empty() {
            return Err(at(
                0..0,
                "listener",
                "expected at least one [[listener]]".into(),
            ));
        }
        let mut listeners = Vec::with_capacity(raw.listeners.len());
        for (i, l) in raw.listeners.iter().enumerate() {
            let key = format!("listener[{i}]");
            let address: SocketAddr = l.address.get_ref().parse().map_err(|_| {
                at(
                    l.address.span(),
                    &format!("{key}.address"),
                    format!(
                        "invalid address \"{}\", expected IP:PORT such as \"127.0.0.1:8888\"",
                        l.address.get_ref()
                    ),
                )
            })?;
            // SO_REUSEPORT would let both bind and the kernel would split one port's connections
            // between two upstreams. Port 0 asks the kernel for a fresh port each time.
            if address.port() != 0 && listeners.iter().any(|o: &Listener| o.address == address) {
                return Err(at(
                    l.address.span(),
                    &format!("{key}.address"),
                    format!(
                        "duplicate listener address {address}; each address may be listened on once"
                    ),
                ));
            }
            let wanted = l.upstream.get_ref();
            let upstream = upstreams
                .iter()
                .position(|u| &u.name == wanted)
                .ok_or_else(|| {
                    let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                    at(
                        l.upstream.span(),
                        &format!("{key}.upstream"),
                        format!(
                            "unknown upstream \"{wanted}\", expected one of: {}",
                            if known.is_empty() {
                                "(none defined)".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    )
                })?;
            listeners.push(Listener { address, upstream });
        }

        let mut trusted = Vec::with_capacity(raw.forwarded.trusted.len());
        for (i, t) in raw.forwarded.trusted.iter().enumerate() {
            let v = t.get_ref();
            // A plain address is a network of one.
            let net = v
                .parse::<ipnet::IpNet>()
                .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    at(
                        t.span(),
                        &format!("forwarded.trusted[{i}]"),
                        format!(
                            "invalid network \"{v}\", expected an address or a CIDR block such as \"10.0.0.0/8\""
                        ),
                    )
                })?;
            trusted.push(net);
        }

        let admin = match &raw.admin {
            None => None,
            Some(a) => {
                let address = match &a.address {
                    None => Admin::DEFAULT_ADDRESS.parse().ok(),
                    Some(v) => v.get_ref().parse::<SocketAddr>().ok(),
                }
                .ok_or_else(|| {
                    let v = a.address.as_ref().map_or(Default::default(), |v| v.span());
                    let text = a.address.as_ref().map_or("", |v| v.get_ref().as_str());
                    at(
                        v,
                        "admin.address",
                        format!(
                            "invalid address \"{text}\", expected IP:PORT such as \"{}\"",
                            Admin::DEFAULT_ADDRESS
                        ),
                    )
                })?;
                let token = match &a.token {
                    Some(t)
                        if t.get_ref().is_empty()
                            || !t.get_ref().bytes().all(|b| b.is_ascii_graphic()) =>
                    {
                        return Err(at(
                            t.span(),
                            "admin.token",
                            "expected a non-empty secret of printable ASCII characters without spaces (it is sent in an HTTP header)".into(),
                        ));
                    }
                    t => t.as_ref().map(|t| t.get_ref().clone()),
                };
                if token.is_none() && !address.ip().is_loopback() {
                    let span = a.address.as_ref().map_or(0..0, |v| v.span());
                    return Err(at(
                        span,
                        "admin.address",
                        format!(
                            "{address} is not a loopback address, so admin.token must be set: anyone who can reach it could take backends out and reload the config"
                        ),
                    ));
                }
                if address.port() != 0 && listeners.iter().any(|l| l.address == address) {
                    let span = a.address.as_ref().map_or(0..0, |v| v.span());
                    return Err(at(
                        span,
                        "admin.address",
                        format!(
                            "{address} is also a [[listener]] address, expected an address of its own"
                        ),
                    ));
                }
                Some(Admin { address, token })
            }
        };
        let access_log = match &raw.log.access {
            None => None,
            Some(v) if v.get_ref().is_empty() => {
                return Err(at(
                    v.span(),
                    "log.access",
                    "expected \"stdout\" or a file path".into(),
                ));
            }
            Some(v) => Some(AccessLog {
                target: if v.get_ref() == "stdout" {
                    AccessTarget::Stdout
                } else {
                    AccessTarget::File(v.get_ref().into())
                },
                format: AccessFormat::Combined,
            }),
        };
        let access_log = match (&raw.log.format, access_log) {
            (None, a) => a,
            (Some(f), None) => {
                return Err(at(
                    f.span(),
                    "log.format",
                    "set without log.access, expected log.access too (\"stdout\" or a file path)"
                        .into(),
                ));
            }
            (Some(f), a) => {
                let format = match f.get_ref().as_str() {
                    "combined" => AccessFormat::Combined,
                    "json" => AccessFormat::Json,
                    other => {
                        return Err(at(
                            f.span(),
                            "log.format",
                            format!("unknown value \"{other}\", expected one of combined, json"),
                        ));
                    }
                };
                a.map(|a| AccessLog { format, ..a })
            }
        };

        Ok(Config {
            runtime,
            limits,
            trusted,
            listeners,
            upstreams,
            admin,
            access_log,
            warnings,
        })
    }

    /// The resolved plan as `pinlb check` prints it.
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let rt = &self.runtime;
        let _ = writeln!(
            s,
            "runtime: {} worker(s), shutdown_timeout {:?}",
            rt.cpus.len(),
            rt.shutdown_timeout
        );
        for (i, c) in rt.cpus.iter().enumerate() {
            let _ = writeln!(s, "  worker {i} -> core {c}");
        }
        let l = &self.limits;
        let _ = writeln!(
            s,
            "limits: request head {} bytes and {} headers, uri {} bytes, body {}, head within {:?}, body reads {:?} apart at most, {} connections",
            l.max_header_bytes,
            l.max_headers,
            l.max_uri_bytes,
            if l.max_body == 0 {
                "unlimited".to_string()
            } else {
                format!("{} bytes", l.max_body)
            },
            l.header_timeout,
            l.body_timeout,
            l.max_connections
        );
        let _ = writeln!(
            s,
            "forwarded: X-Forwarded-For {}",
            if self.trusted.is_empty() {
                "replaced by the client's address for every client".to_string()
            } else {
                let nets: Vec<String> = self.trusted.iter().map(|n| n.to_string()).collect();
                format!(
                    "kept and appended to for {}, replaced for every other client",
                    nets.join(", ")
                )
            }
        );
        for l in &self.listeners {
            let _ = writeln!(
                s,
                "listener {} -> upstream {}",
                l.address, self.upstreams[l.upstream].name
            );
        }
        for u in &self.upstreams {
            let t = &u.timeouts;
            let _ = writeln!(
                s,
                "upstream {}: {}, keepalive {} per backend per worker, timeouts connect {:?} response {:?} send {:?} client_idle {:?}",
                u.name,
                u.algorithm.as_str(),
                u.keepalive,
                t.connect,
                t.response,
                t.send,
                t.client_idle
            );
            match &u.health {
                None => {
                    let _ = writeln!(s, "  health checks: off");
                }
                Some(h) => {
                    let _ = writeln!(
                        s,
                        "  health checks: GET {} every {:?}, timeout {:?}, rise {} fall {}, expect {}{}",
                        h.path,
                        h.interval,
                        h.timeout,
                        h.rise,
                        h.fall,
                        h.expect,
                        h.host
                            .as_deref()
                            .map(|h| format!(", host {h}"))
                            .unwrap_or_default()
                    );
                }
            }
            let p = &u.passive;
            if p.max_fails == 0 {
                let _ = writeln!(s, "  passive checks: off");
            } else {
                let _ = writeln!(
                    s,
                    "  passive checks: max_fails {} within fail_timeout {:?}{}",
                    p.max_fails,
                    p.fail_timeout,
                    if p.fail_on_status.is_empty() {
                        String::new()
                    } else {
                        format!(", statuses {} count as failures", p.fail_on_status)
                    }
                );
            }
            let r = &u.retry;
            let _ = writeln!(
                s,
                "  retry: {} within {:?}, non_idempotent {}, bodies up to {} bytes kept for replay",
                if r.tries == 0 {
                    "every backend once".to_string()
                } else {
                    format!("at most {} tries", r.tries)
                },
                r.timeout,
                r.non_idempotent,
                r.buffer
            );
            for b in &u.backends {
                let mut extra = String::new();
                if let Some(c) = b.cpus.as_deref() {
                    let _ = write!(extra, ", cores {}", format_cpu_list(c));
                }
                if b.max_conns > 0 {
                    let _ = write!(extra, ", max_conns {}", b.max_conns);
                }
                if !b.slow_start.is_zero() {
                    let _ = write!(extra, ", slow_start {:?}", b.slow_start);
                }
                let _ = writeln!(s, "  backend {} weight {}{extra}", b.address, b.weight);
            }
        }
        match &self.admin {
            None => {
                let _ = writeln!(s, "admin: off");
            }
            Some(a) => {
                let _ = writeln!(
                    s,
                    "admin: http://{}/ (metrics, status, control, reload){}",
                    a.address,
                    if a.token.is_some() {
                        ", bearer token required"
                    } else {
                        ""
                    }
                );
            }
        }
        match &self.access_log {
            None => {
                let _ = writeln!(s, "access log: off");
            }
            Some(a) => {
                let _ = writeln!(
                    s,
                    "access log: {} ({})",
                    match &a.target {
                        AccessTarget::Stdout => "stdout".to_string(),
                        AccessTarget::File(p) => p.display().to_string(),
                    },
                    match a.format {
                        AccessFormat::Combined => "combined",
                        AccessFormat::Json => "json",
                    }
                );
            }
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

/// 1-based line and column (in characters) of byte offset `pos`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..pos].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOWED: &[usize] = &[0, 1, 2, 3];

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse("pinlb.toml", text, ALLOWED)
    }

    fn err(text: &str) -> String {
        parse(text)
            .expect_err("config should be rejected")
            .to_string()
    }

    const MINIMAL: &str = r#"
[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
backends = [{ address = "127.0.0.1:8881" }]
"#;

    #[test]
    fn admin_is_off_unless_configured_and_needs_a_token_off_loopback() {
        assert_eq!(parse(MINIMAL).unwrap().admin, None);
        let on = parse(&format!("{MINIMAL}[admin]\n")).unwrap();
        assert_eq!(
            on.admin.unwrap().address,
            Admin::DEFAULT_ADDRESS.parse().unwrap()
        );
        assert_eq!(
            err(&format!("{MINIMAL}[admin]\naddress = \"0.0.0.0:9901\"\n")),
            "pinlb.toml:9:11: admin.address: 0.0.0.0:9901 is not a loopback address, so admin.token must be set: anyone who can reach it could take backends out and reload the config"
        );
        let open = parse(&format!(
            "{MINIMAL}[admin]\naddress = \"0.0.0.0:9901\"\ntoken = \"t\"\n"
        ))
        .unwrap();
        assert_eq!(open.admin.unwrap().token.as_deref(), Some("t"));
        assert_eq!(
            err(&format!("{MINIMAL}[admin]\naddress = \"localhost\"\n")),
            "pinlb.toml:9:11: admin.address: invalid address \"localhost\", expected IP:PORT such as \"127.0.0.1:9901\""
        );
        assert!(err(&format!("{MINIMAL}[admin]\nport = 1\n")).contains("unknown field `port`"));
        assert_eq!(
            err(&format!("{MINIMAL}[admin]\naddress = \"127.0.0.1:8888\"\n")),
            "pinlb.toml:9:11: admin.address: 127.0.0.1:8888 is also a [[listener]] address, expected an address of its own"
        );
        assert!(
            err(&format!("{MINIMAL}[admin]\ntoken = \"two words\"\n"))
                .starts_with("pinlb.toml:9:9: admin.token: expected a non-empty secret")
        );
    }

    #[test]
    fn the_access_log_is_off_by_default_and_its_format_is_checked() {
        assert_eq!(parse(MINIMAL).unwrap().access_log, None);
        let log = parse(&format!("{MINIMAL}[log]\naccess = \"stdout\"\n"))
            .unwrap()
            .access_log
            .unwrap();
        assert_eq!(
            (log.target, log.format),
            (AccessTarget::Stdout, AccessFormat::Combined)
        );
        assert_eq!(
            err(&format!(
                "{MINIMAL}[log]\naccess = \"/tmp/a.log\"\nformat = \"jsonl\"\n"
            )),
            "pinlb.toml:10:10: log.format: unknown value \"jsonl\", expected one of combined, json"
        );
        assert_eq!(
            err(&format!("{MINIMAL}[log]\nformat = \"json\"\n")),
            "pinlb.toml:9:10: log.format: set without log.access, expected log.access too (\"stdout\" or a file path)"
        );
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.runtime.cpus, ALLOWED);
        assert_eq!(c.runtime.shutdown_timeout, Duration::from_secs(30));
        let u = &c.upstreams[0];
        assert_eq!(u.algorithm, Algorithm::RoundRobin);
        assert_eq!(u.keepalive, 64);
        assert_eq!(u.backends[0].weight, 1);
        assert_eq!(u.timeouts, Timeouts::default());
        assert_eq!(c.listeners[0].upstream, 0);
        assert_eq!(c.limits, Limits::default());
    }

    #[test]
    fn limits_parse_sizes_and_durations() {
        let c = parse(&format!(
            "[limits]\nmax_header_bytes = \"16KiB\"\nmax_headers = 50\nmax_uri_bytes = 2048\nmax_body = \"1MiB\"\nheader_timeout = \"300ms\"\nbody_timeout = \"2s\"\nmax_connections = 2\n{MINIMAL}"
        ))
        .unwrap();
        assert_eq!(
            c.limits,
            Limits {
                max_header_bytes: 16 * 1024,
                max_headers: 50,
                max_uri_bytes: 2048,
                max_body: 1024 * 1024,
                header_timeout: Duration::from_millis(300),
                body_timeout: Duration::from_secs(2),
                max_connections: 2,
            }
        );
        assert!(
            c.describe().contains("body 1048576 bytes"),
            "{}",
            c.describe()
        );
    }

    #[test]
    fn limits_that_could_never_work_are_rejected_at_their_place() {
        let with = |kv: &str| err(&format!("[limits]\n{kv}\n{MINIMAL}"));
        assert_eq!(
            with("max_header_bytes = \"100B\""),
            "pinlb.toml:2:20: limits.max_header_bytes: 100 bytes is out of range, expected \"1KiB\" to \"64KiB\""
        );
        assert!(
            with("max_header_bytes = \"65KiB\"").starts_with(
                "pinlb.toml:2:20: limits.max_header_bytes: 66560 bytes is out of range"
            ),
            "{}",
            with("max_header_bytes = \"65KiB\"")
        );
        assert_eq!(
            with("max_headers = 0"),
            "pinlb.toml:2:15: limits.max_headers: 0 is out of range, expected 1 to 1000"
        );
        assert_eq!(
            with("max_uri_bytes = \"0\""),
            "pinlb.toml:2:17: limits.max_uri_bytes: 0 is not allowed, expected a size such as \"8KiB\""
        );
        assert!(
            with("header_timeout = \"0s\"")
                .starts_with("pinlb.toml:2:18: limits.header_timeout: a duration of 0"),
            "{}",
            with("header_timeout = \"0s\"")
        );
        assert!(
            with("max_body = \"lots\"")
                .starts_with("pinlb.toml:2:12: limits.max_body: invalid size \"lots\""),
            "{}",
            with("max_body = \"lots\"")
        );
    }

    #[test]
    fn full_contract_parses() {
        let c = parse(
            r#"
[runtime]
cpus = [0, "2-3"]
shutdown_timeout = "250ms"

[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
algorithm = "least_conn"
keepalive = 8
backends = [
  { address = "127.0.0.1:8881", weight = 5 },
  { address = "127.0.0.1:8882", cpus = [1] },
  { address = "127.0.0.1:8883", cpus = "2" },
]

[upstream.app.timeouts]
connect = "1s"
response = "1m"
send = "5s"
client_idle = "2s"
"#,
        )
        .unwrap();
        assert_eq!(c.runtime.cpus, vec![0, 2, 3]);
        assert_eq!(c.runtime.shutdown_timeout, Duration::from_millis(250));
        let u = &c.upstreams[0];
        assert_eq!(u.algorithm, Algorithm::LeastConn);
        assert_eq!(u.keepalive, 8);
        assert_eq!(
            u.backends.iter().map(|b| b.weight).collect::<Vec<_>>(),
            vec![5, 1, 1]
        );
        assert_eq!(u.timeouts.response, Duration::from_secs(60));
        assert_eq!(u.timeouts.send, Duration::from_secs(5));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("127.0.0.1:8883"), "{:?}", c.warnings);
    }

    #[test]
    fn unknown_algorithm_names_place_key_and_choices() {
        let e = err(&MINIMAL.replace(
            "[upstream.app]\n",
            "[upstream.app]\nalgorithm = \"leastconn\"\n",
        ));
        assert_eq!(
            e,
            "pinlb.toml:7:13: upstream.app.algorithm: unknown value \"leastconn\", expected one of round_robin, least_conn"
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = err(&MINIMAL.replace(
            "[upstream.app]\n",
            "[upstream.app]\nalgoritm = \"least_conn\"\n",
        ));
        assert!(
            e.starts_with("pinlb.toml:7:1: upstream.app.algoritm: unknown field `algoritm`"),
            "{e}"
        );
    }

    #[test]
    fn weight_zero_is_rejected_at_the_weight() {
        let e = err(&MINIMAL.replace("8881\" }", "8881\", weight = 0 }"));
        assert_eq!(
            e,
            "pinlb.toml:7:52: upstream.app.backends[0].weight: weight 0 is not allowed, expected a positive integer"
        );
    }

    #[test]
    fn empty_upstream_is_rejected() {
        let e = err(&MINIMAL.replace("[{ address = \"127.0.0.1:8881\" }]", "[]"));
        assert_eq!(
            e,
            "pinlb.toml:7:12: upstream.app.backends: an upstream needs at least one backend"
        );
    }

    #[test]
    fn listener_to_unknown_upstream_is_rejected() {
        let e = err(&MINIMAL.replace("upstream = \"app\"", "upstream = \"web\""));
        assert_eq!(
            e,
            "pinlb.toml:4:12: listener[0].upstream: unknown upstream \"web\", expected one of: app"
        );
    }

    #[test]
    fn duplicate_backends_are_rejected() {
        let e = err(&MINIMAL.replace(
            "[{ address = \"127.0.0.1:8881\" }]",
            "[{ address = \"127.0.0.1:8881\" }, { address = \"127.0.0.1:8881\" }]",
        ));
        assert!(e.starts_with("pinlb.toml:7:57: upstream.app.backends[1].address: duplicate backend address 127.0.0.1:8881"), "{e}");
    }

    #[test]
    fn duplicate_listeners_are_rejected_but_port_0_may_repeat() {
        let two = |addr: &str| {
            format!("{MINIMAL}\n[[listener]]\naddress = \"{addr}\"\nupstream = \"app\"\n")
                .replace("127.0.0.1:8888", addr)
        };
        let e = err(&two("127.0.0.1:8888"));
        assert!(
            e.starts_with(
                "pinlb.toml:10:11: listener[1].address: duplicate listener address 127.0.0.1:8888"
            ),
            "{e}"
        );
        assert_eq!(parse(&two("127.0.0.1:0")).unwrap().listeners.len(), 2);
    }

    #[test]
    fn core_outside_allowed_set_names_core_and_set() {
        let e = err(&format!("[runtime]\ncpus = \"2-7\"\n{MINIMAL}"));
        assert_eq!(
            e,
            "pinlb.toml:2:8: runtime.cpus: core 4 is not in this process's allowed set 0-3"
        );
    }

    #[test]
    fn bad_duration_says_what_is_expected() {
        let e = err(&format!("[runtime]\nshutdown_timeout = \"30\"\n{MINIMAL}"));
        assert!(
            e.starts_with("pinlb.toml:2:20: runtime.shutdown_timeout: invalid duration \"30\""),
            "{e}"
        );
    }

    #[test]
    fn durations_over_a_year_are_rejected() {
        let e = err(&format!(
            "[limits]\nheader_timeout = \"400days\"\n{MINIMAL}"
        ));
        assert!(
            e.starts_with(
                "pinlb.toml:2:18: limits.header_timeout: duration \"400days\" is too long, expected at most 365 days"
            ),
            "{e}"
        );
        let ok = parse(&format!(
            "[limits]\nheader_timeout = \"365days\"\n{MINIMAL}"
        ));
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    #[test]
    fn type_errors_inside_spanned_values_name_the_users_key() {
        let e = err(&MINIMAL.replace("8881\" }", "8881\", weight = \"heavy\" }"));
        assert!(
            e.starts_with("pinlb.toml:7:52: upstream.app.backends[0].weight: "),
            "{e}"
        );
        let e = err(&format!(
            "{MINIMAL}\n[upstream.app.timeouts]\nresponse = \"30\"\n"
        ));
        assert!(
            e.starts_with("pinlb.toml:10:12: upstream.app.timeouts.response: invalid duration"),
            "{e}"
        );
    }

    #[test]
    fn zero_timeouts_are_rejected() {
        let e = err(&format!(
            "{MINIMAL}\n[upstream.app.timeouts]\nclient_idle = \"0s\"\n"
        ));
        assert_eq!(
            e,
            "pinlb.toml:10:15: upstream.app.timeouts.client_idle: a duration of 0 is not allowed, expected a positive duration such as \"1s\""
        );
    }

    #[test]
    fn bad_address_says_what_is_expected() {
        let e = err(&MINIMAL.replace("127.0.0.1:8888", "localhost"));
        assert!(
            e.starts_with("pinlb.toml:3:11: listener[0].address: invalid address \"localhost\""),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let e = err("[runtime\ncpus = [0]\n");
        assert!(e.starts_with("pinlb.toml:1:"), "{e}");
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncé d", 7), (2, 4));
        assert_eq!(line_col("", 0), (1, 1));
    }

    #[test]
    fn health_values_that_could_never_work_are_rejected_at_their_place() {
        let with = |keys: &str| err(&format!("{MINIMAL}\n[upstream.app.health]\n{keys}\n"));
        assert_eq!(
            with("expect = []"),
            "pinlb.toml:10:10: upstream.app.health.expect: an empty list passes no probe, expected a status such as 200, a range such as \"200-399\", or a list of them"
        );
        assert!(
            with("path = \"/health#top\"").starts_with(
                "pinlb.toml:10:8: upstream.app.health.path: invalid path \"/health#top\""
            ),
            "{}",
            with("path = \"/health#top\"")
        );
        assert_eq!(
            with("interval = \"2d\""),
            "pinlb.toml:10:12: upstream.app.health.interval: 172800s is too long, expected at most 1 day"
        );
    }

    #[test]
    fn trusted_proxies_are_networks_or_addresses() {
        let c = parse(&format!(
            "{MINIMAL}\n[forwarded]\ntrusted = [\"10.0.0.0/8\", \"192.0.2.7\", \"::1\"]\n"
        ))
        .unwrap();
        let nets: Vec<String> = c.trusted.iter().map(|n| n.to_string()).collect();
        assert_eq!(nets, ["10.0.0.0/8", "192.0.2.7/32", "::1/128"]);
        assert!(parse(MINIMAL).unwrap().trusted.is_empty());
        assert_eq!(
            err(&format!(
                "{MINIMAL}\n[forwarded]\ntrusted = [\"10.0.0.0/33\"]\n"
            )),
            "pinlb.toml:10:12: forwarded.trusted[0]: invalid network \"10.0.0.0/33\", expected an address or a CIDR block such as \"10.0.0.0/8\""
        );
    }
}
