//! A worker's open client connections: closing the idle ones (`timeouts.client_idle`, and
//! `limits.header_timeout` for a connection that never sends its first byte), making room at
//! `limits.max_connections`, and closing them for a stop.
//!
//! There is no timer per connection. Each connection has a slot in its worker's [`Connections`]; one
//! sweeper task per worker ticks at a fixed period and closes the connections that have waited
//! for a request for more ticks than their timeout allows. Entering and leaving the idle state
//! costs a connection two stores, no clock read and no timer-wheel insertion, and an idle
//! connection costs its slot (a few dozen bytes) and nothing else. A timeout is kept to within one
//! period late, never early: the period is a quarter of the shortest timeout that applies, at most
//! 100 ms. The same tick refreshes the cached `Date` header value.
//!
//! A request head that has begun to arrive is no longer idle: the connection times it itself
//! (`downstream::h1`), since a slowloris client keeps bytes moving and a late head gets a 408.
//!
//! A connection that has waited [`PARK_AFTER`] is parked: its socket leaves tokio's reactor for a
//! worker-wide epoll set of parked sockets, and its task ends, so that what it holds in memory is
//! its slot here and the few handles it needs to start again. When the client sends its next
//! request the epoll set reports it, and the worker starts a task for the connection anew. Moving
//! a socket between the two sets costs four `epoll_ctl` calls, once per second of idleness at
//! most; a busy keep-alive connection never pays them. This is what makes an idle keep-alive
//! connection cost less than nginx's (`benches/idle.sh`): tokio's own per-socket state is 256
//! bytes, and a task with its future several hundred more.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use http::HeaderValue;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use crate::sys::recycle::Recycler;

/// The longest tick: timeouts are kept to within this much.
const MAX_PERIOD: Duration = Duration::from_millis(100);
/// How long a connection waits for a request before it is parked.
pub const PARK_AFTER: Duration = Duration::from_secs(1);
/// Read buffers kept for reuse, per worker.
const SPARE_BUFFERS: usize = 64;
/// The size of a read buffer, which a typical request head fits in.
pub const READ_BUFFER: usize = 4 * 1024;
/// Parked connections taken back per pass.
const UNPARK_BATCH: usize = 64;
/// How long after its accept an idle connection is spared when room is needed under
/// `limits.max_connections`, unless it has had its chance already: an HTTP/2 connection past
/// its handshake (pinlb's SETTINGS sent, the client's read) may close for room at once.
/// Without this, the accept loop's pressure, which runs whenever the limit is reached, would
/// close a connection it had just accepted before its client's first bytes were read: under
/// load, before an HTTP/2 client got pinlb's SETTINGS. Counted from the accept, not from each
/// wait, so that an HTTP/1.1 request costs no more for it: the tick is stored once, at the
/// accept.
pub const ROOM_AFTER: Duration = Duration::from_secs(1);

/// A worker's client connections, each of which may park here as a `P` (its socket, and what it
/// needs to start again), so that this module knows nothing of what a connection is.
pub struct Connections<P> {
    slots: RefCell<Entries<P>>,
    /// Connections open on this worker.
    open: Cell<usize>,
    /// Notified when `open` drops to zero.
    none_open: Notify,
    /// Sweeps so far; a waiting connection records the tick it began at.
    tick: Cell<u32>,
    period: Cell<Duration>,
    /// Bumped when `period` changes (a reload), so that connections count their timeouts in
    /// ticks of the new length.
    period_changes: Cell<u32>,
    /// The worker is stopping: idle connections close now, busy ones after their response.
    draining: Cell<bool>,
    /// During a stop for a binary upgrade: the tick until which idle HTTP/1.1 connections stay
    /// open, so that a request already on its way is answered (with `Connection: close`)
    /// instead of meeting a closed socket ([`Connections::drain_lingering`]).
    lingering: Cell<Option<u32>>,
    /// Reloads applied so far: a connection that carries many requests at once (HTTP/2) ends
    /// with GOAWAY after one, as nginx's do.
    reloads: Cell<u64>,
    /// The `Date` header value, refreshed every tick.
    date: RefCell<HeaderValue>,
    /// Read buffers of connections that went idle, for the next connection that reads: taking
    /// one is cheaper than a new allocation per request.
    buffers: RefCell<Vec<BytesMut>>,
    /// Memory for the exchanges of this worker's HTTP/1.1 connections (one request each),
    /// kept between requests: a block freed by one is where the next one is made.
    exchanges: Recycler,
    /// The epoll set of parked connections' sockets, registered with tokio's reactor itself;
    /// `None` where it could not be made (connections then stay as they are).
    parking: Option<AsyncFd<ParkingLot>>,
}

