//! TLS termination on listeners, end to end: certificates made here (a CA, an ECDSA P-256 and an
//! RSA server certificate), clients from tokio-rustls and curl, real sockets on loopback.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use http::Method;
use rustls::pki_types::pem::PemObject;
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

/// Whether `tool` is absent (`tool arg` cannot run); says the test is skipped then.
fn missing(tool: &str, arg: &str) -> bool {
    let absent = std::process::Command::new(tool).arg(arg).output().is_err();
    if absent {
        eprintln!("skipped: no {tool}");
    }
    absent
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

/// An SNI name with a fully qualified name's root dot (`b.test.`) picks the certificate for
/// `b.test`. rustls's client strips the dot before sending (RFC 6066 wants none), so OpenSSL's
/// `s_client`, which sends the name as given, speaks for the clients that keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sni_name_with_its_root_dot_picks_the_certificate_of_the_name() {
    if missing("openssl", "version") {
        return;
    }
    let pki = Pki::new();
    let b_cert = pki.issue("b", &["b.test"], false);
    let a = Backend::start("a").await;
    // No default certificate: a name that matches none is refused, so a handshake proves a match.
    let proxy = Proxy::start_toml(&with_tls(
        &Setup::with(&[a.addr]),
        &tls_table(None, &[&b_cert]),
    ));
    let handshake = |name: &'static str| {
        let (addr, ca) = (proxy.addr.to_string(), pki.ca_file());
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new("openssl")
                .args(["s_client", "-connect", &addr, "-servername", name])
                .arg("-CAfile")
                .arg(&ca)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("run openssl s_client");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    for name in ["b.test", "b.test.", "B.Test."] {
        let out = tokio::time::timeout(WAIT, handshake(name))
            .await
            .expect("openssl in time")
            .unwrap();
        assert!(
            out.contains("-----BEGIN CERTIFICATE-----")
                && out.contains("Verify return code: 0 (ok)"),
            "{name}: {out}"
        );
    }
    let out = tokio::time::timeout(WAIT, handshake("c.test."))
        .await
        .expect("openssl in time")
        .unwrap();
    assert!(out.contains("no peer certificate available"), "{out}");
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

/// What a TLS listener sends back on a raw connection given `bytes` as its first flight, read
/// until the listener closes it (bounded by `WAIT`).
async fn answer_to(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut conn = RawConn::open(addr).await;
    conn.send(bytes).await;
    tokio::time::timeout(WAIT, conn.read_until(|_| false))
        .await
        .expect("the connection was never closed")
}

/// A fatal `unexpected_message` alert as a TLS 1.2-framed record: content type alert (21),
/// legacy version 0x0303, length 2, level fatal (2), description unexpected_message (10).
const UNEXPECTED_MESSAGE: [u8; 7] = [21, 3, 3, 0, 2, 2, 10];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_handshake_message_other_than_a_client_hello_gets_an_unexpected_message_alert() {
    let pki = Pki::new();
    let a_cert = pki.issue("a", &["a.test"], false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    let proxy = Proxy::start_toml(&with_tls(&setup, &tls_table(Some(&a_cert), &[])));

    // A Finished (handshake type 20, 32 bytes of verify data) where the ClientHello belongs.
    let mut finished = vec![22, 3, 3, 0, 36, 20, 0, 0, 32];
    finished.extend_from_slice(&[0xab; 32]);
    // A well-formed ServerHello (type 2): version, random, empty session id, a suite, null
    // compression, no extensions.
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[0x5a; 32]);
    hello.extend_from_slice(&[0, 0x13, 0x01, 0]);
    let mut server_hello = vec![
        22,
        3,
        3,
        0,
        hello.len() as u8 + 4,
        2,
        0,
        0,
        hello.len() as u8,
    ];
    server_hello.extend_from_slice(&hello);
    for (what, bytes) in [("Finished", &finished), ("ServerHello", &server_hello)] {
        assert_eq!(
            answer_to(proxy.addr, bytes).await,
            UNEXPECTED_MESSAGE,
            "the answer to a {what} first"
        );
    }

    // Not a TLS record at all (content type 0): rustls's own fatal decode_error (50), as
    // before.
    let garbage = answer_to(proxy.addr, &[0u8, 1, 2, 3, 0xff, 0xfe, 0x16, 0x03]).await;
    assert_eq!(garbage, [21, 3, 3, 0, 2, 2, 50]);

    // The listener still serves, and each refusal counted as an invalid handshake.
    let mut conn = connect(proxy.addr, "a.test", pki.client(BOTH))
        .await
        .expect("handshake");
    assert_eq!(get_on(&mut conn, "/").await.status, 200);
    let m = proxy.metrics().await;
    assert_eq!(failures(&m, proxy.addr, "invalid"), 3.0);
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
    if missing("curl", "--version") {
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
    // A WebSocket echo backend, plain: pinlb terminates TLS and tunnels the bytes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(ws_echo(s));
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
        let (ws, resp) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::client_async("wss://a.test/chat", tls),
        )
        .await
        .expect("upgrade in time")
        .expect("upgrade");
        assert_eq!(resp.status(), 101);
        check_echo(ws).await;
    }
}

