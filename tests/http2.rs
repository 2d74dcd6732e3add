//! HTTP/2 to clients, end to end: h2c with prior knowledge and TLS with ALPN h2, driven by curl,
//! nghttp, hyper's HTTP/2 client and frames written by hand, to HTTP/1.1 backends on loopback.
//!
//! What is checked is pinlb's part: each stream translated to the HTTP/1.1 request it stands
//! for and back, the same request path as HTTP/1.1 (picks, retries, limits, errors, the access
//! log, in-flight counts), idle and stop handling, and that each attack ends in a GOAWAY or
//! RST_STREAM, a counted metric and bounded memory. HTTP/2 itself is hyper's and h2's, which
//! h2spec checks upstream.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::h2frames::*;
use common::*;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::client::conn::http2::SendRequest;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `setup` with an h2c listener and the admin listener.
fn h2c(mut setup: Setup) -> Setup {
    setup.listener_keys += "h2c = true\n";
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
    setup
}

/// `setup` with a TLS listener for `cert` (and `listener_keys` before its table), and the admin
/// listener.
fn tls(mut setup: Setup, cert: &Cert, listener_keys: &str) -> Setup {
    setup.listener_keys += listener_keys;
    setup.tls = Some(format!("cert = {:?}\nkey = {:?}\n", cert.cert, cert.key));
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
    setup
}

fn req(method: Method, path: &str, body: ClientBody) -> Request<ClientBody> {
    Request::builder()
        .method(method)
        .uri(format!("http://a.test{path}"))
        .body(body)
        .unwrap()
}

/// A response read whole over HTTP/2.
async fn fetch(send: &mut SendRequest<ClientBody>, r: Request<ClientBody>) -> Reply {
    let resp = tokio::time::timeout(WAIT, send.send_request(r))
        .await
        .expect("a response in time")
        .expect("a response");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    tokio::time::timeout(WAIT, Reply::read(resp))
        .await
        .expect("the body in time")
}

/// What curl said: `%{http_version}`, the status, the headers and the body.
#[derive(Debug)]
struct Curl {
    version: String,
    status: u16,
    headers: String,
    body: Vec<u8>,
}

static SCRATCH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn scratch(name: &str) -> PathBuf {
    let n = SCRATCH.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pinlb-h2-{}-{n}-{name}", std::process::id()))
}

/// Runs `cmd` on a blocking thread (the backends run on this runtime) and returns its stdout;
/// it must succeed.
async fn run_tool(mut cmd: Command) -> String {
    let what = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run the tool"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs curl with `args`.
async fn curl(args: &[&str]) -> Curl {
    let (head, body) = (scratch("head"), scratch("body"));
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-D"])
        .arg(&head)
        .arg("-o")
        .arg(&body)
        .args(["-w", "%{http_version} %{http_code}"])
        .args(args);
    let stdout = run_tool(cmd).await;
    let (version, status) = stdout.split_once(' ').expect("curl's -w output");
    let c = Curl {
        version: version.to_string(),
        status: status.trim().parse().expect("a status"),
        headers: std::fs::read_to_string(&head).unwrap_or_default(),
        body: std::fs::read(&body).unwrap_or_default(),
    };
    let _ = (std::fs::remove_file(head), std::fs::remove_file(body));
    c
}

/// Runs nghttp with `args`; its stdout (the body, or with `-v` the frames too).
async fn nghttp(args: &[&str]) -> String {
    let mut cmd = Command::new("nghttp");
    cmd.args(["-t", "10"]).args(args);
    run_tool(cmd).await
}

fn errors(m: &Metrics, addr: SocketAddr) -> f64 {
    m.value(
        "pinlb_http2_protocol_errors_total",
        &format!("listener=\"{addr}\""),
    )
}

fn h2_connections(m: &Metrics, addr: SocketAddr) -> f64 {
    m.value(
        "pinlb_http2_connections_total",
        &format!("listener=\"{addr}\""),
    )
}

/// Waits (polls `/metrics`: pinlb's counters announce nothing) until `name{labels}` is `want`.
async fn wait_metric(proxy: &Proxy, name: &str, labels: &str, want: f64) {
    let got = poll(100, Duration::from_millis(50), async || {
        let v = proxy.metrics().await.get(name, labels);
        (v == Some(want)).then_some(())
    })
    .await;
    if got.is_none() {
        let now = proxy.metrics().await.get(name, labels);
        panic!("{name}{{{labels}}} never reached {want}: {now:?}");
    }
}

/// Reads until pinlb closes `raw` (at most `max` frames): it must have sent GOAWAY with `code`,
/// and counted the connection as the listener's `n`th protocol error.
async fn assert_goes_away(proxy: &Proxy, raw: &mut H2Conn, max: usize, code: u32, n: f64) {
    let (goaway, seen) = raw.until_closed(max).await;
    let (_, got) = goaway.unwrap_or_else(|| panic!("no GOAWAY: {:?}", seen.last()));
    assert_eq!(got, code, "{:?}", seen.last());
    let labels = format!("listener=\"{}\"", proxy.addr);
    wait_metric(proxy, "pinlb_http2_protocol_errors_total", &labels, n).await;
}

/// The listener still serves a new HTTP/2 connection.
async fn assert_still_serves(proxy: &Proxy) {
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.status, 200, "{r:?}");
}

fn in_flight_labels(backend: SocketAddr) -> String {
    format!("upstream=\"app\",backend=\"{backend}\"")
}

