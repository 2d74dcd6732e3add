//! The proxy end to end: real backends, real clients, real TCP on loopback.
//!
//! Most tests run `pinlb::Server` in process; the ones about memory, threads and signals run the
//! `pinlb` binary, since those are properties of the process.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1024 * 1024;
/// The size of the large bodies streamed through the binary.
const BIG: u64 = 256 * MIB;
/// pinlb's peak RSS must stay below this while they stream.
const MEMORY_LIMIT_KIB: u64 = 64 * 1024;
const BIG_WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Balancing
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_5_1_1_split_70_requests_50_10_10_in_smooth_order() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let proxy = Proxy::start(&Setup::new(&[(a.addr, 5), (b.addr, 1), (c.addr, 1)]));

    let mut conn = Conn::open(proxy.addr).await;
    let mut order = String::new();
    for _ in 0..70 {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "{r:?}");
        order.push_str(r.backend());
    }

    assert_eq!((a.hits(), b.hits(), c.hits()), (50, 10, 10));
    assert_eq!(
        order,
        "aabacaa".repeat(10),
        "nginx's smooth weighted round robin order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_conn_steers_away_from_a_slow_backend() {
    // The slow backend comes first, so it also wins the ties round robin would give it.
    let slow = Backend::start_with_delay("slow", Duration::from_millis(300)).await;
    let fast = Backend::start("fast").await;
    let mut setup = Setup::with(&[slow.addr, fast.addr]);
    setup.algorithm = "least_conn";
    setup.cpus = allowed();
    let proxy = Proxy::start(&setup);

    // Four clients, each sending its next request as soon as the last one is answered, until 40
    // have been sent: round robin would give each backend 20.
    let tickets = Arc::new(AtomicUsize::new(40));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let tickets = tickets.clone();
        let addr = proxy.addr;
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            while tickets
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let r = conn.get("/").await;
                assert_eq!(r.status, 200, "{r:?}");
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }

    let (s, f) = (slow.hits(), fast.hits());
    assert_eq!(s + f, 40);
    assert!(
        f >= 3 * s,
        "least_conn should favour the fast backend clearly: slow {s}, fast {f}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_conn_answers_every_request_while_other_workers_change_the_load() {
    // Every worker reads the shared in-flight counts while the others change them; a pick must
    // still find a backend when all of them are up.
    let cores = allowed();
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let mut setup = Setup::with(&[a.addr, b.addr, c.addr]);
    setup.algorithm = "least_conn";
    setup.cpus = cores.clone();
    let proxy = Proxy::start(&setup);

    let mut clients = Vec::new();
    for _ in 0..48 {
        let addr = proxy.addr;
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            let mut failures = Vec::new();
            for _ in 0..150 {
                let r = conn.get("/").await;
                if r.status != 200 {
                    failures.push(format!("{} {}", r.status, r.body.trim()));
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} of 7200 requests failed with {} workers and every backend up, e.g. {:?}",
        failures.len(),
        cores.len(),
        failures.first()
    );
    assert_eq!(a.hits() + b.hits() + c.hits(), 7200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_conn_forgets_a_request_that_timed_out() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.algorithm = "least_conn";
    setup.response_timeout = "300ms";
    // One try, and no failure accounting: the timeout must neither move on to `b` nor skip `a`.
    setup.extra = "[upstream.app.retry]\ntries = 1\n[upstream.app.passive]\nmax_fails = 0\n".into();
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;

    let r = conn.get("/sleep/2000").await;
    assert_eq!(r.status, 504, "{r:?}");

    // Nothing is in flight any more, so both backends are equally loaded and both get requests.
    let mut seen = BTreeSet::new();
    for _ in 0..4 {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200);
        seen.insert(r.backend().to_string());
    }
    assert_eq!(
        seen.len(),
        2,
        "the timed-out request must not count as in flight: only {seen:?} answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_conn_forgets_a_download_the_client_abandoned() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.algorithm = "least_conn";
    let proxy = Proxy::start(&setup);

    // A long download goes to `a` (the tie goes to the first backend)...
    let mut dl = Conn::open(proxy.addr).await;
    let resp = dl
        .send(request(
            Method::GET,
            &format!("/download/{}", 256 * MIB),
            empty(),
        ))
        .await;
    assert_eq!(resp.headers()["x-backend"], "a");
    let mut body = resp.into_body();
    let first = http_body_util::BodyExt::frame(&mut body)
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_data());
    // ...so while it runs, `a` is the busier backend.
    assert_eq!(get(proxy.addr, "/").await.backend(), "b");

    // The client walks away mid-body.
    drop(body);
    drop(dl);

    // Once pinlb notices, `a` is idle again and gets requests (at most 100 tries 20 ms apart).
    let back = poll(100, Duration::from_millis(20), async || {
        (get(proxy.addr, "/").await.backend() == "a").then_some(())
    })
    .await
    .is_some();
    assert!(
        back,
        "the abandoned download still counts as in flight on `a`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_clients_are_all_served() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.cpus = allowed();
    let proxy = Proxy::start(&setup);

    let mut clients = Vec::new();
    for _ in 0..100 {
        let addr = proxy.addr;
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            for _ in 0..5 {
                let r = conn.get("/").await;
                assert_eq!(r.status, 200, "{r:?}");
                assert_eq!(r.body, format!("hello from {}\n", r.backend()));
            }
        }));
    }
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(a.hits() + b.hits(), 500);
    assert!(
        a.hits() >= 200 && b.hits() >= 200,
        "round robin spreads the load: a {} b {}",
        a.hits(),
        b.hits()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listener_routes_to_its_own_upstream() {
    let web = Backend::start("web").await;
    let api = Backend::start("api").await;
    let proxy = Proxy::start_toml(&format!(
        r#"[runtime]
cpus = [{core}]
shutdown_timeout = "2s"

[[listener]]
address = "127.0.0.1:0"
upstream = "web"

[[listener]]
address = "127.0.0.1:0"
upstream = "api"

[upstream.web]
backends = [{{ address = "{web}" }}]

[upstream.api]
algorithm = "least_conn"
backends = [{{ address = "{api}" }}]
"#,
        core = first_core(),
        web = web.addr,
        api = api.addr,
    ));
    assert_eq!(proxy.addrs.len(), 2);
    assert_ne!(proxy.addrs[0], proxy.addrs[1]);

    for _ in 0..3 {
        assert_eq!(get(proxy.addrs[0], "/").await.backend(), "web");
        assert_eq!(get(proxy.addrs[1], "/").await.backend(), "api");
    }
    assert_eq!((web.hits(), api.hits()), (3, 3));
}

// ---------------------------------------------------------------------------------------------
// Failures: failover, 502, 503, 504, broken backends
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_over_so_every_request_gets_200() {
    let dead = Refusing::new();
    let live = Backend::start("live").await;
    // The dead backend is first: round robin picks it first, and would pick it every other time.
    let proxy = Proxy::start(&Setup::with(&[dead.addr, live.addr]));

    let mut conn = Conn::open(proxy.addr).await;
    for i in 0..20 {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.backend(), "live");
    }
    assert_eq!(live.hits(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_the_request_body_intact() {
    let dead = Refusing::new();
    let live = Backend::start("live").await;
    let proxy = Proxy::start(&Setup::with(&[dead.addr, live.addr]));

    let mut conn = Conn::open(proxy.addr).await;
    let r = conn
        .fetch(request(Method::POST, "/form", full("name=pinlb&x=1")))
        .await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.backend(), "live");
    assert_eq!(live.requests().pop().unwrap().body_start, b"name=pinlb&x=1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_backend_is_skipped_for_10_seconds_even_once_it_is_back_then_tried_again() {
    let dead = Refusing::new();
    let live = Backend::start("live").await;
    let proxy = Proxy::start(&Setup::with(&[dead.addr, live.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    let failed_at = Instant::now();
    let r = conn.get("/").await;
    assert_eq!((r.status.as_u16(), r.backend()), (200, "live"));

    // The backend comes back on the same port; inside the fail timeout nothing goes there.
    let listener = dead.listen();
    let revived = Backend::serve(listener, "revived", Duration::ZERO);
    for _ in 0..10 {
        let r = conn.get("/").await;
        assert_eq!((r.status.as_u16(), r.backend()), (200, "live"));
    }
    assert_eq!(
        revived.hits(),
        0,
        "a backend that refused must be skipped for the fail timeout"
    );

    // Once the 10 s are over it gets requests again (polled: at most 75 requests 200 ms apart).
    let back_after = poll(75, Duration::from_millis(200), async || {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200);
        (r.backend() == "revived").then(|| failed_at.elapsed())
    })
    .await;
    let back_after = back_after.expect("the revived backend never got a request again");
    assert!(
        back_after >= Duration::from_millis(9_900) && back_after < Duration::from_secs(13),
        "skipped for {back_after:?}, expected about 10 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_backends_refusing_gives_502_naming_the_cause() {
    let (d1, d2) = (Refusing::new(), Refusing::new());
    let proxy = Proxy::start(&Setup::with(&[d1.addr, d2.addr]));

    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.starts_with("502 Bad Gateway"), "{:?}", r.body);
    assert!(r.body.contains("connection refused"), "{:?}", r.body);
    assert!(
        r.body.contains(&d1.addr.to_string()) || r.body.contains(&d2.addr.to_string()),
        "the body should name the backend: {:?}",
        r.body
    );
}

/// Panic mode: with every backend skipped after failures, refusing everyone helps nobody (a
/// busy pool looks failed too), so the next request tries them anyway; refused connects
/// answer at once, so the 502 does not wait either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_every_backend_has_failed_the_next_request_still_tries_them() {
    let (d1, d2) = (Refusing::new(), Refusing::new());
    let proxy = Proxy::start(&Setup::with(&[d1.addr, d2.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    assert_eq!(
        conn.get("/").await.status,
        502,
        "the first request tries both and fails"
    );

    let start = Instant::now();
    let r = conn.get("/").await;
    let took = start.elapsed();
    assert_eq!(r.status, 502, "{r:?}");
    assert!(r.body.contains("connection refused"), "{:?}", r.body);
    assert!(
        took < Duration::from_millis(500),
        "refused connects should not wait on anything (the connect timeout is 1 s), took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_refusing_backend_gives_502_every_time_and_never_503() {
    let dead = Refusing::new();
    let proxy = Proxy::start(&Setup::with(&[dead.addr]));
    let mut conn = Conn::open(proxy.addr).await;
    for i in 0..3 {
        let r = conn.get("/").await;
        assert_eq!(
            r.status, 502,
            "request {i}: a lone backend is always tried: {r:?}"
        );
        assert!(
            r.body
                .contains(&format!("backend {} failed: connection refused", dead.addr)),
            "{:?}",
            r.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_on_an_error_gets_the_error_status_without_a_body() {
    let dead = Refusing::new();
    let proxy = Proxy::start(&Setup::with(&[dead.addr]));

    let mut s = RawConn::open(proxy.addr).await;
    let r = s
        .exchange(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", true)
        .await;
    assert_eq!(r.status, 502, "{}", r.head);

    // Had the HEAD response carried body bytes, this response would not parse.
    let r = s
        .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false)
        .await;
    assert_eq!(r.status, 502, "{}", r.head);
    assert!(String::from_utf8_lossy(&r.body).contains("connection refused"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_slower_than_the_response_timeout_gives_504() {
    let slow = Backend::start_with_delay("slow", Duration::from_secs(2)).await;
    let mut setup = Setup::with(&[slow.addr]);
    setup.response_timeout = "200ms";
    let proxy = Proxy::start(&setup);

    let start = Instant::now();
    let r = get(proxy.addr, "/").await;
    let took = start.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(r.body.starts_with("504 Gateway Timeout"), "{:?}", r.body);
    assert!(
        r.body.contains(&format!(
            "backend {} sent no response headers within 200ms",
            slow.addr
        )),
        "{:?}",
        r.body
    );
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
}

/// `GET /gated` through the proxy, with the backend's gate opened `after` from now: a backend
/// that takes that long to answer. Real time, since the response timer it is measured against
/// runs on pinlb's own runtime.
async fn gated_get_answered_after(
    a: &Backend,
    proxy: std::net::SocketAddr,
    after: Duration,
) -> Reply {
    a.set_gate(false);
    let gate = a.gate_handle();
    let at = Instant::now() + after;
    let opener = tokio::spawn(async move {
        tokio::time::sleep_until(at.into()).await;
        gate.send_replace(true);
    });
    let r = get(proxy, "/gated").await;
    opener.await.unwrap();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_on_a_pooled_connection_gets_the_whole_response_timeout() {
    // The response timer belongs to the pooled backend connection and is reset per request: a
    // later request must get the whole timeout from its own start, not what was left of an
    // earlier request's, and a backend too slow for it must still get 504.
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.response_timeout = "500ms";
    let proxy = Proxy::start(&setup);
    assert_eq!(get(proxy.addr, "/").await.status, 200);

    // 300 ms later, a request answered after 400 ms: within its own timeout, past the first's.
    // Real sleeps here and below: the timers under test run on pinlb's runtime, on real time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = gated_get_answered_after(&a, proxy.addr, Duration::from_millis(400)).await;
    assert_eq!(r.status, 200, "{r:?}");

    // A request the backend never answers in time, on the same connection: 504 at the timeout.
    a.set_gate(false);
    let start = Instant::now();
    let r = get(proxy.addr, "/gated").await;
    let took = start.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_millis(2000),
        "took {took:?}"
    );
    assert_eq!(
        a.accepts(),
        1,
        "all three requests must share one pooled connection"
    );

    // After the timer of an earlier request has fired while the connection sat in the pool, a
    // request answered after 300 ms still gets its whole 500 ms.
    a.set_gate(true);
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    // Longer than the 500 ms timer, in real time: it must fire while the connection is pooled.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = gated_get_answered_after(&a, proxy.addr, Duration::from_millis(300)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        a.accepts(),
        2,
        "the 504 closed the first connection; one new one since"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_not_cut_off_by_the_response_timeout() {
    // The response timeout is about the backend taking long to answer, not about the client taking
    // long to send: a backend cannot answer an upload before it has it.
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.response_timeout = "300ms";
    let proxy = Proxy::start(&setup);

    let (mut read, mut write) = RawConn::open(proxy.addr).await.into_split();
    // The client's deliberate slowness: 10 chunks of 1000 bytes, 100 ms apart. The response is
    // read meanwhile, so an early one is seen rather than a broken pipe. Real sleeps: the time
    // that passes is what the test is about, and pinlb's timer runs on its own runtime.
    let writer = tokio::spawn(async move {
        write
            .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await?;
        for _ in 0..10 {
            write
                .write_all(format!("3e8\r\n{}\r\n", "y".repeat(1000)).as_bytes())
                .await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        write.write_all(b"0\r\n\r\n").await?;
        Ok::<_, std::io::Error>(write)
    });
    let r = read_response(&mut read, false).await;
    let _ = writer.await;
    assert_eq!(
        r.status,
        200,
        "the backend answers as soon as the body is complete, yet:\n{}{}",
        r.head,
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("x-body-bytes"), Some("10000"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_dying_mid_body_is_not_passed_off_as_a_complete_response() {
    // A backend that promises a chunked body, sends one chunk and disappears.
    let backend = raw_backend(vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
        format!("1000\r\n{}\r\n", "z".repeat(4096)).into_bytes(),
    ])
    .await;
    let proxy = Proxy::start(&Setup::with(&[backend]));

    let mut s = RawConn::open(proxy.addr).await;
    s.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let r = read_head(&mut s).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("transfer-encoding"), Some("chunked"), "{}", r.head);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        WAIT,
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut rest),
    )
    .await
    .expect("pinlb must close the client connection when the backend's body breaks");
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains(&"z".repeat(4096)),
        "the data that did arrive is relayed"
    );
    assert!(
        !rest.ends_with("0\r\n\r\n"),
        "a truncated body must not end with the last-chunk marker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_body_delimited_by_the_close_ends_in_a_reset_not_an_end_of_stream() {
    // An HTTP/1.0 client gets a body of unknown length delimited by the close: a plain close
    // after a chunked backend body broke off would look like the whole body.
    let backend = raw_backend(vec![
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
        b"5\r\nhello\r\n".to_vec(),
    ])
    .await;
    let proxy = Proxy::start(&Setup::with(&[backend]));

    let mut s = RawConn::open(proxy.addr).await;
    s.send(b"GET / HTTP/1.0\r\n\r\n").await;
    let r = read_head(&mut s).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("content-length"), None, "{}", r.head);
    assert_eq!(r.header("transfer-encoding"), None, "{}", r.head);
    let mut rest = Vec::new();
    let end = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("pinlb ends the connection when the backend's body breaks");
    let e = end.expect_err("the client must see a reset, not the end of the body");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_stalls_mid_body_is_cut_off_after_the_response_timeout() {
    // A backend that sends its head and part of the body, then nothing while it keeps the
    // connection open.
    let stalling = RawServer::start(|_| {
        RawAction::RespondAndStall(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789".to_vec(),
        )
    })
    .await;
    let mut setup = Setup::with(&[stalling.addr]);
    setup.response_timeout = "300ms";
    let proxy = Proxy::start(&setup);

    let mut s = RawConn::open(proxy.addr).await;
    s.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let start = Instant::now();
    let r = read_head(&mut s).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("pinlb gives up on a stalled body");
    let took = start.elapsed();
    assert_eq!(rest, b"0123456789");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "cut off after {took:?}, timeouts.response is 300ms"
    );
}

/// A client that closes its side while its last request is with a backend abandons that
/// request, as with hyper's server and nginx (499): a half-close reads the same as a close. The
/// requests it pipelined before are answered all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closing_its_side_still_gets_answers_to_the_requests_before_its_last() {
    let slow = Backend::start_with_delay("slow", Duration::from_millis(200)).await;
    let proxy = Proxy::start(&Setup::with(&[slow.addr]));

    let mut s = RawConn::open(proxy.addr).await;
    s.send(
        b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\nGET /3 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    // Half-closed while its first request is with the backend.
    s.half_close().await;
    for _ in 0..2 {
        let r = read_response(&mut s, false).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
        .await
        .expect("the connection ends");
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_statuses_and_bodies_pass_through_unchanged() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let mut conn = Conn::open(proxy.addr).await;
    for code in [404u16, 418, 500, 503] {
        let r = conn.get(&format!("/status/{code}")).await;
        assert_eq!(r.status.as_u16(), code);
        assert_eq!(r.body, format!("status {code} from a\n"));
    }
}

// ---------------------------------------------------------------------------------------------
// Large bodies and back-pressure, through the binary
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_of_256_mib_stream_through_the_binary_in_bounded_memory() {
    let sink = Backend::start("sink").await;
    let proxy = BinProxy::spawn(&Setup::with(&[sink.addr])).await;

    for exact in [false, true] {
        let framing = if exact { "content-length" } else { "chunked" };
        let mut req = request(Method::POST, "/upload", GenBody::new(BIG, exact).boxed());
        if exact {
            req.headers_mut().insert("content-length", BIG.into());
        }
        let mut conn = Conn::open(proxy.addr).await;
        let r = tokio::time::timeout(BIG_WAIT, conn.fetch(req))
            .await
            .expect("upload finished in time");
        assert_eq!(r.status, 200, "{framing}: {r:?}");
        assert_eq!(
            r.headers["x-body-bytes"],
            BIG.to_string(),
            "{framing}: bytes the backend counted"
        );

        let seen = sink.requests().pop().unwrap();
        assert_eq!(seen.body_len, BIG, "{framing}");
        if exact {
            assert_eq!(seen.headers["content-length"], BIG.to_string());
        } else {
            assert_eq!(seen.headers["transfer-encoding"], "chunked");
            assert!(!seen.headers.contains_key("content-length"));
        }
    }

    let hwm = proxy.vm_hwm_kib();
    assert!(
        hwm < MEMORY_LIMIT_KIB,
        "pinlb's peak RSS was {hwm} KiB for 2 x 256 MiB uploads"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_of_256_mib_stream_through_the_binary_in_bounded_memory() {
    let source = Backend::start("source").await;
    let proxy = BinProxy::spawn(&Setup::with(&[source.addr])).await;

    for exact in [false, true] {
        let framing = if exact { "content-length" } else { "chunked" };
        let path = if exact {
            format!("/download/{BIG}")
        } else {
            format!("/download/{BIG}?chunked")
        };
        let mut conn = Conn::open(proxy.addr).await;
        let resp = conn.send(request(Method::GET, &path, empty())).await;
        assert_eq!(resp.status(), 200, "{framing}");
        if exact {
            assert_eq!(resp.headers()["content-length"], BIG.to_string());
        } else {
            assert_eq!(resp.headers()["transfer-encoding"], "chunked");
            assert!(!resp.headers().contains_key("content-length"));
        }
        let n = tokio::time::timeout(BIG_WAIT, count_body(resp.into_body()))
            .await
            .expect("download finished in time");
        assert_eq!(n, BIG, "{framing}: bytes received");
    }

    let hwm = proxy.vm_hwm_kib();
    assert!(
        hwm < MEMORY_LIMIT_KIB,
        "pinlb's peak RSS was {hwm} KiB for 2 x 256 MiB downloads"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_holds_back_the_backend_instead_of_filling_memory() {
    let source = Backend::start("source").await;
    let proxy = BinProxy::spawn(&Setup::with(&[source.addr])).await;

    let mut conn = Conn::open(proxy.addr).await;
    let resp = conn
        .send(request(Method::GET, &format!("/download/{BIG}"), empty()))
        .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = 0u64;
    while got < MIB {
        got += http_body_util::BodyExt::frame(&mut body)
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap()
            .len() as u64;
    }

    // The client stops reading: the backend may only get as far as the buffers in between.
    let produced = settle(&source.produced()).await;
    assert!(
        produced < 64 * MIB,
        "the backend produced {} MiB for a client that read 1 MiB",
        produced / MIB
    );
    let hwm = proxy.vm_hwm_kib();
    assert!(
        hwm < MEMORY_LIMIT_KIB,
        "pinlb's peak RSS was {hwm} KiB while the client was stalled"
    );

    // Reading again, everything arrives.
    got += tokio::time::timeout(BIG_WAIT, count_body(body))
        .await
        .expect("rest of the download");
    assert_eq!(got, BIG);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_stops_reading_holds_back_the_upload_instead_of_filling_memory() {
    let sink = Backend::start("sink").await;
    sink.set_gate(false);
    let proxy = BinProxy::spawn(&Setup::with(&[sink.addr])).await;

    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let addr = proxy.addr;
    let body = GenBody::counted(BIG, false, sent.clone()).boxed();
    let upload = tokio::spawn(async move {
        let mut conn = Conn::open(addr).await;
        let resp = tokio::time::timeout(
            BIG_WAIT,
            conn.try_send(request(Method::POST, "/gated", body)),
        )
        .await;
        Reply::read(resp.expect("upload answered in time").expect("upload")).await
    });
    sink.wait_for_hits(1).await;

    // The backend does not read: the client may only get as far as the buffers in between.
    let pushed = settle(&sent).await;
    assert!(
        pushed < 64 * MIB,
        "the client pushed {} MiB to a backend that read nothing",
        pushed / MIB
    );
    let hwm = proxy.vm_hwm_kib();
    assert!(
        hwm < MEMORY_LIMIT_KIB,
        "pinlb's peak RSS was {hwm} KiB while the backend was stalled"
    );

    sink.set_gate(true);
    let r = upload.await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.headers["x-body-bytes"], BIG.to_string());
}

/// Sends `head` and then `len` bytes of body on `write`, 64 KiB at a time, until done or pinlb
/// stops taking them (closes or resets); returns how much of the body went out.
fn upload(
    mut write: tokio::net::tcp::OwnedWriteHalf,
    head: String,
    len: u64,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_err() {
            return 0;
        }
        let chunk = vec![b'u'; 64 * 1024];
        let mut sent = 0;
        // Bounded by `len`: every pass writes a chunk, or ends.
        while sent < len {
            let n = chunk.len().min((len - sent) as usize);
            if write.write_all(&chunk[..n]).await.is_err() {
                break;
            }
            sent += n as u64;
        }
        sent
    })
}

/// Reads (bounded by [`WAIT`]) until pinlb closes or resets the connection.
async fn closed_by_pinlb(read: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>) {
    let mut scratch = [0u8; 4096];
    let closed = tokio::time::timeout(WAIT, async {
        // Bounded by the timeout.
        loop {
            match read.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "pinlb never closed the client connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_answers_an_upload_early_and_stops_reading_has_its_answer_passed_on_at_once()
{
    let backend = HeadServer::start(OnHead::AnswerThenStopReading(
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\nbig!".to_vec(),
    ))
    .await;
    let proxy = BinProxy::spawn(&Setup::with(&[backend.addr])).await;
    let baseline = proxy.fds_at_rest().await;

    let (mut read, write) = RawConn::open(proxy.addr).await.into_split();
    let len = 32 * MIB;
    let started = Instant::now();
    let writer = upload(
        write,
        format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\n\r\n"),
        len,
    );
    let r = tokio::time::timeout(Duration::from_secs(1), read_response(&mut read, false))
        .await
        .expect("the backend's early 413 reaches the client within 1 s");
    let took = started.elapsed();
    assert_eq!(r.status, 413, "{}", r.head);
    assert_eq!(r.body, b"big!");
    // The rest of the body can't be read within the linger bound, so the connection ends.
    assert_eq!(r.header("connection"), Some("close"), "{}", r.head);
    eprintln!("the early 413 arrived after {took:?}");
    closed_by_pinlb(&mut read).await;
    let sent = writer.await.unwrap();
    assert!(sent < len, "pinlb took the whole body ({sent} bytes)");
    assert_eq!(backend.heads(), 1);

    drop(read);
    let now = proxy.wait_fds_at_most(baseline).await;
    assert_eq!(
        now, baseline,
        "pinlb holds {now} file descriptors, {baseline} before the upload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_reads_an_upload_nor_answers_gives_504_after_the_send_timeout() {
    let backend = HeadServer::start(OnHead::NeverAnswer).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.send_timeout = Some("1s");
    let send_timeout = Duration::from_secs(1);
    let proxy = BinProxy::spawn(&setup).await;
    let baseline = proxy.fds_at_rest().await;

    let (mut read, write) = RawConn::open(proxy.addr).await.into_split();
    let len = 16 * MIB;
    let started = Instant::now();
    let writer = upload(
        write,
        format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\n\r\n"),
        len,
    );
    // The backend's buffers fill at loopback speed; from then on the send timeout runs.
    let r = tokio::time::timeout(send_timeout * 3, read_response(&mut read, false))
        .await
        .expect("an answer soon after the send timeout");
    let took = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.head);
    assert!(
        took >= send_timeout && took < send_timeout * 2,
        "the 504 came after {took:?}, with a send timeout of {send_timeout:?}"
    );
    eprintln!("the 504 arrived after {took:?} (send timeout {send_timeout:?})");
    closed_by_pinlb(&mut read).await;
    let sent = writer.await.unwrap();
    assert!(sent < len, "pinlb took the whole body ({sent} bytes)");

    drop(read);
    let now = proxy.wait_fds_at_most(baseline).await;
    assert_eq!(
        now, baseline,
        "pinlb holds {now} file descriptors, {baseline} before the upload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_answers_and_send_timeouts_leave_memory_and_descriptors_where_they_were() {
    // One backend answers every upload at once and stops reading; the other never reads.
    let early = HeadServer::start(OnHead::AnswerThenStopReading(
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n\r\nbig!".to_vec(),
    ))
    .await;
    let silent = HeadServer::start(OnHead::NeverAnswer).await;
    let toml = |addr: std::net::SocketAddr| {
        let mut setup = Setup::with(&[addr]);
        setup.send_timeout = Some("200ms");
        setup
    };
    let (early_proxy, silent_proxy) = (
        BinProxy::spawn(&toml(early.addr)).await,
        BinProxy::spawn(&toml(silent.addr)).await,
    );
    let len = 8 * MIB;
    let case = async |proxy: &BinProxy, status: u16| {
        let (mut read, write) = RawConn::open(proxy.addr).await.into_split();
        let writer = upload(
            write,
            format!("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\n\r\n"),
            len,
        );
        let r = tokio::time::timeout(WAIT, read_response(&mut read, false))
            .await
            .expect("an answer");
        assert_eq!(r.status, status, "{}", r.head);
        closed_by_pinlb(&mut read).await;
        let _ = writer.await;
    };
    for (proxy, status) in [(&early_proxy, 413), (&silent_proxy, 504)] {
        let fds = proxy.fds_at_rest().await;
        // The first cases warm the allocator and the pools (on a loaded machine pinlb may read
        // more of an upload before its answer, so the first batch of 8 may still grow them);
        // the second batch of 8 must not add to them: a leak would grow both.
        case(proxy, status).await;
        for _ in 0..8 {
            case(proxy, status).await;
        }
        let warm = proxy.vm_rss_kib();
        for _ in 0..8 {
            case(proxy, status).await;
        }
        let after = proxy.vm_rss_kib();
        assert!(
            after <= warm + 1024,
            "{status}: resident memory grew from {warm} KiB to {after} KiB over 8 more {} MiB uploads",
            len / MIB
        );
        assert_eq!(
            proxy.wait_fds_at_most(fds).await,
            fds,
            "{status}: descriptors"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_streamed_past_the_retry_buffer_is_not_sent_to_another_backend_after_a_send_timeout()
 {
    // PUT may be sent again; only the body, larger than retry.buffer, forbids it.
    let a = HeadServer::start(OnHead::NeverAnswer).await;
    let b = HeadServer::start(OnHead::NeverAnswer).await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.send_timeout = Some("500ms");
    let proxy = Proxy::start(&setup);

    let (mut read, write) = RawConn::open(proxy.addr).await.into_split();
    let len = 16 * MIB;
    let writer = upload(
        write,
        format!("PUT /upload HTTP/1.1\r\nHost: a\r\nContent-Length: {len}\r\n\r\n"),
        len,
    );
    let r = tokio::time::timeout(WAIT, read_response(&mut read, false))
        .await
        .expect("an answer after the send timeout");
    assert_eq!(r.status, 504, "{}", r.head);
    assert_eq!(
        a.heads() + b.heads(),
        1,
        "the request went to both backends"
    );
    closed_by_pinlb(&mut read).await;
    writer.abort();
}

// ---------------------------------------------------------------------------------------------
// Headers and HTTP details
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_request_headers_are_stripped_and_forwarding_headers_set() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    // The client is a trusted proxy here, so its X-Forwarded-For is kept and appended to.
    setup.extra = "[forwarded]\ntrusted = [\"127.0.0.0/8\"]\n".into();
    let proxy = Proxy::start(&setup);

    let r = raw_request(
        proxy.addr,
        b"GET /echo?x=1 HTTP/1.1\r\n\
          Host: app.example:8080\r\n\
          Connection: keep-alive, X-Client-Secret\r\n\
          Keep-Alive: timeout=5\r\n\
          Proxy-Connection: keep-alive\r\n\
          TE: trailers\r\n\
          Trailer: X-Checksum\r\n\
          Upgrade: websocket\r\n\
          X-Client-Secret: hidden\r\n\
          X-Forwarded-For: 203.0.113.7\r\n\
          X-Forwarded-For: 198.51.100.2\r\n\
          X-Forwarded-Proto: https\r\n\
          X-Real-IP: 203.0.113.7\r\n\
          Forwarded: for=203.0.113.7\r\n\
          X-Custom: kept\r\n\
          \r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");

    let seen = a.requests().pop().unwrap();
    let h = &seen.headers;
    for gone in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "x-client-secret",
    ] {
        assert!(!h.contains_key(gone), "{gone} reached the backend: {h:?}");
    }
    assert_eq!(seen.uri, "/echo?x=1");
    assert_eq!(h["host"], "app.example:8080", "Host passes unchanged");
    assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(h["x-forwarded-for"], "203.0.113.7, 198.51.100.2, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-custom"], "kept");
    // A trusted proxy's other forwarding headers pass too.
    assert_eq!(h["x-real-ip"], "203.0.113.7");
    assert_eq!(h["forwarded"], "for=203.0.113.7");

    // Without an X-Forwarded-For of its own, the client's address is the whole value.
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 200);
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen.headers["x-forwarded-proto"], "http");
    assert_eq!(seen.headers["host"], "pinlb.test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_x_forwarded_for_is_replaced_by_its_address() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let r = raw_request(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: app.example\r\n\
          X-Forwarded-For: 10.9.9.9\r\nX-Forwarded-For: 10.8.8.8\r\n\
          X-Real-IP: 10.9.9.9\r\nForwarded: for=10.9.9.9\r\nX_Forwarded_For: 10.9.9.9\r\n\
          Connection: close\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.headers.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(
        seen.headers["x-forwarded-for"], "127.0.0.1",
        "a spoofed X-Forwarded-For must not reach the backend"
    );
    // Nor the other names a backend may take the client's address from: X-Real-IP and
    // Forwarded from an untrusted client, and any underscored name (CGI-style backends read
    // `X_Forwarded_For` as `X-Forwarded-For`), as nginx drops those by default.
    for gone in ["x-real-ip", "forwarded", "x_forwarded_for"] {
        assert!(
            !seen.headers.contains_key(gone),
            "{gone} reached the backend: {:?}",
            seen.headers
        );
    }
}

/// A connection parked before its first request (idle for more than a second) still has its
/// first head timed from the accept, not from when it was taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_head_is_timed_from_the_accept_even_across_parking() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = "[limits]\nheader_timeout = \"2s\"\n".into();
    let proxy = Proxy::start(&setup);

    let start = Instant::now();
    let mut s = RawConn::open(proxy.addr).await;
    // Silent past `idle::PARK_AFTER`, then part of a head. A real sleep: the silence is what the
    // test is about, and pinlb parks on its own runtime's clock.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    s.send(b"GET / HTTP/1.1\r\nHost: a\r\n").await;
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut got))
        .await
        .expect("the connection ends")
        .unwrap();
    let took = start.elapsed();
    assert!(
        got.starts_with(b"HTTP/1.1 408 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(2900),
        "408 after {took:?} from the accept, header_timeout is 2s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_response_headers_are_stripped() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    let r = raw_request(
        proxy.addr,
        b"GET /hop HTTP/1.1\r\nHost: app.example\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    for gone in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "trailer",
        "te",
        "x-backend-secret",
    ] {
        assert!(!r.has(gone), "{gone} reached the client:\n{}", r.head);
    }
    assert_eq!(r.header("x-backend-visible"), Some("yes"), "{}", r.head);
    assert_eq!(r.header("content-length"), Some("4"), "{}", r.head);
    assert_eq!(r.body, b"hop\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_client_is_named_in_x_forwarded_for() {
    let a = Backend::start("a").await;
    let toml = Setup::with(&[a.addr])
        .toml()
        .replace("address = \"127.0.0.1:0\"", "address = \"[::1]:0\"");
    let proxy = Proxy::start_toml(&toml);
    assert!(proxy.addr.is_ipv6());

    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        a.requests().pop().unwrap().headers["x-forwarded-for"],
        "::1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_requests_reach_the_backend_in_origin_form() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    let r = raw_request(
        proxy.addr,
        b"GET http://app.example/some/path?q=1 HTTP/1.1\r\nHost: app.example\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.uri, "/some/path?q=1");
    assert_eq!(seen.headers["host"], "app.example");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_client_is_answered_without_chunking_and_the_backend_sees_http_1_1() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    // The backend's body is chunked; HTTP/1.0 has no chunking, so the end is the connection's.
    let r = raw_request(
        proxy.addr,
        b"GET /download/100000?chunked HTTP/1.0\r\nHost: x\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        !r.has("transfer-encoding"),
        "no chunked encoding towards an HTTP/1.0 client:\n{}",
        r.head
    );
    assert_eq!(r.body.len(), 100_000);
    assert_eq!(r.body[..4], [0, 1, 2, 3]);

    assert_eq!(a.requests().pop().unwrap().version, http::Version::HTTP_11);
}

/// What Node's `res.writeHead(200, {...}); res.end(body)` sends: a chunked body, one write.
fn node_like(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_keep_alive_client_gets_a_small_chunked_response_with_its_length_and_keeps_its_connection()
 {
    let b = RawServer::start(|_| RawAction::Respond(node_like("hello from node\n"))).await;
    let proxy = Proxy::start(&Setup::with(&[b.addr]));

    let mut c = RawConn::open(proxy.addr).await;
    for _ in 0..2 {
        let r = c
            .exchange(
                b"GET / HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
                false,
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(r.header("content-length"), Some("16"), "{}", r.head);
        assert!(!r.has("transfer-encoding"), "{}", r.head);
        assert_eq!(
            r.header("connection")
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some("keep-alive"),
            "{}",
            r.head
        );
        assert_eq!(r.body, b"hello from node\n");
    }
    assert_eq!(
        b.requests(),
        2,
        "both requests went over the one client connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_keep_alive_client_gets_a_chunked_body_over_64_kib_exact_and_then_the_close() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    let mut c = RawConn::open(proxy.addr).await;
    let r = c
        .exchange(
            b"GET /download/100000?chunked HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
            false,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        !r.has("content-length") && !r.has("transfer-encoding"),
        "over the read-ahead bound the body is delimited by the close:\n{}",
        r.head
    );
    assert_eq!(r.header("connection"), Some("close"), "{}", r.head);
    assert_eq!(r.body.len(), 100_000);
    assert!(
        r.body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % (64 * 1024) % 251) as u8),
        "the body's bytes, in order"
    );
    c.wait_closed().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_keep_alive_client_gets_a_stream_that_does_not_end_as_it_comes() {
    // A server-sent-events-like response: its head and first event, then nothing more.
    let b = RawServer::start(|_| {
        RawAction::RespondAndStall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
                .to_vec(),
        )
    })
    .await;
    let proxy = Proxy::start(&Setup::with(&[b.addr]));

    let mut c = RawConn::open(proxy.addr).await;
    c.send(b"GET /events HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        .await;
    let seen = tokio::time::timeout(
        WAIT,
        c.read_until(|b| b.windows(9).any(|w| w == b"data: 1\n\n")),
    )
    .await
    .expect("the first event arrives while the stream is still open");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(
        !text.to_ascii_lowercase().contains("content-length"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_1_client_still_gets_a_chunked_backend_response_chunked() {
    let b = RawServer::start(|_| RawAction::Respond(node_like("hello from node\n"))).await;
    let proxy = Proxy::start(&Setup::with(&[b.addr]));

    let mut c = RawConn::open(proxy.addr).await;
    for _ in 0..2 {
        let r = c
            .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false)
            .await;
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(r.header("transfer-encoding"), Some("chunked"), "{}", r.head);
        assert!(
            !r.has("content-length") && !r.has("connection"),
            "{}",
            r.head
        );
        assert_eq!(r.body, b"hello from node\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_requests_get_status_and_headers_but_no_body() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    let mut s = RawConn::open(proxy.addr).await;
    let r = s
        .exchange(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n", true)
        .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(
        r.header("content-length"),
        Some("13"),
        "the length a GET would get:\n{}",
        r.head
    );
    assert_eq!(r.header("x-backend"), Some("a"));

    let r = s
        .exchange(b"HEAD /status/404 HTTP/1.1\r\nHost: x\r\n\r\n", true)
        .await;
    assert_eq!(r.status, 404, "{}", r.head);

    // Had either HEAD response carried body bytes, this response would not parse.
    let r = s
        .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false)
        .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.body, b"hello from a\n");

    let methods: Vec<Method> = a.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(methods, vec![Method::HEAD, Method::HEAD, Method::GET]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_gets_100_continue_then_the_body_reaches_the_backend() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    let mut s = RawConn::open(proxy.addr).await;
    s.send(
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n",
    )
    .await;
    let interim = read_head(&mut s).await;
    assert!(
        interim.head.starts_with("HTTP/1.1 100 Continue\r\n"),
        "{:?}",
        interim.head
    );

    s.send(b"hello world").await;
    let r = read_response(&mut s, false).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("x-body-bytes"), Some("11"));

    let seen = a.requests().pop().unwrap();
    assert_eq!(seen.body_start, b"hello world");
    assert!(
        !seen.headers.contains_key("expect"),
        "pinlb answers Expect itself: {:?}",
        seen.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_request_bodies_arrive_intact_with_either_framing() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    let r = conn
        .fetch(request(Method::PUT, "/x", full("0123456789")))
        .await;
    assert_eq!(
        (
            r.status.as_u16(),
            r.headers["x-body-bytes"].to_str().unwrap()
        ),
        (200, "10")
    );
    let r = conn
        .fetch(request(
            Method::POST,
            "/y",
            GenBody::new(100_000, false).boxed(),
        ))
        .await;
    assert_eq!(
        (
            r.status.as_u16(),
            r.headers["x-body-bytes"].to_str().unwrap()
        ),
        (200, "100000")
    );

    let seen = a.requests();
    assert_eq!(seen[0].body_start, b"0123456789");
    assert_eq!(seen[1].body_len, 100_000);
    assert_eq!(seen[1].body_start[..6], [0, 1, 2, 3, 4, 5]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_delimited_backend_response_is_relayed_completely() {
    // An old-style backend: no Content-Length, no chunking, the body ends when it closes.
    let backend = raw_backend(vec![
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n".to_vec(),
        vec![b'x'; 100_000],
    ])
    .await;
    let proxy = Proxy::start(&Setup::with(&[backend]));

    let mut s = RawConn::open(proxy.addr).await;
    for i in 0..2 {
        let r = s
            .exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", false)
            .await;
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
        assert_eq!(r.body.len(), 100_000, "request {i}");
        assert!(r.body.iter().all(|&b| b == b'x'));
    }
}

// ---------------------------------------------------------------------------------------------
// Upstream connections: the keep-alive pool
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused_across_100_sequential_requests() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    // Half on one client connection, half on a fresh client connection each: the pool belongs
    // to the worker, not to a client connection.
    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..50 {
        assert_eq!(conn.get("/").await.status, 200);
    }
    for _ in 0..50 {
        assert_eq!(get(proxy.addr, "/").await.status, 200);
    }

    assert_eq!(a.hits(), 100);
    assert!(
        a.accepts() <= 2,
        "100 sequential requests opened {} backend connections",
        a.accepts()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_responses_keep_the_upstream_connection_pooled() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    for _ in 0..10 {
        let r = conn.fetch(request(Method::HEAD, "/", empty())).await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (200, ""));
        let r = conn.get("/status/204").await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (204, ""));
        let r = conn.get("/status/304").await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (304, ""));
        let r = conn.get("/").await;
        assert_eq!(r.body, "hello from a\n");
    }
    assert_eq!(a.hits(), 40);
    assert!(
        a.accepts() <= 2,
        "40 sequential requests opened {} backend connections",
        a.accepts()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_caps_the_idle_backend_connections_a_worker_keeps() {
    let a = Backend::start_with_delay("a", Duration::from_millis(200)).await;
    let mut setup = Setup::with(&[a.addr]);
    setup.keepalive = 1;
    let proxy = Proxy::start(&setup);

    // Four at once need four backend connections...
    let mut burst = Vec::new();
    for _ in 0..4 {
        let addr = proxy.addr;
        burst.push(tokio::spawn(async move { get(addr, "/").await.status }));
    }
    for r in burst {
        assert_eq!(r.await.unwrap(), 200);
    }
    assert_eq!(a.accepts(), 4);
    // ...but only one stays open afterwards: the other three are closed.
    a.wait_for_closed(3).await;

    // And the one kept is reused.
    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..3 {
        assert_eq!(conn.get("/").await.status, 200);
    }
    assert_eq!(
        a.accepts(),
        4,
        "the kept connection serves the next requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_0_opens_a_fresh_backend_connection_per_request() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.keepalive = 0;
    let proxy = Proxy::start(&setup);
    let mut conn = Conn::open(proxy.addr).await;
    for _ in 0..5 {
        assert_eq!(conn.get("/").await.status, 200);
    }
    assert_eq!(a.accepts(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_closes_each_connection_still_serves_every_request() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    // The raw client sends several requests on one connection: the backend's Connection: close is
    // about the backend's hop, so the client connection stays open.
    let mut s = RawConn::open(proxy.addr).await;
    for i in 0..5 {
        let r = s
            .exchange(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n", false)
            .await;
        assert_eq!(r.status, 200, "request {i}: {}", r.head);
        assert!(
            !r.has("connection"),
            "request {i}: the backend's Connection: close leaked:\n{}",
            r.head
        );
        assert_eq!(r.body, b"closing, from a\n");
    }
    assert_eq!(a.hits(), 5);
    assert_eq!(
        a.accepts(),
        5,
        "a connection the backend closed must not be reused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_backend_closed_while_idle_is_replaced() {
    // The backend answers as if keeping the connection (no `Connection: close`) and closes it
    // right after, as Node.js does once its keep-alive timeout passes: the connection dies
    // while idle in pinlb's pool. Whether pinlb sees the FIN before the next request (and
    // connects anew) or sends it on the dead connection first (and sends it again on a fresh
    // one), the client gets its answer. A timer in the backend instead of the close would race
    // the first request on a loaded machine.
    let a = RawServer::start(|_| RawAction::RespondAndClose(raw_ok("a", "hello"))).await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let mut conn = Conn::open(proxy.addr).await;

    for i in 0..5 {
        let r = conn.get("/").await;
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.body, "hello", "request {i}");
    }
    assert_eq!(a.requests(), 5);
    assert_eq!(a.accepts(), 5, "a new connection for each request");
}

// ---------------------------------------------------------------------------------------------
// Threads and cores (the binary)
// ---------------------------------------------------------------------------------------------

/// `(tid, comm, cores)` of every thread of `pid`: [`threads`] with the core list parsed.
fn threads_of(pid: i32) -> Vec<(String, String, Vec<usize>)> {
    threads(&pid.to_string())
        .into_iter()
        .map(|(tid, comm, list)| {
            let cores = pinlb::sys::cpus::parse_cpu_list(&list).unwrap();
            (tid, comm, cores)
        })
        .collect()
}

async fn assert_pinned(cpus: Vec<usize>) {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.cpus = cpus.clone();
    let mut proxy = BinProxy::spawn(&setup).await;
    for (i, c) in cpus.iter().enumerate() {
        let line = proxy
            .wait_for_log(&format!("worker {i} running on core"))
            .await;
        assert!(
            line.ends_with(&format!("worker {i} running on core {c}")),
            "{line}"
        );
    }
    assert_eq!(get(proxy.addr, "/").await.status, 200);

    let allowed_set: BTreeSet<usize> = cpus.iter().copied().collect();
    let threads = threads_of(proxy.pid);
    let mut workers = Vec::new();
    for (tid, comm, cores) in &threads {
        assert!(
            cores.iter().all(|c| allowed_set.contains(c)),
            "thread {tid} ({comm}) may run on {cores:?}, outside the configured {cpus:?}"
        );
        if let Some(i) = comm.strip_prefix("pinlb-w") {
            let i: usize = i.parse().unwrap();
            assert_eq!(
                cores,
                &vec![cpus[i]],
                "worker thread {comm} must be pinned to exactly core {}",
                cpus[i]
            );
            workers.push(i);
        }
    }
    workers.sort_unstable();
    assert_eq!(
        workers,
        (0..cpus.len()).collect::<Vec<_>>(),
        "one worker per core: {threads:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_core_every_thread_stays_on_it_and_the_worker_is_pinned_to_it() {
    // The last allowed core, so that on most machines it is not the kernel's first choice anyway.
    let core = *allowed().last().unwrap();
    assert_pinned(vec![core]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_cores_each_worker_is_pinned_to_its_own_core() {
    let cores = allowed();
    if cores.len() < 2 {
        eprintln!("only one core allowed ({cores:?}); the two-core case cannot be checked here");
        return;
    }
    assert_pinned(cores[..2].to_vec()).await;
}

// ---------------------------------------------------------------------------------------------
// Client connections: idle timeout and graceful shutdown
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_connection_is_closed_after_client_idle() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.client_idle = "300ms";
    let proxy = Proxy::start(&setup);

    // A connection that never sends a request...
    let mut silent = RawConn::open(proxy.addr).await;
    let took = silent.wait_closed().await;
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "silent connection closed after {took:?}"
    );

    // ...and one idle between requests.
    let mut s = RawConn::open(proxy.addr).await;
    s.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(read_response(&mut s, false).await.status, 200);
    let took = s.wait_closed().await;
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "idle connection closed after {took:?}"
    );
}

/// A keep-alive connection idle for longer than `idle::PARK_AFTER` (1 s) is parked: its socket
/// leaves the reactor and its task ends. It must still serve its next request, pipelined ones
/// too, and still close at `client_idle`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_idle_connection_serves_its_next_requests_and_still_times_out() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.client_idle = "2500ms";
    let proxy = Proxy::start(&setup);

    let mut s = RawConn::open(proxy.addr).await;
    s.send(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(read_response(&mut s, false).await.status, 200);
    // The idleness under test: parked after 1 s, well before client_idle. A real sleep: pinlb
    // parks on its own runtime's clock.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    s.send(b"GET /2 HTTP/1.1\r\nHost: x\r\n\r\nGET /3 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    for _ in 0..2 {
        assert_eq!(read_response(&mut s, false).await.status, 200);
    }
    assert_eq!(a.hits(), 3);
    let took = s.wait_closed().await;
    assert!(
        took >= Duration::from_millis(2400) && took < Duration::from_secs(5),
        "closed after {took:?} idle, client_idle is 2.5s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_parked_connections_at_once() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.shutdown_timeout = "10s";
    let mut proxy = Proxy::start(&setup);
    let mut idle = Conn::open(proxy.addr).await;
    assert_eq!(idle.get("/").await.status, 200);
    // Parked after 1 s (a real sleep: pinlb parks on its own runtime's clock).
    tokio::time::sleep(Duration::from_millis(1600)).await;

    proxy.trigger_shutdown();
    let start = Instant::now();
    proxy
        .join(Duration::from_secs(15))
        .await
        .expect("run returns Ok");
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "shutdown waited {took:?} on a parked connection"
    );
}

/// Connects until refused: at most 50 tries 10 ms apart. A bare connect, not a client: it only
/// probes whether the listener is still there.
async fn wait_until_refused(addr: std::net::SocketAddr) -> bool {
    poll(
        50,
        Duration::from_millis(10),
        async || match TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        },
    )
    .await
    .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_request_finish_and_refuses_new_connections() {
    let slow = Backend::start_with_delay("slow", Duration::from_millis(500)).await;
    let mut setup = Setup::with(&[slow.addr]);
    setup.cpus = allowed();
    let mut proxy = Proxy::start(&setup);
    let addr = proxy.addr;

    let in_flight = tokio::spawn(async move { get(addr, "/").await });
    slow.wait_for_hits(1).await;
    proxy.trigger_shutdown();

    assert!(
        wait_until_refused(addr).await,
        "new connections must be refused once shutdown starts"
    );
    assert!(
        !in_flight.is_finished(),
        "the in-flight request is still being served while draining"
    );
    let r = in_flight.await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "hello from slow\n");

    proxy
        .join(Duration::from_secs(5))
        .await
        .expect("run returns Ok after draining");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_idle_client_connections() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.shutdown_timeout = "10s";
    let mut proxy = Proxy::start(&setup);

    // One worker accepts in order, so once the second connection has been answered the silent
    // first one has been accepted too.
    let mut silent = RawConn::open(proxy.addr).await;
    let mut idle = Conn::open(proxy.addr).await;
    assert_eq!(idle.get("/").await.status, 200);

    proxy.trigger_shutdown();
    let start = Instant::now();
    proxy
        .join(Duration::from_secs(15))
        .await
        .expect("run returns Ok");
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "shutdown waited {took:?} on connections with no request in flight"
    );
    silent.wait_closed().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_still_arriving_at_shutdown_gets_408_at_the_header_timeout() {
    // hyper does not close a connection holding part of a head when asked to stop, so the
    // watchdog must go on timing that head through the stop.
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.shutdown_timeout = "10s";
    setup.extra = "[limits]\nheader_timeout = \"500ms\"\n".into();
    let mut proxy = Proxy::start(&setup);

    let mut slow = RawConn::open(proxy.addr).await;
    slow.send(b"GET / HTTP/1.1\r\nHost: a\r\n").await;
    // Answered once the head has been read in part: the proxy has the bytes before the stop.
    let mut idle = Conn::open(proxy.addr).await;
    assert_eq!(idle.get("/").await.status, 200);

    let start = Instant::now();
    proxy.trigger_shutdown();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut got))
        .await
        .expect("the connection ends within the header timeout, not the shutdown timeout")
        .unwrap();
    assert!(
        got.starts_with(b"HTTP/1.1 408 "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    proxy
        .join(Duration::from_secs(5))
        .await
        .expect("run returns Ok");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_up_on_requests_that_outlast_the_shutdown_timeout() {
    let stuck = Backend::start_with_delay("stuck", Duration::from_secs(30)).await;
    let mut setup = Setup::with(&[stuck.addr]);
    setup.shutdown_timeout = "300ms";
    let mut proxy = Proxy::start(&setup);
    let addr = proxy.addr;

    let in_flight = tokio::spawn(async move {
        let mut conn = Conn::open(addr).await;
        conn.try_send(request(Method::GET, "/", empty()))
            .await
            .map(|r| r.status())
    });
    stuck.wait_for_hits(1).await;
    proxy.trigger_shutdown();
    let start = Instant::now();
    proxy
        .join(Duration::from_secs(5))
        .await
        .expect("run returns Ok after the shutdown timeout");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "drained for {took:?}"
    );

    let outcome = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("the client was let go")
        .unwrap();
    assert!(
        outcome.is_err(),
        "the cut-off request cannot have been answered: {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_request_finish_then_the_binary_exits_0() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let slow = Backend::start_with_delay("slow", Duration::from_millis(500)).await;
    let mut setup = Setup::with(&[slow.addr]);
    setup.cpus = allowed();
    let mut proxy = BinProxy::spawn(&setup).await;
    let addr = proxy.addr;

    let in_flight = tokio::spawn(async move { get(addr, "/").await });
    slow.wait_for_hits(1).await;
    kill(Pid::from_raw(proxy.pid), Signal::SIGTERM).expect("send SIGTERM");

    assert!(
        wait_until_refused(addr).await,
        "new connections must be refused after SIGTERM"
    );
    let r = in_flight.await.unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "hello from slow\n");

    let status = proxy.wait_exit().await;
    assert_eq!(
        status.code(),
        Some(0),
        "stderr:\n{}",
        proxy.log().join("\n")
    );
    proxy.wait_for_log("shutting down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_as_soon_as_the_binary_listens_still_exits_0() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::os::unix::process::ExitStatusExt;

    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.cpus = allowed();
    let mut proxy = BinProxy::spawn(&setup).await;
    kill(Pid::from_raw(proxy.pid), Signal::SIGTERM).expect("send SIGTERM");
    let status = proxy.wait_exit().await;
    assert_eq!(
        (status.code(), status.signal()),
        (Some(0), None),
        "pinlb was already accepting connections, so SIGTERM must shut it down gracefully; stderr:\n{}",
        proxy.log().join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// limits.max_connections
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_idle_keep_alive_connections_make_room_for_new_clients() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = "[limits]\nmax_connections = 2\n".into();
    let proxy = Proxy::start(&setup);

    // Two clients fill the limit and stay connected, idle, after one request each.
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut r = RawConn::open(proxy.addr).await;
        r.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert_eq!(read_response(&mut r, false).await.status, 200);
        idle.push(r);
    }
    // A third client is still served: idle connections close to make room.
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    let mut closed = 0;
    for r in &mut idle {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), r.read(&mut byte)).await;
        if matches!(read, Ok(Ok(0))) {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no idle connection was closed to make room");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_a_busy_connection_keeps_its_slot_and_the_next_client_waits() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.extra = "[limits]\nmax_connections = 1\n".into();
    let proxy = Proxy::start(&setup);

    let addr = proxy.addr;
    let slow = tokio::spawn(async move { get(addr, "/sleep/400").await });
    a.wait_for_hits(1).await;
    // Accepted only once the slow request's connection has closed: it waits in the backlog
    // meanwhile instead of being refused.
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 200);
    assert!(
        slow.is_finished(),
        "the second client was served while the only slot was busy"
    );
    assert_eq!(slow.await.unwrap().status, 200);
}

// ---------------------------------------------------------------------------------------------
// Blame: a client's bad body is the client's fault
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_request_body_is_answered_and_logged_as_the_clients_fault() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.cpus = vec![first_core()];
    let mut proxy = BinProxy::spawn(&setup).await;

    let r = raw_request(
        proxy.addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
        false,
    )
    .await;
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 400, "{}{body}", r.head);
    assert!(
        body.contains("malformed request body: bad chunk size"),
        "the page names the client's body: {body:?}"
    );
    assert!(
        !body.contains("backend"),
        "the page blames no backend: {body:?}"
    );

    let line = proxy.wait_for_log("answered 400").await;
    assert!(
        line.contains("client=127.0.0.1") && line.contains("malformed request body"),
        "the log line names the client and its body: {line}"
    );
    assert!(
        !line.contains("upstream=") && !line.contains("backend"),
        "the log line must not blame the backend: {line}"
    );
}

// ---------------------------------------------------------------------------------------------
// Framing edges (RFC 9112): HTTP/1.0 with Transfer-Encoding, huge lengths, head size, OPTIONS *
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_response_with_transfer_encoding_is_passed_on_and_its_connection_closed() {
    let b = RawServer::start(|_| {
        RawAction::Respond(
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n\
              2\r\nok\r\n0\r\n\r\n"
                .to_vec(),
        )
    })
    .await;
    let proxy = Proxy::start(&Setup::with(&[b.addr]));
    for _ in 0..2 {
        let r = get(proxy.addr, "/").await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "ok"), "{r:?}");
    }
    assert_eq!(
        b.accepts(),
        2,
        "RFC 9112 §6.1: the connection closes after an HTTP/1.0 message with Transfer-Encoding"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_over_2_63_minus_1_is_refused_both_ways() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let r = raw_request(
        proxy.addr,
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(a.hits(), 0, "the request must not reach the backend");

    let b = RawServer::start(|_| {
        RawAction::RespondAndClose(
            b"HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\nx".to_vec(),
        )
    })
    .await;
    let proxy = Proxy::start(&Setup::with(&[b.addr]));
    assert_eq!(get(proxy.addr, "/").await.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_over_64_kib_is_a_502_however_it_arrives() {
    let head = |size: usize| {
        let mut h = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Pad: ".to_vec();
        let pad = size - h.len() - 4;
        h.extend(std::iter::repeat_n(b'a', pad));
        h.extend_from_slice(b"\r\n\r\n");
        assert_eq!(h.len(), size);
        h.extend_from_slice(b"ok");
        h
    };
    for (size, status) in [
        (60_000, 200),
        (64 * 1024, 200),
        (70_000, 502),
        (140_000, 502),
    ] {
        let response = head(size);
        let b = RawServer::start(move |_| RawAction::Respond(response.clone())).await;
        let proxy = Proxy::start(&Setup::with(&[b.addr]));
        let r = get(proxy.addr, "/").await;
        assert_eq!(r.status, status, "a head of {size} bytes: {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_with_an_absolute_target_and_no_path_goes_upstream_as_options_asterisk() {
    let b = RawServer::start(|_| RawAction::Respond(raw_ok("b", "hi"))).await;
    let proxy = Proxy::start(&Setup::with(&[b.addr]));
    let r = raw_request(
        proxy.addr,
        b"OPTIONS http://a HTTP/1.1\r\nHost: a\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    let seen = b.seen();
    assert!(
        seen[0].head.starts_with("OPTIONS * HTTP/1.1\r\n"),
        "RFC 9112 §3.2.4: {:?}",
        seen[0].head
    );
}
