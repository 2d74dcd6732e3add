//! Operating pinlb live: the admin listener's metrics, status and control, hot reload, and the
//! access log. Real backends and a real proxy on loopback, as everywhere.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use http::{Method, StatusCode};
use tokio::sync::watch;

/// `[admin]` on a port of the kernel's choosing, with an optional token.
fn admin_table(token: Option<&str>) -> String {
    match token {
        Some(t) => format!("[admin]\naddress = \"127.0.0.1:0\"\ntoken = \"{t}\"\n"),
        None => "[admin]\naddress = \"127.0.0.1:0\"\n".into(),
    }
}

fn with_admin(backends: &[SocketAddr]) -> Setup {
    let mut setup = Setup::with(backends);
    setup.extra = admin_table(None);
    setup
}

/// Up to two workers, on the first two allowed cores: reloads must reach every worker.
fn two_workers(mut setup: Setup) -> Setup {
    setup.cpus = allowed().into_iter().take(2).collect();
    setup
}

fn labels(backend: SocketAddr) -> String {
    format!("upstream=\"app\",backend=\"{backend}\"")
}

#[tokio::test]
async fn metrics_count_requests_responses_connections_and_latency_per_backend() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start(&with_admin(&[a.addr, b.addr]));
    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..10 {
        assert_eq!(conn.get("/").await.status, StatusCode::OK);
    }
    let m = proxy.metrics().await;
    for be in [&a, &b] {
        let l = labels(be.addr);
        assert_eq!(m.value("pinlb_backend_requests_total", &l), 5.0);
        assert_eq!(
            m.value(
                "pinlb_backend_responses_total",
                &format!("{l},class=\"2xx\"")
            ),
            5.0
        );
        assert_eq!(
            m.value(
                "pinlb_backend_responses_total",
                &format!("{l},class=\"5xx\"")
            ),
            0.0
        );
        // One connection per backend, then reused: keep-alive works and shows.
        assert_eq!(m.value("pinlb_backend_connections_opened_total", &l), 1.0);
        assert_eq!(m.value("pinlb_backend_connections_reused_total", &l), 4.0);
        assert_eq!(
            m.value("pinlb_backend_response_time_seconds_count", &l),
            5.0
        );
        assert_eq!(
            m.value(
                "pinlb_backend_response_time_seconds_bucket",
                &format!("{l},le=\"+Inf\"")
            ),
            5.0
        );
        assert_eq!(m.value("pinlb_backend_in_flight", &l), 0.0);
        // Each learns its limit (the default), from the floor up.
        let limit = m.value("pinlb_backend_concurrency_limit", &l);
        assert!((2.0..=1000.0).contains(&limit), "{limit}");
        assert_eq!(m.value("pinlb_backend_up", &l), 1.0);
        assert_eq!(
            m.value(
                "pinlb_backend_admin_state",
                &format!("{l},state=\"active\"")
            ),
            1.0
        );
    }
    let listener = format!("listener=\"{}\"", proxy.addr);
    assert_eq!(m.value("pinlb_listener_requests_total", &listener), 10.0);
    assert_eq!(
        m.value("pinlb_listener_connections_accepted_total", &listener),
        1.0
    );
    assert_eq!(m.value("pinlb_listener_connections_active", &listener), 1.0);
    let core = first_core();
    assert_eq!(
        m.value(
            "pinlb_worker_requests_total",
            &format!("worker=\"0\",core=\"{core}\"")
        ),
        10.0
    );
    assert_eq!(m.value("pinlb_config_generation", ""), 1.0);
}

#[tokio::test]
async fn metrics_count_errors_by_kind() {
    let refusing = Refusing::new();
    let slow = Backend::start_with_delay("slow", Duration::from_secs(5)).await;
    let mut setup = with_admin(&[refusing.addr, slow.addr]);
    setup.response_timeout = "200ms";
    // No passive skipping, so each request tries both.
    setup.extra += "[upstream.app.passive]\nmax_fails = 0\n";
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.body);
    let m = proxy.metrics().await;
    assert_eq!(
        m.value(
            "pinlb_backend_errors_total",
            &format!("{},kind=\"connect\"", labels(refusing.addr))
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "pinlb_backend_errors_total",
            &format!("{},kind=\"timeout\"", labels(slow.addr))
        ),
        1.0
    );
}

#[tokio::test]
async fn status_shows_generation_workers_listeners_and_every_backend() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start(&with_admin(&[a.addr, b.addr]));
    assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);
    let s = proxy.status().await;
    assert_eq!(s["generation"], 1);
    assert_eq!(s["workers"][0]["core"], first_core());
    assert_eq!(s["workers"][0]["requests"], 1);
    assert_eq!(s["listeners"][0]["upstream"], "app");
    let backends = s["upstreams"][0]["backends"].as_array().unwrap();
    let addrs: Vec<&str> = backends
        .iter()
        .map(|b| b["address"].as_str().unwrap())
        .collect();
    assert_eq!(addrs, [a.addr.to_string(), b.addr.to_string()]);
    assert!(backends.iter().all(|b| b["state"] == "up"), "{s}");
    assert_eq!(backends[0]["requests"], 1);

    // The page itself is served, and names what it fetches.
    let page = proxy.admin(Method::GET, "/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("fetch(\"status\""), "{}", page.body);
}

