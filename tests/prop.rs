//! Generated adversarial requests, sent over real TCP through a real pinlb to a backend that
//! checks everything it reads (`common::framing`).
//!
//! Each case is one client connection carrying one to three requests, written as one stream:
//! valid requests with their framing headers mutated (duplicate and conflicting Content-Length,
//! Transfer-Encoding variants, both at once), bare LF, obs-fold, NUL and bare CR, chunk-size
//! tricks, and a cut anywhere. Whatever was sent, the backend must see only canonical requests,
//! at most as many as were sent, and the client must get well-formed responses, then the close.
//! `tests/corpus.rs` holds the hand-written cases with their exact expected statuses.

use crate::common;

use std::time::Duration;

use common::framing::{
    FramingBackend, check_responses, client_ip, exchange, next_request, request_lines_at_most,
};
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per run: enough to cover every strategy branch several times in a few seconds.
/// `PROPTEST_CASES=N` runs more.
const CASES: u32 = 128;

/// Small limits so oversized cases stay small, and short timeouts so a cut request ends fast.
const LIMITS: &str = r#"[limits]
max_header_bytes = "4KiB"
max_headers = 20
max_uri_bytes = "1KiB"
max_body = "1KiB"
header_timeout = "500ms"
"#;

/// A framing header set and the body bytes that go with it (well or badly).
fn framing() -> impl Strategy<Value = (Vec<String>, Vec<u8>)> {
    let body = prop::collection::vec(any::<u8>(), 0..48);
    (body, 0usize..40, chunking()).prop_flat_map(|(body, k, chunks)| {
        let n = body.len();
        let chunked = encode_chunks(&body, &chunks);
        let te = |v: &str| vec![format!("Transfer-Encoding: {v}")];
        let cl = |v: String| vec![format!("Content-Length: {v}")];
        prop_oneof![
            Just((vec![], vec![])),
            Just((vec![], body.clone())),
            Just((cl(n.to_string()), body.clone())),
            Just((cl(k.to_string()), body.clone())),
            Just((
                [cl(n.to_string()), cl(n.to_string())].concat(),
                body.clone()
            )),
            Just((
                [cl(n.to_string()), cl(k.to_string())].concat(),
                body.clone()
            )),
            Just((cl(format!("{n}, {n}")), body.clone())),
            Just((cl(format!("+{n}")), body.clone())),
            Just((cl(format!("0x{n:x}")), body.clone())),
            Just((cl("99999999999999999999".into()), body.clone())),
            Just((cl(format!(" {n} ")), body.clone())),
            Just((te("chunked"), chunked.clone())),
            Just((te("CHUNKED"), chunked.clone())),
            Just((te("\tchunked "), chunked.clone())),
            Just((te("chunked, chunked"), chunked.clone())),
            Just((te("gzip, chunked"), chunked.clone())),
            Just((te("xchunked"), chunked.clone())),
            Just((te("\"chunked\""), chunked.clone())),
            Just((te("identity"), body.clone())),
            Just((te(""), chunked.clone())),
            Just(([te("chunked"), te("chunked")].concat(), chunked.clone())),
            Just(([te("chunked"), te("identity")].concat(), chunked.clone())),
            Just(([cl(n.to_string()), te("chunked")].concat(), chunked.clone())),
            Just(([te("chunked"), cl(k.to_string())].concat(), chunked.clone())),
            Just((
                vec!["Transfer-Encoding : chunked".to_string()],
                chunked.clone()
            )),
            Just((
                vec!["Transfer-Encoding:\r\n chunked".to_string()],
                chunked.clone()
            )),
            Just((
                vec!["Transfer-Encoding: \x0bchunked".to_string()],
                chunked.clone()
            )),
        ]
    })
}

/// How a chunked body is written.
#[derive(Debug, Clone, Copy)]
enum Chunking {
    Plain,
    UpperHex,
    LeadingZeros,
    Extension,
    HexPrefix,
    Negative,
    Overflow,
    SizeTooSmall,
    SizeTooLarge,
    NoLastChunk,
    Trailers,
    BareLf,
    SpaceAfterSize,
}

