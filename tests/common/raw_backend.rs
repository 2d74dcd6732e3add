//! Backends that speak HTTP/1.1 by hand, for what hyper would never produce: broken bodies,
//! malformed heads, resets, responses that never come.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use super::WAIT;

/// A backend that answers every connection by reading one request head, writing `parts` as
/// raw bytes, one write each, and closing: for responses hyper would refuse to produce.
pub async fn raw_backend(parts: Vec<Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let parts = parts.clone();
            tokio::spawn(async move {
                let mut s = tokio::io::BufReader::new(s);
                let mut line = String::new();
                while s.read_line(&mut line).await.unwrap_or(0) > 2 {
                    line.clear();
                }
                let mut s = s.into_inner();
                for part in parts {
                    if tokio::io::AsyncWriteExt::write_all(&mut s, &part)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One request as a [`RawServer`] read it.
#[derive(Debug, Clone)]
pub struct RawSeen {
    /// Which connection it came on: 1 for the first one accepted.
    pub conn: usize,
    /// Its place on that connection: 1 for the first request.
    pub nth: usize,
    /// The request line and header lines.
    pub head: String,
    pub body: Vec<u8>,
    /// Whether it is one of pinlb's health probes (`User-Agent: pinlb-health`).
    pub probe: bool,
    /// When it was read completely.
    pub at: Instant,
}

/// What a [`RawServer`] does with a request it has read completely, head and body. Durations are
/// real time, like [`super::Backend`]'s delays.
#[derive(Debug, Clone)]
pub enum RawAction {
    /// Writes these bytes and waits for the next request on the connection.
    Respond(Vec<u8>),
    /// Writes these bytes and closes the connection (FIN).
    RespondAndClose(Vec<u8>),
    /// Waits this long, then responds as [`RawAction::Respond`] does.
    RespondAfter(Duration, Vec<u8>),
    /// Closes the connection (FIN) without a response byte.
    Close,
    /// Resets the connection (RST, by SO_LINGER 0) without a response byte.
    Reset,
    /// Keeps the connection open this long without answering, then closes it.
    HoldThenClose(Duration),
    /// Writes these bytes (a response cut short, say), then neither reads nor writes again,
    /// keeping the connection open for as long as the test's runtime runs.
    RespondAndStall(Vec<u8>),
}

struct RawState {
    accepts: AtomicUsize,
    /// Requests that were not health probes.
    requests: watch::Sender<usize>,
    probes: watch::Sender<usize>,
    seen: Mutex<Vec<RawSeen>>,
    /// Connections this side has closed (its socket dropped: the FIN or RST is on its way).
    closed: watch::Sender<usize>,
}

/// A backend that speaks HTTP/1.1 by hand, for failures hyper would not produce: it reads each
/// request completely (Content-Length or chunked body) and then does what `script` says.
pub struct RawServer {
    pub addr: SocketAddr,
    state: Arc<RawState>,
    stop: Option<oneshot::Sender<()>>,
    accept: Option<tokio::task::JoinHandle<Option<TcpListener>>>,
}

type Script = Arc<dyn Fn(&RawSeen) -> RawAction + Send + Sync>;

impl RawServer {
    pub async fn start(script: impl Fn(&RawSeen) -> RawAction + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        RawServer::serve(listener, script)
    }

    /// Serves on an already bound listener (e.g. the port of a backend that was killed).
    pub fn serve(
        listener: TcpListener,
        script: impl Fn(&RawSeen) -> RawAction + Send + Sync + 'static,
    ) -> Self {
        let addr = listener.local_addr().unwrap();
        let script: Script = Arc::new(script);
        let state = Arc::new(RawState {
            accepts: AtomicUsize::new(0),
            requests: watch::Sender::new(0),
            probes: watch::Sender::new(0),
            seen: Mutex::new(Vec::new()),
            closed: watch::Sender::new(0),
        });
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = &mut stop_rx => return Some(listener),
                    a = listener.accept() => match a {
                        Ok((s, _)) => s,
                        Err(_) => continue,
                    },
                };
                let conn = st.accepts.fetch_add(1, Ordering::SeqCst) + 1;
                let (st, script) = (st.clone(), script.clone());
                tokio::spawn(async move {
                    raw_connection(stream, conn, st.clone(), script).await;
                    st.closed.send_modify(|c| *c += 1);
                });
            }
        });
        RawServer {
            addr,
            state,
            stop: Some(stop_tx),
            accept: Some(accept),
        }
    }

    /// Stops accepting and hands the listener back, still bound and listening (connections
    /// already accepted run on).
    pub async fn into_listener(mut self) -> TcpListener {
        let _ = self.stop.take().unwrap().send(());
        let accept = self.accept.take().unwrap();
        tokio::time::timeout(WAIT, accept)
            .await
            .expect("the accept loop ends when told")
            .expect("accept loop")
            .expect("the listener")
    }

    /// TCP connections accepted, probes' included.
    pub fn accepts(&self) -> usize {
        self.state.accepts.load(Ordering::SeqCst)
    }

    /// Requests read that were not health probes.
    pub fn requests(&self) -> usize {
        *self.state.requests.borrow()
    }

    /// Health probes read.
    pub fn probes(&self) -> usize {
        *self.state.probes.borrow()
    }

    /// Every request read that was not a health probe, in order.
    pub fn seen(&self) -> Vec<RawSeen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.state.requests.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|r| *r >= n))
            .await
            .unwrap_or_else(|_| panic!("never saw {n} requests (saw {})", self.requests()))
            .expect("request counter closed");
    }

    /// Waits (bounded) until this side has closed `n` connections: their sockets are dropped,
    /// so pinlb's end has the FIN (or RST) in its receive queue.
    pub async fn wait_for_closed(&self, n: usize) {
        let mut rx = self.state.closed.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| {
                let closed = *self.state.closed.borrow();
                panic!("never closed {n} connections (closed {closed})")
            })
            .expect("close counter closed");
    }

    pub async fn wait_for_probes(&self, n: usize) {
        let mut rx = self.state.probes.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|p| *p >= n))
            .await
            .unwrap_or_else(|_| panic!("never saw {n} health probes (saw {})", self.probes()))
            .expect("probe counter closed");
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// What a [`HeadServer`] does once it has read a request head. It never reads the body.
#[derive(Debug, Clone)]
pub enum OnHead {
    /// Writes these bytes at once (an early answer, a 413 say), then neither reads nor writes
    /// again, keeping the connection open for as long as the test's runtime runs.
    AnswerThenStopReading(Vec<u8>),
    /// Neither answers nor reads again, keeping the connection open for as long as the test's
    /// runtime runs.
    NeverAnswer,
}

