//! Outlier ejection by answers (`[upstream.NAME.outlier]`; Envoy's outlier detection, HAProxy's
//! `observe layer7`): a backend that answers 5xx too often is taken out of the pool for a while,
//! even though it accepts connections and answers fast, which passive checks (`max_fails`) do not
//! see.
//!
//! - **Consecutive 5xx**: `consecutive_5xx` answers of 500–599 in a row eject the backend.
//! - **Success rate**: every `interval`, each backend with `min_requests` answers or more whose
//!   share of answers below 500 is under `success_rate` times the pool's is ejected. (Envoy's
//!   rule, the mean less 1.9 standard deviations, ejects nobody in a pool of three where one
//!   backend fails half its answers: a fixed share of the pool's rate does.)
//!
//! Only the backends' own answers count: pinlb's 502 and 504 (a refused connect, a timeout) are
//! the passive checks' business (`max_fails`), and a 5xx from pinlb is never the backend's.
//!
//! An ejection is the passive checks' skip: the backend is left out of every pick until its time
//! is up, and then one trial request goes to it; its answer brings it back (logged, as a passive
//! skip's end is). The n-th ejection lasts n × `base_time`, at most `max_time`; a backend that
//! stayed in for `max_time` starts again from `base_time`. At most `max_ejected` of the pool is
//! out at once (ejected or skipped, at least one backend), and a lone backend is never ejected;
//! panic mode still holds. Each ejection is logged and counted (`pinlb_backend_ejections_total`,
//! the status page's `ejections`).
//!
//! All of it is atomics shared by the workers, touched only by upstreams with the table: the
//! plain path tests one `Option`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

use crate::config::Outlier;
use crate::sys::summed::summed_warn;
use crate::upstream::backend::{BackendState, clock_ms, millis};

/// The upstream a detector watches: its name, backends, and whether `/metrics` counts.
pub struct Pool<'a> {
    pub name: &'a str,
    pub backends: &'a [Arc<BackendState>],
    pub counting: bool,
}

/// An upstream's detector, for one generation.
#[derive(Debug)]
pub struct Detector {
    config: Outlier,
    /// When the interval under way began (ms); the answer that finds it over claims the count.
    interval_from: AtomicU64,
}

/// Why a backend is ejected.
enum Why {
    InARow(u32),
    Rate { rate: f64, pool: f64 },
}

impl Detector {
    pub fn new(config: Outlier) -> Detector {
        Detector {
            config,
            interval_from: AtomicU64::new(clock_ms()),
        }
    }

    /// Counts `status`, an answer of `b`, and ejects what it shows.
    #[cold]
    #[inline(never)]
    pub fn answered(&self, pool: &Pool<'_>, b: &BackendState, status: u16) {
        let c = &self.config;
        let counts = &b.outlier;
        let failed = (500..600).contains(&status);
        if failed {
            let n = counts.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
            if c.consecutive_5xx != 0 && n >= c.consecutive_5xx {
                counts.consecutive.store(0, Ordering::Relaxed);
                self.eject(pool, b, Why::InARow(n));
            }
        } else if counts.consecutive.load(Ordering::Relaxed) != 0 {
            counts.consecutive.store(0, Ordering::Relaxed);
        }
        if c.success_rate_per_mille == 0 {
            return;
        }
        counts.answers.fetch_add(1, Ordering::Relaxed);
        if failed {
            counts.fails.fetch_add(1, Ordering::Relaxed);
        }
        let from = self.interval_from.load(Ordering::Relaxed);
        let now = clock_ms();
        if now.saturating_sub(from) >= millis(c.interval)
            && (self.interval_from)
                .compare_exchange(from, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.rates(pool);
        }
    }

    /// The interval is over: each backend's success rate against the pool's.
    fn rates(&self, pool: &Pool<'_>) {
        let counted: Vec<(u32, u32)> = (pool.backends.iter())
            .map(|b| {
                let answers = b.outlier.answers.swap(0, Ordering::Relaxed);
                (
                    answers,
                    b.outlier.fails.swap(0, Ordering::Relaxed).min(answers),
                )
            })
            .collect();
        let (answers, fails) = counted.iter().fold((0u64, 0u64), |(a, f), &(n, x)| {
            (a + u64::from(n), f + u64::from(x))
        });
        if answers == 0 {
            return;
        }
        let pool_rate = (answers - fails) as f64 / answers as f64;
        let bar = pool_rate * f64::from(self.config.success_rate_per_mille) / 1000.0;
        for (b, &(n, x)) in pool.backends.iter().zip(&counted) {
            if n < self.config.min_requests {
                continue;
            }
            let rate = f64::from(n - x) / f64::from(n);
            if rate < bar {
                self.eject(
                    pool,
                    b,
                    Why::Rate {
                        rate,
                        pool: pool_rate,
                    },
                );
            }
        }
    }

    /// Ejects `b` for its next time, unless it is out already, alone, or the pool's share is.
    fn eject(&self, pool: &Pool<'_>, b: &BackendState, why: Why) {
        let now = clock_ms();
        if pool.backends.len() < 2 || now < b.skip_until_ms.load(Ordering::Relaxed) {
            return;
        }
        let name = pool.name;
        let out = (pool.backends.iter())
            .filter(|o| now < o.skip_until_ms.load(Ordering::Relaxed))
            .count();
        let may = (pool.backends.len() * self.config.max_ejected_per_mille as usize / 1000).max(1);
        if out + 1 > may {
            summed_warn!(
                upstream = %name, backend = %b.address;
                "not ejected: {out} of {} backends are out already (outlier.max_ejected)",
                pool.backends.len()
            );
            return;
        }
        let counts = &b.outlier;
        let (base, max) = (self.config.base_time, self.config.max_time);
        // A backend that stayed in for max_time starts again from base_time.
        let last_end = counts.ejected_until.load(Ordering::Relaxed);
        let n = if last_end != 0 && now.saturating_sub(last_end) >= millis(max) {
            1
        } else {
            counts.ejections.load(Ordering::Relaxed).saturating_add(1)
        };
        counts.ejections.store(n, Ordering::Relaxed);
        let time = base.saturating_mul(n).min(max);
        let until = now.saturating_add(millis(time)).max(1);
        counts.ejected_until.store(until, Ordering::Relaxed);
        b.skip_until_ms.store(until, Ordering::Relaxed);
        if pool.counting {
            b.stats.ejections.fetch_add(1, Ordering::Relaxed);
        }
        let why = match why {
            Why::InARow(k) => format!("{k} answers in a row were 5xx"),
            Why::Rate { rate, pool } => format!(
                "{:.0}% of its answers over the last {:?} were below 500, against {:.0}% of the pool's",
                rate * 100.0,
                self.config.interval,
                pool * 100.0
            ),
        };
        warn!(
            upstream = %name,
            "backend {} ejected for {time:?} (ejection {n}): {why}",
            b.address
        );
    }
}
