//! `[upstream.NAME.buffering]`: a slow client holds no backend. Request buffering reads the
//! whole body before a backend is picked (and sends it with a Content-Length); response
//! buffering drains the backend's body as fast as it comes, so its connection is back in the
//! pool while the client still reads. Without the table both bodies stream, as before.
//!
//! The figures (1 MiB uploaded at 10 KiB/s; 10 MiB read at 100 KiB/s) take minutes per
//! run; these tests keep their shape at a higher rate (200 KiB at 100 KiB/s; 3 MiB read at
//! 1 MiB/s) and `benches/buffering.sh` measures the figures themselves.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One request as the backend read it.
#[derive(Debug, Clone)]
struct Seen {
    conn: usize,
    head: String,
    body: Vec<u8>,
    /// When the request's first byte and its last byte arrived.
    first: Instant,
    last: Instant,
}

/// A backend that reads requests framed by Content-Length (what buffering sends; a chunked one
/// is read as far as its head), and answers by path: `/big/N` N bytes of a pattern, with the
/// headers of `/big/N/sse` (an event stream) or `/big/N/no` (`X-Accel-Buffering: no`); anything
/// else a short `ok`. It records each request, and when each big body's last byte was written.
#[derive(Clone)]
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    accepts: Arc<AtomicUsize>,
    /// Bytes of big bodies written so far.
    written: Arc<AtomicU64>,
    /// When the last big body's last byte was written.
    finished: Arc<Mutex<Option<Instant>>>,
    arrived: Arc<tokio::sync::Notify>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Recorder {
            addr: listener.local_addr().unwrap(),
            seen: Arc::default(),
            accepts: Arc::default(),
            written: Arc::default(),
            finished: Arc::default(),
            arrived: Arc::default(),
        };
        let server = r.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let n = server.accepts.fetch_add(1, Ordering::SeqCst) + 1;
                let server = server.clone();
                tokio::spawn(async move { server.serve(s, n).await });
            }
        });
        r
    }

    async fn serve(&self, s: TcpStream, conn: usize) {
        let mut s = BufReader::new(s);
        loop {
            // The first byte's arrival, then the rest of the head.
            if s.fill_buf().await.map_or(true, |b| b.is_empty()) {
                return;
            }
            let first = Instant::now();
            let mut head = String::new();
            let mut line = String::new();
            loop {
                line.clear();
                if s.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let len = header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
            let mut body = vec![0; len];
            if s.read_exact(&mut body).await.is_err() {
                return;
            }
            let path = head.split(' ').nth(1).unwrap_or("/").to_string();
            self.seen.lock().unwrap().push(Seen {
                conn,
                head,
                body,
                first,
                last: Instant::now(),
            });
            self.arrived.notify_waiters();
            let w = s.get_mut();
            let ok = match path.strip_prefix("/big/") {
                Some(rest) => self.big(w, rest).await,
                None => w
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await
                    .is_ok(),
            };
            if !ok {
                return;
            }
        }
    }

    /// `N`, `N/sse` or `N/no`: N bytes of [`pattern`], written in 64 KiB pieces.
    async fn big(&self, w: &mut TcpStream, spec: &str) -> bool {
        let mut parts = spec.split('/');
        let n: usize = parts.next().unwrap().parse().unwrap();
        let extra = match parts.next() {
            Some("sse") => "content-type: text/event-stream\r\n",
            Some("no") => "x-accel-buffering: no\r\n",
            _ => "content-type: application/octet-stream\r\n",
        };
        let head = format!("HTTP/1.1 200 OK\r\n{extra}content-length: {n}\r\n\r\n");
        if w.write_all(head.as_bytes()).await.is_err() {
            return false;
        }
        let body = pattern(n);
        for piece in body.chunks(64 * 1024) {
            if w.write_all(piece).await.is_err() {
                return false;
            }
            self.written.fetch_add(piece.len() as u64, Ordering::SeqCst);
        }
        *self.finished.lock().unwrap() = Some(Instant::now());
        true
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (bounded) until `n` requests have been read whole.
    async fn wait_for(&self, n: usize) -> Vec<Seen> {
        tokio::time::timeout(WAIT, async {
            loop {
                let arrived = self.arrived.notified();
                let seen = self.seen();
                if seen.len() >= n {
                    return seen;
                }
                arrived.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{n} requests did not reach the backend: {:?}", self.seen()))
    }
}

/// The value of header `name` in a head's text.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// `n` bytes that show any lost, doubled or reordered piece.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A proxy to `backend` whose upstream has `[upstream.app.buffering]` with `keys` (none
/// without), and `[limits]` with `limits`.
fn proxy(backend: SocketAddr, keys: Option<&str>, limits: &str) -> Proxy {
    let mut setup = Setup::with(&[backend]);
    if let Some(keys) = keys {
        setup.extra = format!("[upstream.app.buffering]\n{keys}\n");
    }
    setup.extra.push_str(&format!("[limits]\n{limits}\n"));
    Proxy::start(&setup)
}

/// This process's open descriptors that are files in `dir` (the proxy runs in it): an
/// unlinked temporary file shows there as `dir/#inode (deleted)`.
fn temp_files_in(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Sends `body` on `conn` at `rate` bytes per second, in pieces every 20 ms, calling `each`
/// with the bytes sent so far after each piece. Returns when the last piece was written.
async fn paced(
    conn: &mut TcpStream,
    body: &[u8],
    rate: usize,
    mut each: impl FnMut(usize),
) -> Instant {
    let tick = Duration::from_millis(20);
    let per = (rate / 50).max(1);
    let mut interval = tokio::time::interval(tick);
    let mut sent = 0;
    for piece in body.chunks(per) {
        interval.tick().await;
        conn.write_all(piece).await.unwrap();
        sent += piece.len();
        each(sent);
    }
    Instant::now()
}

/// Reads a response to its end (Content-Length framed), at most `rate` bytes per second when
/// given; returns the head and the body.
async fn read_all(conn: &mut BufReader<TcpStream>, rate: Option<usize>) -> (String, Vec<u8>) {
    let mut head = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            conn.read_line(&mut line).await.unwrap() > 0,
            "closed mid-head: {head}"
        );
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let len: usize = header(&head, "content-length")
        .expect(&head)
        .parse()
        .unwrap();
    let mut body = vec![0; len];
    match rate {
        None => {
            conn.read_exact(&mut body).await.unwrap();
        }
        Some(rate) => {
            let per = (rate / 50).max(1);
            let mut interval = tokio::time::interval(Duration::from_millis(20));
            for piece in body.chunks_mut(per) {
                interval.tick().await;
                conn.read_exact(piece).await.unwrap();
            }
        }
    }
    (head, body)
}

/// A client connection with a small receive buffer, so that the kernel does not read a large
/// body ahead for it.
async fn slow_reader(addr: SocketAddr) -> BufReader<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    BufReader::with_capacity(4096, socket.connect(addr).await.unwrap())
}

#[tokio::test]
async fn a_buffered_slow_upload_holds_the_backend_only_for_the_transfer_and_spills_to_a_temp_file()
{
    let backend = Recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = format!(
        "memory = \"64KiB\"\ntemp_dir = \"{}\"",
        dir.path().display()
    );
    let proxy = proxy(backend.addr, Some(&keys), "max_body = \"1MiB\"");
    let body = pattern(200 * 1024);
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut spilled = false;
    let done = paced(&mut conn, &body, 100 * 1024, |sent| {
        // Past the memory bound (with a piece of slack for the connection's own buffer), the
        // body is in a file in temp_dir.
        if sent > 100 * 1024 && !spilled {
            spilled = temp_files_in(dir.path()) == 1;
        }
    })
    .await;
    assert!(
        spilled,
        "no temporary file in {} during the upload",
        dir.path().display()
    );
    let (head, reply) = read_all(&mut BufReader::new(conn), None).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(reply, b"ok");

    let seen = backend.wait_for(1).await;
    let s = &seen[0];
    assert_eq!(s.body, body, "the body arrived intact");
    assert!(
        s.first >= done,
        "the backend saw the request before the client's last byte"
    );
    // Streamed, it would take the client's 2 s; from the file, a loopback transfer (about a
    // millisecond here, bounded for a loaded machine).
    let held = s.last - s.first;
    assert!(
        held < Duration::from_millis(500),
        "the backend was held {held:?}"
    );
    assert_eq!(header(&s.head, "content-length"), Some("204800"));
    // The file went with the request.
    let gone = poll(100, Duration::from_millis(20), async || {
        (temp_files_in(dir.path()) == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the temporary file is still open");
}

#[tokio::test]
async fn a_chunked_upload_arrives_with_a_content_length_after_pinlbs_own_100_continue() {
    let backend = Recorder::start().await;
    let proxy = proxy(backend.addr, Some("response = false"), "");
    let mut conn = BufReader::new(TcpStream::connect(proxy.addr).await.unwrap());
    conn.get_mut()
        .write_all(
            b"POST /up HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let mut line = String::new();
    tokio::time::timeout(WAIT, conn.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(
        backend.accepts.load(Ordering::SeqCst),
        0,
        "no backend before the body"
    );
    conn.get_mut()
        .write_all(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_all(&mut conn, None).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let s = &backend.wait_for(1).await[0];
    assert_eq!(s.body, b"hello world");
    assert_eq!(header(&s.head, "content-length"), Some("11"), "{}", s.head);
    assert_eq!(header(&s.head, "transfer-encoding"), None, "{}", s.head);
}

#[tokio::test]
async fn a_buffered_body_over_max_body_is_413_and_never_reaches_a_backend() {
    let backend = Recorder::start().await;
    let proxy = proxy(backend.addr, Some(""), "max_body = \"100KiB\"");
    let mut conn = BufReader::new(TcpStream::connect(proxy.addr).await.unwrap());
    conn.get_mut()
        .write_all(b"POST /up HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192));
    let mut refused = String::new();
    // The answer comes once the body passes 100 KiB, the connection closing after it; pieces
    // written after that may fail.
    for _ in 0..20 {
        if conn.get_mut().write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    tokio::time::timeout(WAIT, conn.read_line(&mut refused))
        .await
        .unwrap()
        .unwrap();
    assert!(refused.starts_with("HTTP/1.1 413"), "{refused}");
    assert_eq!(backend.accepts.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_length_past_what_buffering_holds_is_413_before_the_body_is_read() {
    let backend = Recorder::start().await;
    let keys = "memory = \"4KiB\"\nmax_temp = \"16KiB\"";
    let proxy = proxy(backend.addr, Some(keys), "max_body = \"1MiB\"");
    // Under max_body, over memory + max_temp: refused on its head alone.
    let head = "POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: 102400\r\n\r\n";
    let refused = raw_request(proxy.addr, head.as_bytes(), false).await;
    assert_eq!(refused.status, 413, "{refused:?}");
    // Within it, a body goes whole.
    let mut conn = BufReader::new(TcpStream::connect(proxy.addr).await.unwrap());
    let body = pattern(20 * 1024);
    let head = format!(
        "POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.get_mut().write_all(head.as_bytes()).await.unwrap();
    conn.get_mut().write_all(&body).await.unwrap();
    let (reply, _) = read_all(&mut conn, None).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(backend.wait_for(1).await[0].body, body);
    assert_eq!(backend.accepts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_buffered_response_frees_the_backend_within_a_second_while_the_client_still_reads() {
    let backend = Recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = format!(
        "request = false\ntemp_dir = \"{}\"\n[admin]\naddress = \"127.0.0.1:0\"",
        dir.path().display()
    );
    let proxy = proxy(backend.addr, Some(&keys), "");
    const SIZE: usize = 3 << 20;
    let mut slow = slow_reader(proxy.addr).await;
    slow.get_mut()
        .write_all(format!("GET /big/{SIZE} HTTP/1.1\r\nHost: app\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        let read = read_all(&mut slow, Some(1 << 20)).await;
        (read, Instant::now())
    });
    // The backend writes its last byte long before the client has read it (3 s at 1 MiB/s).
    let finished = poll(500, Duration::from_millis(10), async || {
        *backend.finished.lock().unwrap()
    })
    .await
    .expect("the backend never finished writing");
    // The backend's last byte may still be on its way through the sockets: the release is
    // when pinlb has read it, which its in-flight gauge shows.
    let labels = format!("upstream=\"app\",backend=\"{}\"", backend.addr);
    let released = poll(200, Duration::from_millis(5), async || {
        let m = proxy.metrics().await;
        (m.value("pinlb_backend_in_flight", &labels) == 0.0).then(Instant::now)
    })
    .await
    .expect("the backend's in-flight count never went back to 0");
    let freed = released - finished;
    assert!(
        freed < Duration::from_secs(1),
        "freed {freed:?} after the last byte"
    );
    assert!(!reader.is_finished(), "the client is still reading");
    // Its connection is back in the pool: the next request goes on it.
    let mut next = BufReader::new(TcpStream::connect(proxy.addr).await.unwrap());
    next.get_mut()
        .write_all(b"GET /small HTTP/1.1\r\nHost: app\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = read_all(&mut next, None).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let seen = backend.wait_for(2).await;
    assert_eq!(
        seen[1].conn, 1,
        "the second request reused the first's connection"
    );
    let ((head, body), read_at) = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .unwrap()
        .unwrap();
    assert!(read_at > finished + Duration::from_secs(1));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body == pattern(SIZE), "the body arrived intact");
    assert_eq!(backend.accepts.load(Ordering::SeqCst), 1);
}

/// Larger than what loopback's socket buffers can take at their largest (`tcp_rmem`'s 32 MiB
/// and `tcp_wmem`'s 4 MiB on each side), so that a streamed body stops.
const STREAMED: usize = 64 << 20;

/// A response that must stream: the backend's writes stop where the kernel's buffers fill while
/// the client reads nothing, and the rest comes as it reads.
async fn streams(backend: &Recorder, proxy: &Proxy, path: &str, size: usize) -> String {
    let mut client = slow_reader(proxy.addr).await;
    let get = format!("GET {path} HTTP/1.1\r\nHost: app\r\n\r\n");
    client.get_mut().write_all(get.as_bytes()).await.unwrap();
    let stopped = settle(&backend.written).await;
    assert!(
        (stopped as usize) < size,
        "{path}: the backend wrote all {size} bytes while the client read none: buffered"
    );
    let (head, body) = read_all(&mut client, None).await;
    assert!(body == pattern(size), "{path}: the body arrived intact");
    backend.written.store(0, Ordering::SeqCst);
    head
}

#[tokio::test]
async fn x_accel_buffering_no_and_event_streams_are_streamed_and_the_header_is_removed() {
    let backend = Recorder::start().await;
    let proxy = proxy(backend.addr, Some("max_temp = \"128MiB\""), "");
    const SIZE: usize = STREAMED;
    let head = streams(&backend, &proxy, &format!("/big/{SIZE}/no"), SIZE).await;
    assert_eq!(header(&head, "x-accel-buffering"), None, "{head}");
    let head = streams(&backend, &proxy, &format!("/big/{SIZE}/sse"), SIZE).await;
    assert_eq!(header(&head, "content-type"), Some("text/event-stream"));
}

#[tokio::test]
async fn without_the_table_both_bodies_stream_as_before() {
    let backend = Recorder::start().await;
    let proxy = proxy(backend.addr, None, "");
    let body = pattern(20 * 1024);
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let done = paced(&mut conn, &body, 100 * 1024, |_| {}).await;
    let (reply_head, _) = read_all(&mut BufReader::new(conn), None).await;
    assert!(reply_head.starts_with("HTTP/1.1 200"), "{reply_head}");
    let s = &backend.wait_for(1).await[0];
    assert!(
        s.first < done,
        "the body streamed: the backend had the head before its end"
    );
    assert_eq!(s.body, body);
    streams(&backend, &proxy, &format!("/big/{STREAMED}"), STREAMED).await;
}

#[test]
fn check_refuses_a_temp_dir_that_takes_no_file_and_response_buffering_on_http2() {
    let backend: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut setup = Setup::with(&[backend]);
    setup.extra = "[upstream.app.buffering]\ntemp_dir = \"/nonexistent/pinlb\"\n".into();
    let e = pinlb::Config::parse("test.toml", &setup.toml(), &allowed())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test.toml:") && e.contains("upstream.app.buffering.temp_dir: cannot make a temporary file in /nonexistent/pinlb"),
        "{e}"
    );
    setup.extra = "[upstream.app.buffering]\ntemp_dir = \"tmp\"\n".into();
    let e = pinlb::Config::parse("test.toml", &setup.toml(), &allowed())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("upstream.app.buffering.temp_dir: \"tmp\" is relative"),
        "{e}"
    );
    setup.extra = "[upstream.app.buffering]\nresponse = true\n".into();
    setup.upstream_keys = "protocol = \"h2c\"\n".into();
    let e = pinlb::Config::parse("test.toml", &setup.toml(), &allowed())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("upstream.app.buffering.response: not with an HTTP/2 upstream"),
        "{e}"
    );
    setup.extra = "[upstream.app.buffering]\nmemory = \"lots\"\n".into();
    setup.upstream_keys.clear();
    let e = pinlb::Config::parse("test.toml", &setup.toml(), &allowed())
        .unwrap_err()
        .to_string();
    assert!(e.contains("test.toml:") && e.contains("memory"), "{e}");
}

#[tokio::test]
async fn a_client_that_leaves_mid_response_takes_the_temp_file_with_it() {
    let backend = Recorder::start().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = format!(
        "memory = \"16KiB\"\ntemp_dir = \"{}\"",
        dir.path().display()
    );
    let proxy = proxy(backend.addr, Some(&keys), "");
    const SIZE: usize = 4 << 20;
    let mut client = slow_reader(proxy.addr).await;
    let get = format!("GET /big/{SIZE} HTTP/1.1\r\nHost: app\r\n\r\n");
    client.get_mut().write_all(get.as_bytes()).await.unwrap();
    let mut status = String::new();
    client.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // The client reads nothing more: past 16 KiB the body waits in a temporary file.
    let spilled = poll(500, Duration::from_millis(10), async || {
        (temp_files_in(dir.path()) == 1).then_some(())
    })
    .await;
    assert!(
        spilled.is_some(),
        "no temporary file in {}",
        dir.path().display()
    );
    drop(client);
    let gone = poll(500, Duration::from_millis(10), async || {
        (temp_files_in(dir.path()) == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the temporary file outlived its client");
    // The proxy goes on serving.
    let mut next = BufReader::new(TcpStream::connect(proxy.addr).await.unwrap());
    next.get_mut()
        .write_all(b"GET /small HTTP/1.1\r\nHost: app\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = read_all(&mut next, None).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, b"ok");
}
