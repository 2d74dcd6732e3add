//! Holds N idle connections open: keep-alive client connections for `benches/idle.sh`, or with
//! `--ws` WebSocket tunnels for `benches/websocket.sh`.
//!
//! ```text
//! idle_clients [--ws] ADDR N [FROM_IP]
//! ```
//!
//! Opens N connections to ADDR (from FROM_IP, default 127.0.0.1), 256 at a time so that the
//! server's accept backlog never overflows, and puts each at rest:
//!
//! - by default it sends one `GET /` on each; a connection counts once its response has been read
//!   whole, which makes it a real keep-alive connection at rest between requests;
//! - with `--ws` it upgrades each to a WebSocket on `/ws`, sends one 64-byte binary message and
//!   reads its echo, which makes it a real tunnel at rest (a proxy has set up both sides and
//!   relayed both ways). The protocol is tokio-tungstenite's: this client's own cost is not what
//!   is measured.
//!
//! Then it prints `ready OPEN FAILED` on stdout and holds every connection, sending nothing,
//! until SIGTERM or SIGINT. Needs `ulimit -n` above N.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// Connections being opened at once.
const BATCH: usize = 256;
/// Budget for one connection's connect and first exchange (request and response, or handshake
/// and echo).
const LIMIT: Duration = Duration::from_secs(10);

/// What each connection is put at rest as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A keep-alive connection after one request.
    KeepAlive,
    /// `--ws`: a WebSocket tunnel after one message each way.
    Tunnel,
}

impl Kind {
    /// What the messages call one.
    fn noun(self) -> &'static str {
        match self {
            Kind::KeepAlive => "connections",
            Kind::Tunnel => "tunnels",
        }
    }

    /// What did not arrive when [`LIMIT`] ran out.
    fn awaited(self) -> &'static str {
        match self {
            Kind::KeepAlive => "response",
            Kind::Tunnel => "echo",
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((kind, addr, count, from)) = parse(&args) else {
        eprintln!("usage: idle_clients [--ws] ADDR N [FROM_IP]");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match kind {
        Kind::KeepAlive => rt.block_on(run(kind, count, move || keep_alive(addr, from))),
        Kind::Tunnel => rt.block_on(run(kind, count, move || tunnel(addr, from))),
    }
}

fn parse(args: &[String]) -> Option<(Kind, SocketAddr, usize, IpAddr)> {
    let (kind, args) = match args.split_first() {
        Some((flag, rest)) if flag == "--ws" => (Kind::Tunnel, rest),
        _ => (Kind::KeepAlive, args),
    };
    let addr = args.first()?.parse().ok()?;
    let count = args.get(1)?.parse().ok()?;
    let from = match args.get(2) {
        Some(ip) => ip.parse().ok()?,
        None => IpAddr::from([127, 0, 0, 1]),
    };
    Some((kind, addr, count, from))
}

/// Opens `count` connections with `open`, holds those it could until SIGTERM or SIGINT.
async fn run<C, F>(kind: Kind, count: usize, open: impl Fn() -> F)
where
    C: Send + 'static,
    F: Future<Output = Result<C, String>> + Send + 'static,
{
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut held = Vec::with_capacity(count);
    let mut failed = 0usize;
    let mut first_error = None;
    let mut left = count;
    while left > 0 {
        let n = left.min(BATCH);
        left -= n;
        let batch: Vec<_> = (0..n)
            .map(|_| tokio::spawn(tokio::time::timeout(LIMIT, open())))
            .collect();
        for task in batch {
            match task.await {
                Ok(Ok(Ok(conn))) => held.push(conn),
                Ok(Ok(Err(e))) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
                Ok(Err(_)) => {
                    failed += 1;
                    first_error.get_or_insert(format!("no {} within {LIMIT:?}", kind.awaited()));
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!(
            "idle_clients: {failed} {} failed; the first: {e}",
            kind.noun()
        );
    }
    println!("ready {} {failed}", held.len());
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(held);
}

/// A connection from `from` to `addr`, Nagle off.
async fn connect(addr: SocketAddr, from: IpAddr) -> Result<TcpStream, String> {
    let sock = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    sock.bind(SocketAddr::new(from, 0))
        .map_err(|e| e.to_string())?;
    let s = sock.connect(addr).await.map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(s)
}

/// A connection that has done one request and read its response whole.
async fn keep_alive(addr: SocketAddr, from: IpAddr) -> Result<TcpStream, String> {
    let mut s = connect(addr, from).await?;
    let exchange = async {
        s.write_all(b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n").await?;
        read_response(&mut s).await
    };
    exchange.await.map_err(|e| e.to_string())?;
    Ok(s)
}

/// A tunnel that has carried one message each way.
async fn tunnel(addr: SocketAddr, from: IpAddr) -> Result<WebSocketStream<TcpStream>, String> {
    let s = connect(addr, from).await?;
    let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), s)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let message = Message::binary(vec![b'x'; 64]);
    ws.send(message.clone()).await.map_err(|e| e.to_string())?;
    match ws.next().await {
        Some(Ok(echo)) if echo == message => Ok(ws),
        other => Err(format!("no echo: {other:?}")),
    }
}

/// Reads one response with a Content-Length body (what every server in the bench sends).
async fn read_response(s: &mut TcpStream) -> std::io::Result<()> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    // A response of more than 64 KiB is not the one this tool expects.
    while buf.len() < 64 * 1024 {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("closed before a whole response"));
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        if !head.starts_with("http/1.1 200") {
            return Err(bad(&format!("not a 200: {head:?}")));
        }
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| bad("no content-length"))?;
        if buf.len() >= end + 4 + len {
            return Ok(());
        }
    }
    Err(bad("response too long"))
}