#[tokio::test]
async fn a_token_is_required_when_set_and_unknown_paths_and_methods_are_refused() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = admin_table(Some("s3cret"));
    let proxy = Proxy::start(&setup);
    let r = proxy.admin(Method::GET, "/metrics", None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.headers.contains_key("www-authenticate"));
    let r = proxy.admin(Method::GET, "/status", Some("wrong")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = proxy.admin(Method::GET, "/status", Some("s3cret")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // The page loads without the token (a browser sends none); it then asks for it.
    let page = proxy.admin(Method::GET, "/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("pinlb admin token"), "{}", page.body);

    let r = proxy.admin(Method::GET, "/nope", Some("s3cret")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = proxy.admin(Method::GET, "/reload", Some("s3cret")).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "POST");
    let path = format!("/backends/{}/pause", a.addr);
    let r = proxy.admin(Method::POST, &path, Some("s3cret")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let r = proxy
        .admin(Method::POST, "/backends/127.0.0.1:1/drain", Some("s3cret"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert!(r.body.contains("no upstream has backend 127.0.0.1:1"));
}

#[tokio::test]
async fn a_draining_backend_finishes_its_requests_but_gets_no_new_ones() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start(&with_admin(&[a.addr, b.addr]));
    // A request held at `a`, in flight through the drain.
    a.set_gate(false);
    let held = tokio::spawn({
        let addr = proxy.addr;
        async move { get(addr, "/gated").await }
    });
    a.wait_for_hits(1).await;

    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/drain", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let s = proxy.status().await;
    assert_eq!(s["upstreams"][0]["backends"][0]["state"], "draining");
    assert_eq!(s["upstreams"][0]["backends"][0]["in_flight"], 1);
    for _ in 0..6 {
        assert_eq!(get(proxy.addr, "/").await.backend(), "b");
    }
    assert_eq!(a.hits(), 1);
    let m = proxy.metrics().await;
    assert_eq!(
        m.value(
            "pinlb_backend_admin_state",
            &format!("{},state=\"draining\"", labels(a.addr))
        ),
        1.0
    );

    a.set_gate(true);
    let held = held.await.unwrap();
    assert_eq!((held.status, held.backend()), (StatusCode::OK, "a"));

    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/enable", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let picked: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(get(proxy.addr, "/").await.backend().to_string());
        }
        v
    };
    assert_eq!(picked.iter().filter(|b| *b == "a").count(), 2, "{picked:?}");
}

#[tokio::test]
async fn a_disabled_lone_backend_gets_a_503_that_says_why() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/disable", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.body.contains("1 draining or disabled"), "{}", r.body);
    assert_eq!(a.hits(), 0);
    let s = proxy.status().await;
    assert_eq!(s["upstreams"][0]["backends"][0]["state"], "disabled");
}

/// A config that listens on one port-0 listener for `backends`, with the admin listener on.
fn reload_config(backends: &[SocketAddr], extra: &str) -> String {
    let mut setup = with_admin(backends);
    setup.extra += extra;
    setup.toml()
}

/// [`reload_config`] with up to two workers.
fn two_workers_config(backends: &[SocketAddr]) -> String {
    two_workers(with_admin(backends)).toml()
}

#[tokio::test]
async fn reload_under_load_swaps_a_backend_without_a_single_error() {
    let old = Backend::start("old").await;
    let kept = Backend::start("kept").await;
    let new = Backend::start("new").await;
    let proxy = Proxy::start_file(&two_workers_config(&[old.addr, kept.addr]));

    // Four clients, each on its own keep-alive connection, request after request.
    let (stop_tx, stop) = watch::channel(false);
    let errors = Arc::new(AtomicUsize::new(0));
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let mut clients = Vec::new();
    for i in 0..4 {
        let (addr, stop, errors, done) = (proxy.addr, stop.clone(), errors.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            // Bounded: the test stops them well before.
            for _ in 0..100_000 {
                if *stop.borrow() {
                    break;
                }
                let r = conn.get("/").await;
                if r.status != StatusCode::OK {
                    errors.fetch_add(1, Ordering::SeqCst);
                }
                done[i].fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    old.wait_for_hits(20).await;

    proxy.rewrite(&two_workers_config(&[new.addr, kept.addr]));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains(&format!("backend {} removed", old.addr)),
        "{}",
        r.body
    );
    assert!(
        r.body.contains(&format!("backend {} added", new.addr)),
        "{}",
        r.body
    );
    // Every client finishes the request it had in flight and starts another after the reload;
    // from then on `old` must see nothing.
    let marks: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
    for (i, mark) in marks.iter().enumerate() {
        let d = &done[i];
        tokio::time::timeout(WAIT, async {
            while d.load(Ordering::SeqCst) < mark + 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("client made progress after the reload");
    }
    let old_hits = old.hits();
    new.wait_for_hits(new.hits() + 50).await;
    let _ = stop_tx.send(true);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        errors.load(Ordering::SeqCst),
        0,
        "requests failed around the reload"
    );
    assert_eq!(
        old.hits(),
        old_hits,
        "the removed backend got requests after the reload"
    );
    assert_eq!(proxy.status().await["generation"], 2);
}

#[tokio::test]
async fn an_invalid_reload_is_refused_with_the_error_and_changes_nothing() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_file(&reload_config(&[a.addr], ""));
    proxy.rewrite("[upstream.app]\nalgorithm = \"leastconn\"\nbackends = []\n");
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body
            .contains(".toml:2:13: upstream.app.algorithm: unknown value \"leastconn\""),
        "{}",
        r.body
    );
    assert_eq!(proxy.status().await["generation"], 1);
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");
}

#[tokio::test]
async fn reload_binds_new_listeners_stops_removed_ones_and_keeps_what_needs_a_restart() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let two_listeners = format!(
        "{}\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"other\"\n\n[upstream.other]\nbackends = [{{ address = \"{}\" }}]\n",
        reload_config(&[a.addr], ""),
        b.addr
    );
    let proxy = Proxy::start_file(&reload_config(&[a.addr], ""));
    let mut before = Conn::open(proxy.addr).await;
    assert_eq!(before.get("/").await.backend(), "a");

    proxy.rewrite(&two_listeners);
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let added: SocketAddr = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("listening on "))
        .unwrap_or_else(|| panic!("no new listener in: {}", r.body))
        .parse()
        .unwrap();
    assert_eq!(get(added, "/").await.backend(), "b");
    // The connection opened before the reload is untouched.
    assert_eq!(before.get("/").await.backend(), "a");

    // Back to one listener, and a core change that only a restart can make.
    let cores = format!("cpus = [{}]", first_core());
    let other_core = allowed().into_iter().find(|c| *c != first_core());
    let mut text = reload_config(&[a.addr], "");
    if let Some(c) = other_core {
        text = text.replace(&cores, &format!("cpus = [{c}]"));
    }
    proxy.rewrite(&text);
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("stopped listening on 127.0.0.1:0"),
        "{}",
        r.body
    );
    if other_core.is_some() {
        assert!(r.body.contains("runtime.cpus changed"), "{}", r.body);
        assert!(r.body.contains("needs a restart"), "{}", r.body);
    }
    // A bare connect, not a client: it only probes whether the listener is still there.
    let refused = tokio::net::TcpStream::connect(added).await;
    assert!(refused.is_err(), "the removed listener still accepts");
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");
    assert_eq!(proxy.status().await["generation"], 3);
}

