//! One worker's view of an upstream: the generation's shared state, this worker's selection
//! state, and its two pools: the HTTP/1.1 pool of idle keep-alive connections (here) and the
//! HTTP/2 connections it multiplexes (`h2`). It lives in the worker's single-threaded runtime
//! (`Rc`, `RefCell`), so nothing here takes a lock.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::time::{Duration, Instant};

use tracing::warn;

use crate::http1::client::{Conn, ConnectError, ConnectFailure, connect};
use crate::sys::clock::monotonic_ns;
use crate::upstream::backend::{BackendState, clock_ms, millis};
use crate::upstream::h2;
use crate::upstream::in_flight::InFlight;
use crate::upstream::pick::{Selection, prefer};
use crate::upstream::proxy_header::{Origin, header};
use crate::upstream::queue::{Queue, Refused};
use crate::upstream::retry_budget::RetryBudget;
use crate::upstream::shared::SharedUpstream;

/// One worker's view of an upstream.
pub struct WorkerUpstream {
    pub shared: Arc<SharedUpstream>,
    selection: Selection,
    /// Idle keep-alive connections, one stack per backend (most recently used on top, so the
    /// warmest connection is reused and surplus ones age out). Shared with the next config
    /// generation's `WorkerUpstream` for each backend it keeps.
    idle: Vec<Rc<RefCell<Vec<Conn>>>>,
    /// For an HTTP/2 upstream, the multiplexed connections to each backend; kept across
    /// generations as `idle` is.
    multiplexed: Vec<Rc<h2::Pool>>,
    /// This worker's retries on a status (`retry.on`'s `http_NNN`).
    pub(crate) retry_budget: RetryBudget,
}

impl WorkerUpstream {
    #[cfg(test)]
    pub fn new(shared: Arc<SharedUpstream>) -> Rc<Self> {
        Self::reloaded(shared, None)
    }

    /// This worker's view of a new generation's upstream; backends that `previous` had keep
    /// their idle connections, unless the upstream's TLS settings changed (a plain connection
    /// must not serve an upstream that now asks for TLS, nor one verified against another CA).
    pub fn reloaded(shared: Arc<SharedUpstream>, previous: Option<&WorkerUpstream>) -> Rc<Self> {
        let n = shared.backends.len();
        // A backend's connections are kept only while they still speak what the upstream asks.
        let previous = previous.filter(|p| {
            p.shared.config.tls == shared.config.tls
                && p.shared.config.protocol == shared.config.protocol
                && p.shared.config.proxy_protocol == shared.config.proxy_protocol
        });
        // Where this generation's backend `b` was in the previous one, if it was.
        let kept = |b: &Arc<BackendState>| {
            let p = previous?;
            let i = p.shared.backends.iter().position(|o| Arc::ptr_eq(o, b))?;
            Some((p, i))
        };
        let idle = shared
            .backends
            .iter()
            .map(|b| kept(b).map(|(p, i)| p.idle[i].clone()).unwrap_or_default())
            .collect();
        let multiplexed = shared
            .backends
            .iter()
            .map(|b| {
                kept(b)
                    .map(|(p, i)| p.multiplexed[i].clone())
                    .unwrap_or_default()
            })
            .collect();
        Rc::new(WorkerUpstream {
            selection: Selection::new(n),
            idle,
            multiplexed,
            retry_budget: RetryBudget::new(&shared.config.retry),
            shared,
        })
    }

    /// Picks a backend for one request (see [`Selection::pick`]) and counts the request
    /// against it.
    #[inline]
    pub fn pick(
        &self,
        key: Option<u64>,
        excluded: impl Fn(usize) -> bool,
    ) -> Option<(usize, InFlight)> {
        let picked = self.selection.pick(&self.shared, key, excluded);
        if let (true, Some((b, _))) = (self.shared.counting, &picked) {
            self.shared.backends[*b]
                .stats
                .requests
                .fetch_add(1, Ordering::Relaxed);
        }
        picked
    }

