//! The response cache (`cache` on a listener or route, `[cache.NAME]` zones): what RFC 9111
//! lets a shared cache store and serve, nginx's `proxy_cache_valid` and `proxy_cache_lock`,
//! `Vary`, a client's conditional request, invalidation by an unsafe method, the status
//! header and log field, the zone's metrics; over HTTP/1.1, h2c and h2 where the protocol
//! could matter. The backend is a [`RawServer`] whose answers each test reads back: every
//! response carries the backend's count of requests so far, so a stored one is told apart
//! from a fresh one by its body.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Method, StatusCode};

/// The origin's answer to a request head: by path, with `n`, its count of requests so far, in
/// the body.
fn answer(head: &str, n: usize) -> Vec<u8> {
    let path = head.split(' ').nth(1).unwrap_or_default();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    if path == "/reval" && header("if-none-match") == "\"r1\"" {
        return format!(
            "HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=60\r\nETag: \"r1\"\r\nX-Version: {n}\r\n\r\n"
        )
        .into_bytes();
    }
    let (lines, body): (&str, String) = match path {
        "/fresh" | "/fresh?a=1" | "/slow" => {
            ("Cache-Control: max-age=60\r\n", format!("fresh {n}"))
        }
        "/short" => (
            "Cache-Control: max-age=1\r\nConnection: close\r\n",
            format!("short {n}"),
        ),
        "/strict" => (
            "Cache-Control: max-age=1, must-revalidate\r\nConnection: close\r\n",
            format!("strict {n}"),
        ),
        "/nostore" => ("Cache-Control: no-store\r\n", format!("nostore {n}")),
        "/private" => (
            "Cache-Control: private, max-age=60\r\n",
            format!("private {n}"),
        ),
        "/cookie" => (
            "Cache-Control: max-age=60\r\nSet-Cookie: id=1\r\n",
            format!("cookie {n}"),
        ),
        "/plain" => ("", format!("plain {n}")),
        "/vary" => (
            "Cache-Control: max-age=60\r\nVary: Accept-Encoding\r\n",
            format!("vary {} {n}", header("accept-encoding")),
        ),
        "/etag" => (
            "Cache-Control: max-age=60\r\nETag: \"v1\"\r\nLast-Modified: Mon, 02 Nov 2026 10:00:00 GMT\r\n",
            format!("etag {n}"),
        ),
        "/reval" => (
            "Cache-Control: max-age=1\r\nETag: \"r1\"\r\n",
            format!("reval {n}"),
        ),
        _ => ("", format!("other {n}")),
    };
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Version: {n}\r\n{lines}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The origin: [`answer`], after 300 ms for `/slow`, closing the connection after `/short`.
async fn origin() -> RawServer {
    let count = Arc::new(AtomicUsize::new(0));
    RawServer::start(move |seen| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        let bytes = answer(&seen.head, n);
        if seen.head.starts_with("GET /slow ") {
            RawAction::RespondAfter(Duration::from_millis(300), bytes)
        } else if seen.head.starts_with("GET /short ") || seen.head.starts_with("GET /strict ") {
            // No connection kept: once the listener is gone, the backend is down.
            RawAction::RespondAndClose(bytes)
        } else {
            RawAction::Respond(bytes)
        }
    })
    .await
}

/// A listener to `origin` with `cache = { zone = "micro", KEYS }` and a zone of its own.
fn setup(origin: &RawServer, keys: &str) -> Setup {
    let mut setup = Setup::with(&[origin.addr]);
    setup.listener_keys +=
        &format!("cache = {{ zone = \"micro\", status_header = \"X-Cache-Status\"{keys} }}\n");
    setup.extra += "[cache.micro]\nmax_size = \"1MiB\"\n";
    setup
}

fn cache_status(r: &Reply) -> &str {
    r.headers
        .get("x-cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
}

async fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = request(Method::GET, path, empty());
    for (k, v) in headers {
        let name = http::HeaderName::from_bytes(k.as_bytes()).unwrap();
        req.headers_mut()
            .insert(name, http::HeaderValue::from_str(v).unwrap());
    }
    Conn::open(addr).await.fetch(req).await
}