/// An epoll instance, for `AsyncFd`.
struct ParkingLot(Epoll);

impl AsRawFd for ParkingLot {
    fn as_raw_fd(&self) -> RawFd {
        self.0.0.as_raw_fd()
    }
}

struct Entries<P> {
    slots: Vec<Entry<P>>,
    /// Indices of unused slots.
    free: Vec<usize>,
}

struct Entry<P> {
    in_use: bool,
    /// The tick at which the connection began to wait for a request; `None` while it has one.
    idle_since: Option<u32>,
    /// Ticks it may wait.
    limit: u32,
    /// Set by the sweeper, by pressure or by a stop: the connection closes when it next looks.
    close: bool,
    /// Set by the sweeper: the connection has waited long enough to be parked.
    park: bool,
    /// While it waits: it has had its chance (see [`ROOM_AFTER`]), so room needed may close it
    /// at once. Set by HTTP/2 connections only.
    spare: bool,
    /// The tick it was accepted at.
    opened: u32,
    /// The connection, parked: its socket in the parking epoll set, its task gone.
    parked: Option<Box<P>>,
    /// The connection's task, remembered while it waits.
    waker: Option<Waker>,
}

impl<P> Default for Entry<P> {
    fn default() -> Self {
        Entry {
            in_use: false,
            idle_since: None,
            limit: 0,
            close: false,
            park: false,
            spare: false,
            opened: 0,
            parked: None,
            waker: None,
        }
    }
}

