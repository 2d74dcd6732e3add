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
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::config::{Algorithm, Backend, Upstream};
use crate::http1::client::Conn;
use crate::tls::client::Connector;
use crate::upstream::balance::{
    Rendezvous, SmoothWrr, least_conn, less_loaded, random, two_choices,
};
use crate::upstream::h2;
use crate::upstream::health::{FailWindow, ramped_weight};
use crate::upstream::stats::BackendStats;

/// Configured weights are multiplied by this before selection, so a backend in slow start can
/// carry a small fraction of even weight 1. Scaling every weight alike changes no pick.
pub const WEIGHT_SCALE: u64 = 1000;

/// Time since the first call in this process.
fn since_start() -> Duration {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed()
}

/// Milliseconds since the first call in this process; never zero, so zero can mean "never".
fn clock_ms() -> u64 {
    millis(since_start()).saturating_add(1)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The clock, read at most once per pick and only when some backend needs it (one that failed
/// recently or is in slow start), so the common pick reads no clock at all.
#[derive(Default)]
struct Now(Option<u64>);

impl Now {
    fn get(&mut self) -> u64 {
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

/// A backend as every worker sees it.
///
/// One per backend of an upstream, shared by every config generation that keeps the backend (the
/// same address in the same upstream), so a reload keeps its health, passive failures, in-flight
/// count and counters. The settings a reload may change (`weight`, `max_conns`, `slow_start`) are
/// atomics too, stored again by each reload.
#[derive(Debug)]
pub struct BackendState {
    pub address: SocketAddr,
    weight: AtomicU32,
    /// Most requests in flight across all workers; 0 = unlimited.
    max_conns: AtomicUsize,
    slow_start_ms: AtomicU64,
    /// Requests sent to this backend whose response has not finished yet, across all workers.
    /// least_conn and `max_conns` read it; [`InFlight`] is the only writer.
    in_flight: AtomicUsize,
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
    skip_until_ms: AtomicU64,
    /// While non-zero the backend is in slow start, which began at this instant.
    ramp_from_ms: AtomicU64,
    /// `ewma`: the peak-EWMA response time in nanoseconds (an f64's bits; 0 = nothing observed
    /// yet) and when it was last updated (nanoseconds on the process clock). Plain loads and
    /// stores: two workers observing at once may lose one sample, which an average shrugs off.
    ewma_ns: AtomicU64,
    ewma_at_ns: AtomicU64,
    /// What `/metrics` reports; counted only while the admin listener is on.
    pub stats: BackendStats,
}

impl BackendState {
    fn new(b: &Backend) -> Self {
        let state = BackendState {
            address: b.address,
            weight: AtomicU32::new(0),
            max_conns: AtomicUsize::new(0),
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
            stats: BackendStats::default(),
        };
        state.configure(b);
        state
    }

    /// Applies the backend's settings from a (re)loaded config.
    fn configure(&self, b: &Backend) {
        self.weight.store(b.weight, Ordering::Relaxed);
        self.max_conns.store(b.max_conns, Ordering::Relaxed);
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

    /// Whether the backend is inside a passive skip window.
    pub fn is_skipped(&self) -> bool {
        self.skipped(&mut Now::default())
    }

    fn skipped(&self, now: &mut Now) -> bool {
        // Only `until` decides, and it is zero for every healthy backend: no clock read then.
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        until != 0
            && FailWindow {
                until,
                ..FailWindow::default()
            }
            .skipped(now.get())
    }

    /// Whether `max_conns` requests are in flight.
    pub fn is_full(&self) -> bool {
        let max = self.max_conns.load(Ordering::Relaxed);
        max != 0 && self.in_flight.load(Ordering::Relaxed) >= max
    }

    /// Whether the backend may be picked now. A lone backend is never skipped for passive
    /// failures, as in nginx: skipping it cannot help.
    fn available(&self, now: &mut Now, lone: bool) -> bool {
        self.admin.load(Ordering::Relaxed) == AdminState::Active as u8
            && self.is_up()
            && (lone || !self.skipped(now))
            && !self.is_full()
    }

    /// The weight selection uses now: the configured one, or less during slow start.
    fn weight_now(&self, now: &mut Now) -> u64 {
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
    fn ewma_cost(&self) -> f64 {
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

    fn start_ramp(&self) {
        if self.slow_start_ms.load(Ordering::Relaxed) != 0 {
            self.ramp_from_ms.store(clock_ms(), Ordering::Relaxed);
        }
    }

    /// Called for a picked backend: a backend past its skip window takes one trial request, and
    /// moves its window forward so that every other request keeps skipping it meanwhile.
    /// `Some(true)` for the trial, `Some(false)` for an ordinary request, `None` when another
    /// worker claimed the trial first.
    fn claim(&self, now: &mut Now, fail_timeout: Duration, lone: bool) -> Option<bool> {
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

    fn window(&self) -> FailWindow {
        FailWindow {
            fails: self.fails.load(Ordering::Relaxed),
            since: self.fails_since_ms.load(Ordering::Relaxed),
            until: self.skip_until_ms.load(Ordering::Relaxed),
        }
    }

    fn store_window(&self, w: FailWindow) {
        self.fails.store(w.fails, Ordering::Relaxed);
        self.fails_since_ms.store(w.since, Ordering::Relaxed);
        self.skip_until_ms.store(w.until, Ordering::Relaxed);
    }
}

/// An upstream as every worker sees it, in one config generation.
#[derive(Debug)]
pub struct SharedUpstream {
    pub config: Upstream,
    pub backends: Vec<Arc<BackendState>>,
    /// With `[upstream.NAME.tls]`, each backend's TLS configuration and session cache, by
    /// backend; empty for plain TCP.
    tls: Vec<Arc<Connector>>,
    /// Whether the request path counts [`BackendStats`] (the admin listener is on).
    pub counting: bool,
    /// `algorithm = "hash"`: the backends' rendezvous seeds, built once per generation.
    ring: Option<Rendezvous>,
    /// Whether any backend is a `backup`, so upstreams without any never look.
    has_backups: bool,
}

impl SharedUpstream {
    pub fn new(config: Upstream, counting: bool) -> Self {
        Self::reloaded(config, counting, &[])
    }

    /// The upstream of a new config generation. A backend that `previous` (the running
    /// generation's upstreams) has under the same upstream name and address keeps its state,
    /// with the new settings applied.
    pub fn reloaded(config: Upstream, counting: bool, previous: &[Arc<SharedUpstream>]) -> Self {
        let before = previous.iter().find(|u| u.config.name == config.name);
        // Unchanged TLS settings keep each backend's session cache, so a reload costs no full
        // handshakes.
        let same_tls = before.filter(|u| u.config.tls == config.tls);
        let tls = match &config.tls {
            None => Vec::new(),
            Some(t) => config
                .backends
                .iter()
                .map(|b| {
                    let kept = same_tls.and_then(|u| {
                        let i = u.backends.iter().position(|s| s.address == b.address)?;
                        u.tls.get(i).cloned()
                    });
                    kept.unwrap_or_else(|| Arc::new(t.connector(b.address)))
                })
                .collect(),
        };
        let backends = config
            .backends
            .iter()
            .map(|b| {
                match before.and_then(|u| u.backends.iter().find(|s| s.address == b.address)) {
                    Some(state) => {
                        state.configure(b);
                        // Without checks nothing else would ever bring it back up.
                        if config.health.is_none() {
                            state.set_up(true);
                            state.set_check_streak(0);
                        }
                        state.clone()
                    }
                    None => Arc::new(BackendState::new(b)),
                }
            })
            .collect();
        let ring = (config.algorithm == Algorithm::Hash).then(|| {
            let names: Vec<String> = config
                .backends
                .iter()
                .map(|b| b.address.to_string())
                .collect();
            let weights: Vec<u32> = config.backends.iter().map(|b| b.weight).collect();
            Rendezvous::new(&names, &weights)
        });
        SharedUpstream {
            has_backups: config.backends.iter().any(|b| b.backup),
            ring,
            config,
            backends,
            tls,
            counting,
        }
    }

    /// The TLS side of `backend`'s connections; `None` for plain TCP.
    pub fn tls(&self, backend: usize) -> Option<&Connector> {
        self.tls.get(backend).map(|c| &**c)
    }

    fn lone(&self) -> bool {
        self.backends.len() == 1
    }

    /// Counts a failed attempt against `backend` (nginx's max_fails); logs when it makes the
    /// backend skipped.
    pub fn record_failure(&self, backend: usize) {
        let passive = &self.config.passive;
        if self.lone() || passive.max_fails == 0 {
            return;
        }
        let b = &self.backends[backend];
        let mut w = b.window();
        let ft = passive.fail_timeout;
        if w.fail(clock_ms(), passive.max_fails, millis(ft)) {
            warn!(
                upstream = %self.config.name,
                "backend {} skipped for {ft:?} after {} failed attempt(s) within {ft:?}",
                b.address, passive.max_fails
            );
        }
        b.store_window(w);
    }

    /// Records a successful exchange on `guard`'s backend. Only the trial request brings a
    /// skipped backend back: a slow request that was sent before the failure and succeeds after
    /// it proves nothing about the backend now.
    pub fn record_success(&self, guard: &InFlight) {
        if !guard.trial {
            return;
        }
        let b = &guard.state;
        let mut w = b.window();
        if w.succeed() {
            b.store_window(w);
            b.start_ramp();
            info!(upstream = %self.config.name, "backend {} is back: a trial request passed", b.address);
        }
    }

    /// Whether some backend would take a request now: active, not held down by health checks,
    /// not skipped after failures (a lone backend never is). One at `max_conns` still counts:
    /// being busy is not being unready. What `/ready` asks of every upstream.
    pub fn has_backend_up(&self) -> bool {
        let lone = self.lone();
        self.backends.iter().any(|b| {
            b.admin_state() == AdminState::Active && b.is_up() && (lone || !b.is_skipped())
        })
    }

    /// Why no backend could be picked, for the 503 body and log line.
    pub fn unavailable(&self) -> String {
        // Only a spawned upstream's pool can be empty: before its first process answers, or
        // while all of them are being started again.
        if self.backends.is_empty() {
            return "no backend available: none of the upstream's spawned processes answers yet"
                .to_string();
        }
        let out = self
            .backends
            .iter()
            .filter(|b| b.admin_state() != AdminState::Active)
            .count();
        let down = self.backends.iter().filter(|b| !b.is_up()).count();
        let skipped = self
            .backends
            .iter()
            .filter(|b| b.is_up() && b.is_skipped())
            .count();
        let full = self.backends.iter().filter(|b| b.is_full()).count();
        let mut why = Vec::new();
        if out > 0 {
            why.push(format!("{out} draining or disabled"));
        }
        if down > 0 {
            why.push(format!("{down} down by health checks"));
        }
        if skipped > 0 {
            why.push(format!("{skipped} skipped after recent failures"));
        }
        if full > 0 {
            why.push(format!("{full} at max_conns"));
        }
        if why.is_empty() {
            why.push("every backend was tried".into());
        }
        format!(
            "no backend available among {}: {}",
            self.backends.len(),
            why.join(", ")
        )
    }
}

/// Counts one request against a backend's `in_flight` for as long as it lives.
///
/// It travels with the response body and is dropped when the body ends or the client goes away,
/// so errors, timeouts and cancelled clients can never leak a count.
#[derive(Debug)]
pub struct InFlight {
    state: Arc<BackendState>,
    /// This request is the one trial a skipped backend gets after `fail_timeout`.
    trial: bool,
}

impl InFlight {
    /// Counts a request against `b`, unless that would exceed its `max_conns`. The increment
    /// comes first, so two workers racing for the last slot cannot both get it.
    fn acquire(b: &Arc<BackendState>) -> Option<Self> {
        let before = b.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight {
            state: b.clone(),
            trial: false,
        };
        let max = b.max_conns.load(Ordering::Relaxed);
        if max != 0 && before >= max {
            return None;
        }
        Some(guard)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One worker's view of an upstream.
pub struct WorkerUpstream {
    pub shared: Arc<SharedUpstream>,
    /// Smooth weighted round-robin scores. Per worker: each worker's picks follow the weights
    /// exactly, so the sum over workers does too, without sharing a counter.
    wrr: RefCell<SmoothWrr>,
    /// Each pick's snapshot of the backends, kept to reuse the allocations.
    scratch: RefCell<Snapshot>,
    /// Idle keep-alive connections, one stack per backend (most recently used on top, so the
    /// warmest connection is reused and surplus ones age out). Shared with the next config
    /// generation's `WorkerUpstream` for each backend it keeps.
    idle: Vec<Rc<RefCell<Vec<Conn>>>>,
    /// For an HTTP/2 upstream, the multiplexed connections to each backend; kept across
    /// generations as `idle` is.
    multiplexed: Vec<Rc<h2::Pool>>,
}

/// One consistent view of state other workers keep changing: selection must see the same
/// numbers on every pass.
#[derive(Default)]
struct Snapshot {
    weights: Vec<u64>,
    loads: Vec<usize>,
    eligible: Vec<bool>,
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
            wrr: RefCell::new(SmoothWrr::new(n)),
            scratch: RefCell::new(Snapshot::default()),
            idle,
            multiplexed,
            shared,
        })
    }

    /// This worker's HTTP/2 connections to `backend`.
    pub fn multiplexed(&self, backend: usize) -> &h2::Pool {
        &self.multiplexed[backend]
    }

    /// Picks a backend by the upstream's algorithm among those not `excluded` that are up, not
    /// skipped after failures and below `max_conns`, and counts the request against it. Backups
    /// are picked only when no primary backend can be. `key` is the request's hash for a `hash`
    /// upstream (`None` there when the request has no such key: round robin then, as HAProxy
    /// does for an absent header); other algorithms ignore it.
    pub fn pick(
        &self,
        key: Option<u64>,
        excluded: impl Fn(usize) -> bool,
    ) -> Option<(usize, InFlight)> {
        let shared = &*self.shared;
        let lone = shared.lone();
        let mut now = Now::default();
        let mut scratch = self.scratch.borrow_mut();
        let Snapshot {
            weights,
            loads,
            eligible,
        } = &mut *scratch;
        weights.clear();
        loads.clear();
        eligible.clear();
        let rule = shared.config.algorithm;
        let counts_loads = rule == Algorithm::LeastConn;
        let is_backup = |i: usize| shared.has_backups && shared.config.backends[i].backup;
        for (i, b) in shared.backends.iter().enumerate() {
            eligible.push(!is_backup(i) && !excluded(i) && b.available(&mut now, lone));
            weights.push(b.weight_now(&mut now));
            if counts_loads {
                loads.push(b.in_flight.load(Ordering::Relaxed));
            }
        }
        let mut backups = false;
        let mut wrr = self.wrr.borrow_mut();
        // Each pass either returns, rules one backend out, or moves on to the backups once;
        // so this ends within n + 1 passes.
        loop {
            let picked = match rule {
                Algorithm::RoundRobin => wrr.pick(weights, |i| eligible[i]),
                Algorithm::LeastConn => least_conn(&mut wrr, weights, loads, eligible),
                // Only the two drawn backends' loads are read, when they are compared.
                Algorithm::RandomTwo => two_choices(weights, eligible, random, |a, b| {
                    let load = |i: usize| (i, shared.backends[i].in_flight());
                    less_loaded(weights, load(a), load(b))
                }),
                Algorithm::Ewma => two_choices(weights, eligible, random, |a, b| {
                    // Cost per unit of weight, cross-multiplied.
                    let cost = |i: usize| shared.backends[i].ewma_cost();
                    cost(a) * (weights[b] as f64) < cost(b) * (weights[a] as f64)
                }),
                Algorithm::Hash => match (key, &shared.ring) {
                    (Some(key), Some(ring)) => ring.pick(key, |i| eligible[i]),
                    _ => wrr.pick(weights, |i| eligible[i]),
                },
            };
            let Some(b) = picked else {
                if backups || !shared.has_backups {
                    return None;
                }
                backups = true;
                for (i, state) in shared.backends.iter().enumerate() {
                    eligible[i] = is_backup(i) && !excluded(i) && state.available(&mut now, lone);
                }
                continue;
            };
            if let Some(mut guard) = InFlight::acquire(&shared.backends[b]) {
                let fail_timeout = shared.config.passive.fail_timeout;
                if let Some(trial) = shared.backends[b].claim(&mut now, fail_timeout, lone) {
                    guard.trial = trial;
                    return Some((b, guard));
                }
            }
            eligible[b] = false;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

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
        u.shared.record_failure(0);
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
        u.shared.record_success(&ordinary);
        assert_eq!(picks(&u, 2), "bb");
        u.shared.record_success(&trial);
        drop((trial, ordinary));
        let after = picks(&u, 4);
        assert_eq!(after.matches('a').count(), 2, "{after}");
    }

    #[test]
    fn a_lone_backend_is_never_skipped_for_failures() {
        let u = upstream("", 1);
        u.shared.record_failure(0);
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
        let u = upstream("algorithm = \"random_two\"", 2);
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
}
