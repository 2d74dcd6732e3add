//! `pinlb bench`: a load generator that compares targets side by side.
//!
//! ```text
//! pinlb bench direct=http://127.0.0.1:8881/ proxied=http://127.0.0.1:8888/ -c 64 -d 10s --rounds 5 --cpus 1
//! ```
//!
//! Targets run in interleaved rounds (A B A B …), each run a warm-up and then a recorded window,
//! so drift of the machine between rounds hits every target alike. Each target gets its
//! requests/s per round, latency percentiles from HDR histograms, errors by kind, and, against the
//! first target, the throughput ratio and the latency added at each percentile: the proxy's
//! overhead when the first target is the backend alone.
//!
//! Each target's CPU per request is read from `/proc` over its recorded windows ([`cpu`]): of
//! the process listening on its port when that is on this machine, shown as "–" where it
//! cannot be known (another machine, another user's process). With `--proxy pinlb,nginx,haproxy
//! --backend ADDR[,...] --proxy-cpus LIST` it starts those proxies pinned in front of backends
//! that already run, on `pinlb sweep`'s configurations ([`crate::peers`]), and benches
//! `direct` (the first backend alone) and each proxy in the same rounds, with each proxy's CPU
//! per request and each backend's beside its req/s.
//!
//! Before the run, the fairness checks (`fairness`) warn on stderr of what would make it
//! unfair: the load threads on a target's core, a debug build, a proxy without keep-alive, SMT
//! siblings, the frequency governor, local ports, a busy core. `--no-checks` turns them off.
//!
//! With `--ws` the same holds for WebSocket tunnels: each connection upgrades once when it
//! opens, then every exchange is a binary message of `--message-size` bytes and its echo
//! (`pinlb backend` echoes on any path), so the rates are messages/s.
//!
//! The client is lean on purpose, so that it measures the server and not itself: its threads are
//! pinned to `--cpus`, each runs a single-threaded runtime with its share of the keep-alive
//! connections, every request is the same pre-built bytes, and responses are parsed in place
//! (`wire.rs`) on the raw `TcpStream`. Its closed loop is structured like wrk's event loop (read
//! every ready response, write the next requests on the following pass, each clock starting at
//! its write), so that its latencies count what wrk's count; `benches/loadgen.sh` measures both
//! side by side, and `benches/RESULTS.md` has the figures and where they still differ.
//!
//! - [`stats`]: medians, ratios, added latency and percentile curves, as plain functions.
//! - [`hdr`]: the histograms in the JSON, in HdrHistogram's standard compressed encoding.
//! - [`wire`]: the request bytes, response heads and body framing.
//! - [`ws`]: `--ws`: the WebSocket handshake, the message frame, and finding the end of an
//!   echo.
//! - [`tls`]: `https://` targets: the client side of TLS for the load threads.
//! - [`thread`]: one load thread's shared state, one exchange, and connecting.
//! - [`h2`]: `--h2`: HTTP/2 on hyper's client, `--streams` concurrent streams per connection.
//! - [`closed`]: the closed loop, one event-loop task per thread.
//! - [`load`]: the pinned threads, the open loop, and the accounting both loops share.
//! - [`cpu`]: the CPU of each target's processes, read at the edges of its recorded windows.
//! - [`limits`]: each backend's learned concurrency limit, read from a pinlb target's `/status`
//!   at the end of its recorded windows.
//! - [`proxies`]: `--proxy`: the proxies started in front of `--backend`, and their targets.
//! - [`report`]: the results, and the table, JSON and SVG made from them.
//! - [`merge`]: `pinlb bench merge`, the reports of several machines that ran at once (each
//!   started with the same `--start-at`) added up into one.

mod closed;
pub mod cpu;
mod h2;
mod hdr;
pub mod limits;
mod load;
pub mod merge;
mod proxies;
pub mod report;
pub mod stats;
mod thread;
mod tls;
pub(crate) mod wire;
pub(crate) mod ws;

use std::io::{IsTerminal, Write as _};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::Uri;

pub use cpu::{CpuUse, Processes};
pub use report::{Overhead, Report, RoundReport, TargetReport};
pub use stats::{AddedLatency, Counts, CurvePoint, Errors, Latency, Spread, Statuses};
pub use tls::Trust;
pub use wire::RequestSpec;

use crate::fairness;
use load::{Done, Plan};
use pinlb::sys::cpus::{allowed_cpus, format_cpu_list, parse_cpu_list};

/// What to load: `NAME=URL`, or just `URL` (then the name is the URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    /// An `http://` URL: its host and port are connected to, its path and query requested, its
    /// authority sent as `Host`.
    pub url: Uri,
}

impl FromStr for Target {
    type Err = BenchError;

