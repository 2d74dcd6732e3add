//! TLS on TCP listeners. Passed through by server name (`[[listener.sni]]`, nginx's
//! `ssl_preread`): `openssl s_client -servername` reaches the `openssl s_server` its name
//! routes to, and sees that backend's own certificate, verified against the test CA; exact
//! names beat wildcards, ALPN narrows a route, and what names nothing (or is not TLS) goes to
//! the listener's upstream. Or terminated (`[listener.tls]`, stunnel's job): `redis-cli --tls`
//! through pinlb to a plain redis-server.

use crate::common;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What `openssl s_client` printed connecting to `port` with `args` (`-servername a.test`,
/// `-alpn h2`), verifying against `pki`'s CA.
async fn s_client(pki: &Pki, port: u16, args: &[&str]) -> String {
    let mut command = Command::new("openssl");
    command
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .arg("-CAfile")
        .arg(pki.ca_file())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::time::timeout(
        WAIT,
        tokio::task::spawn_blocking(move || command.output().expect("run openssl s_client")),
    )
    .await
    .expect("openssl s_client in time")
    .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The subject's common name of the certificate `s_client`'s output shows.
fn subject(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_else(|| panic!("no certificate in:\n{out}"));
    line.rsplit("CN = ").next().unwrap_or_default().to_string()
}

/// A TCP listener whose default upstream is `default`, with `sni` tables after it, over the
/// upstreams `named` (name, backend).
fn passthrough(default: &str, sni: &str, named: &[(&str, SocketAddr)]) -> String {
    let mut toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"{default}\"\n{sni}\n"
    );
    for (name, addr) in named {
        toml += &format!("[upstream.{name}]\nbackends = [{{ address = \"{addr}\" }}]\n");
    }
    toml
}

#[tokio::test]
async fn each_server_name_reaches_its_own_backend_and_its_certificate() {
    let pki = Pki::new();
    let a = TlsServer::start(&pki.issue("a", &["a.test"], false)).await;
    let b = TlsServer::start(&pki.issue("b", &["b.test", "x.b.test"], false)).await;
    let d = TlsServer::start(&pki.issue("d", &["default.test"], false)).await;
    let sni = "[[listener.sni]]\nserver_name = \"*.b.test\"\nupstream = \"b\"\n\
               [[listener.sni]]\nserver_name = [\"a.test\", \"exact.b.test\"]\nupstream = \"a\"\n\
               [[listener.sni]]\nserver_name = \"b.test\"\nupstream = \"b\"\n";
    let proxy = Proxy::start_toml(&passthrough(
        "d",
        sni,
        &[("a", a.addr), ("b", b.addr), ("d", d.addr)],
    ));
    let port = proxy.addr.port();
    let cases = [
        (vec!["-servername", "a.test"], "a.test"),
        (vec!["-servername", "B.TEST"], "b.test"),
        // The wildcard, at any depth below its name.
        (vec!["-servername", "x.b.test"], "b.test"),
        (vec!["-servername", "y.x.b.test"], "b.test"),
        // An exact name beats the wildcard listed before it.
        (vec!["-servername", "exact.b.test"], "a.test"),
        // No match, and no name at all: the listener's upstream.
        (vec!["-servername", "c.test"], "default.test"),
        (vec!["-noservername"], "default.test"),
    ];
    for (args, cn) in cases {
        let out = s_client(&pki, port, &args).await;
        assert_eq!(subject(&out), cn, "{args:?}:\n{out}");
    }
    // The backend's certificate, verified for the name asked: pinlb terminated nothing.
    let out = s_client(
        &pki,
        port,
        &["-servername", "a.test", "-verify_hostname", "a.test"],
    )
    .await;
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
}

#[tokio::test]
async fn alpn_narrows_a_server_names_route() {
    let pki = Pki::new();
    let h2 = TlsServer::start(&pki.issue("h2", &["h2.a.test"], false)).await;
    let any = TlsServer::start(&pki.issue("any", &["any.a.test"], false)).await;
    let sni = "[[listener.sni]]\nserver_name = \"a.test\"\nalpn = [\"h2\"]\nupstream = \"h2\"\n";
    let proxy = Proxy::start_toml(&passthrough(
        "any",
        sni,
        &[("h2", h2.addr), ("any", any.addr)],
    ));
    let port = proxy.addr.port();
    let offered = s_client(
        &pki,
        port,
        &["-servername", "a.test", "-alpn", "http/1.1,h2"],
    )
    .await;
    assert_eq!(subject(&offered), "h2.a.test", "{offered}");
    let not = s_client(&pki, port, &["-servername", "a.test", "-alpn", "http/1.1"]).await;
    assert_eq!(subject(&not), "any.a.test", "{not}");
}

#[tokio::test]
async fn a_connection_that_is_not_tls_goes_to_the_listeners_upstream_with_its_bytes() {
    let pki = Pki::new();
    let a = TlsServer::start(&pki.issue("a", &["a.test"], false)).await;
    // An echo server: the default upstream gets the bytes pinlb read to tell, then the rest.
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = echo.accept().await.unwrap();
        let mut buf = vec![0; 1024];
        // Bounded by the client, which closes after its two writes.
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => s.write_all(&buf[..n]).await.unwrap(),
            }
        }
    });
    let sni = "[[listener.sni]]\nserver_name = \"a.test\"\nupstream = \"a\"\n";
    let proxy = Proxy::start_toml(&passthrough(
        "echo",
        sni,
        &[("a", a.addr), ("echo", echo_addr)],
    ));
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(b"PING\r\n").await.unwrap();
    let mut got = [0; 6];
    tokio::time::timeout(WAIT, c.read_exact(&mut got))
        .await
        .expect("echoed in time")
        .unwrap();
    assert_eq!(&got, b"PING\r\n");
    c.write_all(b"more").await.unwrap();
    let mut more = [0; 4];
    tokio::time::timeout(WAIT, c.read_exact(&mut more))
        .await
        .expect("echoed in time")
        .unwrap();
    assert_eq!(&more, b"more");
}