impl<P> Default for Entries<P> {
    fn default() -> Self {
        Entries {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<P> Default for Connections<P> {
    fn default() -> Self {
        Connections {
            slots: RefCell::default(),
            open: Cell::new(0),
            none_open: Notify::new(),
            tick: Cell::new(0),
            period: Cell::new(MAX_PERIOD),
            period_changes: Cell::new(0),
            draining: Cell::new(false),
            lingering: Cell::new(None),
            reloads: Cell::new(0),
            date: RefCell::new(http_date()),
            buffers: RefCell::default(),
            exchanges: Recycler::new(SPARE_BUFFERS),
            parking: None,
        }
    }
}

impl<P: AsFd> Connections<P> {
    /// A worker's connections, with an epoll set to park idle ones in. Must be called on the
    /// worker's runtime; without the epoll set (it could not be made), connections are never
    /// parked.
    pub fn with_parking() -> Connections<P> {
        let parking = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(std::io::Error::from)
            .and_then(|e| {
                // SAFETY: `ParkingLot` owns the epoll descriptor and closes it only when dropped,
                // with the `AsyncFd`; `as_raw_fd` always returns that one descriptor.
                unsafe {
                    AsyncFd::register_with_interest(ParkingLot(e), tokio::io::Interest::READABLE)
                }
                .map_err(|e| e.into())
            });
        match parking {
            Ok(p) => Connections {
                parking: Some(p),
                ..Connections::default()
            },
            Err(e) => {
                tracing::warn!("cannot park idle connections, they stay as they are: {e}");
                Connections::default()
            }
        }
    }

    /// Registers a new connection. `idle` is its `timeouts.client_idle`, `head` the longest it
    /// may take to send its first byte (`limits.header_timeout`).
    pub fn open(self: &Rc<Self>, idle: Duration, head: Duration) -> Slot<P> {
        let mut s = self.slots.borrow_mut();
        let index = match s.free.pop() {
            Some(i) => i,
            None => {
                s.slots.push(Entry::default());
                s.slots.len() - 1
            }
        };
        s.slots[index] = Entry {
            in_use: true,
            opened: self.tick.get(),
            ..Entry::default()
        };
        self.open.set(self.open.get() + 1);
        Slot {
            clients: self.clone(),
            index,
            idle,
            head,
            ticks: Cell::new(self.limits(idle, head)),
        }
    }

    /// A connection's timeouts in ticks of the current length.
    fn limits(&self, idle: Duration, head: Duration) -> Limits {
        Limits {
            period: self.period_changes.get(),
            idle: self.ticks(idle),
            first: self.ticks(head.min(idle)),
        }
    }

    /// Whole periods in `d`, rounded up.
    fn ticks(&self, d: Duration) -> u32 {
        let p = self.period.get().as_nanos().max(1);
        u32::try_from(d.as_nanos().div_ceil(p)).unwrap_or(u32::MAX)
    }

    /// Sets the tick from the shortest timeout that applies to this worker's connections.
    pub fn set_shortest_timeout(&self, shortest: Duration) {
        let period = (shortest / 4).clamp(Duration::from_millis(1), MAX_PERIOD);
        if period != self.period.get() {
            self.period.set(period);
            self.period_changes
                .set(self.period_changes.get().wrapping_add(1));
        }
    }

    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.open.get()
    }

    /// Completes once no connection is open.
    pub async fn all_closed(&self) {
        // Bounded: every connection ends within the caller's timeout, or the caller gives up.
        while self.open.get() > 0 {
            self.none_open.notified().await;
        }
    }

    /// Closes the connections waiting for a request, to make room for new ones: those accepted
    /// [`ROOM_AFTER`] ago or more, and HTTP/2 ones past their handshake. A connection just
    /// accepted is never closed for room.
    pub fn close_idle(&self) {
        self.close_waiting(false);
    }

    /// Closes the connections waiting for a request: every one (`all`, a stop), or those
    /// [`Connections::close_idle`] may close.
    fn close_waiting(&self, all: bool) {
        let now = self.tick.get();
        let after = self.ticks(ROOM_AFTER);
        let mut closing = Vec::new();
        {
            let mut s = self.slots.borrow_mut();
            for slot in s.slots.iter_mut() {
                // As in `sweep`: more than `after` ticks on, at least `after` periods passed.
                let may = all || slot.spare || now.wrapping_sub(slot.opened) > after;
                if slot.in_use && slot.idle_since.is_some() && may {
                    slot.close = true;
                    closing.extend(slot.parked.take());
                    if let Some(w) = slot.waker.take() {
                        w.wake();
                    }
                }
            }
        }
        // Dropped with the slots released: each frees its own.
        drop(closing);
    }

    /// Starts a stop: idle connections close now, busy ones once their response is out.
    pub fn drain(&self) {
        self.draining.set(true);
        self.close_waiting(true);
        self.wake_all();
    }

    /// Starts a stop for a binary upgrade, where the listening sockets live on in the new
    /// process: busy connections close once their response is out, and idle ones are given
    /// `linger` to send one more request, answered with `Connection: close`, before they close.
    ///
    /// Closing an idle keep-alive connection at once, as [`Connections::drain`] does, races the
    /// client's next request: one already sent meets the close (a reset, or an end of file
    /// where the response should be) and fails unless the client retries it. A stop has no
    /// choice (its port closes too), but after an upgrade the client may as well reconnect to
    /// the new process, so a connection is only closed after a response that said so, or once
    /// it has been idle for `linger` (HAProxy's soft stop does the same).
    pub fn drain_lingering(&self, linger: Duration) {
        let ticks = self.ticks(linger).max(1);
        self.lingering
            .set(Some(self.tick.get().wrapping_add(ticks)));
        self.draining.set(true);
        self.wake_all();
    }

    /// A reload was applied: connections that multiplex requests (HTTP/2) begin their graceful
    /// close, so that their clients' next requests come on new connections.
    pub fn reloaded(&self) {
        self.reloads.set(self.reloads.get() + 1);
        self.wake_all();
    }

    /// Reloads applied so far, for [`Slot::poll_close`].
    pub fn reloads(&self) -> u64 {
        self.reloads.get()
    }

    /// Wakes every connection waiting in its slot: a connection that multiplexes requests
    /// (HTTP/2) waits there while busy too. Others, waiting for a request, look and wait on.
    fn wake_all(&self) {
        let wakers: Vec<Waker> = {
            let mut s = self.slots.borrow_mut();
            s.slots.iter_mut().filter_map(|s| s.waker.take()).collect()
        };
        wakers.into_iter().for_each(Waker::wake);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// A read buffer with room for a request head.
    pub fn take_buffer(&self) -> BytesMut {
        self.buffers
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| BytesMut::with_capacity(READ_BUFFER))
    }

    /// Where this worker's HTTP/1.1 exchanges are made (see `sys::recycle`).
    pub fn exchanges(&self) -> &Recycler {
        &self.exchanges
    }

    /// Keeps an emptied read buffer for another connection, if it is of the usual size.
    ///
    /// The parser advances a buffer past each head it reads, which leaves it that much less
    /// room: emptied, it takes that room back in place (`try_reclaim`; nothing else holds any
    /// of it once the head is copied out), so that a connection's next request reuses the
    /// allocation instead of freeing it and taking a new one.
    pub fn give_buffer(&self, mut buf: BytesMut) {
        buf.clear();
        if !buf.try_reclaim(READ_BUFFER) {
            return;
        }
        let mut spare = self.buffers.borrow_mut();
        if spare.len() < SPARE_BUFFERS && buf.capacity() <= 4 * READ_BUFFER {
            spare.push(buf);
        }
    }

    /// Writes a `date` header line with the current date.
    pub fn write_date(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(self.date.borrow().as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// The `Date` header value, as of the last tick.
    pub fn date(&self) -> HeaderValue {
        self.date.borrow().clone()
    }

    /// One tick: closes the connections that have waited too long, asks those that have
    /// waited `PARK_AFTER` to park, and refreshes the date.
    fn sweep(&self) {
        let now = self.tick.get().wrapping_add(1);
        self.tick.set(now);
        *self.date.borrow_mut() = http_date();
        let park_after = if self.parking.is_some() {
            self.ticks(PARK_AFTER)
        } else {
            u32::MAX
        };
        let mut closing = Vec::new();
        {
            let mut s = self.slots.borrow_mut();
            for slot in s.slots.iter_mut() {
                let Some(since) = slot.idle_since else {
                    continue;
                };
                // It began waiting somewhere within tick `since`: more than `limit` ticks
                // later, at least `limit` whole periods have passed.
                let waited = now.wrapping_sub(since);
                if slot.in_use && waited > slot.limit {
                    slot.close = true;
                    closing.extend(slot.parked.take());
                } else if slot.in_use && waited > park_after && !slot.park {
                    slot.park = true;
                } else {
                    continue;
                }
                if let Some(w) = slot.waker.take() {
                    w.wake();
                }
            }
        }
        // Dropped with the slots released: each frees its own.
        drop(closing);
        if let Some(until) = self.lingering.get() {
            // Signed, for a tick count that wrapped.
            if now.wrapping_sub(until) as i32 >= 0 {
                self.lingering.set(None);
                self.close_idle();
                self.wake_all();
            }
        }
    }

    /// Parks a connection that [`Slot::poll_wait`] said to park: its socket joins the
    /// parking epoll set, and the connection waits in its slot. Gives it back if it can't.
    pub fn park(&self, index: usize, parked: Box<P>) -> Result<(), Box<P>> {
        let Some(lot) = &self.parking else {
            return Err(parked);
        };
        let event = EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, index as u64);
        if lot.get_ref().0.add(&*parked, event).is_err() {
            return Err(parked);
        }
        let mut s = self.slots.borrow_mut();
        match s.slots.get_mut(index) {
            Some(slot) if slot.in_use => {
                slot.parked = Some(parked);
                Ok(())
            }
            _ => {
                drop(s);
                let _ = lot.get_ref().0.delete(&*parked);
                Err(parked)
            }
        }
    }

    /// Waits until some parked connections have something to read (a request, or their end),
    /// and takes them out of the parking set, up to a batch at a time. Never completes without
    /// parking.
    pub async fn unparked(&self) -> Vec<Box<P>> {
        let Some(lot) = &self.parking else {
            return std::future::pending().await;
        };
        // Bounded: each pass waits for the epoll set to be readable.
        loop {
            let Ok(mut ready) = lot.readable().await else {
                return std::future::pending().await;
            };
            let mut events = [EpollEvent::empty(); UNPARK_BATCH];
            let n = lot.get_ref().0.wait(&mut events, 0u8).unwrap_or(0);
            if n < UNPARK_BATCH {
                // Drained: the next event makes the set readable again.
                ready.clear_ready();
            }
            let mut back = Vec::with_capacity(n);
            {
                let mut s = self.slots.borrow_mut();
                for e in &events[..n] {
                    let Some(slot) = s.slots.get_mut(e.data() as usize) else {
                        continue;
                    };
                    if let Some(p) = slot.parked.take() {
                        let _ = lot.get_ref().0.delete(&*p);
                        slot.park = false;
                        slot.idle_since = None;
                        back.push(p);
                    }
                }
            }
            if !back.is_empty() {
                return back;
            }
        }
    }
}

/// Runs a worker's sweeper until the worker's runtime ends. `pressure` reads a count that
/// another worker bumps while it waits for room under `limits.max_connections`; when it moved,
/// this worker's idle connections close too.
pub async fn sweeper<P: AsFd>(clients: Rc<Connections<P>>, pressure: impl Fn() -> u64) {
    let mut seen = pressure();
    loop {
        tokio::time::sleep(clients.period.get()).await;
        clients.sweep();
        let now = pressure();
        if now != seen {
            seen = now;
            clients.close_idle();
        }
    }
}

fn http_date() -> HeaderValue {
    let text = httpdate::fmt_http_date(SystemTime::now());
    HeaderValue::from_str(&text)
        .unwrap_or(HeaderValue::from_static("Thu, 01 Jan 1970 00:00:00 GMT"))
}

/// One connection's slot; freed when dropped.
pub struct Slot<P> {
    clients: Rc<Connections<P>>,
    index: usize,
    /// `timeouts.client_idle`.
    idle: Duration,
    /// `limits.header_timeout`.
    head: Duration,
    ticks: Cell<Limits>,
}

/// A connection's timeouts counted in ticks, for one tick length.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// The `period_changes` they were counted for.
    period: u32,
    /// Waiting for a later request.
    idle: u32,
    /// Waiting for the first byte of the first request.
    first: u32,
}

/// Why a connection stopped waiting for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Bytes arrived (or the client closed, which the read will show).
    Readable,
    /// The connection is to close: idle too long, room needed, or a stop.
    Close,
    /// The connection has waited long enough to be parked.
    Park,
}

impl<P: AsFd> Slot<P> {
    pub fn connections(&self) -> &Connections<P> {
        &self.clients
    }

