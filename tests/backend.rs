//! `pinlb backend`: the pinned test servers, through the library and as the `pinlb` binary.
//!
//! Real TCP on `127.0.0.1` with kernel-chosen ports; every wait is on an event and bounded by
//! [`WAIT`]. The clients are the shared ones in `common`.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    Conn, RawConn, WAIT, allowed, bin, full, raw_request_blocking, raw_request_text, request,
    threads,
};
use http::{Method, StatusCode};
use pinlb_tools::backend::{BackendError, BackendSpec, Backends};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Held while starting backends and while reading threads' cores. A server thread is named when
/// it starts and pins itself just after, so a scan racing another test's start could see an
/// unpinned `pinlb-be0`; `Backends::start` returns only once every thread is pinned, so under
/// this lock no such thread exists.
static PINNING: Mutex<()> = Mutex::new(());

fn pinning() -> MutexGuard<'static, ()> {
    // A test that failed while holding the lock leaves nothing half-done behind it.
    PINNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// `n` cores for `n` servers: server i on the i-th allowed core, round robin. Every test uses this
/// mapping, so all threads named `pinlb-be{i}` in this process belong on the same core.
fn cores_for(n: usize) -> Vec<usize> {
    let allowed = allowed();
    (0..n).map(|i| allowed[i % allowed.len()]).collect()
}

fn spec(servers: usize) -> BackendSpec {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    BackendSpec {
        listen: vec![any; servers],
        cpus: cores_for(servers),
        ..BackendSpec::default()
    }
}

fn start(spec: &BackendSpec) -> Backends {
    let _guard = pinning();
    Backends::start(spec).expect("start the backends")
}

#[tokio::test]
async fn get_answers_the_status_and_body_size_asked_for_on_every_server() {
    let backends = start(&BackendSpec {
        status: 201,
        body: 1000,
        ..spec(2)
    });
    assert_eq!(backends.addrs().len(), 2);
    for &addr in backends.addrs() {
        assert_ne!(addr.port(), 0, "port 0 resolved");
        let r = Conn::open(addr).await.get("/").await;
        let (status, body) = (r.status, r.bytes);
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(body.len(), 1000);
        assert!(body.starts_with(b"hello world\nhello world\n"));
    }
    backends.stop();
}

#[tokio::test]
async fn the_default_answer_is_200_hello_world() {
    let backends = start(&spec(1));
    let r = Conn::open(backends.addrs()[0]).await.get("/").await;
    let (status, body) = (r.status, r.bytes);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"hello world\n");
}