fn chunking() -> impl Strategy<Value = (Chunking, usize)> {
    use Chunking::*;
    (
        prop::sample::select(vec![
            Plain,
            UpperHex,
            LeadingZeros,
            Extension,
            HexPrefix,
            Negative,
            Overflow,
            SizeTooSmall,
            SizeTooLarge,
            NoLastChunk,
            Trailers,
            BareLf,
            SpaceAfterSize,
        ]),
        1usize..20,
    )
}

fn encode_chunks(body: &[u8], &(how, piece): &(Chunking, usize)) -> Vec<u8> {
    use Chunking::*;
    let eol: &[u8] = if matches!(how, BareLf) {
        b"\n"
    } else {
        b"\r\n"
    };
    let mut out = Vec::new();
    for c in body.chunks(piece) {
        let size = match how {
            UpperHex => format!("{:X}", c.len()),
            LeadingZeros => format!("000{:x}", c.len()),
            Extension => format!("{:x};ext=\"v\"", c.len()),
            HexPrefix => format!("0x{:x}", c.len()),
            Negative => format!("-{:x}", c.len()),
            Overflow => format!("ffffffffffffffff{:x}", c.len()),
            SizeTooSmall => format!("{:x}", c.len().saturating_sub(1)),
            SizeTooLarge => format!("{:x}", c.len() + 3),
            SpaceAfterSize => format!("{:x} ", c.len()),
            _ => format!("{:x}", c.len()),
        };
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(eol);
        out.extend_from_slice(c);
        out.extend_from_slice(eol);
    }
    match how {
        NoLastChunk => {}
        Trailers => out.extend_from_slice(b"0\r\nX-Trailer: 1\r\n\r\n"),
        _ => {
            out.extend_from_slice(b"0");
            out.extend_from_slice(eol);
            out.extend_from_slice(eol);
        }
    }
    out
}

/// One request: request line, Host, framing, one more mutation, the body.
fn request() -> impl Strategy<Value = Vec<u8>> {
    let method = prop::sample::select(vec!["GET", "POST", "HEAD", "PUT", "OPTIONS", "G\0T"]);
    let target = prop::sample::select(vec!["/", "/a?b=1", "http://a/x", "*", "/a b", "/\0"]);
    let version = prop::sample::select(vec![
        "HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "http/1.1",
    ]);
    let host = prop::sample::select(vec![
        vec!["Host: a"],
        vec!["Host: a"],
        vec!["Host: a:8080"],
        vec![],
        vec!["Host: a", "Host: b"],
        vec!["Host: "],
        vec!["Host: a b"],
        vec!["Host: user@a"],
    ]);
    let extra = prop::sample::select(vec![
        "",
        "",
        "X-Fold: a\r\n b",
        "X-Fold: a\r\n\tb",
        "X-Nul: a\0b",
        "X-Cr: a\rb",
        "Expect: 100-continue",
        "Connection: close",
        "Connection: keep-alive, TE",
        "TE: trailers",
        "Upgrade: websocket",
        // Upgrades pinlb passes on (any protocol but h2c), and ones it must not.
        "Connection: upgrade\r\nUpgrade: websocket",
        "Connection: Upgrade, keep-alive\r\nUpgrade: h3c",
        "Connection: upgrade\r\nUpgrade: h2c, foo/2",
        "Connection: upgrade\r\nUpgrade: h2c",
        "Keep-Alive: timeout=5",
        "Proxy-Connection: keep-alive",
        "Trailer: X-Trailer",
        "X Space: 1",
        "X-Forwarded-For: 192.0.2.1",
        "X-Obs-Text: caf\u{e9}",
    ]);
    let bare_lf = prop::bool::weighted(0.15);
    (method, target, version, host, framing(), extra, bare_lf).prop_map(
        |(method, target, version, host, (framing, body), extra, bare_lf)| {
            let mut lines = vec![format!("{method} {target} {version}")];
            lines.extend(host.iter().map(|h| h.to_string()));
            lines.extend(framing);
            if !extra.is_empty() {
                lines.push(extra.to_string());
            }
            let eol = if bare_lf { "\n" } else { "\r\n" };
            let mut head = lines.join(eol);
            head.push_str(eol);
            head.push_str(eol);
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(&body);
            bytes
        },
    )
}

