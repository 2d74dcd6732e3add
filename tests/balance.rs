//! The balancing rules beyond round robin, end to end: `backup`, `random_two`, `ewma` and
//! `hash`, with real backends and real clients on loopback.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use http::Method;

/// The admin listener, for `/status`.
const ADMIN: &str = "[admin]\naddress = \"127.0.0.1:0\"\n";

/// GET `/` with one extra header.
async fn get_with(conn: &mut Conn, name: &str, value: &str) -> Reply {
    let mut req = request(Method::GET, "/", empty());
    req.headers_mut().insert(
        http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
        value.parse().unwrap(),
    );
    conn.fetch(req).await
}

#[tokio::test]
async fn backups_get_requests_only_once_every_primary_is_down() {
    let mut a = Backend::start("a").await;
    let mut b = Backend::start("b").await;
    let spare = Backend::start("spare").await;
    let mut setup = Setup::with(&[a.addr, b.addr, spare.addr]);
    setup.backend_keys = vec![String::new(), String::new(), "backup = true".into()];
    setup.extra = ADMIN.into();
    let proxy = Proxy::start(&setup);

    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..10 {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!((a.hits(), b.hits(), spare.hits()), (5, 5, 0));

    // One primary down: the other takes everything; the backup still nothing.
    a.kill().await;
    for _ in 0..6 {
        assert_eq!(get(proxy.addr, "/").await.backend(), "b");
    }
    assert_eq!(spare.hits(), 0);

    // Both down: the backup serves.
    let status = proxy.status().await;
    assert_eq!(
        status["upstreams"][0]["backends"][2]["backup"], true,
        "{status}"
    );
    b.kill().await;
    for _ in 0..4 {
        let r = get(proxy.addr, "/").await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "spare"), "{r:?}");
    }
}

#[tokio::test]
async fn hash_on_a_header_keeps_each_user_on_one_backend() {
    let backends = [
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    ];
    let mut setup = Setup::with(&backends.iter().map(|b| b.addr).collect::<Vec<_>>());
    setup.algorithm = "hash";
    setup.upstream_keys = "hash = \"header:X-User\"".into();
    let proxy = Proxy::start(&setup);

    let mut conn = Conn::open(proxy.addr).await;
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for round in 0..5 {
        for user in 0..12 {
            let r = get_with(&mut conn, "x-user", &format!("user-{user}")).await;
            assert_eq!(r.status, 200, "round {round}: {r:?}");
            seen.entry(format!("user-{user}"))
                .or_default()
                .insert(r.backend().to_string());
        }
    }
    assert!(
        seen.values().all(|b| b.len() == 1),
        "a user moved: {seen:?}"
    );
    let used: BTreeSet<_> = seen.values().flatten().collect();
    assert!(
        used.len() >= 2,
        "12 users all hashed to one backend: {seen:?}"
    );

    // No header: round robin, so all three answer within three requests.
    let plain: BTreeSet<String> = {
        let mut s = BTreeSet::new();
        for _ in 0..3 {
            s.insert(conn.get("/").await.backend().to_string());
        }
        s
    };
    assert_eq!(plain.len(), 3, "{plain:?}");
}

#[tokio::test]
async fn ewma_stops_sending_to_a_slow_backend_after_its_first_answer() {
    let slow = Backend::start_with_delay("slow", Duration::from_millis(40)).await;
    let fast = [
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    ];
    let mut addrs = vec![slow.addr];
    addrs.extend(fast.iter().map(|b| b.addr));
    let mut setup = Setup::with(&addrs);
    setup.algorithm = "ewma";
    setup.extra = ADMIN.into();
    let proxy = Proxy::start(&setup);

    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..60 {
        assert_eq!(conn.get("/").await.status, 200);
    }
    // Unobserved backends cost nothing, so the slow one gets its first request; after that its
    // 40 ms average loses every draw against the fast ones, one request in flight at a time.
    assert_eq!(
        slow.hits(),
        1,
        "fast hits {:?}",
        fast.iter().map(Backend::hits).collect::<Vec<_>>()
    );
    let status = proxy.status().await;
    let ewma_ms = status["upstreams"][0]["backends"][0]["ewma_ms"]
        .as_f64()
        .unwrap();
    assert!(ewma_ms >= 40.0, "{status}");
}

#[tokio::test]
async fn random_two_serves_from_every_backend() {
    let backends = [
        Backend::start("a").await,
        Backend::start("b").await,
        Backend::start("c").await,
    ];
    let mut setup = Setup::with(&backends.iter().map(|b| b.addr).collect::<Vec<_>>());
    setup.algorithm = "random_two";
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..60 {
        assert_eq!(conn.get("/").await.status, 200);
    }
    // One request at a time, so loads tie and the first drawn wins: each backend wins with
    // probability 1/3 per request. One with no request in 60 would be a broken draw, not bad
    // luck (p ≈ 3 × (2/3)^60 ≈ 1e-10).
    let hits: Vec<usize> = backends.iter().map(Backend::hits).collect();
    assert!(hits.iter().all(|&h| h > 0), "{hits:?}");
    assert_eq!(hits.iter().sum::<usize>(), 60);
}
