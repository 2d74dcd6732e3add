//! Malformed and adversarial requests, sent byte for byte through pinlb to a backend that
//! records exactly what it received.
//!
//! Each case says what the client must get back (one status per response, in order) and what
//! the backend must have seen: nothing, or one well-formed request per expected body, with
//! unambiguous framing. A case whose answer is an error, or whose framing was ambiguous, must
//! also see pinlb close the connection, so that nothing the client sent after it is read as
//! another request. Adding a case is one line in [`cases`].

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The corpus proxy's limits: small enough that the oversized cases stay small.
const LIMITS: &str = r#"[limits]
max_header_bytes = "4KiB"
max_headers = 20
max_uri_bytes = "1KiB"
max_body = "1KiB"
header_timeout = "300ms"
body_timeout = "300ms"
"#;
const HEADER_TIMEOUT: Duration = Duration::from_millis(300);
const BODY_TIMEOUT: Duration = Duration::from_millis(300);

struct Case {
    name: &'static str,
    send: Vec<u8>,
    /// The status of each response the client must get, in order.
    statuses: &'static [u16],
    /// The body of each request the backend must see, in order; empty: it sees none.
    backend: &'static [&'static [u8]],
    /// pinlb must close the connection after the last response.
    closes: bool,
}

fn case(
    name: &'static str,
    send: impl AsRef<[u8]>,
    statuses: &'static [u16],
    backend: &'static [&'static [u8]],
    closes: bool,
) -> Case {
    Case {
        name,
        send: send.as_ref().to_vec(),
        statuses,
        backend,
        closes,
    }
}

/// The backend sees nothing.
const NONE: &[&[u8]] = &[];
/// The backend sees one request without a body.
const ONE: &[&[u8]] = &[b""];
const HELLO: &[&[u8]] = &[b"hello"];

