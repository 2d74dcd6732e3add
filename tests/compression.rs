//! `compress` end to end: a real backend, curl and hyper as clients, the output decoded with
//! the same crates pinlb encodes with (and by curl's own zlib, brotli and zstd). Each algorithm
//! round-trips; q-values choose and q=0 refuses; the responses that must stay as they are do
//! (already encoded, HEAD, 204, 206, 304, no-transform, types not listed, short, HTTP/1.0);
//! Vary and ETag; a streamed response flushed piece by piece; HTTP/2 clients; a route's own
//! settings over the listener's; the config errors.

use crate::common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;

use common::*;
use http::Method;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// About 40 KiB of JSON that compresses as real JSON does (not one repeated byte).
fn json() -> String {
    let mut s = String::from("[");
    for i in 0..400 {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            r#"{{"id":{i},"name":"user {i}","email":"user{i}@example.com","score":{},"tags":["a{}","b{}"],"active":{}}}"#,
            (i * 7919) % 1000,
            i % 13,
            i % 7,
            i % 2 == 0
        ));
    }
    s.push(']');
    s
}

/// A backend that answers each path with the response the test is about.
async fn backend() -> RawServer {
    RawServer::start(|seen| {
        let path = seen.head.split_whitespace().nth(1).unwrap_or("/").to_string();
        let body = json();
        let with = |status: &str, lines: &str, body: &str| {
            RawAction::Respond(
                format!(
                    "HTTP/1.1 {status}\r\n{lines}content-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes(),
            )
        };
        let json_type = "content-type: application/json\r\n";
        match path.as_str() {
            "/json" => with("200 OK", json_type, &body),
            "/etag" => with(
                "200 OK",
                "content-type: text/html; charset=utf-8\r\netag: \"v1\"\r\nvary: Origin\r\naccept-ranges: bytes\r\n",
                &body,
            ),
            "/encoded" => with(
                "200 OK",
                "content-type: application/json\r\ncontent-encoding: identity-by-backend\r\n",
                &body,
            ),
            "/no-transform" => with(
                "200 OK",
                "content-type: application/json\r\ncache-control: public, no-transform\r\n",
                &body,
            ),
            "/png" => with("200 OK", "content-type: image/png\r\n", &body),
            "/short" => with("200 OK", json_type, "[1,2,3]"),
            "/204" => RawAction::Respond(b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()),
            "/304" => RawAction::Respond(
                b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\ncontent-type: application/json\r\n\r\n"
                    .to_vec(),
            ),
            "/206" => with(
                "206 Partial Content",
                "content-type: application/json\r\ncontent-range: bytes 0-9/100\r\n",
                "0123456789",
            ),
            "/chunked" => RawAction::Respond(
                format!(
                    "HTTP/1.1 200 OK\r\n{json_type}transfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                    body.len()
                )
                .into_bytes(),
            ),
            _ => with("404 Not Found", "content-type: text/plain\r\n", "no such path\n"),
        }
    })
    .await
}

fn setup(backend: SocketAddr, listener_keys: &str) -> Setup {
    let mut s = Setup::with(&[backend]);
    s.listener_keys = listener_keys.to_string();
    s
}

/// What curl got: status, header lines, and the body as curl wrote it.
struct Curl {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Curl {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Runs curl on a blocking thread (the backend runs on this runtime); `-D` writes the head to
/// a file of its own, so the body stays the bytes as sent (or as curl decoded them).
async fn curl(args: &[&str]) -> Curl {
    let dir = std::env::temp_dir();
    let head = dir.join(format!(
        "pinlb-compress-head-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-o",
        "-",
        "-w",
        "%{http_code}",
        "-D",
    ]);
    cmd.arg(&head);
    cmd.args(args);
    let what = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run curl"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let headers = std::fs::read_to_string(&head).unwrap_or_default();
    let _ = std::fs::remove_file(&head);
    let mut body = out.stdout;
    let status = body.split_off(body.len() - 3);
    // With a 1xx first, curl writes each head; the last is the response's.
    let headers = headers
        .rsplit("\r\n\r\n")
        .find(|h| !h.trim().is_empty())
        .unwrap_or("")
        .to_string();
    Curl {
        status: String::from_utf8_lossy(&status).parse().expect("a status"),
        headers,
        body,
    }
}

fn decode(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        "gzip" => {
            flate2::read::GzDecoder::new(data)
                .read_to_end(&mut out)
                .expect("gzip");
        }
        "br" => {
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .expect("brotli");
        }
        "zstd" => out = zstd::stream::decode_all(data).expect("zstd"),
        other => panic!("unexpected coding {other}"),
    }
    out
}

#[tokio::test]
async fn each_algorithm_round_trips_and_curl_decodes_it() {
    let b = backend().await;
    let proxy = Proxy::start(&setup(b.addr, "compress = true\n"));
    let url = format!("http://{}/json", proxy.addr);
    let plain = json();
    for coding in ["gzip", "br", "zstd"] {
        let ae = format!("Accept-Encoding: {coding}");
        let got = curl(&["-H", &ae, &url]).await;
        assert_eq!(got.status, 200);
        assert_eq!(
            got.header("content-encoding"),
            Some(coding),
            "{}",
            got.headers
        );
        assert_eq!(got.header("content-length"), None, "{}", got.headers);
        assert_eq!(got.header("transfer-encoding"), Some("chunked"));
        assert_eq!(got.header("vary"), Some("Accept-Encoding"));
        assert!(
            got.body.len() * 4 < plain.len(),
            "{coding}: {} bytes",
            got.body.len()
        );
        assert_eq!(decode(coding, &got.body), plain.as_bytes(), "{coding}");
    }
    // curl's own decoders (zlib, brotli, zstd) agree.
    let got = curl(&["--compressed", &url]).await;
    assert_eq!(got.body, plain.as_bytes());
    // A body without Content-Length is compressed too.
    let got = curl(&[
        "-H",
        "Accept-Encoding: gzip",
        &format!("http://{}/chunked", proxy.addr),
    ])
    .await;
    assert_eq!(got.header("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &got.body), plain.as_bytes());
}

#[tokio::test]
async fn q_values_choose_the_coding_and_q_zero_refuses_it() {
    let b = backend().await;
    let proxy = Proxy::start(&setup(b.addr, "compress = true\n"));
    let url = format!("http://{}/json", proxy.addr);
    let cases = [
        // Equal q: the server's order, zstd > br > gzip.
        ("gzip, deflate, br, zstd", Some("zstd")),
        ("gzip, br", Some("br")),
        ("br;q=0.5, gzip;q=0.8", Some("gzip")),
        ("zstd;q=0.1, br;q=0.9", Some("br")),
        ("gzip;q=0", None),
        ("zstd;q=0, br;q=0, *;q=0.3", Some("gzip")),
        ("*;q=0", None),
        ("identity", None),
        ("deflate", None),
    ];
    for (accept, want) in cases {
        let ae = format!("Accept-Encoding: {accept}");
        let got = curl(&["-H", &ae, &url]).await;
        assert_eq!(
            got.header("content-encoding"),
            want,
            "{accept}: {}",
            got.headers
        );
        match want {
            Some(c) => assert_eq!(decode(c, &got.body), json().as_bytes()),
            None => assert_eq!(got.body, json().as_bytes(), "{accept}"),
        }
        // Compressed or not, the response varies by Accept-Encoding.
        assert_eq!(got.header("vary"), Some("Accept-Encoding"), "{accept}");
    }
    // No Accept-Encoding at all: as the backend sent it.
    let got = curl(&[&url]).await;
    assert_eq!(got.header("content-encoding"), None);
    assert_eq!(
        got.header("content-length"),
        Some(&*json().len().to_string())
    );
}

#[tokio::test]
async fn responses_that_must_stay_as_they_are_are_left_alone() {
    let b = backend().await;
    let proxy = Proxy::start(&setup(b.addr, "compress = true\n"));
    let at = |p: &str| format!("http://{}{p}", proxy.addr);
    let ae = "Accept-Encoding: gzip, br, zstd";
    for path in ["/encoded", "/no-transform", "/png", "/short", "/206"] {
        let got = curl(&["-H", ae, &at(path)]).await;
        let enc = got.header("content-encoding");
        assert!(
            enc.is_none() || enc == Some("identity-by-backend"),
            "{path}: {}",
            got.headers
        );
        assert!(
            got.header("content-length").is_some(),
            "{path}: {}",
            got.headers
        );
        assert_eq!(got.header("vary"), None, "{path}: {}", got.headers);
    }
    let got = curl(&["-H", ae, &at("/204")]).await;
    assert_eq!((got.status, got.header("content-encoding")), (204, None));
    let got = curl(&["-H", ae, &at("/304")]).await;
    assert_eq!((got.status, got.header("content-encoding")), (304, None));
    assert_eq!(got.header("etag"), Some("\"v1\""));
    // HEAD: the length of the uncompressed body, no coding.
    let got = curl(&["-H", ae, "--head", &at("/json")]).await;
    assert_eq!(got.header("content-encoding"), None, "{}", got.headers);
    assert_eq!(
        got.header("content-length"),
        Some(&*json().len().to_string())
    );
    // HTTP/1.0 (nginx's gzip_http_version 1.1): as it is, with Vary for the caches.
    let got = curl(&["--http1.0", "-H", ae, &at("/json")]).await;
    assert_eq!(got.header("content-encoding"), None, "{}", got.headers);
    assert_eq!(got.body, json().as_bytes());
    assert_eq!(got.header("vary"), Some("Accept-Encoding"));
    // A listener without compress: nothing changes, no Vary.
    let plain = Proxy::start(&setup(b.addr, ""));
    let got = curl(&["-H", ae, &format!("http://{}/json", plain.addr)]).await;
    assert_eq!(
        (got.header("content-encoding"), got.header("vary")),
        (None, None)
    );
}

#[tokio::test]
async fn vary_is_merged_the_etag_weakened_and_accept_ranges_dropped() {
    let b = backend().await;
    let proxy = Proxy::start(&setup(b.addr, "compress = true\n"));
    let url = format!("http://{}/etag", proxy.addr);
    let got = curl(&["-H", "Accept-Encoding: br", &url]).await;
    assert_eq!(got.header("content-encoding"), Some("br"));
    assert_eq!(got.header("vary"), Some("Origin, Accept-Encoding"));
    assert_eq!(got.header("etag"), Some("W/\"v1\""));
    assert_eq!(got.header("accept-ranges"), None);
    // Uncompressed (the client takes none): the strong ETag stays, Vary is merged still.
    let got = curl(&[&url]).await;
    assert_eq!(got.header("etag"), Some("\"v1\""));
    assert_eq!(got.header("vary"), Some("Origin, Accept-Encoding"));
    assert_eq!(got.header("accept-ranges"), Some("bytes"));
}

/// A backend whose response body comes in two pieces: the first at once, the second when the
/// test says so.
async fn two_piece_backend(second: oneshot::Receiver<()>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "request head cut short");
            head.extend_from_slice(&buf[..n]);
        }
        let first = "data: first piece of the stream\n\n";
        let part = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
            first.len()
        );
        s.write_all(part.as_bytes()).await.unwrap();
        let _ = second.await;
        let last = "data: second piece\n\n";
        let part = format!("{:x}\r\n{last}\r\n0\r\n\r\n", last.len());
        let _ = s.write_all(part.as_bytes()).await;
    });
    addr
}

