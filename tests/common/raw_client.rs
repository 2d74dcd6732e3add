//! The shared raw client: HTTP over a plain socket, for byte-level control of what is sent
//! and seen (malformed requests, pipelining, half-closes, exact response heads).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
    ReadBuf,
};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::WAIT;

/// A response as it came off the wire.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The status line and header lines, as received.
    pub head: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.header(name).is_some()
    }
}

/// One client connection driven byte by byte: what the test sends goes out exactly as given,
/// and what comes back is read through a buffer, so [`read_head`] and [`read_response`] can parse
/// it. It is also a tokio stream (`AsyncRead`, `AsyncBufRead`, `AsyncWrite`), for tests that look
/// at the bytes themselves.
pub struct RawConn {
    inner: BufReader<TcpStream>,
}

impl RawConn {
    /// Connects (bounded by [`WAIT`]).
    pub async fn open(addr: SocketAddr) -> RawConn {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        RawConn {
            inner: BufReader::new(stream),
        }
    }

    /// Writes `bytes` as they are.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.inner.get_mut().write_all(bytes).await.unwrap();
    }

    /// Sends `bytes` as they are and reads one response (`no_body` for HEAD).
    pub async fn exchange(&mut self, bytes: &[u8], no_body: bool) -> RawResponse {
        self.send(bytes).await;
        read_response(self, no_body).await
    }

    /// Closes the sending side (FIN); responses can still be read.
    pub async fn half_close(&mut self) {
        self.inner.get_mut().shutdown().await.unwrap();
    }

    /// Reads until `done` accepts all that was read so far, or the peer closes (or resets), and
    /// returns all that was read. Unbounded: the caller wraps it in a timeout.
    pub async fn read_until(&mut self, mut done: impl FnMut(&[u8]) -> bool) -> Vec<u8> {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !done(&seen) {
            match self.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        seen
    }

    /// Waits (bounded by [`WAIT`]) until the peer closes the connection (or resets it), reading
    /// and discarding anything it sends first; returns how long that took.
    pub async fn wait_closed(&mut self) -> Duration {
        let start = Instant::now();
        tokio::time::timeout(WAIT, self.read_until(|_| false))
            .await
            .expect("the connection was never closed");
        start.elapsed()
    }

    /// Splits the connection into a buffered read half and the write half, for a writer in a
    /// task of its own. Only before anything was read, so no buffered byte is lost.
    pub fn into_split(self) -> (BufReader<OwnedReadHalf>, OwnedWriteHalf) {
        assert!(self.inner.buffer().is_empty(), "split after a read");
        let (read, write) = self.inner.into_inner().into_split();
        (BufReader::new(read), write)
    }
}

impl AsyncRead for RawConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncBufRead for RawConn {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        Pin::new(&mut self.get_mut().inner).poll_fill_buf(cx)
    }

    fn consume(mut self: Pin<&mut Self>, amt: usize) {
        Pin::new(&mut self.inner).consume(amt)
    }
}

impl AsyncWrite for RawConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Sends `bytes` as they are on a new connection and reads one response (`no_body` for HEAD).
pub async fn raw_request(addr: SocketAddr, bytes: &[u8], no_body: bool) -> RawResponse {
    RawConn::open(addr).await.exchange(bytes, no_body).await
}

/// Sends `bytes` as they are on a new connection and reads until `want` responses have arrived
/// (counted by their status lines) or the server closes; returns all it read, as text.
pub async fn raw_request_text(addr: SocketAddr, bytes: &[u8], want: usize) -> String {
    let mut conn = RawConn::open(addr).await;
    conn.send(bytes).await;
    let seen = tokio::time::timeout(
        WAIT,
        conn.read_until(|seen| seen.windows(9).filter(|w| w == b"HTTP/1.1 ").count() >= want),
    )
    .await
    .expect("responses within WAIT");
    String::from_utf8(seen).expect("text")
}

/// [`raw_request_text`] for tests without a runtime, reading until the server closes: the
/// request should ask it to (`Connection: close`). Each read is bounded by [`WAIT`].
pub fn raw_request_blocking(addr: SocketAddr, bytes: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    conn.set_read_timeout(Some(WAIT)).unwrap();
    conn.write_all(bytes).unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).expect("response");
    resp
}

/// Reads a status line and headers.
pub async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> RawResponse {
    let mut head = String::new();
    let mut headers = Vec::new();
    let mut status_line = true;
    loop {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, r.read_line(&mut line))
            .await
            .expect("response head within the wait limit")
            .expect("read response head");
        assert!(
            n > 0,
            "connection closed inside a response head; got so far: {head:?}"
        );
        head.push_str(&line);
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        if std::mem::take(&mut status_line) {
            continue;
        }
        let (k, v) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("bad header line {line:?}"));
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    RawResponse {
        status,
        head,
        headers,
        body: Vec::new(),
    }
}

/// Reads one whole response; `no_body` for responses to HEAD.
pub async fn read_response<R: AsyncBufRead + Unpin>(r: &mut R, no_body: bool) -> RawResponse {
    let mut resp = read_head(r).await;
    if no_body || resp.status == 204 || resp.status == 304 || resp.status < 200 {
        return resp;
    }
    if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).await.expect("chunk size");
            let size = usize::from_str_radix(size.trim().split(';').next().unwrap(), 16)
                .expect("hex chunk size");
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).await.expect("chunk");
            if size == 0 {
                break;
            }
            resp.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = resp.header("content-length") {
        let mut body = vec![0; len.parse().expect("content-length")];
        tokio::time::timeout(WAIT, r.read_exact(&mut body))
            .await
            .expect("body in time")
            .expect("body");
        resp.body = body;
    } else {
        tokio::time::timeout(WAIT, r.read_to_end(&mut resp.body))
            .await
            .expect("body in time")
            .expect("body");
    }
    resp
}
