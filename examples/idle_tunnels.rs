//! Holds N idle WebSocket tunnels open, for `benches/websocket.sh`.
//!
//! ```text
//! idle_tunnels ADDR N [FROM_IP]
//! ```
//!
//! Opens N connections to ADDR (from FROM_IP, default 127.0.0.1), 256 at a time so that the
//! server's accept backlog never overflows; upgrades each to a WebSocket on `/ws`, sends one
//! 64-byte binary message and reads its echo, which makes it a real tunnel at rest (a proxy has
//! set up both sides and relayed both ways). Then it prints `ready OPEN FAILED` on stdout and
//! holds every tunnel, sending nothing, until SIGTERM or SIGINT. Needs `ulimit -n` above N.
//!
//! The protocol is tokio-tungstenite's: this client's own cost is not what is measured.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// Connections being opened at once.
const BATCH: usize = 256;
/// Budget for one tunnel's connect, handshake and echo.
const LIMIT: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, count, from) = match parse(&args) {
        Some(a) => a,
        None => {
            eprintln!("usage: idle_tunnels ADDR N [FROM_IP]");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(addr, count, from));
}

fn parse(args: &[String]) -> Option<(SocketAddr, usize, IpAddr)> {
    let addr = args.first()?.parse().ok()?;
    let count = args.get(1)?.parse().ok()?;
    let from = match args.get(2) {
        Some(ip) => ip.parse().ok()?,
        None => IpAddr::from([127, 0, 0, 1]),
    };
    Some((addr, count, from))
}

async fn run(addr: SocketAddr, count: usize, from: IpAddr) {
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut open = Vec::with_capacity(count);
    let mut failed = 0usize;
    let mut first_error = None;
    let mut left = count;
    while left > 0 {
        let n = left.min(BATCH);
        left -= n;
        let batch: Vec<_> = (0..n)
            .map(|_| tokio::spawn(tokio::time::timeout(LIMIT, one(addr, from))))
            .collect();
        for task in batch {
            match task.await {
                Ok(Ok(Ok(ws))) => open.push(ws),
                Ok(Ok(Err(e))) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
                Ok(Err(_)) => {
                    failed += 1;
                    first_error.get_or_insert(format!("no echo within {LIMIT:?}"));
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!("idle_tunnels: {failed} tunnels failed; the first: {e}");
    }
    println!("ready {} {failed}", open.len());
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(open);
}

/// One tunnel that has carried one message each way.
async fn one(addr: SocketAddr, from: IpAddr) -> Result<WebSocketStream<TcpStream>, String> {
    let sock = TcpSocket::new_v4().map_err(|e| e.to_string())?;
    sock.bind(SocketAddr::new(from, 0))
        .map_err(|e| e.to_string())?;
    let s = sock.connect(addr).await.map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
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
