//! Every listener and route feature over each protocol pinlb serves clients: one test body per
//! feature, run by [`each_proto!`] over HTTP/1.1, h2c and HTTP/2 over TLS (HTTP/1.1 and h2c
//! only for a plain listener's `redirect_https`; HTTP/1.1 and HTTP/2 over TLS for client
//! certificates). Each body checks that the feature worked (the backend saw the header, the
//! body decompresses to what was sent…) and what must not depend on the protocol: the status,
//! the response's header names less the hop-by-hop ones and Date ([`Reply::header_names`]), the
//! body, and the access-log line ([`LogLine`]: the same method, target, status, bytes and
//! backend, its protocol the request's, and the request ID the response carried).
//!
//! Real backends, a real pinlb and hyper's clients on loopback.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use common::*;
use http::{Method, StatusCode};

/// A pinlb for one protocol, with an access log of [`LogLine::FORMAT`] (so request IDs are on,
/// as they are by default with a log).
struct Run {
    proto: Proto,
    pki: Pki,
    proxy: Proxy,
    log: PathBuf,
}

impl Run {
    /// Starts pinlb on `setup` (made by [`Setup::for_proto`] with `pki`) and its log.
    fn start(proto: Proto, pki: Pki, setup: Setup) -> Run {
        let (setup, log) = with_fields_log(setup);
        Run {
            proto,
            pki,
            proxy: Proxy::start(&setup),
            log,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.proxy.addr
    }

    async fn client(&self) -> Client {
        Client::open(self.proto, self.proxy.addr, &self.pki).await
    }

    /// Stops pinlb and reads its log: one line per reply in `replies`, in order, each with the
    /// request ID the reply carried, and `want` (`method target status bytes backend`, the
    /// bytes being the reply's body as it arrived).
    async fn expect_log(self, replies: &[&Reply], want: &[String]) {
        let lines = log_lines(self.proxy, &self.log, self.proto).await;
        let got: Vec<String> = lines.iter().map(LogLine::request).collect();
        assert_eq!(got, want, "{lines:?}");
        assert_eq!(lines.len(), replies.len(), "{lines:?}");
        for (line, reply) in lines.iter().zip(replies) {
            assert_eq!(line.bytes, reply.bytes.len() as u64, "{line:?} {reply:?}");
            assert_eq!(
                line.request_id,
                reply.one("x-request-id"),
                "the log's request ID is the response's: {line:?} {reply:?}"
            );
        }
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The header names of [`Backend`]'s text answers once proxied.
const PROXIED: [&str; 5] = [
    "content-length",
    "content-type",
    "x-backend",
    "x-body-bytes",
    "x-request-id",
];

/// The header names of pinlb's own text answers.
const LOCAL: [&str; 3] = ["content-length", "content-type", "x-request-id"];

/// The content type of pinlb's own text answers.
const TEXT: &str = "text/plain; charset=utf-8";

/// `GET path` with `headers` added.
fn get_with(path: &str, headers: &[(&str, &str)]) -> http::Request<ClientBody> {
    let mut req = request(Method::GET, path, empty());
    for (k, v) in headers {
        req.headers_mut().append(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    req
}

/// The bytes [`GenBody`] (and so the backend's `/download/N`) makes: the first `len`.
fn generated(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i % (64 * 1024)) % 251) as u8).collect()
}

/// A fresh path under cargo's scratch directory.
fn scratch(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pinlb-protocols-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ))
}

/// A 32-digit lower-case hex ID, as pinlb makes them.
fn assert_made_id(id: &str) {
    assert!(
        id.len() == 32
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{id}"
    );
}

// ---------------------------------------------------------------------------------------------
// access, auth_basic
// ---------------------------------------------------------------------------------------------