#[tokio::test]
async fn a_reload_keeps_the_admin_state_of_kept_backends_and_their_counters() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let proxy = Proxy::start_file(&reload_config(&[a.addr, b.addr], ""));
    for _ in 0..4 {
        get(proxy.addr, "/").await;
    }
    proxy
        .admin(Method::POST, &format!("/backends/{}/drain", a.addr), None)
        .await;
    proxy.rewrite(&reload_config(&[a.addr, b.addr, c.addr], ""));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let m = proxy.metrics().await;
    assert_eq!(
        m.value("pinlb_backend_requests_total", &labels(a.addr)),
        2.0
    );
    assert_eq!(
        m.value(
            "pinlb_backend_admin_state",
            &format!("{},state=\"draining\"", labels(a.addr))
        ),
        1.0
    );
    assert_eq!(m.value("pinlb_config_generation", ""), 2.0);
    for _ in 0..4 {
        assert_ne!(get(proxy.addr, "/").await.backend(), "a");
    }
    // `b` kept its pooled connection through the reload: every request since went on it.
    assert_eq!(b.accepts(), 1, "the kept backend's connection was reopened");
}

#[tokio::test]
async fn the_access_log_writes_one_line_per_request_with_backend_and_times() {
    let a = Backend::start("a").await;
    for (format, check) in [
        ("combined", check_combined as fn(&str, SocketAddr)),
        ("json", check_json),
    ] {
        let path = temp_config("");
        let mut setup = Setup::with(&[a.addr]);
        setup.extra = format!(
            "[log]\naccess = \"{}\"\nformat = \"{format}\"\n",
            path.display()
        );
        let proxy = Proxy::start(&setup);
        let mut conn = Conn::open(proxy.addr).await;
        for i in 0..3 {
            let r = conn.get(&format!("/item/{i}?q=1")).await;
            assert_eq!(r.status, StatusCode::OK);
        }
        // The log thread writes everything queued before it stops.
        drop(conn);
        proxy.join(WAIT).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        for (i, line) in lines.iter().enumerate() {
            assert!(line.contains(&format!("/item/{i}?q=1")), "{line}");
            check(line, a.addr);
        }
        let _ = std::fs::remove_file(&path);
    }
}

fn check_combined(line: &str, backend: SocketAddr) {
    // 127.0.0.1 - - [29/Nov/2026:23:47:26 +0000] "GET /item/0?q=1 HTTP/1.1" 200 N "-" "-" BACKEND 0.001 0.001
    assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
    assert!(line.contains(" +0000] \"GET /item/"), "{line}");
    let after = line.split("HTTP/1.1\" ").nth(1).unwrap();
    let fields: Vec<&str> = after.split(' ').collect();
    assert_eq!(fields[0], "200", "{line}");
    assert!(fields[1].parse::<u64>().unwrap() > 0, "{line}");
    assert_eq!(fields[4], backend.to_string(), "{line}");
    assert!(fields[5].parse::<f64>().is_ok(), "{line}");
    assert!(fields[6].parse::<f64>().is_ok(), "{line}");
}

fn check_json(line: &str, backend: SocketAddr) {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["client"], "127.0.0.1");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["status"], 200);
    assert!(v["bytes"].as_u64().unwrap() > 0, "{line}");
    assert_eq!(v["backend"], backend.to_string());
    assert!(v["upstream_time"].as_f64().unwrap() <= v["total_time"].as_f64().unwrap());
}