/// A WebSocket echo on `stream`: every message back until the close.
async fn ws_echo<S>(stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    while let Some(Ok(m)) = ws.next().await {
        if m.is_close() || ws.send(m).await.is_err() {
            return;
        }
    }
}

/// Sends a short text and a binary message larger than one TLS record and one tunnel buffer on
/// `ws`, checks that each comes back, then closes and waits for the end.
async fn check_echo<S>(mut ws: tokio_tungstenite::WebSocketStream<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
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

// ---------------------------------------------------------------------------------------------
// TLS to backends
// ---------------------------------------------------------------------------------------------

/// A TLS backend's rustls configuration: `cert`'s chain and key, TLS 1.3 and 1.2, and client
/// certificates from `clients` (a CA) required when given.
fn backend_tls(cert: &Cert, clients: Option<&Pki>) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::PrivateKeyDer;
    let chain = CertificateDer::pem_file_iter(&cert.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&cert.key).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(BOTH)
        .unwrap();
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(pki) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from(pki.ca.der().to_vec()))
                .unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    Arc::new(builder.with_single_cert(chain, key).unwrap())
}

/// An `[upstream.app.tls]` table with `keys`, for `Setup::extra`.
fn upstream_tls(keys: &str) -> String {
    format!("[upstream.app.tls]\n{keys}\n")
}

fn ca_file_key(pki: &Pki) -> String {
    format!("ca_file = {:?}", pki.ca_file())
}

/// A TLS backend `id` whose certificate, from `pki`, names 127.0.0.1 (and no host name).
async fn ip_backend(pki: &Pki, id: &str) -> Backend {
    Backend::start_tls(id, backend_tls(&pki.issue(id, &["127.0.0.1"], false), None)).await
}