/// A fresh response is stored on its way and then answered from the zone, with its `Age`,
/// over every protocol; the backend sees one request.
async fn a_fresh_response_is_served_from_the_cache(proto: Proto) {
    let origin = origin().await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(proto, &[origin.addr], &pki);
    setup.listener_keys += "cache = { zone = \"micro\", status_header = \"X-Cache-Status\" }\n";
    setup.extra += "[cache.micro]\nmax_size = \"1MiB\"\n";
    let (setup, log) = with_log(setup, "{request_uri} {status} {cache_status}");
    let proxy = Proxy::start(&setup);
    let mut client = Client::open(proto, proxy.addr, &pki).await;
    let first = client.get("/fresh").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::OK, "fresh 1")
    );
    assert_eq!(cache_status(&first), "MISS");
    let second = client.get("/fresh").await;
    assert_eq!(second.body, "fresh 1", "{second:?}");
    assert_eq!(cache_status(&second), "HIT");
    let age: u64 = second.headers["age"].to_str().unwrap().parse().unwrap();
    assert!(age < 60, "{second:?}");
    assert_eq!(second.headers["content-type"], "text/plain");
    assert_eq!(
        second.headers.get_all("date").iter().count(),
        1,
        "{second:?}"
    );
    assert_eq!(origin.requests(), 1);
    let lines = lines_after(proxy, &log).await;
    assert_eq!(lines, ["/fresh 200 MISS", "/fresh 200 HIT"]);
}
each_proto!(a_fresh_response_is_served_from_the_cache);

#[tokio::test]
async fn what_the_rules_forbid_is_never_served_to_a_second_client() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    for path in ["/nostore", "/private", "/cookie", "/plain"] {
        let a = get(proxy.addr, path).await;
        let b = get(proxy.addr, path).await;
        assert_ne!(a.body, b.body, "{path} was served twice: {b:?}");
        assert_eq!(cache_status(&b), "MISS", "{path}");
    }
    // An Authorization request's answer is not stored either (RFC 9111 section 3.5).
    let a = get_with(proxy.addr, "/fresh?a=1", &[("authorization", "Basic YTpi")]).await;
    let b = get_with(proxy.addr, "/fresh?a=1", &[("authorization", "Basic YTpi")]).await;
    assert_ne!(a.body, b.body);
    assert_eq!(origin.requests(), 10);
}

#[tokio::test]
async fn valid_gives_a_lifetime_to_a_response_without_one_and_ignore_headers_stores_past_them() {
    let origin = origin().await;
    let keys =
        ", valid = { \"200\" = \"1m\" }, ignore_headers = [\"Cache-Control\", \"Set-Cookie\"]";
    let proxy = Proxy::start(&setup(&origin, keys));
    for path in ["/plain", "/nostore", "/cookie"] {
        let a = get(proxy.addr, path).await;
        let b = get(proxy.addr, path).await;
        assert_eq!(a.body, b.body, "{path}");
        assert_eq!(cache_status(&b), "HIT", "{path}");
        // An ignored Set-Cookie is not stored: one client's cookie is never another's.
        assert!(b.headers.get("set-cookie").is_none(), "{path}: {b:?}");
    }
    assert_eq!(origin.requests(), 3);
}

#[tokio::test]
async fn variants_by_vary_are_kept_apart() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    let gzip = [("accept-encoding", "gzip")];
    let a = get_with(proxy.addr, "/vary", &gzip).await;
    let b = get(proxy.addr, "/vary").await;
    assert_eq!(a.body, "vary gzip 1");
    assert_eq!(b.body, "vary  2", "identity got the gzip variant: {b:?}");
    let a2 = get_with(proxy.addr, "/vary", &gzip).await;
    let b2 = get(proxy.addr, "/vary").await;
    assert_eq!(
        (a2.body.as_str(), cache_status(&a2)),
        ("vary gzip 1", "HIT")
    );
    assert_eq!((b2.body.as_str(), cache_status(&b2)), ("vary  2", "HIT"));
    assert_eq!(origin.requests(), 2);
}

