//! Selection: which backend of an upstream one request goes to, by the upstream's algorithm,
//! among those that may take it now. The algorithms are `balance`'s pure functions; this is
//! what they are given (one consistent snapshot of the shared state) and what is done with
//! their answer (the in-flight count taken, a trial claimed). A new algorithm is a function in
//! `balance` and an arm here. A sticky request's own backend is tried before any algorithm
//! ([`prefer`]).

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use crate::config::Algorithm;
use crate::upstream::backend::{AdminState, Now};
use crate::upstream::balance::{SmoothWrr, least_conn, less_loaded, random, two_choices};
use crate::upstream::in_flight::InFlight;
use crate::upstream::shared::SharedUpstream;

/// One worker's selection state for one upstream.
pub(super) struct Selection {
    /// Smooth weighted round-robin scores. Per worker: each worker's picks follow the weights
    /// exactly, so the sum over workers does too, without sharing a counter.
    wrr: RefCell<SmoothWrr>,
    /// Each pick's snapshot of the backends, kept to reuse the allocations.
    scratch: RefCell<Snapshot>,
}

/// One consistent view of state other workers keep changing: selection must see the same
/// numbers on every pass.
#[derive(Default)]
struct Snapshot {
    weights: Vec<u64>,
    loads: Vec<usize>,
    eligible: Vec<bool>,
}

impl Selection {
    pub(super) fn new(backends: usize) -> Self {
        Selection {
            wrr: RefCell::new(SmoothWrr::new(backends)),
            scratch: RefCell::new(Snapshot::default()),
        }
    }

    /// Picks a backend of `shared` by its algorithm among those not `excluded` that are up, not
    /// skipped after failures and below `max_conns`, and counts the request against it. Backups
    /// are picked only when no primary backend can be. `key` is the request's hash for a `hash`
    /// upstream (`None` there when the request has no such key: round robin then, as HAProxy
    /// does for an absent header); other algorithms ignore it.
    pub(super) fn pick(
        &self,
        shared: &SharedUpstream,
        key: Option<u64>,
        excluded: impl Fn(usize) -> bool,
    ) -> Option<(usize, InFlight)> {
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
        let mut panic = false;
        let mut wrr = self.wrr.borrow_mut();
        // Each pass either returns, rules one backend out, or moves on once to the backups
        // and once to panic mode; so this ends within 2n + 2 passes.
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
                if !backups && shared.has_backups {
                    backups = true;
                    for (i, state) in shared.backends.iter().enumerate() {
                        eligible[i] =
                            is_backup(i) && !excluded(i) && state.available(&mut now, lone);
                    }
                    continue;
                }
                // Panic mode: nothing could be picked, but backends skipped after failures
                // could take the request. Refusing everyone helps nobody (a busy pool looks
                // failed), so they are all tried, primaries and backups alike, as one pass.
                if panic {
                    return None;
                }
                panic = true;
                // Only when every backend that could take requests is skipped: one that is
                // merely at max_conns is busy, and the request waits for it or gets a 503.
                if shared
                    .backends
                    .iter()
                    .any(|b| b.available_but_full(&mut now))
                {
                    return None;
                }
                let mut any = false;
                for (i, state) in shared.backends.iter().enumerate() {
                    eligible[i] = !excluded(i) && state.only_skipped(&mut now);
                    any |= eligible[i];
                }
                if !any {
                    return None;
                }
                shared.panic();
                continue;
            };
            if panic {
                // Each answer is a trial's: one success ends the backend's skip.
                if let Some(mut guard) = InFlight::acquire(&shared.backends[b]) {
                    guard.trial = true;
                    return Some((b, guard));
                }
                eligible[b] = false;
                continue;
            }
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
}

/// Counts a request against backend `b`, the one its cookie names, if `b` can take it now: up
/// (health and passive checks), not disabled, below `max_conns`. A `draining` backend still
/// takes the clients it has (nginx Plus's and HAProxy's `drain`): draining ends their sessions
/// gently, not at once. `None` sends the request to the upstream's algorithm, and its answer
/// carries a new cookie.
#[cold]
#[inline(never)]
pub(super) fn prefer(shared: &SharedUpstream, b: usize) -> Option<(usize, InFlight)> {
    let state = shared.backends.get(b)?;
    let lone = shared.lone();
    let mut now = Now::default();
    let admin = state.admin_state();
    if admin == AdminState::Disabled || !state.is_up() || (!lone && state.skipped(&mut now)) {
        return None;
    }
    let mut guard = InFlight::acquire(state)?;
    guard.trial = state.claim(&mut now, shared.config.passive.fail_timeout, lone)?;
    if shared.counting {
        state.stats.requests.fetch_add(1, Ordering::Relaxed);
    }
    Some((b, guard))
}