    /// `NAME=URL` when what comes before the first `=` is a plain name (no `:` or `/`), so a URL
    /// with `=` in its query (`http://h/?a=b`) still parses as a bare URL.
    fn from_str(s: &str) -> Result<Target, BenchError> {
        let bad = |reason: &str| BenchError::Target {
            input: s.to_string(),
            reason: reason.to_string(),
        };
        let (name, url) = match s.split_once('=') {
            Some((name, url)) if !name.contains([':', '/']) => (name.trim(), url.trim()),
            _ => (s.trim(), s.trim()),
        };
        if name.is_empty() {
            return Err(bad("the name before '=' is empty"));
        }
        let url: Uri = url.parse().map_err(|e| bad(&format!("not a URL: {e}")))?;
        match url.scheme_str() {
            Some("http" | "https" | "ws" | "wss") => {}
            Some(other) => {
                return Err(bad(&format!(
                    "only http://, https://, ws:// and wss:// URLs are supported, not {other}://"
                )));
            }
            None => return Err(bad("expected an http://, https://, ws:// or wss:// URL")),
        }
        if url.host().is_none_or(str::is_empty) {
            return Err(bad("the URL has no host"));
        }
        Ok(Target {
            name: name.to_string(),
            url,
        })
    }
}

impl Target {
    /// Whether the URL is `https://` or `wss://`: over TLS.
    fn is_https(&self) -> bool {
        matches!(self.url.scheme_str(), Some("https" | "wss"))
    }

    /// Whether the URL is `ws://` or `wss://`: a WebSocket echo target.
    pub fn is_websocket(&self) -> bool {
        matches!(self.url.scheme_str(), Some("ws" | "wss"))
    }

    /// The socket address to connect to: the URL's host resolved (the first address), and its
    /// port or the scheme's (80, 443).
    fn resolve(&self) -> Result<SocketAddr, BenchError> {
        let host = self.url.host().unwrap_or_default();
        // `Uri` keeps IPv6 literals in brackets; the resolver wants them bare.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = self
            .url
            .port_u16()
            .unwrap_or(if self.is_https() { 443 } else { 80 });
        let resolve_err = |source| BenchError::Resolve {
            target: self.name.clone(),
            source,
        };
        (host, port)
            .to_socket_addrs()
            .map_err(resolve_err)?
            .next()
            .ok_or_else(|| resolve_err(std::io::Error::other("no address")))
    }
}

/// How to run a bench. [`BenchArgs`] builds one from the command line; `pinlb demo` builds its
/// own.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// In this order in every round; the first is what the others are compared against.
    pub targets: Vec<Target>,
    /// Keep-alive connections per target, spread over the threads.
    pub connections: usize,
    /// Load threads, each pinned to one of `cpus` in turn; at most `connections`.
    pub threads: usize,
    /// The recorded window of each run.
    pub duration: Duration,
    /// `-n`: the recorded window of each run is this many requests instead of `duration`.
    pub requests: Option<u64>,
    /// The method, headers, body and HTTP version of every request, and whether connections
    /// are kept alive.
    pub request: RequestSpec,
    /// Load before each recorded window, on the same connections, not recorded.
    pub warmup: Duration,
    pub rounds: usize,
    /// Open loop at this many requests per second in total; `None` is closed loop.
    pub rate: Option<f64>,
    /// WebSocket echo instead of HTTP requests: each connection is upgraded when it opens (not
    /// timed), then sends binary messages of this many bytes and waits for each one's echo.
    /// Closed loop only.
    pub websocket: Option<usize>,
    /// HTTP/2 (h2load's `--h2`), with this many concurrent streams per connection (h2load's
    /// `-m`): prior knowledge on `http://`, ALPN `h2` on `https://`. Closed loop only.
    pub http2: Option<usize>,
    /// Cores for the load threads; empty means every core this process may run on.
    pub cpus: Vec<usize>,
    /// Per request (and per connect), like wrk's `--timeout`.
    pub timeout: Duration,
    /// Which certificates `https://` targets are checked against.
    pub trust: Trust,
    /// `--start-at`: wait for this wall-clock time before the first warm-up, so that several
    /// machines begin together. One more than a second past is refused.
    pub start_at: Option<SystemTime>,
    /// Show a live progress line on stderr. Only ever drawn when both stdout and stderr are a
    /// terminal (a person watching, output not captured by a script), so a caller can leave it
    /// on.
    pub progress: bool,
}

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("target {input:?}: {reason}")]
    Target { input: String, reason: String },
    #[error("{0}")]
    Options(String),
    #[error("cannot resolve target {target}: {source}")]
    Resolve {
        target: String,
        source: std::io::Error,
    },
    #[error("cannot read the cores this process may run on: {0}")]
    AllowedCpus(nix::Error),
    #[error("cannot pin load thread {thread} to core {core}: {source}")]
    Pin {
        thread: usize,
        core: usize,
        source: nix::Error,
    },
    #[error("cannot start load thread {thread}: {source}")]
    Thread {
        thread: usize,
        source: std::io::Error,
    },
    #[error("load thread {thread} panicked")]
    ThreadPanicked { thread: usize },
    #[error("latency histogram: {0}")]
    HistogramCreate(#[from] hdrhistogram::CreationError),
    #[error("latency histogram: {0}")]
    HistogramMerge(#[from] hdrhistogram::AdditionError),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("--h2: target {target}: {reason}")]
    Http2 { target: String, reason: String },
    #[error(
        "--start-at {at} is {late} in the past: give a time ahead (the clocks of machines meant to start together must agree)"
    )]
    StartInThePast { at: String, late: String },
    #[error("cannot write chart {path}: {reason}")]
    Plot { path: PathBuf, reason: String },
}

