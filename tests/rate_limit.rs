//! `[limit.NAME]` with `rate_limit`, and `conn_limit`: real clients on real connections to
//! pinlb with two workers, each request on a connection of its own so that the kernel spreads
//! them over both workers' sockets; the limits hold exactly across them.
//!
//! The rates are per minute, so that a test's own duration never lets a request more through:
//! `burst + 1` pass, then none for a minute.

use crate::common;

use std::net::SocketAddr;

use common::*;
use http::Method;

/// Two workers where the machine lets this process use two cores.
fn cores() -> String {
    let a = allowed();
    let two: Vec<String> = a.iter().take(2).map(usize::to_string).collect();
    two.join(", ")
}

/// A config with one listener (its extra keys `listener`), an admin listener, and `rest`
/// appended (zones, routes).
fn config(backend: SocketAddr, listener: &str, rest: &str) -> String {
    format!(
        "[runtime]\ncpus = [{}]\n\n[admin]\naddress = \"127.0.0.1:0\"\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n{listener}\n\n{rest}\n\n[upstream.app]\nbackends = [{{ address = \"{backend}\" }}]\n",
        cores()
    )
}

/// `GET path` on a new connection, with extra header lines.
async fn get_on_new_connection(addr: SocketAddr, path: &str, headers: &str) -> RawResponse {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n");
    raw_request(addr, req.as_bytes(), false).await
}

/// The statuses of `n` requests, each on its own connection.
async fn statuses(addr: SocketAddr, n: usize, path: &str, headers: &str) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get_on_new_connection(addr, path, headers).await.status);
    }
    out
}

/// `POST /reload`, again while a worker has not started on the running generation yet (the
/// reload says to try again); bounded.
async fn reload(proxy: &Proxy) {
    let done = poll(100, std::time::Duration::from_millis(20), async || {
        let r = proxy.admin(Method::POST, "/reload", None).await;
        match r.status.as_u16() {
            200 => Some(Ok(())),
            _ if r.body.contains("try again") => None,
            _ => Some(Err(r.body)),
        }
    })
    .await;
    assert_eq!(done, Some(Ok(())), "reload");
}

