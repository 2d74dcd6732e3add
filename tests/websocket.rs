//! WebSocket and Upgrade through pinlb: a real WebSocket server (tokio-tungstenite) behind the
//! proxy and real WebSocket clients in front of it, on loopback.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use http::{Method, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Messages up to 16 MiB, with room for the frame around them.
fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(32 << 20))
        .max_frame_size(Some(32 << 20))
}

/// A WebSocket echo server: every text and binary message comes back as it was, pings are
/// answered (by tungstenite), a close is answered, and the text `close-me` makes the server
/// start the close handshake itself.
struct WsBackend {
    addr: SocketAddr,
    /// Connections open now.
    open: Arc<AtomicUsize>,
    /// Close handshakes completed: the server saw a Close and then its stream end.
    closed_clean: Arc<AtomicUsize>,
    /// The upgrade request heads, as `name: value` lines.
    heads: Arc<Mutex<Vec<String>>>,
    /// Set to drop every connection at once, as a backend that dies.
    kill: watch::Sender<bool>,
}

impl WsBackend {
    async fn start(id: &'static str) -> WsBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let closed_clean = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (kill, killed) = watch::channel(false);
        let backend = WsBackend {
            addr,
            open: open.clone(),
            closed_clean: closed_clean.clone(),
            heads: heads.clone(),
            kill,
        };
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (open, closed_clean, heads) =
                    (open.clone(), closed_clean.clone(), heads.clone());
                let mut killed = killed.clone();
                tokio::spawn(async move {
                    // tungstenite's callback type returns its large error response.
                    #[allow(clippy::result_large_err)]
                    let record = |req: &Request, mut resp: Response| {
                        let head = req
                            .headers()
                            .iter()
                            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("?")))
                            .collect::<Vec<_>>()
                            .join("\n");
                        heads.lock().unwrap().push(head);
                        resp.headers_mut().insert("x-backend", id.parse().unwrap());
                        Ok(resp)
                    };
                    let Ok(mut ws) =
                        tokio_tungstenite::accept_hdr_async_with_config(s, record, Some(config()))
                            .await
                    else {
                        return;
                    };
                    open.fetch_add(1, Ordering::SeqCst);
                    let mut saw_close = false;
                    // Bounded by the client: every pass handles one message, or ends.
                    loop {
                        let msg = tokio::select! {
                            _ = killed.wait_for(|k| *k) => break,
                            msg = ws.next() => msg,
                        };
                        match msg {
                            Some(Ok(Message::Text(t))) if t.as_str() == "close-me" => {
                                let _ = ws
                                    .close(Some(
                                        tokio_tungstenite::tungstenite::protocol::CloseFrame {
                                            code: CloseCode::Normal,
                                            reason: "asked".into(),
                                        },
                                    ))
                                    .await;
                            }
                            Some(Ok(m @ (Message::Text(_) | Message::Binary(_)))) => {
                                if ws.send(m).await.is_err() {
                                    break;
                                }
                            }
                            Some(Ok(Message::Close(_))) => saw_close = true,
                            Some(Ok(_)) => {}
                            None => {
                                if saw_close {
                                    closed_clean.fetch_add(1, Ordering::SeqCst);
                                }
                                break;
                            }
                            Some(Err(_)) => break,
                        }
                    }
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        backend
    }
}

/// A WebSocket client through the proxy, and the backend that answered (`x-backend`).
async fn connect(addr: SocketAddr) -> (Client, String) {
    let (ws, resp) = tokio::time::timeout(
        WAIT,
        tokio_tungstenite::connect_async_with_config(
            format!("ws://{addr}/echo"),
            Some(config()),
            false,
        ),
    )
    .await
    .expect("handshake in time")
    .expect("handshake");
    let backend = resp
        .headers()
        .get("x-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_string();
    (ws, backend)
}

/// The next data or pong message, within [`WAIT`].
async fn next(ws: &mut Client) -> Message {
    tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("a message in time")
        .expect("the tunnel is open")
        .expect("a valid message")
}

async fn echo(ws: &mut Client, m: Message) {
    ws.send(m.clone()).await.expect("send");
    assert_eq!(next(ws).await, m);
}

/// Waits (bounded) for the tunnel to end, as the client sees it: the stream ends or fails.
async fn ended(ws: &mut Client) -> Option<WsError> {
    // Bounded: each pass takes one message, within WAIT in all.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => panic!("the tunnel did not end within {WAIT:?}"),
            Ok(None) => return None,
            Ok(Some(Err(e))) => return Some(e),
            Ok(Some(Ok(_))) => {}
        }
    }
}

