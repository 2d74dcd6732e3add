//! Closing idle client connections (`timeouts.client_idle`) without a timer per request.
//!
//! hyper's own header read timeout would do it, but it arms a new boxed timer for every request
//! head, which was about a tenth of pinlb's user-space instructions per request. Instead each
//! connection counts its reads and writes, and a watchdog per connection wakes four times per
//! `client_idle`: a connection with no request in flight and no bytes moved for four checks in a
//! row has been idle for at least `client_idle` (and at most 1.25× that) and is closed. A request
//! waiting on a slow backend keeps its connection open, however quiet it is.
//!
//! The same watchdog enforces `limits.header_timeout` against clients that trickle a request
//! head (slowloris), which the idle check cannot see: their bytes keep moving. The head clock
//! starts at the accept for a connection's first request and at the first byte read after a
//! response for later ones; one clock read per request, no timer. hyper's own header read timeout
//! would not do: it also runs while a keep-alive connection waits for its next request (so it
//! would cut `client_idle` short), and it closes without a response. Here a late head gets
//! `408 Request Timeout`, written by [`TrackedIo`] on hyper's next read, which then sees the end
//! of the stream and closes.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hyper::rt::{Read, ReadBufCursor, Write};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the watchdog looks at for one client connection.
#[derive(Default)]
pub struct Activity {
    /// Bumped on every completed read or write.
    events: Cell<u64>,
    /// Requests whose response hasn't been fully written.
    in_flight: Cell<u32>,
    /// When the request head now arriving began; `None` while a request is in flight or a
    /// keep-alive connection waits for its next one.
    head_since: Cell<Option<Instant>>,
    /// Whether any byte of that head has arrived: a connection that never sent one is closed
    /// without an answer, as nginx does.
    head_bytes: Cell<bool>,
    /// Set by the watchdog once the head is late: the next read answers 408 and ends the stream.
    head_expired: Cell<bool>,
    /// The connection's task, remembered on each of its polls, so that the watchdog (another
    /// task) can make hyper read once more and answer 408, or see a stop.
    task: Cell<Option<Waker>>,
    /// The worker is stopping: the connection finishes its request in flight and closes.
    draining: Cell<bool>,
}

impl Activity {
    /// A freshly accepted connection: the clock for its first request head runs from now.
    pub fn accepted() -> Self {
        let a = Activity::default();
        a.head_since.set(Some(Instant::now()));
        a
    }

    fn bump(&self) {
        self.events.set(self.events.get().wrapping_add(1));
    }

    /// Idle between requests: nothing in flight and no part of a next head arrived. Such a
    /// connection can be closed to make room without cutting anything off.
    fn is_idle(&self) -> bool {
        self.in_flight.get() == 0 && !self.head_bytes.get()
    }

    /// Asks the connection to close once no request is in flight, and wakes its task to see
    /// that.
    pub fn drain(&self) {
        self.draining.set(true);
        self.wake();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Remembers the connection's task; called on every poll of it, and costs a clone only
    /// when the task is a new one (never, for a task that stays the same).
    pub fn remember(&self, waker: &Waker) {
        match self.task.take() {
            Some(w) if w.will_wake(waker) => self.task.set(Some(w)),
            _ => self.task.set(Some(waker.clone())),
        }
    }

    /// Wakes the connection's task: hyper then polls its reader, which answers 408 when
    /// `head_expired` is set, and the task sees `draining`.
    pub fn wake(&self) {
        if let Some(waker) = self.task.take() {
            waker.wake();
        }
    }

    /// Marks a request in flight until the returned guard is dropped.
    pub fn request(self: &Rc<Self>) -> Active {
        self.in_flight.set(self.in_flight.get() + 1);
        self.head_since.set(None);
        self.head_bytes.set(false);
        Active(self.clone())
    }

    /// A read completed while no request is in flight: part of the next request head (or the
    /// end of the stream, which ends the connection anyway).
    fn head_read(&self) {
        if self.head_since.get().is_none() {
            self.head_since.set(Some(Instant::now()));
        }
        self.head_bytes.set(true);
    }
}

/// Why [`watchdog`] gave up on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Nothing moved for `client_idle`.
    Idle,
    /// The process is at `limits.max_connections` and this connection was idle: it makes room.
    Pressure,
    /// No complete request head within `header_timeout`; `bytes` says whether any of it came.
    /// When it did, the connection's next read answers 408.
    Head { bytes: bool },
}

/// Holds a request in flight; travels with the response body.
pub struct Active(Rc<Activity>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0
            .in_flight
            .set(self.0.in_flight.get().saturating_sub(1));
    }
}