/// Runs the bench and returns its report. Blocks the calling thread, which only waits and
/// draws the progress line; the load runs on threads it starts and joins, pinned to
/// `opts.cpus`.
pub fn run(opts: &BenchOptions) -> Result<Report, BenchError> {
    run_metered(opts, &[])
}

/// [`run`], also reading the CPU of each target's processes (`processes[i]` for target `i`;
/// missing or empty entries are not read) over its recorded windows: each
/// [`TargetReport::cpu`]; and, for a pinlb whose admin listener is known
/// ([`Processes::status`]), each backend's learned limit at their ends:
/// [`TargetReport::backends_concurrency_limit`].
pub fn run_metered(opts: &BenchOptions, processes: &[Processes]) -> Result<Report, BenchError> {
    let cpus = check_options(opts)?;
    let none = Processes::default();
    let mut meters: Vec<cpu::Meter> = (0..opts.targets.len())
        .map(|i| cpu::Meter::new(processes.get(i).unwrap_or(&none)))
        .collect();
    let mut limits: Vec<limits::Limits> = (0..opts.targets.len())
        .map(|i| limits::Limits::new(processes.get(i).and_then(|p| p.status)))
        .collect();
    let plans = opts
        .targets
        .iter()
        .map(|t| {
            let (request, websocket) = match opts.websocket {
                Some(size) => {
                    let (ws, frame) = ws::WsPlan::new(&t.url, size);
                    (frame, Some(Arc::new(ws)))
                }
                None => (wire::request_bytes(&t.url, &opts.request), None),
            };
            let tls = if t.is_https() {
                Some(tls::Tls::new(
                    t.url.host().unwrap_or_default(),
                    &opts.trust,
                    opts.http2.is_some(),
                )?)
            } else {
                None
            };
            let h2 = match opts.http2 {
                Some(streams) => Some(Arc::new(
                    h2::H2Plan::new(&t.url, &opts.request, streams).map_err(|reason| {
                        BenchError::Http2 {
                            target: t.name.clone(),
                            reason,
                        }
                    })?,
                )),
                None => None,
            };
            Ok(Arc::new(Plan {
                addr: t.resolve()?,
                tls,
                h2,
                request: request.into(),
                websocket,
                connections: opts.connections,
                threads: opts.threads,
                cpus: cpus.clone(),
                warmup: opts.warmup,
                duration: opts.duration,
                requests: opts.requests,
                timeout: opts.timeout,
                head_request: opts.request.method == http::Method::HEAD,
                keep_alive: opts.request.keep_alive,
                rate: opts.rate,
            }))
        })
        .collect::<Result<Vec<_>, BenchError>>()?;

    for (plan, target) in plans.iter().zip(&opts.targets) {
        load::probe_h2(plan).map_err(|reason| BenchError::Http2 {
            target: target.name.clone(),
            reason,
        })?;
    }

    if let Some(at) = opts.start_at {
        wait_until(at)?;
    }
    let started_at = SystemTime::now();
    let show = opts.progress && std::io::stderr().is_terminal() && std::io::stdout().is_terminal();
    let mut runs: Vec<Vec<load::RunResult>> = plans.iter().map(|_| Vec::new()).collect();
    let mut result = Ok(());
    'rounds: for round in 0..opts.rounds {
        for ((((plan, target), results), meter), limits) in plans
            .iter()
            .zip(&opts.targets)
            .zip(&mut runs)
            .zip(&mut meters)
            .zip(&mut limits)
        {
            let mut last = (Duration::ZERO, 0u64);
            let mut tick = |elapsed: Duration, done: Done| {
                if !show {
                    return;
                }
                let dt = elapsed.saturating_sub(last.0).as_secs_f64();
                let rate = if dt > 0.0 {
                    done.responses.saturating_sub(last.1) as f64 / dt
                } else {
                    0.0
                };
                last = (elapsed, done.responses);
                let line = progress_line(round, opts, &target.name, elapsed, rate, done);
                let _ = write!(std::io::stderr(), "\r\x1b[K{line}");
            };
            match load::run(plan, &mut tick, &mut || meter.window_started()) {
                Ok(r) => {
                    meter.window_ended();
                    // After the CPU, so that the request to /status counts in no window.
                    limits.window_ended();
                    results.push(r);
                }
                Err(e) => {
                    result = Err(e);
                    break 'rounds;
                }
            }
        }
    }
    if show {
        let _ = write!(std::io::stderr(), "\r\x1b[K");
    }
    result?;
    let mut report = Report::build(opts, &cpus, runs)?;
    for ((t, meter), limits) in report.targets.iter_mut().zip(&meters).zip(&limits) {
        t.cpu = meter.per_request(t.requests.responses);
        t.backends_concurrency_limit = limits.medians();
    }
    report.started_at = Some(humantime::format_rfc3339_millis(started_at).to_string());
    report.ended_at = Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string());
    Ok(report)
}