#[tokio::test]
async fn health_answers_200_even_when_the_status_is_503() {
    let backends = start(&BackendSpec {
        status: 503,
        ..spec(1)
    });
    let mut client = Conn::open(backends.addrs()[0]).await;
    assert_eq!(
        client.get("/").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(client.get("/health").await.status, StatusCode::OK);
}

#[tokio::test]
async fn requests_counts_exactly_the_requests_sent_but_not_health() {
    let backends = start(&spec(2));
    assert_eq!(backends.requests(), 0);
    let mut a = Conn::open(backends.addrs()[0]).await;
    let mut b = Conn::open(backends.addrs()[1]).await;
    for _ in 0..3 {
        assert_eq!(a.get("/").await.status, StatusCode::OK);
    }
    for _ in 0..4 {
        assert_eq!(b.get("/any/path?x=1").await.status, StatusCode::OK);
    }
    assert_eq!(a.get("/health").await.status, StatusCode::OK);
    assert_eq!(b.get("/health").await.status, StatusCode::OK);
    assert_eq!(backends.requests(), 7);
}

#[tokio::test]
async fn a_request_body_is_read_so_the_connection_stays_open() {
    let backends = start(&spec(1));
    let mut client = Conn::open(backends.addrs()[0]).await;
    let upload = Bytes::from(vec![b'x'; 256 * 1024]);
    let post = request(Method::POST, "/", full(upload));
    assert_eq!(client.fetch(post).await.status, StatusCode::OK);
    // The same connection carries the next request: `ready` in `Conn::send` fails on a closed
    // one.
    assert_eq!(client.get("/").await.status, StatusCode::OK);
    assert_eq!(backends.requests(), 2);
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let backends = start(&spec(1));
    let three = b"GET / HTTP/1.1\r\nhost: b\r\n\r\nGET /health HTTP/1.1\r\nhost: b\r\n\r\n\
                  HEAD / HTTP/1.1\r\nhost: b\r\n\r\n";
    let got = raw_request_text(backends.addrs()[0], three, 3).await;
    let bodies: Vec<&str> = got.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(bodies.len(), 3, "{got}");
    assert!(bodies[0].ends_with("\r\n\r\nhello world\n"), "{got}");
    assert!(bodies[1].ends_with("\r\n\r\nok\n"), "{got}");
    // HEAD: the length of the body it would get, and no body.
    assert!(bodies[2].starts_with("content-length: 12\r\n"), "{got}");
    assert!(bodies[2].ends_with("\r\n\r\n"), "{got}");
    assert_eq!(backends.requests(), 2);
}

#[tokio::test]
async fn a_chunked_body_with_expect_continue_is_read_and_the_connection_stays_open() {
    let backends = start(&spec(1));
    let addr = backends.addrs()[0];
    let mut conn = RawConn::open(addr).await;
    conn.send(
        b"POST / HTTP/1.1\r\nhost: b\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n",
    )
    .await;
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(WAIT, conn.read(&mut buf))
        .await
        .expect("100 Continue within WAIT")
        .expect("read");
    assert_eq!(&buf[..n], b"HTTP/1.1 100 Continue\r\n\r\n");
    conn.send(b"5;x=y\r\nhello\r\n0\r\nt: 1\r\n\r\nGET / HTTP/1.1\r\nhost: b\r\n\r\n")
        .await;
    let read =
        conn.read_until(|seen| seen.windows(12).filter(|w| w == b"hello world\n").count() >= 2);
    let seen = tokio::time::timeout(WAIT, read)
        .await
        .expect("two responses within WAIT");
    let got = String::from_utf8(seen).unwrap();
    assert_eq!(got.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{got}");
    assert_eq!(backends.requests(), 2);
}

#[tokio::test]
async fn http_1_0_closes_unless_asked_to_keep_alive() {
    let backends = start(&spec(1));
    let addr = backends.addrs()[0];
    // Read until the server closes: a second response would mean it kept the connection.
    let closed = raw_request_text(addr, b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n", 2).await;
    assert_eq!(closed.matches("HTTP/1.1 200 OK").count(), 1, "{closed}");
    assert!(closed.contains("\r\nconnection: close\r\n"), "{closed}");
    let kept = raw_request_text(
        addr,
        b"GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET / HTTP/1.0\r\n\r\n",
        2,
    )
    .await;
    assert_eq!(kept.matches("HTTP/1.1 200 OK").count(), 2, "{kept}");
    assert!(kept.contains("\r\nconnection: keep-alive\r\n"), "{kept}");
}

#[tokio::test]
async fn a_malformed_request_gets_400_after_the_answers_before_it_and_a_close() {
    let backends = start(&spec(1));
    let got = raw_request_text(
        backends.addrs()[0],
        b"GET / HTTP/1.1\r\nhost: b\r\n\r\nGET / HTTP/1.1\r\nbad header\r\n\r\n",
        // More than it sends: only the close ends the read.
        3,
    )
    .await;
    let statuses: Vec<&str> = got.matches("HTTP/1.1 ").collect();
    assert_eq!(statuses.len(), 2, "{got}");
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(got.contains("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    assert_eq!(backends.requests(), 1);
}

#[test]
fn every_server_thread_is_pinned_to_its_core() {
    let backends = start(&spec(2));
    assert_eq!(backends.cores(), cores_for(2));
    let _guard = pinning();
    let seen = threads("self");
    for (i, core) in backends.cores().iter().enumerate() {
        let name = format!("pinlb-be{i}");
        let mine: Vec<_> = seen.iter().filter(|(_, n, _)| *n == name).collect();
        assert!(!mine.is_empty(), "no thread named {name} in {seen:?}");
        for (tid, _, cpus) in mine {
            assert_eq!(*cpus, core.to_string(), "thread {tid} ({name})");
        }
    }
}

#[tokio::test]
async fn delay_makes_a_response_take_at_least_that_long() {
    let delay = Duration::from_millis(100);
    let backends = start(&BackendSpec { delay, ..spec(1) });
    let mut client = Conn::open(backends.addrs()[0]).await;
    let started = Instant::now();
    assert_eq!(client.get("/").await.status, StatusCode::OK);
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
}

/// Nanoseconds each `pinlb-be0` thread of this process has run, by thread id.
fn be0_cpu_ns() -> HashMap<String, u64> {
    threads("self")
        .into_iter()
        .filter(|(_, name, _)| name == "pinlb-be0")
        .filter_map(|(tid, _, _)| {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
            let ns = stat.split_whitespace().next()?.parse().ok()?;
            Some((tid, ns))
        })
        .collect()
}

#[tokio::test]
async fn work_burns_cpu_on_the_server_thread_for_at_least_that_long() {
    let work = Duration::from_millis(200);
    let backends = start(&BackendSpec { work, ..spec(1) });
    let mut client = Conn::open(backends.addrs()[0]).await;
    let before = be0_cpu_ns();
    let started = Instant::now();
    assert_eq!(client.get("/").await.status, StatusCode::OK);
    assert!(started.elapsed() >= work, "{:?}", started.elapsed());
    // Other tests may run their own `pinlb-be0`: one of the threads (ours) must have burnt it.
    let after = be0_cpu_ns();
    let most = after
        .iter()
        .filter_map(|(tid, ns)| Some(ns - before.get(tid)?))
        .max()
        .expect("a pinlb-be0 thread in both samples");
    // The loop counts the thread's own CPU time, so all of `work` is burnt however busy the
    // core is (it then takes longer); a wait without CPU would give it next to nothing.
    assert!(
        most >= work.as_nanos() as u64,
        "server thread ran {most} ns for {work:?} of work"
    );
}

#[tokio::test]
async fn stop_closes_the_port_and_open_connections() {
    let backends = start(&spec(1));
    let addr = backends.addrs()[0];
    let mut open = RawConn::open(addr).await;
    // One exchange, so the connection is being served and not just queued in the backlog.
    open.send(b"GET / HTTP/1.1\r\nhost: b\r\n\r\n").await;
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(WAIT, open.read(&mut buf))
        .await
        .expect("response within WAIT")
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));

    backends.stop();
    // Whatever may be left of the response, then end of stream (or a reset).
    open.wait_closed().await;
    // A bare connect, not a client: it only probes whether the port is still open.
    assert!(TcpStream::connect(addr).await.is_err(), "port still open");
}

#[test]
fn a_taken_port_fails_the_start_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let spec = BackendSpec {
        listen: vec!["127.0.0.1:0".parse().unwrap(), addr],
        ..spec(2)
    };
    let err = Backends::start(&spec).err().expect("start fails");
    assert!(matches!(err, BackendError::Bind { address, .. } if address == addr));
    assert!(
        err.to_string()
            .starts_with(&format!("cannot listen on {addr}: "))
    );
}

#[test]
fn the_binary_prints_its_address_serves_and_exits_0_on_sigterm() {
    let core = cores_for(1)[0];
    let mut child = Command::new(bin())
        .args([
            "backend",
            "--listen",
            "127.0.0.1:0",
            "--cpus",
            &core.to_string(),
            "--status",
            "202",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run pinlb backend");
    let pid = child.id();
    let mut reaper = KillOnDrop { pid, reaped: false };
    let stdout = child.stdout.take().unwrap();
    // Read on a thread so the wait for the line is bounded.
    let (line_tx, line_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = line_tx.send(line);
    });
    let line = line_rx.recv_timeout(WAIT).expect("a line on stdout");
    let prefix = "backend 0 listening on ";
    let suffix = format!(" (core {core})\n");
    assert!(
        line.starts_with(prefix) && line.ends_with(&suffix),
        "{line:?}"
    );
    let addr: SocketAddr = line[prefix.len()..line.len() - suffix.len()]
        .parse()
        .expect("an address");

    let resp = raw_request_blocking(
        addr,
        b"GET / HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 202 Accepted\r\n"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nhello world\n"), "{resp}");

    // Its own process: no other test's threads to tell apart.
    let seen = threads(&pid.to_string());
    assert!(
        seen.iter()
            .any(|(_, name, cpus)| name == "pinlb-be0" && *cpus == core.to_string()),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|(_, _, cpus)| *cpus == core.to_string()),
        "every thread on core {core}: {seen:?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("send SIGTERM");
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait());
    });
    let status = exit_rx
        .recv_timeout(WAIT)
        .expect("exits within WAIT of SIGTERM")
        .expect("wait");
    reaper.reaped = true;
    assert_eq!(status.code(), Some(0));
}

/// Kills the child if the test fails before it was reaped, so no backend outlives the test.
/// Until it is reaped its pid cannot be reused, so the kill hits nothing else.
struct KillOnDrop {
    pid: u32,
    reaped: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test]
async fn a_websocket_client_gets_text_and_binary_echoes_a_pong_and_a_clean_close() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let backends = start(&spec(1));
    let addr = backends.addrs()[0];
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut ws, resp) = tokio::time::timeout(
        WAIT,
        tokio_tungstenite::client_async(format!("ws://{addr}/any/path"), stream),
    )
    .await
    .expect("handshake within WAIT")
    .expect("handshake");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);

    async fn next<S: StreamExt + Unpin>(ws: &mut S) -> Option<S::Item> {
        tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("a message within WAIT")
    }
    let binary: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let sent = [
        Message::text("hello"),
        Message::binary(binary),
        Message::text(""),
    ];
    for m in sent {
        ws.send(m.clone()).await.unwrap();
        assert_eq!(next(&mut ws).await.unwrap().unwrap(), m);
    }
    ws.send(Message::Ping(Bytes::from_static(b"are you there")))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ws).await.unwrap().unwrap(),
        Message::Pong(Bytes::from_static(b"are you there"))
    );

    ws.close(None).await.unwrap();
    assert!(matches!(next(&mut ws).await, Some(Ok(Message::Close(_)))));
    // The server closes the TCP connection once the close handshake is done.
    assert!(next(&mut ws).await.is_none());
    assert_eq!(backends.requests(), 1, "the upgrade is one request");
    backends.stop();
}

/// A client frame, masked as RFC 6455 requires of clients.
fn masked_frame(first_byte: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut f = vec![first_byte, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

#[tokio::test]
async fn a_fragmented_message_sent_right_behind_the_handshake_is_echoed_whole() {
    use tokio::io::AsyncWriteExt;

    let backends = start(&spec(1));
    let mut stream = TcpStream::connect(backends.addrs()[0]).await.unwrap();
    let mut out = b"GET /ws HTTP/1.1\r\nHost: b\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        .to_vec();
    // Text "hel" not final, then its continuation "lo", in the same write as the handshake.
    out.extend(masked_frame(0x01, b"hel"));
    out.extend(masked_frame(0x80, b"lo"));
    stream.write_all(&out).await.unwrap();

    let head = "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
        sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    let mut got = vec![0u8; head.len() + 7];
    tokio::time::timeout(WAIT, stream.read_exact(&mut got))
        .await
        .expect("the 101 and the echo within WAIT")
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&got[..head.len()]), head);
    // One final text frame, unmasked: the whole message.
    assert_eq!(&got[head.len()..], b"\x81\x05hello");
    backends.stop();
}
