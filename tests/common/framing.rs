//! The framing invariant, shared by `tests/prop.rs` and the `request` fuzz target
//! (`fuzz/fuzz_targets/request.rs` includes this file by path): whatever a client sends, every
//! request a backend receives from pinlb is one well-formed, canonical HTTP/1.1 request with
//! unambiguous framing, and what the client gets back is a sequence of well-formed responses,
//! then the end of the stream.
//!
//! [`next_request`] and [`check_responses`] are pure functions over bytes; [`FramingBackend`]
//! is a backend on `127.0.0.1:0` that applies [`next_request`] to everything it reads and keeps
//! a count of what passed and a list of what did not.

// The fuzz target uses only part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

/// A request as a backend read it, already checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// Bytes it took on the connection, head and body.
    pub len: usize,
    pub method: String,
    /// Its X-Forwarded-For value: the client's address, as pinlb saw it.
    pub client: Option<String>,
    pub body: Vec<u8>,
}

/// Most header lines a forwarded request may carry: pinlb's own limit in these harnesses is
/// lower, and pinlb adds two (X-Forwarded-For, X-Forwarded-Proto).
const MAX_HEADERS: usize = 128;

/// Reads the first request in `buf`, the bytes a backend received on one connection.
/// `Ok(None)`: not complete yet. `Err`: pinlb sent something that is not one canonical
/// HTTP/1.1 request; the message says what.
pub fn next_request(buf: &[u8]) -> Result<Option<Forwarded>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("unparsable head ({e}): {:?}", lossy(buf, 512))),
    };
    let head = &buf[..head_len];
    let show = || lossy(head, 512);
    // httparse accepts bare LF; pinlb must never send one.
    for (i, b) in head.iter().enumerate() {
        if *b == b'\n' && (i == 0 || head[i - 1] != b'\r') {
            return Err(format!("a line ending without CR: {}", show()));
        }
        if *b == b'\r' && head.get(i + 1) != Some(&b'\n') {
            return Err(format!("a bare CR: {}", show()));
        }
    }
    if req.version != Some(1) {
        return Err(format!("not HTTP/1.1: {}", show()));
    }
    let method = req.method.unwrap_or_default().to_string();
    let path = req.path.unwrap_or_default();
    if !(path.starts_with('/') || (path == "*" && method == "OPTIONS")) {
        return Err(format!("target not in origin form: {}", show()));
    }
    let mut host = 0;
    let mut content_length = Vec::new();
    let mut transfer_encoding = Vec::new();
    let mut client = None;
    let mut connection = Vec::new();
    let mut upgrade = Vec::new();
    for h in req.headers.iter() {
        // Bytes over 0x7f (obs-text) are allowed in values and passed on; NUL, CR and LF never.
        if h.value
            .iter()
            .any(|b| *b == 0 || *b == b'\r' || *b == b'\n')
        {
            return Err(format!("NUL, CR or LF in {}: {}", h.name, show()));
        }
        let value = String::from_utf8_lossy(h.value);
        match h.name.to_ascii_lowercase().as_str() {
            "host" if value.trim().is_empty() => return Err(format!("empty Host: {}", show())),
            "host" => host += 1,
            "content-length" => content_length.push(value.trim().to_string()),
            "transfer-encoding" => transfer_encoding.push(value.trim().to_string()),
            "x-forwarded-for" => client = Some(value.trim().to_string()),
            "connection" => connection.push(value.trim().to_string()),
            "upgrade" => upgrade.push(value.trim().to_string()),
            // Hop-by-hop: pinlb removes them.
            "te" | "trailer" | "keep-alive" | "proxy-connection" => {
                return Err(format!(
                    "hop-by-hop header {} passed on: {}",
                    h.name,
                    show()
                ));
            }
            _ => {}
        }
    }
    upgrade_rule(&connection, &upgrade).map_err(|e| format!("{e}: {}", show()))?;
    if host != 1 {
        return Err(format!("{host} Host headers: {}", show()));
    }
    let rest = &buf[head_len..];
    let body = match (content_length.as_slice(), transfer_encoding.as_slice()) {
        ([], []) => Some((0, Vec::new())),
        ([n], []) => {
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("Content-Length {n:?}: {}", show()));
            }
            let n: usize = n
                .parse()
                .map_err(|_| format!("Content-Length {n:?} overflows: {}", show()))?;
            (rest.len() >= n).then(|| (n, rest[..n].to_vec()))
        }
        ([], [te]) if te.eq_ignore_ascii_case("chunked") => chunked(rest)?,
        (cl, te) => {
            return Err(format!(
                "ambiguous framing: Content-Length {cl:?}, Transfer-Encoding {te:?}: {}",
                show()
            ));
        }
    };
    Ok(body.map(|(n, body)| Forwarded {
        len: head_len + n,
        method,
        client,
        body,
    }))
}