/// How far past a `--start-at` time may be and still start: a launcher that starts its
/// machines a little late should not fail them, one given a stale time should.
const START_AT_SLACK: Duration = Duration::from_secs(1);

/// Blocks until the wall clock reaches `at`; refuses an `at` more than [`START_AT_SLACK`] past.
/// Sleeps in steps of at most a second, reading the wall clock anew, so a clock stepped by NTP
/// meanwhile still starts on time.
fn wait_until(at: SystemTime) -> Result<(), BenchError> {
    if let Ok(late) = SystemTime::now().duration_since(at) {
        if late > START_AT_SLACK {
            return Err(BenchError::StartInThePast {
                at: humantime::format_rfc3339_millis(at).to_string(),
                late: humantime::format_duration(Duration::from_millis(late.as_millis() as u64))
                    .to_string(),
            });
        }
        return Ok(());
    }
    while let Ok(left) = at.duration_since(SystemTime::now()) {
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_secs(1)));
    }
    Ok(())
}

/// `--start-at`'s value: an RFC 3339 UTC time (`2026-12-01T12:00:00Z`, fractions allowed), or
/// `+DURATION` from now (`+10s`).
fn parse_start_at(s: &str) -> Result<SystemTime, String> {
    if let Some(d) = s.strip_prefix('+') {
        let d = humantime::parse_duration(d).map_err(|e| format!("{s:?}: {e}"))?;
        return Ok(SystemTime::now() + d);
    }
    humantime::parse_rfc3339_weak(s).map_err(|e| {
        format!("{s:?}: {e}: expected an RFC 3339 UTC time such as 2026-12-01T12:00:00Z, or +10s")
    })
}

/// Validates `opts` and returns the cores to use.
fn check_options(opts: &BenchOptions) -> Result<Vec<usize>, BenchError> {
    let bad = |s: String| Err(BenchError::Options(s));
    if opts.targets.is_empty() {
        return bad("no targets".into());
    }
    if opts.connections == 0 {
        return bad("connections must be at least 1".into());
    }
    if opts.threads == 0 || opts.threads > opts.connections {
        return bad(format!(
            "threads must be between 1 and the number of connections ({}), not {}",
            opts.connections, opts.threads
        ));
    }
    if opts.duration.is_zero() {
        return bad("the duration must be greater than 0".into());
    }
    if opts.requests == Some(0) {
        return bad("-n must be at least 1".into());
    }
    if opts.timeout.is_zero() {
        return bad("the timeout must be greater than 0".into());
    }
    if opts.rounds == 0 {
        return bad("rounds must be at least 1".into());
    }
    if let Some(t) = opts.targets.iter().find(|t| t.is_websocket()) {
        if opts.websocket.is_none() {
            return bad(format!(
                "{} is a WebSocket target: it needs WebSocket mode (--ws)",
                t.url
            ));
        }
    }
    if opts.websocket.is_some()
        && (opts.request.body.is_some() || opts.request.http10 || !opts.request.keep_alive)
    {
        return bad(
            "a WebSocket run sends messages on upgraded connections: not with --body, \
             --body-file, --http1.0 or --disable-keepalive"
                .into(),
        );
    }
    if opts.websocket.is_some() && opts.rate.is_some() {
        return bad(
            "the open loop (--rate) is not supported with --ws: WebSocket mode is closed loop"
                .into(),
        );
    }
    if let Some(streams) = opts.http2 {
        if streams == 0 {
            return bad("--streams must be at least 1".into());
        }
        if opts.websocket.is_some() || opts.rate.is_some() {
            return bad("--h2 is closed loop HTTP requests: not with --ws or --rate".into());
        }
        if opts.request.http10 || !opts.request.keep_alive {
            return bad(
                "--h2 keeps its connections and has no HTTP/1.0: not with --http1.0 or \
                 --disable-keepalive"
                    .into(),
            );
        }
    }
    if let Some(r) = opts.rate {
        if !(r.is_finite() && r > 0.0) {
            return bad(format!(
                "the rate must be a positive number of requests per second, not {r}"
            ));
        }
    }
    let allowed = allowed_cpus().map_err(BenchError::AllowedCpus)?;
    if opts.cpus.is_empty() {
        return Ok(allowed);
    }
    if let Some(c) = opts.cpus.iter().find(|c| !allowed.contains(c)) {
        return bad(format!(
            "core {c} is not one this process may run on ({})",
            format_cpu_list(&allowed)
        ));
    }
    Ok(opts.cpus.clone())
}