#[tokio::test]
async fn a_streamed_response_is_flushed_piece_by_piece() {
    for coding in ["gzip", "br", "zstd"] {
        let (release, second) = oneshot::channel();
        let addr = two_piece_backend(second).await;
        let proxy = Proxy::start(&setup(addr, "compress = true\n"));
        let mut conn = Conn::open(proxy.addr).await;
        let mut req = request(Method::GET, "/events", empty());
        req.headers_mut()
            .insert("accept-encoding", coding.parse().unwrap());
        let resp = conn.send(req).await;
        assert_eq!(resp.headers()["content-encoding"], coding);
        let mut body = resp.into_body();
        // The first piece arrives, decodable, while the backend holds the second.
        let mut got = Vec::new();
        let mut decoded = Vec::new();
        let first = "data: first piece of the stream\n\n";
        for _ in 0..16 {
            let frame = tokio::time::timeout(WAIT, body.frame())
                .await
                .unwrap_or_else(|_| panic!("{coding}: the first piece never came"))
                .expect("a frame")
                .expect("body data");
            got.extend_from_slice(frame.data_ref().expect("data"));
            decoded = partial_decode(coding, &got);
            if decoded.len() >= first.len() {
                break;
            }
        }
        assert_eq!(decoded, first.as_bytes(), "{coding}");
        release.send(()).unwrap();
        let rest = tokio::time::timeout(WAIT, body.collect())
            .await
            .expect("the rest")
            .expect("body")
            .to_bytes();
        got.extend_from_slice(&rest);
        assert_eq!(
            decode(coding, &got),
            format!("{first}data: second piece\n\n").as_bytes(),
            "{coding}"
        );
    }
}

