//! `pinlb bench` against real backends on loopback: exact request accounting, the open loop's
//! rate, errors by kind, and the command line with `--json` and `--plot`.
//!
//! The backends here are a few lines of raw TCP that count every request head they read before
//! answering, so the count is final by the time the bench has its responses. The load threads
//! are pinned to the first core this process may use.

use crate::common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Refusing, bin, first_core};
use pinlb_tools::bench::{BenchOptions, Report, RequestSpec, Target, Trust, run};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a test backend answers each request.
#[derive(Clone, Copy)]
enum Reply {
    /// `200`, Content-Length framed.
    Ok,
    /// `200`, chunked in two chunks with a trailer.
    Chunked,
    /// `503`, Content-Length framed.
    Unavailable,
    /// `200` with `Connection: close`, and the connection closed after it.
    Close,
    /// `100 Continue`, then `200`: the interim response comes first.
    Interim,
    /// Reads requests and never answers.
    Silent,
}

impl Reply {
    fn bytes(self) -> Option<&'static [u8]> {
        match self {
            Reply::Ok => Some(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n"),
            Reply::Chunked => Some(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n6;x=y\r\nworld\n\r\n0\r\nX-T: 1\r\n\r\n",
            ),
            Reply::Unavailable => {
                Some(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\n\r\nbusy\n")
            }
            Reply::Close => Some(
                b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nConnection: close\r\n\r\nhello world\n",
            ),
            Reply::Interim => Some(
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n",
            ),
            Reply::Silent => None,
        }
    }
}

/// A keep-alive HTTP/1.1 backend on `127.0.0.1:0` that counts the requests it reads. It runs on
/// a runtime of its own, stopped when dropped.
struct Backend {
    addr: SocketAddr,
    seen: Arc<AtomicU64>,
    _rt: tokio::runtime::Runtime,
}

impl Backend {
    fn start(reply: Reply) -> Backend {
        let (addr, seen, rt) = counting_server(move |stream, seen| serve(stream, reply, seen));
        Backend {
            addr,
            seen,
            _rt: rt,
        }
    }

    fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    fn target(&self, name: &str) -> Target {
        format!("{name}=http://{}/", self.addr).parse().unwrap()
    }
}

/// A server on `127.0.0.1:0` on a runtime of its own (stopped when dropped), which runs
/// `serve` on each connection with the counter of requests it shares with the test.
fn counting_server<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicU64>, tokio::runtime::Runtime)
where
    F: Fn(TcpStream, Arc<AtomicU64>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("backend runtime");
    let listener = rt
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind a backend");
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, counter.clone()));
        }
    });
    (addr, seen, rt)
}

/// Requests are bodiless GETs, so each ends at the first empty line.
async fn serve(mut stream: TcpStream, reply: Reply, seen: Arc<AtomicU64>) {
    let mut pending = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&chunk[..n]);
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            pending.drain(..end + 4);
            seen.fetch_add(1, Ordering::SeqCst);
            if let Some(bytes) = reply.bytes() {
                if stream.write_all(bytes).await.is_err() || matches!(reply, Reply::Close) {
                    return;
                }
            }
        }
    }
}

/// Short runs: 4 connections on one thread pinned to the first allowed core.
fn options(targets: Vec<Target>) -> BenchOptions {
    BenchOptions {
        targets,
        connections: 4,
        threads: 1,
        duration: Duration::from_millis(300),
        requests: None,
        request: RequestSpec::default(),
        warmup: Duration::from_millis(100),
        rounds: 1,
        rate: None,
        websocket: None,
        http2: None,
        cpus: vec![first_core()],
        timeout: Duration::from_secs(2),
        trust: pinlb_tools::bench::Trust::default(),
        start_at: None,
        progress: false,
    }
}