/// The fairness checks for `opts`' targets and load threads (none when the options are wrong:
/// `run` then says why). With `--start-at` the one-second busy-core sample is left out, so the
/// checks do not eat into the wait for a time shared by several machines.
fn fairness_warnings(opts: &BenchOptions) -> Vec<fairness::Warning> {
    let Ok(cpus) = check_options(opts) else {
        return Vec::new();
    };
    let targets: Vec<fairness::Target> = opts
        .targets
        .iter()
        .filter_map(|t| {
            Some(fairness::Target {
                name: t.name.clone(),
                addr: t.resolve().ok()?,
                host: t.url.authority().map(|a| a.to_string())?,
                path: t.url.path_and_query().map_or("/".into(), |p| p.to_string()),
                plain_http: t.url.scheme_str() == Some("http")
                    && opts.websocket.is_none()
                    && opts.http2.is_none(),
                proxied: None,
            })
        })
        .collect();
    let load = fairness::Load {
        connections: opts.connections,
        keep_alive: opts.request.keep_alive,
        rate: opts.rate,
        run: opts.warmup + opts.duration,
    };
    fairness::check(&targets, &load, &cpus, None, opts.start_at.is_none())
}

/// The live progress line: `round 2/5  proxied  3.2/10 s  48211 req/s  0 errors`, the
/// warm-up's progress before the recorded window starts, and with `-n` the responses so far.
fn progress_line(
    round: usize,
    opts: &BenchOptions,
    target: &str,
    elapsed: Duration,
    rate: f64,
    done: Done,
) -> String {
    let e = elapsed.as_secs_f64();
    let warmup = opts.warmup.as_secs_f64();
    let phase = if e < warmup {
        format!("warm-up {e:.1}/{warmup:.1} s")
    } else if let Some(n) = opts.requests {
        format!("{:.1} s  {} responses of {n}", e - warmup, done.responses)
    } else {
        format!(
            "{:.1}/{:.1} s",
            (e - warmup).min(opts.duration.as_secs_f64()),
            opts.duration.as_secs_f64()
        )
    };
    let unit = if opts.websocket.is_some() {
        "msg/s"
    } else {
        "req/s"
    };
    format!(
        "round {}/{}  {target}  {phase}  {rate:.0} {unit}  {} errors",
        round + 1,
        opts.rounds,
        done.errors
    )
}