/// The one hop-by-hop pair pinlb passes on: a request that asks to upgrade goes with one
/// `connection: upgrade` and one Upgrade line naming the protocols the client asked for, any but
/// `h2c` (pinlb tunnels bytes after a `101` and needs to know nothing of the protocol, as
/// HAProxy; `docs/behaviour.md`, "WebSocket and Upgrade"). Any other Connection, or an Upgrade
/// without it, is a hop-by-hop header pinlb should have removed.
fn upgrade_rule(connection: &[String], upgrade: &[String]) -> Result<(), String> {
    match (connection, upgrade) {
        ([], []) => Ok(()),
        ([c], [u]) if c.eq_ignore_ascii_case("upgrade") => {
            let protocols = u.split(',').map(str::trim);
            let name = |p: &str| p.split('/').next().unwrap_or_default().to_string();
            match protocols
                .map(name)
                .find(|n| n.is_empty() || n.eq_ignore_ascii_case("h2c"))
            {
                Some(n) => Err(format!("Upgrade {u:?} names {n:?}")),
                None => Ok(()),
            }
        }
        _ => Err(format!(
            "hop-by-hop headers passed on: Connection {connection:?}, Upgrade {upgrade:?}"
        )),
    }
}

/// A chunked body, strictly: hex sizes without extensions, CRLF everywhere, no trailers (pinlb
/// drops them). `Ok(None)`: not complete yet.
fn chunked(buf: &[u8]) -> Result<Option<(usize, Vec<u8>)>, String> {
    let mut at = 0;
    let mut body = Vec::new();
    // Each round consumes at least three bytes, so this ends.
    loop {
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            if buf.len() - at > 20 {
                return Err(format!("chunk size line {:?}", lossy(&buf[at..], 40)));
            }
            return Ok(None);
        };
        let line = &buf[at..at + eol];
        if line.is_empty() || line.len() > 16 || !line.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!("chunk size line {:?}", lossy(line, 40)));
        }
        let size = line.iter().fold(0usize, |n, d| {
            n * 16 + (*d as char).to_digit(16).unwrap_or(0) as usize
        });
        at += eol + 2;
        if size == 0 {
            return match buf.get(at..at + 2) {
                None if buf.len() - at < 2 => Ok(None),
                Some(b"\r\n") => Ok(Some((at + 2, body))),
                _ => Err(format!(
                    "no CRLF after the last chunk: {:?}",
                    lossy(&buf[at..], 40)
                )),
            };
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(format!("chunk of {size} bytes not followed by CRLF"));
        }
        at += size + 2;
    }
}

/// Checks what a client received on one connection, up to the end of the stream: zero or more
/// whole, well-formed HTTP/1.1 responses (interim `1xx` ones included) and nothing else.
/// Returns how many final responses there were.
///
/// The checker does not know which requests were HEAD, so a response whose Content-Length
/// bytes are missing is taken as a bodiless answer to HEAD when the bytes that follow are the
/// next response or the end of the stream.
pub fn check_responses(mut buf: &[u8]) -> Result<usize, String> {
    let mut finals = 0;
    // Each round consumes a whole head, so this ends.
    while !buf.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let head_len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return Err(format!(
                    "the stream ended inside a response head: {:?}",
                    lossy(buf, 512)
                ));
            }
            Err(e) => return Err(format!("unparsable response ({e}): {:?}", lossy(buf, 512))),
        };
        let head = &buf[..head_len];
        if head
            .windows(2)
            .filter(|w| w[1] == b'\n')
            .any(|w| w[0] != b'\r')
        {
            return Err(format!("a bare LF in a response: {:?}", lossy(head, 512)));
        }
        let status = resp.code.unwrap_or(0);
        let header = |name: &str| -> Vec<String> {
            resp.headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
                .collect()
        };
        let cl = header("content-length");
        let te = header("transfer-encoding");
        let rest = &buf[head_len..];
        let body_len = if (100..200).contains(&status) || status == 204 || status == 304 {
            0
        } else {
            match (cl.as_slice(), te.as_slice()) {
                ([n], []) => {
                    let n: usize = n
                        .parse()
                        .map_err(|_| format!("response Content-Length {n:?}"))?;
                    if rest.len() >= n && !rest.starts_with(b"HTTP/1.") {
                        n
                    } else if rest.is_empty() || rest.starts_with(b"HTTP/1.") {
                        0 // an answer to HEAD
                    } else {
                        return Err(format!(
                            "the stream ended inside a {n}-byte body: {:?}",
                            lossy(rest, 200)
                        ));
                    }
                }
                ([], [t]) if t.eq_ignore_ascii_case("chunked") => match chunked(rest)? {
                    Some((n, _)) => n,
                    None => return Err("the stream ended inside a chunked body".into()),
                },
                // Delimited by the close: everything that is left.
                ([], []) => rest.len(),
                _ => {
                    return Err(format!(
                        "ambiguous response framing: {:?}",
                        lossy(head, 512)
                    ));
                }
            }
        };
        if status >= 200 {
            finals += 1;
        }
        buf = &rest[body_len..];
    }
    Ok(finals)
}

