//! The closed loop: one task drives all of a thread's connections the way an event-loop load
//! generator such as wrk does, so that its latencies mean what wrk's mean.
//!
//! Each pass of the loop handles every connection that is ready once: it writes the requests
//! armed on the previous pass, then reads every response that has arrived. A connection whose
//! response completes is armed, and its next request goes out on the next pass, after the
//! runtime has polled the driver again (`yield_now` defers the task until then). That is wrk's
//! structure: `epoll_wait`, every ready read handled (a completed response only re-arms
//! `EPOLLOUT`), then the writes on the following pass, each starting its clock as it is written.
//!
//! Why it matters: latency is counted from the write of a request to the end of its response, so
//! the time a connection spends between reading one response and writing the next request, the
//! generator's own queue, is not in it. When the next request went out in the same poll as the
//! read (one task per connection, as this module replaced), that queue was empty: all `-c`
//! requests were queued at the server all the time, and the mean latency was connections ÷
//! throughput by Little's law. wrk instead leaves each connection about one pass out of the server's
//! queue, so against a saturated server at `-c64` this tool's median was 1.9× wrk's while their
//! rates and p99s agreed. Nothing here hides time a request spends at the server: the clock starts
//! when the request is written and stops when its response has been read.
//!
//! How much either tool leaves out depends on how many events a pass gathers, which depends on
//! which side is slower. When the client is, responses pile up while it works, passes grow, and
//! the median falls to about half of connections ÷ throughput; when the server is, a pass handles
//! one or two events and the median is close to connections ÷ throughput. wrk was seen in both
//! regimes against the same nginx minutes apart (`benches/RESULTS.md`). This loop has the same
//! structure but not wrk's costs (no `epoll_ctl` per request), so against a given server it is
//! more often the faster side.
//!
//! With `--ws` an exchange is a WebSocket message and its echo, on connections that were
//! upgraded when they opened; everything else here is the same.
//!
//! Connect time is not part of the latency (as in wrk), nor is the WebSocket handshake. A failed connect is counted and tried again
//! on the next pass, as wrk does. One timer per thread, set to the earliest deadline of the
//! requests in flight, enforces the timeout; a response that takes longer counts as a timeout and
//! its connection is replaced.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::tls::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::thread::{Failed, Outcome, READ_BUF, Thread};
use super::wire::{BodyDecoder, parse_head};
use super::ws::Echo;

type Connecting = Pin<Box<dyn Future<Output = Result<Stream, Failed>>>>;

/// Where one connection stands.
enum State {
    /// No connection: one is opened on the next pass.
    Closed,
    Connecting(Connecting),
    /// Connected and idle: the next request goes out on the next pass.
    Armed,
    /// The request is (partly) written: `written` bytes of it.
    Writing {
        written: usize,
    },
    /// Reading the response: `filled` bytes of the head so far.
    Head {
        filled: usize,
    },
    /// Reading the body of a response whose head said `status`, `keep_alive` and pinlb's
    /// own time.
    Body {
        decoder: BodyDecoder,
        status: u16,
        keep_alive: bool,
        pinlb_ns: Option<u64>,
    },
    /// `--ws`: reading the echo of the message.
    Echo(Echo),
    /// The window has closed: nothing more to send.
    Done,
}

/// One connection of the loop.
struct Conn {
    stream: Option<Stream>,
    state: State,
    /// When the request in flight was written (the start of its latency), and its deadline.
    start: Instant,
    deadline: Instant,
    /// When the connection began to be opened: with `--disable-keepalive` each request's
    /// latency starts there, as `ab`'s does, since a client without keep-alive waits for it.
    opened: Instant,
    /// Whether the request in flight was sent in the recorded window.
    recorded: bool,
    /// A request of the `-n` budget taken when the connection began to open, for its first
    /// request (or its failed connect): no connection is opened that no request will use.
    reserved: bool,
    /// Bytes read for the exchange in flight.
    bytes: u64,
    buf: Box<[u8]>,
}