/// One client connection: one to three requests back to back, maybe cut short, and where the
/// stream is split into two writes.
fn connection() -> impl Strategy<
    Value = (
        Vec<Vec<u8>>,
        Option<prop::sample::Index>,
        prop::sample::Index,
    ),
> {
    (
        prop::collection::vec(request(), 1..=3),
        prop::option::weighted(0.2, any::<prop::sample::Index>()),
        any::<prop::sample::Index>(),
    )
}

#[test]
fn generated_requests_reach_the_backend_only_as_canonical_requests_and_get_clean_answers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let backend = rt.block_on(FramingBackend::start()).expect("start backend");
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = LIMITS.to_string();
    setup.response_timeout = "2s";
    setup.client_idle = "2s";
    let proxy = Proxy::start(&setup);

    let mut runner = TestRunner::new(Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(CASES),
        failure_persistence: None,
        ..Config::default()
    });
    // `run` takes a `Fn`; each case connects from its own loopback address.
    let case = std::cell::Cell::new(0u64);
    runner
        .run(&connection(), |(requests, cut, split)| {
            case.set(case.get() + 1);
            let from = client_ip(case.get());
            let sent = requests.len();
            let mut bytes = requests.concat();
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            let split = split.index(bytes.len() + 1);
            let tally = backend.tally();
            let before = tally.by_client.get(&from.to_string()).copied().unwrap_or(0);
            let violations_before = tally.violations.len();
            let got = rt
                .block_on(exchange(from, proxy.addr, &bytes, split, WAIT))
                .map_err(TestCaseError::fail)?;
            check_responses(&got).map_err(TestCaseError::fail)?;
            // Whatever pinlb still had on its way to the backend has arrived or been cut off.
            prop_assert!(
                rt.block_on(backend.settled(WAIT)),
                "a backend connection kept a partial request"
            );
            let tally = backend.tally();
            prop_assert!(
                tally.violations.len() == violations_before,
                "the backend got a non-canonical request: {:?}",
                &tally.violations[violations_before..]
            );
            let forwarded = tally.by_client.get(&from.to_string()).copied().unwrap_or(0) - before;
            prop_assert!(
                forwarded <= sent && forwarded <= request_lines_at_most(&bytes),
                "{forwarded} requests forwarded for {sent} sent"
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    drop(proxy);
    // The backend's tasks live on `rt`; dropping it ends them.
    drop(backend);
    rt.shutdown_timeout(Duration::from_secs(1));
}

// The checkers themselves, on bytes whose verdict is known.

#[test]
fn the_framing_checker_passes_canonical_requests_and_refuses_ambiguous_ones() {
    let ok = b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi";
    assert_eq!(next_request(ok).unwrap().unwrap().body, b"hi");
    assert_eq!(next_request(&ok[..ok.len() - 1]).unwrap(), None);
    let chunked =
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
    assert_eq!(next_request(chunked).unwrap().unwrap().len, chunked.len());
    // An upgrade pinlb passes on: any protocol but h2c, with `connection: upgrade`.
    for upgrading in [
        &b"GET / HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: h3c, foo/2\r\n\r\n",
    ] {
        assert!(next_request(upgrading).unwrap().is_some());
    }
    for bad in [
        &b"GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\nhost: a\n\n",
        b"GET / HTTP/1.0\r\nhost: a\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\nhost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nupgrade: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: x, H2C/1\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\nconnection: upgrade, x\r\nupgrade: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: +1\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n2;x\r\nhi\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx: 1\r\n\r\n",
    ] {
        assert!(
            next_request(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn the_response_checker_reads_responses_in_sequence_and_refuses_a_truncated_one() {
    let three = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok\
HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n\
HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    assert_eq!(check_responses(three), Ok(3));
    assert_eq!(check_responses(b""), Ok(0));
    assert!(check_responses(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok").is_err());
    assert!(check_responses(b"HTTP/1.1 200 OK\r\ncontent-len").is_err());
    assert!(check_responses(b"HTTP/1.1 200 OK\ncontent-length: 0\n\n").is_err());
    assert_eq!(
        request_lines_at_most(b"GET / HTTP/1.1\r\n\r\nHTTP/1.HTTP/1"),
        2
    );
}