/// Non-overlapping occurrences of `HTTP/1.` in `bytes`: every request line pinlb accepts has
/// one, so no client can make pinlb forward more requests than this.
pub fn request_lines_at_most(bytes: &[u8]) -> usize {
    let mut n = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(7).position(|w| w == b"HTTP/1.") {
        n += 1;
        at += i + 7;
    }
    n
}

/// A loopback source address for case `n` (127.0.0.2 to 127.0.0.251, round and round), so
/// that [`Tally::by_client`] tells cases apart.
pub fn client_ip(n: u64) -> IpAddr {
    IpAddr::from([127, 0, 0, 2 + (n % 250) as u8])
}

/// Connects to `to` from `from` (any port).
pub async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(from, 0))?;
    s.connect(to).await
}

/// One client connection from `from`: sends `bytes` in two writes (split at `split`), closes
/// the sending side, and returns everything that came back until pinlb closed. `Err` when
/// pinlb neither finished nor closed within `limit`.
pub async fn exchange(
    from: IpAddr,
    proxy: SocketAddr,
    bytes: &[u8],
    split: usize,
    limit: Duration,
) -> Result<Vec<u8>, String> {
    let s = connect_from(from, proxy)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut read, mut write) = s.into_split();
    let (first, second) = bytes.split_at(split.min(bytes.len()));
    // Writes may fail once pinlb has answered and closed; what came back is checked either way.
    let writer = async move {
        if write.write_all(first).await.is_ok() && write.write_all(second).await.is_ok() {
            let _ = write.shutdown().await;
        }
        // Keeps the connection whole until the read side is done.
        write
    };
    let mut got = Vec::new();
    let reader = async {
        match tokio::time::timeout(limit, read.read_to_end(&mut got)).await {
            Err(_) => Err(format!(
                "pinlb neither finished nor closed within {limit:?}; got {:?}",
                lossy(&got, 512)
            )),
            // A reset after the answer (pinlb left unread bytes behind) ends the stream too.
            Ok(_) => Ok(()),
        }
    };
    let (_write, read) = tokio::join!(writer, reader);
    read.map(|()| got)
}

fn lossy(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
}

/// What a [`FramingBackend`] has seen.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Requests that passed [`next_request`] and were answered.
    pub requests: usize,
    /// The same requests by their X-Forwarded-For value: a harness that connects from its own
    /// loopback address per case counts what pinlb forwarded for that case alone, even when a
    /// request of an earlier case arrives late.
    pub by_client: HashMap<String, usize>,
    /// Backend connections holding part of a request right now.
    pub partial: usize,
    /// What failed [`next_request`], one message per connection it ended.
    pub violations: Vec<String>,
}

/// A backend that checks every request it reads with [`next_request`] and answers each good
/// one with an empty `200`. A violation is recorded and the connection closed.
pub struct FramingBackend {
    pub addr: SocketAddr,
    tally: watch::Sender<Tally>,
    accept: tokio::task::JoinHandle<()>,
}

/// The backend's answer: empty, so that only pinlb's own error responses carry a body.
const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";

impl FramingBackend {
    /// Starts on `127.0.0.1:0`, on the current tokio runtime.
    pub async fn start() -> std::io::Result<FramingBackend> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tally = watch::Sender::new(Tally::default());
        let t = tally.clone();
        let accept = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((s, _)) => {
                        tokio::spawn(serve(s, t.clone()));
                    }
                    // Out of descriptors and the like: a real test fails on what it misses.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        });
        Ok(FramingBackend {
            addr,
            tally,
            accept,
        })
    }

    pub fn tally(&self) -> Tally {
        self.tally.borrow().clone()
    }

    /// Waits (at most `limit`) until no backend connection holds part of a request: whatever
    /// pinlb was still sending has arrived whole or been cut off by a close. Returns whether it
    /// got there.
    pub async fn settled(&self, limit: Duration) -> bool {
        let mut rx = self.tally.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|t| t.partial == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Drop for FramingBackend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut s: TcpStream, tally: watch::Sender<Tally>) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    // Each request ends or is cut off by the connection's end; at most a few hundred per
    // connection in these harnesses, so the bound only stops a runaway.
    for _ in 0..1_000_000 {
        let was_partial = !buf.is_empty();
        let n = s.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            if was_partial {
                tally.send_modify(|t| t.partial -= 1);
            }
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut answers = Vec::new();
        let verdict = loop {
            match next_request(&buf) {
                Ok(Some(r)) => {
                    buf.drain(..r.len);
                    answers.push(r.client.unwrap_or_default());
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let now_partial = !buf.is_empty() && verdict.is_ok();
        tally.send_modify(|t| {
            t.requests += answers.len();
            for client in &answers {
                *t.by_client.entry(client.clone()).or_default() += 1;
            }
            match (was_partial, now_partial) {
                (false, true) => t.partial += 1,
                (true, false) => t.partial -= 1,
                _ => {}
            }
            if let Err(e) = &verdict {
                t.violations.push(e.clone());
            }
        });
        for _ in &answers {
            if s.write_all(OK).await.is_err() {
                return;
            }
        }
        if verdict.is_err() {
            return;
        }
    }
}