/// What a run of the `pinlb bench` command left: its exit status and its output as text.
struct Ran {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// Panics with both outputs unless the command exited 0.
    fn succeeded(self) -> Ran {
        assert!(
            self.status.success(),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs `pinlb bench ARGS`.
fn pinlb_bench<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Ran {
    let out = Command::new(bin())
        .arg("bench")
        .args(args)
        .output()
        .expect("run pinlb bench");
    Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn bench(opts: &BenchOptions) -> Report {
    run(opts).expect("bench runs")
}

#[test]
fn bench_counts_exactly_the_requests_each_backend_saw() {
    let plain = Backend::start(Reply::Ok);
    let chunked = Backend::start(Reply::Chunked);
    let opts = BenchOptions {
        rounds: 2,
        ..options(vec![plain.target("plain"), chunked.target("chunked")])
    };
    let report = bench(&opts);

    for (t, backend) in report.targets.iter().zip([&plain, &chunked]) {
        let (r, w) = (t.requests, t.warmup);
        assert_eq!(r.sent + w.sent, backend.seen(), "{}: {r:?} {w:?}", t.name);
        assert!(r.sent > 0 && w.sent > 0, "{}: {r:?} {w:?}", t.name);
        assert_eq!(r.errors.total() + w.errors.total(), 0, "{}", t.name);
        assert_eq!((r.responses, r.ok), (r.sent, r.sent), "{}", t.name);
        assert_eq!(t.rounds.len(), 2);
        let per_round: u64 = t.rounds.iter().map(|x| x.requests.sent).sum();
        assert_eq!(per_round, r.sent);
        assert_eq!(t.histogram.len(), r.responses, "one latency per response");
        assert!(t.latency.p50_us > 0.0 && t.latency.p50_us <= t.latency.p99_us);
        assert!(t.requests_per_sec.median > 0.0);
    }
    let overhead = report.targets[1].vs_first.as_ref().expect("compared");
    assert_eq!(overhead.against, "plain");
    assert!(overhead.throughput_ratio.is_some());
}

#[test]
fn the_open_loop_holds_its_rate() {
    let backend = Backend::start(Reply::Ok);
    let opts = BenchOptions {
        connections: 8,
        duration: Duration::from_secs(1),
        warmup: Duration::ZERO,
        rate: Some(2000.0),
        ..options(vec![backend.target("paced")])
    };
    let report = bench(&opts);
    let t = &report.targets[0];
    assert_eq!(t.requests.sent, backend.seen());
    assert_eq!(t.requests.errors.total(), 0, "{:?}", t.requests);
    // Slots are scheduled 1/2000 s apart, so the count is the rate by construction; what the
    // rate checks is that the responses kept up with the schedule.
    assert!(
        (1800..=2200).contains(&t.requests.responses),
        "{:?}",
        t.requests
    );
    let rps = t.rounds[0].requests_per_sec;
    assert!((1800.0..=2200.0).contains(&rps), "{rps} req/s");
}

#[test]
fn connections_the_server_closes_are_replaced_and_interim_responses_skipped() {
    let closing = Backend::start(Reply::Close);
    let interim = Backend::start(Reply::Interim);
    let report = bench(&options(vec![
        closing.target("closing"),
        interim.target("interim"),
    ]));
    for (t, backend) in report.targets.iter().zip([&closing, &interim]) {
        let (r, w) = (t.requests, t.warmup);
        assert_eq!(r.sent + w.sent, backend.seen(), "{}: {r:?} {w:?}", t.name);
        assert!(r.sent > 0, "{}: {r:?}", t.name);
        assert_eq!(r.errors.total() + w.errors.total(), 0, "{}", t.name);
        assert_eq!((r.responses, r.ok), (r.sent, r.sent), "{}", t.name);
    }
}

#[test]
fn a_refusing_port_gives_connect_errors_and_no_requests() {
    let dead = Refusing::new();
    let addr = dead.addr;
    let opts = BenchOptions {
        duration: Duration::from_millis(200),
        warmup: Duration::ZERO,
        ..options(vec![format!("down=http://{addr}/").parse().unwrap()])
    };
    let report = bench(&opts);
    let r = report.targets[0].requests;
    assert!(r.errors.connect > 0, "{r:?}");
    assert_eq!((r.sent, r.responses), (0, 0), "{r:?}");
    assert_eq!(report.targets[0].requests_per_sec.median, 0.0);
    assert!(report.table().contains("connect "), "{}", report.table());
}

#[test]
fn a_backend_answering_503_counts_non_2xx() {
    let backend = Backend::start(Reply::Unavailable);
    let report = bench(&options(vec![backend.target("busy")]));
    let t = &report.targets[0];
    let (r, w) = (t.requests, t.warmup);
    assert_eq!(r.sent + w.sent, backend.seen());
    assert!(r.responses > 0);
    assert_eq!(r.errors.non_2xx, r.responses, "{r:?}");
    assert_eq!(r.ok, 0);
    assert!(report.table().contains("non-2xx "), "{}", report.table());
}

#[test]
fn a_backend_that_never_answers_gives_timeouts() {
    let backend = Backend::start(Reply::Silent);
    let opts = BenchOptions {
        connections: 2,
        duration: Duration::from_millis(250),
        warmup: Duration::ZERO,
        timeout: Duration::from_millis(100),
        ..options(vec![backend.target("silent")])
    };
    let report = bench(&opts);
    let r = report.targets[0].requests;
    // Each connection sends at about 0, 100 and 200 ms, and each request times out.
    assert!(r.errors.timeout >= 2, "{r:?}");
    assert_eq!(r.errors.timeout, r.sent, "{r:?}");
    assert_eq!(r.responses, 0);
    assert!(backend.seen() > 0 && backend.seen() <= r.sent);
    assert_eq!(report.targets[0].histogram.len(), 0);
}

#[test]
fn the_open_loop_stops_with_the_window_when_the_server_falls_behind() {
    let backend = Backend::start(Reply::Silent);
    let opts = BenchOptions {
        connections: 2,
        duration: Duration::from_millis(300),
        warmup: Duration::ZERO,
        timeout: Duration::from_millis(100),
        rate: Some(1000.0),
        ..options(vec![backend.target("silent")])
    };
    let report = bench(&opts);
    let t = &report.targets[0];
    // 300 slots fall in the window, but each request takes the 100 ms timeout: each connection
    // gets through about three before the window closes, and the rest are never sent.
    assert!(t.requests.sent <= 10, "{:?}", t.requests);
    assert_eq!(t.requests.errors.timeout, t.requests.sent);
    assert!(t.rounds[0].elapsed_s < 1.0, "{:?}", t.rounds[0]);
}

/// A directory of its own under the system temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("pinlb-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_command_prints_the_table_and_writes_json_and_a_chart() {
    let backend = Backend::start(Reply::Ok);
    let dir = TempDir::new("bench-cli");
    let (json, svg) = (dir.0.join("out.json"), dir.0.join("out.svg"));
    let core = first_core().to_string();
    let out = Command::new(bin())
        .args(["bench", &format!("local=http://{}/", backend.addr)])
        .args(["-c", "2", "-d", "200ms", "--warmup", "0s", "--rounds", "1"])
        .args(["--cpus", &core])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        // The fairness checks would rightly warn that the backend, in this process, may run on
        // the load core (tests/fairness.rs checks them); this test wants stderr empty.
        .arg("--no-checks")
        .output()
        .expect("run pinlb bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("| local | "), "{stdout}");
    assert!(
        stderr.is_empty(),
        "no progress line off a terminal: {stderr:?}"
    );

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let t = &v["targets"][0];
    assert_eq!(t["name"], "local");
    assert_eq!(t["requests"]["sent"].as_u64(), Some(backend.seen()));
    assert_eq!(v["threads"], 1);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") && chart.contains("local"));
}

/// The shared recording backend (`common::Backend`) on a runtime of its own, so the bench can
/// block this thread while it answers.
fn recording_backend() -> (tokio::runtime::Runtime, common::Backend) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("backend runtime");
    let backend = rt.block_on(common::Backend::start("rec"));
    (rt, backend)
}

#[test]
fn a_request_count_sends_exactly_that_many_on_the_kept_connections() {
    let (_rt, backend) = recording_backend();
    let opts = BenchOptions {
        requests: Some(250),
        warmup: Duration::ZERO,
        ..options(vec![
            format!("rec=http://{}/x", backend.addr).parse().unwrap(),
        ])
    };
    let report = bench(&opts);
    let r = report.targets[0].requests;
    assert_eq!((r.sent, r.ok), (250, 250), "{r:?}");
    assert_eq!(backend.hits(), 250);
    assert_eq!(backend.accepts(), 4, "one connection each, kept alive");
    assert_eq!(r.statuses.top(), vec![(200, 250)]);
    assert!(r.bytes_read > 250 * 12, "{r:?}");
    assert!(
        report.table().contains("250 requests"),
        "{}",
        report.table()
    );
}

#[test]
fn method_headers_and_body_go_out_and_without_keep_alive_each_on_its_own_connection() {
    let (_rt, backend) = recording_backend();
    let opts = BenchOptions {
        requests: Some(40),
        warmup: Duration::ZERO,
        request: RequestSpec {
            method: http::Method::POST,
            headers: vec![("X-Test".into(), "yes".into())],
            body: Some(b"hello body".to_vec()),
            http10: false,
            keep_alive: false,
        },
        ..options(vec![
            format!("rec=http://{}/post", backend.addr).parse().unwrap(),
        ])
    };
    let report = bench(&opts);
    let r = report.targets[0].requests;
    assert_eq!((r.sent, r.ok), (40, 40), "{r:?}");
    assert_eq!(backend.accepts(), 40, "a new connection per request");
    let seen = backend.requests();
    assert_eq!(seen.len(), 40);
    for req in seen {
        assert_eq!(req.method, http::Method::POST);
        assert_eq!(req.headers["x-test"], "yes");
        assert_eq!(req.body_start, b"hello body");
    }
}

#[test]
fn http_1_0_requests_are_kept_alive_when_the_server_agrees() {
    let (_rt, backend) = recording_backend();
    let opts = BenchOptions {
        requests: Some(20),
        warmup: Duration::ZERO,
        request: RequestSpec {
            http10: true,
            ..RequestSpec::default()
        },
        ..options(vec![
            format!("rec=http://{}/", backend.addr).parse().unwrap(),
        ])
    };
    let report = bench(&opts);
    assert_eq!(report.targets[0].requests.ok, 20);
    let seen = backend.requests();
    assert!(seen.iter().all(|r| r.version == http::Version::HTTP_10));
}

#[test]
fn a_head_request_reads_no_body() {
    let (_rt, backend) = recording_backend();
    let opts = BenchOptions {
        requests: Some(30),
        warmup: Duration::ZERO,
        request: RequestSpec {
            method: http::Method::HEAD,
            ..RequestSpec::default()
        },
        ..options(vec![
            format!("rec=http://{}/", backend.addr).parse().unwrap(),
        ])
    };
    let report = bench(&opts);
    let r = report.targets[0].requests;
    assert_eq!((r.ok, r.errors.total()), (30, 0), "{r:?}");
    assert_eq!(
        backend.accepts(),
        4,
        "no connection was spoiled by a body it waited for"
    );
}

#[test]
fn the_command_takes_ab_s_flags() {
    let (_rt, backend) = recording_backend();
    let core = first_core().to_string();
    let dir = TempDir::new("bench-ab");
    let body = dir.0.join("body.json");
    std::fs::write(&body, b"{\"a\":1}").unwrap();
    let url = format!("http://{}/api", backend.addr);
    let body = body.to_str().unwrap();
    let Ran { stdout, .. } = pinlb_bench([
        url.as_str(),
        "-n",
        "100",
        "-c",
        "4",
        "--disable-keepalive",
        "-m",
        "PUT",
        "-H",
        "Content-Type: application/json",
        "-H",
        "X-Two: 2",
        "--body-file",
        body,
        "--cpus",
        &core,
    ])
    .succeeded();
    assert!(stdout.contains("200 ×100"), "{stdout}");
    assert!(
        stdout.contains("1 interleaved round(s) of 100 requests;"),
        "{stdout}"
    );
    let seen = backend.requests();
    assert_eq!((seen.len(), backend.accepts()), (100, 100));
    assert!(seen.iter().all(|r| r.method == http::Method::PUT
        && r.headers["content-type"] == "application/json"
        && r.headers["x-two"] == "2"
        && r.body_start == b"{\"a\":1}"));
}

#[test]
fn the_command_fails_when_a_target_refuses_every_connection() {
    let backend = Backend::start(Reply::Ok);
    let dead = Refusing::new();
    let core = first_core().to_string();
    let (up, down) = (
        format!("up=http://{}/", backend.addr),
        format!("down=http://{}/", dead.addr),
    );
    let Ran {
        status,
        stdout,
        stderr,
    } = pinlb_bench([
        up.as_str(),
        &down,
        "-d",
        "200ms",
        "--warmup",
        "0s",
        "--rounds",
        "1",
        "-c",
        "2",
        "--cpus",
        &core,
    ]);
    assert_eq!(
        status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stderr.contains("target down") && stderr.contains("connection refused"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("0.00×") && !stdout.contains("| -"),
        "{stdout}"
    );
}

/// pinlb terminating TLS on `127.0.0.1` with a self-signed certificate for that address, in
/// front of the recording backend; the certificate's PEM file is returned beside it.
fn tls_proxy(
    rt: &tokio::runtime::Runtime,
    backend: &common::Backend,
    dir: &TempDir,
) -> (common::Proxy, std::path::PathBuf) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (pem, key) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
    std::fs::write(&pem, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.signing_key.serialize_pem()).unwrap();
    let toml = common::Setup::with(&[backend.addr]).toml().replacen(
        "upstream = \"app\"\n",
        &format!("upstream = \"app\"\n[listener.tls]\ncert = {pem:?}\nkey = {key:?}\n"),
        1,
    );
    let _guard = rt.enter();
    (common::Proxy::start_toml(&toml), pem)
}

#[test]
fn https_targets_are_loaded_over_tls_trusting_the_given_certificate_or_any() {
    let (rt, backend) = recording_backend();
    let dir = TempDir::new("bench-tls");
    let (proxy, pem) = tls_proxy(&rt, &backend, &dir);
    let url = format!("https://127.0.0.1:{}/", proxy.addr.port());
    for trust in [Trust::File(pem.clone()), Trust::Insecure] {
        let opts = BenchOptions {
            requests: Some(60),
            warmup: Duration::ZERO,
            trust: trust.clone(),
            ..options(vec![url.parse().unwrap()])
        };
        let r = bench(&opts).targets[0].requests;
        assert_eq!(
            (r.sent, r.ok, r.errors.total()),
            (60, 60, 0),
            "{trust:?}: {r:?}"
        );
    }
    // Without keep-alive every request is a handshake of its own.
    let opts = BenchOptions {
        requests: Some(20),
        warmup: Duration::ZERO,
        trust: Trust::Insecure,
        request: RequestSpec {
            keep_alive: false,
            ..RequestSpec::default()
        },
        ..options(vec![url.parse().unwrap()])
    };
    assert_eq!(bench(&opts).targets[0].requests.ok, 20);
    assert_eq!(backend.hits(), 60 + 60 + 20);
}

#[test]
fn the_command_refuses_an_untrusted_certificate_and_says_why() {
    let (rt, backend) = recording_backend();
    let dir = TempDir::new("bench-untrusted");
    let (proxy, pem) = tls_proxy(&rt, &backend, &dir);
    let core = first_core().to_string();
    let url = format!("https://127.0.0.1:{}/", proxy.addr.port());
    let run = |extra: &[&str]| {
        let mut args = vec![url.as_str(), "-n", "10", "-c", "2", "--cpus", &core];
        args.extend_from_slice(extra);
        pinlb_bench(args)
    };
    let refused = run(&[]);
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("answered no request")
            && refused.stderr.contains("connect(s) failed"),
        "{}",
        refused.stderr
    );
    assert_eq!(backend.hits(), 0);
    run(&["--cacert", pem.to_str().unwrap()]).succeeded();
    run(&["-k"]).succeeded();
    assert_eq!(backend.hits(), 20);
}

#[test]
fn the_command_rejects_a_target_it_cannot_load() {
    let out = Command::new(bin())
        .args(["bench", "ftp://127.0.0.1:1/"])
        .output()
        .expect("run pinlb bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("only http://, https://, ws:// and wss:// URLs are supported, not ftp://"),
        "{stderr}"
    );
}

/// A `pinlb backend` on the first allowed core, whose WebSocket path echoes.
fn echo_backend() -> pinlb_tools::backend::Backends {
    pinlb_tools::backend::Backends::start(&pinlb_tools::backend::BackendSpec {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        cpus: vec![first_core()],
        ..Default::default()
    })
    .expect("start pinlb backend")
}

#[test]
fn websocket_mode_counts_every_echo_of_pinlb_backend_and_no_errors() {
    let backends = echo_backend();
    let addr = backends.addrs()[0];
    let opts = BenchOptions {
        websocket: Some(64),
        rounds: 2,
        ..options(vec![format!("echo=http://{addr}/ws").parse().unwrap()])
    };
    let report = bench(&opts);
    let t = &report.targets[0];
    let (r, w) = (t.requests, t.warmup);
    assert!(r.responses > 0, "{r:?}");
    assert_eq!(r.errors.total() + w.errors.total(), 0, "{r:?} {w:?}");
    assert_eq!((r.responses, r.ok), (r.sent, r.sent), "{r:?}");
    assert_eq!(t.histogram.len(), r.responses, "one latency per echo");
    assert!(t.latency.p50_us > 0.0 && t.latency.p50_us <= t.latency.p99_us);
    assert_eq!(report.message_size, Some(64));
    assert!(report.table().contains("msg/s"), "{}", report.table());
    // One upgrade per connection and run (each run opens its own): no reconnects.
    assert_eq!(
        backends.requests(),
        2 * 4,
        "4 connections in each of 2 runs"
    );
    backends.stop();
}

#[test]
fn websocket_mode_against_a_server_that_does_not_upgrade_gives_handshake_errors() {
    let backend = Backend::start(Reply::Ok);
    let opts = BenchOptions {
        websocket: Some(64),
        duration: Duration::from_millis(200),
        warmup: Duration::ZERO,
        ..options(vec![backend.target("plain")])
    };
    let report = bench(&opts);
    let r = report.targets[0].requests;
    assert!(r.errors.handshake > 0, "{r:?}");
    assert_eq!((r.sent, r.responses), (0, 0), "{r:?}");
    assert!(report.table().contains("handshake "), "{}", report.table());
}

#[test]
fn the_command_in_websocket_mode_writes_well_formed_json() {
    let backends = echo_backend();
    let dir = TempDir::new("bench-ws-cli");
    let json = dir.0.join("out.json");
    let core = first_core().to_string();
    let out = Command::new(bin())
        .args(["bench", "--ws", "--message-size", "100"])
        .arg(format!("echo=http://{}/", backends.addrs()[0]))
        .args(["-c", "2", "-d", "200ms", "--warmup", "0s", "--rounds", "1"])
        .args(["--cpus", &core])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run pinlb bench --ws");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("| echo | "), "{stdout}");
    assert!(
        stdout.contains("WebSocket echo of 100-byte messages"),
        "{stdout}"
    );

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["message_size"], 100);
    let t = &v["targets"][0];
    assert_eq!(t["name"], "echo");
    assert!(t["requests"]["responses"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["requests"]["ok"], t["requests"]["responses"]);
    for (kind, n) in t["requests"]["errors"].as_object().unwrap() {
        assert_eq!(n.as_u64(), Some(0), "{kind}");
    }
    assert!(t["requests_per_sec"]["median"].as_f64().unwrap() > 0.0);
    assert!(t["latency"]["p99_us"].as_f64().unwrap() > 0.0);
    backends.stop();
}

#[test]
fn ws_urls_are_websocket_targets_and_mix_with_http_ones_only_under_ws() {
    let backends = echo_backend();
    let addr = backends.addrs()[0];
    let core = first_core().to_string();
    let window = ["-c", "2", "-d", "200ms", "--warmup", "0s", "--rounds", "1"];
    let ran = pinlb_bench(
        [
            format!("echo=ws://{addr}/"),
            "--message-size".into(),
            "100".into(),
        ]
        .into_iter()
        .chain(window.map(String::from))
        .chain(["--cpus".into(), core.clone()]),
    )
    .succeeded();
    assert!(
        ran.stdout.contains("WebSocket echo of 100-byte messages") && ran.stdout.contains("msg/s"),
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("| echo | "), "{}", ran.stdout);
    // With --ws an http:// URL is upgraded as its ws:// twin is: both are echo targets.
    let ran = pinlb_bench(
        [
            "--ws".to_string(),
            format!("a=ws://{addr}/"),
            format!("b=http://{addr}/"),
        ]
        .into_iter()
        .chain(window.map(String::from))
        .chain(["--cpus".into(), core]),
    )
    .succeeded();
    assert!(
        ran.stdout.contains("| a | ") && ran.stdout.contains("| b | "),
        "{}",
        ran.stdout
    );
    backends.stop();

    // Without it, echoes and requests would be compared: refused before anything runs.
    let ran = pinlb_bench([
        "a=ws://127.0.0.1:1/",
        "b=http://127.0.0.1:1/",
        "-d",
        "200ms",
    ]);
    assert_eq!(ran.status.code(), Some(1), "{}", ran.stderr);
    assert!(
        ran.stderr.contains(
            "ws://127.0.0.1:1/ is a WebSocket target and http://127.0.0.1:1/ is not: give --ws"
        ),
        "{}",
        ran.stderr
    );
    assert!(ran.stdout.is_empty(), "{}", ran.stdout);
}

/// A server that accepts connections and never answers on them (nor closes them), as long as
/// the test runs.
fn mute_server() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept() {
            held.push(stream);
        }
    });
    addr
}

