//! `pinlb import` of an nginx `stream {}` block: an upstream with a TCP server, a UDP server,
//! `ssl_preread` with a server-name `map`, and a server that terminates TLS (`listen … ssl`). The import passes `pinlb check`, and pinlb (the
//! `pinlb` binary on the import) routes as nginx (with `libnginx-mod-stream`, on the same file)
//! does: the same connections, datagrams and TLS server names through both reach the same
//! backends.

use crate::common;

use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::nginx::Nginx;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// nginx's stream module, as Debian's libnginx-mod-stream installs it.
const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// The configuration under test; `{NAME}` are ports, filled in per proxy and backend.
const CONF: &str = "load_module MODULE;
worker_processes 1;
events { worker_connections 1024; }
stream {
    upstream app {
        server 127.0.0.1:{tcp_a};
        server 127.0.0.1:{tcp_b};
    }
    upstream dns {
        server 127.0.0.1:{udp_a};
        server 127.0.0.1:{udp_b};
    }
    map $ssl_preread_server_name $tls_backend {
        hostnames;
        a.test      127.0.0.1:{tls_a};
        .b.test     127.0.0.1:{tls_b};
        default     127.0.0.1:{tls_b};
    }
    server {
        listen 127.0.0.1:{tcp};
        proxy_pass app;
        proxy_connect_timeout 2s;
    }
    server {
        listen 127.0.0.1:{udp} udp;
        proxy_pass dns;
        proxy_responses 1;
    }
    server {
        listen 127.0.0.1:{tls};
        ssl_preread on;
        proxy_pass $tls_backend;
    }
    ssl_certificate CERT;
    server {
        listen 127.0.0.1:{tls_end} ssl;
        ssl_certificate_key KEY;
        ssl_protocols TLSv1.2 TLSv1.3;
        proxy_pass 127.0.0.1:{tcp_a};
    }
}
";

/// A free port of `127.0.0.1` for TCP and UDP both.
fn free_port() -> u16 {
    // Bounded: a port free for TCP is almost always free for UDP.
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both TCP and UDP");
}

/// `CONF` with `ports` and the TLS server's certificate filled in.
fn conf(ports: &[(&str, u16)], cert: &Cert) -> String {
    let mut text = CONF.replace("MODULE", STREAM_MODULE);
    text = text.replace("CERT", &cert.cert.display().to_string());
    text = text.replace("KEY", &cert.key.display().to_string());
    for (name, port) in ports {
        text = text.replace(&format!("{{{name}}}"), &port.to_string());
    }
    text
}

/// A TCP backend that writes `name` to every connection, then closes it.
async fn named_tcp(port: u16, name: &'static str) {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        // Bounded by the test: the runtime ends with it.
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.write_all(name.as_bytes()).await;
        }
    });
}

/// A UDP backend that answers every datagram with `name`.
async fn named_udp(port: u16, name: &'static str) {
    let s = tokio::net::UdpSocket::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        // Bounded by the test: the runtime ends with it.
        while let Ok((_, from)) = s.recv_from(&mut buf).await {
            let _ = s.send_to(name.as_bytes(), from).await;
        }
    });
}

/// What a TCP connection to `port` reads before the backend closes.
async fn tcp_says(port: u16) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The answer to one datagram sent to `port`, within a second.
async fn udp_says(port: u16) -> Option<String> {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    s.connect(("127.0.0.1", port)).await.ok()?;
    s.send(b"query").await.ok()?;
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(1), s.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The common name of the certificate `openssl s_client -servername name` sees at `port`.
async fn tls_says(port: u16, name: &'static str) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .args(["-servername", name])
            .stdin(Stdio::null())
            .output()
            .expect("run openssl s_client")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_default();
    line.rsplit("CN = ").next().unwrap_or_default().to_string()
}

/// What a TLS connection to `port` for `front.test` (its certificate checked against `pki`'s CA)
/// reads before the other side closes.
async fn tls_front_says(port: u16, pki: &Pki) -> Option<String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let name = rustls::pki_types::ServerName::try_from("front.test").ok()?;
    let connect =
        tokio_rustls::TlsConnector::from(pki.client_config(b"x", None)).connect(name, tcp);
    let mut s = tokio::time::timeout(WAIT, connect).await.ok()?.ok()?;
    let mut out = Vec::new();
    // A peer that closes without close_notify is an error after the bytes, which are kept.
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await;
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// The sorted answers of six connections, six datagrams, and the TLS names, through `ports`.
async fn answers(tcp: u16, udp: u16, tls: u16) -> (Vec<String>, Vec<String>, Vec<String>) {
    let (mut t, mut u) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        t.push(tcp_says(tcp).await.unwrap_or_else(|| "-".into()));
        u.push(udp_says(udp).await.unwrap_or_else(|| "-".into()));
    }
    t.sort();
    u.sort();
    let mut names = Vec::new();
    for n in ["a.test", "b.test", "x.b.test", "c.test"] {
        names.push(format!("{n} -> {}", tls_says(tls, n).await));
    }
    (t, u, names)
}

