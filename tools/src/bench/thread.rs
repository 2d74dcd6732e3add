//! One load thread's side of a run: what its connection tasks share (the target, the request,
//! the window, the thread's counts and histogram), one exchange on a connection, and connecting
//! (with `--ws`, the WebSocket handshake too). The closed loop (`closed.rs`) and the open loop
//! (`load.rs`) both drive connections with it.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use super::tls::{Stream, Tls};

use super::stats::Counts;
use super::wire::{BodyDecoder, parse_head};
use super::ws::{WsPlan, check_upgrade};

/// Each connection's read buffer. A response head must fit; bodies stream through it.
pub(super) const READ_BUF: usize = 32 * 1024;
/// A counter on a cache line of its own: each thread stores into its own at every response, and
/// two threads' counters on one line would bounce it between their cores.
#[repr(align(128))]
#[derive(Default)]
pub(super) struct Progress {
    /// Complete responses, both phases.
    pub(super) responses: AtomicU64,
    /// Failed exchanges and connects, and non-2xx responses, both phases.
    pub(super) errors: AtomicU64,
}

/// One thread's view of the run, shared by its connection tasks.
pub(super) struct Thread {
    pub(super) addr: SocketAddr,
    /// `https://`: each connection's TLS handshake.
    pub(super) tls: Option<Tls>,
    /// What every exchange writes: the HTTP request, or with `--ws` the message's frame.
    pub(super) request: Arc<[u8]>,
    /// `--ws`: each connection opens with this handshake, and exchanges are echoes.
    pub(super) websocket: Option<Arc<WsPlan>>,
    pub(super) timeout: Duration,
    /// The request is a `HEAD`: its responses have no body.
    pub(super) head_request: bool,
    /// Whether a connection may carry more than one request (`--disable-keepalive` says no).
    pub(super) keep_alive: bool,
    /// `-n`: requests this thread may still send in the recorded window; `u64::MAX` when the
    /// window is a duration. A failed connect in the window uses one too, so a target that
    /// refuses every connection ends the run instead of holding it for good.
    pub(super) budget: Cell<u64>,
    /// When this thread's load started: the warm-up, and the open loop's schedule.
    pub(super) begin: Instant,
    /// Start of the recorded window.
    pub(super) t0: Instant,
    /// End of the recorded window: no request is sent (or scheduled) at or after it.
    pub(super) end: Instant,
    pub(super) stats: RefCell<Stats>,
    /// This thread's progress counter is `progress[thread]`.
    pub(super) progress: Arc<Vec<Progress>>,
    pub(super) thread: usize,
}

/// One thread's results so far.
pub(super) struct Stats {
    pub(super) histogram: Histogram<u64>,
    /// pinlb's own time on each response of the recorded window that said it
    /// (`Server-Timing`), in ns.
    pub(super) pinlb_time: Histogram<u64>,
    pub(super) recorded: Counts,
    pub(super) warmup: Counts,
    /// Responses in both phases, for the progress line.
    pub(super) responses: u64,
    /// Errors of every kind in both phases, for the progress line.
    pub(super) errors: u64,
    /// Why the first connect that failed did, for the message when a target fails entirely.
    pub(super) connect_failure: Option<io::ErrorKind>,
}

/// How one exchange ended.
pub(super) enum Outcome {
    /// The status, and pinlb's own time in ns when the response said it.
    Response(u16, Option<u64>),
    /// `--ws`: the whole echo of the message.
    Echo,
    /// No complete response within the timeout.
    Timeout,
    /// The connection failed or the response was malformed.
    Broken,
}

/// Why a connection could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    /// Refused, unreachable, timed out: the kind says which.
    Connect(io::ErrorKind),
    /// Connected, but the WebSocket handshake failed or took longer than the timeout.
    Handshake,
}

impl Thread {
    /// Takes one request from the `-n` budget; false when it is spent.
    pub(super) fn take(&self) -> bool {
        let left = self.budget.get();
        if left == 0 {
            return false;
        }
        if left != u64::MAX {
            self.budget.set(left - 1);
        }
        true
    }