async fn access_rules_answer_403_before_any_backend_and_a_routes_own_let_the_client_in(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "access = [\"allow 127.0.0.2\", \"deny all\"]\n\
        [[listener.route]]\npath = \"/open/\"\nupstream = \"app\"\n\
        access = [\"allow 127.0.0.1\", \"deny all\"]\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let denied = c.get("/secret").await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{denied:?}");
    assert_eq!(denied.body, "403 Forbidden: this address is not allowed\n");
    assert_eq!(denied.one("content-type"), TEXT);
    assert_eq!(denied.header_names(), names(&LOCAL), "{denied:?}");
    assert_eq!(a.hits(), 0);

    let open = c.get("/open/x").await;
    assert_eq!(
        (open.status, open.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(open.header_names(), names(&PROXIED), "{open:?}");
    assert_eq!(a.hits(), 1);
    drop(c);
    run.expect_log(
        &[&denied, &open],
        &[
            "GET /secret 403 43 -".into(),
            format!("GET /open/x 200 13 {}", a.addr),
        ],
    )
    .await;
}
each_proto!(access_rules_answer_403_before_any_backend_and_a_routes_own_let_the_client_in);

async fn basic_auth_answers_401_with_its_challenge_then_lets_good_credentials_through(p: Proto) {
    let a = Backend::start("a").await;
    let users = scratch("htpasswd");
    std::fs::write(&users, "alice:{PLAIN}open sesame\n").unwrap();
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys +=
        &format!("auth_basic = {{ realm = \"Staff only\", user_file = {users:?} }}\n");
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;
    let basic = |creds: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(creds)
        )
    };
    let challenge = "Basic realm=\"Staff only\", charset=\"UTF-8\"";

    let none = c.get("/private").await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{none:?}");
    assert_eq!(none.body, "401 Unauthorized: credentials required\n");
    assert_eq!(none.one("www-authenticate"), challenge);
    let mut want = names(&LOCAL);
    want.insert("www-authenticate".into());
    assert_eq!(none.header_names(), want, "{none:?}");

    let wrong = c
        .fetch(get_with(
            "/private",
            &[("authorization", &basic("alice:guess"))],
        ))
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    assert_eq!(wrong.body, "401 Unauthorized: wrong credentials\n");
    assert_eq!(wrong.one("www-authenticate"), challenge);
    assert_eq!(wrong.header_names(), want, "{wrong:?}");
    assert_eq!(a.hits(), 0);

    let good = c
        .fetch(get_with(
            "/private",
            &[("authorization", &basic("alice:open sesame"))],
        ))
        .await;
    assert_eq!(
        (good.status, good.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(good.header_names(), names(&PROXIED), "{good:?}");
    assert_eq!(a.hits(), 1);
    drop(c);
    let _ = std::fs::remove_file(&users);
    run.expect_log(
        &[&none, &wrong, &good],
        &[
            "GET /private 401 39 -".into(),
            "GET /private 401 36 -".into(),
            format!("GET /private 200 13 {}", a.addr),
        ],
    )
    .await;
}
each_proto!(basic_auth_answers_401_with_its_challenge_then_lets_good_credentials_through);

// ---------------------------------------------------------------------------------------------
// rate_limit, conn_limit
// ---------------------------------------------------------------------------------------------

async fn a_request_over_the_rate_limit_gets_its_status_and_retry_after(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "rate_limit = [{ zone = \"one\", status = 429 }]\n";
    setup.extra += "[limit.one]\nkey = \"client_ip\"\nrate = \"1r/m\"\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let first = c.get("/a").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(first.header_names(), names(&PROXIED), "{first:?}");

    let over = c.get("/b").await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS, "{over:?}");
    let retry: u64 = over.one("retry-after").parse().expect("whole seconds");
    assert!((1..=60).contains(&retry), "{over:?}");
    assert!(
        over.body
            .starts_with("429 Too Many Requests: over the request rate of zone one ("),
        "{over:?}"
    );
    assert_eq!(over.one("content-type"), TEXT);
    let mut want = names(&LOCAL);
    want.insert("retry-after".into());
    assert_eq!(over.header_names(), want, "{over:?}");
    assert_eq!(a.hits(), 1, "the refused request reached no backend");
    drop(c);
    let over_line = format!("GET /b 429 {} -", over.bytes.len());
    run.expect_log(
        &[&first, &over],
        &[format!("GET /a 200 13 {}", a.addr), over_line],
    )
    .await;
}
each_proto!(a_request_over_the_rate_limit_gets_its_status_and_retry_after);

