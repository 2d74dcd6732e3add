//! A backend as every worker sees it: its settings, health, passive failures, in-flight count,
//! slow start and response-time average, all atomics, so the request path reads and writes
//! them without a lock; and the admin state the API sets.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::backend_address::BackendAddress;
use crate::config::{Adaptive, Backend};
use crate::upstream::adaptive::Limiter;
use crate::upstream::connecting::Connecting;
use crate::upstream::counters::BackendStats;
use crate::upstream::health::{FailWindow, ramped_weight};
use crate::upstream::queue::Queue;

/// Configured weights are multiplied by this before selection, so a backend in slow start can
/// carry a small fraction of even weight 1. Scaling every weight alike changes no pick.
pub const WEIGHT_SCALE: u64 = 1000;

/// Time since the first call in this process.
pub(super) fn since_start() -> Duration {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed()
}

/// Milliseconds since the first call in this process; never zero, so zero can mean "never".
pub(super) fn clock_ms() -> u64 {
    millis(since_start()).saturating_add(1)
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The clock, read at most once per pick and only when some backend needs it (one that failed
/// recently or is in slow start), so the common pick reads no clock at all.
#[derive(Default)]
pub(super) struct Now(pub(super) Option<u64>);

impl Now {
    pub(super) fn get(&mut self) -> u64 {
        *self.0.get_or_insert_with(clock_ms)
    }
}

/// What the admin API set for a backend (`POST /backends/{address}/drain` and so on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminState {
    /// Takes requests by the health and passive rules.
    Active = 0,
    /// Takes no new requests; those in flight finish.
    Draining = 1,
    /// Like down: no new requests. Health checks go on, so its state is known when enabled.
    Disabled = 2,
}

impl AdminState {
    pub const ALL: [AdminState; 3] = [
        AdminState::Active,
        AdminState::Draining,
        AdminState::Disabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Active => "active",
            AdminState::Draining => "draining",
            AdminState::Disabled => "disabled",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => AdminState::Draining,
            2 => AdminState::Disabled,
            _ => AdminState::Active,
        }
    }
}

/// One backend's answers as outlier detection (`upstream::outlier`) counts them; shared by
/// every generation that keeps the backend.
#[derive(Debug, Default)]
pub struct OutlierCounts {
    /// 5xx answers in a row.
    pub(super) consecutive: AtomicU32,
    /// Answers, and 5xx ones, in the interval under way.
    pub(super) answers: AtomicU32,
    pub(super) fails: AtomicU32,
    /// Ejections so far (since the backend last stayed in for `max_time`).
    pub(super) ejections: AtomicU32,
    /// When the last ejection ends (ms on the passive checks' clock).
    pub(super) ejected_until: AtomicU64,
}

/// A backend as every worker sees it.
///
/// One per backend of an upstream, shared by every config generation that keeps the backend (the
/// same address in the same upstream), so a reload keeps its health, passive failures, in-flight
/// count and counters. The settings a reload may change (`weight`, `max_conns`, `slow_start`) are
/// atomics too, stored again by each reload.
#[derive(Debug)]
pub struct BackendState {
    pub address: BackendAddress,
    weight: AtomicU32,
    /// Most requests in flight across all workers; 0 = unlimited.
    pub(super) max_conns: AtomicUsize,
    /// The learned concurrency limit, for a backend without `max_conns` in an upstream with
    /// `adaptive` on.
    pub limiter: Limiter,
    slow_start_ms: AtomicU64,
    /// Requests sent to this backend whose response has not finished yet, across all workers.
    /// least_conn and `max_conns` read it; [`InFlight`] is the only writer.
    pub(super) in_flight: AtomicUsize,
    /// Active health: false while checks hold the backend down. Always true without checks.
    up: AtomicBool,
    /// Consecutive check results that disagree with `up`, kept here so that the check loop a
    /// reload starts again goes on counting.
    check_streak: AtomicU32,
    /// [`AdminState`], as set through the admin API.
    admin: AtomicU8,
    /// Passive accounting, the fields of a [`FailWindow`]. Workers update them with plain
    /// loads and stores: two failures racing may count as one, which only delays a skip by one
    /// failure, and costs no lock on the request path. `until` alone needs compare-and-swap, so
    /// that exactly one worker claims the trial request.
    fails: AtomicU32,
    fails_since_ms: AtomicU64,
    pub(super) skip_until_ms: AtomicU64,
    /// While non-zero the backend is in slow start, which began at this instant.
    pub(super) ramp_from_ms: AtomicU64,
    /// `ewma`: the peak-EWMA response time in nanoseconds (an f64's bits; 0 = nothing observed
    /// yet) and when it was last updated (nanoseconds on the process clock). Plain loads and
    /// stores: two workers observing at once may lose one sample, which an average shrugs off.
    ewma_ns: AtomicU64,
    ewma_at_ns: AtomicU64,
    /// Its answers as outlier detection counts them (`[upstream.NAME.outlier]`).
    pub(crate) outlier: OutlierCounts,
    /// What `/metrics` reports; counted only while the admin listener is on.
    pub stats: BackendStats,
    /// The connects in progress to this backend, and their bound (`max_connecting`).
    pub connecting: Connecting,
    /// The queue of the backend's upstream, once a config gave it one: a request that ends
    /// here wakes the queue's first waiter. Unset, as for most upstreams, the end of a request
    /// costs one load more.
    pub(super) queue: OnceLock<Arc<Queue>>,
}