#[tokio::test]
async fn the_binary_reloads_on_sighup_and_reopens_the_access_log_on_sigusr1() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let log = temp_config("");
    let rotated = log.with_extension("1");
    let access = format!("[log]\naccess = \"{}\"\n", log.display());
    let mut setup = with_admin(&[a.addr]);
    setup.extra += &access;
    let mut proxy = BinProxy::spawn(&setup).await;
    // The start-up log says what limits the backends, as `pinlb check` does.
    proxy
        .wait_for_log(
            "upstream app: adaptive concurrency limit per backend, 2 to 1000 (starts at 20, probes at 2 every 30 to 40 s); queue 10000, 30s",
        )
        .await;
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");

    // logrotate: move the file, then SIGUSR1; the next line goes to a new file.
    std::fs::rename(&log, &rotated).unwrap();
    proxy.signal(nix::sys::signal::Signal::SIGUSR1);
    proxy
        .wait_for_log("SIGUSR1: reopening the access log")
        .await;

    let mut next = with_admin(&[b.addr]);
    next.extra += &access;
    std::fs::write(proxy.config_path(), next.toml()).unwrap();
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy.wait_for_log("reloaded: generation 2").await;
    assert_eq!(get(proxy.addr, "/").await.backend(), "b");

    proxy.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(proxy.wait_exit().await.success());
    // Workers hand lines over in batches, so the line from before the rotation may land in
    // either file; the one after the reopen can only be in the new file.
    let before = std::fs::read_to_string(&rotated).unwrap();
    let after = std::fs::read_to_string(&log).expect("SIGUSR1 opened a new file");
    assert_eq!(
        before.lines().count() + after.lines().count(),
        2,
        "{before}{after}"
    );
    assert!(after.contains(&b.addr.to_string()), "{after}");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&rotated);
}