/// Completes once the connection has been idle for `idle`, or a request head has taken longer
/// than `head` to arrive, or `pressure` is notified (the process is out of connections) while the
/// connection is idle.
pub async fn watchdog(
    activity: Rc<Activity>,
    idle: Duration,
    head: Duration,
    pressure: &Notify,
) -> Expired {
    const CHECKS: u32 = 4;
    // Config validation rejects 0; the floor keeps a tiny value from spinning anyway.
    let period = (idle.min(head) / CHECKS).max(Duration::from_millis(1));
    // Quiet checks in a row that add up to at least `idle`.
    let needed = u32::try_from(idle.as_nanos().div_ceil(period.as_nanos())).unwrap_or(u32::MAX);
    let mut seen = activity.events.get();
    let mut quiet = 0;
    loop {
        // The tick keeps its deadline across notifications: pressure that goes on must not
        // postpone the idle and head checks of a busy connection.
        let tick = tokio::time::sleep(period);
        tokio::pin!(tick);
        loop {
            tokio::select! {
                () = &mut tick => break,
                () = pressure.notified() => {
                    if activity.is_idle() {
                        return Expired::Pressure;
                    }
                }
            }
        }
        if let Some(since) = activity.head_since.get() {
            let deadline = since + head;
            // Due before the next check: wait for it exactly, so a late head is answered at
            // `head`, not up to a period later.
            if activity.in_flight.get() == 0 && deadline <= Instant::now() + period {
                tokio::time::sleep_until(deadline).await;
                if activity.head_since.get() == Some(since) && activity.in_flight.get() == 0 {
                    let bytes = activity.head_bytes.get();
                    activity.head_expired.set(bytes);
                    return Expired::Head { bytes };
                }
            }
        }
        let now = activity.events.get();
        if now != seen || activity.in_flight.get() > 0 {
            seen = now;
            quiet = 0;
            continue;
        }
        quiet += 1;
        if quiet >= needed {
            return Expired::Idle;
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

/// What a client whose request head came too late gets. Written by pinlb, not hyper: hyper
/// has no response for its own header timeout.
const REQUEST_TIMEOUT: &[u8] = b"HTTP/1.1 408 Request Timeout\r\n\
content-type: text/plain; charset=utf-8\r\n\
content-length: 75\r\n\
connection: close\r\n\
\r\n\
408 Request Timeout: no complete request head within limits.header_timeout\n";

impl<T: Read + Write + Unpin> Read for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.activity.head_expired.replace(false) {
            // hyper is waiting for the rest of a head and has written nothing since its last
            // response, so the answer can go straight onto the socket. Best effort: the socket
            // buffer is empty, and a client too slow to take 130 bytes gets only the close.
            let _ = Pin::new(&mut self.inner).poll_write(cx, REQUEST_TIMEOUT);
            // The end of the stream: hyper drops the partial head and closes.
            return Poll::Ready(Ok(()));
        }
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if polled.is_ready() {
            self.activity.bump();
            if self.activity.in_flight.get() == 0 {
                self.activity.head_read();
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Duration = Duration::from_secs(10);

    #[test]
    fn the_408_says_its_own_length() {
        let text = String::from_utf8_lossy(REQUEST_TIMEOUT);
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_head_expires_at_the_header_timeout_however_busy() {
        let activity = Rc::new(Activity::accepted());
        let a = activity.clone();
        let start = Instant::now();
        let pressure = Notify::new();
        let dog = watchdog(activity.clone(), Duration::from_secs(60), HEAD, &pressure);
        let trickle = async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                a.bump();
                a.head_read();
            }
        };
        let expired = tokio::select! {
            e = dog => e,
            () = trickle => unreachable!(),
        };
        assert_eq!(expired, Expired::Head { bytes: true });
        assert_eq!(start.elapsed(), HEAD);
        assert!(activity.head_expired.get(), "the next read must answer 408");
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_is_closed_at_the_header_timeout_without_an_answer() {
        let activity = Rc::new(Activity::accepted());
        let expired = watchdog(
            activity.clone(),
            Duration::from_secs(60),
            HEAD,
            &Notify::new(),
        )
        .await;
        assert_eq!(expired, Expired::Head { bytes: false });
        assert!(!activity.head_expired.get());
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_alive_connection_between_requests_waits_for_client_idle_not_the_head_clock() {
        let activity = Rc::new(Activity::accepted());
        drop(activity.request());
        let start = Instant::now();
        let expired = watchdog(activity, Duration::from_secs(60), HEAD, &Notify::new()).await;
        assert_eq!(expired, Expired::Idle);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(60) && took <= Duration::from_secs(63),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_idle_after_the_timeout_and_not_before() {
        let activity = Rc::new(Activity::default());
        let start = tokio::time::Instant::now();
        assert_eq!(
            watchdog(activity, Duration::from_secs(60), HEAD, &Notify::new()).await,
            Expired::Idle
        );
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
        let pressure = Notify::new();
        let dog = tokio::time::timeout(
            Duration::from_secs(600),
            watchdog(activity.clone(), Duration::from_secs(60), HEAD, &pressure),
        );
        assert!(
            dog.await.is_err(),
            "the watchdog fired with a request in flight"
        );
        drop(active);
        let start = tokio::time::Instant::now();
        watchdog(activity, Duration::from_secs(60), HEAD, &Notify::new()).await;
        assert!(start.elapsed() >= Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_restarts_the_count() {
        let activity = Rc::new(Activity::default());
        let a = activity.clone();
        let start = tokio::time::Instant::now();
        let pressure = Notify::new();
        let dog = watchdog(activity, Duration::from_secs(60), HEAD, &pressure);
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

    #[tokio::test(start_paused = true)]
    async fn under_pressure_an_idle_connection_makes_room_and_a_busy_one_does_not() {
        let pressure = Notify::new();
        let idle = Rc::new(Activity::default());
        let busy = Rc::new(Activity::default());
        let _request = busy.request();
        let idle_dog = watchdog(idle, Duration::from_secs(60), HEAD, &pressure);
        let busy_dog = watchdog(busy, Duration::from_secs(60), HEAD, &pressure);
        tokio::pin!(idle_dog, busy_dog);
        // Let both register, then announce the pressure.
        tokio::task::yield_now().await;
        assert!(futures_poll(idle_dog.as_mut()).is_none());
        assert!(futures_poll(busy_dog.as_mut()).is_none());
        pressure.notify_waiters();
        assert_eq!(futures_poll(idle_dog.as_mut()), Some(Expired::Pressure));
        assert!(futures_poll(busy_dog.as_mut()).is_none());
    }

    /// Polls a future once with a no-op waker.
    fn futures_poll<F: std::future::Future>(f: Pin<&mut F>) -> Option<F::Output> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match f.poll(&mut cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }
}
