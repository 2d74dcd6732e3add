//! `limit_rate` and `limit_rate_after` (the first feature module, `proxy/src/modules/`): a
//! response's body paced over HTTP/1.1, h2c and HTTP/2 over TLS alike, a route's `limit_rate =
//! 0` unpaced, the Content-Length kept, the refusal of `limit_rate_after` alone at its place,
//! and `pinlb import` converting nginx's two directives.
//!
//! Real backends, a real pinlb and hyper's clients on loopback; the times are wall-clock, with
//! bounds far from what an unpaced response takes (milliseconds).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use http::Method;
use http_body_util::BodyExt;

/// A paced listener for `proto`, whose route `/fast/` turns the pacing off.
fn paced(proto: Proto, backend: &Backend, pki: &Pki, keys: &str) -> Proxy {
    let mut setup = Setup::for_proto(proto, &[backend.addr], pki);
    setup.listener_keys += keys;
    setup.extra += "[[listener.route]]\npath = \"/fast/\"\nrewrite_prefix = \"/\"\nupstream = \"app\"\nlimit_rate = 0\n";
    Proxy::start(&setup)
}

async fn a_body_goes_out_at_limit_rate_after_limit_rate_after(p: Proto) {
    let backend = Backend::start("a").await;
    let pki = Pki::new();
    let keys = "limit_rate = \"32KiB\"\nlimit_rate_after = \"16KiB\"\n";
    let proxy = paced(p, &backend, &pki, keys);
    let mut client = Client::open(p, proxy.addr, &pki).await;
    // 64 KiB: 16 KiB at once, the other 48 KiB at 32 KiB/s, 1.5 s.
    let started = Instant::now();
    let reply = client.get("/download/65536").await;
    let took = started.elapsed();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.bytes.len(), 65_536);
    assert_eq!(reply.one("content-length"), "65536");
    assert!(
        (Duration::from_millis(1_300)..Duration::from_secs(3)).contains(&took),
        "{p:?}: 64 KiB at 32 KiB/s after 16 KiB took {took:?}"
    );
    // The route that turns it off: the same body unpaced.
    let started = Instant::now();
    let reply = client.get("/fast/download/65536").await;
    let took = started.elapsed();
    assert_eq!(reply.bytes.len(), 65_536);
    assert!(
        took < Duration::from_millis(800),
        "{p:?}: unpaced took {took:?}"
    );
}
each_proto!(a_body_goes_out_at_limit_rate_after_limit_rate_after);

/// A route's own `respond` is paced by the route's keys, on a listener without any.
async fn a_routes_own_answer_is_paced_by_its_route(p: Proto) {
    let backend = Backend::start("a").await;
    let pki = Pki::new();
    let mut setup = Setup::for_proto(p, &[backend.addr], &pki);
    let body = "x".repeat(32 * 1024);
    setup.extra += &format!(
        "[[listener.route]]\npath = \"/answer\"\nrespond = {{ status = 200, body = \"{body}\" }}\nlimit_rate = \"32KiB\"\n"
    );
    let proxy = Proxy::start(&setup);
    let mut client = Client::open(p, proxy.addr, &pki).await;
    let started = Instant::now();
    let reply = client.get("/answer").await;
    let took = started.elapsed();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, body);
    assert!(
        (Duration::from_millis(800)..Duration::from_secs(3)).contains(&took),
        "{p:?}: 32 KiB at 32 KiB/s took {took:?}"
    );
    // The listener's own requests are not paced.
    let started = Instant::now();
    assert_eq!(client.get("/download/65536").await.bytes.len(), 65_536);
    assert!(started.elapsed() < Duration::from_millis(800));
}
each_proto!(a_routes_own_answer_is_paced_by_its_route);

/// 1 MB at `limit_rate = "100k"`: 100,000 bytes a second (pinlb's sizes take `k` as 1000 and
/// `KiB` as 1024; nginx's `100k` is `"100KiB"`, as `pinlb import` writes it, in bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_megabyte_at_100k_takes_about_ten_seconds() {
    let backend = Backend::start("a").await;
    let pki = Pki::new();
    let proxy = paced(Proto::Http11, &backend, &pki, "limit_rate = \"100k\"\n");
    let mut client = Client::open(Proto::Http11, proxy.addr, &pki).await;
    let started = Instant::now();
    let resp = client
        .send(request(Method::GET, "/download/1000000", empty()))
        .await;
    // Longer than the shared wait limit: the body is meant to take 10 s.
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
        .await
        .expect("the body within 30 s")
        .expect("read body")
        .to_bytes();
    let took = started.elapsed();
    assert_eq!(body.len(), 1_000_000);
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(11)).contains(&took),
        "1 MB at 100 kB/s took {took:?}"
    );
}

/// The error of loading a file whose listener (its fourth line the last) has `line`.
fn refused(line: &str) -> String {
    let path = temp_config(&format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n{line}\n\n[upstream.app]\nbackends = [{{ address = \"127.0.0.1:9\" }}]\n"
    ));
    pinlb::Config::load(&path).unwrap_err().to_string()
}

#[test]
fn limit_rate_after_without_a_rate_is_refused_at_its_place() {
    let e = refused("limit_rate_after = \"1MiB\"");
    assert!(
        e.ends_with(":4:20: listener[0].limit_rate_after: limit_rate_after does nothing without a limit_rate (here or on the listener), expected limit_rate beside it"),
        "{e}"
    );
    // A key written wrong lists the module's keys among those expected.
    let e = refused("limit_rat = \"1MiB\"");
    assert!(
        e.contains(
            ":4:1: listener[0].limit_rat: unknown field `limit_rat`, expected one of `address`"
        ) && e.contains(", `limit_rate`, `limit_rate_after`"),
        "{e}"
    );
    // A wrong value is an error at its place too, as any key's.
    let e = refused("limit_rate = \"fast\"");
    assert!(
        e.contains(":4:14: listener[0].limit_rate: invalid size \"fast\""),
        "{e}"
    );
}

#[test]
fn import_converts_nginx_limit_rate_and_limit_rate_after_for_each_location() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        "events {}\nhttp {\n  upstream app { server 127.0.0.1:9; }\n  server {\n    listen 8080;\n    limit_rate 100k;\n    limit_rate_after 1m;\n    location / { proxy_pass http://app; }\n    location /api/ { limit_rate 0; proxy_pass http://app; }\n  }\n}\n",
    )
    .unwrap();
    let (toml, notes) = pinlb_import::import(&conf, false).expect("imported");
    assert!(!notes.iter().any(|n| n.contains("limit_rate")), "{notes:?}");
    let doc: toml::Table = toml.parse().unwrap();
    let routes = doc["listener"][0]["route"].as_array().expect("routes");
    let route = |path: &str| {
        routes
            .iter()
            .find(|r| r.get("path").and_then(|p| p.as_str()) == Some(path))
            .unwrap_or_else(|| panic!("no route {path} in {toml}"))
    };
    assert_eq!(
        route("/")["limit_rate"].as_integer(),
        Some(102_400),
        "{toml}"
    );
    assert_eq!(
        route("/")["limit_rate_after"].as_integer(),
        Some(1 << 20),
        "{toml}"
    );
    assert_eq!(route("/api/")["limit_rate"].as_integer(), Some(0), "{toml}");
    assert!(route("/api/").get("limit_rate_after").is_none(), "{toml}");
    // pinlb reads what it wrote.
    let path = temp_config(&toml);
    pinlb::Config::load(&path).expect("the import loads");
}
