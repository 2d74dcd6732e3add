//! A tunnel: after a `101 Switching Protocols` (a WebSocket, most often), the client and backend
//! connections relay bytes both ways until both are done.
//!
//! Generic over the two streams (`AsyncRead + AsyncWrite`), so that a client connection over TLS
//! relays the same way as a plain one. Each direction has one fixed buffer: a side that stops
//! reading stops the other side's reads too (TCP's own flow control then pushes back on the
//! sender), and a tunnel never holds more than [`BUFFER`] per direction. Both directions are
//! polled from one task, so the tunnel costs one task, two buffers and one timer.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::downstream::splice::Pipe;
use crate::downstream::stream::{DownstreamStream, StreamIo};
use crate::http1::client::BackendStream;

/// The most each direction holds: what one read takes in before it is written out.
pub const BUFFER: usize = 16 * 1024;

/// Reads per direction per poll before the tunnel yields, so that a fast pair of peers cannot
/// keep the worker from its other connections.
const PASSES: usize = 16;

/// Which way bytes went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// From the client to the backend.
    Up = 0,
    /// From the backend to the client.
    Down = 1,
}

/// How a tunnel ended.
#[derive(Debug)]
pub enum End {
    /// Both sides closed their sending half, and everything was passed on.
    Closed,
    /// No byte moved either way for the idle timeout.
    Idle,
    /// This direction's sender closed its half, passed on, and the other side did not close
    /// its own within the fin timeout.
    HalfClosed(Dir),
    /// A read or write failed (a reset, most often): the tunnel is cut.
    Failed(Dir, io::Error),
}

/// What a tunnel carried, and how it ended.
#[derive(Debug)]
pub struct Relayed {
    /// Bytes from the client to the backend.
    pub up: u64,
    /// Bytes from the backend to the client.
    pub down: u64,
    pub end: End,
}