impl BackendState {
    pub(super) fn new(b: &Backend, adaptive: Option<Adaptive>) -> Self {
        let state = BackendState {
            address: b.address,
            weight: AtomicU32::new(0),
            max_conns: AtomicUsize::new(0),
            limiter: Limiter::default(),
            slow_start_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            up: AtomicBool::new(true),
            check_streak: AtomicU32::new(0),
            admin: AtomicU8::new(AdminState::Active as u8),
            fails: AtomicU32::new(0),
            fails_since_ms: AtomicU64::new(0),
            skip_until_ms: AtomicU64::new(0),
            ramp_from_ms: AtomicU64::new(0),
            ewma_ns: AtomicU64::new(0),
            ewma_at_ns: AtomicU64::new(0),
            outlier: OutlierCounts::default(),
            stats: BackendStats::default(),
            connecting: Connecting::default(),
            queue: OnceLock::new(),
        };
        state.configure(b, adaptive);
        state
    }

    /// Applies the backend's settings from a (re)loaded config, and its upstream's `adaptive`
    /// bounds: a fixed `max_conns` overrides learning.
    pub(super) fn configure(&self, b: &Backend, adaptive: Option<Adaptive>) {
        self.weight.store(b.weight, Ordering::Relaxed);
        self.max_conns.store(b.max_conns, Ordering::Relaxed);
        self.limiter
            .configure(adaptive.filter(|_| b.max_conns == 0));
        self.slow_start_ms
            .store(millis(b.slow_start), Ordering::Relaxed);
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Requests in flight across all workers.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn admin_state(&self) -> AdminState {
        AdminState::from_u8(self.admin.load(Ordering::Relaxed))
    }

    /// Sets the admin state; returns the one before.
    pub fn set_admin_state(&self, s: AdminState) -> AdminState {
        AdminState::from_u8(self.admin.swap(s as u8, Ordering::Relaxed))
    }

    /// Whether active health checks hold the backend up.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Sets the active-check state. Coming back up clears passive failures (the checks just
    /// proved the backend healthy) and starts slow start.
    pub fn set_up(&self, up: bool) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if up && !was {
            self.store_window(FailWindow::default());
            self.start_ramp();
        }
    }

    pub fn check_streak(&self) -> u32 {
        self.check_streak.load(Ordering::Relaxed)
    }

    pub fn set_check_streak(&self, n: u32) {
        self.check_streak.store(n, Ordering::Relaxed);
    }

    /// Whether outlier detection has the backend out now (a skip it set, not yet over).
    pub fn is_ejected(&self) -> bool {
        let until = self.outlier.ejected_until.load(Ordering::Relaxed);
        until != 0 && until == self.skip_until_ms.load(Ordering::Relaxed) && self.is_skipped()
    }

    /// Whether the backend is inside a passive skip window.
    pub fn is_skipped(&self) -> bool {
        self.skipped(&mut Now::default())
    }

    #[inline]
    pub(super) fn skipped(&self, now: &mut Now) -> bool {
        // Only `until` decides, and it is zero for every healthy backend: no clock read then.
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        until != 0
            && FailWindow {
                until,
                ..FailWindow::default()
            }
            .skipped(now.get())
    }

    /// Whether `max_conns` requests are in flight, or as many await their heads as its learned
    /// limit allows.
    #[inline]
    pub fn is_full(&self) -> bool {
        let max = self.max_conns.load(Ordering::Relaxed);
        (max != 0 && self.in_flight.load(Ordering::Relaxed) >= max) || self.limiter.is_full()
    }

    /// Whether the backend has a fixed `max_conns`.
    #[inline]
    pub(super) fn has_max_conns(&self) -> bool {
        self.max_conns.load(Ordering::Relaxed) != 0
    }

    /// Whether the backend may be picked now. A lone backend is never skipped for passive
    /// failures, as in nginx: skipping it cannot help.
    #[inline]
    pub(super) fn available(&self, now: &mut Now, lone: bool) -> bool {
        self.admin.load(Ordering::Relaxed) == AdminState::Active as u8
            && self.is_up()
            && (lone || !self.skipped(now))
            && !self.is_full()
    }

