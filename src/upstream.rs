//! Upstream state: what workers share (per-backend atomics) and what each worker owns (its
//! selection state and its pool of idle keep-alive connections).
//!
//! The split is what keeps the request path free of locks: shared state is a handful of atomics
//! behind an `Arc`, and everything else lives in the worker's own single-threaded runtime, behind
//! `Rc`/`RefCell` that no other thread can see.

use std::cell::RefCell;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::balance::{SmoothWrr, least_conn};
use crate::config::{Algorithm, Upstream};
use crate::h1::Conn;

/// A backend as every worker sees it.
#[derive(Debug)]
pub struct BackendState {
    pub address: SocketAddr,
    pub weight: u32,
    /// Requests sent to this backend whose response has not finished yet, across all workers.
    /// least_conn reads it; [`InFlight`] is the only writer.
    pub in_flight: AtomicUsize,
    /// While non-zero: the backend failed recently and is skipped until this instant, in
    /// milliseconds on [`clock_ms`]'s scale. Zero means usable, so the request path only reads
    /// the clock for a backend that actually failed.
    failed_until_ms: AtomicU64,
}

/// How long a backend whose connect failed is skipped: nginx's `max_fails=1 fail_timeout=10s`.
pub const FAIL_TIMEOUT: Duration = Duration::from_secs(10);

/// Milliseconds since the first call in this process; never zero, so zero can mean "never".
fn clock_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

impl BackendState {
    fn new(address: SocketAddr, weight: u32) -> Self {
        BackendState {
            address,
            weight,
            in_flight: AtomicUsize::new(0),
            failed_until_ms: AtomicU64::new(0),
        }
    }

    /// Marks the backend failed: workers skip it for [`FAIL_TIMEOUT`].
    pub fn mark_failed(&self) {
        let until =
            clock_ms().saturating_add(u64::try_from(FAIL_TIMEOUT.as_millis()).unwrap_or(u64::MAX));
        self.failed_until_ms.store(until, Ordering::Relaxed);
    }

    /// Whether the backend is inside a failure window.
    pub fn is_failed(&self) -> bool {
        let until = self.failed_until_ms.load(Ordering::Relaxed);
        until != 0 && clock_ms() < until
    }

    /// Clears a failure mark once the backend has answered again.
    pub fn mark_ok(&self) {
        if self.failed_until_ms.load(Ordering::Relaxed) != 0 {
            self.failed_until_ms.store(0, Ordering::Relaxed);
        }
    }
}

/// An upstream as every worker sees it.
#[derive(Debug)]
pub struct SharedUpstream {
    pub config: Upstream,
    pub backends: Vec<BackendState>,
    /// Weights copied out of `backends` so selection reads one contiguous slice.
    pub weights: Vec<u32>,
}

impl SharedUpstream {
    pub fn new(config: Upstream) -> Self {
        let backends = config
            .backends
            .iter()
            .map(|b| BackendState::new(b.address, b.weight))
            .collect();
        let weights = config.backends.iter().map(|b| b.weight).collect();
        SharedUpstream {
            config,
            backends,
            weights,
        }
    }
}

/// Counts one request against a backend's `in_flight` for as long as it lives.
///
/// It travels with the response body and is dropped when the body ends or the client goes away,
/// so errors, timeouts and cancelled clients can never leak a count.
#[derive(Debug)]
pub struct InFlight {
    upstream: Arc<SharedUpstream>,
    backend: usize,
}

impl InFlight {
    pub fn new(upstream: Arc<SharedUpstream>, backend: usize) -> Self {
        upstream.backends[backend]
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
        InFlight { upstream, backend }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.upstream.backends[self.backend]
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// One worker's view of an upstream.
pub struct WorkerUpstream {
    pub shared: Arc<SharedUpstream>,
    /// Smooth weighted round-robin scores. Per worker: each worker's picks follow the weights
    /// exactly, so the sum over workers does too, without sharing a counter.
    wrr: RefCell<SmoothWrr>,
    /// least_conn's per-pick snapshot of in-flight counts and eligibility, kept to reuse the
    /// allocation.
    scratch: RefCell<(Vec<usize>, Vec<bool>)>,
    /// Idle keep-alive connections, one stack per backend (most recently used on top, so the
    /// warmest connection is reused and surplus ones age out).
    idle: Vec<RefCell<Vec<Conn>>>,
}

impl WorkerUpstream {
    pub fn new(shared: Arc<SharedUpstream>) -> Rc<Self> {
        let n = shared.backends.len();
        Rc::new(WorkerUpstream {
            wrr: RefCell::new(SmoothWrr::new(n)),
            scratch: RefCell::new((Vec::with_capacity(n), Vec::with_capacity(n))),
            idle: (0..n).map(|_| RefCell::new(Vec::new())).collect(),
            shared,
        })
    }

    /// Picks a backend among those `eligible`, by the upstream's algorithm.
    pub fn pick(&self, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let shared = &*self.shared;
        let mut wrr = self.wrr.borrow_mut();
        match shared.config.algorithm {
            Algorithm::RoundRobin => wrr.pick(&shared.weights, eligible),
            Algorithm::LeastConn => {
                // One consistent snapshot of counts other workers keep changing.
                let mut scratch = self.scratch.borrow_mut();
                let (loads, ok) = &mut *scratch;
                loads.clear();
                ok.clear();
                for (i, b) in shared.backends.iter().enumerate() {
                    loads.push(b.in_flight.load(Ordering::Relaxed));
                    ok.push(eligible(i));
                }
                least_conn(&mut wrr, &shared.weights, loads, ok)
            }
        }
    }

    /// Takes an idle connection to `backend` that is still open, dropping ones the backend
    /// closed. Most recently used first: it is the least likely to have been closed.
    pub async fn checkout(&self, backend: usize) -> Option<Conn> {
        poll_fn(|cx| {
            let mut idle = self.idle[backend].borrow_mut();
            while let Some(mut conn) = idle.pop() {
                if conn.is_usable_idle(cx) {
                    conn.reused = true;
                    return Poll::Ready(Some(conn));
                }
            }
            Poll::Ready(None)
        })
        .await
    }

    /// Returns a connection after a complete exchange; beyond `keepalive` it is closed instead.
    pub fn checkin(&self, backend: usize, conn: Conn) {
        let mut idle = self.idle[backend].borrow_mut();
        if idle.len() < self.shared.config.keepalive {
            idle.push(conn);
        }
    }
}