fn with_admin(backends: &[SocketAddr]) -> Setup {
    let mut setup = Setup::with(backends);
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\n".into();
    setup
}

fn labels(backend: SocketAddr) -> String {
    format!("upstream=\"app\",backend=\"{backend}\"")
}

/// Polls `/metrics` until `name{backend}` is `want`.
async fn metric_reaches(proxy: &Proxy, name: &str, backend: SocketAddr, want: f64) {
    let got = poll(100, Duration::from_millis(50), async || {
        let v = proxy.metrics().await.get(name, &labels(backend));
        (v == Some(want)).then_some(())
    })
    .await;
    assert!(
        got.is_some(),
        "{name} never reached {want}:\n{}",
        proxy.metrics().await.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_binary_frames_up_to_16_mib_and_pings_go_through_the_tunnel() {
    let a = WsBackend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let (mut ws, backend) = connect(proxy.addr).await;
    assert_eq!(backend, "a");

    echo(&mut ws, Message::text("hello")).await;
    echo(&mut ws, Message::binary(vec![0u8, 1, 2, 255])).await;
    for size in [16 * 1024, 1 << 20, 16 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        echo(&mut ws, Message::binary(data)).await;
    }
    let text = "é".repeat(4 << 20);
    echo(&mut ws, Message::text(text)).await;

    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(
        next(&mut ws).await,
        Message::Pong(b"are you there".to_vec().into())
    );

    // The backend saw the upgrade asked for, through pinlb.
    let head = a.heads.lock().unwrap()[0].to_lowercase();
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(head.contains("connection: upgrade"), "{head}");
    assert!(head.contains("sec-websocket-key: "), "{head}");
    assert!(head.contains("x-forwarded-for: 127.0.0.1"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_close_handshake_goes_through_from_either_side() {
    let a = WsBackend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));

    // The client closes.
    let (mut ws, _) = connect(proxy.addr).await;
    echo(&mut ws, Message::text("one")).await;
    ws.close(None).await.unwrap();
    assert!(matches!(next(&mut ws).await, Message::Close(_)));
    assert!(
        ended(&mut ws).await.is_none(),
        "a clean end after the close"
    );
    let done = poll(100, Duration::from_millis(20), async || {
        (a.closed_clean.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert!(done.is_some(), "the backend completed the close handshake");

    // The backend closes.
    let (mut ws, _) = connect(proxy.addr).await;
    ws.send(Message::text("close-me")).await.unwrap();
    match next(&mut ws).await {
        Message::Close(Some(f)) => {
            assert_eq!(f.code, CloseCode::Normal);
            assert_eq!(f.reason.as_str(), "asked");
        }
        other => panic!("expected the backend's close, got {other:?}"),
    }
    // tungstenite answers the close; the backend then ends the connection, and pinlb passes
    // the end on.
    assert!(
        ended(&mut ws).await.is_none(),
        "a clean end after the close"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tunnels_stay_open_at_once_on_one_worker() {
    const N: usize = 1000;
    let a = WsBackend::start("a").await;
    let setup = with_admin(&[a.addr]);
    assert_eq!(setup.cpus.len(), 1);
    let proxy = Proxy::start(&setup);
    let mut open = Vec::with_capacity(N);
    // In waves, so that no listen backlog overflows.
    for _ in 0..N / 100 {
        let mut wave = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let addr = proxy.addr;
            wave.spawn(async move {
                let (mut ws, _) = connect(addr).await;
                echo(&mut ws, Message::text("hi")).await;
                ws
            });
        }
        while let Some(ws) = wave.join_next().await {
            open.push(ws.unwrap());
        }
    }
    assert_eq!(a.open.load(Ordering::SeqCst), N);
    let m = proxy.metrics().await;
    assert_eq!(
        m.value("pinlb_backend_tunnels_open", &labels(a.addr)),
        N as f64
    );
    assert_eq!(
        m.value("pinlb_backend_in_flight", &labels(a.addr)),
        N as f64
    );

    // Every one still carries data, all at once.
    let mut all = tokio::task::JoinSet::new();
    for (i, mut ws) in open.into_iter().enumerate() {
        all.spawn(async move {
            echo(&mut ws, Message::text(format!("again {i}"))).await;
            ws.close(None).await.unwrap();
            assert!(ended(&mut ws).await.is_none());
        });
    }
    while let Some(r) = all.join_next().await {
        r.unwrap();
    }
    metric_reaches(&proxy, "pinlb_backend_tunnels_open", a.addr, 0.0).await;
    metric_reaches(&proxy, "pinlb_backend_in_flight", a.addr, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_with_no_bytes_either_way_for_tunnel_idle_is_closed() {
    let a = WsBackend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.tunnel_idle = Some("1s");
    let proxy = Proxy::start(&setup);
    let (mut ws, _) = connect(proxy.addr).await;
    // Traffic every 400 ms keeps it open well past the timeout.
    let start = Instant::now();
    for i in 0..5 {
        echo(&mut ws, Message::text(format!("{i}"))).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(start.elapsed() >= Duration::from_secs(2));
    let quiet = Instant::now();
    ended(&mut ws).await;
    let after = quiet.elapsed();
    assert!(
        after >= Duration::from_millis(500) && after < Duration::from_secs(3),
        "closed {after:?} after the last message; tunnel_idle is 1s"
    );
    let gone = poll(100, Duration::from_millis(20), async || {
        (a.open.load(Ordering::SeqCst) == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the backend side was closed too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_dies_mid_tunnel_ends_the_tunnel_and_its_count() {
    let a = WsBackend::start("a").await;
    let proxy = Proxy::start(&with_admin(&[a.addr]));
    let (mut ws, _) = connect(proxy.addr).await;
    echo(&mut ws, Message::text("before")).await;
    metric_reaches(&proxy, "pinlb_backend_tunnels_open", a.addr, 1.0).await;

    a.kill.send_replace(true);
    let e = ended(&mut ws).await;
    assert!(
        !matches!(e, Some(WsError::ConnectionClosed)),
        "the client sees the tunnel end without a close handshake: {e:?}"
    );
    drop(ws);
    metric_reaches(&proxy, "pinlb_backend_tunnels_open", a.addr, 0.0).await;
    metric_reaches(&proxy, "pinlb_backend_in_flight", a.addr, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_leaves_open_tunnels_until_shutdown_timeout_then_closes_them() {
    let a = WsBackend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.shutdown_timeout = "1s";
    let proxy = Proxy::start(&setup);
    let (mut ws, _) = connect(proxy.addr).await;
    echo(&mut ws, Message::text("before")).await;

    let stopped = Instant::now();
    let joined = tokio::spawn(proxy.join(WAIT));
    // Draining: the tunnel still works.
    echo(&mut ws, Message::text("during the drain")).await;
    ended(&mut ws).await;
    let after = stopped.elapsed();
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(5),
        "closed {after:?} after the stop; shutdown_timeout is 1s"
    );
    joined.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_conn_steers_new_tunnels_away_from_a_backend_that_holds_many() {
    let a = WsBackend::start("a").await;
    let b = WsBackend::start("b").await;
    let mut setup = with_admin(&[a.addr, b.addr]);
    setup.algorithm = "least_conn";
    let proxy = Proxy::start(&setup);
    let admin = async |what: &str, backend: SocketAddr| {
        let r = proxy
            .admin(Method::POST, &format!("/backends/{backend}/{what}"), None)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    };

    // `a` takes six tunnels while `b` is drained.
    admin("drain", b.addr).await;
    let mut on_a = Vec::new();
    for _ in 0..6 {
        let (ws, backend) = connect(proxy.addr).await;
        assert_eq!(backend, "a");
        on_a.push(ws);
    }
    admin("enable", b.addr).await;
    let s = proxy.status().await;
    assert_eq!(s["upstreams"][0]["backends"][0]["in_flight"], 6);

    // The next six go to `b`, which holds fewer.
    let mut on_b = Vec::new();
    for _ in 0..6 {
        let (ws, backend) = connect(proxy.addr).await;
        assert_eq!(backend, "b", "least_conn counts a's open tunnels");
        on_b.push(ws);
    }

    // Draining or disabling a backend leaves its tunnels alone.
    admin("drain", a.addr).await;
    admin("disable", a.addr).await;
    for ws in on_a.iter_mut() {
        echo(ws, Message::text("still here")).await;
    }
    let (_, backend) = connect(proxy.addr).await;
    assert_eq!(backend, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_logs_one_line_when_it_closes_and_counts_its_bytes() {
    let a = WsBackend::start("a").await;
    let log = temp_config("");
    let mut setup = with_admin(&[a.addr]);
    setup.extra += &format!("[log]\naccess = \"{}\"\nformat = \"json\"\n", log.display());
    let proxy = Proxy::start(&setup);
    let (mut ws, _) = connect(proxy.addr).await;
    echo(&mut ws, Message::binary(vec![7u8; 1000])).await;
    metric_reaches(&proxy, "pinlb_backend_tunnels_open", a.addr, 1.0).await;
    let m = proxy.metrics().await;
    let to = |d: &str| {
        m.value(
            "pinlb_backend_tunnel_bytes_total",
            &format!("{},direction=\"{d}\"", labels(a.addr)),
        )
    };
    // 1000 bytes each way, with the frames' own bytes (the client's are masked: 4 more).
    assert!(to("to_backend") >= 1000.0, "{}", m.0);
    assert!(to("to_client") >= 1000.0, "{}", m.0);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "",
        "no line while open"
    );

    ws.close(None).await.unwrap();
    ended(&mut ws).await;
    // The backend closed after the handshake; the tunnel ends once the client closes too.
    drop(ws);
    let line = poll(100, Duration::from_millis(50), async || {
        let text = std::fs::read_to_string(&log).unwrap();
        (!text.is_empty()).then_some(text)
    })
    .await
    .expect("a line once the tunnel closed");
    let lines: Vec<&str> = line.lines().collect();
    assert_eq!(lines.len(), 1, "{line}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["status"], 101, "{line}");
    assert_eq!(v["path"], "/echo", "{line}");
    assert_eq!(v["backend"], a.addr.to_string(), "{line}");
    assert!(v["bytes"].as_u64().unwrap() >= 1000, "{line}");
    assert!(v["bytes_received"].as_u64().unwrap() >= 1000, "{line}");
    assert!(v["total_time"].as_f64().unwrap() > 0.0, "{line}");
    metric_reaches(&proxy, "pinlb_backend_tunnels_open", a.addr, 0.0).await;
    let _ = std::fs::remove_file(&log);
}

const SWITCH: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
const ASK: &[u8] =
    b"GET /ws HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_the_client_did_not_ask_for_is_a_502() {
    let backend = raw_backend(vec![SWITCH.to_vec()]).await;
    let proxy = Proxy::start(&Setup::with(&[backend]));
    let r = raw_request(proxy.addr, b"GET / HTTP/1.1\r\nHost: app\r\n\r\n", false).await;
    assert_eq!(r.status, 502, "{r:?}");
    // Asked for, but a 101 that does not say what it switches to.
    let backend = raw_backend(vec![
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n\r\n".to_vec(),
    ])
    .await;
    let proxy = Proxy::start(&Setup::with(&[backend]));
    let r = raw_request(proxy.addr, ASK, false).await;
    assert_eq!(r.status, 502, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_upgrade_off_the_headers_are_stripped_and_a_101_is_a_502() {
    let backend = raw_backend(vec![SWITCH.to_vec()]).await;
    let mut setup = Setup::with(&[backend]);
    setup.upstream_keys = "upgrade = false".into();
    let proxy = Proxy::start(&setup);
    let r = raw_request(proxy.addr, ASK, false).await;
    assert_eq!(r.status, 502, "{r:?}");

    let a = Backend::start("a").await;
    let mut setup = Setup::with(&[a.addr]);
    setup.upstream_keys = "upgrade = false".into();
    let proxy = Proxy::start(&setup);
    let r = raw_request(proxy.addr, ASK, false).await;
    assert_eq!(r.status, 200, "{r:?}");
    let seen = a.requests().pop().unwrap();
    assert!(!seen.headers.contains_key("upgrade"), "{:?}", seen.headers);
    assert!(
        !seen.headers.contains_key("connection"),
        "{:?}",
        seen.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_h2c_is_never_forwarded() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start(&Setup::with(&[a.addr]));
    let r = raw_request(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: app\r\nConnection: Upgrade, HTTP2-Settings\r\n\
          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let seen = a.requests().pop().unwrap();
    for gone in ["upgrade", "connection", "http2-settings"] {
        assert!(
            !seen.headers.contains_key(gone),
            "{gone}: {:?}",
            seen.headers
        );
    }
}

/// A backend's read of the upgrade request: its head and whatever came with it.
async fn read_head(s: &mut TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    // Bounded by the head's size: it ends with an empty line.
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0 && got.len() < 64 * 1024);
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_sent_with_the_upgrade_request_and_the_101_are_relayed_first() {
    // A backend that answers the upgrade with its first bytes in the same write, then echoes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut s, _) = listener.accept().await.unwrap();
        let got = read_head(&mut s).await;
        let at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        let mut reply = SWITCH.to_vec();
        reply.extend_from_slice(b"server-first|");
        reply.extend_from_slice(&got[at..]);
        s.write_all(&reply).await.unwrap();
        // Echo what else comes, until the client's end, then end too.
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    });
    let proxy = Proxy::start(&Setup::with(&[backend]));
    let mut conn = RawConn::open(proxy.addr).await;
    let mut ask = ASK.to_vec();
    ask.extend_from_slice(b"client-first|");
    conn.send(&ask).await;
    let got = tokio::time::timeout(
        WAIT,
        conn.read_until(|b| b.ends_with(b"server-first|client-first|")),
    )
    .await
    .expect("the 101 and the first bytes in time");
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert!(
        text.starts_with("http/1.1 101 switching protocols\r\n"),
        "{text}"
    );
    assert!(text.contains("\r\nupgrade: websocket\r\n"), "{text}");
    assert!(text.contains("\r\nconnection: upgrade\r\n"), "{text}");
    assert!(!text.contains("content-length"), "{text}");
    conn.send(b"more").await;
    let got = tokio::time::timeout(WAIT, conn.read_until(|b| b.ends_with(b"more")))
        .await
        .expect("the echo in time");
    assert_eq!(got, b"more");
    // A half-close passes through: the backend's echo ends, and so does the tunnel.
    conn.half_close().await;
    conn.wait_closed().await;
}

/// A backend that switches protocols, then never closes its side: whatever the client sends it
/// reads, and after the client's end it still holds the connection until `release` fires.
/// Closing its sending half instead when `close_first`, while it keeps reading.
async fn holding_backend(close_first: bool) -> (SocketAddr, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (release, mut released) = watch::channel(false);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut s, _) = listener.accept().await.unwrap();
        read_head(&mut s).await;
        let mut buf = [0u8; 1024];
        s.write_all(SWITCH).await.unwrap();
        if close_first {
            s.shutdown().await.unwrap();
        }
        // Bounded by the client's bytes: reads until its end (or a reset), then holds.
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
        let _ = released.wait_for(|r| *r).await;
    });
    (addr, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_left_open_after_the_other_closed_is_closed_after_tunnel_fin() {
    for close_first in [false, true] {
        let (backend, release) = holding_backend(close_first).await;
        let mut setup = with_admin(&[backend]);
        setup.tunnel_fin = Some("300ms");
        let proxy = Proxy::start(&setup);
        let mut conn = RawConn::open(proxy.addr).await;
        conn.send(ASK).await;
        let head = tokio::time::timeout(
            WAIT,
            conn.read_until(|b| b.windows(4).any(|w| w == b"\r\n\r\n")),
        )
        .await
        .expect("the 101 in time");
        assert!(head.starts_with(b"HTTP/1.1 101"), "{head:?}");
        // The client closes its side and the backend holds its own (or the backend closed
        // first and the client holds): tunnel_idle is an hour, tunnel_fin ends it.
        let after = if close_first {
            conn.wait_closed().await
        } else {
            conn.half_close().await;
            conn.wait_closed().await
        };
        assert!(
            after < Duration::from_secs(3),
            "closed {after:?} after the half-close; tunnel_fin is 300ms"
        );
        metric_reaches(
            &proxy,
            "pinlb_backend_tunnel_fin_timeouts_total",
            backend,
            1.0,
        )
        .await;
        metric_reaches(&proxy, "pinlb_backend_tunnels_open", backend, 0.0).await;
        release.send_replace(true);
    }
}
