//! Overload end to end: the upstream's queue at `max_conns` (arrival order, the hand-over
//! between workers, the timeout, a full queue, a client that leaves), busy backends that are
//! not dead (a listen backlog of 1 and a slow accept stand for a busy Node.js process), panic
//! mode, and the bound on connects in progress.
//!
//! Every wait is on an event (a hit at the backend, a gauge in `/metrics`, a log line) within
//! a bound.

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn admin() -> String {
    "[admin]\naddress = \"127.0.0.1:0\"\n".into()
}

/// Requests waiting in upstream `app`'s queue now.
async fn waiting(proxy: &Proxy) -> f64 {
    proxy
        .metrics()
        .await
        .value("pinlb_upstream_queue_waiting", "upstream=\"app\"")
}

/// Waits until `n` requests wait in the queue.
async fn until_waiting(proxy: &Proxy, n: f64) {
    let seen = poll(200, Duration::from_millis(10), async || {
        (waiting(proxy).await == n).then_some(())
    })
    .await;
    assert!(seen.is_some(), "never {n} waiting in the queue");
}

/// Each worker's request count, by its labels.
async fn worker_requests(proxy: &Proxy) -> BTreeMap<String, f64> {
    let m = proxy.metrics().await;
    m.0.lines()
        .filter_map(|l| l.strip_prefix("pinlb_worker_requests_total{"))
        .filter_map(|l| {
            let (labels, v) = l.split_once("} ")?;
            Some((labels.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The worker that serves `conn`: the one whose request count a request on it raises.
async fn worker_of(proxy: &Proxy, conn: &mut Conn) -> String {
    let before = worker_requests(proxy).await;
    assert_eq!(conn.get("/").await.status, 200);
    let after = worker_requests(proxy).await;
    after
        .into_iter()
        .find(|(w, n)| before.get(w).is_none_or(|b| n > b))
        .map(|(w, _)| w)
        .expect("some worker served the request")
}

fn retry_after(r: &Reply) -> Option<&str> {
    r.headers.get("retry-after").and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_go_out_in_arrival_order_whichever_worker_frees_the_slot() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.upstream_keys = "max_conns = 1\nqueue = 10".into();
    // Every allowed core: a worker each, and the queue is shared by them all.
    setup.cpus = allowed();
    setup.extra = admin();
    let proxy = Proxy::start(&setup);

    // Connections, each known by the worker that serves it (SO_REUSEPORT spreads them).
    let mut conns: Vec<(String, Conn)> = Vec::new();
    for _ in 0..12 {
        let mut c = Conn::open(proxy.addr).await;
        let w = worker_of(&proxy, &mut c).await;
        conns.push((w, c));
    }
    let (holder_worker, mut holder) = conns.remove(0);
    // The first waiter is on another worker than the holder when there is one: the slot the
    // holder frees is handed to a request parked in another runtime.
    let other = conns.iter().position(|(w, _)| *w != holder_worker);
    if setup.cpus.len() > 1 {
        assert!(other.is_some(), "12 connections all on one worker");
    }
    let first = conns.remove(other.unwrap_or(0));
    let waiters: Vec<(String, Conn)> = std::iter::once(first).chain(conns.drain(..3)).collect();

    a.set_gate(false);
    let hits = a.hits();
    let held = tokio::spawn(async move { holder.get("/gated").await });
    a.wait_for_hits(hits + 1).await;
    let mut answers = Vec::new();
    for (i, (_, mut c)) in waiters.into_iter().enumerate() {
        answers.push(tokio::spawn(
            async move { c.get(&format!("/?n={i}")).await },
        ));
        until_waiting(&proxy, (i + 1) as f64).await;
    }
    // Nobody got past the queue while the slot was held.
    assert_eq!(a.hits(), hits + 1);
    a.set_gate(true);
    assert_eq!(held.await.unwrap().status, 200);
    for answer in answers {
        let r = answer.await.unwrap();
        assert_eq!((r.status.as_u16(), r.backend()), (200, "a"), "{r:?}");
    }
    let uris: Vec<String> = a.requests().iter().map(|r| r.uri.clone()).collect();
    assert_eq!(
        uris[uris.len() - 4..],
        ["/?n=0", "/?n=1", "/?n=2", "/?n=3"],
        "served in arrival order"
    );
    let m = proxy.metrics().await;
    let app = "upstream=\"app\"";
    assert_eq!(m.value("pinlb_upstream_queue_waiting", app), 0.0);
    assert_eq!(m.value("pinlb_upstream_queue_wait_seconds_count", app), 4.0);
    assert_eq!(m.value("pinlb_upstream_queue_timeouts_total", app), 0.0);
    let status = proxy.status().await;
    let queue = &status["upstreams"][0]["queue"];
    assert_eq!(queue["max"], 10, "{queue}");
    assert_eq!(queue["dequeued"], 4, "{queue}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_and_a_queue_timeout_get_a_503_with_retry_after_and_a_client_that_leaves_leaves_the_queue()
 {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.upstream_keys = "max_conns = 1\nqueue = 1".into();
    setup.queue_timeout = Some("400ms");
    setup.extra = admin();
    let proxy = Proxy::start(&setup);

    a.set_gate(false);
    let held = tokio::spawn(get(proxy.addr, "/gated"));
    a.wait_for_hits(1).await;

    // One waits; the next finds the queue full and is refused at once.
    let started = Instant::now();
    let timed_out = tokio::spawn(get(proxy.addr, "/"));
    until_waiting(&proxy, 1.0).await;
    let full = get(proxy.addr, "/").await;
    assert_eq!(full.status, 503, "{full:?}");
    assert_eq!(retry_after(&full), Some("1"), "{full:?}");
    assert!(
        full.body.contains("the queue is full (1 requests waiting)"),
        "{full:?}"
    );

    // The one waiting gives up after timeouts.queue.
    let r = timed_out.await.unwrap();
    let took = started.elapsed();
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(retry_after(&r), Some("1"), "{r:?}");
    assert!(r.body.contains("waited 400ms in the queue"), "{r:?}");
    assert!(took >= Duration::from_millis(400), "gave up after {took:?}");

    // A client that leaves while queued leaves the queue: the request never reaches the
    // backend, and its place is free.
    let mut leaving = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    leaving
        .write_all(b"GET /?left HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    until_waiting(&proxy, 1.0).await;
    drop(leaving);
    until_waiting(&proxy, 0.0).await;

    a.set_gate(true);
    assert_eq!(held.await.unwrap().status, 200);
    assert_eq!(get(proxy.addr, "/").await.status, 200);
    assert!(
        !a.requests().iter().any(|r| r.uri.contains("left")),
        "the request whose client left was sent on"
    );
    let m = proxy.metrics().await;
    let app = "upstream=\"app\"";
    assert_eq!(m.value("pinlb_upstream_queue_timeouts_total", app), 1.0);
    assert_eq!(m.value("pinlb_upstream_queue_overflows_total", app), 1.0);
    assert_eq!(m.value("pinlb_upstream_queue_waiting", app), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_queue_a_lone_backend_at_max_conns_still_answers_503_at_once() {
    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.upstream_keys = "max_conns = 1".into();
    let proxy = Proxy::start(&setup);
    a.set_gate(false);
    let held = tokio::spawn(get(proxy.addr, "/gated"));
    a.wait_for_hits(1).await;
    let started = Instant::now();
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(retry_after(&r), None, "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(500));
    a.set_gate(true);
    assert_eq!(held.await.unwrap().status, 200);
}

/// A backend like a busy single-threaded Node.js process: a listen backlog of 1, and one
/// connection served at a time, each request taking `work`, the connection closed after it.
/// SYNs beyond the accept queue are dropped by the kernel, so connects wait for a
/// retransmission.
struct Busy {
    addr: SocketAddr,
    served: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Busy {
    fn start(work: Duration) -> Busy {
        use socket2::{Domain, Socket, Type};
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        sock.bind(&any.into()).unwrap();
        sock.listen(1).unwrap();
        sock.set_nonblocking(true).unwrap();
        let addr = sock.local_addr().unwrap().as_socket().unwrap();
        let listener = tokio::net::TcpListener::from_std(sock.into()).unwrap();
        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            // Bounded by the test's life: the runtime ends with it.
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                // One head, then the work, then the answer; one connection at a time.
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                tokio::time::sleep(work).await;
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Busy { addr, served }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_backends_whose_accept_queues_overflow_are_not_taken_for_dead() {
    let a = Busy::start(Duration::from_millis(20));
    let b = Busy::start(Duration::from_millis(20));
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.algorithm = "least_conn";
    // Shorter than the SYN retransmission, so connects into a full backlog time out: each
    // such timeout, with requests in flight on connections the backend took, is busy.
    setup.connect_timeout = "300ms";
    setup.extra = admin();
    let proxy = Proxy::start(&setup);

    let clients: Vec<_> = (0..30)
        .map(|_| tokio::spawn(get(proxy.addr, "/")))
        .collect();
    let mut statuses = BTreeMap::new();
    for c in clients {
        *statuses
            .entry(c.await.unwrap().status.as_u16())
            .or_insert(0) += 1;
    }
    assert_eq!(
        statuses.get(&503),
        None,
        "busy backends were skipped: {statuses:?}"
    );
    assert!(statuses.contains_key(&200), "{statuses:?}");
    // Neither is skipped after the burst: both answer at once.
    let status = proxy.status().await;
    for backend in status["upstreams"][0]["backends"].as_array().unwrap() {
        assert_eq!(backend["state"], "up", "{backend}");
    }
    let served = a.served.load(std::sync::atomic::Ordering::Relaxed)
        + b.served.load(std::sync::atomic::Ordering::Relaxed);
    assert!(served > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_connect_timeout_a_burst_into_busy_backends_loses_nothing() {
    let a = Busy::start(Duration::from_millis(10));
    let b = Busy::start(Duration::from_millis(10));
    let toml = format!(
        "[runtime]\ncpus = [{}]\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
         [upstream.app]\nalgorithm = \"least_conn\"\n\
         backends = [{{ address = \"{}\" }}, {{ address = \"{}\" }}]\n",
        first_core(),
        a.addr,
        b.addr
    );
    let proxy = Proxy::start_toml(&toml);
    // Four a backend: one served, two in its accept queue, and one whose SYN is dropped and
    // sent again after 1 s, which the old default connect timeout (1 s) did not wait for.
    let clients: Vec<_> = (0..8).map(|_| tokio::spawn(get(proxy.addr, "/"))).collect();
    let mut statuses = BTreeMap::new();
    for c in clients {
        *statuses
            .entry(c.await.unwrap().status.as_u16())
            .or_insert(0) += 1;
    }
    assert_eq!(statuses, BTreeMap::from([(200, 8)]), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_backend_is_skipped_panic_mode_tries_them_anyway_and_ends_when_one_answers() {
    let a = Refusing::new();
    let b = Refusing::new();
    let (a_addr, b_addr) = (a.addr, b.addr);
    let setup = Setup::with(&[a_addr, b_addr]);
    let mut proxy = BinProxy::spawn(&setup).await;
    let proxy_addr = proxy.addr;

    // Both refuse: each is skipped after its failure.
    let r = get(proxy_addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    // Every backend is skipped: they are tried anyway, not refused with a 503.
    let r = get(proxy_addr, "/").await;
    assert_eq!(r.status, 502, "{r:?}");
    proxy.wait_for_log("panic mode on").await;

    // They come back within fail_timeout (10 s): panic mode reaches them at once.
    let _a = Backend::serve(a.listen(), "a", Duration::ZERO);
    let _b = Backend::serve(b.listen(), "b", Duration::ZERO);
    let r = get(proxy_addr, "/").await;
    assert_eq!(r.status, 200, "{r:?}");
    proxy.wait_for_log("panic mode off").await;
    let ons = proxy
        .log()
        .iter()
        .filter(|l| l.contains("panic mode on"))
        .count();
    assert_eq!(ons, 1, "logged once: {:?}", proxy.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connecting_a_connect_waits_for_one_in_progress() {
    // A listener that never accepts, its accept queue (backlog 0: one connection) filled by
    // the test: every further SYN is dropped, so a connect stays in progress.
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    sock.bind(&any.into()).unwrap();
    sock.listen(0).unwrap();
    let addr = sock.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..2 {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    let mut setup = Setup::with(&[addr]);
    setup.upstream_keys = "max_connecting = 1".into();
    setup.connect_timeout = "400ms";
    let proxy = Proxy::start(&setup);
    let clients: Vec<_> = (0..3).map(|_| tokio::spawn(get(proxy.addr, "/"))).collect();
    let mut bodies = Vec::new();
    for c in clients {
        let r = c.await.unwrap();
        assert_eq!(r.status, 502, "{r:?}");
        bodies.push(r.body);
    }
    assert!(
        bodies
            .iter()
            .any(|b| b.contains("connects to the backend in progress (max_connecting)")),
        "{bodies:?}"
    );
    drop(fillers);
}
