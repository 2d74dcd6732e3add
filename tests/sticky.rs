//! Sticky sessions by an inserted cookie (`[upstream.NAME] sticky`): real backends, real clients
//! over HTTP/1.1 and HTTP/2, the admin API, reloads, two pinlb instances, `check`'s errors, and
//! socket.io's long-polling handshake, which needs every request of a session on one server.

use crate::common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use http::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, BufReader};

/// `backends` behind round robin with `sticky` set to `table`, and the admin listener.
fn sticky_setup(backends: &[SocketAddr], table: &str) -> Setup {
    let mut setup = Setup::with(backends);
    setup.upstream_keys = format!("sticky = {table}\n");
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\n".into();
    setup
}

const SRV: &str = r#"{ cookie = "SRV" }"#;

/// A GET with `cookie` as its Cookie header, when given.
async fn get_with(conn: &mut Conn, cookie: Option<&str>) -> Reply {
    let mut req = request(Method::GET, "/", empty());
    if let Some(c) = cookie {
        req.headers_mut().insert("cookie", c.parse().unwrap());
    }
    let r = conn.fetch(req).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r
}

/// The `Set-Cookie` lines of a response.
fn set_cookies(r: &Reply) -> Vec<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// The `SRV=VALUE` pair a response sets, asserting it sets exactly one.
fn srv_cookie(r: &Reply) -> String {
    let set = set_cookies(r);
    assert_eq!(set.len(), 1, "one Set-Cookie expected: {set:?}");
    let pair = set[0].split(';').next().unwrap().to_string();
    assert!(pair.starts_with("SRV="), "{set:?}");
    pair
}

#[tokio::test]
async fn the_first_response_sets_the_cookie_and_later_requests_stay_on_its_backend() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let proxy = Proxy::start(&sticky_setup(&[a.addr, b.addr, c.addr], SRV));
    let mut conn = Conn::open(proxy.addr).await;
    let first = get_with(&mut conn, None).await;
    let set = set_cookies(&first);
    assert_eq!(set.len(), 1, "{set:?}");
    let cookie = srv_cookie(&first);
    let value = cookie.strip_prefix("SRV=").unwrap();
    // Opaque: 16 hex digits, no address or port in it.
    assert_eq!(value.len(), 16, "{cookie}");
    assert!(value.bytes().all(|b| b.is_ascii_hexdigit()), "{cookie}");
    for backend in [a.addr, b.addr, c.addr] {
        assert!(!value.contains(&backend.port().to_string()), "{cookie}");
    }
    assert_eq!(set[0], format!("{cookie}; Path=/; HttpOnly"));
    // `nocache`: a shared cache must not hand this cookie to other clients.
    assert_eq!(first.headers["cache-control"], "private");
    let home = first.backend().to_string();
    for i in 0..100 {
        let r = get_with(&mut conn, Some(&cookie)).await;
        assert_eq!(r.backend(), home, "request {i} left its backend");
        // The client has the right cookie: it is not sent again.
        assert!(set_cookies(&r).is_empty(), "{r:?}");
        assert!(r.headers.get("cache-control").is_none(), "{r:?}");
    }
    // Without the cookie the algorithm still spreads requests, each answer naming its backend.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let r = get_with(&mut conn, None).await;
        srv_cookie(&r);
        seen.insert(r.backend().to_string());
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

#[tokio::test]
async fn the_backend_sees_the_other_cookies_but_not_the_sticky_one() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&sticky_setup(&[a.addr], SRV));
    let mut conn = Conn::open(proxy.addr).await;
    let cookie = srv_cookie(&get_with(&mut conn, Some("theme=dark")).await);
    let r = get_with(&mut conn, Some(&format!("theme=dark; {cookie}; lang=fr"))).await;
    assert!(set_cookies(&r).is_empty(), "{r:?}");
    get_with(&mut conn, Some(&cookie)).await;
    let seen = a.requests();
    assert_eq!(seen.len(), 3);
    let cookies = |i: usize| -> Vec<String> {
        seen[i]
            .headers
            .get_all("cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(cookies(0), ["theme=dark"]);
    assert_eq!(cookies(1), ["theme=dark; lang=fr"]);
    // Only the sticky cookie: the Cookie header is gone altogether.
    assert!(cookies(2).is_empty(), "{:?}", cookies(2));
}

#[tokio::test]
async fn an_unknown_or_forged_cookie_counts_as_none() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start(&sticky_setup(&[a.addr, b.addr], SRV));
    let mut conn = Conn::open(proxy.addr).await;
    let real = srv_cookie(&get_with(&mut conn, None).await);
    for forged in [
        "SRV=0123456789abcdef".to_string(),
        "SRV=nonsense".to_string(),
        format!("SRV={}", a.addr),
        real.to_uppercase(),
    ] {
        let r = get_with(&mut conn, Some(&forged)).await;
        let fresh = srv_cookie(&r);
        assert_ne!(fresh, forged);
        // The new cookie names the backend that answered: it keeps the client there.
        let again = get_with(&mut conn, Some(&fresh)).await;
        assert_eq!(again.backend(), r.backend());
        assert!(set_cookies(&again).is_empty());
    }
    // Neither backend ever saw a sticky cookie, forged or not.
    for backend in [&a, &b] {
        for seen in backend.requests() {
            assert!(seen.headers.get("cookie").is_none(), "{:?}", seen.headers);
        }
    }
}