/// Polls until `port` accepts TCP connections.
async fn listening(port: u16) {
    poll(200, Duration::from_millis(25), async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await
    .unwrap_or_else(|| panic!("nothing listens on {port}"));
}

#[tokio::test]
async fn an_imported_stream_block_routes_tcp_udp_and_tls_names_as_nginx_does() {
    assert!(
        Path::new(STREAM_MODULE).exists(),
        "needs nginx's stream module: apt-get install libnginx-mod-stream (scripts/test does)"
    );
    let backends = ["tcp_a", "tcp_b", "udp_a", "udp_b", "tls_a", "tls_b"].map(|n| (n, free_port()));
    let port = |n: &str| backends.iter().find(|(b, _)| *b == n).unwrap().1;
    named_tcp(port("tcp_a"), "tcp-a").await;
    named_tcp(port("tcp_b"), "tcp-b").await;
    named_udp(port("udp_a"), "udp-a").await;
    named_udp(port("udp_b"), "udp-b").await;
    let pki = Pki::new();
    let front_cert = pki.issue("front", &["front.test"], false);
    let _a = TlsServer::on(port("tls_a"), &pki.issue("a", &["a.test"], false)).await;
    let _b = TlsServer::on(port("tls_b"), &pki.issue("b", &["b.test"], false)).await;

    let fronts = |tag: &str| {
        let _ = tag;
        [
            ("tcp", free_port()),
            ("udp", free_port()),
            ("tls", free_port()),
            ("tls_end", free_port()),
        ]
    };
    let (for_nginx, for_pinlb) = (fronts("nginx"), fronts("pinlb"));
    let dir = tempfile::tempdir().unwrap();
    let nginx_conf = conf(&[&backends[..], &for_nginx[..]].concat(), &front_cert);
    let _nginx = Nginx::start(dir.path(), &nginx_conf);

    // The import, of the same file with pinlb's own front ports.
    let pinlb_conf = conf(&[&backends[..], &for_pinlb[..]].concat(), &front_cert);
    let file = dir.path().join("pinlb-nginx.conf");
    std::fs::write(&file, &pinlb_conf).unwrap();
    let imported = Command::new(bin())
        .arg("import")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let toml = String::from_utf8(imported.stdout).unwrap();
    for want in [
        "mode = \"tcp\"",
        "mode = \"udp\"",
        "responses = 1",
        "[[listener.sni]]",
        "[listener.tls]",
    ] {
        assert!(toml.contains(want), "{want} missing from:\n{toml}");
    }
    let checked = Command::new(bin())
        .args(["check", "-c"])
        .arg(temp_config(&toml))
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let mut pinlb = BinProxy::spawn_toml(&toml, &[]).await;

    let front = |set: &[(&str, u16); 4], n: &str| set.iter().find(|(f, _)| *f == n).unwrap().1;
    listening(front(&for_nginx, "tcp")).await;
    listening(front(&for_pinlb, "tcp")).await;
    let via_nginx = answers(
        front(&for_nginx, "tcp"),
        front(&for_nginx, "udp"),
        front(&for_nginx, "tls"),
    )
    .await;
    let via_pinlb = answers(
        front(&for_pinlb, "tcp"),
        front(&for_pinlb, "udp"),
        front(&for_pinlb, "tls"),
    )
    .await;
    // Round robin over two backends, each way: three connections and three datagrams each.
    let even = |x: &str| {
        vec![format!("{x}-a"); 3]
            .into_iter()
            .chain(vec![format!("{x}-b"); 3])
            .collect::<Vec<_>>()
    };
    assert_eq!(via_nginx.0, even("tcp"), "nginx, TCP");
    assert_eq!(via_nginx.1, even("udp"), "nginx, UDP");
    assert_eq!(via_pinlb, via_nginx, "pinlb and nginx disagree");
    assert_eq!(
        via_pinlb.2,
        [
            "a.test -> a.test",
            "b.test -> b.test",
            "x.b.test -> b.test",
            "c.test -> b.test"
        ]
    );
    // TLS ends at the proxy, and the backend's bytes come back inside it, through both.
    for set in [&for_nginx, &for_pinlb] {
        let says = tls_front_says(front(set, "tls_end"), &pki).await;
        assert_eq!(says.as_deref(), Some("tcp-a"), "through {set:?}");
    }
    pinlb.signal(nix::sys::signal::Signal::SIGTERM);
    let _ = pinlb.wait_exit().await;
}

/// `pinlb import ARGS` of `text`: exit code, stdout, stderr.
fn import(text: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nginx.conf");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(bin())
        .arg("import")
        .args(args)
        .arg(&file)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn stream_level_directives_are_inherited_and_a_servers_own_list_replaces_them() {
    let text = "stream {
    deny 192.0.2.1;
    allow all;
    proxy_connect_timeout 3s;
    upstream a { server 127.0.0.1:7001; }
    upstream b { server 127.0.0.1:7002; }
    server { listen 127.0.0.1:7000; proxy_pass a; }
    server { listen 127.0.0.1:7010; proxy_pass b; allow 10.0.0.0/8; deny all; }
}
";
    let (code, toml, stderr) = import(text, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    // The first server inherits the stream level's rules; the second has its own alone.
    assert!(
        toml.contains("access = [\"deny 192.0.2.1\", \"allow all\"]\naddress = \"127.0.0.1:7000\""),
        "{toml}"
    );
    assert!(
        toml.contains(
            "access = [\"allow 10.0.0.0/8\", \"deny all\"]\naddress = \"127.0.0.1:7010\""
        ),
        "{toml}"
    );
    // Timeouts inherited, and nginx's default proxy_timeout written out.
    assert!(toml.contains("connect = \"3s\""), "{toml}");
    assert!(toml.contains("tunnel_idle = \"600s\""), "{toml}");
}

#[test]
fn a_proxy_protocol_listen_without_set_real_ip_from_is_refused_as_less_strict() {
    let text = "stream {
    server { listen 127.0.0.1:7000 proxy_protocol; proxy_pass 127.0.0.1:7001; }
}
";
    let (code, _, stderr) = import(text, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(":2: listen … proxy_protocol without set_real_ip_from"),
        "{stderr}"
    );
    let (code, toml, stderr) = import(text, &["--allow-less-strict"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        toml.contains("proxy_protocol = true\nproxy_protocol_from = [\"0.0.0.0/0\", \"::/0\"]"),
        "{toml}"
    );
}

#[test]
fn a_tls_listen_takes_its_servers_certificates_or_is_refused_without_one() {
    // The stream level's pair, replaced by the second server's own two.
    let text = "stream {
    ssl_certificate /etc/a.pem;
    ssl_certificate_key /etc/a.key;
    server { listen 127.0.0.1:7000 ssl; proxy_pass 127.0.0.1:7001; }
    server {
        listen 127.0.0.1:7010 ssl;
        ssl_certificate /etc/b.pem;
        ssl_certificate_key /etc/b.key;
        ssl_certificate /etc/c.pem;
        ssl_certificate_key /etc/c.key;
        proxy_pass 127.0.0.1:7001;
    }
}
";
    let (code, toml, stderr) = import(text, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let config: toml::Table = toml.parse().unwrap();
    let tls = |i: usize| config["listener"][i]["tls"].as_table().unwrap().clone();
    assert_eq!(tls(0)["cert"].as_str(), Some("/etc/a.pem"), "{toml}");
    assert_eq!(tls(0)["key"].as_str(), Some("/etc/a.key"), "{toml}");
    assert!(!tls(0).contains_key("certificate"), "{toml}");
    assert_eq!(tls(1)["cert"].as_str(), Some("/etc/b.pem"), "{toml}");
    assert_eq!(
        tls(1)["certificate"][0]["cert"].as_str(),
        Some("/etc/c.pem")
    );
    assert_eq!(tls(1)["certificate"][0]["key"].as_str(), Some("/etc/c.key"));

    // Without a certificate, pinlb would relay in clear where nginx asks for TLS.
    let text = "stream {
    server { listen 127.0.0.1:7000 ssl; proxy_pass 127.0.0.1:7001; }
}
";
    let (code, _, stderr) = import(text, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(":2: listen … ssl not converted: the server has no ssl_certificate"),
        "{stderr}"
    );
}
