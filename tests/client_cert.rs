//! Client certificates on a TLS listener, end to end: a client CA, client certificates (good,
//! expired, from another CA, revoked by a CRL) made here; curl for the requests and the lines
//! the backend gets, `openssl s_client` for the alerts a refused client sees.

use crate::common;

use std::path::Path;

use common::*;
use http::Method;

/// The server's PKI (its certificate for `a.test`) and the clients' CA apart.
struct Pkis {
    server: Pki,
    server_cert: Cert,
    clients: Pki,
}

impl Pkis {
    fn new() -> Pkis {
        let server = Pki::new();
        let server_cert = server.issue("a", &["a.test"], false);
        Pkis {
            server,
            server_cert,
            clients: Pki::named("pinlb test client CA"),
        }
    }

    /// `setup`'s TOML with a `[listener.tls]` asking for client certificates, `more` keys
    /// added to it.
    fn toml(&self, setup: &Setup, more: &str) -> String {
        let tls = format!(
            "[listener.tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n{more}",
            self.server_cert.cert,
            self.server_cert.key,
            self.clients.ca_file()
        );
        setup.toml().replacen(
            "upstream = \"app\"\n",
            &format!("upstream = \"app\"\n{tls}"),
            1,
        )
    }
}

fn with_admin(setup: &mut Setup) {
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
}

/// Whether `tool` is absent; says the test is skipped then.
fn missing(tool: &str, arg: &str) -> bool {
    let absent = std::process::Command::new(tool).arg(arg).output().is_err();
    if absent {
        eprintln!("skipped: no {tool}");
    }
    absent
}

/// curl to `https://a.test:PORT/path` trusting the server's CA, with `args`: the status (and
/// `000` when the handshake failed) and curl's stderr.
async fn curl(s: &Pkis, port: u16, path: &str, args: Vec<String>) -> (String, String) {
    let ca = s.server.ca_file();
    let resolve = format!("a.test:{port}:127.0.0.1");
    let url = format!("https://a.test:{port}{path}");
    let out = tokio::time::timeout(
        WAIT,
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "--max-time", "10", "-o", "/dev/null"])
                .args(["-w", "%{http_code}"])
                .args(args)
                .arg("--cacert")
                .arg(&ca)
                .args(["--resolve", &resolve, &url])
                .output()
                .expect("run curl")
        }),
    )
    .await
    .expect("curl in time")
    .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn cert_args(c: &Cert) -> Vec<String> {
    vec![
        "--cert".into(),
        c.cert.display().to_string(),
        "--key".into(),
        c.key.display().to_string(),
    ]
}

/// `openssl s_client` with `cert` (or none) over `version` (`-tls1_2`, `-tls1_3`), sending one
/// request so that a TLS 1.3 client, whose handshake ends before the server has read its
/// certificate, reads the server's answer or alert: what it printed, stdout and stderr.
async fn s_client(s: &Pkis, port: u16, cert: Option<&Cert>, version: &str) -> String {
    let mut args: Vec<String> = vec![
        "s_client".into(),
        "-connect".into(),
        format!("127.0.0.1:{port}"),
        "-servername".into(),
        "a.test".into(),
        "-CAfile".into(),
        s.server.ca_file().display().to_string(),
        "-ign_eof".into(),
        version.into(),
    ];
    if let Some(c) = cert {
        args.extend(cert_args(c).into_iter().map(|a| a.replace("--", "-")));
    }
    let out = tokio::time::timeout(
        WAIT,
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = std::process::Command::new("openssl")
                .args(&args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run openssl s_client");
            let mut stdin = child.stdin.take().unwrap();
            let _ = stdin.write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
            drop(stdin);
            child.wait_with_output().expect("openssl output")
        }),
    )
    .await
    .expect("openssl in time")
    .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn refused(m: &Metrics, addr: std::net::SocketAddr) -> f64 {
    m.value(
        "pinlb_refused_total",
        &format!("listener=\"{addr}\",cause=\"client_cert\""),
    )
}

fn tls_failed(m: &Metrics, addr: std::net::SocketAddr) -> f64 {
    m.value(
        "pinlb_tls_handshake_failures_total",
        &format!("listener=\"{addr}\",reason=\"client_cert\""),
    )
}