#[tokio::test]
async fn a_disabled_or_stopped_backend_moves_its_clients_with_a_new_cookie() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut c = Backend::start("c").await;
    let proxy = Proxy::start(&sticky_setup(&[a.addr, b.addr, c.addr], SRV));
    let mut conn = Conn::open(proxy.addr).await;
    // One client per backend.
    let mut clients = Vec::new();
    for _ in 0..3 {
        let r = get_with(&mut conn, None).await;
        clients.push((r.backend().to_string(), srv_cookie(&r)));
    }
    let cookie_of = |id: &str| clients.iter().find(|(b, _)| b == id).unwrap().1.clone();
    let on_a = cookie_of("a");
    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/disable", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let moved = get_with(&mut conn, Some(&on_a)).await;
    assert_ne!(moved.backend(), "a");
    let new_cookie = srv_cookie(&moved);
    assert_ne!(new_cookie, on_a);
    assert_eq!(new_cookie, cookie_of(moved.backend()));
    for _ in 0..10 {
        let r = get_with(&mut conn, Some(&new_cookie)).await;
        assert_eq!(r.backend(), moved.backend());
        assert!(set_cookies(&r).is_empty());
    }
    // Enabled again, the old cookie leads back to it.
    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/enable", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let back = get_with(&mut conn, Some(&on_a)).await;
    assert_eq!(back.backend(), "a");
    assert!(set_cookies(&back).is_empty());
    // A stopped backend: the connect fails, the next backend answers, with its cookie.
    let on_c = cookie_of("c");
    c.kill().await;
    for _ in 0..3 {
        let r = get_with(&mut Conn::open(proxy.addr).await, Some(&on_c)).await;
        assert_ne!(r.backend(), "c");
        assert_eq!(srv_cookie(&r), cookie_of(r.backend()));
    }
}

#[tokio::test]
async fn a_draining_backend_keeps_its_clients_and_takes_no_new_ones() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start(&sticky_setup(&[a.addr, b.addr], SRV));
    let mut conn = Conn::open(proxy.addr).await;
    let mut on_a = None;
    for _ in 0..2 {
        let r = get_with(&mut conn, None).await;
        if r.backend() == "a" {
            on_a = Some(srv_cookie(&r));
        }
    }
    let on_a = on_a.expect("round robin reached a");
    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/drain", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    for _ in 0..5 {
        let r = get_with(&mut conn, Some(&on_a)).await;
        assert_eq!(r.backend(), "a");
        let r = get_with(&mut conn, None).await;
        assert_eq!(r.backend(), "b");
    }
}

#[tokio::test]
async fn a_full_backend_sends_its_client_to_another_with_a_new_cookie() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = sticky_setup(&[a.addr, b.addr], SRV);
    setup.backend_keys = vec!["max_conns = 1".into(), String::new()];
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    let mut cookies = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let r = get_with(&mut conn, None).await;
        cookies.insert(r.backend().to_string(), srv_cookie(&r));
    }
    assert_eq!(cookies.len(), 2, "{cookies:?}");
    // a's one slot, held by a request its gate keeps waiting.
    a.set_gate(false);
    let before = a.hits();
    let mut held = request(Method::POST, "/gated", full("x"));
    held.headers_mut()
        .insert("cookie", cookies["a"].parse().unwrap());
    let mut holder = Conn::open(proxy.addr).await;
    let pending = tokio::spawn(async move { holder.fetch(held).await });
    a.wait_for_hits(before + 1).await;
    let r = get_with(&mut conn, Some(&cookies["a"])).await;
    assert_eq!(r.backend(), "b");
    assert_eq!(srv_cookie(&r), cookies["b"]);
    a.set_gate(true);
    let held = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    assert_eq!(held.backend(), "a");
    assert!(set_cookies(&held).is_empty());
}