/// The limit counts connections, not requests: on HTTP/2 the one connection within the
/// limit carries every stream, and a second connection is closed whatever its protocol.
async fn a_connection_over_conn_limit_is_closed_and_one_within_it_carries_every_request(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "conn_limit = { max = 1 }\n";
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;
    let mut replies = Vec::new();
    for i in 0..3 {
        let r = c.get(&format!("/in/{i}")).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (StatusCode::OK, "hello from a\n")
        );
        assert_eq!(r.header_names(), names(&PROXIED), "{r:?}");
        replies.push(r);
    }

    // A second connection while the first is open: closed before a byte is read, so the
    // handshake (TLS), the preface exchange (h2c) or the request (HTTP/1.1) fails.
    let refused = async {
        let mut second = Client::try_open(p, run.addr(), &run.pki, None).await?;
        let r = tokio::time::timeout(
            WAIT,
            second.try_send(request(Method::GET, "/over", empty())),
        )
        .await
        .expect("the second connection answered or closed in time")
        .map_err(|e| e.to_string())?;
        let reply = Reply::read(r).await;
        Ok::<Reply, String>(reply)
    }
    .await;
    assert!(
        refused.is_err(),
        "a connection over the limit was served: {refused:?}"
    );
    let labels = format!("listener=\"{}\",cause=\"conn_limit\"", run.addr());
    let counted = poll(100, Duration::from_millis(20), async || {
        let v = run
            .proxy
            .metrics()
            .await
            .get("pinlb_refused_total", &labels);
        (v == Some(1.0)).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "{:?}",
        run.proxy
            .metrics()
            .await
            .get("pinlb_refused_total", &labels)
    );
    // And the first connection goes on.
    let r = c.get("/in/3").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    replies.push(r);

    // Once it is closed, a new connection is served (pinlb sees the close on its own time).
    drop(c);
    let after = poll(100, Duration::from_millis(50), async || {
        let mut c = Client::try_open(p, run.addr(), &run.pki, None).await.ok()?;
        let r = tokio::time::timeout(WAIT, c.try_send(request(Method::GET, "/after", empty())))
            .await
            .ok()?
            .ok()?;
        Some(Reply::read(r).await)
    })
    .await
    .expect("a new connection is served once the first is closed");
    assert_eq!(
        (after.status, after.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(after.header_names(), names(&PROXIED), "{after:?}");
    assert_eq!(a.hits(), 5);
    replies.push(after);
    let b = a.addr;
    run.expect_log(
        &replies.iter().collect::<Vec<_>>(),
        &[
            format!("GET /in/0 200 13 {b}"),
            format!("GET /in/1 200 13 {b}"),
            format!("GET /in/2 200 13 {b}"),
            format!("GET /in/3 200 13 {b}"),
            format!("GET /after 200 13 {b}"),
        ],
    )
    .await;
}
each_proto!(a_connection_over_conn_limit_is_closed_and_one_within_it_carries_every_request);

// ---------------------------------------------------------------------------------------------
// Client certificates (TLS only)
// ---------------------------------------------------------------------------------------------

async fn a_client_certificate_reaches_the_backend_as_headers_and_forged_ones_are_removed(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let clients = Pki::named("pinlb test client CA");
    let alice = clients.issue_client("alice", "alice", 0x9a10, false);
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    let tls = setup.tls.as_mut().expect("a TLS listener");
    tls.push_str(&format!(
        "client_ca = {:?}\nclient_auth = \"optional\"\n{CLIENT_CERT_HEADERS}",
        clients.ca_file()
    ));
    let run = Run::start(p, pki, setup);
    let forged = [
        ("x-client-subject", "CN=mallory"),
        ("x-client-verify", "SUCCESS"),
        ("x-client-serial", "01"),
        ("x_client_san", "DNS:mallory.test"),
    ];

    let mut with_cert = Client::open_with_cert(p, run.addr(), &run.pki, &alice).await;
    let shown = with_cert.fetch(get_with("/who", &forged)).await;
    assert_eq!(
        (shown.status, shown.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(shown.header_names(), names(&PROXIED), "{shown:?}");
    let seen = a.requests().pop().unwrap();
    assert_eq!(
        seen.one("x-client-subject").as_deref(),
        Some("CN=alice,O=Example\\, Inc")
    );
    assert_eq!(
        seen.one("x-client-san").as_deref(),
        Some("DNS:alice.clients.test, email:alice@example.test")
    );
    assert_eq!(seen.one("x-client-verify").as_deref(), Some("SUCCESS"));
    assert_eq!(seen.one("x-client-serial").as_deref(), Some("9A10"));
    assert!(
        seen.headers.get("x_client_san").is_none(),
        "{:?}",
        seen.headers
    );
    assert_eq!(seen.headers["x-forwarded-proto"], "https");
    drop(with_cert);

    let mut without = run.client().await;
    let none = without.fetch(get_with("/who", &forged)).await;
    assert_eq!(
        (none.status, none.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(none.header_names(), names(&PROXIED), "{none:?}");
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.one("x-client-verify").as_deref(), Some("NONE"));
    for name in [
        "x-client-subject",
        "x-client-san",
        "x-client-serial",
        "x_client_san",
    ] {
        assert!(
            seen.headers.get(name).is_none(),
            "{name}: {:?}",
            seen.headers
        );
    }
    drop(without);
    run.expect_log(
        &[&shown, &none],
        &[
            format!("GET /who 200 13 {}", a.addr),
            format!("GET /who 200 13 {}", a.addr),
        ],
    )
    .await;
}
each_proto!(tls: a_client_certificate_reaches_the_backend_as_headers_and_forged_ones_are_removed);

// ---------------------------------------------------------------------------------------------
// Request IDs, Server-Timing
// ---------------------------------------------------------------------------------------------

async fn request_ids_reach_the_backend_and_come_back_on_proxied_and_local_answers(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "[[listener.route]]\npath_exact = \"/forbidden\"\n\
        respond = { status = 403 }\n\
        [[listener.route]]\npath_exact = \"/missing\"\n\
        respond = { status = 404, body = \"nothing here\\n\" }\n\
        [[listener.route]]\npath_exact = \"/moved\"\n\
        redirect = { status = 302, location = \"/new\" }\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let proxied = c.get("/proxied").await;
    assert_eq!(
        (proxied.status, proxied.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(proxied.header_names(), names(&PROXIED), "{proxied:?}");
    let id = proxied.one("x-request-id").to_string();
    assert_made_id(&id);
    assert_eq!(
        a.requests().pop().unwrap().headers["x-request-id"],
        id.as_str()
    );

    let kept = c
        .fetch(get_with("/kept", &[("x-request-id", "client-id-1")]))
        .await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    assert_eq!(kept.one("x-request-id"), "client-id-1");
    assert_eq!(
        a.requests().pop().unwrap().headers["x-request-id"],
        "client-id-1"
    );

    let forbidden = c.get("/forbidden").await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN, "{forbidden:?}");
    assert_eq!(forbidden.header_names(), names(&LOCAL), "{forbidden:?}");
    let missing = c.get("/missing").await;
    assert_eq!(
        (missing.status, missing.body.as_str()),
        (StatusCode::NOT_FOUND, "nothing here\n")
    );
    assert_eq!(missing.header_names(), names(&LOCAL), "{missing:?}");
    let moved = c.get("/moved").await;
    assert_eq!(moved.status, StatusCode::FOUND, "{moved:?}");
    assert_eq!(moved.one("location"), "/new");
    let mut ids = BTreeSet::from([id]);
    for r in [&forbidden, &missing, &moved] {
        let id = r.one("x-request-id");
        assert_made_id(id);
        assert!(ids.insert(id.to_string()), "{id} twice");
    }
    assert_eq!(a.hits(), 2);
    drop(c);
    let b = a.addr;
    run.expect_log(
        &[&proxied, &kept, &forbidden, &missing, &moved],
        &[
            format!("GET /proxied 200 13 {b}"),
            format!("GET /kept 200 13 {b}"),
            format!("GET /forbidden 403 {} -", forbidden.bytes.len()),
            "GET /missing 404 13 -".into(),
            format!("GET /moved 302 {} -", moved.bytes.len()),
        ],
    )
    .await;
}
each_proto!(request_ids_reach_the_backend_and_come_back_on_proxied_and_local_answers);

/// `Server-Timing`'s `name;dur=` value, in ms.
fn timing(reply: &Reply, name: &str) -> f64 {
    let v = reply.one("server-timing");
    v.split(',')
        .find_map(|m| m.trim().strip_prefix(&format!("{name};dur=")))
        .unwrap_or_else(|| panic!("no {name} in {v}"))
        .parse()
        .unwrap()
}

async fn server_timing_gives_pinlbs_share_and_the_backends_wait(p: Proto) {
    let a = Backend::start_with_delay("a", Duration::from_millis(5)).await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "server_timing = true\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;
    let r = c.get("/timed").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    let mut want = names(&PROXIED);
    want.insert("server-timing".into());
    assert_eq!(r.header_names(), want, "{r:?}");
    assert!(timing(&r, "upstream") >= 5.0, "{r:?}");
    assert!(timing(&r, "pinlb") >= 0.0, "{r:?}");
    drop(c);
    run.expect_log(&[&r], &[format!("GET /timed 200 13 {}", a.addr)])
        .await;
}
each_proto!(server_timing_gives_pinlbs_share_and_the_backends_wait);

// ---------------------------------------------------------------------------------------------
// redirect_https (plain listeners only), header rules, respond and redirect, error pages
// ---------------------------------------------------------------------------------------------

async fn redirect_https_answers_301_to_the_same_target_and_proxies_nothing(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "redirect_https = true\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;
    let r = c.get("/one?x=1").await;
    assert_eq!(r.status, StatusCode::MOVED_PERMANENTLY, "{r:?}");
    assert_eq!(r.one("location"), "https://pinlb.test/one?x=1");
    // The connection goes on after a redirect of a request without a body.
    let again = c.get("/two").await;
    assert_eq!(again.status, StatusCode::MOVED_PERMANENTLY, "{again:?}");
    assert_eq!(again.one("location"), "https://pinlb.test/two");
    assert_eq!(r.header_names(), again.header_names());
    assert!(r.header_names().contains("location"), "{r:?}");
    assert!(r.header_names().contains("x-request-id"), "{r:?}");
    assert_eq!(a.hits(), 0);
    drop(c);
    let (one, two) = (r.bytes.len(), again.bytes.len());
    run.expect_log(
        &[&r, &again],
        &[
            format!("GET /one?x=1 301 {one} -"),
            format!("GET /two 301 {two} -"),
        ],
    )
    .await;
}
each_proto!(plain: redirect_https_answers_301_to_the_same_target_and_proxies_nothing);

async fn header_rules_reach_the_backend_and_the_client_on_proxied_redirected_and_fixed_answers(
    p: Proto,
) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "[[listener.route]]\npath = \"/api/\"\nupstream = \"app\"\n\
        request_headers = { set = { \"X-Real-IP\" = \"{client_ip}\" }, add = { \"X-Added\" = \"yes\" }, remove = [\"X-Debug\"] }\n\
        response_headers = { add = { \"X-Served-By\" = \"pinlb\" }, remove = [\"X-Body-Bytes\"] }\n\
        [[listener.route]]\npath_exact = \"/old\"\n\
        redirect = { status = 301, location = \"{scheme}://{host}/new{is_args}{query}\" }\n\
        response_headers = { set = { \"X-Served-By\" = \"pinlb\" } }\n\
        [[listener.route]]\npath_exact = \"/teapot\"\n\
        respond = { status = 418, body = \"short and stout\\n\" }\n\
        response_headers = { add = { \"X-Served-By\" = \"pinlb\" } }\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let api = c
        .fetch(get_with(
            "/api/users",
            &[
                ("x-debug", "1"),
                ("x-real-ip", "192.0.2.66"),
                ("x-added", "client"),
            ],
        ))
        .await;
    assert_eq!(
        (api.status, api.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(api.one("x-served-by"), "pinlb");
    assert_eq!(
        api.header_names(),
        names(&[
            "content-length",
            "content-type",
            "x-backend",
            "x-request-id",
            "x-served-by"
        ]),
        "{api:?}"
    );
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.one("x-real-ip").as_deref(), Some("127.0.0.1"));
    let added: Vec<_> = seen.headers.get_all("x-added").iter().collect();
    assert_eq!(added, ["client", "yes"], "{:?}", seen.headers);
    assert!(seen.headers.get("x-debug").is_none(), "{:?}", seen.headers);

    let old = c.get("/old?a=1").await;
    assert_eq!(old.status, StatusCode::MOVED_PERMANENTLY, "{old:?}");
    assert_eq!(
        old.one("location"),
        format!("{}://pinlb.test/new?a=1", p.scheme())
    );
    assert_eq!(old.one("x-served-by"), "pinlb");
    assert!(old.header_names().contains("x-request-id"), "{old:?}");

    let teapot = c.get("/teapot").await;
    assert_eq!(
        (teapot.status.as_u16(), teapot.body.as_str()),
        (418, "short and stout\n")
    );
    assert_eq!(teapot.one("content-type"), TEXT);
    assert_eq!(teapot.one("x-served-by"), "pinlb");
    let mut want = names(&LOCAL);
    want.insert("x-served-by".into());
    assert_eq!(teapot.header_names(), want, "{teapot:?}");
    assert_eq!(a.hits(), 1);
    drop(c);
    run.expect_log(
        &[&api, &old, &teapot],
        &[
            format!("GET /api/users 200 13 {}", a.addr),
            format!("GET /old?a=1 301 {} -", old.bytes.len()),
            "GET /teapot 418 16 -".into(),
        ],
    )
    .await;
}
each_proto!(header_rules_reach_the_backend_and_the_client_on_proxied_redirected_and_fixed_answers);

async fn a_listeners_header_rules_reach_every_request_whose_route_has_none_of_its_own(p: Proto) {
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "request_headers = { set = { \"X-Env\" = \"prod\" } }\n\
        response_headers = { add = { \"X-Listener\" = \"yes\" } }\n\
        [[listener.route]]\npath = \"/own/\"\nupstream = \"app\"\n\
        request_headers = {}\nresponse_headers = {}\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let theirs = c.fetch(get_with("/any", &[("x-env", "dev")])).await;
    assert_eq!(theirs.status, StatusCode::OK, "{theirs:?}");
    assert_eq!(theirs.one("x-listener"), "yes");
    let own = c.fetch(get_with("/own/x", &[("x-env", "dev")])).await;
    assert_eq!(own.status, StatusCode::OK, "{own:?}");
    assert!(!own.header_names().contains("x-listener"), "{own:?}");
    let seen = a.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].one("x-env").as_deref(), Some("prod"));
    assert_eq!(
        seen[1].one("x-env").as_deref(),
        Some("dev"),
        "the route's own lift them"
    );
    drop(c);
    run.expect_log(
        &[&theirs, &own],
        &[
            format!("GET /any 200 13 {}", a.addr),
            format!("GET /own/x 200 13 {}", a.addr),
        ],
    )
    .await;
}
each_proto!(a_listeners_header_rules_reach_every_request_whose_route_has_none_of_its_own);

async fn a_listeners_error_page_answers_pinlbs_404_and_routes_respond_and_redirect(p: Proto) {
    let a = Backend::start("a").await;
    let page = scratch("404.html");
    std::fs::write(&page, "<h1>Not here</h1>\n").unwrap();
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += &format!(
        "[[listener.error_page]]\nstatus = 404\nfile = {page:?}\n\
         [[listener.route]]\npath_exact = \"/gone\"\nrespond = {{ status = 404 }}\n\
         [[listener.route]]\npath_exact = \"/fixed\"\n\
         respond = {{ status = 200, body = \"fixed\\n\" }}\n\
         [[listener.route]]\npath_exact = \"/go\"\nredirect = {{ location = \"/there\" }}\n"
    );
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let gone = c.get("/gone").await;
    assert_eq!(
        (gone.status, gone.body.as_str()),
        (StatusCode::NOT_FOUND, "<h1>Not here</h1>\n")
    );
    assert_eq!(gone.one("content-type"), "text/html; charset=utf-8");
    assert_eq!(gone.header_names(), names(&LOCAL), "{gone:?}");

    let fixed = c.get("/fixed").await;
    assert_eq!(
        (fixed.status, fixed.body.as_str()),
        (StatusCode::OK, "fixed\n")
    );
    assert_eq!(fixed.one("content-type"), TEXT);
    assert_eq!(fixed.header_names(), names(&LOCAL), "{fixed:?}");

    let go = c.get("/go").await;
    assert_eq!(go.status, StatusCode::FOUND, "{go:?}");
    assert_eq!(go.one("location"), "/there");
    assert!(go.header_names().contains("x-request-id"), "{go:?}");

    // A backend's own 404 is its own (no intercept_errors).
    let theirs = c.get("/status/404").await;
    assert_eq!(
        (theirs.status, theirs.body.as_str()),
        (StatusCode::NOT_FOUND, "status 404 from a\n")
    );
    assert_eq!(theirs.header_names(), names(&PROXIED), "{theirs:?}");
    assert_eq!(a.hits(), 1);
    drop(c);
    let _ = std::fs::remove_file(&page);
    run.expect_log(
        &[&gone, &fixed, &go, &theirs],
        &[
            "GET /gone 404 18 -".into(),
            "GET /fixed 200 6 -".into(),
            format!("GET /go 302 {} -", go.bytes.len()),
            format!("GET /status/404 404 18 {}", a.addr),
        ],
    )
    .await;
}
each_proto!(a_listeners_error_page_answers_pinlbs_404_and_routes_respond_and_redirect);

// ---------------------------------------------------------------------------------------------
// compress, buffering, sticky
// ---------------------------------------------------------------------------------------------

fn decode(coding: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    match coding {
        "gzip" => flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .map(drop)
            .expect("gzip"),
        "br" => brotli::Decompressor::new(data, 4096)
            .read_to_end(&mut out)
            .map(drop)
            .expect("brotli"),
        other => panic!("unexpected coding {other}"),
    }
    out
}

async fn gzip_and_brotli_responses_decode_to_the_backends_body_with_vary(p: Proto) {
    const LEN: usize = 40_000;
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "compress = { types = [\"*\"] }\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;
    let path = format!("/download/{LEN}");
    let mut replies = Vec::new();
    for coding in ["gzip", "br"] {
        let r = c
            .fetch(get_with(&path, &[("accept-encoding", coding)]))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        assert_eq!(r.one("content-encoding"), coding);
        assert!(
            r.one("vary")
                .to_ascii_lowercase()
                .contains("accept-encoding"),
            "{r:?}"
        );
        assert!(r.bytes.len() < LEN / 4, "{coding}: {} bytes", r.bytes.len());
        assert_eq!(decode(coding, &r.bytes), generated(LEN), "{coding}");
        assert_eq!(
            r.header_names(),
            names(&[
                "content-encoding",
                "vary",
                "x-backend",
                "x-body-bytes",
                "x-request-id"
            ]),
            "{r:?}"
        );
        replies.push(r);
    }
    // A client that asks for no coding gets the body as it is.
    let plain = c.get(&path).await;
    assert_eq!(plain.status, StatusCode::OK, "{plain:?}");
    assert!(plain.headers.get("content-encoding").is_none(), "{plain:?}");
    assert_eq!(plain.bytes, generated(LEN));
    assert_eq!(plain.one("content-length"), LEN.to_string());
    replies.push(plain);
    drop(c);
    let b = a.addr;
    let lines: Vec<String> = replies
        .iter()
        .map(|r| format!("GET {path} 200 {} {b}", r.bytes.len()))
        .collect();
    run.expect_log(&replies.iter().collect::<Vec<_>>(), &lines)
        .await;
}
each_proto!(gzip_and_brotli_responses_decode_to_the_backends_body_with_vary);

async fn buffered_bodies_arrive_whole_both_ways(p: Proto) {
    const DOWN: usize = 1 << 20;
    const UP: u64 = 300_000;
    let a = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.extra += "[upstream.app.buffering]\nmemory = \"16KiB\"\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let down = c.get(&format!("/download/{DOWN}")).await;
    assert_eq!(down.status, StatusCode::OK, "{down:?}");
    assert_eq!(down.one("content-length"), DOWN.to_string());
    assert!(down.bytes == generated(DOWN), "the body arrived changed");
    assert_eq!(
        down.header_names(),
        names(&[
            "content-length",
            "x-backend",
            "x-body-bytes",
            "x-request-id"
        ]),
        "{down:?}"
    );

    // Sent without a length: the backend gets it whole, with one.
    let body = GenBody::new(UP, false).boxed();
    let up = c.fetch(request(Method::POST, "/upload", body)).await;
    assert_eq!(
        (up.status, up.body.as_str()),
        (StatusCode::OK, "hello from a\n")
    );
    assert_eq!(up.one("x-body-bytes"), UP.to_string());
    assert_eq!(up.header_names(), names(&PROXIED), "{up:?}");
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.body_len, UP);
    assert_eq!(seen.headers["content-length"], UP.to_string());
    assert!(
        seen.headers.get("transfer-encoding").is_none(),
        "{:?}",
        seen.headers
    );
    assert_eq!(seen.body_start, generated(seen.body_start.len()));
    drop(c);
    let b = a.addr;
    run.expect_log(
        &[&down, &up],
        &[
            format!("GET /download/{DOWN} 200 {DOWN} {b}"),
            format!("POST /upload 200 13 {b}"),
        ],
    )
    .await;
}
each_proto!(buffered_bodies_arrive_whole_both_ways);

async fn a_sticky_cookie_is_set_and_brings_its_client_back_to_the_same_backend(p: Proto) {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr, b.addr], &pki);
    setup.upstream_keys += "sticky = { cookie = \"SRV\" }\n";
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;

    let first = c.get("/").await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let set = first.one("set-cookie");
    let value = set
        .strip_prefix("SRV=")
        .and_then(|s| s.strip_suffix("; Path=/; HttpOnly"))
        .unwrap_or_else(|| panic!("{set}"));
    assert!(
        value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()),
        "{set}"
    );
    // A response that sets a cookie is not for shared caches.
    assert_eq!(first.one("cache-control"), "private");
    let mut want = names(&PROXIED);
    want.extend(["set-cookie".into(), "cache-control".into()]);
    assert_eq!(first.header_names(), want, "{first:?}");
    let (id, addr) = match first.backend() {
        "a" => ("a", a.addr),
        "b" => ("b", b.addr),
        other => panic!("backend {other}"),
    };

    // Round robin alone would alternate; the cookie keeps every request on one backend.
    let cookie = format!("SRV={value}");
    let mut replies = vec![first];
    for i in 0..4 {
        let r = c
            .fetch(get_with(&format!("/again/{i}"), &[("cookie", &cookie)]))
            .await;
        assert_eq!((r.status, r.backend()), (StatusCode::OK, id), "{r:?}");
        assert!(r.headers.get("set-cookie").is_none(), "{r:?}");
        assert_eq!(r.header_names(), names(&PROXIED), "{r:?}");
        replies.push(r);
    }
    drop(c);
    let mut want = vec![format!("GET / 200 13 {addr}")];
    want.extend((0..4).map(|i| format!("GET /again/{i} 200 13 {addr}")));
    run.expect_log(&replies.iter().collect::<Vec<_>>(), &want)
        .await;
}
each_proto!(a_sticky_cookie_is_set_and_brings_its_client_back_to_the_same_backend);