/// How reading a response went.
enum Read {
    /// The response is complete.
    Response {
        status: u16,
        keep_alive: bool,
        pinlb_ns: Option<u64>,
    },
    /// `--ws`: the echo is complete.
    Echo { keep_alive: bool },
    /// Nothing more to read now.
    Pending,
    /// The connection failed or sent something that is not a response.
    Broken,
}

/// Runs `connections` connections in closed loop until the window closes and every request sent
/// has been answered or has timed out.
pub(super) async fn closed_loop(sh: &Thread, connections: usize) {
    let now = Instant::now();
    let mut conns: Vec<Conn> = (0..connections)
        .map(|_| Conn {
            stream: None,
            state: State::Closed,
            start: now,
            deadline: now,
            opened: now,
            recorded: false,
            reserved: false,
            bytes: 0,
            buf: vec![0u8; READ_BUF].into_boxed_slice(),
        })
        .collect();
    let timer = tokio::time::sleep(sh.timeout);
    tokio::pin!(timer);
    let mut timer_at = None;
    // Bounded: after `sh.end` no connection is armed again, so every connection reaches `Done`
    // once its last response is read or its timeout passes.
    loop {
        let (live, armed, deadline) = poll_fn(|cx| Poll::Ready(pass(sh, &mut conns, cx))).await;
        if !live {
            break;
        }
        if let Some(at) = deadline {
            if timer_at != Some(at) {
                timer.as_mut().reset(tokio::time::Instant::from_std(at));
                timer_at = Some(at);
            }
            // Registers the timer's wake-up; when it is already due, the next pass finds it.
            let _ = poll_fn(|cx| Poll::Ready(timer.as_mut().poll(cx))).await;
        }
        if armed {
            // The next pass after the driver has been polled, like wrk's next `epoll_wait`.
            tokio::task::yield_now().await;
        } else {
            // Every connection is waiting on its socket or the timer, each registered with this
            // task's waker during the pass: sleep until one of them wakes it.
            wait_for_wake().await;
        }
    }
}

/// Returns `Pending` once, then `Ready`: the task sleeps until something it registered with
/// wakes it.
async fn wait_for_wake() {
    let mut polled = false;
    poll_fn(|_| {
        if polled {
            Poll::Ready(())
        } else {
            polled = true;
            Poll::Pending
        }
    })
    .await;
}

/// One pass over all connections. Returns whether any connection is still live, whether any is
/// armed for the next pass, and the earliest deadline of a request in flight.
fn pass(sh: &Thread, conns: &mut [Conn], cx: &mut Context<'_>) -> (bool, bool, Option<Instant>) {
    let mut live = false;
    let mut armed = false;
    let mut deadline: Option<Instant> = None;
    // Writes first: they were armed on the previous pass, before the reads of this one arrived.
    for c in conns.iter_mut() {
        if matches!(c.state, State::Armed) {
            c.send(sh);
            c.step(sh, cx, c.start);
        }
    }
    let now = Instant::now();
    for c in conns.iter_mut() {
        c.step(sh, cx, now);
        match c.state {
            State::Done => continue,
            State::Armed | State::Closed => armed = true,
            State::Writing { .. } | State::Head { .. } | State::Body { .. } | State::Echo(_) => {
                deadline = Some(deadline.map_or(c.deadline, |d| d.min(c.deadline)));
            }
            State::Connecting(_) => {}
        }
        live = true;
    }
    (live, armed, deadline)
}

impl Conn {
    /// Writes the next request, starting its clock, unless the window has closed.
    fn send(&mut self, sh: &Thread) {
        let now = Instant::now();
        self.recorded = now >= sh.t0;
        let reserved = std::mem::take(&mut self.reserved);
        if now >= sh.end || (self.recorded && !reserved && !sh.take()) {
            self.close(State::Done);
            return;
        }
        self.start = if sh.keep_alive { now } else { self.opened };
        self.bytes = 0;
        self.deadline = now + sh.timeout;
        self.state = State::Writing { written: 0 };
    }