#[test]
fn a_websocket_run_that_measured_nothing_says_why_and_fails() {
    // No handshake is answered: no message goes out, and none of the 0 msg/s is an error.
    let addr = mute_server();
    let core = first_core().to_string();
    let target = format!("mute=http://{addr}/");
    let ran = pinlb_bench([
        "--ws",
        target.as_str(),
        "-c",
        "2",
        "-d",
        "200ms",
        "--warmup",
        "0s",
        "--rounds",
        "1",
        "--timeout",
        "1s",
        "--cpus",
        &core,
    ]);
    assert_eq!(
        ran.status.code(),
        Some(1),
        "stdout:\n{}\nstderr:\n{}",
        ran.stdout,
        ran.stderr
    );
    assert!(
        ran.stderr.contains("target mute")
            && ran
                .stderr
                .contains("no message was sent within the 0.2 s window"),
        "{}",
        ran.stderr
    );
}

#[test]
fn the_command_refuses_the_open_loop_in_websocket_mode() {
    let out = Command::new(bin())
        .args(["bench", "--ws", "--rate", "100", "http://127.0.0.1:1/"])
        .output()
        .expect("run pinlb bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("'--ws' cannot be used with '--rate"),
        "{stderr}"
    );
}

/// An h2c (prior knowledge) server on hyper that counts the requests it answers: `200` with a
/// 12-byte body, or `503` on `/busy`. On a runtime of its own, stopped when dropped.
struct H2Backend {
    addr: SocketAddr,
    seen: Arc<AtomicU64>,
    _rt: tokio::runtime::Runtime,
}

