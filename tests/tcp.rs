//! TCP listeners (`mode = "tcp"`): bytes relayed to a backend of the listener's upstream without
//! being read. Redis (`redis-server` behind pinlb, `redis-cli` as the client) where the test is
//! about a real protocol, plain tokio sockets where it is about bytes: half-close passed on, the
//! byte counts of the access log, which backend a connection reached (balancing, connect
//! failures, health checks, access rules), the PROXY protocol header sent to a backend, and the
//! config errors a TCP listener and its upstream refuse.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

/// A port nobody listens on once this returns: bound by the kernel's choice, then let go.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` child process on a port of its own, without persistence; killed (and
/// reaped) on drop.
struct Redis {
    port: u16,
    child: std::process::Child,
}

impl Redis {
    /// One on a free port, answering `PING`.
    async fn start() -> Redis {
        Redis::on(free_port()).await
    }

    /// One on `port`, answering `PING`.
    async fn on(port: u16) -> Redis {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-server (Debian's redis-server)");
        let redis = Redis { port, child };
        let up = poll(100, Duration::from_millis(50), async || {
            redis_cli(port, &["PING"], "")
                .await
                .filter(|out| out.trim() == "PONG")
        })
        .await;
        assert!(
            up.is_some(),
            "redis-server on port {port} never answered PING"
        );
        redis
    }

    /// Its address, as a backend of pinlb's upstream.
    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-cli -p port args...` with `stdin` (commands, one a line, sent on one connection when
/// `args` is empty): its output when it exits 0 within 10 s, `None` otherwise (it could not
/// connect, or its connection was closed).
async fn redis_cli(port: u16, args: &[&str], stdin: &str) -> Option<String> {
    let mut child = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run redis-cli (Debian's redis-tools)");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("redis-cli exits in time")
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The port of the Redis server that `CONFIG GET port` through `proxy` reached, on a fresh
/// connection; `None` when the connection failed.
async fn reached(proxy: SocketAddr) -> Option<u16> {
    let out = redis_cli(proxy.port(), &["CONFIG", "GET", "port"], "").await?;
    // `port`, then its value.
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("port"), "{out}");
    Some(lines.next()?.parse().expect("a port"))
}

/// A plain TCP backend that writes its name and a newline on each connection it accepts, then
/// keeps the connection until the client closes its half, and closes its own. Counts its
/// accepts; stops on drop.
struct Named {
    addr: SocketAddr,
    accepts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Named {
    /// One on a port of the kernel's choosing, that answers with `name`.
    async fn start(name: &'static str) -> Named {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepts = Arc::new(AtomicUsize::new(0));
        let counted = accepts.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = s.write_all(format!("{name}\n").as_bytes()).await;
                    let mut sink = Vec::new();
                    let _ = s.read_to_end(&mut sink).await;
                });
            }
        });
        Named {
            addr,
            accepts,
            task,
        }
    }

    /// The connections it has accepted so far.
    fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A connection to `proxy` from `source` (any address of 127.0.0.0/8), and the name of the
/// [`Named`] backend it reached.
async fn connect_from(proxy: SocketAddr, source: IpAddr) -> (TcpStream, String) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source, 0)).unwrap();
    let stream = socket.connect(proxy).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut name = String::new();
    tokio::time::timeout(WAIT, reader.read_line(&mut name))
        .await
        .expect("the backend's name in time")
        .unwrap();
    assert!(
        name.ends_with('\n'),
        "no name, the connection closed: {name:?}"
    );
    // The backend wrote nothing after its name, so nothing is left buffered.
    (reader.into_inner(), name.trim_end().to_string())
}

/// [`connect_from`] 127.0.0.1.
async fn connect_named(proxy: SocketAddr) -> (TcpStream, String) {
    connect_from(proxy, IpAddr::V4(Ipv4Addr::LOCALHOST)).await
}

/// A config with one TCP listener on a kernel-chosen port, relaying to upstream `r` of
/// `backends` through one worker: `listener` adds keys to the `[[listener]]` table, `upstream`
/// to `[upstream.r]`; `extra` is appended (more tables).
fn tcp_toml(backends: &[SocketAddr], listener: &str, upstream: &str, extra: &str) -> String {
    let backends: String = backends
        .iter()
        .map(|a| format!("  {{ address = \"{a}\" }},\n"))
        .collect();
    format!(
        r#"[runtime]
cpus = [{core}]
shutdown_timeout = "3s"

[[listener]]
address = "127.0.0.1:0"
mode = "tcp"
upstream = "r"
{listener}
[upstream.r]
{upstream}
backends = [
{backends}]

{extra}"#,
        core = first_core(),
    )
}

/// `[admin]` on a port of the kernel's choosing, for `/metrics`.
const ADMIN: &str = "[admin]\naddress = \"127.0.0.1:0\"\n";

/// A backend on a kernel-chosen port that takes one connection, reads the client's bytes to
/// its FIN, then writes each of `answer`'s pieces, `gap` apart, and closes; what it read comes
/// out of the receiver.
async fn answers_after_fin(
    answer: Vec<Vec<u8>>,
    gap: Duration,
) -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        for (i, piece) in answer.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            s.write_all(piece).await.unwrap();
        }
        s.shutdown().await.unwrap();
        let _ = tx.send(got);
    });
    (backend, rx)
}

/// Connects to `proxy`, sends `bytes`, closes its half and reads the answer to its end within
/// `WAIT`: the connection's own address, and the answer.
async fn send_and_close(proxy: SocketAddr, bytes: &[u8]) -> (SocketAddr, Vec<u8>) {
    let mut client = TcpStream::connect(proxy).await.unwrap();
    let me = client.local_addr().unwrap();
    client.write_all(bytes).await.unwrap();
    client.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, client.read_to_end(&mut answer))
        .await
        .expect("answered and closed in time")
        .unwrap();
    (me, answer)
}

/// The metric labels of backend `addr` of upstream `r`.
fn labels(addr: SocketAddr) -> String {
    format!("upstream=\"r\",backend=\"{addr}\"")
}

/// Polls `/metrics` (every 50 ms, at most `tries` times) until `name` for backend `addr` is
/// `want`; fails the test with the last value otherwise.
async fn wait_for_metric(proxy: &Proxy, name: &str, addr: SocketAddr, want: f64, tries: u32) {
    let mut last = None;
    let seen = poll(tries, Duration::from_millis(50), async || {
        let v = proxy.metrics().await.get(name, &labels(addr));
        last = v;
        (v == Some(want)).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "{name} of {addr} stayed {last:?}, expected {want}"
    );
}

/// The fields of a TCP connection's line in nginx's combined format, after the date:
/// `"TCP LISTENER" STATUS BYTES_TO_CLIENT "-" "-" BACKEND CONNECT_TIME DURATION
/// BYTES_FROM_CLIENT [queue=WAIT] end=HOW`.
#[derive(Debug)]
struct TcpLine {
    client: String,
    listener: String,
    status: u16,
    sent: u64,
    backend: String,
    received: u64,
    end: String,
}

impl TcpLine {
    /// The fields of `line`; fails the test when it is not a TCP connection's line.
    fn parse(line: &str) -> TcpLine {
        let client = line.split(' ').next().unwrap().to_string();
        let (_, rest) = line
            .split_once("] \"TCP ")
            .unwrap_or_else(|| panic!("not a TCP connection's line: {line}"));
        let (listener, rest) = rest.split_once("\" ").unwrap();
        let f: Vec<&str> = rest.split(' ').collect();
        assert!(f.len() >= 9, "{line}");
        assert_eq!((f[2], f[3]), ("\"-\"", "\"-\""), "{line}");
        TcpLine {
            client,
            listener: listener.to_string(),
            status: f[0].parse().unwrap_or_else(|_| panic!("a status: {line}")),
            sent: f[1].parse().unwrap_or_else(|_| panic!("bytes: {line}")),
            backend: f[4].to_string(),
            received: f[7].parse().unwrap_or_else(|_| panic!("bytes: {line}")),
            end: f[f.len() - 1]
                .strip_prefix("end=")
                .unwrap_or_else(|| panic!("no end= last: {line}"))
                .to_string(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_ping_answers_pong_through_a_tcp_listener() {
    let (a, b) = (Redis::start().await, Redis::start().await);
    let proxy = Proxy::start_toml(&tcp_toml(&[a.addr(), b.addr()], "", "", ""));
    let port = proxy.addr.port();
    for _ in 0..4 {
        let pong = redis_cli(port, &["PING"], "").await;
        assert_eq!(pong.as_deref(), Some("PONG\n"));
    }
    // Two commands on one connection: the GET reaches the server the SET did.
    let out = redis_cli(port, &[], "SET greeting hello\nGET greeting\n").await;
    assert_eq!(out.as_deref(), Some("OK\nhello\n"));
    // Through to a real server: exactly one of the two has the key.
    let mut holders = Vec::new();
    for r in [&a, &b] {
        let v = redis_cli(r.port, &["GET", "greeting"], "").await.unwrap();
        if v == "hello\n" {
            holders.push(r.port);
        }
    }
    assert_eq!(holders.len(), 1, "{holders:?}");
}

#[tokio::test]
async fn a_client_that_shuts_down_its_half_still_gets_the_answer_and_the_log_counts_both_ways() {
    // A backend that reads to the client's FIN, then answers and closes.
    let (backend, got) =
        answers_after_fin(vec![b"got 100000 bytes".to_vec()], Duration::ZERO).await;
    let (path, log) = log_table("combined");
    let proxy = Proxy::start_toml(&tcp_toml(&[backend], "", "", &format!("{ADMIN}{log}")));
    let (_, answer) = send_and_close(proxy.addr, &vec![b'x'; 100_000]).await;
    assert_eq!(answer, b"got 100000 bytes");
    assert_eq!(got.await.unwrap().len(), 100_000);

    wait_for_metric(&proxy, "pinlb_backend_tunnels_open", backend, 0.0, 100).await;
    let m = proxy.metrics().await;
    let l = labels(backend);
    let bytes = |dir: &str| {
        m.value(
            "pinlb_backend_tunnel_bytes_total",
            &format!("{l},direction=\"{dir}\""),
        )
    };
    assert_eq!(bytes("to_backend"), 100_000.0);
    assert_eq!(bytes("to_client"), 16.0);

    let listener = proxy.addr;
    let lines = lines_after(proxy, &path).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = TcpLine::parse(&lines[0]);
    assert_eq!(line.client, "127.0.0.1", "{}", lines[0]);
    assert_eq!(line.listener, listener.to_string(), "{}", lines[0]);
    assert_eq!(line.status, 200, "{}", lines[0]);
    assert_eq!(line.sent, 16, "bytes to the client: {}", lines[0]);
    assert_eq!(
        line.received, 100_000,
        "bytes from the client: {}",
        lines[0]
    );
    assert_eq!(line.backend, backend.to_string(), "{}", lines[0]);
    assert_eq!(line.end, "closed", "{}", lines[0]);
}

#[tokio::test]
async fn least_conn_sends_each_connection_to_the_backend_with_the_fewest_open() {
    let (a, b) = (Named::start("a").await, Named::start("b").await);
    let proxy = Proxy::start_toml(&tcp_toml(
        &[a.addr, b.addr],
        "",
        "algorithm = \"least_conn\"",
        ADMIN,
    ));
    // Four held open: two each.
    let mut open = Vec::new();
    for _ in 0..4 {
        open.push(connect_named(proxy.addr).await);
    }
    let names: Vec<&str> = open.iter().map(|(_, n)| n.as_str()).collect();
    let count = |n: &str| names.iter().filter(|&&x| x == n).count();
    assert_eq!((count("a"), count("b")), (2, 2), "{names:?}");
    assert_eq!((a.accepts(), b.accepts()), (2, 2));

    // Close a's two: a has none open, b two, so the next two both go to a (where round robin
    // would alternate).
    open.retain(|(_, n)| n != "a");
    wait_for_metric(&proxy, "pinlb_backend_tunnels_open", a.addr, 0.0, 100).await;
    for _ in 0..2 {
        let (s, name) = connect_named(proxy.addr).await;
        assert_eq!(name, "a", "a has fewer open connections than b");
        open.push((s, name));
    }
    assert_eq!((a.accepts(), b.accepts()), (4, 2));
}

#[tokio::test]
async fn hash_on_client_ip_keeps_an_address_on_one_backend() {
    let (a, b) = (Named::start("a").await, Named::start("b").await);
    let proxy = Proxy::start_toml(&tcp_toml(
        &[a.addr, b.addr],
        "",
        "algorithm = \"hash\"\nhash = \"client_ip\"",
        "",
    ));
    // Ten at once from 127.0.0.1, all open: one backend (round robin or least_conn would split
    // them).
    let mut open = Vec::new();
    for _ in 0..10 {
        open.push(connect_named(proxy.addr).await);
    }
    let first = open[0].1.clone();
    assert!(
        open.iter().all(|(_, n)| *n == first),
        "{:?}",
        open.iter().map(|(_, n)| n).collect::<Vec<_>>()
    );
    drop(open);
    // The key is the address: each of twenty others lands on one backend, twice over, and
    // between them they reach both.
    let mut seen = Vec::new();
    for i in 2..22u8 {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, i));
        let (_s1, one) = connect_from(proxy.addr, source).await;
        let (_s2, two) = connect_from(proxy.addr, source).await;
        assert_eq!(one, two, "127.0.0.{i}");
        seen.push(one);
    }
    assert!(
        seen.iter().any(|n| n == "a") && seen.iter().any(|n| n == "b"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_refused_connect_moves_on_to_the_next_backend() {
    let dead = Refusing::new();
    let live = Named::start("live").await;
    let (path, log) = log_table("combined");
    let proxy = Proxy::start_toml(&tcp_toml(
        &[dead.addr, live.addr],
        "",
        "",
        &format!("{ADMIN}{log}"),
    ));
    for i in 0..6 {
        let (_s, name) = connect_named(proxy.addr).await;
        assert_eq!(name, "live", "connection {i}");
    }
    assert_eq!(live.accepts(), 6);
    // The dead one was tried (and counted), and its connection went on to the live one.
    let failed = proxy.metrics().await.value(
        "pinlb_backend_errors_total",
        &format!("{},kind=\"connect\"", labels(dead.addr)),
    );
    assert!(failed >= 1.0, "{failed}");
    let lines = lines_after(proxy, &path).await;
    assert_eq!(lines.len(), 6, "{lines:?}");
    for l in &lines {
        let line = TcpLine::parse(l);
        assert_eq!(line.status, 200, "{l}");
        assert_eq!(line.backend, live.addr.to_string(), "{l}");
        assert_eq!(line.sent, 5, "\"live\\n\": {l}");
    }
}

/// `[upstream.r.health]` checking Redis's answer to `PING` every 200 ms: one pass brings a
/// backend back, one failure takes it down.
const REDIS_CHECK: &str = "[upstream.r.health]\nsend = \"PING\\r\\n\"\nreceive = \"+PONG\"\n\
                           interval = \"200ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_receive_check_takes_a_killed_redis_out_and_brings_it_back() {
    let a = Redis::start().await;
    let b = Redis::start().await;
    let (b_port, b_addr) = (b.port, b.addr());
    let proxy = Proxy::start_toml(&tcp_toml(
        &[a.addr(), b.addr()],
        "",
        "",
        &format!("{REDIS_CHECK}{ADMIN}"),
    ));
    // Both serve.
    let mut ports = Vec::new();
    for _ in 0..4 {
        ports.push(reached(proxy.addr).await.expect("a Redis answers"));
    }
    assert!(
        ports.contains(&a.port) && ports.contains(&b_port),
        "{ports:?}"
    );

    drop(b);
    wait_for_metric(&proxy, "pinlb_backend_up", b_addr, 0.0, 100).await;
    for _ in 0..6 {
        assert_eq!(reached(proxy.addr).await, Some(a.port));
    }

    let b = Redis::on(b_port).await;
    wait_for_metric(&proxy, "pinlb_backend_up", b.addr(), 1.0, 100).await;
    let back = poll(20, Duration::from_millis(50), async || {
        (reached(proxy.addr).await == Some(b.port)).then_some(())
    })
    .await;
    assert!(back.is_some(), "no connection reached the restarted Redis");
    assert_eq!(
        proxy
            .metrics()
            .await
            .value("pinlb_backend_up", &labels(a.addr())),
        1.0
    );
}

#[tokio::test]
async fn a_backend_that_accepts_but_answers_otherwise_fails_the_receive_check() {
    let redis = Redis::start().await;
    // Accepts, and answers anything with an error: a plain connect check would pass it.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wrong = listener.local_addr().unwrap();
    let (probed, mut probes) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let probed = probed.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = probed.send(buf[..n].to_vec());
                let _ = s.write_all(b"-ERR not redis\r\n").await;
            });
        }
    });
    let proxy = Proxy::start_toml(&tcp_toml(
        &[redis.addr(), wrong],
        "",
        "",
        &format!("{REDIS_CHECK}{ADMIN}"),
    ));
    let first = tokio::time::timeout(WAIT, probes.recv())
        .await
        .expect("a probe in time")
        .unwrap();
    assert_eq!(first, b"PING\r\n", "the check sends `send`");
    wait_for_metric(&proxy, "pinlb_backend_up", wrong, 0.0, 100).await;
    assert_eq!(
        proxy
            .metrics()
            .await
            .value("pinlb_backend_up", &labels(redis.addr())),
        1.0
    );
    for _ in 0..4 {
        assert_eq!(reached(proxy.addr).await, Some(redis.port));
    }
    task.abort();
}

#[tokio::test]
async fn a_denied_client_is_closed_without_reaching_the_backend_and_logged_403() {
    let backend = Named::start("b").await;
    let (path, log) = log_table("combined");
    let proxy = Proxy::start_toml(&tcp_toml(
        &[backend.addr],
        "access = [\"deny 127.0.0.1\"]",
        "",
        &format!("{ADMIN}{log}"),
    ));
    let mut denied = TcpStream::connect(proxy.addr).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(WAIT, denied.read_to_end(&mut got))
        .await
        .expect("closed in time");
    // A reset is a close too.
    assert!(read.is_err() || got.is_empty(), "{got:?}");
    // Another address passes (no rule matches it), so the rule is what closed the first.
    let (_s, name) = connect_from(proxy.addr, "127.0.0.2".parse().unwrap()).await;
    assert_eq!(name, "b");
    assert_eq!(backend.accepts(), 1, "only the allowed client reached it");
    let m = proxy.metrics().await;
    let refused = m.value(
        "pinlb_refused_total",
        &format!("listener=\"{}\",cause=\"denied\"", proxy.addr),
    );
    assert_eq!(refused, 1.0);

    drop(_s);
    let lines = lines_after(proxy, &path).await;
    let parsed: Vec<TcpLine> = lines.iter().map(|l| TcpLine::parse(l)).collect();
    assert_eq!(parsed.len(), 2, "{lines:?}");
    let by = |client: &str| {
        parsed
            .iter()
            .find(|l| l.client == client)
            .unwrap_or_else(|| panic!("no line for {client}: {lines:?}"))
    };
    let d = by("127.0.0.1");
    assert_eq!(
        (d.status, d.sent, d.backend.as_str()),
        (403, 0, "-"),
        "{d:?}"
    );
    let ok = by("127.0.0.2");
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.backend, backend.addr.to_string(), "{ok:?}");
}

