//! The shared raw client: HTTP over a plain socket, for byte-level control of what is sent
//! and seen (malformed requests, pipelining, half-closes, exact response heads).

use std::net::SocketAddr;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};
use tokio::net::TcpStream;

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

/// Reads a status line and headers.
/// Sends `bytes` as they are on a new connection and reads one response (`no_body` for HEAD).
pub async fn raw_request(addr: SocketAddr, bytes: &[u8], no_body: bool) -> RawResponse {
    let mut s = tokio::io::BufReader::new(TcpStream::connect(addr).await.unwrap());
    raw_exchange(&mut s, bytes, no_body).await
}

/// Sends `bytes` as they are on an open connection and reads one response (`no_body` for HEAD).
pub async fn raw_exchange(
    s: &mut tokio::io::BufReader<TcpStream>,
    bytes: &[u8],
    no_body: bool,
) -> RawResponse {
    tokio::io::AsyncWriteExt::write_all(s.get_mut(), bytes)
        .await
        .unwrap();
    read_response(s, no_body).await
}

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
