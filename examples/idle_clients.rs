//! Holds N idle keep-alive client connections open, for `benches/idle.sh`.
//!
//! ```text
//! idle_clients ADDR N [FROM_IP]
//! ```
//!
//! Opens N connections to ADDR (from FROM_IP, default 127.0.0.1), 256 at a time so that the
//! server's accept backlog never overflows, and sends one `GET /` on each; a connection counts
//! once its response has been read whole, which makes it a real keep-alive connection at rest
//! between requests. Then it prints `ready OPEN FAILED` on stdout and holds every connection,
//! sending nothing, until SIGTERM or SIGINT. Needs `ulimit -n` above N.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::signal::unix::{SignalKind, signal};

/// Connections being opened at once.
const BATCH: usize = 256;
/// Budget for one connection's connect, request and response.
const LIMIT: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (addr, count, from) = match parse(&args) {
        Some(a) => a,
        None => {
            eprintln!("usage: idle_clients ADDR N [FROM_IP]");
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
                Ok(Ok(Ok(stream))) => open.push(stream),
                Ok(Ok(Err(e))) => {
                    failed += 1;
                    first_error.get_or_insert(e.to_string());
                }
                Ok(Err(_)) => {
                    failed += 1;
                    first_error.get_or_insert(format!("no response within {LIMIT:?}"));
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!("idle_clients: {failed} connections failed; the first: {e}");
    }
    println!("ready {} {failed}", open.len());
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    drop(open);
}

/// One connection that has done one request and read its response whole.
async fn one(addr: SocketAddr, from: IpAddr) -> std::io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(from, 0))?;
    let mut s = sock.connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n").await?;
    read_response(&mut s).await?;
    Ok(s)
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