#[tokio::test]
async fn two_instances_and_a_reload_agree_on_the_values() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let table = r#"{ cookie = "SRV", seed = "shared secret" }"#;
    let one = Proxy::start_file(&sticky_setup(&[a.addr, b.addr], table).toml());
    let two = Proxy::start(&sticky_setup(&[a.addr, b.addr], table));
    let mut conn = Conn::open(one.addr).await;
    let mut cookies = Vec::new();
    for _ in 0..2 {
        let r = get_with(&mut conn, None).await;
        cookies.push((r.backend().to_string(), srv_cookie(&r)));
    }
    // The other instance sends each cookie to the same backend, and sees no need to set one.
    let mut other = Conn::open(two.addr).await;
    for (backend, cookie) in &cookies {
        for _ in 0..5 {
            let r = get_with(&mut other, Some(cookie)).await;
            assert_eq!(r.backend(), backend);
            assert!(set_cookies(&r).is_empty(), "{r:?}");
        }
    }
    // A reload that adds a backend before the others keeps every value.
    one.rewrite(&sticky_setup(&[c.addr, a.addr, b.addr], table).toml());
    let r = one.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let mut after = Conn::open(one.addr).await;
    for (backend, cookie) in &cookies {
        let r = get_with(&mut after, Some(cookie)).await;
        assert_eq!(r.backend(), backend);
        assert!(set_cookies(&r).is_empty(), "{r:?}");
    }
    // Another seed gives other values: the cookies of `one` mean nothing there.
    let three = Proxy::start(&sticky_setup(
        &[a.addr, b.addr],
        r#"{ cookie = "SRV", seed = "another" }"#,
    ));
    let r = get_with(&mut Conn::open(three.addr).await, Some(&cookies[0].1)).await;
    assert_ne!(srv_cookie(&r), cookies[0].1);
}

#[tokio::test]
async fn attributes_appear_on_the_cookie() {
    let a = Backend::start("a").await;
    let table = r#"{ cookie = "route", path = "/app", domain = "example.com", max_age = "1h", secure = true, httponly = false, samesite = "strict" }"#;
    let proxy = Proxy::start(&sticky_setup(&[a.addr], table));
    let r = get_with(&mut Conn::open(proxy.addr).await, None).await;
    let set = set_cookies(&r);
    assert_eq!(set.len(), 1, "{set:?}");
    let value = set[0].split(';').next().unwrap();
    assert!(value.starts_with("route="), "{set:?}");
    assert_eq!(
        set[0],
        format!("{value}; Path=/app; Domain=example.com; Max-Age=3600; Secure; SameSite=Strict")
    );
}