/// The reason an HTTP/2 client error carries, if it is a stream reset or GOAWAY.
fn h2_reason(e: &(dyn std::error::Error + 'static)) -> Option<h2::Reason> {
    let mut cur = Some(e);
    // Bounded by the chain of sources.
    while let Some(e) = cur {
        if let Some(h) = e.downcast_ref::<h2::Error>() {
            return h.reason();
        }
        cur = e.source();
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Translation
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reaches_an_http1_backend_as_the_request_it_stands_for() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let mut send = h2_client(proxy.addr).await;
    let r = Request::builder()
        .uri("http://a.test:8080/path?q=1")
        .header("cookie", "a=1")
        .header("x-one", "1")
        .header("cookie", "b=2")
        .header("te", "trailers")
        .body(empty())
        .unwrap();
    let reply = fetch(&mut send, r).await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(seen.uri, "/path?q=1");
    assert_eq!(seen.headers["host"], "a.test:8080");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    let cookies: Vec<_> = seen.headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2"], "one joined cookie line");
    assert_eq!(seen.headers["x-one"], "1");
    assert!(seen.headers.get("te").is_none(), "{:?}", seen.headers);

    // The backend's connection-specific fields stay behind; the rest arrive.
    let r = fetch(&mut send, req(Method::GET, "/hop", empty())).await;
    assert_eq!(r.status, 200);
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "transfer-encoding",
        "te",
    ] {
        assert!(r.headers.get(name).is_none(), "{name}: {:?}", r.headers);
    }
    assert_eq!(r.headers["x-backend-visible"], "yes");
    assert_eq!(r.headers["x-backend"], "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_with_its_root_dot_matches_the_host_route_without_it() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.listener_keys +=
        "[[listener.route]]\nhost = \"secret.example.test\"\nrespond = { status = 403 }\n";
    let proxy = Proxy::start(&setup);
    let mut send = h2_client(proxy.addr).await;
    for authority in ["secret.example.test.", "Secret.Example.Test.:80"] {
        let r = Request::builder()
            .uri(format!("http://{authority}/x"))
            .body(empty())
            .unwrap();
        let reply = fetch(&mut send, r).await;
        assert_eq!(
            reply.status,
            StatusCode::FORBIDDEN,
            ":authority {authority}"
        );
    }
    assert_eq!(a.hits(), 0, "no backend saw these");
    // What is proxied carries the authority as received.
    let r = Request::builder()
        .uri("http://other.example.test.:80/y")
        .body(empty())
        .unwrap();
    assert_eq!(fetch(&mut send, r).await.status, StatusCode::OK);
    assert_eq!(
        a.requests().pop().unwrap().headers["host"],
        "other.example.test.:80"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_up_and_down_arrive_exact_with_a_length_or_streamed_over_h2c_and_tls() {
    let pki = Pki::new();
    let cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let plain = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let secure = Proxy::start(&tls(Setup::with(&[a.addr]), &cert, ""));
    for (mut send, proto) in [
        (h2_client(plain.addr).await, "http"),
        (h2_tls_client(secure.addr, &pki).await, "https"),
    ] {
        bodies_on(&mut send, &a, proto).await;
    }
}

/// POSTs and GETs of 1 and 16 MiB on `send`, with a length and without.
async fn bodies_on(send: &mut SendRequest<ClientBody>, a: &Backend, proto: &str) {
    for (len, exact) in [
        (1u64 << 20, true),
        (1 << 20, false),
        (16 << 20, true),
        (16 << 20, false),
    ] {
        let body = GenBody::new(len, exact).boxed();
        let r = fetch(send, req(Method::POST, "/upload", body)).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.headers["x-body-bytes"], len.to_string());
        let seen = a.requests().pop().unwrap();
        assert_eq!(seen.body_len, len);
        assert_eq!(seen.headers["x-forwarded-proto"], proto);
        let pattern: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        assert_eq!(&seen.body_start[..4096], &pattern[..]);
        if exact {
            assert_eq!(seen.headers["content-length"], len.to_string());
        } else {
            assert_eq!(
                seen.headers["transfer-encoding"], "chunked",
                "{:?}",
                seen.headers
            );
            assert!(seen.headers.get("content-length").is_none());
        }

        let query = if exact { "" } else { "?chunked" };
        let resp = send
            .send_request(req(
                Method::GET,
                &format!("/download/{len}{query}"),
                empty(),
            ))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()
                .get("content-length")
                .map(|v| v.to_str().unwrap().to_string()),
            exact.then(|| len.to_string())
        );
        let got = tokio::time::timeout(WAIT, count_body(resp.into_body()))
            .await
            .unwrap();
        assert_eq!(got, len);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_are_exact_and_head_204_304_have_no_body() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/status/404", empty())).await;
    assert_eq!(
        (r.status.as_u16(), r.body.as_str()),
        (404, "status 404 from a\n")
    );
    let r = fetch(&mut send, req(Method::GET, "/status/418", empty())).await;
    assert_eq!(
        (r.status.as_u16(), r.body.as_str()),
        (418, "status 418 from a\n")
    );
    for (method, path, status) in [
        (Method::HEAD, "/", 200),
        (Method::GET, "/status/204", 204),
        (Method::GET, "/status/304", 304),
    ] {
        let r = fetch(&mut send, req(method.clone(), path, empty())).await;
        assert_eq!(r.status.as_u16(), status, "{method} {path}");
        assert_eq!(r.body, "", "{method} {path}");
    }
    // HEAD keeps the length of what GET would send.
    let r = fetch(&mut send, req(Method::HEAD, "/", empty())).await;
    assert_eq!(r.headers["content-length"], "13");
    // And the connection still serves.
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.body, "hello from a\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_nghttp_speak_h2c_and_h2_over_tls() {
    let pki = Pki::new();
    let cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let plain = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let secure = Proxy::start(&tls(Setup::with(&[a.addr]), &cert, ""));
    let url = format!("http://{}/c?x=1", plain.addr);
    let c = curl(&["--http2-prior-knowledge", "-H", "Cookie: k=v", &url]).await;
    assert_eq!((c.version.as_str(), c.status), ("2", 200), "{c:?}");
    assert_eq!(c.body, b"hello from a\n");
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["host"], plain.addr.to_string());
    assert_eq!(seen.headers["cookie"], "k=v");

    let resolve = format!("a.test:{}:127.0.0.1", secure.addr.port());
    let url = format!("https://a.test:{}/s", secure.addr.port());
    let ca = pki.ca_file();
    let ca = ca.to_str().unwrap();
    let c = curl(&["--http2", "--cacert", ca, "--resolve", &resolve, &url]).await;
    assert_eq!((c.version.as_str(), c.status), ("2", 200), "{c:?}");
    assert_eq!(c.body, b"hello from a\n");
    assert!(c.headers.starts_with("HTTP/2 200"), "{}", c.headers);
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    assert_eq!(
        seen.headers["host"],
        format!("a.test:{}", secure.addr.port())
    );

    // A POST with curl over TLS: the body arrives whole.
    let upload = scratch("upload");
    std::fs::write(&upload, vec![b'u'; 300_000]).unwrap();
    let data = format!("@{}", upload.display());
    let c = curl(&[
        "--http2",
        "--cacert",
        ca,
        "--resolve",
        &resolve,
        "--data-binary",
        &data,
        &url,
    ])
    .await;
    assert_eq!((c.version.as_str(), c.status), ("2", 200), "{c:?}");
    assert_eq!(a.requests().pop().unwrap().body_len, 300_000);

    // nghttp, prior knowledge and over TLS (it does not check certificates).
    let out = nghttp(&["-v", &format!("http://{}/n", plain.addr)]).await;
    assert!(out.contains(":status: 200"), "{out}");
    assert!(out.contains("hello from a"), "{out}");
    let out = nghttp(&["-v", &format!("https://127.0.0.1:{}/n", secure.addr.port())]).await;
    assert!(out.contains(":status: 200"), "{out}");
    assert!(out.contains("hello from a"), "{out}");
    let out = nghttp(&[
        "-d",
        upload.to_str().unwrap(),
        &format!("http://{}/n", plain.addr),
    ])
    .await;
    assert!(out.contains("hello from a"), "{out}");
    assert_eq!(a.requests().pop().unwrap().body_len, 300_000);
    let _ = std::fs::remove_file(upload);

    let m = plain.metrics().await;
    assert_eq!(h2_connections(&m, plain.addr), 3.0);
    assert_eq!(errors(&m, plain.addr), 0.0);
    let m = secure.metrics().await;
    assert_eq!(h2_connections(&m, secure.addr), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_still_works_beside_h2_and_http2_false_leaves_alpn_to_http1() {
    let pki = Pki::new();
    let cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let plain = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let offers = Proxy::start(&tls(Setup::with(&[a.addr]), &cert, ""));
    let refuses = Proxy::start(&tls(Setup::with(&[a.addr]), &cert, "http2 = false\n"));
    let ca = pki.ca_file();
    let ca = ca.to_str().unwrap();

    let c = curl(&["--http1.1", &format!("http://{}/", plain.addr)]).await;
    assert_eq!((c.version.as_str(), c.status), ("1.1", 200), "{c:?}");
    // Without prior knowledge curl asks to upgrade; pinlb stays with HTTP/1.1 (as nginx).
    let c = curl(&["--http2", &format!("http://{}/", plain.addr)]).await;
    assert_eq!((c.version.as_str(), c.status), ("1.1", 200), "{c:?}");

    for (proxy, flag, want) in [
        (&offers, "--http1.1", "1.1"),
        (&offers, "--http2", "2"),
        (&refuses, "--http2", "1.1"),
    ] {
        let port = proxy.addr.port();
        let resolve = format!("a.test:{port}:127.0.0.1");
        let url = format!("https://a.test:{port}/");
        let c = curl(&[flag, "--cacert", ca, "--resolve", &resolve, &url]).await;
        assert_eq!((c.version.as_str(), c.status), (want, 200), "{flag} {c:?}");
        assert_eq!(c.body, b"hello from a\n");
    }
    assert_eq!(h2_connections(&refuses.metrics().await, refuses.addr), 0.0);
    assert_eq!(h2_connections(&plain.metrics().await, plain.addr), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Many streams, one connection
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams_on_one_connection_are_all_answered_round_robin() {
    let (a, b, c) = (
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    );
    let mut setup = h2c(Setup::with(&[a.addr, b.addr, c.addr]));
    setup.extra += "[http2]\nmax_concurrent_streams = 150\n";
    // Strict turns: a learned limit (20 a backend at first) would queue the burst past it and
    // deal it among the backends with room, 49/51/50 say, as max_conns does.
    setup.upstream_keys = "adaptive = false".into();
    let proxy = Proxy::start(&setup);

    // The SETTINGS frame says what the config does; the default says 128.
    let other = Proxy::start(&h2c(Setup::with(&[a.addr])));
    for (addr, want) in [(proxy.addr, 150), (other.addr, 128)] {
        let raw = H2Conn::open(addr, &[]).await;
        let settings = &raw.server_settings;
        assert!(
            settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, want)),
            "{settings:?}"
        );
    }

    // 150 streams at once, each held 300 ms by the backend: all open together.
    let send = h2_client(proxy.addr).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..150 {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            fetch(
                &mut send,
                req(Method::GET, &format!("/sleep/300?i={i}"), empty()),
            )
            .await
        }));
    }
    let mut by = std::collections::BTreeMap::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        *by.entry(r.backend().to_string()).or_insert(0) += 1;
    }
    let took = started.elapsed();
    assert_eq!(
        by.values().copied().collect::<Vec<_>>(),
        [50, 50, 50],
        "{by:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "150 streams of 300 ms took {took:?}: not concurrent"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        h2_connections(&m, proxy.addr),
        2.0,
        "the probe and the client"
    );
    assert_eq!(
        m.value(
            "pinlb_listener_requests_total",
            &format!("listener=\"{}\"", proxy.addr)
        ),
        150.0
    );
    for be in [a.addr, b.addr, c.addr] {
        assert_eq!(
            m.value("pinlb_backend_in_flight", &in_flight_labels(be)),
            0.0
        );
    }
}