/// What a stream's bytes so far decode to (a flushed stream decodes whole without its end).
fn partial_decode(coding: &str, data: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut d = flate2::write::GzDecoder::new(Vec::new());
            let _ = d.write_all(data);
            let _ = d.flush();
            d.get_ref().clone()
        }
        "br" => {
            let mut d = brotli::DecompressorWriter::new(Vec::new(), 4096);
            let _ = d.write_all(data);
            let _ = d.flush();
            d.get_ref().clone()
        }
        _ => {
            let mut d = zstd::stream::write::Decoder::new(Vec::new()).unwrap();
            let _ = d.write_all(data);
            let _ = d.flush();
            d.get_ref().clone()
        }
    }
}

#[tokio::test]
async fn an_http2_client_gets_the_same_compression() {
    let b = backend().await;
    let proxy = Proxy::start(&setup(b.addr, "h2c = true\ncompress = true\n"));
    let url = format!("http://{}/json", proxy.addr);
    let got = curl(&["--http2-prior-knowledge", "-H", "Accept-Encoding: br", &url]).await;
    assert!(got.headers.starts_with("HTTP/2 200"), "{}", got.headers);
    assert_eq!(got.header("content-encoding"), Some("br"));
    assert_eq!(got.header("content-length"), None);
    assert_eq!(decode("br", &got.body), json().as_bytes());
    let got = curl(&["--http2-prior-knowledge", "--compressed", &url]).await;
    assert_eq!(got.body, json().as_bytes());
    let got = curl(&[
        "--http2-prior-knowledge",
        "-H",
        "Accept-Encoding: gzip",
        "--head",
        &url,
    ])
    .await;
    assert_eq!(got.header("content-encoding"), None);
}

