//! Overload end to end: the upstream's queue at `max_conns` (arrival order, the hand-over
//! between workers, the timeout, a full queue, a client that leaves), busy backends that are
//! not dead (a listen backlog of 1 and a slow accept stand for a busy Node.js process), panic
//! mode, the bound on connects in progress, and the concurrency limits backends learn by
//! default (a one-at-a-time backend; one that slows down and recovers).
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
    setup.upstream_keys = "max_conns = 1\nqueue = 0".into();
    let proxy = Proxy::start(&setup);
    a.set_gate(false);
    let held = tokio::spawn(get(proxy.addr, "/gated"));
    a.wait_for_hits(1).await;
    let started = Instant::now();
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(retry_after(&r), None, "{r:?}");
    // Not held until the gated request ends (which it does not before the gate opens).
    assert!(started.elapsed() < Duration::from_secs(2));
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

/// Connects in progress to `addr` on this machine, whoever makes them: sockets whose SYN went
/// out and was not answered (`SYN-SENT` in `/proc/net/tcp`).
fn connects_in_progress_to(addr: SocketAddr) -> usize {
    procfs::net::tcp()
        .expect("read /proc/net/tcp")
        .into_iter()
        .filter(|e| e.state == procfs::net::TcpState::SynSent && e.remote_address == addr)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connecting_a_connect_waits_for_one_in_progress_and_goes_on_when_it_ends() {
    // A listener that does not accept yet, its accept queue (backlog 0: one connection) filled
    // by the test: every further SYN is dropped, so a connect stays in progress (the test's
    // second filler's, and pinlb's) until a retransmission of its SYN finds room.
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
    // Past the SYN's third retransmission (7 s after it went), within the clients' 10 s.
    setup.connect_timeout = "8s";
    setup.extra = admin();
    let proxy = Proxy::start(&setup);
    let clients: Vec<_> = (0..3).map(|_| tokio::spawn(get(proxy.addr, "/"))).collect();

    // All three requests are on the backend and one of pinlb's connects is in progress: the
    // other two wait for it rather than sending SYNs of their own.
    let in_flight =
        async || proxy.status().await["upstreams"][0]["backends"][0]["in_flight"].as_u64();
    let started = poll(500, Duration::from_millis(10), async || {
        (in_flight().await? == 3 && connects_in_progress_to(addr) >= 2).then_some(())
    })
    .await;
    assert!(
        started.is_some(),
        "never 3 requests in flight with pinlb's connect in progress"
    );
    assert_eq!(in_flight().await, Some(3));
    assert_eq!(
        connects_in_progress_to(addr),
        2,
        "the second filler's connect and one of pinlb's"
    );
    // Still so a while later, well before the SYNs' first retransmission (1 s): connects
    // without the bound would have begun at once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(connects_in_progress_to(addr), 2, "a connect past the bound");

    // The backend accepts: pinlb's connect gets in with its SYN's retransmission (after 1 s),
    // and each waiting connect goes on as the one before it ends, within its connect timeout.
    sock.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(sock.into()).unwrap();
    let backend = Backend::serve(listener, "a", Duration::ZERO);
    for c in clients {
        let r = c.await.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(backend.hits(), 3);
    drop(fillers);
}

// Learned concurrency limits (issue 47): nothing set but the backends.

/// Backend `i`'s learned limit in `/status`; `None` while it learns none.
async fn learned_limit(proxy: &Proxy, i: usize) -> Option<u64> {
    proxy.status().await["upstreams"][0]["backends"][i]["concurrency_limit"].as_u64()
}

/// Clients each sending their next GET on a keep-alive connection as soon as the last is
/// answered, until stopped.
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    failed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr, n: usize) -> Load {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let (answered, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let clients = (0..n)
            .map(|_| {
                let (stop, answered, failed) = (stop.clone(), answered.clone(), failed.clone());
                tokio::spawn(async move {
                    let mut conn = Conn::open(addr).await;
                    for _ in 0..1_000_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let counter = if conn.get("/").await.status == 200 {
                            &answered
                        } else {
                            &failed
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Load {
            stop,
            answered,
            failed,
            clients,
        }
    }

    fn answered(&self) -> usize {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the clients; how many requests were answered 200, and how many not.
    async fn stop(self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.await.unwrap();
        }
        (
            self.answered.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_at_a_time_backend_settles_near_the_floor_and_every_client_is_answered() {
    // One request at a time, 5 ms each, as a single Node.js process: 40 clients keep 40
    // requests coming, and what the backend cannot take waits in pinlb's queue.
    let backend = Workers::start(1, Duration::from_millis(5)).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = admin();
    let proxy = Proxy::start(&setup);
    assert_eq!(learned_limit(&proxy, 0).await, Some(20), "it starts at 20");
    let load = Load::start(proxy.addr, 40);
    // The first probe (2 to 3 s in) measures it alone; the limit then comes down to the few
    // that keep it busy without a queue inside it.
    let settled = poll(200, Duration::from_millis(50), async || {
        learned_limit(&proxy, 0).await.filter(|l| *l <= 4)
    })
    .await;
    let (answered, failed) = load.stop().await;
    assert!(settled.is_some(), "the limit never came to 4 or below");
    assert!(answered > 100, "{answered}");
    assert_eq!(failed, 0, "every request of {answered} is answered");
}

/// A backend of `n` workers whose time per request the test sets: each request waits for a
/// worker, then `work`, on keep-alive connections (one Node.js process, a cluster of 4, a PHP
/// pool of 4), with the default listen backlog.
struct Workers {
    addr: SocketAddr,
    work_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Workers {
    async fn start(n: usize, work: Duration) -> Workers {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let work_us = Arc::new(AtomicU64::new(work.as_micros() as u64));
        let workers = Arc::new(tokio::sync::Semaphore::new(n));
        let us = work_us.clone();
        tokio::spawn(async move {
            // Bounded by the test's life: the runtime ends with it.
            while let Ok((mut s, _)) = listener.accept().await {
                let (workers, us) = (workers.clone(), us.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    loop {
                        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => got.extend_from_slice(&buf[..n]),
                            }
                        }
                        got.clear();
                        let Ok(_worker) = workers.acquire().await else {
                            return;
                        };
                        let work = Duration::from_micros(us.load(Ordering::Relaxed));
                        tokio::time::sleep(work).await;
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Workers { addr, work_us }
    }

    fn set_work(&self, work: Duration) {
        self.work_us.store(
            work.as_micros() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// Issue 47's figures (the limit cut within 5 s of a slow-down, raised again within 10 s of the
/// recovery) are measured by `benches/overload_follow.sh` (0.72 s and 0.41 s); here a debug
/// build shares its cores with the rest of the suite, so the waits are bounds for a loaded
/// machine and what is checked is where the limit goes, with the times in the messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_slows_down_has_its_limit_cut_and_regains_it_when_it_recovers() {
    let backend = Workers::start(4, Duration::from_millis(1)).await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = admin();
    let proxy = Proxy::start(&setup);

    let load = Load::start(proxy.addr, 32);

    // A limit learned from a thousand answers at 1 ms: four workers at 1 ms take more than
    // the six they take at 20 ms (seen outside a probe window, which holds it at the floor).
    let before = poll(400, Duration::from_millis(25), async || {
        if load.answered() < 1000 {
            return None;
        }
        learned_limit(&proxy, 0).await.filter(|l| *l > 6)
    })
    .await
    .expect("a learned limit over 6 after 1000 answers at 1 ms a request");

    // 20 ms a request: it comes down to where four workers have no queue, 4 or 5 (6 at most).
    backend.set_work(Duration::from_millis(20));
    let slowed = Instant::now();
    let slow = poll(400, Duration::from_millis(50), async || {
        learned_limit(&proxy, 0).await.filter(|l| *l <= 6)
    })
    .await;
    let cut = slowed.elapsed();
    let slow = slow.unwrap_or_else(|| panic!("limit {before} not cut to 6 or below in {cut:?}"));

    // Back to 1 ms: room again (four workers at 1 ms take at least 10 within the 2 ms
    // tolerance).
    backend.set_work(Duration::from_millis(1));
    let recovered = Instant::now();
    let again = poll(400, Duration::from_millis(50), async || {
        learned_limit(&proxy, 0).await.filter(|l| *l >= 10)
    })
    .await;
    let took = recovered.elapsed();
    let again = again.unwrap_or_else(|| {
        panic!("limit {slow} (cut from {before} in {cut:?}) not raised in {took:?}")
    });

    let (answered, failed) = load.stop().await;
    assert_eq!(
        failed, 0,
        "every request of {answered} is answered ({before} -> {slow} in {cut:?} -> {again} in {took:?})"
    );
}