#[tokio::test]
async fn a_conditional_request_is_answered_304_from_the_cache_and_head_from_a_stored_get() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    let full = get(proxy.addr, "/etag").await;
    assert_eq!(full.body, "etag 1");
    let r = get_with(
        proxy.addr,
        "/etag",
        &[("if-none-match", "W/\"v1\", \"v0\"")],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED, "{r:?}");
    assert_eq!(r.headers["etag"], "\"v1\"");
    assert!(r.body.is_empty());
    let r = get_with(proxy.addr, "/etag", &[("if-none-match", "\"v2\"")]).await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "etag 1"));
    let r = get_with(
        proxy.addr,
        "/etag",
        &[("if-modified-since", "Tue, 03 Nov 2026 10:00:00 GMT")],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED, "{r:?}");
    let mut head = Conn::open(proxy.addr).await;
    let r = head.fetch(request(Method::HEAD, "/etag", empty())).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-length"], "6");
    assert_eq!(cache_status(&r), "HIT");
    assert_eq!(origin.requests(), 1);
}

#[tokio::test]
async fn a_miss_goes_without_the_clients_conditions_so_that_its_answer_is_stored() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    let cond = [("if-none-match", "\"v1\""), ("range", "bytes=0-1")];
    let first = get_with(proxy.addr, "/etag", &cond).await;
    assert_eq!(
        (first.status, cache_status(&first)),
        (StatusCode::OK, "MISS")
    );
    let seen = origin.seen();
    let head = seen[0].head.to_ascii_lowercase();
    assert!(
        !head.contains("if-none-match") && !head.contains("range:"),
        "{head}"
    );
    // Stored: the same condition is now answered from the zone.
    let again = get_with(proxy.addr, "/etag", &cond[..1]).await;
    assert_eq!(
        (again.status, cache_status(&again)),
        (StatusCode::NOT_MODIFIED, "HIT")
    );
    assert_eq!(origin.requests(), 1);
}

#[tokio::test]
async fn a_post_that_succeeds_removes_what_its_key_holds() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    assert_eq!(get(proxy.addr, "/fresh").await.body, "fresh 1");
    assert_eq!(get(proxy.addr, "/fresh").await.body, "fresh 1");
    let post = request(Method::POST, "/fresh", full(Bytes::from_static(b"x")));
    let r = Conn::open(proxy.addr).await.fetch(post).await;
    assert_eq!(r.status, StatusCode::OK);
    let after = get(proxy.addr, "/fresh").await;
    assert_eq!(
        (after.body.as_str(), cache_status(&after)),
        ("fresh 3", "MISS")
    );
}

#[tokio::test]
async fn a_stale_response_is_fetched_again_as_expired() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    assert_eq!(get(proxy.addr, "/short").await.body, "short 1");
    // Bounded: max-age=1 runs out within 2 s; each round is one request.
    let expired = poll(40, Duration::from_millis(100), async || {
        let r = get(proxy.addr, "/short").await;
        (cache_status(&r) == "EXPIRED").then_some(r)
    })
    .await
    .expect("EXPIRED within 4 s");
    assert_eq!(expired.body, format!("short {}", origin.requests()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_of_one_key_send_one_request_across_workers() {
    let origin = origin().await;
    let mut setup = setup(&origin, "");
    // Two workers where the machine has two cores: the wait crosses them.
    setup.cpus = allowed().into_iter().take(2).collect();
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
    let proxy = Proxy::start(&setup);
    let clients: Vec<_> = (0..100)
        .map(|_| tokio::spawn(get(proxy.addr, "/slow")))
        .collect();
    let mut bodies = Vec::new();
    for c in clients {
        bodies.push(c.await.unwrap().body);
    }
    assert!(bodies.iter().all(|b| b == "fresh 1"), "{bodies:?}");
    assert_eq!(origin.requests(), 1);
    let m = proxy.metrics().await;
    assert_eq!(
        m.value(
            "pinlb_cache_requests_total",
            "zone=\"micro\",status=\"miss\""
        ),
        1.0
    );
    assert!(m.value("pinlb_cache_collapsed_total", "zone=\"micro\"") >= 1.0);
    assert_eq!(m.value("pinlb_cache_stored_total", "zone=\"micro\""), 1.0);
    assert!(m.value("pinlb_cache_bytes", "zone=\"micro\"") > 0.0);
}

#[test]
fn a_route_names_a_zone_that_exists_and_can_turn_its_listeners_cache_off() {
    let bad = "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\ncache = { zone = \"nope\" }\n\
               [upstream.app]\nbackends = [{ address = \"127.0.0.1:9\" }]\n[cache.micro]\n";
    let out = std::process::Command::new(bin())
        .args(["check", "-c"])
        .arg(temp_config(bad))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            ":4:18: listener[0].cache.zone: unknown cache zone \"nope\", expected one of micro"
        ),
        "{stderr}"
    );
    let off = "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\ncache = { zone = \"micro\" }\n\
               [[listener.route]]\npath = \"/live\"\nupstream = \"app\"\ncache = false\n\
               [upstream.app]\nbackends = [{ address = \"127.0.0.1:9\" }]\n[cache.micro]\n";
    let out = std::process::Command::new(bin())
        .args(["check", "-c"])
        .arg(temp_config(off))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("cache in zone micro, key {scheme}://{host}{uri}"),
        "{stdout}"
    );
    assert!(stdout.contains("cache: off"), "{stdout}");
}