async fn a_mirror_copies_requests_and_their_bodies_and_the_client_sees_nothing_of_it(p: Proto) {
    let a = Backend::start("a").await;
    let canary = Backend::start("canary").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[a.addr], &pki);
    setup.listener_keys += "mirror = { upstream = \"canary\" }\n";
    setup.extra += &format!(
        "[upstream.canary]\nbackends = [{{ address = \"{}\" }}]\n",
        canary.addr
    );
    let run = Run::start(p, pki, setup);
    let mut c = run.client().await;
    let get = c.get("/item?x=1").await;
    let post = c.fetch(request(Method::POST, "/order", full("x=1"))).await;
    for r in [&get, &post] {
        assert_eq!(
            (r.status, r.body.as_str()),
            (StatusCode::OK, "hello from a\n")
        );
        assert_eq!(r.header_names(), names(&PROXIED), "{r:?}");
    }
    // Both copied, marked, the POST with its body; the copies' order is the tasks'.
    canary.wait_for_hits(2).await;
    let mut copies = Vec::new();
    for _ in 0..500 {
        copies = canary.requests();
        if copies.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    copies.sort_by(|x, y| x.uri.cmp(&y.uri));
    let seen: Vec<(&str, &str, u64)> = (copies.iter())
        .map(|c| (c.method.as_str(), c.uri.as_str(), c.body_len))
        .collect();
    assert_eq!(seen, [("GET", "/item?x=1", 0), ("POST", "/order", 3)]);
    assert!(
        copies
            .iter()
            .all(|c| c.one("x-mirrored-by").as_deref() == Some("pinlb"))
    );
    drop(c);
    let b = a.addr;
    run.expect_log(
        &[&get, &post],
        &[
            format!("GET /item?x=1 200 13 {b}"),
            format!("POST /order 200 13 {b}"),
        ],
    )
    .await;
}
each_proto!(a_mirror_copies_requests_and_their_bodies_and_the_client_sees_nothing_of_it);
