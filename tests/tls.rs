//! TLS termination on listeners, end to end: certificates made here (a CA, an ECDSA P-256 and an
//! RSA server certificate), clients from tokio-rustls and curl, real sockets on loopback.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http::Method;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, HandshakeKind, SupportedProtocolVersion};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A client that takes any certificate, to see which one a name gets.
fn any_cert_client() -> Arc<ClientConfig> {
    #[derive(Debug)]
    struct Any(Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for Any {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Any(provider())))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

const BOTH: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

async fn connect(
    addr: SocketAddr,
    name: &str,
    config: Arc<ClientConfig>,
) -> std::io::Result<BufReader<TlsStream<TcpStream>>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_string()).unwrap();
    let tls = tokio::time::timeout(WAIT, TlsConnector::from(config).connect(name, tcp))
        .await
        .map_err(|_| std::io::Error::other("handshake timed out"))??;
    Ok(BufReader::new(tls))
}

/// One keep-alive GET on an open connection.
async fn get_on(conn: &mut BufReader<TlsStream<TcpStream>>, path: &str) -> RawResponse {
    let req = format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n\r\n");
    conn.get_mut().write_all(req.as_bytes()).await.unwrap();
    tokio::time::timeout(WAIT, read_response(conn, false))
        .await
        .expect("a response in time")
}

/// The served certificate of an open connection.
fn served(conn: &BufReader<TlsStream<TcpStream>>) -> CertificateDer<'static> {
    conn.get_ref().get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// `setup`'s TOML with a `[listener.tls]` table for its listener.
fn with_tls(setup: &Setup, tls: &str) -> String {
    setup.toml().replacen(
        "upstream = \"app\"\n",
        &format!("upstream = \"app\"\n{tls}"),
        1,
    )
}

fn tls_table(default: Option<&Cert>, by_name: &[&Cert]) -> String {
    let mut s = String::from("[listener.tls]\n");
    if let Some(c) = default {
        s += &format!("cert = {:?}\nkey = {:?}\n", c.cert, c.key);
    }
    for c in by_name {
        s += &format!(
            "[[listener.tls.certificate]]\ncert = {:?}\nkey = {:?}\n",
            c.cert, c.key
        );
    }
    s
}

fn with_admin(setup: &mut Setup) {
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
}