#[tokio::test]
async fn a_client_that_sends_no_hello_in_time_is_closed() {
    let pki = Pki::new();
    let a = TlsServer::start(&pki.issue("a", &["a.test"], false)).await;
    let sni = "[[listener.sni]]\nserver_name = \"a.test\"\nupstream = \"a\"\n";
    let toml = passthrough("a", sni, &[("a", a.addr)]) + "[limits]\nheader_timeout = \"300ms\"\n";
    let proxy = Proxy::start_toml(&toml);
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    // Half a record header, then nothing.
    c.write_all(&[22, 3]).await.unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, c.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "closed within {WAIT:?}");
    assert!(rest.is_empty(), "nothing relayed: {rest:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
}

#[test]
fn sni_tables_are_refused_on_an_http_listener_and_unknown_upstreams_named() {
    let http = "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"a\"\n\
                [[listener.sni]]\nserver_name = \"a.test\"\nupstream = \"a\"\n\
                [upstream.a]\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    let e = pinlb::Config::parse("test.toml", http, &allowed())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test.toml:4:")
            && e.contains("listener[0].sni")
            && e.contains("only for a TCP listener"),
        "{e}"
    );
    let unknown = "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"a\"\n\
                   [[listener.sni]]\nserver_name = \"a.test\"\nupstream = \"nope\"\n\
                   [upstream.a]\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    let e = pinlb::Config::parse("test.toml", unknown, &allowed())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test.toml:7:")
            && e.contains("listener[0].sni[0].upstream")
            && e.contains("unknown upstream \"nope\""),
        "{e}"
    );
}

/// A `redis-server` on a free port; killed on drop.
struct Redis {
    port: u16,
    child: Child,
}

impl Redis {
    async fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--port",
            ])
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-server (apt-get install redis-server)");
        poll(200, Duration::from_millis(25), async || {
            TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .expect("redis-server listens");
        Redis { port, child }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_tcp_listener_with_tls_terminates_it_and_relays_in_clear() {
    let pki = Pki::new();
    let cert = pki.issue("redis", &["redis.test"], false);
    let redis = Redis::start().await;
    let (log, table) = log_table("combined");
    let toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"r\"\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [upstream.r]\nbackends = [{{ address = \"127.0.0.1:{}\" }}]\n{table}",
        cert.cert.display(),
        cert.key.display(),
        redis.port
    );
    let proxy = Proxy::start_toml(&toml);
    let port = proxy.addr.port();
    let ca = pki.ca_file();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("redis-cli")
            .args(["--tls", "--sni", "redis.test", "--cacert"])
            .arg(&ca)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "PING"])
            .output()
            .expect("run redis-cli")
    })
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "PONG",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // In clear, the same port is refused: it speaks TLS only.
    let mut plain = TcpStream::connect(proxy.addr).await.unwrap();
    plain.write_all(b"PING\r\n").await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, plain.read_to_end(&mut rest)).await;
    assert!(!String::from_utf8_lossy(&rest).contains("PONG"), "{rest:?}");
    let lines = lines_after(proxy, &log).await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\" 200 7 ") && l.ends_with("end=closed")),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l.contains("\" 400 0 ")), "{lines:?}");
}

#[test]
fn tls_and_sni_on_one_tcp_listener_are_refused() {
    let pki = Pki::new();
    let cert = pki.issue("a", &["a.test"], false);
    let toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"a\"\n\
         [listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\
         [[listener.sni]]\nserver_name = \"a.test\"\nupstream = \"a\"\n\
         [upstream.a]\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n",
        cert.cert.display(),
        cert.key.display()
    );
    let e = pinlb::Config::parse("test.toml", &toml, &allowed())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("listener[0].tls") && e.contains("expected one of them"),
        "{e}"
    );
}