/// Polls `path` through `proxy` until its cache status is `want`, each try one request; the
/// stored responses of these tests go stale within 2 s.
async fn until_status(addr: std::net::SocketAddr, path: &str, want: &str) -> Reply {
    poll(40, Duration::from_millis(100), async || {
        let r = get(addr, path).await;
        (cache_status(&r) == want).then_some(r)
    })
    .await
    .unwrap_or_else(|| panic!("{path} never answered {want} within 4 s"))
}

#[tokio::test]
async fn a_stale_response_is_served_while_the_backends_are_down_under_use_stale_error() {
    let origin = origin().await;
    let keys = ", use_stale = [\"error\", \"timeout\"]";
    let proxy = Proxy::start(&setup(&origin, keys));
    assert_eq!(get(proxy.addr, "/short").await.body, "short 1");
    assert_eq!(get(proxy.addr, "/strict").await.body, "strict 2");
    // The backend gone: its port refuses connections.
    drop(origin.into_listener().await);
    let r = until_status(proxy.addr, "/short", "STALE").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "short 1"));
    // must-revalidate: never served stale (RFC 9111 section 4.2.4), whatever use_stale says.
    let r = until_status(proxy.addr, "/strict", "EXPIRED").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{r:?}");
}

#[tokio::test]
async fn without_use_stale_a_backend_that_is_down_gets_its_error() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    assert_eq!(get(proxy.addr, "/short").await.body, "short 1");
    drop(origin.into_listener().await);
    let r = until_status(proxy.addr, "/short", "EXPIRED").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{r:?}");
}

#[tokio::test]
async fn with_background_update_the_stale_response_goes_out_at_once_and_is_refreshed_behind() {
    let origin = origin().await;
    let keys = ", use_stale = [\"updating\"], background_update = true";
    let proxy = Proxy::start(&setup(&origin, keys));
    assert_eq!(get(proxy.addr, "/short").await.body, "short 1");
    let r = until_status(proxy.addr, "/short", "STALE").await;
    assert_eq!(r.body, "short 1");
    origin.wait_for_requests(2).await;
    let r = until_status(proxy.addr, "/short", "HIT").await;
    assert_eq!(r.body, "short 2");
}

#[tokio::test]
async fn a_304_to_the_caches_conditional_request_refreshes_the_stored_headers() {
    let origin = origin().await;
    let proxy = Proxy::start(&setup(&origin, ""));
    let first = get(proxy.addr, "/reval").await;
    assert_eq!(
        (
            first.body.as_str(),
            first.headers["x-version"].to_str().unwrap()
        ),
        ("reval 1", "1")
    );
    let r = until_status(proxy.addr, "/reval", "REVALIDATED").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "reval 1");
    assert_eq!(r.headers["x-version"], "2", "{r:?}");
    let seen = origin.seen();
    assert!(
        seen[1]
            .head
            .to_ascii_lowercase()
            .contains("if-none-match: \"r1\""),
        "{:?}",
        seen[1]
    );
    // Fresh again for the 304's max-age=60, with its headers.
    let r = get(proxy.addr, "/reval").await;
    assert_eq!(
        (
            cache_status(&r),
            r.body.as_str(),
            r.headers["x-version"].to_str().unwrap()
        ),
        ("HIT", "reval 1", "2")
    );
    assert_eq!(origin.requests(), 2);
}

