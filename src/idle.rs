//! Closing idle client connections (`timeouts.client_idle`) without a timer per request.
//!
//! hyper's own header read timeout would do it, but it arms a new boxed timer for every request
//! head, which was about a tenth of pinlb's user-space instructions per request. Instead each
//! connection counts its reads and writes, and a watchdog per connection wakes four times per
//! `client_idle`: a connection with no request in flight and no bytes moved for four checks in a
//! row has been idle for at least `client_idle` (and at most 1.25× that) and is closed. A request
//! waiting on a slow backend keeps its connection open, however quiet it is.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::rt::{Read, ReadBufCursor, Write};

/// What the watchdog looks at for one client connection.
#[derive(Debug, Default)]
pub struct Activity {
    /// Bumped on every completed read or write.
    events: Cell<u64>,
    /// Requests whose response hasn't been fully written.
    in_flight: Cell<u32>,
}

impl Activity {
    fn bump(&self) {
        self.events.set(self.events.get().wrapping_add(1));
    }

    /// Marks a request in flight until the returned guard is dropped.
    pub fn request(self: &Rc<Self>) -> Active {
        self.in_flight.set(self.in_flight.get() + 1);
        Active(self.clone())
    }
}

/// Holds a request in flight; travels with the response body.
#[derive(Debug)]
pub struct Active(Rc<Activity>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0
            .in_flight
            .set(self.0.in_flight.get().saturating_sub(1));
    }
}

/// Completes once the connection has been idle for `idle`.
pub async fn watchdog(activity: Rc<Activity>, idle: Duration) {
    const CHECKS: u32 = 4;
    // Config validation rejects 0; the floor keeps a tiny value from spinning anyway.
    let period = (idle / CHECKS).max(Duration::from_millis(1));
    let mut seen = activity.events.get();
    let mut quiet = 0;
    loop {
        tokio::time::sleep(period).await;
        let now = activity.events.get();
        if now != seen || activity.in_flight.get() > 0 {
            seen = now;
            quiet = 0;
            continue;
        }
        quiet += 1;
        if quiet >= CHECKS {
            return;
        }
    }
}

/// A client connection's I/O that reports each completed read and write to [`Activity`].
pub struct TrackedIo<T> {
    inner: T,
    activity: Rc<Activity>,
}

impl<T> TrackedIo<T> {
    pub fn new(inner: T, activity: Rc<Activity>) -> Self {
        TrackedIo { inner, activity }
    }
}

impl<T: Read + Unpin> Read for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if polled.is_ready() {
            self.activity.bump();
        }
        polled
    }
}

impl<T: Write + Unpin> Write for TrackedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<Result<usize, std::io::Error>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if polled.is_ready() {
            self.activity.bump();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<Result<usize, std::io::Error>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if polled.is_ready() {
            self.activity.bump();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), std::io::Error>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), std::io::Error>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A response body that keeps its request counted in flight until hyper is done with it.
pub struct TrackedBody<B> {
    body: B,
    _active: Active,
}

impl<B> TrackedBody<B> {
    pub fn new(body: B, active: Active) -> Self {
        TrackedBody {
            body,
            _active: active,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for TrackedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_idle_after_the_timeout_and_not_before() {
        let activity = Rc::new(Activity::default());
        let start = tokio::time::Instant::now();
        watchdog(activity, Duration::from_secs(60)).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(60) && took <= Duration::from_secs(75),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_the_connection_open() {
        let activity = Rc::new(Activity::default());
        let active = activity.request();
        let dog = tokio::time::timeout(
            Duration::from_secs(600),
            watchdog(activity.clone(), Duration::from_secs(60)),
        );
        assert!(
            dog.await.is_err(),
            "the watchdog fired with a request in flight"
        );
        drop(active);
        let start = tokio::time::Instant::now();
        watchdog(activity, Duration::from_secs(60)).await;
        assert!(start.elapsed() >= Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_restarts_the_count() {
        let activity = Rc::new(Activity::default());
        let a = activity.clone();
        let start = tokio::time::Instant::now();
        let dog = watchdog(activity, Duration::from_secs(60));
        let traffic = async move {
            // Bytes move every 10 s for the first 100 s.
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(10)).await;
                a.bump();
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = dog => {}
            _ = traffic => {}
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(160) && took <= Duration::from_secs(180),
            "{took:?}"
        );
    }
}