impl H2Backend {
    fn start() -> H2Backend {
        let (addr, seen, rt) = counting_server(serve_h2);
        H2Backend {
            addr,
            seen,
            _rt: rt,
        }
    }

    fn seen(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }
}

/// One h2c connection: every request counted, then answered.
async fn serve_h2(stream: TcpStream, seen: Arc<AtomicU64>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
        seen.fetch_add(1, Ordering::SeqCst);
        let status = if req.uri().path() == "/busy" {
            503
        } else {
            200
        };
        let resp = hyper::Response::builder()
            .status(status)
            .body(Full::new(Bytes::from_static(b"hello world\n")));
        async move { resp }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

#[test]
fn h2_counts_exactly_the_streams_the_server_answered() {
    let backend = H2Backend::start();
    let busy = H2Backend::start();
    let targets = vec![
        format!("ok=http://{}/", backend.addr).parse().unwrap(),
        format!("busy=http://{}/busy", busy.addr).parse().unwrap(),
    ];
    let opts = BenchOptions {
        connections: 2,
        http2: Some(8),
        rounds: 2,
        ..options(targets)
    };
    let report = bench(&opts);
    for (t, server) in report.targets.iter().zip([&backend, &busy]) {
        let (r, w) = (t.requests, t.warmup);
        // The one request of the check that the target speaks HTTP/2, before the first round.
        assert_eq!(
            r.sent + w.sent + 1,
            server.seen(),
            "{}: {r:?} {w:?}",
            t.name
        );
        assert!(r.sent > 0 && w.sent > 0, "{}: {r:?}", t.name);
        assert_eq!(r.responses, r.sent, "{}: {r:?}", t.name);
        assert_eq!(t.histogram.len(), r.responses, "one latency per response");
        assert_eq!(r.bytes_read, 12 * r.responses, "{}: body bytes", t.name);
    }
    let (ok, busy_r) = (report.targets[0].requests, report.targets[1].requests);
    assert_eq!(ok.ok, ok.sent);
    assert_eq!(ok.errors.total(), 0);
    assert_eq!(busy_r.statuses.top(), vec![(503, busy_r.sent)]);
    assert_eq!(busy_r.errors.non_2xx, busy_r.sent);

    // -n: exactly that many, spread over the connections' streams.
    let counted = H2Backend::start();
    let opts = BenchOptions {
        connections: 3,
        http2: Some(5),
        requests: Some(101),
        warmup: Duration::ZERO,
        ..options(vec![format!("n=http://{}/", counted.addr).parse().unwrap()])
    };
    let r = bench(&opts).targets[0].requests;
    assert_eq!((r.sent, r.ok), (101, 101));
    assert_eq!(counted.seen(), 102);
}

#[test]
fn h2_against_an_http1_only_server_fails_and_says_so() {
    let backend = Backend::start(Reply::Ok);
    let ran = pinlb_bench([
        "--h2".to_string(),
        "--streams".into(),
        "4".into(),
        "-c".into(),
        "2".into(),
        "-n".into(),
        "10".into(),
        "--cpus".into(),
        first_core().to_string(),
        format!("http://{}/", backend.addr),
    ]);
    assert!(!ran.status.success(), "{}", ran.stdout);
    assert!(
        ran.stderr.contains("--h2") && ran.stderr.contains("HTTP/2"),
        "{}",
        ran.stderr
    );
    assert!(ran.stdout.is_empty(), "no table: {}", ran.stdout);

    // And the command line: the same counts as the library, from `--h2 --streams`.
    let h2 = H2Backend::start();
    let ran = pinlb_bench([
        "--h2".to_string(),
        "--streams".into(),
        "4".into(),
        "-c".into(),
        "2".into(),
        "-n".into(),
        "40".into(),
        "--cpus".into(),
        first_core().to_string(),
        format!("http://{}/", h2.addr),
    ])
    .succeeded();
    assert_eq!(h2.seen(), 41, "{}", ran.stdout);
    assert!(
        ran.stdout
            .contains("GET over HTTP/2, 4 concurrent stream(s) per connection"),
        "{}",
        ran.stdout
    );
}

/// A report's histogram, decoded here with hdrhistogram's own deserialiser (not pinlb's), as
/// any HdrHistogram tool would read it.
fn histogram_in(v: &serde_json::Value) -> hdrhistogram::Histogram<u64> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("a base64 histogram"))
        .expect("base64");
    hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .expect("an HdrHistogram V2 encoding")
}