fn failures(m: &Metrics, addr: SocketAddr, reason: &str) -> f64 {
    m.value(
        "pinlb_tls_handshake_failures_total",
        &format!("listener=\"{addr}\",reason=\"{reason}\""),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_tls_1_2_and_1_3_reach_the_backend_with_x_forwarded_proto_https() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&with_tls(
        &Setup::with(&[a.addr]),
        &tls_table(Some(&a_cert), &[]),
    ));
    for (version, want) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let mut conn = connect(proxy.addr, "a.test", pki.client(&[version]))
            .await
            .expect("handshake");
        let (_, session) = conn.get_ref().get_ref();
        assert_eq!(session.protocol_version(), Some(want));
        assert_eq!(session.alpn_protocol(), Some(&b"http/1.1"[..]));
        // Two requests on the one connection: keep-alive works over TLS.
        for path in ["/one", "/two"] {
            let r = get_on(&mut conn, path).await;
            assert_eq!(r.status, 200, "{r:?}");
            let seen = a.requests().pop().unwrap();
            assert_eq!(seen.uri, path);
            assert_eq!(seen.headers["x-forwarded-proto"], "https");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_the_certificate_and_an_unknown_name_gets_the_default() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let b_cert = pki.issue("b", &["b.test", "*.b.test"], true);
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&with_tls(
        &Setup::with(&[a.addr]),
        &tls_table(Some(&a_cert), &[&b_cert]),
    ));
    // Verified against the CA: each name gets its own certificate, ECDSA or RSA.
    for (name, cert) in [
        ("a.test", &a_cert),
        ("b.test", &b_cert),
        ("x.b.test", &b_cert),
    ] {
        let mut conn = connect(proxy.addr, name, pki.client(BOTH))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(served(&conn), cert.der(), "{name}");
        assert_eq!(get_on(&mut conn, "/").await.status, 200);
    }
    // A name no certificate has gets the default.
    let conn = connect(proxy.addr, "c.test", any_cert_client())
        .await
        .expect("handshake");
    assert_eq!(served(&conn), a_cert.der());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_name_without_a_default_certificate_is_refused_and_counted() {
    let pki = Pki::new();
    let b_cert = pki.issue("b", &["b.test"], false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    let proxy = Proxy::start_toml(&with_tls(&setup, &tls_table(None, &[&b_cert])));
    assert!(
        connect(proxy.addr, "c.test", any_cert_client())
            .await
            .is_err()
    );
    let mut conn = connect(proxy.addr, "b.test", pki.client(BOTH))
        .await
        .expect("a known name still works");
    assert_eq!(get_on(&mut conn, "/").await.status, 200);
    let m = proxy.metrics().await;
    assert_eq!(failures(&m, proxy.addr, "unknown_name"), 1.0);
    assert_eq!(
        m.value(
            "pinlb_tls_handshakes_total",
            &format!("listener=\"{}\"", proxy.addr)
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_a_tls_port_gets_a_400_that_says_so() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    let proxy = Proxy::start_toml(&with_tls(&setup, &tls_table(Some(&a_cert), &[])));
    let r = raw_request(proxy.addr, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", false).await;
    assert_eq!(r.status, 400, "{r:?}");
    let body = String::from_utf8_lossy(&r.body);
    assert!(
        body.contains("The plain HTTP request was sent to HTTPS port"),
        "{body}"
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(a.hits(), 0);
    let m = proxy.metrics().await;
    assert_eq!(failures(&m, proxy.addr, "plain_http"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_a_stalled_handshake_are_closed_and_counted() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    setup.extra += "[limits]\nheader_timeout = \"1s\"\n";
    let proxy = Proxy::start_toml(&with_tls(&setup, &tls_table(Some(&a_cert), &[])));

    // Not a TLS record, and not HTTP either.
    let mut garbage = RawConn::open(proxy.addr).await;
    garbage.send(&[0u8, 1, 2, 3, 0xff, 0xfe, 0x16, 0x03]).await;
    garbage.send(&[0x99; 64]).await;
    assert!(garbage.wait_closed().await < Duration::from_millis(900));

    // A handshake record header that promises more than ever comes.
    let started = Instant::now();
    let mut stalled = RawConn::open(proxy.addr).await;
    stalled.send(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
    stalled.wait_closed().await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "closed after {took:?}, with a header_timeout of 1s"
    );
    // A connection that sends nothing at all is timed the same way.
    let started = Instant::now();
    RawConn::open(proxy.addr).await.wait_closed().await;
    assert!(started.elapsed() < Duration::from_secs(3));

    // The listener still serves.
    let mut conn = connect(proxy.addr, "a.test", pki.client(BOTH))
        .await
        .expect("handshake");
    assert_eq!(get_on(&mut conn, "/").await.status, 200);
    let m = proxy.metrics().await;
    assert_eq!(failures(&m, proxy.addr, "invalid"), 1.0);
    assert_eq!(failures(&m, proxy.addr, "timeout"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_with_tls_1_3_tickets_and_the_tls_1_2_cache() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    // Two workers: a session made on one resumes on the other.
    setup.cpus = allowed().into_iter().take(2).collect();
    let proxy = Proxy::start_toml(&with_tls(&setup, &tls_table(Some(&a_cert), &[])));
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        // One client config keeps its sessions between connections.
        let client = pki.client(&[version]);
        let mut first = connect(proxy.addr, "a.test", client.clone()).await.unwrap();
        assert_eq!(get_on(&mut first, "/").await.status, 200);
        let kinds: Vec<_> = {
            let mut kinds = Vec::new();
            for _ in 0..4 {
                let mut again = connect(proxy.addr, "a.test", client.clone()).await.unwrap();
                assert_eq!(get_on(&mut again, "/").await.status, 200);
                kinds.push(again.get_ref().get_ref().1.handshake_kind());
            }
            kinds
        };
        assert!(
            kinds.iter().all(|k| *k == Some(HandshakeKind::Resumed)),
            "{version:?}: {kinds:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tls_connection_parks_and_serves_its_next_request() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&with_tls(
        &Setup::with(&[a.addr]),
        &tls_table(Some(&a_cert), &[]),
    ));
    let mut conn = connect(proxy.addr, "a.test", pki.client(BOTH))
        .await
        .unwrap();
    assert_eq!(get_on(&mut conn, "/").await.status, 200);
    // Parked after a second idle, its rustls state kept beside the socket.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    for _ in 0..3 {
        assert_eq!(get_on(&mut conn, "/after").await.status, 200);
    }
    assert_eq!(a.hits(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_new_certificates_to_new_connections_and_keeps_open_ones() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    setup.cpus = allowed().into_iter().take(2).collect();
    let toml = with_tls(&setup, &tls_table(Some(&a_cert), &[]));
    let proxy = Proxy::start_file(&toml);
    let mut open = connect(proxy.addr, "a.test", pki.client(BOTH))
        .await
        .unwrap();
    assert_eq!(get_on(&mut open, "/").await.status, 200);
    let old = served(&open);

    // New files in the same places, then a reload.
    let renewed = pki.issue("a", &["a.test"], false);
    assert_ne!(renewed.der(), old);
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    for _ in 0..4 {
        let conn = connect(proxy.addr, "a.test", pki.client(BOTH))
            .await
            .unwrap();
        assert_eq!(
            served(&conn),
            renewed.der(),
            "a new connection after the reload"
        );
    }
    assert_eq!(get_on(&mut open, "/still").await.status, 200);

    // A bad PEM fails the reload, naming the file; the running certificate stays.
    let served_now = renewed.der();
    std::fs::write(&renewed.key, "-----BEGIN PRIVATE KEY-----\nnot base64\n").unwrap();
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_ne!(r.status, 200);
    assert!(
        r.body.contains(&renewed.key.display().to_string()),
        "{}",
        r.body
    );
    // So does a key that belongs to another certificate.
    let other = pki.issue("other", &["a.test"], false);
    std::fs::copy(&other.key, &renewed.key).unwrap();
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_ne!(r.status, 200);
    assert!(r.body.contains("does not match"), "{}", r.body);
    assert!(
        r.body.contains(&renewed.key.display().to_string()),
        "{}",
        r.body
    );
    let conn = connect(proxy.addr, "a.test", pki.client(BOTH))
        .await
        .unwrap();
    assert_eq!(served(&conn), served_now);
    assert_eq!(get_on(&mut open, "/still").await.status, 200);
}

#[test]
fn config_errors_name_the_file_and_the_place() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let b_cert = pki.issue("b", &["b.test"], true);
    let setup = Setup::with(&["127.0.0.1:1".parse().unwrap()]);
    let parse = |toml: &str| pinlb::Config::parse("test.toml", toml, &allowed());
    // The line of `cert = ` in the file, for the expected position.
    let line_of = |toml: &str, needle: &str| {
        toml.lines()
            .position(|l| l.starts_with(needle))
            .map(|i| i + 1)
            .unwrap()
    };

    let toml = with_tls(&setup, &tls_table(Some(&a_cert), &[]));
    assert!(parse(&toml).is_ok(), "{:?}", parse(&toml).err());

    let missing = Cert {
        cert: pki.dir.join("missing.pem"),
        key: a_cert.key.clone(),
    };
    let toml = with_tls(&setup, &tls_table(Some(&missing), &[]));
    let e = parse(&toml).unwrap_err().to_string();
    let at = format!(
        "test.toml:{}:8: listener[0].tls.cert: cannot read ",
        line_of(&toml, "cert")
    );
    assert!(e.starts_with(&at), "{e}");
    assert!(e.contains(&missing.cert.display().to_string()), "{e}");

    // A key file that is not PEM.
    let garbage = pki.dir.join("garbage.key");
    std::fs::write(&garbage, "hello").unwrap();
    let bad_key = Cert {
        cert: a_cert.cert.clone(),
        key: garbage.clone(),
    };
    let toml = with_tls(&setup, &tls_table(None, &[&b_cert, &bad_key]));
    let e = parse(&toml).unwrap_err().to_string();
    assert!(e.contains("listener[0].tls.certificate[1].key: "), "{e}");
    assert!(e.contains(&garbage.display().to_string()), "{e}");
    assert!(e.contains("no private key"), "{e}");

    // A certificate file with no certificate in it.
    let not_cert = pki.dir.join("not-a-cert.pem");
    std::fs::copy(&a_cert.key, &not_cert).unwrap();
    let bad_cert = Cert {
        cert: not_cert,
        key: a_cert.key.clone(),
    };
    let e = parse(&with_tls(&setup, &tls_table(Some(&bad_cert), &[])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("listener[0].tls.cert: "), "{e}");
    assert!(e.contains("no certificate"), "{e}");

    // The RSA key with the ECDSA certificate.
    let mismatched = Cert {
        cert: a_cert.cert.clone(),
        key: b_cert.key.clone(),
    };
    let e = parse(&with_tls(&setup, &tls_table(Some(&mismatched), &[])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("listener[0].tls.key: "), "{e}");
    assert!(e.contains("does not match"), "{e}");
    assert!(e.contains(&b_cert.key.display().to_string()), "{e}");

    // An empty table, a cert without its key, and TLS on a redirecting listener.
    for (tls, want) in [
        (
            "[listener.tls]\n".to_string(),
            "listener[0].tls: no certificate",
        ),
        (
            format!("[listener.tls]\ncert = {:?}\n", a_cert.cert),
            "listener[0].tls.key: missing",
        ),
        (
            format!("redirect_https = true\n{}", tls_table(Some(&a_cert), &[])),
            "listener[0].tls: set together with redirect_https",
        ),
    ] {
        let e = parse(&with_tls(&setup, &tls)).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// `curl`, when there is one: a client that is not rustls, over TLS 1.2 and 1.3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_the_backend_over_tls_1_2_and_1_3() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: no curl");
        return;
    }
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&with_tls(
        &Setup::with(&[a.addr]),
        &tls_table(Some(&a_cert), &[]),
    ));
    let port = proxy.addr.port();
    for version in [
        ["--tlsv1.2", "--tls-max", "1.2"],
        ["--tlsv1.3", "--tls-max", "1.3"],
    ] {
        let ca = pki.ca_file();
        let resolve = format!("a.test:{port}:127.0.0.1");
        let url = format!("https://a.test:{port}/curl");
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "--http1.1", "--max-time", "10", "-o", "/dev/null"])
                .args(["-w", "%{http_code} %{ssl_verify_result}"])
                .args(version)
                .arg("--cacert")
                .arg(&ca)
                .args(["--resolve", &resolve, &url])
                .output()
                .expect("run curl")
        })
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text,
            "200 0",
            "{version:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            a.requests().pop().unwrap().headers["x-forwarded-proto"],
            "https"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_listener_with_redirect_https_answers_301_to_the_same_host_and_path() {
    let a = Backend::start("a").await;
    let toml = Setup::with(&[a.addr]).toml().replacen(
        "upstream = \"app\"\n",
        "redirect_https = true\n",
        1,
    );
    let proxy = Proxy::start_toml(&toml);
    let mut conn = RawConn::open(proxy.addr).await;
    for path in ["/a/b?c=d", "/again"] {
        let r = conn
            .exchange(
                format!("GET {path} HTTP/1.1\r\nHost: example.test:8080\r\n\r\n").as_bytes(),
                false,
            )
            .await;
        assert_eq!(r.status, 301, "{r:?}");
        assert_eq!(
            r.header("location"),
            Some(format!("https://example.test{path}").as_str())
        );
        assert!(!r.has("connection"), "kept alive: {r:?}");
    }
    assert_eq!(a.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_over_tls_is_tunnelled_to_a_plain_backend() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    // A WebSocket echo backend, plain: pinlb terminates TLS and tunnels the bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if m.is_close() || ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let pki = Pki::new();
    let cert = pki.issue("a", &["a.test"], false);
    let proxy = Proxy::start_toml(&with_tls(
        &Setup::with(&[backend]),
        &tls_table(Some(&cert), &[]),
    ));
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let tls = connect(proxy.addr, "a.test", pki.client(&[version]))
            .await
            .expect("handshake")
            .into_inner();
        let (mut ws, resp) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::client_async("wss://a.test/chat", tls),
        )
        .await
        .expect("upgrade in time")
        .expect("upgrade");
        assert_eq!(resp.status(), 101);
        // Larger than one TLS record and one tunnel buffer, both ways.
        let big = vec![7u8; 300 * 1024];
        for m in [Message::text("hello"), Message::binary(big)] {
            ws.send(m.clone()).await.unwrap();
            let back = tokio::time::timeout(WAIT, ws.next())
                .await
                .expect("echo in time")
                .expect("a message")
                .expect("no error");
            assert_eq!(back, m);
        }
        ws.close(None).await.unwrap();
        let end = tokio::time::timeout(WAIT, async {
            // Bounded by the timeout: the close answer, then the end.
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
        assert!(end.is_ok(), "the tunnel closes after the close handshake");
    }
}