#[tokio::test]
async fn a_post_from_a_page_of_another_origin_is_refused() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    let addr = proxy.admin.unwrap();
    let path = format!("/backends/{}/disable", a.addr);
    let mut req = request(Method::POST, &path, empty());
    req.headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    let r = Conn::open(addr).await.fetch(req).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(
        get(proxy.addr, "/").await.backend(),
        "a",
        "the backend was disabled"
    );
    // The page's own requests, and clients that are not browsers, are served.
    let mut req = request(Method::POST, &path, empty());
    req.headers_mut()
        .insert("sec-fetch-site", "same-origin".parse().unwrap());
    let r = Conn::open(addr).await.fetch(req).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn an_open_keep_alive_connection_follows_a_reload_of_the_trusted_proxies() {
    let a = Backend::start("a").await;
    let trusting = reload_config(&[a.addr], "\n[forwarded]\ntrusted = [\"127.0.0.1\"]\n");
    let proxy = Proxy::start_file(&trusting);
    let mut conn = Conn::open(proxy.addr).await;
    let spoofed = || {
        let mut req = request(Method::GET, "/", empty());
        req.headers_mut()
            .insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
        req
    };
    let xff = |a: &Backend| {
        a.requests()
            .last()
            .unwrap()
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    assert_eq!(conn.fetch(spoofed()).await.status, StatusCode::OK);
    assert_eq!(xff(&a), "203.0.113.9, 127.0.0.1");

    proxy.rewrite(&reload_config(&[a.addr], ""));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(conn.fetch(spoofed()).await.status, StatusCode::OK);
    assert_eq!(
        xff(&a),
        "127.0.0.1",
        "the same connection is no longer trusted"
    );
}

#[tokio::test]
async fn removing_health_checks_in_a_reload_brings_a_down_backend_back() {
    let a = Backend::start("a").await;
    let checked = reload_config(
        &[a.addr],
        "[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\nfall = 1\nrise = 1\n",
    );
    let proxy = Proxy::start_file(&checked);
    a.set_health(503);
    // Bounded: a check runs every 100 ms.
    let down = poll(100, Duration::from_millis(50), async || {
        (proxy.status().await["upstreams"][0]["backends"][0]["health"] == "down").then_some(())
    })
    .await
    .is_some();
    assert!(down, "health checks never took the backend down");
    assert_eq!(
        get(proxy.addr, "/").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    proxy.rewrite(&reload_config(&[a.addr], ""));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");
}

#[tokio::test]
async fn a_client_that_leaves_before_the_response_is_logged_with_499() {
    let slow = Backend::start("slow").await;
    let path = temp_config("");
    let mut setup = Setup::with(&[slow.addr]);
    setup.extra = format!(
        "[log]\naccess = \"{}\"\nformat = \"json\"\n",
        path.display()
    );
    let proxy = Proxy::start(&setup);
    let mut s = RawConn::open(proxy.addr).await;
    s.send(b"GET /sleep/3000 HTTP/1.1\r\nHost: a\r\n\r\n").await;
    slow.wait_for_hits(1).await;
    drop(s);
    // A complete exchange too, so the exact byte count is checked as well.
    let r = get(proxy.addr, "/done").await;
    assert_eq!(r.status, StatusCode::OK);
    proxy.join(WAIT).await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let gone = lines
        .iter()
        .find(|v| v["path"] == "/sleep/3000")
        .unwrap_or_else(|| panic!("no line for the abandoned request in:\n{text}"));
    assert_eq!(gone["status"], 499, "{text}");
    assert_eq!(gone["bytes"], 0);
    let done = lines.iter().find(|v| v["path"] == "/done").unwrap();
    assert_eq!(done["status"], 200);
    assert_eq!(done["bytes"], r.body.len());
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_reload_does_not_restart_the_count_of_failed_checks() {
    let a = Backend::start("a").await;
    a.set_health(503);
    let checked = reload_config(
        &[a.addr],
        "[upstream.app.health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"100ms\"\nfall = 3\nrise = 1\n",
    );
    let proxy = Proxy::start_file(&checked);
    a.wait_for_probes(2).await;
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // Bounded: probes come every 200 ms. The assertion below says whether it got there.
    poll(200, Duration::from_millis(20), async || {
        (proxy.status().await["upstreams"][0]["backends"][0]["health"] == "down").then_some(())
    })
    .await;
    let probes = a.probes();
    assert_eq!(
        proxy.status().await["upstreams"][0]["backends"][0]["health"],
        "down"
    );
    // The third failure takes it down: the two from before the reload still count.
    assert!(probes <= 3, "down only after {probes} failed probes");
}

/// Two upstreams that both list `shared`, each with a listener of its own: `app` (the first
/// listener) with `only_app` too, `api` (the second) with `only_api`; `extra` follows `api`.
fn shared_backend_config(
    shared: SocketAddr,
    only_app: SocketAddr,
    only_api: SocketAddr,
    extra: &str,
) -> String {
    let mut setup = with_admin(&[shared, only_app]);
    setup.extra += &format!(
        "\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"api\"\n\n\
         [upstream.api]\n\
         backends = [{{ address = \"{shared}\" }}, {{ address = \"{only_api}\" }}]\n\n{extra}"
    );
    setup.toml()
}

/// Which backends answer `n` requests to `addr`, sorted.
async fn answered_by(addr: SocketAddr, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let r = get(addr, "/").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        ids.push(r.backend().to_string());
    }
    ids.sort();
    ids
}

/// The `/status` entry of the backend at `addr` in upstream `name`.
fn status_of(s: &serde_json::Value, name: &str, addr: SocketAddr) -> serde_json::Value {
    let u = s["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap_or_else(|| panic!("no upstream {name} in {s}"));
    u["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["address"] == addr.to_string())
        .unwrap_or_else(|| panic!("no backend {addr} in upstream {name}: {s}"))
        .clone()
}

#[tokio::test]
async fn one_address_in_two_upstreams_is_drained_in_both_by_address_or_in_one_by_upstream() {
    let shared = Backend::start("shared").await;
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start_toml(&shared_backend_config(shared.addr, a.addr, b.addr, ""));
    let (app, api) = (proxy.addrs[0], proxy.addrs[1]);

    // Each upstream proxies to it, and counts its own requests under its own label.
    assert_eq!(answered_by(app, 4).await, ["a", "a", "shared", "shared"]);
    assert_eq!(
        answered_by(api, 6).await,
        ["b", "b", "b", "shared", "shared", "shared"]
    );
    let m = proxy.metrics().await;
    let shared_in = |u: &str| format!("upstream=\"{u}\",backend=\"{}\"", shared.addr);
    assert_eq!(
        m.value("pinlb_backend_requests_total", &shared_in("app")),
        2.0
    );
    assert_eq!(
        m.value("pinlb_backend_requests_total", &shared_in("api")),
        3.0
    );

    // By address alone: every upstream that has it.
    let r = proxy
        .admin(
            Method::POST,
            &format!("/backends/{}/drain", shared.addr),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["upstreams"], serde_json::json!(["api", "app"]), "{v}");
    let s = proxy.status().await;
    for u in ["app", "api"] {
        assert_eq!(status_of(&s, u, shared.addr)["state"], "draining", "{u}");
    }
    assert_eq!(answered_by(app, 4).await, ["a"; 4]);
    assert_eq!(answered_by(api, 4).await, ["b"; 4]);
    assert_eq!(shared.hits(), 5);

    // Qualified by upstream: that upstream only.
    let r = proxy
        .admin(
            Method::POST,
            &format!("/upstreams/app/backends/{}/enable", shared.addr),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["upstreams"], serde_json::json!(["app"]), "{v}");
    let s = proxy.status().await;
    assert_eq!(status_of(&s, "app", shared.addr)["state"], "up");
    assert_eq!(status_of(&s, "api", shared.addr)["state"], "draining");
    assert_eq!(answered_by(app, 4).await, ["a", "a", "shared", "shared"]);
    assert_eq!(answered_by(api, 4).await, ["b"; 4]);

    let r = proxy
        .admin(
            Method::POST,
            &format!("/upstreams/web/backends/{}/enable", shared.addr),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.body.contains("no upstream \"web\""), "{}", r.body);
    let r = proxy
        .admin(
            Method::POST,
            &format!("/upstreams/app/backends/{}/drain", b.addr),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(
        r.body
            .contains(&format!("upstream \"app\" has no backend {}", b.addr)),
        "{}",
        r.body
    );
    let r = proxy
        .admin(
            Method::GET,
            &format!("/upstreams/app/backends/{}/drain", shared.addr),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn one_address_in_two_upstreams_has_its_own_health_in_each() {
    let shared = Backend::start("shared").await;
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    // Checks in `api` only.
    let proxy = Proxy::start_toml(&shared_backend_config(
        shared.addr,
        a.addr,
        b.addr,
        "[upstream.api.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\nfall = 1\nrise = 1\n",
    ));
    let (app, api) = (proxy.addrs[0], proxy.addrs[1]);
    shared.set_health(503);
    // Bounded: a check runs every 100 ms.
    let mut down = false;
    for _ in 0..100 {
        if status_of(&proxy.status().await, "api", shared.addr)["health"] == "down" {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(down, "health checks never took the backend down in api");
    assert_eq!(
        status_of(&proxy.status().await, "app", shared.addr)["health"],
        "up"
    );
    assert_eq!(answered_by(api, 4).await, ["b"; 4]);
    assert_eq!(answered_by(app, 4).await, ["a", "a", "shared", "shared"]);
}

#[tokio::test]
async fn every_response_is_counted_by_code_and_source_including_pinlbs_own_503s() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    let listener = format!("listener=\"{}\"", proxy.addr);
    assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);
    assert_eq!(
        get(proxy.addr, "/status/404").await.status,
        StatusCode::NOT_FOUND
    );
    let r = proxy
        .admin(Method::POST, &format!("/backends/{}/disable", a.addr), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            get(proxy.addr, "/").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    let m = proxy.metrics().await;
    let code = |code: u16, source: &str| {
        m.get(
            "pinlb_responses_total",
            &format!("{listener},code=\"{code}\",source=\"{source}\""),
        )
    };
    assert_eq!(code(503, "pinlb"), Some(3.0), "{}", m.0);
    assert_eq!(code(200, "backend"), Some(1.0));
    assert_eq!(code(404, "backend"), Some(1.0));
    assert_eq!(code(503, "backend"), None, "codes never sent are left out");
    let class = |c: &str| {
        m.value(
            "pinlb_responses_by_class_total",
            &format!("{listener},class=\"{c}\""),
        )
    };
    assert_eq!(
        (class("2xx"), class("4xx"), class("5xx"), class("3xx")),
        (1.0, 1.0, 3.0, 0.0)
    );
    // Every request is in the duration histogram, whatever answered it.
    let routed = format!("{listener},upstream=\"app\"");
    assert_eq!(
        m.value("pinlb_request_duration_seconds_count", &routed),
        5.0
    );
    assert_eq!(
        m.value(
            "pinlb_request_duration_seconds_bucket",
            &format!("{routed},le=\"60\"")
        ),
        5.0
    );
}

#[tokio::test]
async fn requests_pinlb_refuses_are_counted_by_cause() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    let listener = format!("listener=\"{}\"", proxy.addr);
    let r = raw_request(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 400);
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let r = raw_request(proxy.addr, huge.as_bytes(), false).await;
    assert_eq!(r.status, 431);
    let m = proxy.metrics().await;
    let cause = |c: &str| {
        m.value(
            "pinlb_client_errors_total",
            &format!("{listener},cause=\"{c}\""),
        )
    };
    assert_eq!(
        (
            cause("malformed"),
            cause("head_too_large"),
            cause("timeout")
        ),
        (1.0, 1.0, 0.0)
    );
    assert_eq!(
        m.value(
            "pinlb_responses_total",
            &format!("{listener},code=\"400\",source=\"pinlb\"")
        ),
        1.0
    );
    assert_eq!(a.hits(), 0);
}

#[tokio::test]
async fn metrics_carry_build_info_and_the_process_figures_prometheus_clients_export() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    // The kernel counts a process's CPU in clock ticks (10 ms): run alone, this test's process
    // may not have spent one yet. Spend one, bounded in time, before the scrape reads it.
    let ticks = || {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ticks() == 0 && std::time::Instant::now() < deadline {
        std::hint::black_box((0..100_000u64).fold(0u64, |a, b| a ^ b.wrapping_mul(31)));
    }
    let m = proxy.metrics().await;
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        m.value(
            "pinlb_build_info",
            &format!("version=\"{version}\",profile=\"debug\"")
        ),
        1.0
    );
    assert!(m.value("process_cpu_seconds_total", "") > 0.0);
    // Tests run in one process: these are the test binary's own figures, as they should be.
    assert!(m.value("process_resident_memory_bytes", "") > 1_000_000.0);
    assert!(m.value("process_open_fds", "") >= 3.0);
    let started = m.value("process_start_time_seconds", "");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started <= now + 1.0 && started > now - 24.0 * 3600.0,
        "{started} vs {now}"
    );
}

#[tokio::test]
async fn head_works_on_every_get_endpoint_of_the_admin_listener() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    for path in ["/", "/status", "/metrics"] {
        let got = proxy.admin(Method::GET, path, None).await;
        let head = proxy.admin(Method::HEAD, path, None).await;
        assert_eq!(head.status, StatusCode::OK, "HEAD {path}");
        assert!(head.body.is_empty(), "HEAD {path}: {}", head.body);
        assert_eq!(
            head.headers["content-type"], got.headers["content-type"],
            "{path}"
        );
        assert!(head.headers.contains_key("content-length"), "HEAD {path}");
    }
    let r = proxy.admin(Method::PUT, "/metrics", None).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "GET, HEAD");
}

#[tokio::test]
async fn a_reload_that_changes_nothing_answers_one_line() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start_file(&reload_config(&[a.addr], ""));
    // Served once: the worker runs generation 1, so a reload may follow it.
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, "reloaded: generation 2\nno change\n");
}

#[tokio::test]
async fn a_reload_lists_every_setting_it_changes() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = with_admin(&[a.addr, b.addr]);
    setup.extra += "\n[upstream.app.health]\npath = \"/\"\ninterval = \"2s\"\n";
    let proxy = Proxy::start_file(&setup.toml());
    assert_eq!(proxy.status().await["generation"], 1);
    let weighted = format!("address = \"{}\", weight = 5", a.addr);
    let next = setup
        .toml()
        .replace(&format!("address = \"{}\", weight = 1", a.addr), &weighted)
        .replace("interval = \"2s\"", "interval = \"5s\"")
        .replace("algorithm = \"round_robin\"", "algorithm = \"least_conn\"");
    assert!(next.contains(&weighted), "{next}");
    proxy.rewrite(&next);
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let lines: Vec<&str> = r.body.lines().collect();
    assert_eq!(lines[0], "reloaded: generation 2", "{}", r.body);
    for want in [
        "upstream app: algorithm round_robin -> least_conn".to_string(),
        "upstream app: health.interval 2s -> 5s".to_string(),
        format!("upstream app: backend {}: weight 1 -> 5", a.addr),
    ] {
        assert!(
            lines.contains(&want.as_str()),
            "no {want:?} in:\n{}",
            r.body
        );
    }
    assert_eq!(
        lines.len(),
        4,
        "one line per change, nothing else:\n{}",
        r.body
    );
}