// ---------------------------------------------------------------------------------------------
// pinlb's own answers
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinlb_errors_are_answered_per_stream_and_the_connection_goes_on() {
    // 502: the only backend refuses.
    let refusing = Refusing::new();
    let mut setup = h2c(Setup::with(&[refusing.addr]));
    setup.extra += "[upstream.app.passive]\nmax_fails = 0\n";
    let proxy = Proxy::start(&setup);
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.starts_with("502 Bad Gateway"), "{}", r.body);
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.status, 502, "the connection goes on: {r:?}");

    // 503 (a lone backend at max_conns, its one slot held by another stream on the same
    // connection), 504 (timeouts.response), 431 (a header over limits.max_header_bytes).
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.upstream_keys = "max_conns = 1\nqueue = 0".into();
    setup.response_timeout = "500ms";
    setup.extra += "[limits]\nmax_header_bytes = \"4KiB\"\n";
    let proxy = Proxy::start(&setup);
    let mut send = h2_client(proxy.addr).await;
    let slow = {
        let mut send = send.clone();
        tokio::spawn(
            async move { fetch(&mut send, req(Method::GET, "/sleep/2000", empty())).await },
        )
    };
    a.wait_for_hits(1).await;
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(
        r.body,
        "503 Service Unavailable: no backend available among 1: 1 at max_conns\n"
    );
    let r = slow.await.unwrap();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(r.body.starts_with("504 Gateway Timeout"), "{}", r.body);

    let big = "x".repeat(5000);
    let r = Request::builder()
        .uri("http://a.test/")
        .header("x-big", big.as_str())
        .body(empty())
        .unwrap();
    let resp = tokio::time::timeout(WAIT, send.send_request(r))
        .await
        .unwrap();
    match resp {
        Ok(resp) => assert_eq!(resp.status(), 431),
        Err(e) => panic!("a stream over the header limit should get 431: {e:?}"),
    }
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(
        (r.status.as_u16(), r.body.as_str()),
        (200, "hello from a\n")
    );
    assert_eq!(
        a.hits(),
        2,
        "neither the 503 nor the 431 reached the backend"
    );
    assert_eq!(errors(&proxy.metrics().await, proxy.addr), 0.0);
}

