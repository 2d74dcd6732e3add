//! The PROXY protocol through pinlb: accepted on a listener (v1 and v2, from curl and from raw
//! headers), refused when bad, and sent to a backend (nginx reading `$proxy_protocol_addr`).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any one connection may take to be answered or closed.
const WAIT: Duration = Duration::from_secs(5);

/// A v2 PROXY header over TCP naming `source` and `destination` (same family).
fn v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            h.extend_from_slice(&[0x21, 0x11, 0, 12]);
            h.extend_from_slice(&s.ip().octets());
            h.extend_from_slice(&d.ip().octets());
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            h.extend_from_slice(&[0x21, 0x21, 0, 36]);
            h.extend_from_slice(&s.ip().octets());
            h.extend_from_slice(&d.ip().octets());
        }
        _ => panic!("one family"),
    }
    h.extend_from_slice(&source.port().to_be_bytes());
    h.extend_from_slice(&destination.port().to_be_bytes());
    h
}

/// Writes `first` then a GET that closes, and returns all pinlb sent back (empty when it
/// closed without answering), within `WAIT`.
async fn exchange(addr: SocketAddr, first: &[u8], path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    s.write_all(&[first, req.as_bytes()].concat())
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await;
    // A reset is a close too.
    let _ = read.expect("answered or closed in time");
    String::from_utf8_lossy(&out).into_owned()
}

/// The sum of `pinlb_refused_total{cause}` over the listener at `listener`.
fn refused(m: &Metrics, listener: SocketAddr, cause: &str) -> f64 {
    m.0.lines()
        .filter(|l| l.starts_with("pinlb_refused_total{"))
        .filter(|l| {
            l.contains(&format!("\"{listener}\"")) && l.contains(&format!("cause=\"{cause}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

fn accepting(backend: SocketAddr, extra: &str) -> Setup {
    let mut setup = Setup::with(&[backend]);
    setup.listener_keys =
        "proxy_protocol = true\nproxy_protocol_from = [\"127.0.0.1\", \"::1\"]\n".into();
    setup.extra = extra.into();
    setup
}

#[tokio::test]
async fn raw_v1_and_v2_headers_name_the_client_in_x_forwarded_for_and_the_access_log() {
    let a = Backend::start("a").await;
    let log = temp_config("");
    let setup = accepting(
        a.addr,
        &format!("[log]\naccess = \"{}\"\nformat = \"json\"\n", log.display()),
    );
    let proxy = Proxy::start(&setup);
    let dst = proxy.addr;
    let v6dst: SocketAddr = "[2001:db8::1]:80".parse().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "203.0.113.7",
            format!(
                "PROXY TCP4 203.0.113.7 {} 40000 {}\r\n",
                dst.ip(),
                dst.port()
            )
            .into_bytes(),
        ),
        (
            "2001:db8::7",
            b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 80\r\n".to_vec(),
        ),
        ("203.0.113.8", v2("203.0.113.8:40001".parse().unwrap(), dst)),
        (
            "2001:db8::8",
            v2("[2001:db8::8]:40001".parse().unwrap(), v6dst),
        ),
        // A load balancer's own check keeps the connection's address.
        ("127.0.0.1", b"PROXY UNKNOWN\r\n".to_vec()),
    ];
    for (i, (source, header)) in cases.iter().enumerate() {
        let answer = exchange(proxy.addr, header, &format!("/case/{i}")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{source}: {answer}");
        let seen = a.requests();
        let last = seen.last().unwrap();
        assert_eq!(last.uri, format!("/case/{i}"));
        assert_eq!(last.headers["x-forwarded-for"], *source, "{source}");
    }
    proxy.join(WAIT).await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let clients: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["client"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let expected: Vec<&str> = cases.iter().map(|(s, _)| *s).collect();
    assert_eq!(clients, expected, "{text}");
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_haproxy_protocol_reaches_the_backend() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&accepting(a.addr, ""));
    let url = format!("http://{}/curl", proxy.addr);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "5",
                "--haproxy-protocol",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &url,
            ])
            .output()
            .expect("curl")
    })
    .await
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    let seen = a.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uri, "/curl");
    assert_eq!(seen[0].headers["x-forwarded-for"], "127.0.0.1");
}

#[tokio::test]
async fn bad_slow_missing_and_untrusted_headers_are_closed_counted_and_reach_no_backend() {
    let a = Backend::start("a").await;
    let mut setup = accepting(
        a.addr,
        "[admin]\naddress = \"127.0.0.1:0\"\n\n[limits]\nheader_timeout = \"300ms\"\n",
    );
    // A second listener that only 10.0.0.0/8 may send headers to: 127.0.0.1 is not.
    setup.extra.push_str(
        "\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\nproxy_protocol = true\nproxy_protocol_from = [\"10.0.0.0/8\"]\n",
    );
    let proxy = Proxy::start(&setup);
    let (open, closed) = (proxy.addrs[0], proxy.addrs[1]);
    let mut truncated = v2("203.0.113.7:1".parse().unwrap(), open);
    truncated.truncate(20);
    let mut oversized = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    oversized.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
    let bad: Vec<(&str, Vec<u8>)> = vec![
        (
            "malformed v1",
            b"PROXY TCP4 203.0.113.999 10.0.0.1 1 2\r\n".to_vec(),
        ),
        ("bare LF", b"PROXY TCP4 203.0.113.7 10.0.0.1 1 2\n".to_vec()),
        (
            "oversized v1",
            [b"PROXY TCP4 ".as_slice(), &[b'9'; 120]].concat(),
        ),
        ("oversized v2", oversized),
        ("bad v2 addresses", {
            let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
            h.extend_from_slice(&[0x21, 0x11, 0, 4, 1, 2, 3, 4]);
            h
        }),
    ];
    for (what, bytes) in &bad {
        // The request behind the bad header is never answered: the connection just closes.
        let answer = exchange(open, bytes, "/bad").await;
        assert_eq!(answer, "", "{what}");
    }
    // Truncated: the client stops mid-header and closes its side.
    {
        let mut s = TcpStream::connect(open).await.unwrap();
        s.write_all(&truncated).await.unwrap();
        s.shutdown().await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out))
            .await
            .expect("closed");
        assert!(out.is_empty());
    }
    // Slow: part of a header, then nothing, past header_timeout.
    {
        let mut s = TcpStream::connect(open).await.unwrap();
        s.write_all(b"PROXY TCP4 203.0").await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out))
            .await
            .expect("closed");
        assert!(out.is_empty());
    }
    // No header from an allowed address; a good header from one not allowed.
    assert_eq!(exchange(open, b"", "/plain").await, "");
    let good = format!(
        "PROXY TCP4 203.0.113.7 {} 1 {}\r\n",
        closed.ip(),
        closed.port()
    );
    assert_eq!(exchange(closed, good.as_bytes(), "/untrusted").await, "");
    let m = proxy.metrics().await;
    assert_eq!(refused(&m, open, "proxy_protocol_invalid"), 6.0, "{}", m.0);
    assert_eq!(refused(&m, open, "proxy_protocol_timeout"), 1.0, "{}", m.0);
    assert_eq!(
        refused(&m, open, "proxy_protocol_untrusted"),
        1.0,
        "{}",
        m.0
    );
    assert_eq!(
        refused(&m, closed, "proxy_protocol_untrusted"),
        1.0,
        "{}",
        m.0
    );
    assert_eq!(a.hits(), 0, "nothing reached the backend");
}