#[tokio::test]
async fn a_route_sets_its_own_keys_over_the_listener_or_turns_compression_off() {
    let b = backend().await;
    let keys = r#"compress = { algorithms = ["gzip"], gzip_level = 9 }
[[listener.route]]
path = "/json"
upstream = "app"
compress = false
[[listener.route]]
path = "/etag"
upstream = "app"
compress = { algorithms = ["br", "gzip"] }
[[listener.route]]
path = "/"
upstream = "app"
"#;
    let proxy = Proxy::start(&setup(b.addr, keys));
    let at = |p: &str| format!("http://{}{p}", proxy.addr);
    let ae = "Accept-Encoding: gzip, br, zstd";
    let got = curl(&["-H", ae, &at("/json")]).await;
    assert_eq!(
        (got.header("content-encoding"), got.header("vary")),
        (None, None)
    );
    let got = curl(&["-H", ae, &at("/etag")]).await;
    assert_eq!(got.header("content-encoding"), Some("br"));
    let got = curl(&["-H", ae, &at("/chunked")]).await;
    assert_eq!(got.header("content-encoding"), Some("gzip"));
    assert_eq!(decode("gzip", &got.body), json().as_bytes());
    // Level 9 from the listener: smaller than level 1's output of the same body.
    let one = Proxy::start(&setup(b.addr, "compress = { algorithms = [\"gzip\"] }\n"));
    let level1 = curl(&["-H", ae, &format!("http://{}/chunked", one.addr)]).await;
    assert!(
        got.body.len() < level1.body.len(),
        "{} vs {}",
        got.body.len(),
        level1.body.len()
    );
}

#[test]
fn bad_compress_keys_are_config_errors_at_their_place() {
    let base = |keys: &str| {
        format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n{keys}\n[upstream.app]\nbackends = [{{ address = \"127.0.0.1:9\" }}]\n"
        )
    };
    let cases = [
        (
            "compress = { algorithms = [\"deflate\"] }",
            "4:",
            "listener[0].compress.algorithms: unknown algorithm \"deflate\"",
        ),
        (
            "compress = { algorithms = [] }",
            "4:",
            "listener[0].compress.algorithms: empty",
        ),
        (
            "compress = { algorithms = [\"br\", \"br\"] }",
            "4:",
            "listed twice",
        ),
        (
            "compress = { gzip_level = 10 }",
            "4:",
            "listener[0].compress.gzip_level: 10 is out of range, expected a level from 1 to 9",
        ),
        (
            "compress = { br_level = 12 }",
            "4:",
            "br_level: 12 is out of range",
        ),
        (
            "compress = { zstd_level = 0 }",
            "4:",
            "zstd_level: 0 is out of range",
        ),
        (
            "compress = { min_length = -1 }",
            "4:",
            "min_length: -1 is negative",
        ),
        (
            "compress = { types = [\"text/html; charset=utf-8\"] }",
            "4:",
            "is not a media type",
        ),
        ("compress = { level = 1 }", "4:", "unknown field `level`"),
        ("compress = \"gzip\"", "4:", "expected true, false or"),
        (
            "[[listener.route]]\npath = \"/\"\nupstream = \"app\"\ncompress = { gzip_level = 0 }",
            "7:",
            "listener[0].route[0].compress.gzip_level: 0 is out of range",
        ),
    ];
    for (keys, line, want) in cases {
        let text = base(keys);
        let e = pinlb::Config::parse("bad.toml", &text, &allowed())
            .expect_err(keys)
            .to_string();
        assert!(e.contains(&format!("bad.toml:{line}")), "{keys}: {e}");
        assert!(e.contains(want), "{keys}: {e}");
    }
}
