//! An upstream as every worker sees it in one configuration generation: its backends' shared
//! state, their TLS connectors, the hash ring, and the passive-health rules applied to them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use tracing::{info, warn};

use crate::config::{Algorithm, Upstream};
use crate::modules::sticky::table::StickyTable;
use crate::tls::client::Connector;
use crate::upstream::backend::{AdminState, BackendState, clock_ms, millis};
use crate::upstream::balance::Rendezvous;
use crate::upstream::outlier::Detector;
use crate::upstream::queue::Queue;

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
    pub(super) ring: Option<Rendezvous>,
    /// Whether any backend is a `backup`, so upstreams without any never look.
    pub(super) has_backups: bool,
    /// With `queue`, where requests wait when every backend is at `max_conns`; `None`
    /// without, and then no request ever waits or takes a lock.
    pub queue: Option<Arc<Queue>>,
    /// Panic mode: every backend was skipped after failures, so they are all tried anyway
    /// (Envoy's panic threshold, at zero). On from the first request that finds them so
    /// until one of them answers; each change is logged once.
    pub(super) panicking: AtomicBool,
    /// `sticky`: the cookie's settings and each backend's value, built once per generation;
    /// `None` without, and then the request path never looks at a cookie.
    pub sticky: Option<Box<StickyTable>>,
    /// `[outlier]`: ejection by answers; `None` without, and then answers are not looked at.
    pub(super) outlier: Option<Detector>,
    /// Side requests (`mirror`'s copies) to it in flight, across workers, and those dropped
    /// past their `max_in_flight` (`proxy::side_request`); counted for this generation.
    pub side_in_flight: AtomicUsize,
    pub side_dropped: AtomicU64,
    /// Retries on a status the worker's retry budget refused (`retry.budget`).
    pub budget_refused: AtomicU64,
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
                    kept.unwrap_or_else(|| Arc::new(t.connector(b.address.tcp())))
                })
                .collect(),
        };
        // The queue stays across reloads, with the requests waiting in it; one that a reload
        // turns off serves those still waiting.
        let queue_before = before.and_then(|u| {
            u.queue
                .clone()
                .or_else(|| u.backends.iter().find_map(|b| b.queue.get().cloned()))
        });
        if let (Some(q), 0) = (&queue_before, config.queue) {
            q.set_max(0);
        }
        let queue = (config.queue > 0).then(|| {
            let q = queue_before.unwrap_or_else(|| Arc::new(Queue::new(config.queue)));
            q.set_max(config.queue);
            q
        });
        let backends: Vec<Arc<BackendState>> = config
            .backends
            .iter()
            .map(|b| {
                match before.and_then(|u| u.backends.iter().find(|s| s.address == b.address)) {
                    Some(state) => {
                        state.configure(b, config.adaptive);
                        // Without checks nothing else would ever bring it back up.
                        if config.health.is_none() {
                            state.set_up(true);
                            state.set_check_streak(0);
                        }
                        state.clone()
                    }
                    None => Arc::new(BackendState::new(b, config.adaptive)),
                }
            })
            .collect();
        for b in &backends {
            b.connecting.set_max(config.max_connecting);
            if let Some(q) = &queue {
                // Set once per backend, to its upstream's one queue.
                let _ = b.queue.set(q.clone());
            }
        }
        let ring = (config.algorithm == Algorithm::Hash).then(|| {
            let names: Vec<String> = config
                .backends
                .iter()
                .map(|b| b.address.to_string())
                .collect();
            let weights: Vec<u32> = config.backends.iter().map(|b| b.weight).collect();
            Rendezvous::new(&names, &weights)
        });
        let sticky = config.sticky.as_ref().map(|s| {
            let addresses: Vec<_> = backends.iter().map(|b| b.address).collect();
            Box::new(StickyTable::new(s, &config.name, &addresses))
        });
        SharedUpstream {
            outlier: config.outlier.clone().map(Detector::new),
            side_in_flight: AtomicUsize::new(0),
            side_dropped: AtomicU64::new(0),
            budget_refused: AtomicU64::new(0),
            sticky,
            has_backups: config.backends.iter().any(|b| b.backup),
            queue,
            panicking: AtomicBool::new(false),
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

    pub(super) fn lone(&self) -> bool {
        self.backends.len() == 1
    }

    /// Counts a failed attempt against `backend` (nginx's max_fails); logs when it makes the
    /// backend skipped.
    pub fn record_failure(&self, b: &BackendState) {
        let passive = &self.config.passive;
        if self.lone() || passive.max_fails == 0 {
            return;
        }
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

    /// Records a successful exchange on `b`. Only the `trial` request brings a skipped backend
    /// back: a slow request that was sent before the failure and succeeds after it proves
    /// nothing about the backend now.
    pub fn record_success(&self, b: &BackendState, trial: bool) {
        if !trial {
            return;
        }
        let mut w = b.window();
        if w.succeed() {
            b.store_window(w);
            b.start_ramp();
            info!(upstream = %self.config.name, "backend {} is back: a trial request passed", b.address);
            if self.panicking.swap(false, Ordering::Relaxed) {
                info!(
                    upstream = %self.config.name,
                    "panic mode off: backend {} answered, so skipped backends are skipped again",
                    b.address
                );
            }
        }
    }

    /// Turns panic mode on, logging it once: no backend could be picked, and some are only
    /// skipped after failures.
    #[cold]
    pub(super) fn panic(&self) {
        if !self.panicking.swap(true, Ordering::Relaxed) {
            warn!(
                upstream = %self.config.name,
                "panic mode on: every available backend is skipped after recent failures, so \
                 requests go to them anyway until one answers (refusing everyone would not help)"
            );
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
        let learned = self.backends.iter().filter(|b| b.limiter.is_full()).count();
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
        if full > learned {
            why.push(format!("{} at max_conns", full - learned));
        }
        if learned > 0 {
            why.push(format!("{learned} at their learned concurrency limit"));
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