/// `promtool check metrics` (Debian package `prometheus`; scripts/test installs it) on a scrape
/// of a proxy that has counted something of every kind.
#[tokio::test]
async fn promtool_accepts_the_metrics() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);
    let r = raw_request(proxy.addr, b"BAD\r\n\r\n", false).await;
    assert_eq!(r.status, 400);
    let m = proxy.metrics().await;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool (Debian package `prometheus`; scripts/test installs it)");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(m.0.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn status_shows_the_version_listener_connections_and_each_backends_responses_and_retries() {
    let a = Backend::start("a").await;
    let dead = Refusing::new();
    let mut setup = with_admin(&[dead.addr, a.addr]);
    setup.extra.push_str(
        "\n[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\nrise = 1\nfall = 100\n",
    );
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..4 {
        assert_eq!(conn.get("/").await.backend(), "a");
    }
    let s = proxy.status().await;
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    let l = &s["listeners"][0];
    assert_eq!(l["address"], proxy.addr.to_string());
    assert_eq!(
        (l["upstream"].as_str(), l["connections"].as_u64()),
        (Some("app"), Some(1))
    );
    assert_eq!(l["responses"]["2xx"], 4);
    let backends = &s["upstreams"][0]["backends"];
    let (refusing, good) = (&backends[0], &backends[1]);
    assert!(refusing["retries"].as_u64() >= Some(1), "{refusing}");
    assert_eq!(good["responses"]["2xx"], 4);
    assert!(good["p50_ms"].as_f64().is_some_and(|v| v > 0.0), "{good}");
    assert!(good["state_seconds"].as_f64().is_some());
    // Health probes run every 100 ms: the refusing backend's last one failed.
    let failed = poll(50, Duration::from_millis(100), async || {
        let s = proxy.status().await;
        let c = s["upstreams"][0]["backends"][0]["last_check"].clone();
        (c["passed"] == false).then_some(c)
    })
    .await
    .expect("a failed check is shown");
    assert!(
        failed["seconds_ago"].as_f64().is_some_and(|s| s < 5.0),
        "{failed}"
    );
}