/// A proxy setup for `backends` over TLS, trusting `pki`'s CA.
fn trusting(pki: &Pki, backends: &[SocketAddr]) -> Setup {
    let mut setup = Setup::with(backends);
    setup.extra += &upstream_tls(&ca_file_key(pki));
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_a_tls_backend_on_one_pooled_connection_after_one_handshake() {
    let pki = Pki::new();
    // No sni: the certificate must name the backend's address.
    let a = ip_backend(&pki, "a").await;
    let setup = trusting(&pki, &[a.addr]);
    let proxy = Proxy::start(&setup);
    // A fresh client connection each time: the reuse is the pool's.
    for i in 0..20 {
        let r = get(proxy.addr, &format!("/n{i}")).await;
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body, "hello from a\n");
    }
    // Bodies larger than a TLS record and the socket's buffers, both ways.
    let mut conn = Conn::open(proxy.addr).await;
    let up = conn
        .fetch(request(
            Method::POST,
            "/upload",
            GenBody::new(3 << 20, true).boxed(),
        ))
        .await;
    assert_eq!(up.status, 200, "{up:?}");
    assert_eq!(
        up.headers["x-body-bytes"],
        (3u64 << 20).to_string().as_str()
    );
    let chunked = conn
        .fetch(request(
            Method::POST,
            "/upload",
            GenBody::new(1 << 20, false).boxed(),
        ))
        .await;
    assert_eq!(
        chunked.headers["x-body-bytes"],
        (1u64 << 20).to_string().as_str()
    );
    let down = conn.get(&format!("/download/{}", 5 << 20)).await;
    assert_eq!(down.status, 200);
    assert_eq!(down.bytes.len(), 5 << 20);
    assert_eq!(
        a.accepts(),
        1,
        "every request went on the one pooled connection"
    );
    assert_eq!(
        a.handshakes(),
        vec![Handshake {
            sni: None,
            resumed: false,
            client_cert: false
        }],
        "no SNI is sent for an IP address"
    );
    assert_eq!(a.requests().len(), 23);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_to_a_tls_backend_resume_the_session() {
    let pki = Pki::new();
    let a = ip_backend(&pki, "a").await;
    // No pool: every request opens a connection.
    let mut setup = Setup::with(&[a.addr]);
    setup.keepalive = 0;
    setup.extra += &upstream_tls(&ca_file_key(&pki));
    let proxy = Proxy::start(&setup);
    for _ in 0..4 {
        assert_eq!(get(proxy.addr, "/").await.status, 200);
    }
    let resumed: Vec<bool> = a.handshakes().iter().map(|h| h.resumed).collect();
    assert_eq!(resumed, [false, true, true, true], "one full handshake");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_certificate_from_an_unknown_ca_fails_like_a_connect_and_is_logged() {
    let pki = Pki::new();
    let stranger = Pki::new();
    let bad = ip_backend(&stranger, "bad").await;
    let good = ip_backend(&pki, "good").await;
    let setup = trusting(&pki, &[bad.addr, good.addr]);
    let mut proxy = BinProxy::spawn(&setup).await;
    // Retried on the next backend, as a refused connect is.
    for _ in 0..4 {
        let r = get(proxy.addr, "/").await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    }
    let line = proxy
        .wait_for_log(&format!(
            "backend {} failed: TLS handshake failed: certificate verify failed: ",
            bad.addr
        ))
        .await;
    // Both test CAs have one name: the stranger's certificate names this CA as its issuer,
    // and its signature does not verify.
    assert!(line.contains("BadSignature"), "{line}");
    assert!(line.contains("trying the next backend"), "{line}");
    assert!(bad.handshakes().is_empty());
    assert_eq!(bad.hits(), 0);

    // Alone, it is a 502 that says why.
    let setup = trusting(&pki, &[bad.addr]);
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.contains("certificate verify failed"), "{r:?}");
    // The system's CA store does not know the test CA either.
    let mut setup = Setup::with(&[good.addr]);
    setup.extra += &upstream_tls("");
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.contains("UnknownIssuer"), "{r:?}");
    // Unless told not to verify.
    let mut setup = Setup::with(&[bad.addr]);
    setup.extra += &upstream_tls("insecure_skip_verify = true");
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "bad"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_is_sent_and_verified_and_a_wrong_name_is_refused() {
    let pki = Pki::new();
    let a = Backend::start_tls("a", backend_tls(&pki.issue("a", &["a.test"], false), None)).await;
    let proxy_with = |keys: &str| {
        let mut setup = Setup::with(&[a.addr]);
        setup.extra += &upstream_tls(&format!("{}\n{keys}", ca_file_key(&pki)));
        Proxy::start(&setup)
    };
    let right = proxy_with("sni = \"a.test\"");
    let r = get(right.addr, "/").await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(a.handshakes()[0].sni.as_deref(), Some("a.test"));

    for (keys, why) in [
        ("sni = \"b.test\"", "not valid for name"),
        // Without sni the certificate must name 127.0.0.1, which this one does not.
        ("", "not valid for name"),
    ] {
        let wrong = proxy_with(keys);
        let r = get(wrong.addr, "/").await;
        assert_eq!(r.status, 502, "{keys}: {r:?}");
        assert!(r.body.contains("certificate verify failed"), "{r:?}");
        assert!(r.body.contains(why), "{r:?}");
    }
    assert_eq!(
        a.handshakes().len(),
        1,
        "only the right name completed a handshake"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_shown_to_a_backend_that_requires_one() {
    let pki = Pki::new();
    let a = Backend::start_tls(
        "a",
        backend_tls(&pki.issue("ip", &["127.0.0.1"], false), Some(&pki)),
    )
    .await;
    let client = pki.issue("client", &["pinlb.client"], false);
    let mut setup = Setup::with(&[a.addr]);
    setup.extra += &upstream_tls(&format!(
        "{}\ncert = {:?}\nkey = {:?}",
        ca_file_key(&pki),
        client.cert,
        client.key
    ));
    let proxy = Proxy::start(&setup);
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    assert!(a.handshakes()[0].client_cert);

    let setup = trusting(&pki, &[a.addr]);
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "refused without one: {r:?}");
    assert_eq!(a.handshakes().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_go_over_tls_and_mark_the_backend_down_and_up() {
    let pki = Pki::new();
    let a = ip_backend(&pki, "a").await;
    let mut setup = trusting(&pki, &[a.addr]);
    setup.extra += "[upstream.app.health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nrise = 1\nfall = 1\n";
    let proxy = Proxy::start(&setup);
    // The backend speaks only TLS: a probe it counts came over TLS.
    a.wait_for_probes(2).await;
    assert!(a.handshakes().len() >= 2);
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    a.set_health(500);
    let down = poll(200, Duration::from_millis(20), async || {
        (get(proxy.addr, "/").await.status == 503).then_some(())
    })
    .await;
    assert!(down.is_some(), "marked down by a failing check over TLS");
    a.set_health(200);
    let up = poll(200, Duration::from_millis(20), async || {
        (get(proxy.addr, "/").await.status == 200).then_some(())
    })
    .await;
    assert!(up.is_some(), "marked up again by a passing check over TLS");
    // Probes resume their sessions like requests do.
    assert!(a.handshakes().iter().skip(1).all(|h| h.resumed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_against_an_unverifiable_backend_fails_naming_the_cause() {
    let stranger = Pki::new();
    let pki = Pki::new();
    let a = ip_backend(&stranger, "a").await;
    let mut setup = trusting(&pki, &[a.addr]);
    setup.extra += "[upstream.app.health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nrise = 1\nfall = 1\n";
    let mut proxy = BinProxy::spawn(&setup).await;
    let line = proxy
        .wait_for_log(&format!("backend {} DOWN after 1 failed checks", a.addr))
        .await;
    assert!(
        line.contains("TLS handshake failed: certificate verify failed"),
        "{line}"
    );
    assert_eq!(a.probes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_is_tunnelled_to_a_tls_backend() {
    let pki = Pki::new();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(backend_tls(&pki.issue("ip", &["127.0.0.1"], false), None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    ws_echo(tls).await;
                }
            });
        }
    });
    let setup = trusting(&pki, &[backend]);
    let proxy = Proxy::start(&setup);
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (ws, resp) = tokio::time::timeout(
        WAIT,
        tokio_tungstenite::client_async("ws://a.test/chat", tcp),
    )
    .await
    .expect("upgrade in time")
    .expect("upgrade");
    assert_eq!(resp.status(), 101);
    check_echo(ws).await;
}

#[test]
fn upstream_tls_config_errors_name_the_file_and_the_place() {
    let pki = Pki::new();
    let client = pki.issue("client", &["pinlb.client"], false);
    let parse = |keys: &str| {
        let mut setup = Setup::with(&["127.0.0.1:1".parse().unwrap()]);
        setup.extra += &upstream_tls(keys);
        let toml = setup.toml();
        let line = toml
            .lines()
            .position(|l| l == "[upstream.app.tls]")
            .unwrap()
            + 2;
        (pinlb::Config::parse("test.toml", &toml, &allowed()), line)
    };
    let (ok, _) = parse(&format!(
        "{}\nsni = \"api.internal\"\ncert = {:?}\nkey = {:?}",
        ca_file_key(&pki),
        client.cert,
        client.key
    ));
    let plan = pinlb_tools::check::describe(&ok.expect("valid"));
    assert!(
        plan.contains(&format!(
            "  TLS to backends: verified against {} (1 CA certificates), sni api.internal, client certificate {}",
            pki.ca_file().display(),
            client.cert.display()
        )),
        "{plan}"
    );
    let (ok, _) = parse("");
    let plan = pinlb_tools::check::describe(&ok.expect("the system's CA store"));
    assert!(
        plan.contains("TLS to backends: verified against the system's CA store"),
        "{plan}"
    );

    let missing = pki.dir.join("missing.pem");
    let (e, line) = parse(&format!("ca_file = {missing:?}"));
    let e = e.unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "test.toml:{line}:11: upstream.app.tls.ca_file: cannot read {}",
            missing.display()
        )),
        "{e}"
    );
    // A key is not a CA bundle.
    let (e, _) = parse(&format!("ca_file = {:?}", client.key));
    let e = e.unwrap_err().to_string();
    assert!(e.contains("upstream.app.tls.ca_file: "), "{e}");
    assert!(e.contains(&client.key.display().to_string()), "{e}");
    assert!(e.contains("no certificate in it"), "{e}");

    let (e, line) = parse(&format!("cert = {:?}", client.cert));
    let e = e.unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "test.toml:{line}:8: upstream.app.tls.key: missing"
        )),
        "{e}"
    );
    let other = pki.issue("other", &["other"], true);
    let (e, _) = parse(&format!("cert = {:?}\nkey = {:?}", client.cert, other.key));
    let e = e.unwrap_err().to_string();
    assert!(e.contains("upstream.app.tls.key: "), "{e}");
    assert!(e.contains("does not match"), "{e}");

    for (keys, want) in [
        (
            format!("{}\ninsecure_skip_verify = true", ca_file_key(&pki)),
            "upstream.app.tls.ca_file: set together with insecure_skip_verify = true",
        ),
        (
            "sni = \"10.0.0.1\"".to_string(),
            "upstream.app.tls.sni: \"10.0.0.1\" is an IP address",
        ),
        (
            "sni = \"not a name\"".to_string(),
            "upstream.app.tls.sni: \"not a name\" is not a valid host name",
        ),
        ("verify = false".to_string(), "unknown field `verify`"),
        (
            "insecure_skip_verify = \"yes\"".to_string(),
            "upstream.app.tls.insecure_skip_verify",
        ),
    ] {
        let (e, _) = parse(&keys);
        let e = e.unwrap_err().to_string();
        assert!(e.contains(want), "{keys}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_the_backend_never_answers_is_bounded_by_the_connect_timeout() {
    // Accepts, then holds every connection without a byte of TLS.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            open.push(s);
        }
    });
    let mut setup = Setup::with(&[addr]);
    setup.connect_timeout = "300ms";
    setup.extra += &upstream_tls("insecure_skip_verify = true");
    let proxy = Proxy::start(&setup);
    let start = Instant::now();
    let r = get(proxy.addr, "/").await;
    let took = start.elapsed();
    assert_eq!(r.status, 502, "{r:?}");
    assert!(
        r.body.contains("TLS handshake timed out after 300ms"),
        "{r:?}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_backend_tls_settings_drops_the_pooled_connections() {
    let pki = Pki::new();
    let stranger = Pki::new();
    let a = ip_backend(&pki, "a").await;
    let mut setup = trusting(&pki, &[a.addr]);
    with_admin(&mut setup);
    let proxy = Proxy::start_file(&setup.toml());
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    // The same settings keep the pooled connection.
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    assert_eq!(a.accepts(), 1, "the pooled connection went on serving");
    // Another CA: the connection verified against the old one carries no request.
    let mut other = trusting(&stranger, &[a.addr]);
    with_admin(&mut other);
    proxy.rewrite(&other.toml());
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.contains("certificate verify failed"), "{r:?}");
}