/// The error `Config::parse` gives for `toml`; fails the test when it parses.
fn parse_error(toml: &str) -> String {
    match pinlb::Config::parse("test.toml", toml, &allowed()) {
        Ok(_) => panic!("parsed, expected an error:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

/// The 1-based number of the line of `toml` that contains `needle` (once).
fn line_of(toml: &str, needle: &str) -> usize {
    let found: Vec<usize> = (toml.lines().enumerate())
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(found.len(), 1, "{needle:?} in:\n{toml}");
    found[0]
}

/// Asserts that `toml` fails to parse with an error at the line of `needle` that contains each
/// of `parts`.
fn assert_refused(toml: &str, needle: &str, parts: &[&str]) {
    let e = parse_error(toml);
    let at = format!("test.toml:{}:", line_of(toml, needle));
    assert!(e.contains(&at), "expected {at} in:\n{e}\n---\n{toml}");
    for p in parts {
        assert!(e.contains(p), "expected {p:?} in:\n{e}\n---\n{toml}");
    }
}

#[test]
fn a_tcp_listener_and_its_upstream_refuse_the_keys_of_http() {
    let backend = ["127.0.0.1:1".parse().unwrap()];
    // A TCP listener parses; h2c on one does not.
    let plain = tcp_toml(&backend, "", "", "");
    pinlb::Config::parse("test.toml", &plain, &allowed()).unwrap_or_else(|e| panic!("{e}"));
    assert_refused(
        &tcp_toml(&backend, "h2c = true", "", ""),
        "h2c = true",
        &["listener[0].h2c", "not for a TCP listener"],
    );

    // One upstream for a TCP listener and an HTTP one (its `upstream` in single quotes, so
    // that the TCP listener's line is the one the error points at).
    let shared = format!("{plain}\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = 'r'\n");
    assert_refused(
        &shared,
        "upstream = \"r\"",
        &["listener[0].upstream", "named by HTTP listeners too"],
    );

    // An HTTP listener's mirror sends HTTP requests to the TCP listener's upstream.
    let mirrored = format!(
        "{plain}\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"h\"\nmirror = {{ upstream = 'r' }}\n\
         [upstream.h]\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n"
    );
    assert_refused(
        &mirrored,
        "upstream = \"r\"",
        &["listener[0].upstream", "named by HTTP listeners too"],
    );

    // Any protocol on a TCP upstream, HTTP/1.1's written out too.
    assert_refused(
        &tcp_toml(&backend, "", "protocol = \"http1\"", ""),
        "protocol = ",
        &["upstream.r.protocol", "carry bytes"],
    );

    // A connection has no header to count by.
    assert_refused(
        &tcp_toml(
            &backend,
            "rate_limit = [{ zone = 'by_key' }]",
            "",
            "[limit.by_key]\nkey = \"header:x-key\"\nrate = \"1r/s\"\n",
        ),
        "zone = 'by_key'",
        &["listener[0].rate_limit", "keyed by client_ip"],
    );

    // An HTTP check on a TCP upstream.
    assert_refused(
        &tcp_toml(
            &backend,
            "",
            "",
            "[upstream.r.health]\npath = \"/health\"\n",
        ),
        "path = \"/health\"",
        &["upstream.r.health.path"],
    );

    // A TCP check on an HTTP upstream.
    let http = format!(
        "[runtime]\ncpus = [{core}]\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"h\"\n\n\
         [upstream.h]\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n\n\
         [upstream.h.health]\nsend = \"PING\\r\\n\"\n",
        core = first_core()
    );
    assert_refused(
        &http,
        "send = ",
        &["upstream.h.health.send", "TCP listener"],
    );
}

#[tokio::test]
async fn proxy_protocol_v1_to_the_backend_names_the_client_before_its_bytes() {
    // A backend that reads the header line, then the client's bytes to its FIN, and answers.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let mut reader = BufReader::new(s);
        let mut header = String::new();
        reader.read_line(&mut header).await.unwrap();
        let mut rest = String::new();
        reader.read_to_string(&mut rest).await.unwrap();
        let mut s = reader.into_inner();
        s.write_all(b"ok").await.unwrap();
        s.shutdown().await.unwrap();
        let _ = tx.send((header, rest));
    });
    let (path, log) = log_table("json");
    let proxy = Proxy::start_toml(&tcp_toml(&[backend], "", "proxy_protocol = \"v1\"", &log));
    let (me, answer) = send_and_close(proxy.addr, b"hello\r\n").await;
    assert_eq!(answer, b"ok");
    let (header, rest) = tokio::time::timeout(WAIT, rx)
        .await
        .expect("the backend read everything in time")
        .unwrap();
    assert_eq!(
        header,
        format!(
            "PROXY TCP4 127.0.0.1 127.0.0.1 {} {}\r\n",
            me.port(),
            proxy.addr.port()
        )
    );
    assert_eq!(rest, "hello\r\n");

    // The JSON log counts the client's bytes, not the header pinlb wrote.
    let listener = proxy.addr;
    let lines = lines_after(proxy, &path).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v: serde_json::Value = serde_json::from_str(&lines[0]).expect("a JSON line");
    let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let fields = ["protocol", "method", "path", "client", "backend", "end"].map(field);
    let want = [
        "TCP".to_string(),
        "TCP".to_string(),
        listener.to_string(),
        "127.0.0.1".to_string(),
        backend.to_string(),
        "closed".to_string(),
    ];
    assert_eq!(fields, want, "{}", lines[0]);
    assert_eq!(v["status"], 200, "{}", lines[0]);
    assert_eq!(v["bytes"], 2, "{}", lines[0]);
    assert_eq!(v["bytes_received"], 7, "{}", lines[0]);
}

#[tokio::test]
async fn a_reload_keeps_open_connections_on_their_backend_and_moves_new_ones() {
    let a = tcp_echo(Some("a")).await;
    let b = tcp_echo(Some("b")).await;
    let config = |backend: SocketAddr, listener: bool| {
        let tcp = tcp_toml(&[backend], "", "", ADMIN);
        if listener {
            tcp
        } else {
            // The TCP listener gone; an HTTP one elsewhere keeps the file valid.
            tcp.replace(
                "address = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"r\"",
                "address = \"127.0.0.2:0\"\nupstream = \"h\"",
            ) + &format!("\n[upstream.h]\nbackends = [{{ address = \"{backend}\" }}]\n")
        }
    };
    let proxy = Proxy::start_file(&config(a, true));
    let (mut before, name) = connect_named(proxy.addr).await;
    assert_eq!(name, "a");

    proxy.rewrite(&config(b, true));
    let r = proxy.admin(http::Method::POST, "/reload", None).await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.body);
    // The open connection stays with its backend; a new one goes to the new pool.
    assert_eq!(echoed(&mut before, b"still a").await, b"still a");
    assert_eq!(connect_named(proxy.addr).await.1, "b");

    proxy.rewrite(&config(b, false));
    let r = proxy.admin(http::Method::POST, "/reload", None).await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("stopped listening on"), "{}", r.body);
    // No new connection is taken; the open one runs on until it closes.
    let refused = TcpStream::connect(proxy.addr).await;
    assert!(refused.is_err(), "the removed TCP listener still accepts");
    assert_eq!(echoed(&mut before, b"and after").await, b"and after");
    before.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, before.read_to_end(&mut rest))
        .await
        .expect("closed in time")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

