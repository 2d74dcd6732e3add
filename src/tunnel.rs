//! A tunnel: after a `101 Switching Protocols` (a WebSocket, most often), the client and backend
//! connections relay bytes both ways until both are done.
//!
//! Generic over the two streams (`AsyncRead + AsyncWrite`), so that a client connection over TLS
//! relays the same way as a plain one. Each direction has one fixed buffer: a side that stops
//! reading stops the other side's reads too (TCP's own flow control then pushes back on the
//! sender), and a tunnel never holds more than [`BUFFER`] per direction. Both directions are
//! polled from one task, so the tunnel costs one task, two buffers and one timer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

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

/// One direction: read from one side into the buffer, write the buffer to the other.
struct Half {
    buf: Box<[u8]>,
    /// The part of `buf` still to write.
    start: usize,
    end: usize,
    /// The reading side has closed its sending half.
    eof: bool,
    /// The end of stream was passed on: this direction is done.
    done: bool,
    total: u64,
}

impl Half {
    /// A direction whose first bytes (read before the switch) are `early`; the buffer is
    /// `BUFFER`, or larger to hold them all at once.
    fn new(early: &[u8]) -> Half {
        let mut buf = vec![0u8; BUFFER.max(early.len())].into_boxed_slice();
        buf[..early.len()].copy_from_slice(early);
        Half {
            buf,
            start: 0,
            end: early.len(),
            eof: false,
            done: false,
            total: 0,
        }
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
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        // Bounded by `PASSES`: every pass reads or writes something, or returns.
        for _ in 0..PASSES {
            // Bounded: every pass writes at least one byte, or returns.
            while self.start < self.end {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &self.buf[self.start..self.end]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += n;
                self.total += n as u64;
                *moved += n as u64;
            }
            // Nothing for a plain socket; a TLS stream sends what it holds.
            ready!(Pin::new(&mut *to).poll_flush(cx))?;
            self.start = 0;
            self.end = 0;
            if self.eof {
                // The half-close goes on: the other side sees the end of stream and may still
                // answer. An error here is a peer already gone, which the other direction
                // finds out for itself.
                let _ = ready!(Pin::new(&mut *to).poll_shutdown(cx));
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut self.buf);
            ready!(Pin::new(&mut *from).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                self.eof = true;
            } else {
                self.end = n;
            }
        }
        // Out of passes with more to move: come back after the worker's other tasks.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Relays between `client` and `backend` until both directions are done, one fails, or no byte
/// moves for `idle`. `client_early` and `backend_early`
/// are bytes each side sent before the switch was complete, which go first. `count` hears of
/// the bytes as they move, for counters that must not wait for the close.
pub async fn relay<C, B>(
    client: &mut C,
    backend: &mut B,
    client_early: &[u8],
    backend_early: &[u8],
    idle: Duration,
    mut count: impl FnMut(Dir, u64),
) -> Relayed
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut up = Half::new(client_early);
    let mut down = Half::new(backend_early);
    let now = Instant::now();
    // A timeout too large to add is as good as none.
    let far = |from: Instant| {
        from.checked_add(idle)
            .unwrap_or_else(|| from + Duration::from_secs(86_400 * 365 * 30))
    };
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
            deadline = far(Instant::now());
        }
        match (polled_up, polled_down) {
            (Poll::Ready(Err(e)), _) => return Poll::Ready(End::Failed(Dir::Up, e)),
            (_, Poll::Ready(Err(e))) => return Poll::Ready(End::Failed(Dir::Down, e)),
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => return Poll::Ready(End::Closed),
            _ => {}
        }
        // Bounded: a reset moves the deadline later, so the next poll of the timer is
        // Pending, or the deadline has passed and the tunnel ends.
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                return Poll::Ready(End::Idle);
            }
            timer.as_mut().reset(deadline);
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