/// `pinlb bench`'s command line: a run, or `merge` of runs' reports.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub action: Option<BenchAction>,
    /// Targets, compared against the first: NAME=URL or URL (http:// or https://). With
    /// --proxy they come after the targets it starts. Each one's CPU per request (user +
    /// system µs per response, from /proc over the recorded windows) is printed for the
    /// process listening on its port when that is on this machine, "–" where unknown.
    #[arg(required_unless_present = "proxy", value_name = "TARGET")]
    pub targets: Vec<Target>,
    /// Start these proxies (pinlb, nginx, haproxy; nginx and HAProxy found on PATH, skipped
    /// with a line saying how to install them when not) in front of --backend, pinned to
    /// --proxy-cpus with a worker per core, on configurations equivalent to pinlb's (the ones
    /// `pinlb sweep --proxy` writes), and bench `direct` (the first backend alone) and then
    /// each proxy in the same interleaved rounds. Give --cpus to keep the load off their cores.
    #[arg(long, value_name = "LIST", value_parser = parse_proxies, requires = "backend")]
    pub proxy: Option<std::vec::Vec<crate::peers::Proxy>>,
    /// With --proxy: the backends, already running (`pinlb backend`, your app).
    #[arg(
        long,
        value_name = "ADDR,...",
        value_delimiter = ',',
        requires = "proxy"
    )]
    pub backend: Vec<SocketAddr>,
    /// With --proxy: the proxies' cores, one worker each [default: the first core this
    /// process may run on].
    #[arg(long, value_name = "LIST", requires = "proxy")]
    pub proxy_cpus: Option<String>,
    /// With --proxy: where each proxy's configuration and logs go [default: a pinlb-bench-PID
    /// directory in the temporary directory].
    #[arg(long, value_name = "DIR", requires = "proxy")]
    pub proxy_dir: Option<PathBuf>,
    /// With --proxy: the path requested from direct and the proxies.
    #[arg(long, default_value = "/", requires = "proxy")]
    pub path: String,
    /// Connections open at once per target (ab's concurrency); kept alive unless
    /// --disable-keepalive.
    #[arg(short, long, default_value_t = 64)]
    pub connections: usize,
    /// Load threads [default: the number of --cpus, at most -c].
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Recorded duration of each run (wrk's -d).
    #[arg(short, long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Send this many requests per run instead of running for a duration (ab's and oha's -n);
    /// then --warmup defaults to 0 and --rounds to 1, as ab measures.
    #[arg(short = 'n', long, value_name = "N", conflicts_with = "duration")]
    pub requests: Option<u64>,
    /// Unrecorded load before each recorded run [default: 1s, or 0s with -n].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub warmup: Option<Duration>,
    /// Rounds; each runs every target once, in order [default: 3, or 1 with -n].
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Open loop at this many requests/s in total, latency from the scheduled send time
    /// (corrected for coordinated omission) [default: closed loop].
    #[arg(long, value_name = "REQ_PER_S")]
    pub rate: Option<f64>,
    /// The request method (ab's -m, oha's -m, curl's -X).
    #[arg(short, long, value_name = "METHOD", default_value = "GET")]
    pub method: http::Method,
    /// A header for every request, "Name: value"; repeat it for more (ab, wrk, oha, curl: -H).
    /// One named Host replaces the URL's.
    #[arg(short = 'H', long = "header", value_name = "HEADER", value_parser = wire::parse_header)]
    pub headers: Vec<(String, String)>,
    /// The request body, sent with its Content-Length (curl's --data; -d is the duration, as in
    /// wrk).
    #[arg(long, value_name = "STRING", conflicts_with = "body_file")]
    pub body: Option<String>,
    /// The request body, read from FILE (ab's -p, oha's -D).
    #[arg(long, value_name = "FILE")]
    pub body_file: Option<PathBuf>,
    /// A new connection for every request, which asks the server to close it: ab's default
    /// (ab -k keeps alive). Latency then counts the connect, as ab's does.
    #[arg(long)]
    pub disable_keepalive: bool,
    /// Send HTTP/1.0 requests, as ab does (kept alive with Connection: keep-alive unless
    /// --disable-keepalive).
    #[arg(long = "http1.0")]
    pub http10: bool,
    /// WebSocket echo instead of HTTP requests: each connection upgrades its target's URL
    /// once (not timed), then sends a binary message and waits for its echo, over and over;
    /// rates are messages/s. Closed loop only.
    #[arg(long, conflicts_with_all = ["rate", "body", "body_file", "disable_keepalive", "http10"])]
    pub ws: bool,
    /// With --ws or ws:// targets: the size of each message ("64", "1KiB"; default 64).
    #[arg(long, value_name = "SIZE")]
    pub message_size: Option<bytesize::ByteSize>,
    /// HTTP/2 (h2load's --h2): prior knowledge on http://, ALPN h2 on https://. Each
    /// connection carries --streams requests at once. Closed loop only.
    #[arg(long, conflicts_with_all = ["ws", "rate", "disable_keepalive", "http10"])]
    pub h2: bool,
    /// With --h2: concurrent streams per connection (h2load's -m).
    #[arg(long, value_name = "M", default_value_t = 1, requires = "h2")]
    pub streams: usize,
    /// Cores for the load threads, e.g. "1" or "2-3" [default: every allowed core].
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,
    /// Per request (and connect).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// https://: take any certificate (curl's -k), for a test server's self-signed one.
    #[arg(short = 'k', long, conflicts_with = "cacert")]
    pub insecure: bool,
    /// https://: trust the certificates in this PEM file (curl's --cacert) [default: the
    /// system's, /etc/ssl/certs/ca-certificates.crt].
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Wait until this wall-clock time before the first warm-up: an RFC 3339 UTC time
    /// (2026-12-01T12:00:00Z) or +DURATION from now (+10s). Give several machines the same
    /// time, then `pinlb bench merge` their --json reports.
    #[arg(long, value_name = "TIME", value_parser = parse_start_at)]
    pub start_at: Option<SystemTime>,
    /// Also write the results as JSON to FILE, with each round's full latency histogram
    /// (HdrHistogram's compressed encoding, base64), the start and end times and the command.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write a latency-by-percentile chart (SVG) to FILE.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Skip the fairness checks warned about before the run (docs/performance.md): the load
    /// generator sharing a target's core, a debug build of pinlb, a proxy without keep-alive to
    /// its backends, SMT siblings, the frequency governor, local ports, a core already busy.
    #[arg(long)]
    pub no_checks: bool,
}

/// What `pinlb bench` does instead of a run.
#[derive(Debug, clap::Subcommand)]
pub enum BenchAction {
    /// Add up the --json reports of runs that loaded the same targets at the same time
    /// (several machines given the same --start-at) and print them as one run: rates summed per
    /// round, percentiles from the added histograms.
    Merge(merge::MergeArgs),
}