#[tokio::test]
async fn http2_clients_are_sticky_too() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = sticky_setup(&[a.addr, b.addr], SRV);
    setup.listener_keys += "h2c = true\n";
    let proxy = Proxy::start(&setup);
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let mut fetch = async |cookies: &[&str]| {
        let mut req = Request::builder().uri("http://a.test/");
        // HTTP/2 clients may split the Cookie header into one field per pair (RFC 9113 §8.2.3).
        for c in cookies {
            req = req.header("cookie", *c);
        }
        let resp = tokio::time::timeout(WAIT, send.send_request(req.body(empty()).unwrap()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        Reply::read(resp).await
    };
    let first = fetch(&[]).await;
    let cookie = srv_cookie(&first);
    for _ in 0..20 {
        let r = fetch(&["x=1", &cookie, "y=2"]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.backend(), first.backend());
        assert!(set_cookies(&r).is_empty());
    }
    let home = if first.backend() == "a" { &a } else { &b };
    let last = home.requests().pop().unwrap();
    let seen: Vec<_> = last.headers.get_all("cookie").iter().collect();
    let joined = seen
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect::<Vec<_>>()
        .join("; ");
    assert_eq!(joined, "x=1; y=2");
}

/// `config`'s error from `check`, which must read `test.toml:LINE:COL: KEY: …`.
fn config_error(upstream_keys: &str) -> String {
    let mut setup = Setup::with(&["127.0.0.1:9".parse().unwrap()]);
    setup.upstream_keys = upstream_keys.to_string();
    let toml = setup.toml();
    let e = pinlb::Config::parse("test.toml", &toml, &allowed())
        .err()
        .unwrap_or_else(|| panic!("accepted:\n{toml}"))
        .to_string();
    // The line the key is on.
    let line = toml.lines().position(|l| l.starts_with("sticky")).unwrap() + 1;
    assert!(e.starts_with(&format!("test.toml:{line}:")), "{e}");
    e
}

#[test]
fn bad_sticky_settings_are_check_errors_at_their_place() {
    for (keys, key, says) in [
        (
            r#"sticky = { cookie = "a b" }"#,
            "sticky.cookie",
            "invalid cookie name \"a b\"",
        ),
        (
            r#"sticky = { cookie = "a=b" }"#,
            "sticky.cookie",
            "expected a token",
        ),
        (
            r#"sticky = { cookie = "" }"#,
            "sticky.cookie",
            "invalid cookie name",
        ),
        (
            r#"sticky = { cookie = "s;x" }"#,
            "sticky.cookie",
            "invalid cookie name",
        ),
        (
            r#"sticky = { cookie = "SRV", path = "app" }"#,
            "sticky.path",
            "beginning with '/'",
        ),
        (
            r#"sticky = { cookie = "SRV", path = "/a;b" }"#,
            "sticky.path",
            "without ';'",
        ),
        (
            r#"sticky = { cookie = "SRV", domain = "a b" }"#,
            "sticky.domain",
            "host name",
        ),
        (
            r#"sticky = { cookie = "SRV", max_age = "0s" }"#,
            "sticky.max_age",
            "at least \"1s\"",
        ),
        (
            r#"sticky = { cookie = "SRV", samesite = "none" }"#,
            "sticky.samesite",
            "needs secure = true",
        ),
        (
            r#"sticky = { cookie = "SRV", samesite = "loose" }"#,
            "sticky.samesite",
            "\"strict\", \"lax\" or \"none\"",
        ),
    ] {
        let e = config_error(keys);
        assert!(
            e.contains(&format!(": upstream.app.{key}: ")),
            "{keys}: {e}"
        );
        assert!(e.contains(says), "{keys}: {e}");
    }
    // Unknown keys and a missing name are serde's errors, at the table.
    let e = config_error(r#"sticky = { cookie = "SRV", expires = "1h" }"#);
    assert!(e.contains("expires"), "{e}");
    let e = config_error(r#"sticky = { path = "/" }"#);
    assert!(e.contains("cookie"), "{e}");
}

/// A node process from `tests/socketio`, ended with the test.
fn node(modules: &str, script: &str, args: &[&str]) -> tokio::process::Command {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/socketio");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(format!("{dir}/{script}"))
        .args(args)
        .env("NODE_PATH", modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd
}

/// Four socket.io servers, each once it accepts, and their addresses.
async fn socketio_servers(modules: &str) -> (Vec<tokio::process::Child>, Vec<SocketAddr>) {
    let mut children = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..4 {
        let id = format!("s{i}");
        let mut child = node(modules, "server.js", &[&id])
            .spawn()
            .expect("run node");
        let out = child.stdout.take().unwrap();
        let mut line = String::new();
        tokio::time::timeout(WAIT, BufReader::new(out).read_line(&mut line))
            .await
            .expect("socket.io server listening in time")
            .unwrap();
        let port: u16 = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("server said {line:?}"))
            .parse()
            .unwrap();
        addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
        children.push(child);
    }
    (children, addrs)
}

/// The client's run through pinlb at `addr`: its exit status and what it printed.
async fn socketio_client(modules: &str, addr: SocketAddr) -> (bool, String) {
    let child = node(modules, "client.js", &[&format!("http://{addr}")])
        .spawn()
        .expect("run node");
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the client ends in time")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

#[tokio::test]
async fn socketio_long_polling_needs_stickiness_and_works_with_it() {
    let Ok(modules) = std::env::var("PINLB_TEST_NODE_MODULES") else {
        eprintln!(
            "skipped: PINLB_TEST_NODE_MODULES is unset (scripts/test installs socket.io and \
             socket.io-client from tests/socketio/package-lock.json and sets it)"
        );
        return;
    };
    let (_servers, addrs) = socketio_servers(&modules).await;

    // Round robin without stickiness: the handshake's session lives on one server, the next
    // request of the session reaches another, which does not know it.
    let plain = Proxy::start(&Setup::with(&addrs));
    let (ok, said) = socketio_client(&modules, plain.addr).await;
    assert!(!ok, "connected without stickiness: {said}");
    assert!(said.starts_with("connect_error"), "{said}");
    assert!(said.contains("Session ID unknown"), "{said}");

    let sticky = Proxy::start(&sticky_setup(&addrs, r#"{ cookie = "io_srv" }"#));
    for _ in 0..3 {
        let (ok, said) = socketio_client(&modules, sticky.addr).await;
        assert!(ok, "{said}");
        assert!(
            said.starts_with("echo {\"msg\":\"hello\",\"id\":\"s"),
            "{said}"
        );
    }
}

#[test]
fn check_describes_the_sticky_cookie() {
    let setup = sticky_setup(
        &["127.0.0.1:9".parse().unwrap()],
        r#"{ cookie = "SRV", max_age = "2h", samesite = "lax" }"#,
    );
    let config = pinlb::Config::parse("test.toml", &setup.toml(), &allowed()).unwrap();
    let shown = pinlb_tools::check::describe(&config);
    assert!(
        shown.contains(
            "  sticky: cookie SRV=VALUE; Path=/; Max-Age=7200; HttpOnly; SameSite=Lax; its backend first while that one can take the request, others by round_robin\n"
        ),
        "{shown}"
    );
}