/// A backend that answers `/cut` with a head promising 100000 bytes and 1000 of them, and
/// drops the connection once `cut` is notified; anything else gets a small 200.
async fn cutting_backend(cut: std::sync::Arc<tokio::sync::Notify>) -> SocketAddr {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let cut = cut.clone();
            tokio::spawn(async move {
                let mut s = tokio::io::BufReader::new(s);
                // Bounded by the connection: each pass reads a request head, or ends.
                loop {
                    let mut first = String::new();
                    let mut line = String::new();
                    if s.read_line(&mut first).await.unwrap_or(0) == 0 {
                        return;
                    }
                    while s.read_line(&mut line).await.unwrap_or(0) > 2 {
                        line.clear();
                    }
                    if first.starts_with("GET /cut") {
                        let mut r = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n".to_vec();
                        r.extend_from_slice(&[b'c'; 1000]);
                        let _ = s.get_mut().write_all(&r).await;
                        cut.notified().await;
                        return;
                    }
                    if s.get_mut().write_all(&raw_ok("raw", "fine")).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_dies_mid_body_resets_its_stream_and_the_others_go_on() {
    let cut = std::sync::Arc::new(tokio::sync::Notify::new());
    let backend = cutting_backend(cut.clone()).await;
    let proxy = Proxy::start(&h2c(Setup::with(&[backend])));
    let mut send = h2_client(proxy.addr).await;
    let resp = fetch_head(&mut send, "/cut").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], "100000");
    let mut body = resp.into_body();
    let mut got = 0;
    // Bounded: 1000 bytes come in at most 1000 frames.
    while got < 1000 {
        let f = tokio::time::timeout(WAIT, body.frame()).await.unwrap();
        got += f
            .expect("a frame")
            .expect("data")
            .into_data()
            .map_or(0, |d| d.len());
    }
    assert_eq!(got, 1000);
    // Another stream on the connection, while this one waits.
    let r = fetch(&mut send, req(Method::GET, "/during", empty())).await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "fine"));
    cut.notify_one();
    let e = tokio::time::timeout(WAIT, body.collect())
        .await
        .unwrap()
        .expect_err("the body is cut short");
    assert_eq!(h2_reason(&e), Some(h2::Reason::INTERNAL_ERROR), "{e:?}");
    let r = fetch(&mut send, req(Method::GET, "/after", empty())).await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "fine"));
    let m = proxy.metrics().await;
    assert_eq!(
        m.value("pinlb_backend_in_flight", &in_flight_labels(backend)),
        0.0
    );
    assert_eq!(
        errors(&m, proxy.addr),
        0.0,
        "a backend's failure is no client protocol error"
    );
}

async fn fetch_head(
    send: &mut SendRequest<ClientBody>,
    path: &str,
) -> http::Response<hyper::body::Incoming> {
    tokio::time::timeout(WAIT, send.send_request(req(Method::GET, path, empty())))
        .await
        .expect("a response in time")
        .expect("a response")
}