fn count(v: &[u16], status: u16) -> usize {
    v.iter().filter(|&&s| s == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_the_rate_gets_exactly_the_burst_across_both_workers_with_retry_after() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&config(
        a.addr,
        "rate_limit = [{ zone = \"one\", burst = 4, nodelay = true }]",
        "[limit.one]\nkey = \"client_ip\"\nrate = \"1r/m\"",
    ));
    let got = statuses(proxy.addr, 20, "/", "").await;
    assert_eq!(count(&got, 200), 5, "burst 4 + 1: {got:?}");
    assert_eq!(count(&got, 429), 15, "{got:?}");
    assert!(
        got[..5].iter().all(|&s| s == 200),
        "the burst passes first: {got:?}"
    );

    let r = get_on_new_connection(proxy.addr, "/", "").await;
    assert_eq!(r.status, 429);
    // One request a minute: the next passes a minute after the last one that passed.
    let retry: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((55..=60).contains(&retry), "Retry-After: {retry}");
    let body = String::from_utf8_lossy(&r.body);
    assert!(body.contains("zone one"), "{body}");
    assert_eq!(a.hits(), 5, "refused requests never reach the backend");

    let m = proxy.metrics().await;
    let listener = format!("listener=\"{}\"", proxy.addr);
    assert_eq!(
        m.value(
            "pinlb_refused_total",
            &format!("{listener},cause=\"rate_limit\"")
        ),
        16.0
    );
    assert_eq!(
        m.value(
            "pinlb_rate_limited_total",
            &format!("{listener},route=\"default\",zone=\"one\"")
        ),
        16.0
    );
    // The requests were spread over both workers, and the limit held across them.
    if allowed().len() >= 2 {
        let per_worker: Vec<f64> = (m.0.lines())
            .filter(|l| l.starts_with("pinlb_worker_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert_eq!(per_worker.len(), 2, "{}", m.0);
        assert!(per_worker.iter().all(|&n| n > 0.0), "{per_worker:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_by_header_are_limited_apart_and_a_request_without_one_is_not_limited() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&config(
        a.addr,
        "rate_limit = [{ zone = \"api\", status = 503 }]",
        "[limit.api]\nkey = \"header:x-api-key\"\nrate = \"1r/m\"",
    ));
    let alice = statuses(proxy.addr, 3, "/", "X-Api-Key: alice\r\n").await;
    assert_eq!(alice, [200, 503, 503], "the configured status");
    let bob = statuses(proxy.addr, 2, "/", "X-Api-Key: bob\r\n").await;
    assert_eq!(bob, [200, 503], "another key has its own bucket");
    let none = statuses(proxy.addr, 6, "/", "").await;
    assert_eq!(none, [200; 6], "no key, no limit (nginx's empty key)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_by_cookie_are_limited_apart() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&config(
        a.addr,
        "rate_limit = [{ zone = \"s\", burst = 1, nodelay = true }]",
        "[limit.s]\nkey = \"cookie:session\"\nrate = \"1r/m\"",
    ));
    let s1 = statuses(proxy.addr, 3, "/", "Cookie: theme=dark; session=s1\r\n").await;
    assert_eq!(s1, [200, 200, 429]);
    let s2 = statuses(proxy.addr, 1, "/", "Cookie: session=s2\r\n").await;
    assert_eq!(s2, [200]);
    let other = statuses(proxy.addr, 4, "/", "Cookie: theme=dark\r\n").await;
    assert_eq!(
        other, [200; 4],
        "a request without the cookie is not limited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_s_own_zones_replace_the_listener_s_and_are_counted_by_route() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&config(
        a.addr,
        "rate_limit = [{ zone = \"one\" }]",
        "[limit.one]\nrate = \"1r/m\"\n\n[limit.two]\nrate = \"1r/m\"\n\n\
         [[listener.route]]\npath = \"/open/\"\nupstream = \"app\"\nrate_limit = []\n\n\
         [[listener.route]]\npath = \"/api/\"\nupstream = \"app\"\nrate_limit = [{ zone = \"two\", burst = 1, nodelay = true }]",
    ));
    assert_eq!(statuses(proxy.addr, 4, "/open/x", "").await, [200; 4]);
    assert_eq!(statuses(proxy.addr, 3, "/api/x", "").await, [200, 200, 429]);
    // The listener's own zone, for the requests no route matches, is a bucket of its own.
    assert_eq!(statuses(proxy.addr, 2, "/", "").await, [200, 429]);
    let m = proxy.metrics().await;
    let listener = format!("listener=\"{}\"", proxy.addr);
    assert_eq!(
        m.value(
            "pinlb_rate_limited_total",
            &format!("{listener},route=\"1:/api/\",zone=\"two\"")
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "pinlb_rate_limited_total",
            &format!("{listener},route=\"default\",zone=\"one\"")
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_zone_refuses_new_keys_and_keeps_limiting_the_known_ones() {
    let a = Backend::start("a").await;
    // 8 keys: the window of slots a key may use is the whole table.
    let proxy = Proxy::start_toml(&config(
        a.addr,
        "rate_limit = [{ zone = \"k\" }]",
        "[limit.k]\nkey = \"header:x-key\"\nrate = \"1r/m\"\nkeys = 8",
    ));
    for k in 0..8 {
        let r = get_on_new_connection(proxy.addr, "/", &format!("X-Key: k{k}\r\n")).await;
        assert_eq!(r.status, 200, "key {k}");
    }
    let r = get_on_new_connection(proxy.addr, "/", "X-Key: new\r\n").await;
    assert_eq!(r.status, 429, "no room for a new key");
    assert_eq!(r.header("retry-after"), Some("1"));
    let r = get_on_new_connection(proxy.addr, "/", "X-Key: k3\r\n").await;
    assert_eq!(r.status, 429, "a known key is still limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_keeps_the_zone_keeps_its_state_and_a_changed_zone_starts_anew() {
    let a = Backend::start("a").await;
    let zone = "[limit.one]\nrate = \"1r/m\"";
    let listener = "rate_limit = [{ zone = \"one\" }]";
    let proxy = Proxy::start_file(&config(a.addr, listener, zone));
    assert_eq!(statuses(proxy.addr, 2, "/", "").await, [200, 429]);

    // Another backend timeout, the same zone.
    proxy.rewrite(&format!(
        "{}\n[upstream.app.timeouts]\nconnect = \"2s\"\n",
        config(a.addr, listener, zone)
    ));
    reload(&proxy).await;
    assert_eq!(
        statuses(proxy.addr, 1, "/", "").await,
        [429],
        "the state stays"
    );

    proxy.rewrite(&config(a.addr, listener, "[limit.one]\nrate = \"2r/m\""));
    reload(&proxy).await;
    assert_eq!(
        statuses(proxy.addr, 2, "/", "").await,
        [200, 429],
        "a new rate, a new zone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_client_are_limited_across_workers_and_released_on_close() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_toml(&config(a.addr, "conn_limit = { max = 3 }", ""));
    // Three keep-alive connections, each with a request answered, so each is admitted.
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut c = RawConn::open(proxy.addr).await;
        let r = c
            .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false)
            .await;
        assert_eq!(r.status, 200);
        open.push(c);
    }
    // More, spread by the kernel over both workers: each is closed without an answer.
    for i in 0..6 {
        let mut c = RawConn::open(proxy.addr).await;
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let seen = tokio::time::timeout(WAIT, c.read_until(|_| false))
            .await
            .expect("closed");
        assert!(seen.is_empty(), "connection {i} got {seen:?}");
    }
    assert_eq!(a.hits(), 3);

    // One closes; its place is free once pinlb has seen the close.
    drop(open.pop());
    let admitted = poll(100, std::time::Duration::from_millis(20), async || {
        let mut c = RawConn::open(proxy.addr).await;
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await;
        let seen = tokio::time::timeout(WAIT, c.read_until(|_| false))
            .await
            .expect("closed");
        seen.starts_with(b"HTTP/1.1 200").then_some(())
    })
    .await;
    assert!(
        admitted.is_some(),
        "a closed connection's place is given back"
    );

    let m = proxy.metrics().await;
    let refused = m.value(
        "pinlb_refused_total",
        &format!("listener=\"{}\",cause=\"conn_limit\"", proxy.addr),
    );
    assert!(refused >= 6.0, "{refused}");
}

#[test]
fn bad_limits_are_config_errors_at_their_key() {
    let cases = [
        (
            "rate_limit = [{ zone = \"one\", burst = 5 }]",
            "[limit.one]\nrate = \"10r/s\"",
            "listener[0].rate_limit[0].nodelay: pinlb does not delay requests over the rate, expected nodelay = true",
        ),
        (
            "rate_limit = [{ zone = \"nope\" }]",
            "[limit.one]\nrate = \"10r/s\"",
            "listener[0].rate_limit[0].zone: no [limit.nope]",
        ),
        (
            "",
            "[limit.one]\nrate = \"10r/h\"",
            "limit.one.rate: \"10r/h\" is not a rate",
        ),
        (
            "",
            "[limit.one]\nrate = \"0r/s\"",
            "limit.one.rate: \"0r/s\": a rate of 0",
        ),
        (
            "",
            "[limit.one]\nrate = \"1r/s\"\nkey = \"uri\"",
            "limit.one.key: unknown value \"uri\"",
        ),
        (
            "",
            "[limit.one]\nrate = \"1r/s\"\nkeys = 0",
            "limit.one.keys: 0 is out of range",
        ),
        (
            "rate_limit = [{ zone = \"one\", status = 200 }]",
            "[limit.one]\nrate = \"1r/s\"",
            "listener[0].rate_limit[0].status: 200 is not an error status",
        ),
        (
            "conn_limit = { max = 0 }",
            "",
            "listener[0].conn_limit.max: 0 is out of range",
        ),
    ];
    for (listener, rest, want) in cases {
        let text = config("127.0.0.1:9".parse().unwrap(), listener, rest);
        let e = pinlb::Config::parse("t.toml", &text, &allowed())
            .expect_err(want)
            .to_string();
        assert!(
            e.starts_with("t.toml:") && e.contains(want),
            "{e}\nwanted {want}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_connection_stays_counted_and_gives_its_place_back_when_it_times_out() {
    let a = Backend::start("a").await;
    // Idle connections park after 1 s, and close at client_idle.
    let toml = format!(
        "{}\n[upstream.app.timeouts]\nclient_idle = \"2s\"\n",
        config(a.addr, "conn_limit = { max = 1 }", "")
    );
    let proxy = Proxy::start_toml(&toml);
    let mut held = RawConn::open(proxy.addr).await;
    let r = held
        .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false)
        .await;
    assert_eq!(r.status, 200);
    let mut second = RawConn::open(proxy.addr).await;
    second.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let seen = tokio::time::timeout(WAIT, second.read_until(|_| false))
        .await
        .expect("closed");
    assert!(
        seen.is_empty(),
        "the address has its one connection open already"
    );

    // Parked at 1 s, then closed by pinlb at client_idle: its place is free again.
    let took = held.wait_closed().await;
    assert!(
        took >= std::time::Duration::from_millis(1900),
        "closed after {took:?}"
    );
    let admitted = poll(100, std::time::Duration::from_millis(20), async || {
        let r = get_on_new_connection(proxy.addr, "/", "").await;
        (r.status == 200).then_some(())
    })
    .await;
    assert!(
        admitted.is_some(),
        "the timed-out connection's place is given back"
    );
}