// One line per case, however long: the table reads as a table.
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(5000)
    );
    let many_headers = format!(
        "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
        (0..21).map(|i| format!("X-{i}: 1\r\n")).collect::<String>()
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "u".repeat(1100));
    let uri_at_limit = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "u".repeat(1023));
    let body_over_cl = format!(
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1025\r\n\r\n{}",
        "b".repeat(1025)
    );
    let body_at_limit = format!(
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1024\r\n\r\n{}",
        "b".repeat(1024)
    );
    let body_over_chunked = format!(
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
        format!("200\r\n{}\r\n", "c".repeat(512)).repeat(3)
    );
    vec![
        // Well-formed requests pass, re-framed canonically.
        case("plain GET", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", &[200], ONE, false),
        case("Content-Length body", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", &[200], HELLO, false),
        case("chunked body", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[200], HELLO, false),
        case("chunk extension", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n0\r\n\r\n", &[200], HELLO, false),
        case("chunked trailers are dropped", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", &[200], HELLO, false),
        case("HTTP/1.0 without Host", "GET / HTTP/1.0\r\n\r\n", &[200], ONE, true),
        case("absolute-form target", "GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n", &[200], ONE, false),
        case("TE coding is case-insensitive", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[200], HELLO, false),
        case("TE value with tab and trailing space", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked \r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[200], HELLO, false),
        case("bare LF line endings", "GET / HTTP/1.1\nHost: a\n\n", &[200], ONE, false),
        case("identical duplicate Content-Length is merged", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", &[200], HELLO, false),
        // CL.TE and TE.CL: chunked wins, Content-Length is dropped, and the connection closes
        // so the leftover bytes are never read as a request.
        case("CL.TE", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG", &[200], ONE, true),
        case("TE.CL", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", &[200], &[b"SMUGGLED"], true),
        case("CL.TE smuggled request", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n", &[200], ONE, true),
        // TE.TE obfuscations.
        case("TE xchunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE chunked, chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE chunked twice on two lines", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE gzip, chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE chunked then identity", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE quoted chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE space before colon", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE with vertical tab", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE folded onto the next line", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE on HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("TE empty", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n", &[400], NONE, true),
        // Content-Length tricks.
        case("conflicting Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", &[400], NONE, true),
        case("Content-Length list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello", &[400], NONE, true),
        case("negative Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\nhello", &[400], NONE, true),
        case("Content-Length with plus sign", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", &[400], NONE, true),
        case("hex Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello", &[400], NONE, true),
        case("Content-Length overflow", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\nhello", &[400], NONE, true),
        // Line endings, folding and bytes that have no place in a head.
        case("bare CR line ending", "GET / HTTP/1.1\rHost: a\r\n\r\n", &[400], NONE, true),
        case("obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n b\r\n\r\n", &[400], NONE, true),
        case("obs-fold with tab", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n\tb\r\n\r\n", &[400], NONE, true),
        case("bare CR inside a header value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", &[400], NONE, true),
        case("NUL in a header value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\0b\r\n\r\n", &[400], NONE, true),
        case("NUL in a header name", "GET / HTTP/1.1\r\nHost: a\r\nX\0A: a\r\n\r\n", &[400], NONE, true),
        case("NUL in the target", "GET /a\0b HTTP/1.1\r\nHost: a\r\n\r\n", &[400], NONE, true),
        case("NUL in the method", "G\0T / HTTP/1.1\r\nHost: a\r\n\r\n", &[400], NONE, true),
        case("space before colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", &[400], NONE, true),
        case("bad header name character", "GET / HTTP/1.1\r\nHost: a\r\nX(A): 1\r\n\r\n", &[400], NONE, true),
        case("double space in request line", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", &[400], NONE, true),
        case("unknown HTTP version", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", &[400], NONE, true),
        // Chunk sizes.
        case("chunk size overflow", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("negative chunk size", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("empty chunk size", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("hex-prefixed chunk size", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        case("chunk longer than its size", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", &[400], NONE, true),
        // Host.
        case("HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", &[400], NONE, true),
        case("duplicate Host", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &[400], NONE, true),
        case("empty Host", "GET / HTTP/1.1\r\nHost: \r\n\r\n", &[400], NONE, true),
        case("Host with a space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", &[400], NONE, true),
        case("Host with userinfo", "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", &[400], NONE, true),
        // Asterisk-form is for OPTIONS only; hyper lets `GET *` through (found by tests/prop.rs).
        case("OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", &[200], ONE, false),
        case("GET *", "GET * HTTP/1.1\r\nHost: a\r\n\r\n", &[400], NONE, true),
        case("POST * with a body", "POST * HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello", &[400], NONE, true),
        // Sizes.
        case("head over max_header_bytes", big_header, &[431], NONE, true),
        case("more than max_headers", many_headers, &[431], NONE, true),
        case("target over max_uri_bytes", long_uri, &[414], NONE, true),
        case("target at max_uri_bytes", uri_at_limit, &[200], ONE, false),
        case("Content-Length over max_body", body_over_cl, &[413], NONE, true),
        case("body at max_body", body_at_limit, &[200], &[&[b'b'; 1024]], false),
        case("chunked body growing over max_body", body_over_chunked, &[413], NONE, true),
        // Pipelining.
        case("two pipelined requests", "GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n", &[200, 200], &[b"", b""], false),
        case("pipelined bad request after a good one", "GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\n\r\n", &[200, 400], ONE, true),
        case("pipelined garbage after a good one", "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n\0\0\0\r\n\r\n", &[200, 400], ONE, true),
        // A head that stops coming.
        case("unfinished head", "GET / HTTP/1.1\r\nHost: a\r\n", &[408], NONE, true),
    ]
}

/// Checks that a request as the backend read it is one well-formed HTTP/1.1 message with
/// unambiguous framing and the expected body.
fn check_canonical(seen: &RawSeen, body: &[u8]) -> Result<(), String> {
    let head = &seen.head;
    let lines: Vec<&str> = head.split_inclusive('\n').collect();
    if lines.iter().any(|l| !l.ends_with("\r\n")) {
        return Err(format!("a line without CRLF in {head:?}"));
    }
    if head.contains('\0') || lines[1..].iter().any(|l| l.starts_with([' ', '\t'])) {
        return Err(format!("NUL or a folded line in {head:?}"));
    }
    if !lines[0].ends_with(" HTTP/1.1\r\n") || lines[0].matches(' ').count() != 2 {
        return Err(format!("request line {:?}", lines[0]));
    }
    let values = |name: &str| -> Vec<String> {
        lines[1..]
            .iter()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    };
    if values("host").len() != 1 {
        return Err(format!("not exactly one Host in {head:?}"));
    }
    let cl = values("content-length");
    let te = values("transfer-encoding");
    match (cl.as_slice(), te.as_slice()) {
        ([], []) if body.is_empty() => {}
        ([n], []) if n.parse() == Ok(body.len()) => {}
        ([], [c]) if c == "chunked" => {}
        _ => return Err(format!("framing CL {cl:?} TE {te:?} in {head:?}")),
    }
    if seen.body != body {
        return Err(format!(
            "body {:?}, expected {:?}",
            String::from_utf8_lossy(&seen.body),
            String::from_utf8_lossy(body)
        ));
    }
    Ok(())
}

/// Runs one case against a fresh backend and proxy; `Err` says what went wrong.
async fn run(case: &Case) -> Result<(), String> {
    let backend = RawServer::start(|_| RawAction::Respond(raw_ok("b", "ok"))).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = LIMITS.to_string();
    let proxy = Proxy::start(&setup);

    let mut s = RawConn::open(proxy.addr).await;
    s.send(&case.send).await;
    let mut got = Vec::new();
    for _ in case.statuses {
        got.push(read_response(&mut s, false).await.status);
    }
    if got != case.statuses {
        return Err(format!("statuses {got:?}, expected {:?}", case.statuses));
    }
    if case.closes {
        // The end of the stream, or a reset when pinlb left unread bytes behind.
        let mut rest = Vec::new();
        match tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await {
            Err(_) => return Err("the connection stayed open".into()),
            Ok(Ok(_)) if !rest.is_empty() => {
                return Err(format!(
                    "more bytes after the last response: {:?}",
                    String::from_utf8_lossy(&rest)
                ));
            }
            Ok(_) => {}
        }
    }
    // Every response is in, so every request pinlb forwarded has been read by the backend:
    // pinlb sends a request whole before it reads the response.
    let seen = backend.seen();
    if seen.len() != case.backend.len() {
        return Err(format!(
            "backend saw {} requests, expected {}: {:?}",
            seen.len(),
            case.backend.len(),
            seen.iter().map(|r| &r.head).collect::<Vec<_>>()
        ));
    }
    for (r, body) in seen.iter().zip(case.backend) {
        check_canonical(r, body)?;
    }
    Ok(())
}

#[tokio::test]
async fn every_corpus_request_gets_its_status_and_the_backend_sees_nothing_or_one_clean_request() {
    let cases = cases();
    assert!(cases.len() >= 40, "the corpus shrank to {}", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        if let Err(e) = run(c).await {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Slowloris: a head trickled a byte at a time keeps bytes moving (so the idle check never
/// fires) but never completes; it gets 408 at the header timeout and the connection closes.
#[tokio::test]
async fn a_trickled_head_gets_408_at_the_header_timeout() {
    let backend = RawServer::start(|_| RawAction::Respond(raw_ok("b", "ok"))).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = LIMITS.to_string();
    let proxy = Proxy::start(&setup);

    let (mut r, mut write) = RawConn::open(proxy.addr).await.into_split();
    let start = Instant::now();
    let trickle = tokio::spawn(async move {
        write.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n").await?;
        // Far longer than the timeout if nothing stops it; pinlb closing ends it sooner. Real
        // sleeps: the trickle's pace against pinlb's header timer, on pinlb's own runtime, is
        // what the test is about.
        for _ in 0..400 {
            tokio::time::sleep(Duration::from_millis(25)).await;
            write.write_all(b"X-Slow: 1\r\n").await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let resp = read_response(&mut r, false).await;
    let took = start.elapsed();
    assert_eq!(resp.status, 408, "{resp:?}");
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(
        took >= HEADER_TIMEOUT && took < HEADER_TIMEOUT * 3,
        "408 after {took:?}, header_timeout is {HEADER_TIMEOUT:?}"
    );
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, r.read_to_end(&mut rest))
        .await
        .expect("pinlb closes after the 408");
    assert!(rest.is_empty(), "{rest:?}");
    trickle.abort();
    assert_eq!(backend.requests(), 0);
}

/// A body that stops arriving gets 408 once `body_timeout` passes without a byte, and the
/// backend, which already has the head and part of the body, never sees the request complete.
/// A body that keeps coming, however slowly, is not cut off.
#[tokio::test]
async fn a_stalled_body_gets_408_at_the_body_timeout_but_a_slow_steady_one_goes_through() {
    let backend = RawServer::start(|_| RawAction::Respond(raw_ok("b", "ok"))).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = LIMITS.to_string();
    let proxy = Proxy::start(&setup);

    // Steady: 10 bytes, one every 100 ms (a third of the timeout), 1 s in all. Real sleeps: the
    // pace against pinlb's body timer, on pinlb's own runtime, is what the test is about.
    let mut steady = RawConn::open(proxy.addr).await;
    steady
        .send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
        .await;
    for _ in 0..10 {
        tokio::time::sleep(BODY_TIMEOUT / 3).await;
        steady.send(b"x").await;
    }
    let resp = read_response(&mut steady, false).await;
    assert_eq!(resp.status, 200, "{resp:?}");
    backend.wait_for_requests(1).await;
    assert_eq!(backend.seen()[0].body, b"xxxxxxxxxx");

    // Stalled: half the body, then nothing.
    let mut r = RawConn::open(proxy.addr).await;
    let start = Instant::now();
    r.send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nxxxxx")
        .await;
    let resp = read_response(&mut r, false).await;
    let took = start.elapsed();
    assert_eq!(resp.status, 408, "{resp:?}");
    assert!(
        String::from_utf8_lossy(&resp.body).contains("limits.body_timeout"),
        "{resp:?}"
    );
    assert!(
        took >= BODY_TIMEOUT && took < BODY_TIMEOUT * 4,
        "408 after {took:?}, body_timeout is {BODY_TIMEOUT:?}"
    );
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, r.read_to_end(&mut rest))
        .await
        .expect("pinlb closes after the 408");
    assert!(rest.is_empty(), "{rest:?}");
    drop(r);
    // The steady request is the only complete one the backend ever saw.
    assert_eq!(backend.requests(), 1);
}

/// Each refusal leaves a warn line that names the cause, whether pinlb or hyper's parser
/// answered (hyper logs nothing of its own at warn).
#[tokio::test]
async fn each_refusal_is_logged_at_warn_with_its_cause() {
    let backend = RawServer::start(|_| RawAction::Respond(raw_ok("b", "ok"))).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = LIMITS.to_string();
    let mut proxy = BinProxy::spawn(&setup).await;
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "a".repeat(5000)
    );
    let refusals: [(&[u8], u16, &str); 5] = [
        (
            b"GET / HTTP/1.1\r\n\r\n",
            400,
            "answered 400: HTTP/1.1 request without a Host header",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n",
            400,
            "answered 400: malformed request",
        ),
        (
            big_header.as_bytes(),
            431,
            "answered 431: request head over limits.max_header_bytes",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n",
            413,
            "answered 413: request body over limits.max_body (1024 bytes)",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\n",
            408,
            "answered 408: no complete request head within 300ms",
        ),
    ];
    for (send, status, log) in refusals {
        let r = raw_request(proxy.addr, send, false).await;
        assert_eq!(r.status, status, "{log}");
        let line = proxy.wait_for_log(log).await;
        assert!(line.contains("WARN"), "{line}");
    }
    assert_eq!(backend.requests(), 0);
}