/// `GET path` on the admin listener without a token: what a kubelet probe sends.
async fn probe(proxy: &Proxy, path: &str) -> Reply {
    proxy.admin(Method::GET, path, None).await
}

#[tokio::test]
async fn ready_and_live_need_no_token_and_ready_names_the_upstream_whose_backend_is_down() {
    let mut a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = admin_table(Some("s3cret"))
        + "[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"50ms\"\nfall = 1\nrise = 1\n";
    let proxy = Proxy::start(&setup);
    let live = probe(&proxy, "/live").await;
    assert_eq!(
        (live.status, live.body.as_str()),
        (StatusCode::OK, "live\n")
    );
    // Ready once the workers accept, which a loaded machine may take a moment after the start
    // (until then /ready says "0 of 1 workers accept", as it should).
    let ready = poll(100, Duration::from_millis(50), async || {
        let r = probe(&proxy, "/ready").await;
        (r.status == StatusCode::OK).then_some(r.body)
    })
    .await
    .expect("/ready never answered 200 with the backend up");
    assert_eq!(ready, "ready\n");
    assert_eq!(
        probe(&proxy, "/status").await.status,
        StatusCode::UNAUTHORIZED
    );
    let r = proxy.admin(Method::POST, "/ready", Some("s3cret")).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);

    // Checks fail: not ready, and the reason names the upstream; still live.
    a.set_health(503);
    let why = poll(100, Duration::from_millis(50), async || {
        let r = probe(&proxy, "/ready").await;
        (r.status == StatusCode::SERVICE_UNAVAILABLE).then_some(r.body)
    })
    .await
    .expect("/ready never answered 503 with the backend down");
    assert!(
        why.contains(
            "not ready: upstream app: no backend available among 1: 1 down by health checks"
        ),
        "{why}"
    );
    assert_eq!(probe(&proxy, "/live").await.status, StatusCode::OK);
    a.set_health(200);
    let back = poll(100, Duration::from_millis(50), async || {
        (probe(&proxy, "/ready").await.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "/ready never came back once the checks passed"
    );

    // A crash: the port refuses, the checks fail, not ready again.
    a.kill().await;
    let down = poll(100, Duration::from_millis(50), async || {
        let r = probe(&proxy, "/ready").await;
        (r.status == StatusCode::SERVICE_UNAVAILABLE && r.body.contains("upstream app"))
            .then_some(())
    })
    .await;
    assert!(down.is_some(), "/ready stayed 200 with the backend killed");
}

#[tokio::test]
async fn ready_answers_503_while_a_stop_drains_and_live_stays_200() {
    let a = Backend::start("a").await;
    let mut proxy = Proxy::start(&with_admin(&[a.addr]));
    a.set_gate(false);
    let held = tokio::spawn({
        let addr = proxy.addr;
        async move { get(addr, "/gated").await }
    });
    a.wait_for_hits(1).await;
    proxy.trigger_shutdown();
    let why = poll(100, Duration::from_millis(20), async || {
        let r = probe(&proxy, "/ready").await;
        (r.status == StatusCode::SERVICE_UNAVAILABLE).then_some(r.body)
    })
    .await
    .expect("/ready never said 503 during the drain");
    assert_eq!(why, "not ready: draining for a stop\n");
    assert_eq!(probe(&proxy, "/live").await.status, StatusCode::OK);
    a.set_gate(true);
    let held = held.await.unwrap();
    assert_eq!((held.status, held.backend()), (StatusCode::OK, "a"));
    proxy.join(WAIT).await.expect("a clean stop");
}

#[tokio::test]
async fn status_carries_each_rate_over_the_last_completed_second_and_each_backends_limit() {
    let a = Backend::start("a").await;
    let dead = Refusing::new();
    let mut setup = with_admin(&[dead.addr, a.addr]);
    // Every other request tries `dead` first and is retried on `a`: errors at a steady rate.
    setup
        .extra
        .push_str("\n[upstream.app.passive]\nmax_fails = 0\n");
    setup.backend_keys = vec![String::new(), "max_conns = 8".into()];
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    let rates = |s: &serde_json::Value| {
        let b = &s["upstreams"][0]["backends"];
        [
            s["listeners"][0]["requests_per_second"].as_f64(),
            s["workers"][0]["requests_per_second"].as_f64(),
            b[1]["requests_per_second"].as_f64(),
            b[0]["errors_per_second"].as_f64(),
        ]
    };
    // Requests until a completed second has some of them in it.
    let busy = poll(100, Duration::from_millis(100), async || {
        for _ in 0..10 {
            assert_eq!(conn.get("/").await.backend(), "a");
        }
        let s = proxy.status().await;
        rates(&s)
            .iter()
            .all(|r| r.is_some_and(|r| r > 0.0))
            .then_some(s)
    })
    .await
    .expect("every rate shows the traffic");
    let window = busy["rate_window_seconds"].as_f64();
    assert!(window.is_some_and(|w| w > 0.0 && w < 10.0), "{busy}");
    let b = &busy["upstreams"][0]["backends"];
    assert_eq!(b[1]["errors_per_second"], 0.0, "{busy}");
    assert_eq!(
        (b[0]["max_conns"].clone(), b[1]["max_conns"].clone()),
        (serde_json::Value::Null, 8.into())
    );

    // A rate is of the last completed second, not since the start: with the traffic stopped
    // it falls to zero while the counts stay.
    let idle = poll(100, Duration::from_millis(100), async || {
        let s = proxy.status().await;
        (rates(&s) == [Some(0.0); 4]).then_some(s)
    })
    .await
    .expect("the rates fall to zero once the traffic stops");
    assert!(
        idle["listeners"][0]["requests"].as_u64() >= Some(10),
        "{idle}"
    );
}

#[tokio::test]
async fn a_learning_backends_limit_its_time_without_queueing_and_its_history_show_in_status_and_metrics()
 {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    // `a` learns a limit (the default); `b`'s max_conns is a fixed one, and it learns none.
    let mut setup = with_admin(&[a.addr, b.addr]);
    setup.backend_keys = vec![String::new(), "max_conns = 8".into()];
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    // Its first window (100 ms and 8 answers at least) is a probe at the floor, which measures
    // its time without queueing.
    poll(100, Duration::from_millis(20), async || {
        for _ in 0..10 {
            assert_eq!(conn.get("/").await.status, StatusCode::OK);
        }
        let s = proxy.status().await;
        s["upstreams"][0]["backends"][0]["min_rtt_ms"]
            .as_f64()
            .map(|_| ())
    })
    .await
    .expect("a's time without queueing is measured");
    // A window closes only on an answer: with the traffic stopped, what /status and /metrics
    // say is the same limit.
    let s = proxy.status().await;
    let m = proxy.metrics().await;
    assert_eq!(s["concurrency_limit_history_every_seconds"], 5, "{s}");
    let (learns, fixed) = (
        &s["upstreams"][0]["backends"][0],
        &s["upstreams"][0]["backends"][1],
    );
    let limit = learns["concurrency_limit"].as_u64().expect("a limit");
    assert!((2..=1000).contains(&limit), "{learns}");
    assert_eq!(learns["awaiting"], 0, "{learns}");
    let min_rtt_ms = learns["min_rtt_ms"].as_f64().unwrap();
    assert!(min_rtt_ms > 0.0 && min_rtt_ms < 1000.0, "{learns}");
    assert_eq!(
        m.value("pinlb_backend_concurrency_limit", &labels(a.addr)),
        limit as f64
    );
    let min_rtt_s = m.value("pinlb_backend_min_rtt_seconds", &labels(a.addr));
    assert!(
        (min_rtt_s * 1000.0 - min_rtt_ms).abs() < 0.001,
        "{min_rtt_s}"
    );
    // The sampler keeps the limit from the start (every 5 s, and at once): the page's chart
    // has a past when it opens.
    let history = learns["concurrency_limit_history"].as_array().unwrap();
    assert!(!history.is_empty(), "{learns}");
    assert!(
        history
            .iter()
            .all(|l| l.as_u64().is_some_and(|l| (2..=1000).contains(&l))),
        "{learns}"
    );
    for key in ["concurrency_limit", "min_rtt_ms"] {
        assert!(fixed[key].is_null(), "{key}: {fixed}");
    }
    assert_eq!(fixed["concurrency_limit_history"], serde_json::json!([]));
    assert_eq!(
        m.get("pinlb_backend_concurrency_limit", &labels(b.addr)),
        None
    );
    assert_eq!(
        m.get("pinlb_backend_min_rtt_seconds", &labels(b.addr)),
        None
    );

    // A request held at `a` awaits its head: it counts against the limit until answered.
    a.set_gate(false);
    let held = tokio::spawn({
        let addr = proxy.addr;
        async move {
            for _ in 0..2 {
                get(addr, "/gated").await;
            }
        }
    });
    let s = poll(100, Duration::from_millis(20), async || {
        let s = proxy.status().await;
        (s["upstreams"][0]["backends"][0]["in_flight"] == 1).then_some(s)
    })
    .await
    .expect("a request held at a");
    assert_eq!(s["upstreams"][0]["backends"][0]["awaiting"], 1, "{s}");
    a.set_gate(true);
    held.await.unwrap();
}