    /// Moves this connection on as far as it can go without waiting.
    fn step(&mut self, sh: &Thread, cx: &mut Context<'_>, now: Instant) {
        // Bounded: each turn either returns or moves to a later state of the same exchange.
        loop {
            match &mut self.state {
                State::Done | State::Armed => return,
                State::Closed => {
                    if sh.over(now) || (now >= sh.t0 && !sh.take()) {
                        self.state = State::Done;
                        return;
                    }
                    self.reserved = now >= sh.t0;
                    self.opened = Instant::now();
                    self.state = State::Connecting(Box::pin(sh.open()));
                }
                State::Connecting(fut) => match fut.as_mut().poll(cx) {
                    Poll::Ready(Ok(s)) => {
                        self.stream = Some(s);
                        // Like wrk, the first request goes out on the next pass.
                        self.state = State::Armed;
                        return;
                    }
                    Poll::Ready(Err(failed)) => {
                        let now = Instant::now();
                        // A failed connect uses the request of the `-n` budget it reserved.
                        let reserved = std::mem::take(&mut self.reserved);
                        if now >= sh.end {
                            self.state = State::Done;
                        } else {
                            sh.connect_error(reserved || now >= sh.t0, failed);
                            self.state = State::Closed;
                        }
                        return;
                    }
                    Poll::Pending => return,
                },
                State::Writing { written } => {
                    if now >= self.deadline {
                        return self.finish(sh, Outcome::Timeout, false);
                    }
                    let Some(stream) = &mut self.stream else {
                        return self.finish(sh, Outcome::Broken, false);
                    };
                    let request = &sh.request[*written..];
                    if request.is_empty() {
                        // Written whole: a TLS stream may still hold its last record, which a
                        // flush sends; for TCP it is done at once.
                        match Pin::new(stream).poll_flush(cx) {
                            Poll::Ready(Ok(())) => {
                                self.state = match &sh.websocket {
                                    Some(ws) => State::Echo(Echo::new(ws.message_size)),
                                    None => State::Head { filled: 0 },
                                };
                            }
                            Poll::Ready(Err(_)) => return self.finish(sh, Outcome::Broken, false),
                            Poll::Pending => return,
                        }
                        continue;
                    }
                    match Pin::new(stream).poll_write(cx, request) {
                        Poll::Ready(Ok(n)) if n > 0 => *written += n,
                        Poll::Ready(_) => return self.finish(sh, Outcome::Broken, false),
                        Poll::Pending => return,
                    }
                }
                State::Head { .. } | State::Body { .. } | State::Echo(_) => {
                    match self.read(cx, sh.head_request) {
                        Read::Response {
                            status,
                            keep_alive,
                            pinlb_ns,
                        } => {
                            return self.finish(
                                sh,
                                Outcome::Response(status, pinlb_ns),
                                keep_alive,
                            );
                        }
                        Read::Echo { keep_alive } => {
                            return self.finish(sh, Outcome::Echo, keep_alive);
                        }
                        Read::Broken => return self.finish(sh, Outcome::Broken, false),
                        Read::Pending if now >= self.deadline => {
                            return self.finish(sh, Outcome::Timeout, false);
                        }
                        Read::Pending => return,
                    }
                }
            }
        }
    }

    /// Records the exchange that just ended and arms the connection for the next one, on a new
    /// connection unless this one can be kept.
    fn finish(&mut self, sh: &Thread, outcome: Outcome, keep_alive: bool) {
        sh.record(self.recorded, outcome, self.start.elapsed(), self.bytes);
        if keep_alive && sh.keep_alive {
            self.state = State::Armed;
        } else {
            self.close(State::Closed);
        }
    }

    fn close(&mut self, next: State) {
        self.stream = None;
        self.state = next;
    }