thread_local! {
    /// The worker's read buffer for every tunnel's reads: what the other side takes at once is
    /// never copied, so an idle tunnel, or one whose peers keep up, holds no buffer of its own.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A side of a tunnel whose bytes `splice(2)` can move: its TCP socket, when it is a plain one.
pub trait Spliceable {
    fn plain_tcp(&self) -> Option<&tokio::net::TcpStream>;
}

impl<S: std::borrow::Borrow<DownstreamStream> + Unpin> Spliceable for StreamIo<S> {
    fn plain_tcp(&self) -> Option<&tokio::net::TcpStream> {
        match self.0.borrow() {
            DownstreamStream::Plain(s) => Some(s),
            DownstreamStream::Tls(_) => None,
        }
    }
}

impl Spliceable for BackendStream {
    fn plain_tcp(&self) -> Option<&tokio::net::TcpStream> {
        match self {
            BackendStream::Plain(s) => Some(s),
            _ => None,
        }
    }
}

/// One direction: read from one side into the worker's scratch buffer and write that to the
/// other; only the bytes the other side does not take at once are kept, in a buffer of this
/// direction's own that is given back once they are written. With splicing allowed, a read
/// that fills the buffer moves the direction to a pipe (`downstream::splice`) for good: the
/// transfer is a bulk one.
struct Half {
    /// Bytes read but not yet written (from `start`); no allocation while there are none.
    pending: Vec<u8>,
    start: usize,
    /// The reading side has closed its sending half.
    eof: bool,
    /// The end of stream was passed on: this direction is done.
    done: bool,
    total: u64,
    /// Whether this direction may move to a pipe (both sides plain TCP, and the caller asks).
    splice: bool,
    /// A read filled the buffer: the next pass moves the direction to a pipe.
    bulk: bool,
    /// Once moved: the pipe its bytes go through.
    pipe: Option<Pipe>,
}

impl Half {
    /// A direction whose first bytes (read before the switch) are `early`.
    fn new(early: &[u8], splice: bool) -> Half {
        Half {
            pending: early.to_vec(),
            start: 0,
            eof: false,
            done: false,
            total: 0,
            splice,
            bulk: false,
            pipe: None,
        }
    }

    /// The spliced direction's poll: ready once the end of stream is passed on.
    #[cold]
    fn poll_pipe<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        (from, to): (&mut R, &mut W),
        moved: &mut u64,
    ) -> Poll<io::Result<()>>
    where
        R: Spliceable,
        W: AsyncWrite + Spliceable + Unpin,
    {
        let (Some(pipe), Some(r), Some(w)) = (&mut self.pipe, from.plain_tcp(), to.plain_tcp())
        else {
            return Poll::Ready(Err(io::Error::other("a spliced side is no plain socket")));
        };
        // Counted whether or not the poll completes: it may move bytes, then wait.
        let mut n = 0;
        let polled = pipe.poll_move(cx, r, w, &mut n);
        self.total += n;
        *moved += n;
        let eof = ready!(polled)?;
        if !eof {
            // Its share moved: back after the worker's other tasks.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let _ = ready!(Pin::new(&mut *to).poll_shutdown(cx));
        self.done = true;
        Poll::Ready(Ok(()))
    }

    /// Moves what it can from `from` to `to`, adding the bytes written to `moved`. Ready once
    /// the direction is done (the end of stream passed on as a shutdown of `to`'s writing
    /// half), or failed.
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        moved: &mut u64,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Spliceable + Unpin,
        W: AsyncWrite + Spliceable + Unpin,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        if self.pipe.is_some() {
            return self.poll_pipe(cx, (from, to), moved);
        }
        // Bounded by `PASSES`: every pass reads or writes something, or returns.
        for _ in 0..PASSES {
            // Bounded: every pass writes at least one byte, or returns.
            while self.start < self.pending.len() {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &self.pending[self.start..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += n;
                self.total += n as u64;
                *moved += n as u64;
            }
            if self.pending.capacity() > 0 {
                // Drained: the buffer goes back.
                self.pending = Vec::new();
                self.start = 0;
            }
            if self.bulk && !self.eof {
                self.bulk = false;
                self.pipe = Pipe::new();
                if self.pipe.is_some() {
                    return self.poll_pipe(cx, (from, to), moved);
                }
            }
            // Nothing for a plain socket; a TLS stream sends what it holds.
            ready!(Pin::new(&mut *to).poll_flush(cx))?;
            if self.eof {
                // The half-close goes on: the other side sees the end of stream and may still
                // answer. An error here is a peer already gone, which the other direction
                // finds out for itself.
                let _ = ready!(Pin::new(&mut *to).poll_shutdown(cx));
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            ready!(SCRATCH.with(|scratch| {
                // Taken by a tunnel polled inside another's poll, which none is: then a buffer
                // of its own for this read.
                let mut own = Vec::new();
                let mut borrowed = scratch.try_borrow_mut();
                let buf = match borrowed.as_deref_mut() {
                    Ok(b) => b,
                    Err(_) => &mut own,
                };
                if buf.len() < BUFFER {
                    buf.resize(BUFFER, 0);
                }
                self.read_and_pass(cx, from, to, moved, buf)
            }))?;
        }
        // Out of passes with more to move: come back after the worker's other tasks.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// One read into `buf`, written on at once as far as `to` takes it; the rest is kept in
    /// `pending`.
    fn read_and_pass<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        moved: &mut u64,
        buf: &mut [u8],
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let n = {
            let mut rb = ReadBuf::new(buf);
            ready!(Pin::new(&mut *from).poll_read(cx, &mut rb))?;
            rb.filled().len()
        };
        if n == 0 {
            self.eof = true;
            return Poll::Ready(Ok(()));
        }
        self.bulk = self.splice && n == buf.len();
        let mut off = 0;
        // Bounded: every pass writes at least one byte, or stops.
        while off < n {
            match Pin::new(&mut *to).poll_write(cx, &buf[off..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(w)) => {
                    off += w;
                    self.total += w as u64;
                    *moved += w as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // Woken when `to` has room; the rest waits in `pending` until then.
                Poll::Pending => break,
            }
        }
        if off < n {
            self.pending = buf[off..n].to_vec();
            self.start = 0;
        }
        Poll::Ready(Ok(()))
    }
}

/// How long a tunnel may wait: for any byte (`idle`), and, once one side has closed its
/// sending half, for the other to close its own (`fin`); and whether a direction whose reads
/// fill the buffer may move to `splice(2)` when both sides are plain TCP (`splice`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub idle: Duration,
    pub fin: Duration,
    pub splice: bool,
}

/// Relays between `client` and `backend` until both directions are done, one fails, no byte
/// moves for `limits.idle`, or one side stays open `limits.fin` after the other closed.
/// `client_early` and `backend_early` are bytes each side sent before the switch was complete,
/// which go first. `count` hears of the bytes as they move, for counters that must not wait for
/// the close.
pub async fn relay<C, B>(
    client: &mut C,
    backend: &mut B,
    client_early: BytesMut,
    backend_early: BytesMut,
    limits: Limits,
    mut count: impl FnMut(Dir, u64),
) -> Relayed
where
    C: AsyncRead + AsyncWrite + Spliceable + Unpin,
    B: AsyncRead + AsyncWrite + Spliceable + Unpin,
{
    let splice = limits.splice && client.plain_tcp().is_some() && backend.plain_tcp().is_some();
    let mut up = Half::new(&client_early, splice);
    let mut down = Half::new(&backend_early, splice);
    // Copied: the connections' read buffers go back now, not when the tunnel closes.
    drop((client_early, backend_early));
    let now = Instant::now();
    // A timeout too large to add is as good as none.
    let after = |from: Instant, d: Duration| {
        from.checked_add(d)
            .unwrap_or_else(|| from + Duration::from_secs(86_400 * 365 * 30))
    };
    let far = |from: Instant| after(from, limits.idle);
    // Set once, when the first direction is done: the other's fin deadline.
    let mut half_closed: Option<(Dir, Instant)> = None;
    // One timer for the tunnel's life. Moving bytes only moves `deadline`; the timer catches up
    // when it fires, so a busy tunnel touches the timer wheel once per `idle`, not per read.
    let mut deadline = far(now);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
    let end = std::future::poll_fn(|cx| {
        let (mut went_up, mut went_down) = (0, 0);
        let polled_up = up.poll(cx, client, backend, &mut went_up);
        let polled_down = down.poll(cx, backend, client, &mut went_down);
        if went_up > 0 {
            count(Dir::Up, went_up);
        }
        if went_down > 0 {
            count(Dir::Down, went_down);
        }
        if went_up + went_down > 0 {
            let now = Instant::now();
            deadline = far(now);
            // Once one side has closed, `fin` bounds the other's silence, not its whole
            // answer (HAProxy's client-fin and server-fin): bytes still moving keep it open.
            if let Some((dir, _)) = half_closed {
                half_closed = Some((dir, after(now, limits.fin)));
            }
        }
        let closed = match (polled_up, polled_down) {
            (Poll::Ready(Err(e)), _) => return Poll::Ready(End::Failed(Dir::Up, e)),
            (_, Poll::Ready(Err(e))) => return Poll::Ready(End::Failed(Dir::Down, e)),
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => return Poll::Ready(End::Closed),
            (Poll::Ready(Ok(())), _) => Some(Dir::Up),
            (_, Poll::Ready(Ok(()))) => Some(Dir::Down),
            _ => None,
        };
        if let (None, Some(dir)) = (half_closed, closed) {
            half_closed = Some((dir, after(Instant::now(), limits.fin)));
        }
        // The nearer of the two deadlines; which one it was, for the end.
        let (due, end) = match half_closed {
            Some((dir, fin)) if fin < deadline => (fin, End::HalfClosed(dir)),
            _ => (deadline, End::Idle),
        };
        // Bounded: a reset moves the timer to `due`, so the next poll of the timer is Pending,
        // or `due` has passed and the tunnel ends.
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= due {
                return Poll::Ready(end);
            }
            timer.as_mut().reset(due);
        }
        // An earlier deadline than the timer's (a fin deadline just set) needs it moved back.
        if due < timer.deadline() {
            timer.as_mut().reset(due);
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(end);
            }
        }
        Poll::Pending
    })
    .await;
    Relayed {
        up: up.total,
        down: down.total,
        end,
    }
}
