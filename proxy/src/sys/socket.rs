//! The plain path's socket reads and writes, made as system calls of their own.
//!
//! A plain request takes four socket calls (the client's request in, the request out to the
//! backend, its response in, the response out). Through std or tokio each goes by libc's
//! `recv`/`send`/`writev`, and libc wraps every one as a thread cancellation point: two atomic
//! read-modify-writes of the thread's cancel state around each call, which pinlb's threads
//! never use. rustix makes the same calls straight to the kernel. The readiness handling stays
//! tokio's: each call runs inside [`TcpStream::try_io`], which clears the socket's readiness
//! when the call says it would block.

use std::io::{self, IoSlice};
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use rustix::net::{RecvFlags, SendFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Reads what the socket has into the spare room of `buf`.
///
/// A short read has emptied the socket, so the socket's readiness is cleared then, as tokio's
/// own `poll_read` does: the next wait goes straight to the reactor instead of first making a
/// read that fails with EAGAIN.
#[inline]
pub(crate) fn poll_read_tcp(
    stream: &TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(stream.poll_read_ready(cx))?;
        let spare = buf.spare_capacity_mut();
        let room = spare.len();
        let mut got = 0;
        let read = stream.try_io(Interest::READABLE, || {
            let ((filled, _), _) = rustix::net::recv(stream, &mut *spare, RecvFlags::empty())?;
            got = filled.len();
            if got > 0 && got < room {
                // Reported to tokio as "would block" so that it clears the readiness; `got`
                // carries the bytes out.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(got)
        });
        match read {
            Ok(_) | Err(_) if got > 0 => {
                // SAFETY: `recv` initialised the first `got` bytes of the spare capacity (rustix
                // hands them back as `filled`, a slice of exactly that length).
                unsafe { buf.set_len(buf.len() + got) };
                return Poll::Ready(Ok(got));
            }
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// Writes what of `data` the socket takes now, as [`TcpStream::try_write`] does. No SIGPIPE
/// either way (`MSG_NOSIGNAL`, as std sends).
#[inline]
pub(crate) fn try_send(stream: &TcpStream, data: &[u8]) -> io::Result<usize> {
    stream.try_io(Interest::WRITABLE, || {
        Ok(rustix::net::send(stream, data, SendFlags::NOSIGNAL)?)
    })
}

/// Writes what of `bufs` the socket takes now, as [`TcpStream::try_write_vectored`] does. The
/// process ignores SIGPIPE (Rust's runtime sets that at start), so `writev` on a closed
/// connection fails with EPIPE as `sendmsg` with `MSG_NOSIGNAL` would.
#[inline]
pub(crate) fn try_writev(stream: &TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    stream.try_io(Interest::WRITABLE, || Ok(rustix::io::writev(stream, bufs)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn reads_what_came_and_waits_for_more() {
        let (mut a, b) = pair().await;
        a.write_all(b"hello").await.unwrap();
        let mut buf = BytesMut::with_capacity(64);
        let n = std::future::poll_fn(|cx| poll_read_tcp(&b, &mut buf, cx))
            .await
            .unwrap();
        assert_eq!((n, &buf[..]), (5, &b"hello"[..]));
        // The short read cleared the readiness: the next read waits for the next bytes.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(poll_read_tcp(&b, &mut buf, &mut cx).is_pending());
        a.write_all(b" world").await.unwrap();
        let n = std::future::poll_fn(|cx| poll_read_tcp(&b, &mut buf, cx))
            .await
            .unwrap();
        assert_eq!((n, &buf[..]), (6, &b"hello world"[..]));
        drop(a);
        let n = std::future::poll_fn(|cx| poll_read_tcp(&b, &mut buf, cx))
            .await
            .unwrap();
        assert_eq!(n, 0, "the peer's close reads as 0");
    }

    #[tokio::test]
    async fn a_full_buffer_read_keeps_reading() {
        let (mut a, b) = pair().await;
        a.write_all(b"0123456789").await.unwrap();
        b.readable().await.unwrap();
        let mut buf = BytesMut::with_capacity(4);
        let room = buf.capacity();
        let n = std::future::poll_fn(|cx| poll_read_tcp(&b, &mut buf, cx))
            .await
            .unwrap();
        assert_eq!(n, room);
        // The readiness stayed: the rest is read without a new event.
        buf.reserve(64);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let Poll::Ready(Ok(more)) = poll_read_tcp(&b, &mut buf, &mut cx) else {
            panic!("the rest was there to read");
        };
        assert_eq!((room + more, &buf[..]), (10, &b"0123456789"[..]));
    }

    #[tokio::test]
    async fn sends_and_writes_vectored() {
        let (a, mut b) = pair().await;
        a.writable().await.unwrap();
        assert_eq!(try_send(&a, b"one ").unwrap(), 4);
        let parts = [IoSlice::new(b"two "), IoSlice::new(b"three")];
        assert_eq!(try_writev(&a, &parts).unwrap(), 9);
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"one two three");
    }

    #[tokio::test]
    async fn a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = pair().await;
        // An RST from the peer: closed with unread bytes in its buffer.
        a.writable().await.unwrap();
        try_send(&a, b"unread").unwrap();
        b.readable().await.unwrap();
        drop(b);
        // Bounded: the RST arrives at once on loopback; a few writes see it.
        let mut failed = None;
        for _ in 0..100 {
            a.writable().await.unwrap();
            match try_writev(&a, &[IoSlice::new(b"more")]) {
                Ok(_) => tokio::task::yield_now().await,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    failed = Some(e.kind());
                    break;
                }
            }
        }
        assert!(
            matches!(
                failed,
                Some(io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset)
            ),
            "{failed:?}"
        );
    }
}
