//! Health end to end: active checks, passive failure detection, retries, `max_conns` and slow
//! start, with real backends on loopback that die, reset, refuse and come back.
//!
//! Waits on time-based transitions are bounded polls; everything else waits on events (hits,
//! probes, accepts) counted by the backends.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use http::Method;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Consecutive passing probes that bring a backend back.
const RISE: usize = 2;
/// Consecutive failing probes that take a backend down.
const FALL: usize = 3;

/// Fast active checks on `/health`.
fn health_table() -> String {
    format!(
        "[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\ntimeout = \"80ms\"\n\
         rise = {RISE}\nfall = {FALL}\n"
    )
}

/// Waits until checks must have taken `b` down, given that its `/health` already fails: once
/// `FALL + 1` probes arrived after this call, the first `FALL` of them (all failing) have been
/// recorded, since a backend's probes go one after another.
async fn wait_until_down(b: &Backend) {
    let seen = b.probes();
    b.wait_for_probes(seen + FALL + 1).await;
}

/// Sends a GET on `conn` and checks that it gets a 503 with `body` at once: a request no
/// backend can take waits on nothing.
async fn assert_fast_503(conn: &mut Conn, body: &str) {
    let start = Instant::now();
    let r = conn.get("/").await;
    let took = start.elapsed();
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.body, body);
    assert!(
        took < Duration::from_secs(1),
        "a 503 should wait on nothing (a queue would hold it 30 s), took {took:?}"
    );
}

/// Sends GETs for `/` (at most `max`, 10 ms apart) until backend `id` answers one; every answer
/// must be a 200. Returns how many requests it took, or `None`.
async fn until_answered_by(conn: &mut Conn, id: &str, max: u32) -> Option<usize> {
    let mut sent = 0;
    poll(max, Duration::from_millis(10), async || {
        sent += 1;
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "{r:?}");
        (r.backend() == id).then_some(sent)
    })
    .await
}

/// Which backends answered `n` GETs, as a string of their ids' first letters.
async fn order_of(conn: &mut Conn, n: usize) -> String {
    let mut order = String::new();
    for _ in 0..n {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "{r:?}");
        order.push_str(&r.backend()[..1]);
    }
    order
}