    /// Reads what has arrived of the response. Interim 1xx responses are skipped; bytes after the
    /// response, which nothing asked for, make the connection unusable for the next request.
    fn read(&mut self, cx: &mut Context<'_>, head_request: bool) -> Read {
        // Bounded: every turn reads more bytes, or returns.
        loop {
            let Some(stream) = &mut self.stream else {
                return Read::Broken;
            };
            let into = match self.state {
                State::Head { filled } => &mut self.buf[filled..],
                _ => &mut self.buf[..],
            };
            // `poll_read`, not `try_read`: a short read tells tokio the socket is drained, so the
            // next response is waited for without a read that fails with `EAGAIN` first.
            let mut into = ReadBuf::new(into);
            let n = match Pin::new(stream).poll_read(cx, &mut into) {
                Poll::Ready(Ok(())) => into.filled().len(),
                Poll::Ready(Err(_)) => return Read::Broken,
                Poll::Pending => return Read::Pending,
            };
            self.bytes += n as u64;
            let done = match &mut self.state {
                State::Head { filled } => {
                    if n == 0 {
                        return Read::Broken;
                    }
                    *filled += n;
                    let filled = *filled;
                    self.on_head_bytes(filled, head_request)
                }
                State::Body {
                    decoder,
                    status,
                    keep_alive,
                    pinlb_ns,
                } => {
                    if n == 0 {
                        if *decoder == BodyDecoder::UntilClose {
                            return Read::Response {
                                status: *status,
                                keep_alive: false,
                                pinlb_ns: *pinlb_ns,
                            };
                        }
                        return Read::Broken;
                    }
                    match decoder.feed(&self.buf[..n]) {
                        Ok(fed) if fed.done => Some(Read::Response {
                            status: *status,
                            keep_alive: *keep_alive && fed.used == n,
                            pinlb_ns: *pinlb_ns,
                        }),
                        Ok(_) => None,
                        Err(_) => Some(Read::Broken),
                    }
                }
                // Bytes after the echo, which nothing asked for, make the connection unusable.
                State::Echo(echo) => {
                    if n == 0 {
                        return Read::Broken;
                    }
                    match echo.feed(&self.buf[..n]) {
                        Ok(fed) if fed.done => Some(Read::Echo {
                            keep_alive: fed.used == n,
                        }),
                        Ok(_) => None,
                        Err(_) => Some(Read::Broken),
                    }
                }
                _ => Some(Read::Broken),
            };
            if let Some(r) = done {
                return r;
            }
        }
    }

    /// Parses the head in `buf[..filled]`; moves on to the body once it is complete. `Some` when
    /// the exchange is over.
    fn on_head_bytes(&mut self, mut filled: usize, head_request: bool) -> Option<Read> {
        // Bounded: each turn drops an interim response from the buffer.
        loop {
            let head = match parse_head(&self.buf[..filled], head_request) {
                Ok(Some(h)) => h,
                Ok(None) if filled == self.buf.len() => return Some(Read::Broken),
                Ok(None) => {
                    self.state = State::Head { filled };
                    return None;
                }
                Err(_) => return Some(Read::Broken),
            };
            if head.is_interim() {
                self.buf.copy_within(head.len..filled, 0);
                filled -= head.len;
                if filled == 0 {
                    self.state = State::Head { filled };
                    return None;
                }
                continue;
            }
            let mut decoder = head.body;
            let rest = filled - head.len;
            return match decoder.feed(&self.buf[head.len..filled]) {
                Ok(fed) if fed.done => Some(Read::Response {
                    status: head.status,
                    keep_alive: head.keep_alive && fed.used == rest,
                    pinlb_ns: head.pinlb_ns,
                }),
                Ok(_) => {
                    self.state = State::Body {
                        decoder,
                        status: head.status,
                        keep_alive: head.keep_alive,
                        pinlb_ns: head.pinlb_ns,
                    };
                    None
                }
                Err(_) => Some(Read::Broken),
            };
        }
    }
}