    /// Whether nothing more may be sent at `now`: the window has closed or the budget is spent.
    pub(super) fn over(&self, now: Instant) -> bool {
        now >= self.end || (now >= self.t0 && self.budget.get() == 0)
    }

    /// Counts a failed connect (or handshake), and keeps why the first connect failed.
    pub(super) fn connect_error(&self, recorded: bool, failed: Failed) {
        let mut st = self.stats.borrow_mut();
        if let Failed::Connect(kind) = failed {
            st.connect_failure.get_or_insert(kind);
        }
        let counts = if recorded {
            &mut st.recorded
        } else {
            &mut st.warmup
        };
        match failed {
            Failed::Connect(_) => counts.errors.connect += 1,
            Failed::Handshake => counts.errors.handshake += 1,
        }
        st.errors += 1;
        self.progress[self.thread]
            .errors
            .store(st.errors, Ordering::Relaxed);
    }

    /// Opens a connection to the target, with the handshake in `--ws` mode, all within the
    /// timeout. Owns what it needs, so the closed loop can keep it across passes.
    pub(super) fn open(&self) -> impl Future<Output = Result<Stream, Failed>> + 'static {
        let (addr, timeout, ws) = (self.addr, self.timeout, self.websocket.clone());
        let tls = self.tls.clone();
        async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let connecting =
                tokio::time::timeout_at(deadline, connect(addr, timeout, tls.as_ref()));
            let mut stream = match connecting.await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(Failed::Connect(e.kind())),
                Err(_) => return Err(Failed::Connect(io::ErrorKind::TimedOut)),
            };
            if let Some(ws) = ws {
                match tokio::time::timeout_at(deadline, upgrade(&mut stream, &ws)).await {
                    Ok(Ok(())) => {}
                    _ => return Err(Failed::Handshake),
                }
            }
            Ok(stream)
        }
    }

    /// Counts one exchange; the latency goes into the histogram when it was a response in the
    /// recorded window (timeouts and broken connections have no latency, as in wrk).
    pub(super) fn record(&self, recorded: bool, outcome: Outcome, latency: Duration, bytes: u64) {
        let mut st = self.stats.borrow_mut();
        let st = &mut *st;
        let counts = if recorded {
            &mut st.recorded
        } else {
            &mut st.warmup
        };
        counts.sent += 1;
        counts.bytes_read += bytes;
        // Whether the exchange got a whole answer, and whether that answer was a good one.
        let mut pinlb_ns = None;
        let good = match outcome {
            Outcome::Response(status, pinlb) => {
                counts.statuses.add(status, 1);
                pinlb_ns = pinlb;
                (200..300).contains(&status)
            }
            Outcome::Echo => true,
            Outcome::Timeout => {
                counts.errors.timeout += 1;
                st.errors += 1;
                self.progress[self.thread]
                    .errors
                    .store(st.errors, Ordering::Relaxed);
                return;
            }
            Outcome::Broken => {
                counts.errors.read += 1;
                st.errors += 1;
                self.progress[self.thread]
                    .errors
                    .store(st.errors, Ordering::Relaxed);
                return;
            }
        };
        counts.responses += 1;
        if good {
            counts.ok += 1;
        } else {
            counts.errors.non_2xx += 1;
            st.errors += 1;
            self.progress[self.thread]
                .errors
                .store(st.errors, Ordering::Relaxed);
        }
        if recorded {
            let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
            st.histogram.saturating_record(ns);
            if let Some(ns) = pinlb_ns {
                st.pinlb_time.saturating_record(ns);
            }
        }
        st.responses += 1;
        self.progress[self.thread]
            .responses
            .store(st.responses, Ordering::Relaxed);
    }

    /// One request and its response on `stream`, with the timeout counted from now. Resetting
    /// the connection's one `Sleep` to a later deadline only updates it in place, where a fresh
    /// timer per request would be inserted into and removed from tokio's timer wheel each time.
    pub(super) async fn exchange(
        &self,
        stream: &mut Stream,
        buf: &mut [u8],
        mut timer: Pin<&mut Sleep>,
    ) -> (Outcome, bool, u64) {
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + self.timeout);
        let mut bytes = 0;
        let outcome = tokio::select! {
            biased;
            r = exchange(stream, &self.request, buf, self.head_request, &mut bytes) => match r {
                Ok(resp) => (
                    Outcome::Response(resp.status, resp.pinlb_ns),
                    resp.keep_alive && self.keep_alive,
                ),
                Err(Broken) => (Outcome::Broken, false),
            },
            () = timer => (Outcome::Timeout, false),
        };
        (outcome.0, outcome.1, bytes)
    }
}