    /// Counts a request against backend `b`, the one a sticky cookie names, when it can take
    /// it now (see [`prefer`]); `None` leaves the pick to the algorithm.
    #[cold]
    #[inline(never)]
    pub fn prefer(&self, b: usize) -> Option<(usize, InFlight)> {
        prefer(&self.shared, b)
    }

    /// Picks a backend as [`Self::pick`] does, for an upstream with a `queue`, when nobody
    /// waits in it; `None` when someone does or no backend has room (then [`Self::pick_queued`]
    /// waits). Most requests find room at once: they make no future and wait on nothing.
    #[inline]
    pub fn pick_unqueued(&self, queue: &Queue, key: Option<u64>) -> Option<(usize, InFlight)> {
        if queue.is_busy() {
            return None;
        }
        self.pick(key, |_| false)
    }

    /// Picks a backend as [`Self::pick`] does, for an upstream with a `queue`: when every
    /// backend that could take the request is at `max_conns`, or others wait already, the
    /// request waits in the queue, at most `timeouts.queue`, and then picks among those that
    /// have room. Also returns how long it waited. `Ok(None)` when no backend could take it
    /// even by waiting (each down, drained or skipped).
    ///
    /// Only a request's first pick waits: one that failed on a backend and may not go back to
    /// it could be woken for a slot there and would have to pass the wake on, and two such
    /// requests could pass wakes between them for ever. A retry picks as without a queue.
    pub async fn pick_queued(
        &self,
        queue: &Arc<Queue>,
        key: Option<u64>,
    ) -> Result<Option<(usize, InFlight, Duration)>, Refused> {
        let excluded = |_: usize| false;
        if !queue.is_busy() {
            if let Some((b, guard)) = self.pick(key, excluded) {
                return Ok(Some((b, guard, Duration::ZERO)));
            }
        }
        // Waiting helps only while some backend could take the request once it has room (a
        // slot may be free now, held for a request just woken).
        if !self.shared.has_backend_up() {
            return Ok(None);
        }
        let after = self.shared.config.timeouts.queue;
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + after);
        let taken = |(b, guard): (usize, InFlight)| {
            let waited = started.elapsed();
            queue.stats.wait_time.observe(waited);
            queue.stats.dequeued.fetch_add(1, Ordering::Relaxed);
            Some((b, guard, waited))
        };
        // Each turn ends in a pick, a refusal, or a place at the queue's front again; every
        // turn waits for a freed slot, so the loop is bounded by the deadline.
        let mut front = false;
        loop {
            let mut ticket = queue.enter(front)?;
            // Alone in the queue: a slot freed between the pick above and now had no one to
            // wake.
            if !front && queue.waiting() == 1 {
                if let Some(picked) = self.pick(key, excluded) {
                    ticket.used();
                    return Ok(taken(picked));
                }
            }
            if !ticket.woken(deadline).await {
                queue.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::TimedOut { after });
            }
            ticket.used();
            match self.pick(key, excluded) {
                Some(picked) => return Ok(taken(picked)),
                None if !self.shared.has_backend_up() => return Ok(None),
                // Another request took the slot first: this one keeps its turn.
                None => front = true,
            }
        }
    }

    /// A stream to an HTTP/2 `backend`, on the least busy of this worker's connections to it
    /// with room, or on a new one; counted as a reused or an opened connection.
    pub async fn open_stream(
        &self,
        backend: usize,
        timeout: Duration,
    ) -> Result<h2::Opened, String> {
        let shared = &*self.shared;
        let begun = shared.counting.then(Instant::now);
        let opened = self.multiplexed[backend]
            .open(
                shared.backends[backend].address,
                timeout,
                shared.config.max_streams,
                shared.tls(backend),
            )
            .await?;
        if shared.counting {
            let stats = &shared.backends[backend].stats;
            let counter = if opened.new {
                if let Some(begun) = begun {
                    stats.connect_time.observe(begun.elapsed());
                }
                &stats.connections_opened
            } else {
                &stats.connections_reused
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(opened)
    }

    /// Takes an idle connection to `backend` that is still open, dropping ones the backend
    /// closed, and counts it as reused. Most recently used first: it is the least likely to
    /// have been closed. With `proxy_protocol` (`origin`), only the client's own (see
    /// [`Self::checkout_for`]). Not a future of its own: `cx` is the attempt's, whose poll this
    /// is inlined into (`poll_fn` at each caller), as it is on every request's path.
    #[inline(always)]
    pub fn checkout(
        &self,
        backend: usize,
        origin: Option<&Origin>,
        cx: &mut Context<'_>,
    ) -> Option<Conn> {
        if let Some(origin) = origin {
            return self.checkout_for(backend, origin, cx);
        }
        let mut idle = self.idle[backend].borrow_mut();
        // Bounded by the pool (`keepalive`): every pass takes one connection out.
        while let Some(mut conn) = idle.pop() {
            if conn.is_usable_idle(cx) {
                return Some(self.reused(backend, conn));
            }
        }
        None
    }

    /// A new connection to `backend` (TLS when the upstream asks for it), counted as opened.
    /// Past `max_connecting` connects in progress to the backend, it first waits for one of
    /// them to end; `timeout` bounds the wait and the connect together. With `proxy_protocol`,
    /// it begins with a header naming `origin`, and carries only `origin`'s requests.
    pub async fn connect(
        &self,
        backend: usize,
        timeout: Duration,
        origin: Option<&Origin>,
    ) -> Result<Conn, ConnectError> {
        let shared = &*self.shared;
        let state = &shared.backends[backend];
        let Some((_slot, waited)) = state.connecting.enter(timeout).await else {
            return Err(ConnectError::busy(format!(
                "{} connects to the backend in progress (max_connecting) for {timeout:?}",
                state.connecting.in_progress()
            )));
        };
        let started_ms = clock_ms();
        let begun = shared.counting.then(Instant::now);
        // The wait for a slot comes out of the connect's own budget (the TLS handshake after
        // it keeps a whole one, as nginx gives it).
        let left = timeout.saturating_sub(waited);
        let first = match (shared.config.proxy_protocol, origin) {
            (Some(version), Some(origin)) => header(version, *origin),
            _ => Vec::new(),
        };
        let conn = match connect(state.address, left, shared.tls(backend), &first).await {
            Ok(mut conn) => {
                let now_ms = clock_ms();
                state.connecting.connected(now_ms);
                // Linux's first SYN retransmission comes after 1 s.
                if now_ms.saturating_sub(started_ms) >= 900 {
                    self.dropped(state);
                }
                if !first.is_empty() {
                    conn.origin = origin.map(|o| Box::new(*o));
                }
                conn
            }
            // A SYN the backend's full accept queue dropped, while it took others (since one
            // timeout before this connect began) or serves requests on connections it took
            // (in flight beyond those connecting, this one among them): busy, not dead.
            Err(mut e) if e.kind == ConnectFailure::TimedOut => {
                let since = started_ms.saturating_sub(millis(timeout));
                if state.connecting.connected_since(since)
                    || state.in_flight() > state.connecting.in_progress()
                {
                    e.kind = ConnectFailure::Busy;
                    self.dropped(state);
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if let Some(begun) = begun {
            let stats = &shared.backends[backend].stats;
            stats.connections_opened.fetch_add(1, Ordering::Relaxed);
            // The wait for a slot is part of what it took to connect.
            stats.connect_time.observe(begun.elapsed() + waited);
        }
        Ok(conn)
    }

    /// A connect to `state` found its accept queue full: its learned limit is halved.
    #[cold]
    fn dropped(&self, state: &BackendState) {
        if let Some((from, to)) = state.limiter.dropped(monotonic_ns()) {
            warn!(
                upstream = %self.shared.config.name,
                "backend {}: concurrency limit {from} -> {to}: a connect waited for a SYN \
                 retransmission, or timed out, while the backend took others: its accept queue \
                 is full",
                state.address
            );
        }
    }

    /// Returns a connection after a complete exchange; beyond `keepalive` it is closed instead
    /// (but a client's private one takes the place of the oldest: see `proxy_header`).
    pub fn checkin(&self, backend: usize, conn: Conn) {
        let mut idle = self.idle[backend].borrow_mut();
        if idle.len() < self.shared.config.keepalive {
            idle.push(conn);
        } else if conn.origin.is_some() && !idle.is_empty() {
            idle.remove(0);
            idle.push(conn);
        }
    }

    /// A pooled connection taken for a request, marked and counted as reused.
    #[inline(always)]
    fn reused(&self, backend: usize, mut conn: Conn) -> Conn {
        conn.reused = true;
        if self.shared.counting {
            let stats = &self.shared.backends[backend].stats;
            stats.connections_reused.fetch_add(1, Ordering::Relaxed);
        }
        conn
    }

    /// With `proxy_protocol`: an idle connection to `backend` whose header named `origin`, the
    /// most recently used first, counted as reused; every other client's stays in the pool.
    #[cold]
    #[inline(never)]
    fn checkout_for(&self, backend: usize, origin: &Origin, cx: &mut Context<'_>) -> Option<Conn> {
        let mut idle = self.idle[backend].borrow_mut();
        let mut i = idle.len();
        // Bounded by the pool (`keepalive`): every pass looks at one connection.
        while i > 0 {
            i -= 1;
            if idle[i].origin.as_deref() != Some(origin) {
                continue;
            }
            let mut conn = idle.remove(i);
            if conn.is_usable_idle(cx) {
                return Some(self.reused(backend, conn));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::upstream::backend::{AdminState, Now, WEIGHT_SCALE};

    fn upstream(extra: &str, backends: usize) -> Rc<WorkerUpstream> {
        let list: String = (0..backends)
            .map(|i| format!("{{ address = \"127.0.0.1:{}\" }},", 9001 + i))
            .collect();
        upstream_of(extra, &list)
    }

    /// An upstream whose `backends` list is `list` as written.
    fn upstream_of(extra: &str, list: &str) -> Rc<WorkerUpstream> {
        let text = format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
             [upstream.app]\n{extra}\nbackends = [{list}]\n"
        );
        let config = Config::parse("t.toml", &text, &[0]).unwrap();
        let shared = Arc::new(SharedUpstream::new(config.upstreams[0].clone(), false));
        WorkerUpstream::new(shared)
    }

    /// Picks `n` times, releasing each request at once; the backends picked, as letters.
    fn picks(u: &WorkerUpstream, n: usize) -> String {
        (0..n)
            .map(|_| match u.pick(None, |_| false) {
                Some((b, _guard)) => (b'a' + b as u8) as char,
                None => '-',
            })
            .collect()
    }

    #[test]
    fn a_backend_down_by_health_checks_is_not_picked_even_alone() {
        let u = upstream("", 3);
        u.shared.backends[1].set_up(false);
        assert_eq!(picks(&u, 4), "acac");
        let lone = upstream("", 1);
        lone.shared.backends[0].set_up(false);
        assert_eq!(picks(&lone, 2), "--");
        assert!(
            lone.shared
                .unavailable()
                .contains("1 down by health checks")
        );
    }

    #[test]
    fn a_failed_backend_is_skipped_then_gets_exactly_one_trial() {
        let u = upstream("", 2);
        u.shared.record_failure(&u.shared.backends[0]);
        assert_eq!(picks(&u, 3), "bbb");
        // Move the skip window into the past: the next pick is the trial, and claiming it
        // keeps every other pick away from the backend.
        u.shared.backends[0]
            .skip_until_ms
            .store(1, Ordering::Relaxed);
        let (first, trial) = u.pick(None, |_| false).unwrap();
        assert_eq!(first, 0);
        assert_eq!(picks(&u, 3), "bbb");
        // Only the trial's success ends the skip.
        let (_, ordinary) = u.pick(None, |_| false).unwrap();
        ordinary.answered(
            &u.shared,
            http::StatusCode::OK,
            None,
            std::time::Instant::now(),
            false,
        );
        assert_eq!(picks(&u, 2), "bb");
        trial.answered(
            &u.shared,
            http::StatusCode::OK,
            None,
            std::time::Instant::now(),
            false,
        );
        drop((trial, ordinary));
        let after = picks(&u, 4);
        assert_eq!(after.matches('a').count(), 2, "{after}");
    }

    #[test]
    fn a_lone_backend_is_never_skipped_for_failures() {
        let u = upstream("", 1);
        u.shared.record_failure(&u.shared.backends[0]);
        assert_eq!(picks(&u, 2), "aa");
    }

    #[test]
    fn max_conns_is_held_by_the_in_flight_guard() {
        let u = upstream("max_conns = 1", 2);
        let (a, _ga) = u.pick(None, |_| false).unwrap();
        let (b, gb) = u.pick(None, |_| false).unwrap();
        assert_eq!((a, b), (0, 1));
        assert!(u.pick(None, |_| false).is_none(), "both backends are full");
        assert!(u.shared.unavailable().contains("2 at max_conns"));
        drop(gb);
        assert_eq!(u.pick(None, |_| false).map(|p| p.0), Some(1));
    }

    #[test]
    fn a_backend_coming_back_up_ramps_its_weight() {
        let u = upstream("slow_start = \"1h\"", 2);
        let b = &u.shared.backends[1];
        b.set_up(false);
        b.set_up(true);
        let mut now = Now::default();
        let w = b.weight_now(&mut now);
        assert!((1..WEIGHT_SCALE / 100).contains(&w), "{w}");
        // Started an hour ago: the ramp is over.
        b.ramp_from_ms.store(1, Ordering::Relaxed);
        let mut later = Now(Some(3_600_001));
        assert_eq!(b.weight_now(&mut later), WEIGHT_SCALE);
        assert_eq!(b.ramp_from_ms.load(Ordering::Relaxed), 0);
        // The other backend takes nearly every pick right after the return.
        let u = upstream("slow_start = \"1h\"", 2);
        u.shared.backends[1].set_up(false);
        u.shared.backends[1].set_up(true);
        assert_eq!(picks(&u, 20), "a".repeat(20));
    }

    #[test]
    fn a_trial_claimed_meanwhile_by_another_worker_is_not_claimed_again() {
        let u = upstream("", 2);
        let b = &u.shared.backends[0];
        // The snapshot saw the window over; by the claim another worker has moved it forward.
        let mut now = Now(Some(5_000));
        b.skip_until_ms.store(4_000, Ordering::Relaxed);
        assert_eq!(
            b.claim(&mut now, Duration::from_secs(10), false),
            Some(true)
        );
        assert_eq!(b.claim(&mut now, Duration::from_secs(10), false), None);
        assert_eq!(b.skip_until_ms.load(Ordering::Relaxed), 15_000);
    }

    #[test]
    fn backups_take_requests_only_while_no_primary_can() {
        let u = upstream_of(
            "",
            r#"{ address = "127.0.0.1:9001" }, { address = "127.0.0.1:9002" },
               { address = "127.0.0.1:9003", backup = true }"#,
        );
        assert_eq!(picks(&u, 4), "abab");
        u.shared.backends[0].set_up(false);
        assert_eq!(picks(&u, 3), "bbb");
        u.shared.backends[1].set_admin_state(AdminState::Draining);
        assert_eq!(picks(&u, 3), "ccc");
        // A retry that has tried the primaries goes to the backup too.
        u.shared.backends[0].set_up(true);
        u.shared.backends[1].set_admin_state(AdminState::Active);
        assert_eq!(u.pick(None, |i| i < 2).map(|p| p.0), Some(2));
        assert_eq!(picks(&u, 2), "ab");
    }

    #[test]
    fn random_two_avoids_the_backend_with_most_in_flight() {
        let u = upstream("algorithm = \"random_two\"\nadaptive = false", 2);
        // Backend 0 holds five requests: of the two drawn (here always both), 1 wins.
        let _held: Vec<_> = (0..5)
            .map(|_| InFlight::acquire(&u.shared.backends[0]).unwrap())
            .collect();
        assert_eq!(picks(&u, 20), "b".repeat(20));
    }

    #[test]
    fn ewma_steers_away_from_a_slow_backend() {
        let u = upstream("algorithm = \"ewma\"", 4);
        let decay = Duration::from_secs(10);
        for (i, b) in u.shared.backends.iter().enumerate() {
            let rtt = if i == 3 { 5_000 } else { 200 };
            b.observe_response_time(Duration::from_micros(rtt), decay);
        }
        let counts = (0..4000).fold([0usize; 4], |mut c, _| {
            c[u.pick(None, |_| false).unwrap().0] += 1;
            c
        });
        // The slow one wins only when drawn against... nothing faster: never, while idle.
        assert_eq!(counts[3], 0, "{counts:?}");
        assert!(counts[..3].iter().all(|&c| c > 1000), "{counts:?}");
        // A peak replaces the average at once; a fast sample after it decays it only slowly.
        let b = &u.shared.backends[0];
        b.observe_response_time(Duration::from_millis(50), decay);
        assert_eq!(b.ewma(), Some(Duration::from_millis(50)));
        b.observe_response_time(Duration::from_micros(100), decay);
        assert!(b.ewma().unwrap() > Duration::from_millis(49));
    }

    #[test]
    fn hash_keeps_a_key_on_its_backend_and_falls_back_consistently() {
        let u = upstream("algorithm = \"hash\"\nhash = \"uri\"", 5);
        let key = crate::upstream::balance::hash(b"/cart?user=7");
        let first = u.pick(Some(key), |_| false).unwrap().0;
        assert!((0..20).all(|_| u.pick(Some(key), |_| false).unwrap().0 == first));
        u.shared.backends[first].set_up(false);
        let second = u.pick(Some(key), |_| false).unwrap().0;
        assert_ne!(second, first);
        assert!((0..20).all(|_| u.pick(Some(key), |_| false).unwrap().0 == second));
        // Without a key: round robin over the four up.
        assert_eq!(
            picks(&u, 4)
                .chars()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            4
        );
    }

    /// Polls `fut` once.
    async fn pending<F: std::future::Future>(fut: &mut std::pin::Pin<Box<F>>) -> bool {
        std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx).is_pending())).await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_arriving_while_the_freed_slot_is_held_for_a_woken_waiter_waits_its_turn() {
        let u = upstream("max_conns = 1\nqueue = 4", 1);
        let queue = u.shared.queue.clone().expect("a queue");
        let (_, first) = u.pick(None, |_| false).expect("a free slot");
        let mut a = Box::pin(u.pick_queued(&queue, None));
        assert!(pending(&mut a).await, "the backend is full: a waits");
        // The slot frees and is promised to a, which has not run yet: b must not take it, nor
        // give up (the backend is up, only busy).
        drop(first);
        let mut b = Box::pin(u.pick_queued(&queue, None));
        assert!(pending(&mut b).await, "b waits behind a");
        let (_, a_guard, _) = a.await.expect("a is served").expect("a backend");
        assert!(
            pending(&mut b).await,
            "b still waits while a holds the slot"
        );
        drop(a_guard);
        let (_, _b_guard, waited) = b.await.expect("b is served").expect("a backend");
        assert!(waited > Duration::ZERO);
        assert_eq!(queue.waiting(), 0);
    }
}
