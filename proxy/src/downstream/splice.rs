//! One direction of a relay moved by the kernel: `splice(2)` from one TCP socket into a pipe
//! and from the pipe into the other socket, so that the bytes are never copied to user space
//! (HAProxy's `option splice-auto`). It pays for bulk transfers, where each read fills the
//! tunnel's buffer; for small exchanges (a Redis command and its reply) it costs a pipe and the
//! same system calls, so the tunnel starts every direction with buffers and moves one here
//! after a read that filled its buffer (`downstream::tunnel`).

use std::io;
use std::os::fd::OwnedFd;
use std::task::{Context, Poll, ready};

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most one splice asks to move: a pipe's default capacity (16 pages).
const CHUNK: usize = 64 * 1024;

/// Splices per poll before the relay yields, as the buffered path's passes.
const PASSES: usize = 16;

/// The most pipes a worker holds at once (two descriptors each, beyond the two of each
/// connection that `limits.max_connections` is sized by): past it, bulk directions stay
/// buffered (HAProxy's `maxpipes`).
pub const MAX_PIPES: usize = 256;

thread_local! {
    /// This worker's pipes now.
    static PIPES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A pipe between the two sockets, and the bytes it holds.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
}

impl Pipe {
    /// A new, empty pipe; `None` when the worker holds [`MAX_PIPES`] already or none can be
    /// made (out of descriptors): the direction stays buffered.
    pub fn new() -> Option<Pipe> {
        if PIPES.get() >= MAX_PIPES {
            return None;
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        PIPES.set(PIPES.get() + 1);
        Some(Pipe {
            read,
            write,
            held: 0,
        })
    }

    /// Moves what it can from `from` to `to`, adding the bytes written to `moved`. Ready with
    /// `true` at `from`'s end of stream (the pipe drained to `to` first), with `false` when
    /// it has moved its share for this poll.
    pub fn poll_move(
        &mut self,
        cx: &mut Context<'_>,
        from: &TcpStream,
        to: &TcpStream,
        moved: &mut u64,
    ) -> Poll<io::Result<bool>> {
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        for _ in 0..PASSES {
            // Bounded: every pass moves a byte out of the pipe, or waits.
            while self.held > 0 {
                ready!(to.poll_write_ready(cx))?;
                let out = to.try_io(Interest::WRITABLE, || {
                    splice(&self.read, None, to, None, self.held, flags).map_err(io::Error::from)
                });
                match out {
                    Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Ok(n) => {
                        self.held -= n;
                        *moved += n as u64;
                    }
                    // The socket's buffer is full: its readiness is cleared, and the next
                    // pass waits for room.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            ready!(from.poll_read_ready(cx))?;
            // The pipe is empty, so a would-block is the socket's: nothing to read yet.
            let got = from.try_io(Interest::READABLE, || {
                splice(from, None, &self.write, None, CHUNK, flags).map_err(io::Error::from)
            });
            match got {
                Ok(0) => return Poll::Ready(Ok(true)),
                Ok(n) => self.held = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(false))
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        PIPES.set(PIPES.get().saturating_sub(1));
    }
}