/// A connect within `timeout`, with Nagle off (a request is one small write, and it must go
/// out at once), and the TLS handshake for an `https://` target.
pub(super) async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Tls>,
) -> io::Result<Stream> {
    let opened = async {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        super::tls::open(stream, tls).await
    };
    tokio::time::timeout(timeout, opened)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// Sends the WebSocket handshake and reads its answer: a `101` with the expected accept key and
/// nothing after it, or an error. The head is read into a buffer of its own, once per
/// connection.
async fn upgrade(stream: &mut Stream, ws: &WsPlan) -> io::Result<()> {
    stream.write_all(&ws.handshake).await?;
    stream.flush().await?;
    let mut buf = vec![0u8; 8 * 1024];
    let mut filled = 0;
    loop {
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        filled += n;
        match check_upgrade(&buf[..filled], &ws.accept) {
            Ok(Some(())) => return Ok(()),
            Ok(None) if filled < buf.len() => {}
            Ok(None) => return Err(io::Error::other("handshake answer too large")),
            Err(refused) => return Err(io::Error::other(format!("{refused:?}"))),
        }
    }
}

/// The connection failed or sent something that is not a response.
struct Broken;

/// A complete response.
struct Response {
    status: u16,
    keep_alive: bool,
    pinlb_ns: Option<u64>,
}

/// Writes `request` and reads one whole response into `buf` (head, then the body, which is
/// dropped as it arrives). Interim 1xx responses are skipped. Bytes after the response, which
/// nothing asked for, make the connection unusable for the next request.
async fn exchange(
    stream: &mut Stream,
    request: &[u8],
    buf: &mut [u8],
    head_request: bool,
    bytes: &mut u64,
) -> Result<Response, Broken> {
    stream.write_all(request).await.map_err(|_| Broken)?;
    // A TLS stream may hold the last record until flushed; for TCP this does nothing.
    stream.flush().await.map_err(|_| Broken)?;
    let mut filled = 0;
    let head = loop {
        if filled > 0 {
            match parse_head(&buf[..filled], head_request).map_err(|_| Broken)? {
                Some(h) if h.is_interim() => {
                    buf.copy_within(h.len..filled, 0);
                    filled -= h.len;
                    continue;
                }
                Some(h) => break h,
                // The head does not fit in the buffer.
                None if filled == buf.len() => return Err(Broken),
                None => {}
            }
        }
        let n = stream.read(&mut buf[filled..]).await.map_err(|_| Broken)?;
        if n == 0 {
            return Err(Broken);
        }
        *bytes += n as u64;
        filled += n;
    };
    let mut body = head.body;
    let mut keep_alive = head.keep_alive;
    let mut fed = body.feed(&buf[head.len..filled]).map_err(|_| Broken)?;
    let mut extra = filled - head.len - fed.used;
    while !fed.done {
        let n = stream.read(buf).await.map_err(|_| Broken)?;
        *bytes += n as u64;
        if n == 0 {
            if body == BodyDecoder::UntilClose {
                keep_alive = false;
                break;
            }
            return Err(Broken);
        }
        fed = body.feed(&buf[..n]).map_err(|_| Broken)?;
        extra = n - fed.used;
    }
    if extra > 0 {
        keep_alive = false;
    }
    Ok(Response {
        status: head.status,
        keep_alive,
        pinlb_ns: head.pinlb_ns,
    })
}