/// `n` bytes of a pattern that a shifted or repeated piece would break.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

#[tokio::test]
async fn a_bulk_transfer_each_way_arrives_whole_in_order_and_half_closed() {
    const SIZE: usize = 8 << 20;
    // A backend that reads the client's bytes to their end, then answers with as many of its
    // own and closes.
    let (backend, rx) = answers_after_fin(vec![pattern(SIZE, 7)], Duration::ZERO).await;
    let (path, log) = log_table("combined");
    let proxy = Proxy::start_toml(&tcp_toml(&[backend], "", "", &log));
    let client = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut r, mut w) = client.into_split();
    // Written and read at once: neither side waits for the other to finish.
    let sent = tokio::spawn(async move {
        w.write_all(&pattern(SIZE, 3)).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::with_capacity(SIZE);
    tokio::time::timeout(WAIT, r.read_to_end(&mut back))
        .await
        .expect("the answer in time")
        .unwrap();
    sent.await.unwrap();
    let got = tokio::time::timeout(WAIT, rx)
        .await
        .expect("in time")
        .unwrap();
    assert!(
        got == pattern(SIZE, 3),
        "the backend got {} bytes, not the client's",
        got.len()
    );
    assert!(
        back == pattern(SIZE, 7),
        "the client got {} bytes, not the backend's",
        back.len()
    );
    let lines = lines_after(proxy, &path).await;
    let line = lines
        .first()
        .unwrap_or_else(|| panic!("no line: {lines:?}"));
    assert!(line.contains(&format!("\" 200 {SIZE} ")), "{line}");
    assert!(line.ends_with(&format!(" {SIZE} end=closed")), "{line}");
}

#[tokio::test]
async fn a_rate_limit_closes_a_clients_connections_over_its_rate() {
    let a = Named::start("a").await;
    let (path, log) = log_table("combined");
    let toml = tcp_toml(
        &[a.addr],
        "rate_limit = [{ zone = \"per_client\", burst = 1, nodelay = true }]",
        "",
        &format!("[limit.per_client]\nrate = \"1r/m\"\n{log}"),
    );
    let proxy = Proxy::start_toml(&toml);
    // A bucket of burst + 1 = 2 connections, refilled once a minute: the third is closed.
    for _ in 0..2 {
        assert_eq!(connect_named(proxy.addr).await.1, "a");
    }
    let mut third = TcpStream::connect(proxy.addr).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, third.read_to_end(&mut got))
        .await
        .expect("closed in time")
        .unwrap_or_default();
    assert!(got.is_empty(), "the third reached a backend: {got:?}");
    assert_eq!(a.accepts(), 2);
    let lines = lines_after(proxy, &path).await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\" 429 0 ") && l.ends_with("end=not_relayed")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn after_the_clients_fin_a_backend_still_answering_is_not_cut_by_tunnel_fin() {
    // A backend that reads to the client's FIN, then answers in ten pieces 100 ms apart: a
    // second in all, past the 300 ms `tunnel_fin`, which bounds silence, not the answer.
    let pieces = (0..10u8).map(|i| vec![b'0' + i]).collect();
    let (backend, _) = answers_after_fin(pieces, Duration::from_millis(100)).await;
    let toml = tcp_toml(&[backend], "", "timeouts = { tunnel_fin = \"300ms\" }", "");
    let proxy = Proxy::start_toml(&toml);
    let (_, answer) = send_and_close(proxy.addr, b"request").await;
    assert_eq!(answer, b"0123456789");
}

#[test]
fn a_tcp_and_a_udp_listener_may_share_an_address() {
    // DNS listens on both.
    let toml = format!(
        "[runtime]\ncpus = [{core}]\n\
         [[listener]]\naddress = \"127.0.0.1:5353\"\nmode = \"tcp\"\nupstream = \"dns\"\n\
         [[listener]]\naddress = \"127.0.0.1:5353\"\nmode = \"udp\"\nupstream = \"dns\"\n\
         [upstream.dns]\nbackends = [{{ address = \"127.0.0.1:53\" }}]\n",
        core = first_core()
    );
    pinlb::Config::parse("test.toml", &toml, &allowed()).unwrap_or_else(|e| panic!("{e}"));
    let twice = toml.replace("mode = \"udp\"", "mode = \"tcp\"");
    let e = parse_error(&twice);
    assert!(
        e.contains("duplicate listener address 127.0.0.1:5353"),
        "{e}"
    );
}