// ---------------------------------------------------------------------------------------------
// The same request path as HTTP/1.1
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_retried_on_the_next_backend_after_a_reset() {
    let resetter = RawServer::start(|_| RawAction::Reset).await;
    let good = Backend::start("good").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[resetter.addr, good.addr])));
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/order", empty())).await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!((resetter.requests(), good.hits()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failing_its_health_checks_gets_no_streams() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = h2c(Setup::with(&[a.addr, b.addr]));
    setup.extra += "[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"80ms\"\nfall = 1\nrise = 1\n";
    let proxy = Proxy::start(&setup);
    a.set_health(503);
    let from = a.probes();
    a.wait_for_probes(from + 2).await;
    let mut send = h2_client(proxy.addr).await;
    for _ in 0..6 {
        let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "b"));
    }
    assert_eq!(a.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_a_line_per_stream_with_protocol_http_2() {
    let a = Backend::start("a").await;
    let (setup, path) = with_combined_log(h2c(Setup::with(&[a.addr])));
    let proxy = Proxy::start(&setup);
    let mut send = h2_client(proxy.addr).await;
    for i in 0..3 {
        let r = fetch(&mut send, req(Method::GET, &format!("/item/{i}"), empty())).await;
        assert_eq!(r.status, 200);
    }
    drop(send);
    let lines = lines_after(proxy, &path).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (i, line) in lines.iter().enumerate() {
        assert!(
            line.contains(&format!("\"GET /item/{i} HTTP/2.0\" 200 13 ")),
            "{line}"
        );
        assert!(line.contains(&a.addr.to_string()), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_https_answer_is_logged_with_its_301_over_http_1_1_and_h2c() {
    // Over h2c the log entry was started and then dropped by the redirect (logged 499); over
    // HTTP/1.1 the redirect answered before the entry started (no line at all).
    let a = Backend::start("a").await;
    let (setup, path) = with_combined_log(h2c(Setup::with(&[a.addr])));
    let toml = setup
        .toml()
        .replacen("upstream = \"app\"\n", "redirect_https = true\n", 1);
    let proxy = Proxy::start_toml(&toml);
    let r = raw_request(
        proxy.addr,
        b"GET /one HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 301, "{r:?}");
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/two", empty())).await;
    assert_eq!(r.status, 301);
    drop(send);
    let lines = lines_after(proxy, &path).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, request) in lines.iter().zip(["GET /one HTTP/1.1", "GET /two HTTP/2.0"]) {
        assert!(line.contains(&format!("\"{request}\" 301 ")), "{line}");
    }
    assert_eq!(a.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_returns_to_zero_after_streams_end_and_after_a_client_reset() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let labels = in_flight_labels(a.addr);
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        proxy
            .metrics()
            .await
            .value("pinlb_backend_in_flight", &labels),
        0.0
    );

    // A large download the client gives up on mid-way: hyper resets the stream (CANCEL).
    let resp = fetch_head(&mut send, "/download/1073741824").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        proxy
            .metrics()
            .await
            .value("pinlb_backend_in_flight", &labels),
        1.0
    );
    let mut body = resp.into_body();
    let first = tokio::time::timeout(WAIT, body.frame()).await.unwrap();
    assert!(first.is_some_and(|f| f.is_ok()));
    drop(body);
    wait_metric(&proxy, "pinlb_backend_in_flight", &labels, 0.0).await;
    // The backend connection it held is not reused mid-body: closed, and the next stream works.
    a.wait_for_closed(1).await;
    let r = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(r.status, 200);

    // A stream reset while the backend still thinks.
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    raw.headers(1, &Hpack::request("GET", "/sleep/5000", "a.test"), true)
        .await;
    // Its request is the backend's fourth.
    a.wait_for_hits(4).await;
    assert_eq!(
        proxy
            .metrics()
            .await
            .value("pinlb_backend_in_flight", &labels),
        1.0
    );
    raw.send(&rst_frame(1, CANCEL)).await;
    wait_metric(&proxy, "pinlb_backend_in_flight", &labels, 0.0).await;
}

// ---------------------------------------------------------------------------------------------
// Idle connections and stopping
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_gets_goaway_but_one_with_an_open_stream_does_not() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.client_idle = "500ms";
    let proxy = Proxy::start(&setup);

    // One stream, then nothing: GOAWAY (no error) about client_idle later, then the close.
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    raw.get(1, "/").await;
    let done = Instant::now();
    let (goaway, seen) = raw.until_closed(20).await;
    let took = done.elapsed();
    let (last, code) = goaway.unwrap_or_else(|| panic!("no GOAWAY: {seen:?}"));
    assert_eq!((last, code), (1, NO_ERROR));
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "closed {took:?} after the last stream, with client_idle 500ms"
    );

    // A stream that takes longer than client_idle keeps its connection.
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    let (end, before) = raw.get(1, "/sleep/1500").await;
    assert!(
        before.iter().chain([&end]).all(|f| f.kind != GOAWAY),
        "GOAWAY while a stream was open: {before:?}"
    );
    assert!(before.iter().any(|f| f.kind == HEADERS && f.stream == 1));
    let (goaway, _) = raw.until_closed(20).await;
    assert_eq!(goaway, Some((1, NO_ERROR)));
}

/// How long pinlb waits, after a graceful close's GOAWAY, before it drops a connection with no
/// stream open that has not ended (`GRACEFUL_CLOSE` in proxy/src/downstream/h2.rs).
const GRACEFUL_CLOSE: Duration = Duration::from_secs(2);

/// The GOAWAYs of `frames`, as (last stream, error code).
fn goaways(frames: &[Frame]) -> Vec<(u32, u32)> {
    frames.iter().filter_map(Frame::goaway).collect()
}

/// Checks how a graceful close that the client never let end went: GOAWAY (last stream
/// 2^31−1, NO_ERROR) and a PING first, and last the final GOAWAY with the real last stream.
fn assert_graceful_then_final(frames: &[Frame], last: u32) {
    let gone = goaways(frames);
    assert_eq!(
        gone.first(),
        Some(&(0x7fff_ffff, NO_ERROR)),
        "the graceful GOAWAY first: {frames:?}"
    );
    assert_eq!(
        gone.last(),
        Some(&(last, NO_ERROR)),
        "the final GOAWAY last: {frames:?}"
    );
    assert!(
        frames.iter().any(|f| f.kind == PING && f.flags & ACK == 0),
        "{frames:?}"
    );
}

/// Opens an HTTP/2 connection that never opens a stream and never answers a PING: the preface,
/// an empty SETTINGS, the ACK of the server's (which `H2Conn::open` insists came first), then
/// only reads. Returns the frames read after the server's SETTINGS and when pinlb closed the
/// connection (`None` if not within `limit`).
async fn streamless(addr: SocketAddr, limit: Duration) -> (Vec<Frame>, Option<Instant>) {
    let mut raw = H2Conn::open(addr, &[]).await;
    let (frames, closed) = raw.read_to_close(limit).await;
    (frames, closed.then(Instant::now))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamless_connection_that_never_acks_the_ping_is_closed_after_the_grace() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.client_idle = "1s";
    let proxy = Proxy::start(&setup);
    let opened = Instant::now();
    let (frames, closed) = streamless(proxy.addr, WAIT).await;
    let took =
        closed.unwrap_or_else(|| panic!("still open after {WAIT:?}; read {frames:?}")) - opened;
    assert_graceful_then_final(&frames, 0);
    let idle = Duration::from_secs(1);
    assert!(
        took >= idle + GRACEFUL_CLOSE - Duration::from_millis(300)
            && took < idle + GRACEFUL_CLOSE + Duration::from_millis(1500),
        "closed {took:?} after it opened, with client_idle 1s and a grace of {GRACEFUL_CLOSE:?}"
    );
    assert_still_serves(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_close_never_acked_ends_in_a_goaway_with_the_last_stream_after_the_grace() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.client_idle = "500ms";
    let proxy = Proxy::start(&setup);
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    raw.get(3, "/").await;
    let done = Instant::now();
    // From here on the client reads and never answers the PING.
    let (frames, closed) = raw.read_to_close(WAIT).await;
    let took = done.elapsed();
    assert!(closed, "still open after {WAIT:?}; read {frames:?}");
    assert_graceful_then_final(&frames, 3);
    let idle = Duration::from_millis(500);
    assert!(
        took >= idle + GRACEFUL_CLOSE - Duration::from_millis(300)
            && took < idle + GRACEFUL_CLOSE + Duration::from_millis(1500),
        "closed {took:?} after its stream, with client_idle 500ms and a grace of {GRACEFUL_CLOSE:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamless_connections_over_max_connections_are_all_closed_and_a_new_client_is_served() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.client_idle = "1s";
    setup.extra += "[limits]\nmax_connections = 50\n";
    let proxy = Proxy::start(&setup);
    let opened = Instant::now();
    // Sixty at once: ten of them wait in the backlog until room is made. Each must get pinlb's
    // SETTINGS before anything else (`H2Conn::open` insists): room is made from connections
    // past their handshake, never from one just accepted.
    let clients: Vec<_> = (0..60)
        .map(|_| tokio::spawn(streamless(proxy.addr, WAIT)))
        .collect();
    let mut last = opened;
    for (i, c) in clients.into_iter().enumerate() {
        let (frames, closed) = c.await.expect("client task");
        let closed = closed
            .unwrap_or_else(|| panic!("client {i} still open after {WAIT:?}; read {frames:?}"));
        assert_graceful_then_final(&frames, 0);
        last = last.max(closed);
    }
    // Those closed to make room go at once; the last in wait client_idle (their first
    // stream's wait: header_timeout is longer), then the grace; a tick's slack and the
    // accepts' on top.
    let bound = Duration::from_secs(1) + GRACEFUL_CLOSE + Duration::from_millis(1500);
    assert!(
        last - opened < bound,
        "all closed {:?} after they opened",
        last - opened
    );
    let asked = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        raw_request(proxy.addr, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", false),
    )
    .await
    .expect("a new HTTP/1.1 client is answered within 1s");
    assert_eq!(r.status, 200, "{r:?}");
    let answered = asked.elapsed();
    assert!(answered < Duration::from_secs(1));
    eprintln!(
        "60 streamless connections all closed {:?} after they opened; a new HTTP/1.1 client answered in {answered:?}",
        last - opened
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_slow_to_send_its_preface_is_not_closed_to_make_room() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.client_idle = "5s";
    setup.extra += "[limits]\nmax_connections = 1\n";
    let proxy = Proxy::start(&setup);
    // One connection past its handshake holds the only place; a second client connects and
    // waits in the backlog, which makes pinlb close the first to make room.
    let mut first = H2Conn::open(proxy.addr, &[]).await;
    let slow = tokio::net::TcpStream::connect(proxy.addr)
        .await
        .expect("connect");
    let (frames, closed) = first.read_to_close(WAIT).await;
    assert!(closed, "the first is closed to make room; read {frames:?}");
    assert_graceful_then_final(&frames, 0);
    // The second is accepted in its place, and pinlb is at max_connections again, so it keeps
    // asking for room; its client is slow to send the preface (300 ms, well within the 1 s a
    // new connection is spared). It must get pinlb's SETTINGS all the same (`handshake`
    // insists they come first).
    let accepted = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut second = H2Conn::handshake(slow, &[]).await;
    assert!(
        accepted.elapsed() < Duration::from_secs(1),
        "the preface went {:?} after the first closed: past the 1 s a new connection is spared, \
         this run does not test what it means to",
        accepted.elapsed()
    );
    // Past its handshake it has had its chance: room is still wanted (the accept loop waits at
    // the limit), so it goes at once, with both GOAWAYs, well before client_idle (5 s).
    let (frames, closed) = second.read_to_close(Duration::from_secs(3)).await;
    assert!(
        closed,
        "still open 3 s after its handshake; read {frames:?}"
    );
    assert_graceful_then_final(&frames, 0);
    let r = tokio::time::timeout(
        Duration::from_secs(1),
        raw_request(proxy.addr, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", false),
    )
    .await
    .expect("a new HTTP/1.1 client is answered within 1s");
    assert_eq!(r.status, 200, "{r:?}");
}

/// Waits for a graceful GOAWAY (NO_ERROR) before any frame of stream 1, then for stream 1's
/// whole answer and the close; when the GOAWAY came.
async fn goaway_then_stream_1_completes(raw: &mut H2Conn) -> Instant {
    let (goaway, before) = raw.until(20, |f| f.kind == GOAWAY).await;
    let gone_away = Instant::now();
    assert_eq!(goaway.goaway().map(|g| g.1), Some(NO_ERROR));
    assert!(before.iter().all(|f| f.stream != 1), "{before:?}");
    let (end, between) = raw
        .until(20, |f| {
            f.stream == 1 && f.kind == DATA && f.flags & END_STREAM != 0
        })
        .await;
    assert!(
        between.iter().any(|f| f.kind == HEADERS && f.stream == 1),
        "{between:?}"
    );
    let body: Vec<u8> = between
        .iter()
        .chain([&end])
        .filter(|f| f.kind == DATA && f.stream == 1)
        .flat_map(|f| f.payload.clone())
        .collect();
    assert_eq!(body, b"hello from a\n");
    let (_, _) = raw.until_closed(20).await;
    gone_away
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sends_goaway_and_the_stream_in_flight_completes() {
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.shutdown_timeout = "5s";
    let mut proxy = Proxy::start(&setup);
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    raw.headers(1, &Hpack::request("GET", "/sleep/1000", "a.test"), true)
        .await;
    a.wait_for_hits(1).await;
    let stopped = Instant::now();
    proxy.trigger_shutdown();
    let gone_away = goaway_then_stream_1_completes(&mut raw).await;
    assert!(
        gone_away - stopped < Duration::from_millis(500),
        "GOAWAY came {:?} after the stop",
        gone_away - stopped
    );
    proxy.join(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_sends_goaway_and_the_stream_in_flight_completes() {
    let a = Backend::start("a").await;
    let toml = h2c(Setup::with(&[a.addr])).toml();
    let proxy = Proxy::start_file(&toml);
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    raw.headers(1, &Hpack::request("GET", "/sleep/500", "a.test"), true)
        .await;
    a.wait_for_hits(1).await;
    // The same file again, with one key changed, so that a generation is applied.
    let changed = toml.replace("shutdown_timeout = \"3s\"", "shutdown_timeout = \"7s\"");
    assert_ne!(changed, toml);
    proxy.rewrite(&changed);
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    goaway_then_stream_1_completes(&mut raw).await;
    // A new connection is served by the new generation.
    let mut send = h2_client(proxy.addr).await;
    let reply = fetch(&mut send, req(Method::GET, "/", empty())).await;
    assert_eq!(reply.status, 200);
}

// ---------------------------------------------------------------------------------------------
// Defences
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_ends_in_goaway_enhance_your_calm_and_is_counted() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    let block = Hpack::request("GET", "/sleep/1000", "a.test");
    let mut burst = Vec::new();
    for i in 0..5000u32 {
        let id = 2 * i + 1;
        burst.extend(frame(HEADERS, END_HEADERS | END_STREAM, id, &block.0));
        burst.extend(rst_frame(id, CANCEL));
    }
    raw.try_send(&burst).await;
    assert_goes_away(&proxy, &mut raw, 10_000, ENHANCE_YOUR_CALM, 1.0).await;
    // h2 counts streams reset before they were accepted, and goes away after 20 of them.
    assert!(
        a.hits() <= 20,
        "{} of 5000 reset streams reached the backend",
        a.hits()
    );
    assert_still_serves(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_ends_in_goaway_and_is_counted() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    let block = Hpack::request("GET", "/", "a.test");
    let mut flood = frame(HEADERS, END_STREAM, 1, &block.0);
    let field = Hpack::default().literal(b"x-f", b"1");
    for _ in 0..20_000 {
        flood.extend(frame(CONTINUATION, 0, 1, &field.0));
    }
    raw.try_send(&flood).await;
    assert_goes_away(&proxy, &mut raw, 100, ENHANCE_YOUR_CALM, 1.0).await;
    assert_eq!(a.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpack_header_bomb_is_refused_and_counted() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    // One 4000-byte field in the dynamic table, then referenced 5000 times: 20 MB decoded
    // from a 9 KB block.
    let mut block = Hpack::request("GET", "/", "a.test").literal_indexed(b"x-bomb", &[b'b'; 4000]);
    for _ in 0..5000 {
        block = block.indexed(62);
    }
    let mut out = frame(HEADERS, END_STREAM, 1, &block.0[..8000]);
    out.extend(frame(CONTINUATION, END_HEADERS, 1, &block.0[8000..]));
    raw.try_send(&out).await;
    assert_goes_away(&proxy, &mut raw, 100, ENHANCE_YOUR_CALM, 1.0).await;
    assert_eq!(a.hits(), 0);
}

/// Sends `n` copies of `one` at once and reads what comes back until the connection ends:
/// the GOAWAY and how many ACKs came before it.
async fn flood(proxy: &Proxy, one: Vec<u8>, n: usize, kind: u8) -> (Option<(u32, u32)>, usize) {
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    let flood: Vec<u8> = one.iter().copied().cycle().take(one.len() * n).collect();
    // pinlb may close before it has read it all.
    raw.try_send(&flood).await;
    let (goaway, seen) = raw.until_closed(n + 10).await;
    let acks = seen
        .iter()
        .filter(|f| f.kind == kind && f.flags & ACK != 0)
        .count();
    (goaway, acks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_and_ping_floods_end_in_goaway_and_are_counted() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    let labels = format!("listener=\"{}\"", proxy.addr);
    let settings = settings_frame(&[(SETTINGS_INITIAL_WINDOW_SIZE, 65_535)]);
    let (goaway, acks) = flood(&proxy, settings, 10_000, SETTINGS).await;
    assert_eq!(goaway.map(|g| g.1), Some(PROTOCOL_ERROR));
    // The connection's first SETTINGS and 99 of the flood were answered, no more.
    assert_eq!(acks, 100);
    wait_metric(&proxy, "pinlb_http2_protocol_errors_total", &labels, 1.0).await;

    let (goaway, acks) = flood(&proxy, frame(PING, 0, 0, &[7; 8]), 10_000, PING).await;
    assert_eq!(goaway.map(|g| g.1), Some(PROTOCOL_ERROR));
    assert!(acks <= 100, "{acks} PINGs answered");
    wait_metric(&proxy, "pinlb_http2_protocol_errors_total", &labels, 2.0).await;

    // A client that PINGs now and then is no flood.
    let mut raw = H2Conn::open(proxy.addr, &[]).await;
    for i in 0..20u8 {
        raw.send(&frame(PING, 0, 0, &[i; 8])).await;
        let (pong, _) = raw.until(10, |f| f.kind == PING).await;
        assert_eq!((pong.flags, pong.payload), (ACK, vec![i; 8]));
    }
    raw.headers(1, &Hpack::request("GET", "/", "a.test"), true)
        .await;
    raw.until(10, |f| f.stream == 1 && f.flags & END_STREAM != 0)
        .await;
    assert_eq!(errors(&proxy.metrics().await, proxy.addr), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_stalls_its_streams_without_growing_memory() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.listener_keys = "h2c = true\n".into();
    let proxy = BinProxy::spawn(&setup).await;
    // A reading client first, so the worker's allocations for a large response are made.
    let mut send = h2_client(proxy.addr).await;
    let resp = fetch_head(&mut send, "/download/33554432").await;
    assert_eq!(count_body(resp.into_body()).await, 32 << 20);
    drop(send);
    let before = proxy.vm_rss_kib();

    // Eight clients with a 16-byte stream window, each asking for 1 GiB and reading nothing.
    const N: usize = 8;
    let mut stalled = Vec::new();
    for _ in 0..N {
        stalled.push(stalled_download(proxy.addr).await);
    }
    a.wait_for_hits(1 + N).await;
    let produced = settle(&a.produced()).await - (32 << 20);
    let after = proxy.vm_rss_kib();
    let grew = after.saturating_sub(before);
    eprintln!(
        "{N} stalled 1 GiB responses: backend produced {} KiB, pinlb VmRSS {before} -> {after} KiB",
        produced / 1024
    );
    // What the backend could write is what the sockets between it and pinlb hold, and what
    // pinlb buffers per stream (64 KiB), nowhere near the 8 GiB asked for.
    assert!(
        produced < (N as u64) * (16 << 20),
        "backends produced {produced} bytes"
    );
    assert!(
        grew < 16 * 1024,
        "pinlb grew by {grew} KiB for {N} stalled streams"
    );
    drop(stalled);
}

/// A connection with a 16-byte stream window that asks for 1 GiB and opens it no further.
async fn stalled_download(addr: SocketAddr) -> H2Conn {
    let mut raw = H2Conn::open(addr, &[(SETTINGS_INITIAL_WINDOW_SIZE, 16)]).await;
    let block = Hpack::request("GET", "/download/1073741824", "a.test");
    raw.headers(1, &block, true).await;
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_opens_its_window_is_closed_after_client_idle() {
    // It reads everything (PINGs are answered, were they on) but sends no WINDOW_UPDATE.
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.client_idle = "1s";
    let proxy = Proxy::start(&setup);
    let labels = in_flight_labels(a.addr);
    let mut raw = stalled_download(proxy.addr).await;
    let (_, _) = raw.until(10, |f| f.kind == DATA && f.stream == 1).await;
    let stalled = Instant::now();
    let (_, seen) = raw.until_closed(100).await;
    let took = stalled.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed {took:?} after the window ran out, with client_idle 1s"
    );
    let data: usize = seen
        .iter()
        .filter(|f| f.kind == DATA)
        .map(|f| f.payload.len())
        .sum();
    assert_eq!(data, 0, "nothing past the 16-byte window");
    wait_metric(&proxy, "pinlb_backend_in_flight", &labels, 0.0).await;
    assert_still_serves(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pings_on_a_client_that_never_reads_is_closed_and_its_backend_let_go() {
    // The client that reads nothing answers no PING: closed after ping_timeout, well before
    // client_idle (30 s here) would.
    let a = Backend::start("a").await;
    let mut setup = h2c(Setup::with(&[a.addr]));
    setup.extra += "[http2]\nping_interval = \"300ms\"\nping_timeout = \"300ms\"\n";
    let proxy = Proxy::start(&setup);
    let labels = in_flight_labels(a.addr);
    let mut raw = stalled_download(proxy.addr).await;
    a.wait_for_hits(1).await;
    // Read nothing (reading would answer the PINGs) until the stream is let go.
    wait_metric(&proxy, "pinlb_backend_in_flight", &labels, 0.0).await;
    let (_, seen) = raw.until_closed(1_000).await;
    assert!(
        seen.iter().any(|f| f.kind == PING && f.flags & ACK == 0),
        "no PING: {seen:?}"
    );
}

/// The request path's timing and IDs reach HTTP/2 clients as they reach HTTP/1.1 ones
/// (tests/timing.rs has the rest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_get_server_timing_and_request_ids_too() {
    let a = Backend::start_with_delay("a", Duration::from_millis(5)).await;
    let mut setup = Setup::with(&[a.addr]);
    setup.listener_keys = "h2c = true\nserver_timing = true\n".into();
    setup.extra = "[request_id]\nenabled = true\n".into();
    let proxy = Proxy::start(&setup);
    let mut send = h2_client(proxy.addr).await;
    let r = fetch(&mut send, req(Method::GET, "/h2", empty())).await;
    assert_eq!(r.status, StatusCode::OK);
    let id = r.headers["x-request-id"].to_str().unwrap();
    assert_eq!(a.requests()[0].headers["x-request-id"], id);
    let st = r.headers["server-timing"].to_str().unwrap();
    let upstream: f64 = st
        .split(',')
        .find_map(|m| m.trim().strip_prefix("upstream;dur="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(upstream >= 5.0, "{st}");
}

/// Reads all a connection sends until the peer closes it (bounded by `WAIT`).
async fn all_until_closed(conn: &mut RawConn) -> Vec<u8> {
    tokio::time::timeout(WAIT, conn.read_until(|_| false))
        .await
        .expect("the connection was never closed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_preface_on_an_h2c_listener_gets_a_goaway_with_protocol_error() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&h2c(Setup::with(&[a.addr])));
    // SETTINGS (empty), then GOAWAY: last stream 0, PROTOCOL_ERROR (RFC 9113 §3.4, §6.8).
    let refused: &[u8] = &[
        0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    ];
    // h2spec's http2/3.5/2, and the HTTP/2 preface with a wrong second part.
    for first in [
        &b"INVALID CONNECTION PREFACE\r\n\r\n"[..],
        &b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"[..],
    ] {
        let mut conn = RawConn::open(proxy.addr).await;
        conn.send(first).await;
        assert_eq!(
            all_until_closed(&mut conn).await,
            refused,
            "{:?}",
            String::from_utf8_lossy(first)
        );
    }
    // A broken HTTP/1.x request on the same listener is still answered as HTTP/1.1.
    let text = raw_request_text(proxy.addr, b"GET / HTTP/1.1\r\nHost a.test\r\n\r\n", 12).await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert_eq!(a.hits(), 0);
    // And a listener without h2c answers the invalid preface as HTTP/1.1 too.
    let plain = Proxy::start(&Setup::with(&[a.addr]));
    let text = raw_request_text(plain.addr, b"INVALID CONNECTION PREFACE\r\n\r\n", 12).await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
}
