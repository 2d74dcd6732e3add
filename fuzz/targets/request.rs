//! Arbitrary bytes as one client connection through the real request path: a `pinlb::Server`
//! bound on `127.0.0.1:0` in this process, in front of a backend that checks everything it
//! reads (`tests/common/framing.rs`, shared with `tests/prop.rs`).
//!
//! Asserted for every input: pinlb does not panic (a worker panic ends the process); every
//! request the backend receives is one canonical HTTP/1.1 request with unambiguous framing;
//! pinlb forwards no more requests than the input holds request lines; and the client gets
//! well-formed responses, then the close, within a few seconds.
//!
//! The body of the `request` fuzz target (`fuzz/fuzz_targets/request.rs`), also replayed over
//! `fuzz/seeds/request/` and `fuzz/regressions/request/` by `tests/fuzz_replay.rs`.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[path = "../../tests/common/framing.rs"]
mod framing;

use framing::FramingBackend;

/// How long pinlb may take to answer and close one connection. Its own timeouts below are all
/// shorter, so running past this is a hang, not a slow answer.
const LIMIT: Duration = Duration::from_secs(5);

struct Harness {
    rt: tokio::runtime::Runtime,
    backend: FramingBackend,
    proxy: SocketAddr,
    /// Inputs run so far: each connects from its own loopback address (`framing::client_ip`).
    runs: AtomicU64,
}

/// Started once per fuzzing process: the backend on a one-thread runtime of its own (so it
/// keeps reading between inputs), pinlb on a thread of its own, running until the process ends.
fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("backend runtime");
        let backend = rt.block_on(FramingBackend::start()).expect("start backend");
        let cpus = pinlb::sys::cpus::allowed_cpus().expect("allowed cores");
        let toml = format!(
            r#"[runtime]
cpus = [{core}]
shutdown_timeout = "1s"

[limits]
max_header_bytes = "1KiB"
max_headers = 20
max_uri_bytes = "512"
max_body = "1KiB"
header_timeout = "500ms"

[[listener]]
address = "127.0.0.1:0"
upstream = "app"

[upstream.app]
backends = [{{ address = "{backend}" }}]

[upstream.app.timeouts]
connect = "1s"
response = "1s"
client_idle = "1s"
"#,
            core = cpus[0],
            backend = backend.addr,
        );
        let config = pinlb::Config::parse("fuzz.toml", &toml, &cpus).expect("harness config");
        let server = pinlb::Server::bind(config).expect("bind pinlb");
        let proxy = server.local_addrs()[0];
        std::thread::spawn(move || server.run(std::future::pending::<()>()));
        Harness {
            rt,
            backend,
            proxy,
            runs: AtomicU64::new(0),
        }
    })
}

/// Panics when `data` breaks the target's invariant.
pub fn check(data: &[u8]) {
    let h = harness();
    let n = h.runs.fetch_add(1, Ordering::Relaxed);
    let from = framing::client_ip(n);
    let key = from.to_string();
    let count = || h.backend.tally().by_client.get(&key).copied().unwrap_or(0);
    let before = count();
    // The first byte picks where the stream is split into two writes.
    let (split, bytes) = match data.split_first() {
        Some((s, rest)) => (usize::from(*s) * rest.len() / 255, rest),
        None => (0, data),
    };
    let got =
        h.rt.block_on(framing::exchange(from, h.proxy, bytes, split, LIMIT))
            .unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = framing::check_responses(&got) {
        panic!("malformed answer to the client: {e}");
    }
    assert!(
        h.rt.block_on(h.backend.settled(LIMIT)),
        "a backend connection kept a partial request"
    );
    let tally = h.backend.tally();
    assert!(
        tally.violations.is_empty(),
        "the backend got a non-canonical request: {:?}",
        tally.violations
    );
    let forwarded = count() - before;
    let bound = framing::request_lines_at_most(bytes);
    assert!(
        forwarded <= bound,
        "{forwarded} requests forwarded from at most {bound} request lines"
    );
}