/// The proxy's metrics once `counted` holds for them, scraped again until it does (at most
/// 250 times, 20 ms apart): a refused handshake is counted just after its alert is written, so
/// a client that has read the alert can scrape before the last refusal is counted.
async fn metrics_once(proxy: &Proxy, counted: impl Fn(&Metrics) -> bool) -> Metrics {
    let mut m = proxy.metrics().await;
    for _ in 0..250 {
        if counted(&m) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        m = proxy.metrics().await;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_certificate_reaches_the_backend_as_headers_over_http1_and_http2_and_forged_ones_are_stripped()
 {
    if missing("curl", "--version") {
        return;
    }
    let s = Pkis::new();
    let alice = s.clients.issue_client("alice", "alice", 0x9a10, false);
    let a = Backend::start("a").await;
    let log = temp_config("");
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = format!(
        "[log]\naccess = \"{}\"\nformat = \"{{ssl_client_verify}} {{ssl_client_serial}} {{ssl_client_s_dn}}\"\n",
        log.display()
    );
    let proxy = Proxy::start_toml(&s.toml(&setup, CLIENT_CERT_HEADERS));
    let port = proxy.addr.port();
    for http in ["--http1.1", "--http2"] {
        let mut args = cert_args(&alice);
        args.extend(
            [
                http,
                "-H",
                "X-Client-Subject: CN=mallory",
                "-H",
                "x-client-verify: SUCCESS",
            ]
            .map(String::from),
        );
        let (status, err) = curl(&s, port, "/who", args).await;
        assert_eq!(status, "200", "{http}: {err}");
        let seen = a.requests().pop().unwrap();
        assert_eq!(
            seen.one("x-client-subject").as_deref(),
            Some("CN=alice,O=Example\\, Inc"),
            "{http}"
        );
        assert_eq!(
            seen.one("x-client-san").as_deref(),
            Some("DNS:alice.clients.test, email:alice@example.test")
        );
        assert_eq!(seen.one("x-client-verify").as_deref(), Some("SUCCESS"));
        assert_eq!(seen.one("x-client-serial").as_deref(), Some("9A10"));
    }
    proxy.join(WAIT).await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        // The log escapes a backslash as nginx's does.
        ["SUCCESS 9A10 CN=alice,O=Example\\x5C, Inc"; 2],
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_refuses_a_missing_expired_foreign_or_revoked_certificate_with_its_alert() {
    if missing("openssl", "version") || missing("curl", "--version") {
        return;
    }
    let s = Pkis::new();
    let good = s.clients.issue_client("good", "good", 1, false);
    let expired = s.clients.issue_client("expired", "old", 2, true);
    let revoked = s.clients.issue_client("revoked", "gone", 3, false);
    let other = Pki::named("another CA");
    let foreign = other.issue_client("foreign", "eve", 4, false);
    let crl = s.clients.dir.join("crl.pem");
    s.clients.write_crl(&crl, &[3]);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    let proxy =
        Proxy::start_toml(&s.toml(&setup, &format!("crl = {crl:?}\n{CLIENT_CERT_HEADERS}")));
    let port = proxy.addr.port();

    let (status, err) = curl(&s, port, "/", cert_args(&good)).await;
    assert_eq!(status, "200", "{err}");
    assert!(
        s_client(&s, port, Some(&good), "-tls1_3")
            .await
            .contains("HTTP/1.1 200")
    );

    // TLS 1.3 has an alert for a certificate not sent; the others name the fault.
    let out = s_client(&s, port, None, "-tls1_3").await;
    assert!(out.contains("alert certificate required"), "{out}");
    for (cert, alert) in [
        (&expired, "alert certificate expired"),
        (&foreign, "alert unknown ca"),
        (&revoked, "alert certificate revoked"),
    ] {
        for version in ["-tls1_2", "-tls1_3"] {
            let out = s_client(&s, port, Some(cert), version).await;
            assert!(out.contains(alert), "{alert} {version}: {out}");
            assert!(!out.contains("HTTP/1.1 200"), "{out}");
        }
    }
    assert_eq!(
        a.hits(),
        2,
        "only the good certificate's requests got through"
    );
    let m = metrics_once(&proxy, |m| {
        refused(m, proxy.addr) >= 7.0 && tls_failed(m, proxy.addr) >= 7.0
    })
    .await;
    assert_eq!(refused(&m, proxy.addr), 7.0);
    assert_eq!(tls_failed(&m, proxy.addr), 7.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_serves_a_client_without_a_certificate_as_verify_none_and_still_strips_the_headers()
 {
    if missing("curl", "--version") || missing("openssl", "version") {
        return;
    }
    let s = Pkis::new();
    let bob = s.clients.issue_client("bob", "bob", 7, false);
    let other = Pki::named("another CA");
    let foreign = other.issue_client("foreign", "eve", 8, false);
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&s.toml(
        &Setup::with(&[a.addr]),
        &format!("client_auth = \"optional\"\n{CLIENT_CERT_HEADERS}"),
    ));
    let port = proxy.addr.port();
    let forged = [
        "-H",
        "X-Client-Subject: CN=bob",
        "-H",
        "X-Client-Serial: 07",
    ]
    .map(String::from);
    let (status, err) = curl(&s, port, "/anon", forged.to_vec()).await;
    assert_eq!(status, "200", "{err}");
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.one("x-client-verify").as_deref(), Some("NONE"));
    assert_eq!(seen.one("x-client-subject"), None);
    assert_eq!(seen.one("x-client-serial"), None);
    assert_eq!(seen.one("x-client-san"), None);

    let (status, err) = curl(&s, port, "/bob", cert_args(&bob)).await;
    assert_eq!(status, "200", "{err}");
    let seen = a.requests().pop().unwrap();
    assert_eq!(
        seen.one("x-client-subject").as_deref(),
        Some("CN=bob,O=Example\\, Inc")
    );
    assert_eq!(seen.one("x-client-verify").as_deref(), Some("SUCCESS"));

    // A certificate that does not verify is refused even so (rustls's choice, see the docs).
    let out = s_client(&s, port, Some(&foreign), "-tls1_2").await;
    assert!(out.contains("alert unknown ca"), "{out}");
    assert_eq!(a.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_new_crl_refuses_the_revoked_certificate_on_its_next_handshake() {
    if missing("curl", "--version") {
        return;
    }
    let s = Pkis::new();
    let carol = s.clients.issue_client("carol", "carol", 21, false);
    let crl = s.clients.dir.join("crl.pem");
    s.clients.write_crl(&crl, &[]);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    with_admin(&mut setup);
    let proxy = Proxy::start_file(&s.toml(&setup, &format!("crl = {crl:?}\n")));
    let port = proxy.addr.port();
    let (status, err) = curl(&s, port, "/", cert_args(&carol)).await;
    assert_eq!(status, "200", "{err}");

    s.clients.write_crl(&crl, &[21]);
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Over TLS 1.2, where the alert comes within the handshake curl waits for (over TLS 1.3
    // curl's handshake is done before pinlb reads the certificate).
    let mut tls12 = cert_args(&carol);
    tls12.extend(["--tls-max", "1.2"].map(String::from));
    let (status, err) = curl(&s, port, "/", tls12).await;
    assert_eq!(status, "000", "refused after the reload: {err}");
    assert!(err.contains("alert certificate revoked"), "{err}");

    // A CRL file that is no longer PEM fails the reload at its key; the running one stays.
    std::fs::write(&crl, "not a crl").unwrap();
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_ne!(r.status, 200);
    assert!(r.body.contains("listener[0].tls.crl: "), "{}", r.body);
    let (status, _) = curl(&s, port, "/", cert_args(&carol)).await;
    assert_eq!(status, "000");
    let m = proxy.metrics().await;
    assert_eq!(refused(&m, proxy.addr), 2.0);
}

#[test]
fn client_certificate_config_errors_name_the_key_and_the_place() {
    let s = Pkis::new();
    let setup = Setup::with(&["127.0.0.1:1".parse().unwrap()]);
    let parse = |toml: &str| pinlb::Config::parse("test.toml", toml, &allowed());
    let ok = s.toml(
        &setup,
        &format!("client_auth = \"optional\"\n{CLIENT_CERT_HEADERS}"),
    );
    assert!(parse(&ok).is_ok(), "{:?}", parse(&ok).err());

    let garbage = s.clients.dir.join("garbage.pem");
    std::fs::write(&garbage, "hello").unwrap();
    let missing = s.clients.dir.join("missing.pem");
    let with_ca = |ca: &Path, more: &str| {
        s.toml(&setup, more)
            .replace(&format!("{:?}", s.clients.ca_file()), &format!("{ca:?}"))
    };
    for (toml, want) in [
        (
            with_ca(&missing, ""),
            "listener[0].tls.client_ca: cannot read ".to_string(),
        ),
        (
            with_ca(&garbage, ""),
            "listener[0].tls.client_ca: ".to_string() + &garbage.display().to_string() + ": no certificate",
        ),
        (
            s.toml(&setup, &format!("crl = {garbage:?}\n")),
            "listener[0].tls.crl: ".to_string() + &garbage.display().to_string() + ": no CRL",
        ),
        (
            s.toml(&setup, "client_auth = \"maybe\"\n"),
            "listener[0].tls.client_auth: \"maybe\" is not a mode".into(),
        ),
        (
            s.toml(&setup, "verify_depth = 2\n"),
            "unknown field `verify_depth`".into(),
        ),
        (
            s.toml(&setup, "client_cert_headers = { subject = \"X Bad\" }\n"),
            "listener[0].tls.client_cert_headers.subject: \"X Bad\" is not a header name".into(),
        ),
        (
            s.toml(&setup, "client_cert_headers = { subject = \"X-A\", san = \"x-a\" }\n"),
            "listener[0].tls.client_cert_headers.san: \"x-a\" is named twice".into(),
        ),
        (
            s.toml(&setup, "client_cert_headers = { verify = \"X-Forwarded-For\" }\n"),
            "listener[0].tls.client_cert_headers.verify: \"X-Forwarded-For\" is a header pinlb writes itself".into(),
        ),
        (
            s.toml(&setup, "client_cert_headers = { subjekt = \"X-A\" }\n"),
            "unknown field `subjekt`".into(),
        ),
    ] {
        let e = parse(&toml).unwrap_err().to_string();
        assert!(e.contains(&want), "want {want}\ngot {e}");
        assert!(e.starts_with("test.toml:"), "{e}");
    }
    // The keys need client_ca.
    let toml = s
        .toml(&setup, "client_auth = \"optional\"\n")
        .replace(&format!("client_ca = {:?}\n", s.clients.ca_file()), "");
    let e = parse(&toml).unwrap_err().to_string();
    assert!(
        e.contains("listener[0].tls.client_auth: set without client_ca"),
        "{e}"
    );
}

/// A resumed session carries the certificate verified when it began: the backend gets the same
/// subject on a resumed connection (TLS 1.3 tickets and the TLS 1.2 cache), across two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_keeps_its_verified_certificate() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncWriteExt, BufReader};

    let s = Pkis::new();
    let dave = s.clients.issue_client("dave", "dave", 44, false);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.cpus = allowed().into_iter().take(2).collect();
    let proxy = Proxy::start_toml(&s.toml(&setup, CLIENT_CERT_HEADERS));
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(s.server.ca.der().to_vec()))
            .unwrap();
        let chain = vec![CertificateDer::from_pem_file(&dave.cert).unwrap()];
        let key = PrivateKeyDer::from_pem_file(&dave.key).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[version])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = std::sync::Arc::new(config);
        let mut kinds = Vec::new();
        for i in 0..4 {
            let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
            let name = ServerName::try_from("a.test").unwrap();
            let tls = tokio::time::timeout(
                WAIT,
                tokio_rustls::TlsConnector::from(config.clone()).connect(name, tcp),
            )
            .await
            .expect("a handshake in time")
            .unwrap();
            kinds.push(tls.get_ref().1.handshake_kind());
            let mut conn = BufReader::new(tls);
            let req = format!("GET /{i} HTTP/1.1\r\nHost: a.test\r\n\r\n");
            conn.get_mut().write_all(req.as_bytes()).await.unwrap();
            let r = tokio::time::timeout(WAIT, read_response(&mut conn, false))
                .await
                .expect("a response in time");
            assert_eq!(r.status, 200, "{version:?} {i}");
            let seen = a.requests().pop().unwrap();
            assert_eq!(
                seen.one("x-client-subject").as_deref(),
                Some("CN=dave,O=Example\\, Inc"),
                "{version:?} {i} ({:?})",
                kinds.last()
            );
            assert_eq!(seen.one("x-client-verify").as_deref(), Some("SUCCESS"));
        }
        assert!(
            kinds[1..]
                .iter()
                .all(|k| *k == Some(rustls::HandshakeKind::Resumed)),
            "{version:?}: {kinds:?}"
        );
    }
}

/// A refused handshake is logged as a warning naming the client and the cause, once per client
/// per second: a second refusal within the second is summed into the next line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_certificate_is_logged_with_the_client_and_the_cause_once_a_second() {
    if missing("openssl", "version") {
        return;
    }
    let s = Pkis::new();
    let expired = s.clients.issue_client("expired", "old", 9, true);
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.cpus = allowed().into_iter().take(1).collect();
    let mut pinlb = BinProxy::spawn_toml(&s.toml(&setup, ""), &[]).await;
    let port = pinlb.addr.port();
    for _ in 0..2 {
        let out = s_client(&s, port, Some(&expired), "-tls1_2").await;
        assert!(out.contains("alert certificate expired"), "{out}");
    }
    let line = pinlb
        .wait_for_log("refused the TLS handshake of 127.0.0.1: client certificate refused")
        .await;
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("client certificate refused: certificate expired client=127.0.0.1:"),
        "{line}"
    );
    let summed = pinlb.wait_for_log("1 more in the last").await;
    assert!(summed.contains("127.0.0.1"), "{summed}");
    let written = pinlb
        .log()
        .iter()
        .filter(|l| l.contains("refused the TLS handshake of 127.0.0.1"))
        .count();
    assert_eq!(written, 2, "the first, then the sum: {:?}", pinlb.log());
}