/// A backend that reads only request heads, for the backends a [`RawServer`] cannot be (it reads
/// every body before it acts): one that answers an upload early and stops reading, or one that
/// stops reading and never answers.
pub struct HeadServer {
    pub addr: SocketAddr,
    heads: watch::Sender<usize>,
    accept: tokio::task::JoinHandle<()>,
}

impl HeadServer {
    pub async fn start(action: OnHead) -> HeadServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let heads = watch::Sender::new(0);
        let counter = heads.clone();
        let accept = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (action, counter) = (action.clone(), counter.clone());
                tokio::spawn(async move {
                    let mut s = tokio::io::BufReader::new(s);
                    let mut line = String::new();
                    // Bounded by the head: each pass reads a line, or ends.
                    loop {
                        line.clear();
                        match s.read_line(&mut line).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" || line == "\n" => break,
                            Ok(_) => {}
                        }
                    }
                    counter.send_modify(|n| *n += 1);
                    if let OnHead::AnswerThenStopReading(bytes) = action {
                        let _ = tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes).await;
                    }
                    std::future::pending::<()>().await;
                });
            }
        });
        HeadServer {
            addr,
            heads,
            accept,
        }
    }

    /// Request heads read so far.
    pub fn heads(&self) -> usize {
        *self.heads.borrow()
    }

    pub async fn wait_for_heads(&self, n: usize) {
        let mut rx = self.heads.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|h| *h >= n))
            .await
            .unwrap_or_else(|_| panic!("never saw {n} request heads (saw {})", self.heads()))
            .expect("head counter closed");
    }
}

impl Drop for HeadServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A complete `200 OK` response with `x-backend: id` and `body`, keeping the connection open.
pub fn raw_ok(id: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nx-backend: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A complete response with `status`, `x-backend: id` and a short body.
pub fn raw_status(id: &str, status: u16) -> Vec<u8> {
    let body = format!("status {status} from {id}\n");
    format!(
        "HTTP/1.1 {status} X\r\nx-backend: {id}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn raw_connection(stream: TcpStream, conn: usize, st: Arc<RawState>, script: Script) {
    let _ = stream.set_nodelay(true);
    let mut s = tokio::io::BufReader::new(stream);
    for nth in 1.. {
        let Some(seen) = raw_read_request(&mut s, conn, nth).await else {
            return;
        };
        if seen.probe {
            st.probes.send_modify(|p| *p += 1);
        } else {
            st.seen.lock().unwrap().push(seen.clone());
            st.requests.send_modify(|r| *r += 1);
        }
        match script(&seen) {
            RawAction::Respond(bytes) => {
                if tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            RawAction::RespondAfter(delay, bytes) => {
                tokio::time::sleep(delay).await;
                if tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            RawAction::RespondAndClose(bytes) => {
                let _ = tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes).await;
                return;
            }
            RawAction::Close => return,
            RawAction::Reset => {
                let _ = socket2::SockRef::from(s.get_ref()).set_linger(Some(Duration::ZERO));
                return;
            }
            RawAction::HoldThenClose(d) => {
                tokio::time::sleep(d).await;
                return;
            }
            RawAction::RespondAndStall(bytes) => {
                let _ = tokio::io::AsyncWriteExt::write_all(s.get_mut(), &bytes).await;
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Reads one request, head and body; `None` when the connection ends first.
async fn raw_read_request(
    s: &mut tokio::io::BufReader<TcpStream>,
    conn: usize,
    nth: usize,
) -> Option<RawSeen> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if s.read_line(&mut line).await.unwrap_or(0) == 0 {
            return None;
        }
        let end = line == "\r\n" || line == "\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let probe = header("user-agent").is_some_and(|v| v == "pinlb-health");
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            s.read_line(&mut size).await.ok()?;
            let size =
                usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            s.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = header("content-length") {
        body = vec![0; len.parse().ok()?];
        s.read_exact(&mut body).await.ok()?;
    }
    Some(RawSeen {
        conn,
        nth,
        head,
        body,
        probe,
        at: Instant::now(),
    })
}
