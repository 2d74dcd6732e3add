//! `mirror`: copies of a share of the requests go to another upstream, marked, never waited
//! for, bounded in flight; a route turns its listener's off.

use std::time::Duration;

use crate::common;
use common::*;
use http::Method;

/// The listener's upstream `app` is `main`; `canary` is a second upstream; `listener_keys` adds
/// the mirror.
fn setup(main: std::net::SocketAddr, canary: std::net::SocketAddr, mirror: &str) -> Setup {
    let mut setup = Setup::with(&[main]);
    setup.listener_keys = format!("{mirror}\n");
    setup.extra = format!("[upstream.canary]\nbackends = [{{ address = \"{canary}\" }}]\n");
    setup
}

/// The requests `backend` has recorded, once there are `n` (a request is recorded when its
/// handler ends, after it is counted as a hit); within 5 s.
async fn recorded(backend: &Backend, n: usize) -> Vec<Recorded> {
    backend.wait_for_hits(n).await;
    for _ in 0..500 {
        let seen = backend.requests();
        if seen.len() >= n {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{n} requests not recorded within 5 s: {:?}",
        backend.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenth_of_the_requests_are_copied_to_the_mirror_marked_and_its_answers_dropped() {
    let main = Backend::start("main").await;
    let canary = Backend::start("canary").await;
    let mirror = "mirror = { upstream = \"canary\", share = 0.1 }";
    let proxy = Proxy::start(&setup(main.addr, canary.addr, mirror));
    for i in 0..200 {
        let r = get(proxy.addr, &format!("/item/{i}?x=1")).await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "main"), "{r:?}");
    }
    // Exactly a tenth, each with the request's target and the mark.
    let copies = recorded(&canary, 20).await;
    assert_eq!(main.hits(), 200);
    assert_eq!(copies.len(), 20);
    assert!(
        copies
            .iter()
            .all(|c| c.one("x-mirrored-by").as_deref() == Some("pinlb"))
    );
    assert!(
        copies
            .iter()
            .all(|c| c.uri.starts_with("/item/") && c.uri.ends_with("?x=1"))
    );
    assert!(
        main.requests()
            .iter()
            .all(|r| r.one("x-mirrored-by").is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_that_never_answers_costs_the_requests_nothing_and_holds_at_most_its_bound() {
    let main = Backend::start("main").await;
    let silent = RawServer::start(|_| RawAction::HoldThenClose(Duration::from_secs(30))).await;
    let mirror = "mirror = { upstream = \"canary\", max_in_flight = 4 }";
    let proxy = Proxy::start(&setup(main.addr, silent.addr, mirror));
    for _ in 0..20 {
        let r = tokio::time::timeout(Duration::from_secs(5), get(proxy.addr, "/"))
            .await
            .expect("answered without waiting for the mirror");
        assert_eq!(r.status, 200);
    }
    // Four copies reach the silent mirror and wait there; the other sixteen were dropped.
    silent.wait_for_requests(4).await;
    assert_eq!(silent.requests(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_takes_the_body_unless_body_is_false_and_a_route_can_turn_the_mirror_off() {
    let main = Backend::start("main").await;
    let canary = Backend::start("canary").await;
    let mut setup = setup(main.addr, canary.addr, "mirror = { upstream = \"canary\" }");
    setup.listener_keys.push_str(
        "[[listener.route]]\npath = \"/quiet/\"\nupstream = \"app\"\nmirror = { share = 0 }\n\
         [[listener.route]]\npath = \"/bare/\"\nupstream = \"app\"\nmirror = { body = false }\n",
    );
    let proxy = Proxy::start(&setup);
    let post = |path: &'static str| async move {
        let r = Conn::open(proxy.addr)
            .await
            .fetch(request(Method::POST, path, full("x=1")))
            .await;
        assert_eq!(r.status, 200);
    };
    // Copied with its body, sent once the body was read.
    post("/order").await;
    let copy = &recorded(&canary, 1).await[0];
    assert_eq!(
        (copy.method.as_str(), copy.uri.as_str()),
        ("POST", "/order")
    );
    assert_eq!((copy.body_len, &copy.body_start[..]), (3, &b"x=1"[..]));
    // body = false: at once, without it.
    post("/bare/x").await;
    let copy = &recorded(&canary, 2).await[1];
    assert_eq!((copy.uri.as_str(), copy.body_len), ("/bare/x", 0));
    assert!(main.requests().iter().all(|r| r.body_len == 3));
    get(proxy.addr, "/quiet/a").await;
    get(proxy.addr, "/loud").await;
    let uris: Vec<String> = recorded(&canary, 3)
        .await
        .iter()
        .map(|c| c.uri.clone())
        .collect();
    assert_eq!(uris, ["/order", "/bare/x", "/loud"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_larger_than_a_copy_keeps_drops_the_copy_not_the_request() {
    let main = Backend::start("main").await;
    let canary = Backend::start("canary").await;
    let proxy = Proxy::start(&setup(
        main.addr,
        canary.addr,
        "mirror = { upstream = \"canary\" }",
    ));
    let big = vec![b'b'; 100 * 1024];
    let r = Conn::open(proxy.addr)
        .await
        .fetch(request(Method::POST, "/big", full(big)))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(main.requests()[0].body_len, 100 * 1024);
    // The next copy (of a small body) arrives; the big one never did.
    get(proxy.addr, "/after").await;
    let uris: Vec<String> = recorded(&canary, 1)
        .await
        .iter()
        .map(|c| c.uri.clone())
        .collect();
    assert_eq!(uris, ["/after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_body_lets_a_larger_body_be_copied() {
    let main = Backend::start("main").await;
    let canary = Backend::start("canary").await;
    let mirror = "mirror = { upstream = \"canary\", max_body = \"128KiB\" }";
    let proxy = Proxy::start(&setup(main.addr, canary.addr, mirror));
    let r = Conn::open(proxy.addr)
        .await
        .fetch(request(Method::POST, "/big", full(vec![b'b'; 100 * 1024])))
        .await;
    assert_eq!(r.status, 200);
    let copy = &recorded(&canary, 1).await[0];
    assert_eq!((copy.uri.as_str(), copy.body_len), ("/big", 100 * 1024));
}