impl BenchArgs {
    /// Whether the run is WebSocket echo: `--ws`, or `ws://` and `wss://` targets, which imply
    /// it. Without `--ws`, `ws://` and `http://` targets in one run are refused: the ones would
    /// be echoes and the others requests, and no figure compares the two. With it, an
    /// `http://` URL is upgraded just as its `ws://` twin, so they mix.
    fn websocket(&self) -> Result<bool, BenchError> {
        let (ws, http): (Vec<&Target>, Vec<&Target>) =
            self.targets.iter().partition(|t| t.is_websocket());
        let websocket = self.ws || !ws.is_empty();
        if !self.ws {
            if let (Some(w), Some(h)) = (ws.first(), http.first()) {
                return Err(BenchError::Options(format!(
                    "{} is a WebSocket target and {} is not: give --ws to bench every target as \
                     a WebSocket echo (an http:// URL is then upgraded as ws:// is), or bench \
                     them in separate runs",
                    w.url, h.url
                )));
            }
        }
        if !websocket && self.message_size.is_some() {
            return Err(BenchError::Options(
                "--message-size is the size of WebSocket messages: give --ws or ws:// targets"
                    .into(),
            ));
        }
        Ok(websocket)
    }

    /// The options these arguments ask for; the progress line is on.
    pub fn options(&self) -> Result<BenchOptions, BenchError> {
        let cpus = match &self.cpus {
            Some(list) => parse_cpu_list(list)
                .map_err(|e| BenchError::Options(format!("--cpus {list:?}: {e}")))?,
            None => allowed_cpus().map_err(BenchError::AllowedCpus)?,
        };
        let threads = self
            .threads
            .unwrap_or_else(|| cpus.len().clamp(1, self.connections.max(1)));
        let websocket = if self.websocket()? {
            let size = self.message_size.map_or(64, |s| s.as_u64());
            Some(usize::try_from(size).map_err(|_| {
                BenchError::Options(format!("--message-size {size} does not fit in memory here"))
            })?)
        } else {
            None
        };
        let body = match (&self.body, &self.body_file) {
            (Some(s), _) => Some(s.clone().into_bytes()),
            (None, Some(path)) => Some(std::fs::read(path).map_err(|e| {
                BenchError::Options(format!("--body-file {}: {e}", path.display()))
            })?),
            (None, None) => None,
        };
        let counted = self.requests.is_some();
        Ok(BenchOptions {
            targets: self.targets.clone(),
            websocket,
            http2: self.h2.then_some(self.streams),
            connections: self.connections,
            threads,
            duration: self.duration,
            requests: self.requests,
            request: RequestSpec {
                method: self.method.clone(),
                headers: self.headers.clone(),
                body,
                http10: self.http10,
                keep_alive: !self.disable_keepalive,
            },
            warmup: self.warmup.unwrap_or(if counted {
                Duration::ZERO
            } else {
                Duration::from_secs(1)
            }),
            rounds: self.rounds.unwrap_or(if counted { 1 } else { 3 }),
            rate: self.rate,
            cpus,
            timeout: self.timeout,
            trust: match (&self.cacert, self.insecure) {
                (Some(path), _) => Trust::File(path.clone()),
                (None, true) => Trust::Insecure,
                (None, false) => Trust::System,
            },
            start_at: self.start_at,
            progress: true,
        })
    }
}

fn parse_proxies(s: &str) -> Result<Vec<crate::peers::Proxy>, String> {
    crate::peers::Proxy::parse_list(s)
}

/// The options, with `--proxy`'s proxies started (stopped when the returned `Children` is
/// dropped) and their targets first, and the processes of every target whose CPU can be read:
/// those started, and for URLs the process listening on each one's port on this machine.
fn prepare(
    args: &BenchArgs,
) -> Result<
    (
        BenchOptions,
        Vec<Processes>,
        Option<crate::launch::Children>,
    ),
    BenchError,
> {
    let mut opts = args.options()?;
    let given = proxies::discover(&opts.targets);
    if args.proxy.is_none() {
        return Ok((opts, given, None));
    }
    let started = proxies::start(args)?;
    for line in &started.skipped {
        eprintln!("pinlb bench: {line}");
    }
    opts.targets.splice(0..0, started.targets);
    let mut processes = started.processes;
    processes.extend(given);
    Ok((opts, processes, Some(started.children)))
}