    /// Whether the backend would be picked but for `max_conns`.
    #[cold]
    pub(super) fn available_but_full(&self, now: &mut Now) -> bool {
        self.admin.load(Ordering::Relaxed) == AdminState::Active as u8
            && self.is_up()
            && !self.skipped(now)
            && self.is_full()
    }

    /// Whether the backend could be picked in panic mode: it is only skipped after failures.
    #[cold]
    pub(super) fn only_skipped(&self, now: &mut Now) -> bool {
        self.admin.load(Ordering::Relaxed) == AdminState::Active as u8
            && self.is_up()
            && self.skipped(now)
            && !self.is_full()
    }

    /// The weight selection uses now: the configured one, or less during slow start.
    #[inline(always)]
    pub(super) fn weight_now(&self, now: &mut Now) -> u64 {
        let scaled = u64::from(self.weight()) * WEIGHT_SCALE;
        let from = self.ramp_from_ms.load(Ordering::Relaxed);
        if from == 0 {
            return scaled;
        }
        let elapsed = Duration::from_millis(now.get().saturating_sub(from));
        let slow_start = Duration::from_millis(self.slow_start_ms.load(Ordering::Relaxed));
        if elapsed >= slow_start {
            // Only this ramp ends: a backend that went down and came back meanwhile has a new one.
            let _ =
                self.ramp_from_ms
                    .compare_exchange(from, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        ramped_weight(scaled, elapsed, slow_start)
    }

    /// Takes one response time into the peak EWMA (Finagle's): a sample above the average
    /// replaces it at once, so a backend that turns slow is avoided from its first slow answer;
    /// below it, the average decays towards it with time constant `decay`, so recovery is
    /// believed gradually.
    pub fn observe_response_time(&self, rtt: Duration, decay: Duration) {
        let now = u64::try_from(since_start().as_nanos()).unwrap_or(u64::MAX);
        let rtt = rtt.as_nanos() as f64;
        let average = f64::from_bits(self.ewma_ns.load(Ordering::Relaxed));
        let at = self.ewma_at_ns.swap(now, Ordering::Relaxed);
        let next = if rtt >= average {
            rtt
        } else {
            let w = (-(now.saturating_sub(at) as f64) / decay.as_nanos() as f64).exp();
            average * w + rtt * (1.0 - w)
        };
        self.ewma_ns.store(next.to_bits(), Ordering::Relaxed);
    }

    /// What `ewma` minimises: the response-time average × (requests in flight + 1). A backend
    /// never observed costs nothing while idle, so it is tried, and the most while it has a
    /// request in flight, so a new backend is not flooded before its first answer (Finagle's
    /// penalty rule).
    pub(super) fn ewma_cost(&self) -> f64 {
        let average = f64::from_bits(self.ewma_ns.load(Ordering::Relaxed));
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        match (average == 0.0, in_flight) {
            (true, 0) => 0.0,
            (true, _) => f64::MAX,
            (false, n) => average * (n as f64 + 1.0),
        }
    }

    /// The response-time average `ewma` keeps, for `/status`; `None` before the first sample.
    pub fn ewma(&self) -> Option<Duration> {
        let ns = f64::from_bits(self.ewma_ns.load(Ordering::Relaxed));
        (ns > 0.0).then(|| Duration::from_nanos(ns as u64))
    }

    pub(super) fn start_ramp(&self) {
        if self.slow_start_ms.load(Ordering::Relaxed) != 0 {
            self.ramp_from_ms.store(clock_ms(), Ordering::Relaxed);
        }
    }

    /// Called for a picked backend: a backend past its skip window takes one trial request, and
    /// moves its window forward so that every other request keeps skipping it meanwhile.
    /// `Some(true)` for the trial, `Some(false)` for an ordinary request, `None` when another
    /// worker claimed the trial first.
    #[inline]
    pub(super) fn claim(&self, now: &mut Now, fail_timeout: Duration, lone: bool) -> Option<bool> {
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        if until == 0 || lone {
            return Some(false);
        }
        // Another worker may have claimed the trial (or a failure skipped the backend again)
        // since the snapshot said it was eligible.
        if now.get() < until {
            return None;
        }
        let next = now.get().saturating_add(millis(fail_timeout));
        self.skip_until_ms
            .compare_exchange(until, next, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| true)
    }

    pub(super) fn window(&self) -> FailWindow {
        FailWindow {
            fails: self.fails.load(Ordering::Relaxed),
            since: self.fails_since_ms.load(Ordering::Relaxed),
            until: self.skip_until_ms.load(Ordering::Relaxed),
        }
    }

    pub(super) fn store_window(&self, w: FailWindow) {
        self.fails.store(w.fails, Ordering::Relaxed);
        self.fails_since_ms.store(w.since, Ordering::Relaxed);
        self.skip_until_ms.store(w.until, Ordering::Relaxed);
    }
}