    /// The worker's connections, to park in.
    pub fn connections_rc(&self) -> Rc<Connections<P>> {
        self.clients.clone()
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// Waits for the first byte of a request. `first` says whether it is the connection's first
    /// request, which must begin within `limits.header_timeout` of the accept (or
    /// `timeouts.client_idle`, if shorter); a later one within `timeouts.client_idle` of the
    /// previous response. `readable` polls the socket.
    pub fn poll_wait(
        &self,
        first: bool,
        cx: &mut Context<'_>,
        readable: impl FnOnce(&mut Context<'_>) -> Poll<std::io::Result<()>>,
    ) -> Poll<Wait> {
        let mut s = self.clients.slots.borrow_mut();
        let tick = self.clients.tick.get();
        let Some(slot) = s.slots.get_mut(self.index) else {
            return Poll::Ready(Wait::Close);
        };
        // While a stop lingers, an idle connection waits on (its next response says close).
        if slot.close || (self.clients.draining.get() && self.clients.lingering.get().is_none()) {
            return Poll::Ready(Wait::Close);
        }
        match readable(cx) {
            Poll::Ready(Ok(())) => {
                slot.idle_since = None;
                slot.park = false;
                slot.waker = None;
                Poll::Ready(Wait::Readable)
            }
            Poll::Ready(Err(_)) => Poll::Ready(Wait::Close),
            Poll::Pending if slot.park => Poll::Ready(Wait::Park),
            Poll::Pending => {
                self.start_idle(slot, tick, first);
                remember(slot, cx);
                Poll::Pending
            }
        }
    }

    /// Starts the slot's idle time at `tick`, unless it has begun: limited as a first request's
    /// wait (`first`) or a later one's, in ticks of the current length. A connection that never
    /// sent a byte is idle too.
    #[inline]
    fn start_idle(&self, slot: &mut Entry<P>, tick: u32, first: bool) {
        if slot.idle_since.is_some() {
            return;
        }
        slot.idle_since = Some(tick);
        let mut limits = self.ticks.get();
        if limits.period != self.clients.period_changes.get() {
            limits = self.clients.limits(self.idle, self.head);
            self.ticks.set(limits);
        }
        slot.limit = if first { limits.first } else { limits.idle };
    }
}

/// Remembers the connection's task in its slot, for the sweeper (or a stop) to wake.
#[inline]
fn remember<P>(slot: &mut Entry<P>, cx: &Context<'_>) {
    match &slot.waker {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => slot.waker = Some(cx.waker().clone()),
    }
}

impl<P: AsFd> Slot<P> {
    /// For a connection that carries many requests at once and never parks (HTTP/2):
    /// completes when it is to close. `idle` says it has no request open; only then does its
    /// idle time count, as `poll_wait`'s connection's does between requests: `first` (no
    /// request yet) within `limits.header_timeout` of the accept, later ones within
    /// `timeouts.client_idle`. Room needed under `max_connections` closes it only while idle;
    /// a stop, or a reload since `reloads` (what [`Connections::reloads`] said when it opened), at
    /// once (the caller lets its open requests finish). `shaken` says its handshake is done (the
    /// client's preface and SETTINGS read, pinlb's SETTINGS sent): from then on it has had its
    /// chance, and room needed may close it at once while idle; before, only [`ROOM_AFTER`]
    /// after its accept.
    pub fn poll_close(
        &self,
        idle: bool,
        first: bool,
        shaken: bool,
        reloads: u64,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut s = self.clients.slots.borrow_mut();
        let tick = self.clients.tick.get();
        let Some(slot) = s.slots.get_mut(self.index) else {
            return Poll::Ready(());
        };
        if slot.close || self.clients.draining.get() || self.clients.reloads.get() != reloads {
            return Poll::Ready(());
        }
        if idle {
            self.start_idle(slot, tick, first);
            slot.spare = shaken;
        } else {
            slot.idle_since = None;
            slot.park = false;
        }
        // The sweeper's asking it to park (left set, so it asks once) only polls it once more.
        remember(slot, cx);
        Poll::Pending
    }
}

impl<P: AsFd> Slot<P> {
    /// For a connection that [`Slot::poll_close`] said to close, whose graceful close (HTTP/2's
    /// GOAWAY) has begun: what asked it to close is spent, and its idle time starts again, so
    /// that [`Slot::poll_closing`] completes only for a new reason.
    pub fn closing_began(&self) {
        if let Some(slot) = self.clients.slots.borrow_mut().slots.get_mut(self.index) {
            slot.close = false;
            slot.idle_since = None;
            slot.park = false;
        }
    }

    /// For a connection in its graceful close: completes when, with no request open (`idle`),
    /// room is needed under `max_connections` or a stop begins, which close it at once as they
    /// do a waiting HTTP/1.1 connection (room needed: once its handshake is done, `shaken`, or
    /// it was accepted [`ROOM_AFTER`] ago, as in [`Slot::poll_close`]). Its idle time is not limited
    /// here (the caller bounds the graceful close itself), and a reload no longer concerns it:
    /// it is closing already.
    pub fn poll_closing(&self, idle: bool, shaken: bool, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.clients.slots.borrow_mut();
        let tick = self.clients.tick.get();
        let Some(slot) = s.slots.get_mut(self.index) else {
            return Poll::Ready(());
        };
        if idle {
            if slot.close || self.clients.draining.get() {
                return Poll::Ready(());
            }
            self.start_idle(slot, tick, false);
            slot.spare = shaken;
            slot.limit = u32::MAX;
        } else {
            slot.idle_since = None;
            slot.park = false;
        }
        remember(slot, cx);
        Poll::Pending
    }
}

impl<P> Drop for Slot<P> {
    fn drop(&mut self) {
        {
            let mut s = self.clients.slots.borrow_mut();
            if let Some(slot) = s.slots.get_mut(self.index) {
                *slot = Entry::default();
                s.free.push(self.index);
            }
        }
        let n = self.clients.open.get().saturating_sub(1);
        self.clients.open.set(n);
        if n == 0 {
            // Stores a permit if `all_closed` isn't waiting yet, so the wake is never lost.
            self.clients.none_open.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn pending(_: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Pending
    }

    fn setup() -> (Rc<Connections<std::net::TcpStream>>, Arc<Count>) {
        let clients = Rc::new(Connections::default());
        clients.set_shortest_timeout(Duration::from_millis(400));
        (clients, Arc::new(Count(AtomicUsize::new(0))))
    }

    #[test]
    fn a_waiting_connection_closes_after_its_timeout_and_not_before() {
        let (clients, woken) = setup();
        // A period of 100 ms: 300 ms to idle is 3 ticks, 200 ms for the first byte 2.
        let c = clients.open(Duration::from_millis(300), Duration::from_millis(200));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(c.poll_wait(false, &mut cx, pending), Poll::Pending);
        for _ in 0..3 {
            clients.sweep();
            assert_eq!(c.poll_wait(false, &mut cx, pending), Poll::Pending);
        }
        clients.sweep();
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        assert_eq!(
            c.poll_wait(false, &mut cx, pending),
            Poll::Ready(Wait::Close)
        );
    }

    #[test]
    fn the_first_request_gets_the_header_timeout_and_a_busy_connection_is_never_swept() {
        let (clients, woken) = setup();
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let first = clients.open(Duration::from_secs(60), Duration::from_millis(200));
        assert_eq!(first.poll_wait(true, &mut cx, pending), Poll::Pending);
        let busy = clients.open(Duration::from_millis(100), Duration::from_millis(100));
        let ready = |_: &mut Context<'_>| Poll::Ready(Ok(()));
        assert_eq!(
            busy.poll_wait(false, &mut cx, ready),
            Poll::Ready(Wait::Readable)
        );
        for _ in 0..3 {
            clients.sweep();
        }
        assert_eq!(
            first.poll_wait(true, &mut cx, pending),
            Poll::Ready(Wait::Close)
        );
        assert_eq!(
            busy.poll_wait(false, &mut cx, ready),
            Poll::Ready(Wait::Readable)
        );
    }

    #[test]
    fn a_shorter_tick_after_a_reload_keeps_the_timeout_of_open_connections() {
        let (clients, woken) = setup();
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        // 300 ms at 100 ms a tick, opened before the reload.
        let c = clients.open(Duration::from_millis(300), Duration::from_secs(60));
        clients.set_shortest_timeout(Duration::from_millis(100));
        // Now 25 ms a tick: the same 300 ms is 12 ticks.
        assert_eq!(c.poll_wait(false, &mut cx, pending), Poll::Pending);
        for _ in 0..12 {
            clients.sweep();
        }
        assert_eq!(c.poll_wait(false, &mut cx, pending), Poll::Pending);
        clients.sweep();
        assert_eq!(
            c.poll_wait(false, &mut cx, pending),
            Poll::Ready(Wait::Close)
        );
    }

    #[test]
    fn a_connection_waiting_longer_than_park_after_is_asked_to_park_but_a_busy_one_is_not() {
        let (clients, woken) = setup();
        // The sweeper parks only where there is a parking set; pretend there is one by asking
        // for parking directly through the slot, as `sweep` would.
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let c = clients.open(Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(c.poll_wait(false, &mut cx, pending), Poll::Pending);
        clients.slots.borrow_mut().slots[c.index].park = true;
        assert_eq!(
            c.poll_wait(false, &mut cx, pending),
            Poll::Ready(Wait::Park)
        );
        // Bytes that came meanwhile win: a connection with a request is never parked.
        let ready = |_: &mut Context<'_>| Poll::Ready(Ok(()));
        assert_eq!(
            c.poll_wait(false, &mut cx, ready),
            Poll::Ready(Wait::Readable)
        );
        assert!(!clients.slots.borrow().slots[c.index].park);
    }

    #[test]
    fn a_lingering_drain_keeps_idle_connections_for_one_more_request_then_closes_them() {
        let (clients, woken) = setup();
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let idle = clients.open(Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(idle.poll_wait(false, &mut cx, pending), Poll::Pending);
        clients.drain_lingering(clients.period.get() * 3);
        assert!(clients.is_draining(), "responses now say Connection: close");
        assert_eq!(idle.poll_wait(false, &mut cx, pending), Poll::Pending);
        // A request on its way when the stop began is read, not met by a close.
        let ready = |_: &mut Context<'_>| Poll::Ready(Ok(()));
        assert_eq!(
            idle.poll_wait(false, &mut cx, ready),
            Poll::Ready(Wait::Readable)
        );
        assert_eq!(idle.poll_wait(false, &mut cx, pending), Poll::Pending);
        for _ in 0..2 {
            clients.sweep();
            assert_eq!(idle.poll_wait(false, &mut cx, pending), Poll::Pending);
        }
        // Three periods on, whatever is still idle closes.
        clients.sweep();
        assert_eq!(
            idle.poll_wait(false, &mut cx, pending),
            Poll::Ready(Wait::Close)
        );
    }

    #[test]
    fn pressure_and_a_stop_close_only_waiting_connections_and_slots_are_reused() {
        let (clients, woken) = setup();
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let idle = clients.open(Duration::from_secs(60), Duration::from_secs(60));
        let busy = clients.open(Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(idle.poll_wait(false, &mut cx, pending), Poll::Pending);
        // Past the second after their accept that spares new connections (10 ticks).
        for _ in 0..11 {
            clients.sweep();
        }
        clients.close_idle();
        assert_eq!(woken.0.load(Ordering::Relaxed), 1);
        assert_eq!(
            idle.poll_wait(false, &mut cx, pending),
            Poll::Ready(Wait::Close)
        );
        assert_eq!(clients.open_count(), 2);
        drop(idle);
        assert_eq!(clients.open_count(), 1);
        let again = clients.open(Duration::from_secs(60), Duration::from_secs(60));
        assert_eq!(again.index, 0, "the freed slot is taken again");
        clients.drain();
        assert!(clients.is_draining());
        assert_eq!(
            busy.poll_wait(false, &mut cx, pending),
            Poll::Ready(Wait::Close)
        );
    }

    #[test]
    fn a_closing_connection_closes_for_pressure_or_a_stop_while_idle_and_not_for_time() {
        let (clients, woken) = setup();
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        // 300 ms to idle: 3 ticks of 100 ms.
        let c = clients.open(Duration::from_millis(300), Duration::from_millis(300));
        assert_eq!(c.poll_close(true, false, true, 0, &mut cx), Poll::Pending);
        for _ in 0..4 {
            clients.sweep();
        }
        assert_eq!(c.poll_close(true, false, true, 0, &mut cx), Poll::Ready(()));
        // Its graceful close began: the idle timeout that asked for it is spent, and more idle
        // time does not close it again (its caller bounds the graceful close).
        c.closing_began();
        assert_eq!(c.poll_closing(true, true, &mut cx), Poll::Pending);
        for _ in 0..10 {
            clients.sweep();
        }
        assert_eq!(c.poll_closing(true, true, &mut cx), Poll::Pending);
        // With a stream open, room needed passes it by; once idle, room needed (or a stop)
        // closes it.
        assert_eq!(c.poll_closing(false, true, &mut cx), Poll::Pending);
        clients.close_idle();
        assert_eq!(c.poll_closing(false, true, &mut cx), Poll::Pending);
        assert_eq!(c.poll_closing(true, true, &mut cx), Poll::Pending);
        clients.close_idle();
        assert_eq!(c.poll_closing(true, true, &mut cx), Poll::Ready(()));
        let d = clients.open(Duration::from_millis(300), Duration::from_millis(300));
        d.closing_began();
        assert_eq!(d.poll_closing(true, true, &mut cx), Poll::Pending);
        clients.drain();
        assert_eq!(d.poll_closing(true, true, &mut cx), Poll::Ready(()));
    }

    #[test]
    fn room_needed_spares_a_new_connection_until_it_had_its_chance() {
        let (clients, woken) = setup();
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let long = Duration::from_secs(60);
        // All just accepted: HTTP/1.1 waiting for its first request, HTTP/1.1 between requests,
        // HTTP/2 before and after its handshake (no stream yet), HTTP/2 closing before its
        // handshake.
        let new = clients.open(long, long);
        let kept = clients.open(long, long);
        let h2_new = clients.open(long, long);
        let h2_shaken = clients.open(long, long);
        let h2_closing = clients.open(long, long);
        let h1 = |c: &Slot<_>, first, cx: &mut Context<'_>| c.poll_wait(first, cx, pending);
        let h2 =
            |c: &Slot<_>, shaken, cx: &mut Context<'_>| c.poll_close(true, true, shaken, 0, cx);
        assert_eq!(h1(&new, true, &mut cx), Poll::Pending);
        assert_eq!(h1(&kept, false, &mut cx), Poll::Pending);
        assert_eq!(h2(&h2_new, false, &mut cx), Poll::Pending);
        assert_eq!(h2(&h2_shaken, false, &mut cx), Poll::Pending);
        h2_closing.closing_began();
        assert_eq!(h2_closing.poll_closing(true, false, &mut cx), Poll::Pending);
        // Its handshake done, later: it has had its chance, and goes at once.
        assert_eq!(h2(&h2_shaken, true, &mut cx), Poll::Pending);
        clients.close_idle();
        assert_eq!(h2(&h2_shaken, true, &mut cx), Poll::Ready(()));
        // ROOM_AFTER (1 s) is 10 ticks of 100 ms: the others not yet at 10, at 11.
        for _ in 0..10 {
            clients.sweep();
        }
        clients.close_idle();
        assert_eq!(h1(&new, true, &mut cx), Poll::Pending);
        assert_eq!(h1(&kept, false, &mut cx), Poll::Pending);
        assert_eq!(h2(&h2_new, false, &mut cx), Poll::Pending);
        assert_eq!(h2_closing.poll_closing(true, false, &mut cx), Poll::Pending);
        clients.sweep();
        clients.close_idle();
        assert_eq!(h1(&new, true, &mut cx), Poll::Ready(Wait::Close));
        assert_eq!(h1(&kept, false, &mut cx), Poll::Ready(Wait::Close));
        assert_eq!(h2(&h2_new, false, &mut cx), Poll::Ready(()));
        assert_eq!(
            h2_closing.poll_closing(true, false, &mut cx),
            Poll::Ready(())
        );
        // A stop closes a new connection at once.
        let newer = clients.open(long, long);
        assert_eq!(h1(&newer, true, &mut cx), Poll::Pending);
        clients.drain();
        assert_eq!(h1(&newer, true, &mut cx), Poll::Ready(Wait::Close));
    }
}