/// `pinlb bench`: runs, prints the table to stdout, writes `--json` and `--plot`. Exits 1 when
/// the bench cannot run, a file cannot be written, or a target answered no request at all
/// (refused every connection, say): then no figure compares anything. Other errors during the
/// run are results, and are in the table.
pub fn main(args: BenchArgs) -> ExitCode {
    if let Some(BenchAction::Merge(m)) = &args.action {
        return merge::main(m);
    }
    let report = match prepare(&args).and_then(|(o, p, children)| {
        if !args.no_checks {
            for w in fairness_warnings(&o) {
                eprintln!("pinlb bench: warning: {w}");
            }
        }
        let r = run_metered(&o, &p);
        drop(children);
        r
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pinlb bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.table());
    let mut code = ExitCode::SUCCESS;
    for failure in report.failures() {
        eprintln!("pinlb bench: {failure}");
        code = ExitCode::FAILURE;
    }
    if let Some(path) = &args.json {
        if let Err(e) = report.write_json(path) {
            eprintln!("pinlb bench: cannot write {}: {e}", path.display());
            code = ExitCode::FAILURE;
        }
    }
    if let Some(path) = &args.plot {
        if let Err(e) = report.write_svg(path) {
            eprintln!("pinlb bench: {e}");
            code = ExitCode::FAILURE;
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Result<Target, BenchError> {
        s.parse()
    }

    #[test]
    fn a_target_is_name_equals_url_or_just_a_url() {
        let t = target("direct=http://127.0.0.1:8881/").unwrap();
        assert_eq!(t.name, "direct");
        assert_eq!(t.url, "http://127.0.0.1:8881/");
        let t = target("http://127.0.0.1:8881/x?a=b").unwrap();
        assert_eq!(t.name, "http://127.0.0.1:8881/x?a=b");
        assert_eq!(t.url.query(), Some("a=b"));
    }

    #[test]
    fn only_http_and_ws_urls_with_a_host_are_targets() {
        assert!(target("https://example.com/").is_ok());
        let ws = target("echo=ws://127.0.0.1:8881/chat").unwrap();
        assert!(ws.is_websocket() && !ws.is_https());
        assert_eq!(ws.resolve().unwrap(), "127.0.0.1:8881".parse().unwrap());
        let wss = target("wss://127.0.0.1/").unwrap();
        assert!(wss.is_websocket() && wss.is_https());
        assert_eq!(wss.resolve().unwrap(), "127.0.0.1:443".parse().unwrap());
        for bad in [
            "ftp://example.com/",
            "127.0.0.1:8881",
            "=http://127.0.0.1/",
            "x=not a url",
            "/just/a/path",
        ] {
            assert!(target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn targets_resolve_with_port_80_by_default() {
        let t = target("http://127.0.0.1/").unwrap();
        assert_eq!(t.resolve().unwrap(), "127.0.0.1:80".parse().unwrap());
        let t = target("http://[::1]:8080/").unwrap();
        assert_eq!(t.resolve().unwrap(), "[::1]:8080".parse().unwrap());
        let t = target("https://127.0.0.1/").unwrap();
        assert_eq!(t.resolve().unwrap(), "127.0.0.1:443".parse().unwrap());
    }

    fn opts() -> BenchOptions {
        BenchOptions {
            targets: vec![target("http://127.0.0.1:1/").unwrap()],
            connections: 4,
            threads: 2,
            duration: Duration::from_secs(1),
            requests: None,
            request: RequestSpec::default(),
            warmup: Duration::from_secs(1),
            rounds: 1,
            rate: None,
            websocket: None,
            http2: None,
            cpus: Vec::new(),
            timeout: Duration::from_secs(2),
            trust: Trust::default(),
            start_at: None,
            progress: false,
        }
    }

    #[test]
    fn options_are_checked_before_anything_runs() {
        assert_eq!(check_options(&opts()).unwrap(), allowed_cpus().unwrap());
        let bad = [
            BenchOptions {
                threads: 5,
                ..opts()
            },
            BenchOptions {
                connections: 0,
                ..opts()
            },
            BenchOptions {
                duration: Duration::ZERO,
                ..opts()
            },
            BenchOptions {
                rounds: 0,
                ..opts()
            },
            BenchOptions {
                rate: Some(0.0),
                ..opts()
            },
            BenchOptions {
                rate: Some(f64::NAN),
                ..opts()
            },
            BenchOptions {
                targets: Vec::new(),
                ..opts()
            },
            BenchOptions {
                requests: Some(0),
                ..opts()
            },
            BenchOptions {
                cpus: vec![100_000],
                ..opts()
            },
            BenchOptions {
                websocket: Some(64),
                rate: Some(100.0),
                ..opts()
            },
        ];
        for o in bad {
            assert!(check_options(&o).is_err(), "{o:?}");
        }
    }

    #[test]
    fn the_progress_line_shows_the_warm_up_then_the_recorded_window() {
        let o = BenchOptions {
            rounds: 5,
            ..opts()
        };
        let done = Done {
            responses: 70,
            errors: 3,
        };
        assert_eq!(
            progress_line(1, &o, "proxied", Duration::from_millis(400), 0.0, done),
            "round 2/5  proxied  warm-up 0.4/1.0 s  0 req/s  3 errors"
        );
        assert_eq!(
            progress_line(1, &o, "proxied", Duration::from_millis(1500), 48211.4, done),
            "round 2/5  proxied  0.5/1.0 s  48211 req/s  3 errors"
        );
        let counted = BenchOptions {
            requests: Some(100),
            ..o
        };
        assert_eq!(
            progress_line(0, &counted, "ab", Duration::from_millis(1500), 10.0, done),
            "round 1/5  ab  0.5 s  70 responses of 100  10 req/s  3 errors"
        );
    }
}
