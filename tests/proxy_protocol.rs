//! The PROXY protocol through pinlb: accepted on a listener (v1 and v2, from curl and from raw
//! headers), refused when bad, and sent to a backend (nginx reading `$proxy_protocol_addr`).

use crate::common;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_listener_reads_the_header_before_the_http2_preface() {
    let a = Backend::start("a").await;
    let mut setup = accepting(a.addr, "");
    setup.listener_keys += "h2c = true\n";
    let proxy = Proxy::start(&setup);
    let url = format!("http://{}/h2c", proxy.addr);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "--http2-prior-knowledge",
                "--haproxy-protocol",
            ])
            .args([
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
                &url,
            ])
            .output()
            .expect("curl")
    })
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200 2",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(a.requests()[0].uri, "/h2c");
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

/// A child process killed when dropped, its directory holding its config and output.
struct Child {
    child: std::process::Child,
    dir: std::path::PathBuf,
}

impl Child {
    fn start(name: &str, program: &str, args: &[&str], config: &str) -> Child {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pinlb-pp-{name}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("conf"), config).unwrap();
        let conf = dir.join("conf").display().to_string();
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                a.replace("{conf}", &conf)
                    .replace("{dir}", &dir.display().to_string())
            })
            .collect();
        // Debian's place, else the PATH's (as scripts/test checks for them).
        let sbin = format!("/usr/sbin/{program}");
        let program = if std::path::Path::new(&sbin).exists() {
            sbin.as_str()
        } else {
            program
        };
        let child = std::process::Command::new(program)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        Child { child, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Waits (bounded) until something listens on `addr`.
async fn listening(addr: SocketAddr, what: &Child) {
    let up = wait::poll(200, Duration::from_millis(25), async || {
        TcpStream::connect(addr).await.ok()
    })
    .await;
    assert!(up.is_some(), "nothing listens on {addr}: {}", what.log());
}

/// nginx with `listen … proxy_protocol`, answering each request with the address its
/// connection's header named.
fn nginx(addr: SocketAddr) -> Child {
    // Its log shows who each request came from, pinlb's health checks among them.
    let conf = format!(
        "events {{}}\nhttp {{\n log_format pp '$status $request_uri $http_user_agent [$proxy_protocol_addr]';\n access_log logs/access.log pp;\n server {{\n  listen {addr} proxy_protocol;\n  location / {{ return 200 \"$proxy_protocol_addr\"; }}\n }}\n}}\n"
    );
    Child::start(
        "nginx",
        "nginx",
        &[
            "-p",
            "{dir}",
            "-c",
            "{conf}",
            "-g",
            "daemon off; master_process off; pid {dir}/nginx.pid; error_log {dir}/stderr.log info;",
        ],
        &conf,
    )
}

/// GETs `path` on an open keep-alive connection (after `first`, on the first request) and
/// returns the body.
async fn keep_alive_get(s: &mut TcpStream, first: &[u8], path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n");
    s.write_all(&[first, req.as_bytes()].concat())
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Bounded: each pass reads some of one small response, or fails the test.
    for _ in 0..64 {
        let n = tokio::time::timeout(WAIT, s.read(&mut chunk))
            .await
            .expect("answer")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("content-length");
            if body.len() >= len {
                assert!(head.starts_with("HTTP/1.1 200"), "{text}");
                return body[..len].to_string();
            }
        }
    }
    panic!("no whole response: {}", String::from_utf8_lossy(&buf));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_behind_pinlb_sees_each_client_and_clients_never_share_a_backend_connection() {
    for version in ["v1", "v2"] {
        let at = free_port();
        let n = nginx(at);
        listening(at, &n).await;
        let mut setup = accepting(
            at,
            "[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\n",
        );
        setup.upstream_keys = format!("proxy_protocol = \"{version}\"\n");
        let proxy = Proxy::start(&setup);
        let header = |ip: &str| {
            format!("PROXY TCP4 {ip} 127.0.0.1 5000 {}\r\n", proxy.addr.port()).into_bytes()
        };
        let mut a = TcpStream::connect(proxy.addr).await.unwrap();
        let mut b = TcpStream::connect(proxy.addr).await.unwrap();
        // Interleaved: each request finds the other client's connection idle in the pool.
        assert_eq!(
            keep_alive_get(&mut a, &header("203.0.113.7"), "/a1").await,
            "203.0.113.7",
            "{version}"
        );
        assert_eq!(
            keep_alive_get(&mut b, &header("198.51.100.9"), "/b1").await,
            "198.51.100.9",
            "{version}"
        );
        assert_eq!(
            keep_alive_get(&mut a, b"", "/a2").await,
            "203.0.113.7",
            "{version}"
        );
        assert_eq!(
            keep_alive_get(&mut b, b"", "/b2").await,
            "198.51.100.9",
            "{version}"
        );
        // Health checks send LOCAL (v2) or UNKNOWN (v1): nginx takes them, with no address.
        let log = n.dir.join("logs/access.log");
        let probed = wait::poll(100, Duration::from_millis(50), async || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .any(|l| l == "200 /health pinlb-health [-]")
                .then_some(())
        })
        .await;
        assert!(
            probed.is_some(),
            "{version}: no passing health check in nginx's log:\n{}{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            n.log()
        );
        drop(n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_in_front_with_send_proxy_v2_shows_pinlb_the_real_client() {
    let a = Backend::start("a").await;
    // Only HAProxy (on 127.0.0.1) may send headers; the client comes from 127.0.0.2.
    let mut setup = Setup::with(&[a.addr]);
    setup.listener_keys = "proxy_protocol = true\nproxy_protocol_from = [\"127.0.0.1\"]\n".into();
    let proxy = Proxy::start(&setup);
    let front = free_port();
    let conf = format!(
        "defaults\n mode http\n timeout connect 2s\n timeout client 5s\n timeout server 5s\nfrontend f\n bind {front}\n default_backend b\nbackend b\n server pinlb {} send-proxy-v2\n",
        proxy.addr
    );
    let h = Child::start("haproxy", "haproxy", &["-db", "-f", "{conf}"], &conf);
    listening(front, &h).await;
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut s = sock.connect(front).await.unwrap();
    keep_alive_get(&mut s, b"", "/via-haproxy").await;
    let seen = a.requests();
    assert_eq!(seen.len(), 1, "{}", h.log());
    assert_eq!(seen[0].uri, "/via-haproxy");
    assert_eq!(seen[0].headers["x-forwarded-for"], "127.0.0.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_reads_the_header_before_the_handshake() {
    let pki = Pki::new();
    let cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let mut setup = accepting(a.addr, "");
    // The keys first, then the table.
    setup.listener_keys += &format!(
        "[listener.tls]\ncert = {:?}\nkey = {:?}\n",
        cert.cert, cert.key
    );
    let proxy = Proxy::start(&setup);
    let port = proxy.addr.port();
    let ca = pki.ca_file();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "--haproxy-protocol",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg("--cacert")
            .arg(&ca)
            .args([
                "--resolve",
                &format!("a.test:{port}:127.0.0.1"),
                &format!("https://a.test:{port}/tls"),
            ])
            .output()
            .expect("curl")
    })
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = a.requests();
    assert_eq!(seen[0].uri, "/tls");
    assert_eq!(seen[0].headers["x-forwarded-proto"], "https");
}