#[tokio::test]
async fn bypass_skips_the_lookup_no_cache_the_store_and_min_uses_waits_for_the_uses() {
    let origin = origin().await;
    let keys = ", bypass = [\"cookie:nocache\", \"header:x-refresh\"], no_cache = [\"arg:a\"], min_uses = 2";
    let proxy = Proxy::start(&setup(&origin, keys));
    // min_uses = 2: the first miss is not stored, the second is.
    assert_eq!(cache_status(&get(proxy.addr, "/fresh").await), "MISS");
    assert_eq!(cache_status(&get(proxy.addr, "/fresh").await), "MISS");
    let hit = get(proxy.addr, "/fresh").await;
    assert_eq!((cache_status(&hit), hit.body.as_str()), ("HIT", "fresh 2"));
    // Bypassed: the backend answers, and its answer is stored for the next one.
    let by = get_with(proxy.addr, "/fresh", &[("cookie", "a=1; nocache=1")]).await;
    assert_eq!((cache_status(&by), by.body.as_str()), ("BYPASS", "fresh 3"));
    let zero = get_with(proxy.addr, "/fresh", &[("x-refresh", "0")]).await;
    assert_eq!(
        (cache_status(&zero), zero.body.as_str()),
        ("HIT", "fresh 3"),
        "a 0 does not hold"
    );
    // no_cache: never stored, however many uses.
    for n in 0..3 {
        let r = get(proxy.addr, "/fresh?a=1").await;
        assert_eq!(cache_status(&r), "MISS", "use {n}: {r:?}");
    }
}

#[tokio::test]
async fn the_admin_api_purges_a_key_with_its_variants_or_a_prefix() {
    let origin = origin().await;
    let mut setup = setup(&origin, "");
    setup.extra += "[admin]\naddress = \"127.0.0.1:0\"\n";
    let proxy = Proxy::start(&setup);
    let gzip = [("accept-encoding", "gzip")];
    for _ in 0..2 {
        get(proxy.addr, "/fresh").await;
        get(proxy.addr, "/etag").await;
        get_with(proxy.addr, "/vary", &gzip).await;
    }
    assert_eq!(origin.requests(), 3);
    let purge = |q: &str| format!("/cache/micro/purge{q}");
    let r = proxy
        .admin(
            Method::POST,
            &purge("?key=http%3A%2F%2Fpinlb.test%2Fvary"),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert!(
        r.body.contains("purged 2 entries"),
        "the key and its variant: {r:?}"
    );
    assert_eq!(
        cache_status(&get_with(proxy.addr, "/vary", &gzip).await),
        "MISS"
    );
    assert_eq!(cache_status(&get(proxy.addr, "/fresh").await), "HIT");
    let r = proxy
        .admin(Method::POST, &purge("?prefix=http://pinlb.test/f"), None)
        .await;
    assert!(r.body.contains("purged 1 entries"), "{r:?}");
    assert_eq!(cache_status(&get(proxy.addr, "/fresh").await), "MISS");
    assert_eq!(cache_status(&get(proxy.addr, "/etag").await), "HIT");
    let r = proxy.admin(Method::POST, "/cache/nope/purge", None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // The status page's figures: 5 answered from the zone of 10 looked up.
    let status = proxy.status().await;
    let zone = &status["caches"][0];
    assert_eq!(zone["zone"], "micro", "{status}");
    assert_eq!(
        (zone["hits"].as_u64(), zone["misses"].as_u64()),
        (Some(5), Some(5)),
        "{zone}"
    );
    assert_eq!(zone["hit_ratio"].as_f64(), Some(0.5), "{zone}");
    assert_eq!(zone["max_size"].as_u64(), Some(1 << 20), "{zone}");
    let m = proxy.metrics().await;
    assert_eq!(m.value("pinlb_cache_evicted_total", "zone=\"micro\""), 0.0);
}