// ---------------------------------------------------------------------------------------------
// Active checks
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_three_backends_under_load_loses_no_request_and_checks_keep_traffic_off_it()
{
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut c = Backend::start("c").await;
    // Requests reaching `c` wait at its gate, so some are in flight when it dies.
    c.set_gate(false);
    let mut setup = Setup::with(&[a.addr, b.addr, c.addr]);
    // Every allowed core: the workers share what the checks find.
    setup.cpus = allowed();
    // Passive checks off: only the active checks may keep traffic away from `c`.
    setup.extra = format!(
        "{}\n[upstream.app.passive]\nmax_fails = 0\n",
        health_table()
    );
    let proxy = Proxy::start(&setup);

    // Six clients, each sending its next GET as soon as the last is answered, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(watch::Sender::new(0usize));
    let mut clients = Vec::new();
    for _ in 0..6 {
        let (stop, done, addr) = (stop.clone(), done.clone(), proxy.addr);
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            let mut failures = Vec::new();
            for _ in 0..20_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let r = conn.get("/gated").await;
                if r.status != 200 {
                    failures.push(format!("{} {}", r.status, r.body.trim()));
                }
                done.send_modify(|d| *d += 1);
            }
            failures
        }));
    }
    let mut done_rx = done.subscribe();
    let mut wait_done = async |n: usize| {
        tokio::time::timeout(WAIT, done_rx.wait_for(|d| *d >= n))
            .await
            .unwrap_or_else(|_| panic!("the clients stalled before {n} requests"))
            .map(|d| *d)
            .unwrap()
    };

    // Three requests hang in `c` when it dies.
    c.wait_for_hits(3).await;
    let killed = c.kill().await;
    assert!(
        killed >= 3,
        "only {killed} requests were in flight on c when it died"
    );

    // A while with `c` refusing connections...
    let at_kill = *done.borrow();
    wait_done(at_kill + 100).await;
    // ...then its port accepts again, but `/health` gets no answer, and neither would a request.
    let listener = TcpListener::bind(c.addr).await.expect("rebind c's port");
    let trap = RawServer::serve(listener, |_| RawAction::Close);
    // FALL probes failed while the port refused or here: `c` is down by now.
    trap.wait_for_probes(FALL + 1).await;
    let before = trap.requests();
    let at_down = *done.borrow();
    wait_done(at_down + 300).await;
    let after = trap.requests();

    stop.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for client in clients {
        failures.extend(client.await.unwrap());
    }
    let total = *done.borrow();
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(
        after,
        before,
        "c got {} requests after checks took it down",
        after - before
    );
    assert_eq!(
        a.hits() + b.hits(),
        total,
        "every request, the {killed} killed mid-flight included, is answered once by a or b"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_backend_restarted_on_its_port_is_readmitted_after_rise_passing_checks() {
    let a = Backend::start("a").await;
    let mut c = Backend::start("c").await;
    let mut setup = Setup::with(&[a.addr, c.addr]);
    setup.extra = format!(
        "{}\n[upstream.app.passive]\nmax_fails = 0\n",
        health_table()
    );
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    assert_eq!(order_of(&mut conn, 4).await, "acac");

    c.kill().await;
    let trap = RawServer::serve(
        TcpListener::bind(c.addr).await.expect("rebind c's port"),
        |_| RawAction::Close,
    );
    trap.wait_for_probes(FALL + 1).await;
    assert_eq!(order_of(&mut conn, 10).await, "a".repeat(10));
    assert_eq!(trap.requests(), 0, "a backend down must get no request");

    // `c` starts again on the same port.
    let c = Backend::serve(trap.into_listener().await, "c", Duration::ZERO);
    let took = until_answered_by(&mut conn, "c", 300).await;
    assert!(took.is_some(), "the restarted backend never got a request");
    assert!(
        c.probes() >= RISE,
        "readmitted after {} passing probes, before rise = {RISE}",
        c.probes()
    );
    let order = order_of(&mut conn, 10).await;
    assert_eq!(
        order.matches('c').count(),
        5,
        "back to its full share: {order}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_whose_health_path_answers_500_gets_no_traffic_until_it_answers_200() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.extra = health_table();
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    assert_eq!(order_of(&mut conn, 4).await, "abab");

    b.set_health(500);
    wait_until_down(&b).await;
    let hits = b.hits();
    assert_eq!(order_of(&mut conn, 20).await, "a".repeat(20));
    assert_eq!(b.hits(), hits, "b is down: it serves nothing");

    b.set_health(200);
    let probes = b.probes();
    assert!(
        until_answered_by(&mut conn, "b", 300).await.is_some(),
        "b never came back after its health check passed again"
    );
    assert!(
        b.probes() >= probes + RISE,
        "back after {} passing probes, before rise = {RISE}",
        b.probes() - probes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_status_outside_expect_fails_the_check() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    // `/health` answers 200, which is not expected.
    setup.extra = format!("{}expect = [204, \"300-304\"]\n", health_table());
    let proxy = Proxy::start(&setup);
    wait_until_down(&a).await;
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 503, "{r:?}");

    // Once it answers an expected status it comes back (503s until then: it is alone).
    a.set_health(204);
    let mut conn = Conn::open(proxy.addr).await;
    let back = poll(300, Duration::from_millis(10), async || {
        let r = conn.get("/").await;
        if r.status == 200 {
            return Some(());
        }
        assert_eq!(r.status, 503, "{r:?}");
        None
    })
    .await
    .is_some();
    assert!(back, "a never came back after answering 204");
}

/// A lone backend that answers proxied requests but handles probes with `on_probe`: once
/// `FALL + 1` probes arrived, requests must get 503.
async fn probes_handled_like(on_probe: RawAction) -> (RawServer, Reply) {
    let server = RawServer::start(move |seen| {
        if seen.probe {
            on_probe.clone()
        } else {
            RawAction::Respond(raw_ok("raw", "hello"))
        }
    })
    .await;
    let mut setup = Setup::with(&[server.addr]);
    setup.extra = health_table();
    let proxy = Proxy::start(&setup);
    server.wait_for_probes(FALL + 1).await;
    let r = get(proxy.addr, "/").await;
    (server, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_probe_response_fails_the_check() {
    let (server, r) =
        probes_handled_like(RawAction::RespondAndClose(b"HELLO THERE\r\n\r\n".to_vec())).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(server.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_without_a_response_within_the_timeout_fails_the_check() {
    let (server, r) = probes_handled_like(RawAction::RespondAfter(
        Duration::from_millis(300),
        raw_ok("raw", "late"),
    ))
    .await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(server.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_the_backend_closes_unanswered_fails_the_check() {
    let (server, r) = probes_handled_like(RawAction::Close).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(server.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answered_in_time_keep_a_raw_backend_up() {
    // The control for the three above: the same backend, probes answered 204.
    let (server, r) = probes_handled_like(RawAction::RespondAndClose(
        b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
    ))
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "raw"), "{r:?}");
    assert_eq!(server.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_get_the_configured_path_and_host() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = "[upstream.app.health]\npath = \"/ready?full=1\"\ninterval = \"100ms\"\n\
                   timeout = \"80ms\"\nhost = \"app.local\"\n"
        .into();
    let _proxy = Proxy::start(&setup);
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[b.addr]);
    setup.extra = "[upstream.app.health]\ninterval = \"100ms\"\ntimeout = \"80ms\"\n".into();
    let _proxy_b = Proxy::start(&setup);

    a.wait_for_probes(1).await;
    b.wait_for_probes(1).await;
    let p = &a.probe_requests()[0];
    assert_eq!((&p.method, p.uri.as_str()), (&Method::GET, "/ready?full=1"));
    assert_eq!(p.headers["host"], "app.local");
    let p = &b.probe_requests()[0];
    assert_eq!(p.uri, "/", "the default path");
    assert_eq!(
        p.headers["host"],
        b.addr.to_string().as_str(),
        "the default Host is the backend's address"
    );
    assert_eq!((a.hits(), b.hits()), (0, 0), "probes are not requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_each_down_and_up_transition_with_its_cause() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.extra = health_table();
    let mut proxy = BinProxy::spawn(&setup).await;

    b.set_health(500);
    let down = proxy
        .wait_for_log(&format!(
            "backend {} DOWN after {FALL} failed checks",
            b.addr
        ))
        .await;
    assert!(
        down.contains("failed checks: status 500, expected 200-399"),
        "the cause is named: {down}"
    );
    b.set_health(200);
    proxy
        .wait_for_log(&format!(
            "backend {} UP after {RISE} passing checks",
            b.addr
        ))
        .await;
    let transitions = proxy
        .log()
        .iter()
        .filter(|l| l.contains(" DOWN after ") || l.contains(" UP after "))
        .count();
    assert_eq!(
        transitions,
        2,
        "only changes are logged:\n{}",
        proxy.log().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_backend_down_by_health_checks_a_request_gets_503_at_once() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    a.set_health(500);
    b.set_health(503);
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.extra = health_table();
    let proxy = Proxy::start(&setup);
    wait_until_down(&a).await;
    wait_until_down(&b).await;
    let mut conn = Conn::open(proxy.addr).await;

    assert_fast_503(
        &mut conn,
        "503 Service Unavailable: no backend available among 2: 2 down by health checks\n",
    )
    .await;
    assert_eq!((a.hits(), b.hits()), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_backend_down_by_health_checks_is_not_tried_and_gets_503_at_once() {
    let a = Backend::start("a").await;
    a.set_health(500);
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = health_table();
    let proxy = Proxy::start(&setup);
    wait_until_down(&a).await;
    let mut conn = Conn::open(proxy.addr).await;

    assert_fast_503(
        &mut conn,
        "503 Service Unavailable: no backend available among 1: 1 down by health checks\n",
    )
    .await;
    assert_eq!(a.hits(), 0);
}

// ---------------------------------------------------------------------------------------------
// Retries
// ---------------------------------------------------------------------------------------------

/// A backend that reads each request completely and then does `action`, first in line, and
/// a good one after it; `extra` is appended to the config. Sends one request.
async fn first_fails_with(
    action: RawAction,
    method: Method,
    body: ClientBody,
    extra: &str,
) -> (Reply, RawServer, Backend) {
    let failing = RawServer::start(move |_| action.clone()).await;
    let good = Backend::start("good").await;
    let mut setup = Setup::with(&[failing.addr, good.addr]);
    setup.extra = extra.into();
    let proxy = Proxy::start(&setup);
    let r = Conn::open(proxy.addr)
        .await
        .fetch(request(method, "/order", body))
        .await;
    (r, failing, good)
}

/// [`first_fails_with`] a reset.
async fn after_a_reset(method: Method, body: Vec<u8>, extra: &str) -> (Reply, RawServer, Backend) {
    first_fails_with(RawAction::Reset, method, full(body), extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_not_replayed_after_its_backend_read_it_and_reset_the_connection() {
    let (r, resetter, good) = after_a_reset(Method::POST, b"item=1".to_vec(), "").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(
        r.body.starts_with(&format!(
            "502 Bad Gateway: backend {} failed",
            resetter.addr
        )),
        "{:?}",
        r.body
    );
    assert_eq!(resetter.requests(), 1);
    assert_eq!(
        resetter.seen()[0].body,
        b"item=1",
        "it read the whole request"
    );
    assert_eq!(
        good.hits(),
        0,
        "a POST the backend may have acted on is not sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_whose_backend_read_it_and_reset_the_connection_is_retried_on_the_next() {
    let (r, resetter, good) = after_a_reset(Method::GET, Vec::new(), "").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!((resetter.requests(), good.hits()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_retried_after_a_reset_with_non_idempotent_and_its_body_arrives_intact() {
    let (r, resetter, good) = after_a_reset(
        Method::POST,
        b"item=2&qty=3".to_vec(),
        "[upstream.app.retry]\nnon_idempotent = true\n",
    )
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!(resetter.requests(), 1);
    assert_eq!(good.requests()[0].body_start, b"item=2&qty=3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_with_a_body_larger_than_retry_buffer_is_not_retried_after_a_reset() {
    let (r, resetter, good) = after_a_reset(
        Method::PUT,
        vec![b'x'; 4096],
        "[upstream.app.retry]\nbuffer = \"1KiB\"\n",
    )
    .await;
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(resetter.seen()[0].body.len(), 4096);
    assert_eq!(
        good.hits(),
        0,
        "the body was not kept, so it cannot be sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_with_a_body_of_exactly_retry_buffer_is_retried_after_a_reset() {
    let (r, resetter, good) = after_a_reset(
        Method::PUT,
        vec![b'y'; 1024],
        "[upstream.app.retry]\nbuffer = \"1KiB\"\n",
    )
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!(resetter.requests(), 1);
    let got = &good.requests()[0];
    assert_eq!(
        (got.body_len, &got.body_start[..]),
        (1024, &[b'y'; 1024][..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_tried_on_each_backend_at_most_once_then_gets_502() {
    let mut resetters = Vec::new();
    for _ in 0..3 {
        resetters.push(RawServer::start(|_| RawAction::Reset).await);
    }
    let addrs: Vec<_> = resetters.iter().map(|r| r.addr).collect();
    let proxy = Proxy::start(&Setup::with(&addrs));
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    let seen: Vec<usize> = resetters.iter().map(RawServer::requests).collect();
    assert_eq!(seen, [1, 1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_error_is_the_last_attempts_504_after_a_reset_then_a_timeout() {
    let resetter = RawServer::start(|_| RawAction::Reset).await;
    let slow = Backend::start_with_delay("slow", Duration::from_millis(2000)).await;
    let mut setup = Setup::with(&[resetter.addr, slow.addr]);
    setup.response_timeout = "200ms";
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        r.body
            .contains(&format!("backend {} sent no response headers", slow.addr)),
        "{:?}",
        r.body
    );
    assert_eq!((resetter.requests(), slow.hits()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_put_is_replayed_intact_after_a_reset() {
    // No length: the client streams it chunked, and so does pinlb.
    let (r, resetter, good) = first_fails_with(
        RawAction::Reset,
        Method::PUT,
        GenBody::new(3000, false).boxed(),
        "",
    )
    .await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!(resetter.seen()[0].body.len(), 3000);
    let got = &good.requests()[0];
    let sent: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
    assert_eq!((got.body_len, &got.body_start[..]), (3000, &sent[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_response_head_moves_a_get_on_but_not_a_post() {
    let garbage = RawAction::RespondAndClose(b"HTTP/1.1 OK ???\r\n\r\n".to_vec());
    let (r, bad, good) = first_fails_with(garbage.clone(), Method::GET, empty(), "").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!((bad.requests(), good.hits()), (1, 1));

    let (r, bad, good) = first_fails_with(garbage, Method::POST, full("x=1"), "").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.contains("invalid response"), "{:?}", r.body);
    assert_eq!((bad.requests(), good.hits()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_timeout_moves_a_get_on_but_not_a_post() {
    // The first backend reads each request and never answers (it closes after 3 s).
    let silent = RawServer::start(|_| RawAction::HoldThenClose(Duration::from_secs(3))).await;
    let good = Backend::start("good").await;
    let mut setup = Setup::with(&[silent.addr, good.addr]);
    setup.response_timeout = "200ms";
    // No skipping: both requests go to `silent` first.
    setup.extra = "[upstream.app.passive]\nmax_fails = 0\n".into();
    let proxy = Proxy::start(&setup);

    let r = get(proxy.addr, "/").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    assert_eq!((silent.requests(), good.hits()), (1, 1));

    // Round robin sends the next request to `good`; the one after to `silent` again.
    assert_eq!(get(proxy.addr, "/").await.backend(), "good");
    let r = Conn::open(proxy.addr)
        .await
        .fetch(request(Method::POST, "/order", full("x=1")))
        .await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!((silent.requests(), good.hits()), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_tries_1_gives_up_after_the_first_failed_attempt() {
    let (r, resetter, good) =
        after_a_reset(Method::GET, Vec::new(), "[upstream.app.retry]\ntries = 1\n").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!((resetter.requests(), good.hits()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_new_attempt_starts_once_retry_timeout_has_passed() {
    // The first backend holds the request 300 ms, then closes without answering.
    let slow = RawServer::start(|_| RawAction::HoldThenClose(Duration::from_millis(300))).await;
    let good = Backend::start("good").await;
    let mut setup = Setup::with(&[slow.addr, good.addr]);
    setup.extra = "[upstream.app.retry]\ntimeout = \"100ms\"\n".into();
    let proxy = Proxy::start(&setup);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!((slow.requests(), good.hits()), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_retried_once_the_response_head_arrived() {
    // The head promises 100 bytes; 10 come, then the connection closes.
    let mut partial =
        b"HTTP/1.1 200 OK\r\nx-backend: broken\r\ncontent-length: 100\r\n\r\n".to_vec();
    partial.extend_from_slice(&[b'z'; 10]);
    let broken = RawServer::start(move |_| RawAction::RespondAndClose(partial.clone())).await;
    let good = Backend::start("good").await;
    let proxy = Proxy::start(&Setup::with(&[broken.addr, good.addr]));

    let resp = Conn::open(proxy.addr)
        .await
        .send(request(Method::GET, "/", empty()))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-backend"], "broken");
    let body = tokio::time::timeout(WAIT, http_body_util::BodyExt::collect(resp.into_body()))
        .await
        .expect("the body ends, one way or the other");
    assert!(body.is_err(), "a cut-off body must not look complete");
    assert_eq!(good.hits(), 0);
}

// ---------------------------------------------------------------------------------------------
// Stale keep-alive connections
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_after_the_backend_closed_its_idle_connection_arrives_with_its_body() {
    // The backend closes each connection right after answering, without `Connection: close`:
    // the pooled connection dies while idle. Once the FIN has reached pinlb, the POST goes on a
    // fresh connection with its body. (Sent before the FIN arrives, it would meet the keep-alive
    // race, where a POST gets a 502 rather than being sent twice:
    // `a_post_on_a_pooled_connection_that_dies_is_not_sent_again`.)
    let a = RawServer::start(|seen| {
        RawAction::RespondAndClose(raw_ok("a", &String::from_utf8_lossy(&seen.body)))
    })
    .await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    let r = conn
        .fetch(request(Method::POST, "/form", full("first=1")))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    a.wait_for_closed(1).await;
    let r = conn
        .fetch(request(Method::POST, "/form", full("second=2")))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "second=2");
    let seen: Vec<(usize, usize)> = a.seen().iter().map(|s| (s.conn, s.nth)).collect();
    assert_eq!(
        seen,
        [(1, 1), (2, 1)],
        "each POST on a connection of its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_dying_on_reuse_is_replaced_invisibly_and_counts_no_failure() {
    // Each connection answers its first request, echoing the body, and closes without a word
    // on the second: the request went out on a keep-alive connection just as it died. PUT is
    // idempotent, so sending it again on a fresh connection is safe.
    let stale = RawServer::start(|seen| {
        if seen.nth == 1 {
            RawAction::Respond(raw_ok("stale", &String::from_utf8_lossy(&seen.body)))
        } else {
            RawAction::Close
        }
    })
    .await;
    let good = Backend::start("good").await;
    // Passive checks are on (max_fails 1): one failure would skip `stale` for 10 s.
    let proxy = Proxy::start(&Setup::with(&[stale.addr, good.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    let mut order = Vec::new();
    for i in 0..6 {
        let body = format!("n={i}");
        let r = conn
            .fetch(request(Method::PUT, "/form", full(body.clone())))
            .await;
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        if r.backend() == "stale" {
            assert_eq!(r.body, body, "request {i}: the body is sent again intact");
        }
        order.push(r.backend().to_string());
    }
    assert_eq!(
        order,
        ["stale", "good"].repeat(3),
        "stale stays in rotation"
    );
    let seen: Vec<(usize, usize, String)> = stale
        .seen()
        .iter()
        .map(|s| (s.conn, s.nth, String::from_utf8_lossy(&s.body).into_owned()))
        .collect();
    let expected: Vec<(usize, usize, String)> = [
        (1, 1, "n=0"),
        (1, 2, "n=2"),
        (2, 1, "n=2"),
        (2, 2, "n=4"),
        (3, 1, "n=4"),
    ]
    .into_iter()
    .map(|(c, n, b)| (c, n, b.to_string()))
    .collect();
    assert_eq!(
        seen, expected,
        "each dead pooled connection is replaced by a fresh one to the same backend"
    );
    assert_eq!(good.hits(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_on_a_pooled_connection_that_dies_is_not_sent_again() {
    // The same race, for a POST: the backend may have read it before the connection died, so
    // pinlb answers 502 rather than risk sending it twice.
    let stale = RawServer::start(|seen| {
        if seen.nth == 1 {
            RawAction::Respond(raw_ok("stale", "ok"))
        } else {
            RawAction::Close
        }
    })
    .await;
    let proxy = Proxy::start(&Setup::with(&[stale.addr]));
    let mut conn = Conn::open(proxy.addr).await;
    let r = conn
        .fetch(request(Method::POST, "/form", full("n=0")))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = conn
        .fetch(request(Method::POST, "/form", full("n=1")))
        .await;
    assert_eq!(r.status, 502, "{r:?}");
    let seen: Vec<(usize, usize)> = stale.seen().iter().map(|s| (s.conn, s.nth)).collect();
    assert_eq!(seen, [(1, 1), (1, 2)], "the POST reached the backend once");
}

// ---------------------------------------------------------------------------------------------
// max_conns
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_at_max_conns_is_skipped_while_its_request_is_in_flight() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.backend_keys = vec!["max_conns = 1".into()];
    let proxy = Proxy::start(&setup);

    let slow = tokio::spawn(get(proxy.addr, "/sleep/1000"));
    a.wait_for_hits(1).await;
    let mut conn = Conn::open(proxy.addr).await;
    assert_eq!(
        order_of(&mut conn, 4).await,
        "bbbb",
        "a is at max_conns while the slow request runs"
    );
    assert!(
        !slow.is_finished(),
        "the slow request should still be in flight"
    );
    let r = slow.await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, "a"));

    // Its slot is free again.
    let order = order_of(&mut conn, 4).await;
    assert!(order.contains('a'), "a never came back: {order}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_backend_at_max_conns_gets_the_next_request_a_503_at_once() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.upstream_keys = "max_conns = 1\nqueue = 0".into();
    // Every allowed core: the limit counts requests across workers.
    setup.cpus = allowed();
    let proxy = Proxy::start(&setup);

    // Slower than `assert_fast_503`'s bound, so a 503 held until it ends would not pass.
    let slow = tokio::spawn(get(proxy.addr, "/sleep/3000"));
    a.wait_for_hits(1).await;
    let mut conn = Conn::open(proxy.addr).await;
    assert_fast_503(
        &mut conn,
        "503 Service Unavailable: no backend available among 1: 1 at max_conns\n",
    )
    .await;
    assert_eq!(a.hits(), 1);

    assert_eq!(slow.await.unwrap().status, 200);
    let r = conn.get("/").await;
    assert_eq!(r.status, 200, "the slot is free again: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_503_says_why_each_backend_was_unavailable() {
    let dead = Refusing::new();
    let busy = Backend::start("busy").await;
    let mut setup = Setup::with(&[dead.addr, busy.addr]);
    setup.backend_keys = vec![String::new(), "max_conns = 1".into()];
    setup.upstream_keys = "queue = 0".into();
    let proxy = Proxy::start(&setup);

    // The first request finds `dead` refusing (now skipped) and occupies `busy`.
    let slow = tokio::spawn(get(proxy.addr, "/sleep/1000"));
    busy.wait_for_hits(1).await;
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(
        r.body,
        "503 Service Unavailable: no backend available among 2: 1 skipped after recent failures, 1 at max_conns\n"
    );
    assert_eq!(slow.await.unwrap().status, 200);
}

// ---------------------------------------------------------------------------------------------
// Slow start
// ---------------------------------------------------------------------------------------------

/// Sends GETs back to back (at most 20 000, for at most `WAIT`) until `id` answers one.
async fn first_answer_by(conn: &mut Conn, id: &str) {
    let start = Instant::now();
    for _ in 0..20_000 {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "{r:?}");
        if r.backend() == id {
            return;
        }
        assert!(start.elapsed() < WAIT, "{id} never answered");
    }
    panic!("{id} never answered");
}

/// Sends GETs back to back for `span`, and returns when each was answered (from now) and
/// whether `id` answered it.
async fn answers_over(conn: &mut Conn, id: &str, span: Duration) -> Vec<(Duration, bool)> {
    let start = Instant::now();
    let mut log = Vec::new();
    while start.elapsed() < span {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "{r:?}");
        log.push((start.elapsed(), r.backend() == id));
    }
    log
}

/// The share of the requests answered within `from..to` ms that `answers_over`'s backend
/// answered.
fn share(log: &[(Duration, bool)], from: u64, to: u64) -> f64 {
    let window: Vec<bool> = log
        .iter()
        .filter(|(t, _)| (from..to).contains(&(t.as_millis() as u64)))
        .map(|&(_, is_it)| is_it)
        .collect();
    assert!(
        window.len() >= 20,
        "only {} requests in {from}..{to} ms",
        window.len()
    );
    window.iter().filter(|&&is_it| is_it).count() as f64 / window.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_start_gives_a_backend_that_comes_back_up_a_small_share_growing_to_its_fair_share() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.upstream_keys = "slow_start = \"3s\"".into();
    setup.extra = health_table();
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;

    assert_eq!(
        order_of(&mut conn, 10).await,
        "ab".repeat(5),
        "no slow start at startup"
    );

    b.set_health(500);
    wait_until_down(&b).await;
    b.set_health(200);
    // b's first request comes a few ms after it is up again (its weight starts near 0).
    first_answer_by(&mut conn, "b").await;
    let log = answers_over(&mut conn, "b", Duration::from_millis(4400)).await;
    // b's weight grows linearly from ~0 to a's over 3 s, so its share is at most 14% over
    // the first 500 ms, about a third around 1.5 s, and half once the ramp is over.
    let early = share(&log, 0, 500);
    let middle = share(&log, 1250, 1750);
    let late = share(&log, 3600, 4400);
    assert!(
        early < 0.25 && (0.15..0.45).contains(&middle) && (0.4..=0.6).contains(&late),
        "b's share right after coming back {early:.2}, 1.5 s later {middle:.2}, after the ramp \
         {late:.2}"
    );
    assert!(early < middle && middle < late);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_start_also_follows_a_passing_trial_after_passive_skip() {
    let dead = Refusing::new();
    let live = Backend::start("live").await;
    let mut setup = Setup::with(&[dead.addr, live.addr]);
    setup.upstream_keys = "slow_start = \"3s\"".into();
    setup.extra = "[upstream.app.passive]\nfail_timeout = \"300ms\"\n".into();
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;

    let r = conn.get("/").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "live"));
    let _back = Backend::serve(dead.listen(), "back", Duration::ZERO);
    // The trial, 300 ms after the failure, passes...
    first_answer_by(&mut conn, "back").await;
    // ...and the backend ramps up from there instead of taking half at once.
    let log = answers_over(&mut conn, "back", Duration::from_millis(500)).await;
    let early = share(&log, 0, 500);
    assert!(
        early < 0.25,
        "back got {early:.2} of requests right after its trial passed"
    );
}

// ---------------------------------------------------------------------------------------------
// Passive checks
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_backend_is_skipped_then_gets_exactly_one_trial_per_fail_timeout() {
    let dead = Refusing::new();
    let live = Backend::start("live").await;
    let mut setup = Setup::with(&[dead.addr, live.addr]);
    // Every allowed core: the workers race for the trial, and only one may win.
    setup.cpus = allowed();
    setup.extra = "[upstream.app.passive]\nmax_fails = 1\nfail_timeout = \"500ms\"\n".into();
    let proxy = Proxy::start(&setup);

    let start = Instant::now();
    let r = get(proxy.addr, "/").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "live"));
    // The port accepts from now on; each connection is held 100 ms, then closed unanswered: a
    // trial fails.
    let trap = RawServer::serve(dead.listen(), |_| {
        RawAction::HoldThenClose(Duration::from_millis(100))
    });

    // Four clients keep sending requests until two trials went to the trap.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (stop, addr) = (stop.clone(), proxy.addr);
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            let mut statuses = Vec::new();
            for _ in 0..20_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                statuses.push(conn.get("/").await.status.as_u16());
            }
            statuses
        }));
    }
    trap.wait_for_requests(2).await;
    stop.store(true, Ordering::SeqCst);
    let mut statuses = Vec::new();
    for c in clients {
        statuses.extend(c.await.unwrap());
    }
    assert!(
        statuses.iter().all(|&s| s == 200),
        "every request is answered: {:?}",
        statuses.iter().filter(|&&s| s != 200).collect::<Vec<_>>()
    );
    let seen = trap.seen();
    assert!(seen.len() <= 3, "{} trials", seen.len());
    let first = seen[0].at - start;
    let gap = seen[1].at - seen[0].at;
    assert!(
        first >= Duration::from_millis(490),
        "the first trial came {first:?} after the failure, inside fail_timeout"
    );
    // The trial failed when the trap closed it, 100 ms in; the next one waits another 500 ms.
    assert!(
        gap >= Duration::from_millis(590),
        "the second trial came {gap:?} after the first: more than one trial per fail_timeout"
    );
    assert_eq!(
        trap.accepts(),
        seen.len(),
        "the only connections were the trials"
    );

    // A trial that passes brings the backend back into the rotation.
    let back = Backend::serve(trap.into_listener().await, "back", Duration::ZERO);
    let mut conn = Conn::open(proxy.addr).await;
    assert!(
        until_answered_by(&mut conn, "back", 300).await.is_some(),
        "a passing trial should bring the backend back"
    );
    let order = order_of(&mut conn, 10).await;
    assert_eq!(order.matches('b').count(), 5, "{order}");
    assert!(back.hits() >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_that_was_in_flight_when_the_backend_failed_does_not_end_its_skip() {
    // `flaky` answers `/slow` after 300 ms, resets the connection on `/fail`, and answers
    // anything else at once.
    let flaky = RawServer::start(|seen| {
        if seen.head.starts_with("GET /slow ") {
            RawAction::RespondAfter(Duration::from_millis(300), raw_ok("flaky", "slow"))
        } else if seen.head.starts_with("GET /fail ") {
            RawAction::Reset
        } else {
            RawAction::Respond(raw_ok("flaky", "hello"))
        }
    })
    .await;
    let good = Backend::start("good").await;
    let proxy = Proxy::start(&Setup::with(&[flaky.addr, good.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    // Round robin: `/slow` goes to flaky, `/` to good, `/fail` to flaky again, while `/slow`
    // still waits for its answer.
    let slow = tokio::spawn(get(proxy.addr, "/slow"));
    flaky.wait_for_requests(1).await;
    assert_eq!(conn.get("/").await.backend(), "good");
    let r = conn.get("/fail").await;
    assert_eq!(
        (r.status.as_u16(), r.backend()),
        (200, "good"),
        "retried: {r:?}"
    );
    // flaky failed (max_fails 1): it is skipped for fail_timeout (10 s)...
    assert_eq!(
        order_of(&mut conn, 4).await,
        "gggg",
        "skipped after its failure"
    );
    assert!(
        !slow.is_finished(),
        "the slow request should still be in flight"
    );
    // ...and the request that started before the failure now succeeds: it is no trial and must
    // not end the skip.
    let r = slow.await.unwrap();
    assert_eq!((r.status.as_u16(), r.backend()), (200, "flaky"));
    assert_eq!(
        order_of(&mut conn, 10).await,
        "g".repeat(10),
        "flaky must stay skipped for fail_timeout after its failure"
    );
    assert_eq!(flaky.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_on_status_503_a_backend_answering_503_is_skipped_after_max_fails() {
    let bad = RawServer::start(|_| RawAction::Respond(raw_status("bad", 503))).await;
    let good = Backend::start("good").await;
    let mut setup = Setup::with(&[bad.addr, good.addr]);
    setup.extra =
        "[upstream.app.passive]\nmax_fails = 2\nfail_on_status = [502, 503, 504]\n".into();
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;

    let mut got = Vec::new();
    for _ in 0..4 {
        let r = conn.get("/").await;
        got.push((r.status.as_u16(), r.backend().to_string()));
        if r.status == 503 {
            assert_eq!(
                r.body, "status 503 from bad\n",
                "passed through, not retried"
            );
        }
    }
    let want: Vec<(u16, String)> = [(503, "bad"), (200, "good"), (503, "bad"), (200, "good")]
        .into_iter()
        .map(|(s, b)| (s, b.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(order_of(&mut conn, 10).await, "g".repeat(10));
    assert_eq!(bad.requests(), 2, "skipped after max_fails = 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_backend_is_never_skipped_for_its_failures() {
    // Skipping the only backend cannot help: its 503s keep going to the client, never pinlb's.
    let bad = RawServer::start(|_| RawAction::Respond(raw_status("bad", 503))).await;
    let mut setup = Setup::with(&[bad.addr]);
    setup.extra = "[upstream.app.passive]\nfail_on_status = [503]\n".into();
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    for i in 0..5 {
        let r = conn.get("/").await;
        assert_eq!(
            (r.status.as_u16(), r.body.as_str()),
            (503, "status 503 from bad\n"),
            "request {i}"
        );
    }
    assert_eq!(bad.requests(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fail_on_status_a_503_counts_as_an_answer_not_a_failure() {
    let bad = RawServer::start(|_| RawAction::Respond(raw_status("bad", 503))).await;
    let good = Backend::start("good").await;
    let proxy = Proxy::start(&Setup::with(&[bad.addr, good.addr]));
    let mut conn = Conn::open(proxy.addr).await;
    let mut order = String::new();
    for _ in 0..10 {
        let r = conn.get("/").await;
        order.push_str(&r.backend()[..1]);
    }
    assert_eq!(order, "bg".repeat(5));
    assert_eq!(bad.requests(), 5);
}

// ---------------------------------------------------------------------------------------------
// Configuration errors
// ---------------------------------------------------------------------------------------------

const BASE: &str = r#"[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
backends = [{ address = "127.0.0.1:8881" }]
"#;

/// The error for `BASE` with `more` appended (it starts on line 7).
fn config_error(more: &str) -> String {
    let text = format!("{BASE}{more}");
    pinlb::Config::parse("pinlb.toml", &text, &allowed())
        .expect_err("the config should be rejected")
        .to_string()
}

#[test]
fn the_new_keys_parse_with_their_defaults() {
    let text = format!(
        "{}\n[upstream.app.health]\n",
        BASE.replace(
            "backends = [{ address = \"127.0.0.1:8881\" }]",
            "max_conns = 4\nslow_start = \"30s\"\nbackends = [\n  { address = \"127.0.0.1:8881\" },\n  { address = \"127.0.0.1:8882\", max_conns = 0, slow_start = \"1s\" },\n]"
        )
    );
    let c = pinlb::Config::parse("pinlb.toml", &text, &allowed()).unwrap_or_else(|e| panic!("{e}"));
    let u = &c.upstreams[0];
    assert_eq!(
        (u.backends[0].max_conns, u.backends[0].slow_start),
        (4, Duration::from_secs(30))
    );
    assert_eq!(
        (u.backends[1].max_conns, u.backends[1].slow_start),
        (0, Duration::from_secs(1)),
        "per-backend keys override the upstream's"
    );
    let h = u
        .health
        .as_ref()
        .expect("an empty health table turns checks on");
    assert_eq!(
        (h.path.as_str(), h.interval, h.timeout, h.rise, h.fall),
        ("/", Duration::from_secs(2), Duration::from_secs(1), 2, 3)
    );
    assert!(h.expect.contains(200) && h.expect.contains(399) && !h.expect.contains(400));
    assert_eq!(
        (u.passive.max_fails, u.passive.fail_timeout),
        (1, Duration::from_secs(10))
    );
    assert!(u.passive.fail_on_status.is_empty());
    assert_eq!(
        (
            u.retry.tries,
            u.retry.timeout,
            u.retry.non_idempotent,
            u.retry.buffer
        ),
        (0, Duration::from_secs(10), false, 64 * 1024)
    );

    let c = pinlb::Config::parse("pinlb.toml", BASE, &allowed()).unwrap();
    assert!(
        c.upstreams[0].health.is_none(),
        "no health table, no checks"
    );
}

#[test]
fn a_health_timeout_not_below_the_interval_is_an_error_at_the_timeout() {
    assert_eq!(
        config_error("[upstream.app.health]\ninterval = \"1s\"\ntimeout = \"2s\"\n"),
        "pinlb.toml:9:11: upstream.app.health: timeout (2s) must be less than interval (1s)"
    );
    assert_eq!(
        config_error("[upstream.app.health]\ninterval = \"1s\"\ntimeout = \"1s\"\n"),
        "pinlb.toml:9:11: upstream.app.health: timeout (1s) must be less than interval (1s)"
    );
    // Without a timeout key the default (1 s) is too long for a 500 ms interval; the error
    // points at the interval.
    assert_eq!(
        config_error("[upstream.app.health]\ninterval = \"500ms\"\n"),
        "pinlb.toml:8:12: upstream.app.health: timeout (1s) must be less than interval (500ms)"
    );
}

#[test]
fn rise_or_fall_0_is_an_error() {
    assert_eq!(
        config_error("[upstream.app.health]\nrise = 0\n"),
        "pinlb.toml:8:8: upstream.app.health.rise: 0 is not allowed, expected a positive number of checks"
    );
    assert_eq!(
        config_error("[upstream.app.health]\nfall = 0\n"),
        "pinlb.toml:8:8: upstream.app.health.fall: 0 is not allowed, expected a positive number of checks"
    );
}

#[test]
fn a_bad_expect_is_an_error_naming_the_value() {
    let e = config_error("[upstream.app.health]\nexpect = \"600\"\n");
    assert!(
        e.starts_with(
            "pinlb.toml:8:10: upstream.app.health.expect: invalid status 600, expected 100 to 599"
        ),
        "{e}"
    );
    let e = config_error("[upstream.app.health]\nexpect = \"abc\"\n");
    assert!(
        e.starts_with("pinlb.toml:8:10: upstream.app.health.expect: invalid status range \"abc\""),
        "{e}"
    );
    let e = config_error("[upstream.app.health]\nexpect = \"399-200\"\n");
    assert!(e.contains("invalid status range \"399-200\""), "{e}");
    let e = config_error("[upstream.app.passive]\nfail_on_status = [502, 99]\n");
    assert!(
        e.starts_with("pinlb.toml:8:")
            && e.contains("upstream.app.passive.fail_on_status")
            && e.contains("invalid status 99"),
        "{e}"
    );
}

#[test]
fn a_bad_retry_buffer_is_an_error() {
    let e = config_error("[upstream.app.retry]\nbuffer = \"lots\"\n");
    assert!(
        e.starts_with("pinlb.toml:8:10: upstream.app.retry.buffer: invalid size \"lots\", expected a size such as 4096"),
        "{e}"
    );
    let e = config_error("[upstream.app.retry]\nbuffer = -1\n");
    assert!(
        e.starts_with("pinlb.toml:8:10: upstream.app.retry.buffer: invalid size -1"),
        "{e}"
    );
}

#[test]
fn zero_durations_in_the_new_tables_are_errors() {
    for (table, key) in [
        ("health", "interval"),
        ("health", "timeout"),
        ("passive", "fail_timeout"),
        ("retry", "timeout"),
    ] {
        let e = config_error(&format!("[upstream.app.{table}]\n{key} = \"0s\"\n"));
        let col = key.len() + 4;
        assert_eq!(
            e,
            format!(
                "pinlb.toml:8:{col}: upstream.app.{table}.{key}: a duration of 0 is not allowed, expected a positive duration such as \"1s\""
            )
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Retries on a status (`retry.on`'s `http_NNN`) and their budget
// ---------------------------------------------------------------------------------------------

/// `retry.on` with 503, and no passive skipping, so that every backend keeps its turn.
const ON_503: &str = "[upstream.app.retry]\non = [\"error\", \"timeout\", \"http_503\"]\n\
                      [upstream.app.passive]\nmax_fails = 0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_answered_503_goes_to_the_next_backend_and_a_post_does_not() {
    let unavailable = RawServer::start(|_| RawAction::Respond(raw_status("down", 503))).await;
    let good = Backend::start("good").await;
    let mut setup = Setup::with(&[unavailable.addr, good.addr]);
    setup.extra = ON_503.into();
    let proxy = Proxy::start(&setup);

    // Round robin gives `down` every other first pick; each of those is retried on `good`.
    for _ in 0..20 {
        let r = get(proxy.addr, "/").await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
    }
    assert_eq!((unavailable.requests(), good.hits()), (10, 20));

    // A POST may not be sent twice: the one that `down` answers gets its 503.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let r = Conn::open(proxy.addr)
            .await
            .fetch(request(Method::POST, "/order", full("x=1")))
            .await;
        statuses.push(r.status.as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 503]);
    assert_eq!((unavailable.requests(), good.hits()), (11, 21));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_backend_answers_503_the_budget_bounds_the_retries() {
    let mut servers = Vec::new();
    for id in ["a", "b", "c"] {
        servers.push(RawServer::start(move |_| RawAction::Respond(raw_status(id, 503))).await);
    }
    let addrs: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let mut setup = Setup::with(&addrs);
    // No minimum: the share alone, 20% of the requests.
    setup.extra = "[upstream.app.retry]\non = [\"http_503\"]\nbudget = 0.2\nbudget_min = 0\n\
                   [upstream.app.passive]\nmax_fails = 0\n"
        .into();
    let proxy = Proxy::start(&setup);
    for _ in 0..100 {
        let r = get(proxy.addr, "/").await;
        assert_eq!(r.status, 503, "{r:?}");
    }
    // Each request adds a fifth of a retry; each retry, answered 503 too, gives nothing back:
    // 20 retries (one worker), not the 200 that three tries each would make.
    let sent: Vec<usize> = servers.iter().map(|s| s.requests()).collect();
    assert_eq!(sent.iter().sum::<usize>(), 120, "{sent:?}");
}

// ---------------------------------------------------------------------------------------------
// Outlier ejection by answers (`[upstream.NAME.outlier]`)
// ---------------------------------------------------------------------------------------------

/// Sends GETs through `proxy` until `server` has gone `quiet` requests in a row without one
/// (round robin over three would give it every third), at most `most` requests; returns the
/// requests sent, `None` if it never went quiet.
async fn until_left_out(
    proxy: SocketAddr,
    server: &RawServer,
    quiet: usize,
    most: usize,
) -> Option<usize> {
    let (mut seen, mut without) = (server.requests(), 0);
    for sent in 1..=most {
        get(proxy, "/").await;
        let now = server.requests();
        without = if now == seen { without + 1 } else { 0 };
        seen = now;
        if without >= quiet {
            return Some(sent);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundreds_in_a_row_eject_a_backend_for_longer_each_time() {
    let bad = RawServer::start(|_| RawAction::Respond(raw_status("bad", 500))).await;
    let (one, two) = (Backend::start("one").await, Backend::start("two").await);
    let mut setup = Setup::with(&[bad.addr, one.addr, two.addr]);
    setup.extra = "[upstream.app.passive]\nmax_fails = 0\n[upstream.app.outlier]\n\
                   consecutive_5xx = 3\nsuccess_rate = 0\nbase_time = \"300ms\"\n\
                   max_time = \"10s\"\nmax_ejected = 0.34\n"
        .into();
    let proxy = Proxy::start(&setup);

    // Three 500s in a row (every third request): ejected, and the next 30 requests miss it.
    send_until(proxy.addr, || bad.requests() >= 3).await;
    let out = Instant::now();
    until_left_out(proxy.addr, &bad, 30, 100)
        .await
        .expect("ejected");
    assert_eq!(bad.requests(), 3);
    // Its time up, one trial goes to it, and brings it back.
    send_until(proxy.addr, || bad.requests() >= 4).await;
    let first = out.elapsed();
    assert!(first >= Duration::from_millis(250), "{first:?}");
    // The trial was the first of three more 500s: the second ejection lasts twice as long.
    send_until(proxy.addr, || bad.requests() >= 6).await;
    let out = Instant::now();
    until_left_out(proxy.addr, &bad, 30, 100)
        .await
        .expect("ejected again");
    assert_eq!(bad.requests(), 6);
    send_until(proxy.addr, || bad.requests() >= 7).await;
    let second = out.elapsed();
    assert!(
        second >= Duration::from_millis(550),
        "{second:?} after {first:?}"
    );
}

/// Sends GETs through `proxy` until `done` (at most 20,000, within 20 s).
async fn send_until(proxy: SocketAddr, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for _ in 0..20_000 {
        if done() {
            return;
        }
        assert!(Instant::now() < deadline, "not done within 20 s");
        get(proxy, "/").await;
    }
    panic!("not done within 20,000 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_max_ejected_of_the_pool_is_out_at_once() {
    let bad_a = RawServer::start(|_| RawAction::Respond(raw_status("a", 500))).await;
    let bad_b = RawServer::start(|_| RawAction::Respond(raw_status("b", 500))).await;
    let good = Backend::start("good").await;
    let mut setup = Setup::with(&[bad_a.addr, bad_b.addr, good.addr]);
    // A third of three is one backend: the second to fail is not ejected.
    setup.extra = "[upstream.app.passive]\nmax_fails = 0\n[upstream.app.outlier]\n\
                   consecutive_5xx = 2\nsuccess_rate = 0\nbase_time = \"60s\"\nmax_ejected = 0.34\n"
        .into();
    let proxy = Proxy::start(&setup);
    for _ in 0..30 {
        get(proxy.addr, "/").await;
    }
    // `a` fails twice first and is out; `b` fails as often and stays in.
    assert_eq!(bad_a.requests(), 2);
    assert!(bad_b.requests() >= 12, "{}", bad_b.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failing_half_its_answers_is_ejected_by_its_success_rate() {
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // 500 and 200 in turn: never two 500s in a row.
    let flaky = RawServer::start(move |_| {
        let i = n.fetch_add(1, Ordering::Relaxed);
        RawAction::Respond(raw_status("flaky", if i % 2 == 0 { 500 } else { 200 }))
    })
    .await;
    let (one, two) = (Backend::start("one").await, Backend::start("two").await);
    let mut setup = Setup::with(&[flaky.addr, one.addr, two.addr]);
    setup.extra = "[upstream.app.passive]\nmax_fails = 0\n[upstream.app.outlier]\n\
                   consecutive_5xx = 0\nsuccess_rate = 0.8\ninterval = \"100ms\"\n\
                   min_requests = 5\nbase_time = \"60s\"\n"
        .into();
    let proxy = Proxy::start(&setup);
    // Its rate, 50%, is under 0.8 × the pool's 83%: out after an interval with 5 answers.
    let sent = until_left_out(proxy.addr, &flaky, 60, 20_000).await;
    assert!(
        sent.is_some(),
        "never ejected: {} requests reached it",
        flaky.requests()
    );
    assert!(one.hits() > 0 && two.hits() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_lists_every_attempt_as_nginx_does() {
    let unavailable = RawServer::start(|_| RawAction::Respond(raw_status("down", 503))).await;
    let refusing = Refusing::new();
    let good = Backend::start("good").await;
    let addrs = [unavailable.addr, refusing.addr, good.addr];
    let template = "{upstream_addr}|{upstream_status}|{status}";
    for (format, want) in [
        (
            template,
            format!("{}, {}, {}|503, 502, 200|200", addrs[0], addrs[1], addrs[2]),
        ),
        (
            "combined",
            format!(" tried={}(503),{}(502)", addrs[0], addrs[1]),
        ),
    ] {
        let mut setup = Setup::with(&addrs);
        setup.extra = ON_503.into();
        let (setup, path) = with_log(setup, format);
        let proxy = Proxy::start(&setup);
        // Round robin's first pick is `down` (503, retried), then the refused connect, then
        // `good`.
        let r = get(proxy.addr, "/").await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "good"), "{r:?}");
        let lines = lines_after(proxy, &path).await;
        assert_eq!(lines.len(), 1, "{lines:?}");
        // The template's line is the lists alone; the combined one has them as `tried=`.
        match format == template {
            true => assert_eq!(lines[0], want),
            false => assert!(lines[0].contains(&want), "{}\nwanted {want}", lines[0]),
        }
    }
}