fn json_file(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("read the report")).expect("JSON")
}

#[test]
fn two_benches_started_at_one_time_merge_into_exact_counts_and_percentiles() {
    let backends = echo_backend();
    let url = format!("backend=http://{}/", backends.addrs()[0]);
    let dir = TempDir::new("bench-merge");
    let core = first_core().to_string();
    let start = std::time::SystemTime::now() + Duration::from_secs(2);
    let start_at = humantime::format_rfc3339_millis(start).to_string();
    let files = [dir.0.join("a.json"), dir.0.join("b.json")];
    let children: Vec<_> = files
        .iter()
        .map(|json| {
            Command::new(bin())
                .args(["bench", &url, "-c", "2", "-d", "300ms", "--warmup", "100ms"])
                .args(["--rounds", "2", "--cpus", &core, "--start-at", &start_at])
                .arg("--json")
                .arg(json)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start pinlb bench")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("pinlb bench ends");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let runs: Vec<serde_json::Value> = files.iter().map(|f| json_file(f)).collect();
    for run in &runs {
        let began = humantime::parse_rfc3339(run["started_at"].as_str().unwrap()).unwrap();
        // Not before the time (the clock's millisecond rounding aside), and soon after it.
        assert!(
            began + Duration::from_millis(1) >= start
                && began <= start + Duration::from_millis(500),
            "started at {} for --start-at {start_at}",
            run["started_at"]
        );
        assert!(run["ended_at"].as_str().unwrap() > run["started_at"].as_str().unwrap());
        assert!(
            run["command"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "--start-at")
        );
    }

    let merged_json = dir.0.join("merged.json");
    let out = Command::new(bin())
        .args(["bench", "merge"])
        .args(&files)
        .arg("--json")
        .arg(&merged_json)
        .output()
        .expect("run pinlb bench merge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| backend | "), "{stdout}");
    assert!(stdout.contains("over 2 machines merged"), "{stdout}");

    let merged = json_file(&merged_json);
    let (m, a, b) = (
        &merged["targets"][0],
        &runs[0]["targets"][0],
        &runs[1]["targets"][0],
    );
    let count = |t: &serde_json::Value| t["requests"]["responses"].as_u64().unwrap();
    assert!(count(a) > 0 && count(b) > 0);
    assert_eq!(count(m), count(a) + count(b));
    assert_eq!(
        m["requests"]["sent"].as_u64().unwrap(),
        a["requests"]["sent"].as_u64().unwrap() + b["requests"]["sent"].as_u64().unwrap()
    );
    // One histogram fed both runs' rounds, each decoded on its own.
    let mut one = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
    for run in [a, b] {
        for round in run["rounds"].as_array().unwrap() {
            one.add(histogram_in(&round["histogram"])).unwrap();
        }
    }
    assert_eq!(one.len(), count(m));
    let us = |ns: u64| ns as f64 / 1000.0;
    assert_eq!(
        m["latency"]["p50_us"].as_f64(),
        Some(us(one.value_at_quantile(0.5)))
    );
    assert_eq!(
        m["latency"]["p99_us"].as_f64(),
        Some(us(one.value_at_quantile(0.99)))
    );
    assert_eq!(m["latency"]["max_us"].as_f64(), Some(us(one.max())));
    assert_eq!(histogram_in(&m["histogram"]), one);
    for r in 0..2 {
        let rate = |t: &serde_json::Value| t["rounds"][r]["requests_per_sec"].as_f64().unwrap();
        assert!((rate(m) - (rate(a) + rate(b))).abs() < 1e-6);
    }
    assert_eq!(merged["machines"], 2);
}

#[test]
fn a_start_time_in_the_past_and_reports_that_do_not_line_up_are_refused() {
    let ran = pinlb_bench(["http://127.0.0.1:1/", "--start-at", "2020-01-01T00:00:00Z"]);
    assert!(!ran.status.success());
    assert!(
        ran.stderr.contains("--start-at 2020-01-01T00:00:00") && ran.stderr.contains("in the past"),
        "{}",
        ran.stderr
    );
    let ran = pinlb_bench(["http://127.0.0.1:1/", "--start-at", "noon"]);
    assert!(!ran.status.success());
    assert!(ran.stderr.contains("RFC 3339"), "{}", ran.stderr);

    let backend = Backend::start(Reply::Ok);
    let dir = TempDir::new("bench-merge-mismatch");
    let core = first_core().to_string();
    let files = [dir.0.join("one.json"), dir.0.join("two.json")];
    for (json, name) in files.iter().zip(["one", "two"]) {
        let ran = pinlb_bench([
            format!("{name}=http://{}/", backend.addr),
            "-c".into(),
            "1".into(),
            "-d".into(),
            "100ms".into(),
            "--warmup".into(),
            "0s".into(),
            "--rounds".into(),
            "1".into(),
            "--cpus".into(),
            core.clone(),
            "--json".into(),
            json.display().to_string(),
        ]);
        assert!(ran.status.success(), "{}", ran.stderr);
    }
    let ran = pinlb_bench([
        "merge".to_string(),
        files[0].display().to_string(),
        files[1].display().to_string(),
    ]);
    assert!(!ran.status.success());
    assert!(
        ran.stderr.contains(&format!(
            "{} does not line up with {}",
            files[1].display(),
            files[0].display()
        )) && ran.stderr.contains("targets [two="),
        "{}",
        ran.stderr
    );
}

/// PATH with the system's sbin directories, where Debian installs nginx and HAProxy.
fn path_with_sbin() -> String {
    format!(
        "{}:/usr/sbin:/sbin",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs `pinlb bench ARGS` with PATH set to `path`.
fn pinlb_bench_with_path(args: &[&str], path: &str) -> Ran {
    let out = Command::new(bin())
        .arg("bench")
        .args(args)
        .env("PATH", path)
        .output()
        .expect("run pinlb bench");
    Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn bench_with_proxies_starts_them_in_front_of_the_backend_and_reads_their_cpu() {
    let backend = Backend::start(Reply::Ok);
    let cores = common::allowed();
    let proxy_core = cores[0];
    let load_core = *cores.last().unwrap();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-proxies-{}", std::process::id()));
    let json = dir.join("bench.json");
    let (addr, pc, lc) = (
        backend.addr.to_string(),
        proxy_core.to_string(),
        load_core.to_string(),
    );
    let ran = pinlb_bench_with_path(
        &[
            "--proxy",
            "pinlb,nginx,haproxy",
            "--backend",
            &addr,
            "--proxy-cpus",
            &pc,
            "--proxy-dir",
            dir.to_str().unwrap(),
            "--cpus",
            &lc,
            "-c",
            "4",
            "-d",
            "300ms",
            "--warmup",
            "100ms",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &path_with_sbin(),
    )
    .succeeded();
    for name in ["direct", "pinlb", "nginx", "haproxy"] {
        assert!(
            ran.stdout.contains(&format!("\n| {name} | ")),
            "{}",
            ran.stdout
        );
    }
    assert!(ran.stdout.contains("\nCPU per request ("), "{}", ran.stdout);
    let report: Report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let names: Vec<&str> = report.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["direct", "pinlb", "nginx", "haproxy"]);
    for t in &report.targets {
        assert_eq!(t.requests.errors.total(), 0, "{}", t.name);
        assert!(t.requests.responses > 0, "{}", t.name);
        let cpu = t
            .cpu
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no CPU", t.name));
        // The backend is this test process (its children, other tests' included, count with
        // it); the proxies are bench's children.
        if t.name == "direct" {
            assert!(cpu.server_pids.contains(&std::process::id()), "{cpu:?}");
            assert!(cpu.backends_us_per_request.is_empty());
        } else {
            assert!(!cpu.server_pids.contains(&std::process::id()), "{cpu:?}");
            assert!(
                cpu.server_us_per_request.unwrap() > 0.0,
                "{}: {cpu:?}",
                t.name
            );
            assert_eq!(cpu.backends_us_per_request.len(), 1, "{cpu:?}");
            assert!(cpu.backends_us_per_request[0].is_some(), "{cpu:?}");
        }
        // pinlb runs with its admin listener, whose /status says the limit its backend
        // learned; the other targets have none.
        let limits = &t.backends_concurrency_limit;
        if t.name == "pinlb" {
            assert!(
                limits.len() == 1 && limits[0].is_some_and(|l| (2..=1000).contains(&l)),
                "{limits:?}"
            );
        } else {
            assert!(limits.is_empty(), "{}: {limits:?}", t.name);
        }
    }
    let row = |name: &str| {
        let prefix = format!("| {name} | ");
        ran.stdout
            .lines()
            .rfind(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {name} row: {}", ran.stdout))
            .split('|')
            .map(|c| c.trim().to_string())
            .collect::<Vec<_>>()
    };
    // The CPU table's fourth column: the learned limit beside the backend's CPU.
    assert!(
        ran.stdout.contains("| backends' learned limit |"),
        "{}",
        ran.stdout
    );
    let learned = report.targets[1].backends_concurrency_limit[0].map(|l| l.to_string());
    assert_eq!(Some(row("pinlb")[4].clone()), learned, "{}", ran.stdout);
    assert_eq!(row("nginx")[4], "–", "{}", ran.stdout);
    // What reached the backend went through the proxies too.
    assert!(
        backend.seen() >= report.targets.iter().map(|t| t.requests.responses).sum(),
        "{}",
        backend.seen()
    );
    // The generated configurations pin the proxy core and keep the backend alive.
    let text = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    let nginx = text("nginx/nginx.conf");
    assert!(
        nginx.contains(&format!("worker_cpu_affinity 1{};", "0".repeat(proxy_core)))
            && nginx.contains(&format!("server {addr};"))
            && nginx.contains("keepalive 64;"),
        "{nginx}"
    );
    let haproxy = text("haproxy/haproxy.cfg");
    assert!(
        haproxy.contains(&format!("cpu-map 1/1 {proxy_core}\n"))
            && haproxy.contains(&format!("server b0 {addr}\n"))
            && haproxy.contains("http-reuse always"),
        "{haproxy}"
    );
    assert!(text("pinlb/pinlb.toml").contains(&format!("cpus = [{proxy_core}]")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_skips_a_proxy_missing_from_path_and_says_how_to_install_it() {
    let backend = Backend::start(Reply::Ok);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-missing-{}", std::process::id()));
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let (addr, core) = (backend.addr.to_string(), first_core().to_string());
    let ran = pinlb_bench_with_path(
        &[
            "--proxy",
            "pinlb,haproxy",
            "--backend",
            &addr,
            "--proxy-cpus",
            &core,
            "--proxy-dir",
            dir.to_str().unwrap(),
            "--cpus",
            &core,
            "-c",
            "2",
            "-d",
            "200ms",
            "--warmup",
            "0s",
            "--rounds",
            "1",
        ],
        empty.to_str().unwrap(),
    )
    .succeeded();
    assert!(
        ran.stderr.contains(
            "pinlb bench: haproxy not found on PATH: skipped (Debian: apt-get install haproxy)"
        ),
        "{}",
        ran.stderr
    );
    assert!(
        ran.stdout.contains("\n| pinlb | ") && !ran.stdout.contains("\n| haproxy | "),
        "{}",
        ran.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// pinlb with `server_timing` in front of a backend: `bench` reads pinlb's own time from each
/// response's `Server-Timing`, over HTTP/1.1 and over h2c, and prints it beside the latency; a
/// target whose responses carry none (the backend itself) has no figure.
#[test]
fn pinlb_s_own_time_is_read_from_server_timing_and_printed_beside_the_latency() {
    let backend = Backend::start(Reply::Ok);
    let mut setup = common::Setup::with(&[backend.addr]);
    setup.listener_keys = "server_timing = true\nh2c = true\n".into();
    let proxy = common::Proxy::start(&setup);
    let proxied: Target = format!("proxied=http://{}/", proxy.addr).parse().unwrap();
    // HTTP/1.1 beside the backend itself, which says nothing of pinlb; h2c through pinlb alone
    // (the backend speaks HTTP/1.1 only).
    for (http2, targets) in [
        (None, vec![backend.target("direct"), proxied.clone()]),
        (Some(2), vec![proxied.clone()]),
    ] {
        let report = bench(&BenchOptions {
            http2,
            ..options(targets)
        });
        let through = report.targets.last().unwrap();
        if http2.is_none() {
            let direct = &report.targets[0].pinlb_time;
            assert!(direct.is_none(), "{direct:?}");
        }
        let own = through
            .pinlb_time
            .as_ref()
            .unwrap_or_else(|| panic!("http2 {http2:?}: no Server-Timing read"));
        // pinlb's own share is a part of what the client waited for.
        assert!(
            own.p50_us > 0.0 && own.p50_us <= through.latency.p50_us,
            "http2 {http2:?}: own {own:?}, latency {:?}",
            through.latency
        );
    }
    let core = first_core().to_string();
    let ran = pinlb_bench(
        [
            format!("direct=http://{}/", backend.addr),
            format!("proxied=http://{}/", proxy.addr),
        ]
        .iter()
        .map(String::as_str)
        .chain(["-c", "2", "-d", "200ms", "--warmup", "0s", "--rounds", "1"])
        .chain(["--cpus", &core, "--no-checks"]),
    )
    .succeeded();
    assert!(
        ran.stdout.contains("pinlb's own time per request"),
        "{}",
        ran.stdout
    );
    let row = |name: &str| {
        let after = ran.stdout.split("pinlb's own time per request").nth(1)?;
        after
            .lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .map(str::to_string)
    };
    assert_eq!(
        row("direct").as_deref(),
        Some("| direct | – | – | – | – | – |"),
        "{}",
        ran.stdout
    );
    let proxied_row = row("proxied").unwrap_or_default();
    assert!(
        proxied_row.ends_with('%') || proxied_row.ends_with("% |"),
        "a share of the latency: {proxied_row:?}\n{}",
        ran.stdout
    );
}
