//! What `GET /status` answers and the status page draws: the version, every listener with its
//! connections, responses and request rate, every backend with its state, how long it has been
//! in it, its request and error rates, its latency over the last minute, its responses by class,
//! retries and last health check.
//!
//! Most of it is read from `stats` at the moment of the request. Three things need a past, which
//! the counters do not keep: the latency over the last minute (the difference between the
//! response-time histogram now and a minute ago), how long a backend has been in its state, and
//! the rates (the difference between the request and error counters at the two newest samples,
//! so that one `/status` has them and the page's first paint shows them). A [`Window`] keeps all
//! three: [`Window::sample`], called every second on the control thread, stores each backend's
//! histogram buckets and the counters the page shows rates of, and notes each change of state.
//! It costs the request path nothing: it only reads the atomics the request path writes anyway.
//!
//! The sampler also keeps each learning backend's concurrency limit (`upstream::adaptive`) every
//! [`LIMIT_EVERY`], the last [`LIMIT_SAMPLES`] of them (ten minutes), so that the page's chart
//! of it has a past from the moment it is opened: `/status` gives them oldest first as each
//! backend's `concurrency_limit_history`, and the period as
//! `concurrency_limit_history_every_seconds`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use crate::backend_address::BackendAddress;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::process::shared::Process;
use crate::upstream::backend::{AdminState, BackendState};
use crate::upstream::counters::{ListenerStats, Source};

/// How far back the page's latency percentiles reach.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// How often [`Window::sample`] runs.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often each learning backend's concurrency limit is kept for the page's chart, and how
/// many are kept: ten minutes.
pub(crate) const LIMIT_EVERY: Duration = Duration::from_secs(5);
pub(crate) const LIMIT_SAMPLES: usize = 120;

/// A backend, as the window tells backends apart: its upstream and address.
type Key = (String, BackendAddress);

/// A counter the page shows as a rate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Counter {
    /// A bound listener's requests, summed over the workers that share its address.
    Listener(SocketAddr),
    /// A worker's requests, over all its listeners.
    Worker(usize),
    BackendRequests(Key),
    BackendErrors(Key),
}

/// What the window keeps of one moment.
#[derive(Debug)]
struct Sample {
    at: Instant,
    /// Each backend's response-time histogram, per bucket.
    buckets: HashMap<Key, Vec<u64>>,
    counts: HashMap<Counter, u64>,
}

/// Each counter's rate per second over the window between the two newest samples, and that
/// window's length; empty before the first sample.
#[derive(Debug, Default)]
pub(crate) struct Rates {
    per_second: HashMap<Counter, f64>,
    over: Option<Duration>,
}

impl Rates {
    /// The counter's rate, rounded as `/status` shows it; `None` for one the newest sample
    /// hasn't seen (a backend a reload added since).
    fn of(&self, counter: &Counter) -> Option<f64> {
        self.per_second.get(counter).copied().map(thousandths)
    }
}

/// The past the counters don't keep. The lock is taken once a second by the sampler and once
/// per `/status`, both on the control thread, never while anything awaits.
#[derive(Debug, Default)]
pub(crate) struct Window {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Oldest first, at most one per [`SAMPLE_EVERY`] over [`WINDOW`] (plus one, the base).
    samples: VecDeque<Sample>,
    /// Each backend's state word and since when.
    states: HashMap<Key, (&'static str, Instant)>,
    /// Each backend's concurrency limit every [`LIMIT_EVERY`], oldest first, at most
    /// [`LIMIT_SAMPLES`]; `None` while it did not learn one (it had learned before).
    limits: HashMap<Key, VecDeque<Option<usize>>>,
    /// When the limits were last kept.
    limits_at: Option<Instant>,
}

impl Window {
    /// Records every backend's response-time buckets and state, and the counters the page
    /// shows rates of, now; and forgets what is older than the window needs.
    pub(crate) fn sample(&self, process: &Process) {
        let generation = process.generations.borrow().clone();
        let now = Instant::now();
        let mut buckets = HashMap::new();
        let mut counts = HashMap::new();
        let mut states = Vec::new();
        let mut limits = Vec::new();
        for u in &generation.upstreams {
            for b in u.backends.iter() {
                let key = (u.config.name.clone(), b.address);
                limits.push((key.clone(), b.limiter.limit()));
                let histogram = b.stats.response_time.snapshot().2;
                buckets.insert(key.clone(), histogram.into_iter().map(|(_, n)| n).collect());
                let requests = b.stats.requests.load(Ordering::Relaxed);
                counts.insert(Counter::BackendRequests(key.clone()), requests);
                counts.insert(Counter::BackendErrors(key.clone()), b.stats.errors_total());
                states.push((key, state_word(b)));
            }
        }
        for l in process.registered.all() {
            let requests = l.requests.load(Ordering::Relaxed);
            *counts.entry(Counter::Listener(l.listener)).or_default() += requests;
            *counts.entry(Counter::Worker(l.worker)).or_default() += requests;
        }
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (key, state) in states {
            note_state(&mut inner.states, key, state, now);
        }
        inner.keep_limits(now, limits);
        inner.record(
            process.started,
            Sample {
                at: now,
                buckets,
                counts,
            },
        );
    }

    /// The rates over the last completed window: between the two newest samples, about
    /// [`SAMPLE_EVERY`] apart. A window that is still open (from the newest sample to now)
    /// would hold a fraction of a second's requests, as noisy as the browser's own difference
    /// of two polls was; one completed window is the same for every reader within the second.
    pub(crate) fn rates(&self) -> Rates {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut newest = inner.samples.iter().rev();
        match (newest.next(), newest.next()) {
            (Some(newer), Some(older)) => Rates {
                per_second: per_second(older, newer),
                over: Some(newer.at.duration_since(older.at)),
            },
            _ => Rates::default(),
        }
    }

    /// The backend's p50 and p99 in seconds over the window, from its histogram now and the
    /// oldest sample kept; `None` without a request in it.
    fn percentiles(&self, key: &Key, b: &BackendState) -> Option<(f64, f64)> {
        let (_, _, now) = b.stats.response_time.snapshot();
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let base = inner.samples.front().and_then(|s| s.buckets.get(key));
        let counts: Vec<(f64, u64)> = now
            .iter()
            .enumerate()
            .map(|(i, &(le, n))| {
                let before = base.and_then(|v| v.get(i)).copied().unwrap_or(0);
                (le, n.saturating_sub(before))
            })
            .collect();
        Some((quantile(&counts, 0.5)?, quantile(&counts, 0.99)?))
    }

    /// The backend's concurrency limits kept for the chart, oldest first; empty for one that
    /// never learned one.
    fn limit_history(&self, key: &Key) -> Vec<Option<usize>> {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        inner
            .limits
            .get(key)
            .map(|h| h.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How long the backend has been in `state`, as far as the samples saw; noted now if new.
    fn in_state(&self, key: &Key, state: &'static str) -> Duration {
        let now = Instant::now();
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        note_state(&mut inner.states, key.clone(), state, now);
        inner
            .states
            .get(key)
            .map_or(Duration::ZERO, |(_, since)| now.duration_since(*since))
    }
}

impl Inner {
    /// Keeps each backend's limit (`None`: it does not learn one) once [`LIMIT_EVERY`] has
    /// passed since the last time, give or take half a sampling tick, so that one-second ticks
    /// keep one in five. A backend gets a history once it learns; one that stops learning keeps
    /// a gap (`None`) until its learned limits have left the window; one no longer in
    /// `limits` (a reload removed it) is forgotten.
    fn keep_limits(&mut self, now: Instant, limits: Vec<(Key, Option<usize>)>) {
        let due = self
            .limits_at
            .is_none_or(|at| now.saturating_duration_since(at) + SAMPLE_EVERY / 2 >= LIMIT_EVERY);
        if !due {
            return;
        }
        self.limits_at = Some(now);
        let mut kept = HashMap::with_capacity(limits.len());
        for (key, limit) in limits {
            let mut history = self.limits.remove(&key).unwrap_or_default();
            if limit.is_none() && history.is_empty() {
                continue;
            }
            if history.len() == LIMIT_SAMPLES {
                history.pop_front();
            }
            history.push_back(limit);
            if history.iter().any(Option::is_some) {
                kept.insert(key, history);
            }
        }
        self.limits = kept;
    }

    /// Adds `sample` as the newest, and drops the oldest ones the window no longer needs.
    fn record(&mut self, started: Instant, sample: Sample) {
        if self.samples.is_empty() {
            // The base until a sample is a window old: the process's start, when every count
            // was zero. Without it the first sample would be the base, and requests served
            // before the sampler first ran (a loaded machine starts it late) would never show,
            // neither in the percentiles nor in the first rates.
            self.samples.push_back(Sample {
                at: started.min(sample.at),
                buckets: HashMap::new(),
                counts: HashMap::new(),
            });
        }
        let now = sample.at;
        self.samples.push_back(sample);
        // Keep the newest sample at least WINDOW old, as the base the differences start from.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|s| now.duration_since(s.at) >= WINDOW)
        {
            self.samples.pop_front();
        }
    }
}

/// Each counter of `newer` per second since `older`. One that `older` lacks counted from zero:
/// the base at the process's start has no counter, and a backend or listener a reload added
/// started at zero since. One that went down (a backend removed and added back by reloads
/// starts its counters again) shows 0, not a negative rate. Nothing when no time passed.
fn per_second(older: &Sample, newer: &Sample) -> HashMap<Counter, f64> {
    let seconds = newer.at.saturating_duration_since(older.at).as_secs_f64();
    if seconds <= 0.0 {
        return HashMap::new();
    }
    newer
        .counts
        .iter()
        .map(|(counter, &now)| {
            let before = older.counts.get(counter).copied().unwrap_or(0);
            (counter.clone(), now.saturating_sub(before) as f64 / seconds)
        })
        .collect()
}

fn note_state(
    states: &mut HashMap<Key, (&'static str, Instant)>,
    key: Key,
    state: &'static str,
    now: Instant,
) {
    match states.get_mut(&key) {
        Some(seen) if seen.0 == state => {}
        Some(seen) => *seen = (state, now),
        None => {
            states.insert(key, (state, now));
        }
    }
}

/// The `q` quantile of a histogram given as per-bucket counts with upper bounds (the last one
/// +Inf), interpolated linearly within its bucket as Prometheus's `histogram_quantile` does;
/// one in the +Inf bucket is the highest finite bound. `None` when the histogram is empty.
pub(crate) fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    let mut lower = 0.0;
    for &(le, n) in buckets {
        if n > 0 && (below + n) as f64 >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let into = (rank - below as f64) / n as f64;
            return Some(lower + (le - lower) * into.clamp(0.0, 1.0));
        }
        below += n;
        if le.is_finite() {
            lower = le;
        }
    }
    Some(lower)
}

/// One word for what keeps a backend from taking requests, if anything: the page's colour.
fn state_word(b: &BackendState) -> &'static str {
    let admin = b.admin_state();
    if admin != AdminState::Active {
        admin.as_str()
    } else if !b.is_up() {
        "down"
    } else if b.is_ejected() {
        "ejected"
    } else if b.is_skipped() {
        "skipped"
    } else if b.is_full() {
        "full"
    } else {
        "up"
    }
}

/// Responses by class as `{"1xx": n, ..., "5xx": n}`.
fn classes(counts: [u64; 5]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (i, n) in counts.iter().enumerate() {
        m.insert(format!("{}xx", i + 1), json!(n));
    }
    serde_json::Value::Object(m)
}

/// What the status page and `GET /status` show: the same picture as `/metrics`, the last
/// minute, and the rates over the last second.
pub(crate) fn status(process: &Process, window: &Window) -> serde_json::Value {
    let generation = process.generations.borrow().clone();
    let config = &generation.config;
    let listeners = process.registered.all();
    let rates = window.rates();
    let workers: Vec<_> = config
        .runtime
        .cpus
        .iter()
        .enumerate()
        .map(|(w, core)| {
            let requests: u64 = listeners
                .iter()
                .filter(|l| l.worker == w)
                .map(|l| l.requests.load(Ordering::Relaxed))
                .sum();
            json!({
                "worker": w,
                "core": core,
                "requests": requests,
                "requests_per_second": rates.of(&Counter::Worker(w)),
            })
        })
        .collect();
    let names = process.dns.names();
    let upstreams: Vec<_> = generation
        .upstreams
        .iter()
        .map(|u| {
            let backends: Vec<_> = u
                .backends
                .iter()
                .zip(&u.config.backends)
                .map(|(b, c)| backend_status(&u.config.name, b, c, window, &rates))
                .collect();
            // Each DNS name with the addresses it resolved to (backends above, among the rest).
            let names: Vec<_> = names
                .iter()
                .filter(|n| n.upstream == u.config.name)
                .map(|n| {
                    json!({
                        "name": n.name.to_string(),
                        "addresses": n.addresses.iter().map(|(a, w)| json!({ "address": a.to_string(), "weight": w })).collect::<Vec<_>>(),
                        "failures": n.failures,
                        "failing": n.failing,
                    })
                })
                .collect();
            json!({
                "name": u.config.name,
                "algorithm": u.config.algorithm.as_str(),
                "hash": u.config.hash.as_ref().map(ToString::to_string),
                "health_checks": u.config.health.is_some(),
                "queue": u.queue.as_deref().map(|q| {
                    let (sum, count, _) = q.stats.wait_time.snapshot();
                    json!({
                        "max": u.config.queue,
                        "waiting": q.waiting(),
                        "dequeued": q.stats.dequeued.load(Ordering::Relaxed),
                        "timeouts": q.stats.timeouts.load(Ordering::Relaxed),
                        "overflows": q.stats.overflows.load(Ordering::Relaxed),
                        // The mean wait of those that went to a backend, in seconds.
                        "mean_wait_s": (count > 0).then(|| thousandths(sum / count as f64)),
                    })
                }),
                "backends": backends,
                "names": names,
            })
        })
        .collect();
    let listener_list: Vec<_> = config
        .listeners
        .iter()
        .flat_map(|l| {
            let upstream = &config.upstreams[l.upstream].name;
            // Each worker has its own counters for a listener: one row per bound address.
            let mut bound: Vec<SocketAddr> = listeners
                .iter()
                .filter(|s| s.configured == l.address)
                .map(|s| s.listener)
                .collect();
            bound.sort_unstable();
            bound.dedup();
            if bound.is_empty() {
                bound.push(l.address);
            }
            bound
                .into_iter()
                .map(|addr| {
                    let mine: Vec<&std::sync::Arc<ListenerStats>> =
                        listeners.iter().filter(|s| s.listener == addr).collect();
                    let rate = rates.of(&Counter::Listener(addr));
                    listener_status(addr, upstream, l.tls.is_some(), &mine, rate)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "generation": generation.number,
        "uptime_seconds": thousandths(process.started.elapsed().as_secs_f64()),
        "config_file": process.config_path.as_ref().map(|p| p.display().to_string()),
        "metrics": config.admin.is_some(),
        // How long the window the rates are over was: about a second, more on a loaded machine
        // whose sampler ran late, less for the first (from the process's start to the first
        // sample); `null`, and every rate with it, before the first sample.
        "rate_window_seconds": rates.over.map(|d| thousandths(d.as_secs_f64())),
        // The time between two entries of each backend's `concurrency_limit_history`.
        "concurrency_limit_history_every_seconds": LIMIT_EVERY.as_secs(),
        "workers": workers,
        "listeners": listener_list,
        "upstreams": upstreams,
        "spawned": spawned_status(&process.spawned.all()),
        "caches": cache_status(&process.caches.figures(), &config.cache_zones),
    })
}

/// Each cache zone in use: what it holds against its `max_size`, and what it did.
fn cache_status(
    figures: &[crate::modules::cache::zone::Figures],
    zones: &[crate::modules::cache::zone::ZoneConfig],
) -> serde_json::Value {
    figures
        .iter()
        .map(|f| {
            let looked_up = f.hits + f.misses + f.expired + f.stale + f.revalidated;
            let answered = f.hits + f.stale + f.revalidated;
            json!({
                "zone": f.zone,
                "entries": f.entries,
                "bytes": f.bytes,
                "max_size": zones.iter().find(|z| z.name == f.zone).map(|z| z.max_size),
                "hits": f.hits,
                "misses": f.misses,
                "expired": f.expired,
                "stale": f.stale,
                "revalidated": f.revalidated,
                "bypassed": f.bypassed,
                "collapsed": f.collapsed,
                "stored": f.stored,
                "evicted": f.evicted,
                // Of the requests looked up, the share answered from the zone; `null` before any.
                "hit_ratio": (looked_up > 0).then(|| thousandths(answered as f64 / looked_up as f64)),
            })
        })
        .collect()
}

/// The spawned backends, by upstream and index.
fn spawned_status(records: &[crate::process::spawned::Record]) -> serde_json::Value {
    records
        .iter()
        .map(|r| {
            json!({
                "upstream": r.upstream,
                "index": r.index,
                "pid": r.pid,
                "address": r.address.to_string(),
                "core": r.core,
                "state": r.state.as_str(),
                "restarts": r.restarts,
                "last_exit": r.last_exit,
            })
        })
        .collect()
}

fn listener_status(
    addr: SocketAddr,
    upstream: &str,
    tls: bool,
    stats: &[&std::sync::Arc<ListenerStats>],
    requests_per_second: Option<f64>,
) -> serde_json::Value {
    let sum = |f: &dyn Fn(&ListenerStats) -> u64| -> u64 { stats.iter().map(|s| f(s)).sum() };
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let accepted = sum(&|s| load(&s.accepted));
    let closed = sum(&|s| load(&s.closed));
    let mut by_class = [0u64; 5];
    for (class, slot) in by_class.iter_mut().enumerate() {
        let first = 100 * (class as u16 + 1);
        for code in first..first + 100 {
            *slot +=
                sum(&|s| s.responses(Source::Backend, code) + s.responses(Source::Pinlb, code));
        }
    }
    json!({
        "address": addr.to_string(),
        "upstream": upstream,
        "tls": tls,
        "connections": accepted.saturating_sub(closed),
        "accepted": accepted,
        "requests": sum(&|s| load(&s.requests)),
        "requests_per_second": requests_per_second,
        "responses": classes(by_class),
    })
}

/// What `/status` shows of a time or a rate: rounded to the thousandth, so milliseconds (`*_ms`)
/// to the microsecond, seconds (`*_seconds`, `seconds_ago`) to the millisecond and rates
/// (`*_per_second`) to a thousandth of a request. Finer digits are no measurement (latencies
/// come from histogram buckets, rates from a window timed to the sampler's wake-up) and the
/// arithmetic would show as noise (`2.4699999999999998`); the rounded value prints as its
/// shortest decimal (`2.47`).
fn thousandths(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn backend_status(
    upstream: &str,
    b: &BackendState,
    config: &crate::config::Backend,
    window: &Window,
    rates: &Rates,
) -> serde_json::Value {
    let admin = b.admin_state();
    let state = state_word(b);
    let key = (upstream.to_string(), b.address);
    let s = &b.stats;
    let responses: [u64; 5] = std::array::from_fn(|i| s.responses[i].load(Ordering::Relaxed));
    let latency = window.percentiles(&key, b);
    let limit = b.limiter.limit();
    let last_check = s.last_check().map(|(ms, passed)| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        json!({
            "passed": passed,
            "seconds_ago": thousandths(now.saturating_sub(ms) as f64 / 1000.0),
        })
    });
    json!({
        "address": b.address.to_string(),
        "state": state,
        "state_seconds": thousandths(window.in_state(&key, state).as_secs_f64()),
        "health": if b.is_up() { "up" } else { "down" },
        "admin": admin.as_str(),
        "weight": b.weight(),
        "backup": config.backup,
        "in_flight": b.in_flight(),
        // What the page draws the in-flight bar against; `null` for no limit (`max_conns = 0`),
        // which has no full to draw.
        "max_conns": (config.max_conns > 0).then_some(config.max_conns),
        // `ewma` upstreams: the response-time average picks are made on.
        "ewma_ms": b.ewma().map(|d| thousandths(d.as_secs_f64() * 1000.0)),
        // `adaptive`: the limit the backend learned (`null` when it learns none: a
        // `max_conns`, or `adaptive = false`), the requests it counts against it (those that
        // await their response head), and its time without queueing the limit is set against
        // (`null` until measured, or when it learns none).
        "concurrency_limit": limit,
        "awaiting": b.limiter.awaiting(),
        "min_rtt_ms": limit
            .and(b.limiter.min_rtt())
            .map(|d| thousandths(d.as_secs_f64() * 1000.0)),
        // Its limit every `concurrency_limit_history_every_seconds`, oldest first, over the
        // last ten minutes: what the page's chart draws. `null` where it learned none.
        "concurrency_limit_history": window.limit_history(&key),
        "requests": s.requests.load(Ordering::Relaxed),
        "requests_per_second": rates.of(&Counter::BackendRequests(key.clone())),
        "errors": s.errors_total(),
        "errors_per_second": rates.of(&Counter::BackendErrors(key.clone())),
        "retries": s.retries.load(Ordering::Relaxed),
        // Times `[outlier]` ejected it for its answers.
        "ejections": s.ejections.load(Ordering::Relaxed),
        // New connections against reused ones: `pinlb bench`'s fairness checks read these to
        // see whether the proxy keeps its backend connections alive.
        "connections_opened": s.connections_opened.load(Ordering::Relaxed),
        "connections_reused": s.connections_reused.load(Ordering::Relaxed),
        "responses": classes(responses),
        "p50_ms": latency.map(|l| thousandths(l.0 * 1000.0)),
        "p99_ms": latency.map(|l| thousandths(l.1 * 1000.0)),
        "last_check": last_check,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_learning_backends_limit_is_kept_every_five_seconds_for_ten_minutes() {
        let mut inner = Inner::default();
        let key =
            |port: u16| -> Key { ("app".into(), format!("127.0.0.1:{port}").parse().unwrap()) };
        let (learns, fixed, gone) = (key(1), key(2), key(3));
        let t0 = Instant::now();
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        // The sampler ticks every second: the first tick keeps, then one in five. A backend
        // that learns none (`max_conns`) gets no history.
        for tick in 0..=10 {
            let limits = vec![
                (learns.clone(), Some(20 + tick)),
                (fixed.clone(), None),
                (gone.clone(), Some(7)),
            ];
            inner.keep_limits(at(tick as f64), limits);
        }
        let history = |inner: &Inner, k: &Key| -> Vec<Option<usize>> {
            inner
                .limits
                .get(k)
                .map(|h| h.iter().copied().collect())
                .unwrap_or_default()
        };
        assert_eq!(history(&inner, &learns), [Some(20), Some(25), Some(30)]);
        assert!(!inner.limits.contains_key(&fixed));
        // A tick late by most of a second still keeps its sample: five seconds, not six.
        inner.keep_limits(at(14.6), vec![(learns.clone(), Some(1))]);
        assert_eq!(history(&inner, &learns).last(), Some(&Some(1)));
        assert!(
            !inner.limits.contains_key(&gone),
            "a backend removed is forgotten"
        );
        // Ten minutes at most; a backend that stops learning shows gaps, then is forgotten.
        for i in 0..LIMIT_SAMPLES {
            inner.keep_limits(at(20.0 + 5.0 * i as f64), vec![(learns.clone(), Some(i))]);
        }
        let kept = history(&inner, &learns);
        assert_eq!(kept.len(), LIMIT_SAMPLES);
        assert_eq!(
            (kept[0], kept[LIMIT_SAMPLES - 1]),
            (Some(0), Some(LIMIT_SAMPLES - 1))
        );
        let later = 20.0 + 5.0 * LIMIT_SAMPLES as f64;
        inner.keep_limits(at(later), vec![(learns.clone(), None)]);
        assert_eq!(history(&inner, &learns).last(), Some(&None));
        for i in 1..LIMIT_SAMPLES {
            inner.keep_limits(at(later + 5.0 * i as f64), vec![(learns.clone(), None)]);
        }
        assert!(!inner.limits.contains_key(&learns), "{:?}", inner.limits);
    }

    #[test]
    fn times_are_shown_to_the_thousandth_without_float_noise() {
        let shown = json!({
            "p99_ms": thousandths(0.00247 * 1000.0),
            "p50_ms": thousandths(0.1 * 3.0 * 1000.0),
            "ewma_ms": thousandths(1.23456789),
            "min_rtt_ms": thousandths(Duration::from_nanos(452_631).as_secs_f64() * 1000.0),
            "state_seconds": thousandths(12.0004999),
            "seconds_ago": thousandths(0.0),
        });
        assert_eq!(
            shown.to_string(),
            r#"{"ewma_ms":1.235,"min_rtt_ms":0.453,"p50_ms":300.0,"p99_ms":2.47,"seconds_ago":0.0,"state_seconds":12.0}"#
        );
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let b = [(0.001, 10), (0.01, 80), (0.1, 10), (f64::INFINITY, 0)];
        assert_eq!(quantile(&b, 0.0), Some(0.0));
        // The 50th of 100 is the 40th of the 80 in (1 ms, 10 ms].
        let p50 = quantile(&b, 0.5).unwrap();
        assert!((p50 - (0.001 + 0.009 * 40.0 / 80.0)).abs() < 1e-12, "{p50}");
        let p99 = quantile(&b, 0.99).unwrap();
        assert!((p99 - (0.01 + 0.09 * 0.9)).abs() < 1e-12, "{p99}");
        assert_eq!(quantile(&[(0.1, 0), (f64::INFINITY, 0)], 0.5), None);
        assert_eq!(
            quantile(&[(0.1, 0), (f64::INFINITY, 3)], 0.5),
            Some(0.1),
            "beyond the last bound is the last bound"
        );
    }

    #[test]
    fn a_state_keeps_its_start_until_it_changes() {
        let mut states = HashMap::new();
        let key = ("app".to_string(), "127.0.0.1:1".parse().unwrap());
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(5);
        note_state(&mut states, key.clone(), "up", t0);
        note_state(&mut states, key.clone(), "up", t1);
        assert_eq!(states[&key], ("up", t0));
        note_state(&mut states, key.clone(), "draining", t1);
        assert_eq!(states[&key], ("draining", t1));
    }

    fn sample(at: Instant, counts: &[(Counter, u64)]) -> Sample {
        Sample {
            at,
            buckets: HashMap::new(),
            counts: counts.iter().cloned().collect(),
        }
    }

    #[test]
    fn a_rate_is_the_counters_difference_over_the_time_between_two_samples() {
        let t0 = Instant::now();
        let key = ("app".to_string(), "127.0.0.1:1".parse().unwrap());
        let older = sample(
            t0,
            &[
                (Counter::Worker(0), 1_000),
                (Counter::BackendErrors(key.clone()), 7),
            ],
        );
        let newer = sample(
            t0 + Duration::from_millis(1_250),
            &[
                (Counter::Worker(0), 1_500),
                (Counter::BackendErrors(key.clone()), 7),
            ],
        );
        let rates = per_second(&older, &newer);
        assert_eq!(rates[&Counter::Worker(0)], 400.0, "500 in 1.25 s");
        assert_eq!(rates[&Counter::BackendErrors(key)], 0.0);
    }

    #[test]
    fn a_counter_new_since_the_older_sample_counts_from_zero_and_one_that_went_down_shows_zero() {
        let t0 = Instant::now();
        let listener: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let older = sample(t0, &[(Counter::Worker(0), 90)]);
        let newer = sample(
            t0 + Duration::from_secs(2),
            &[(Counter::Worker(0), 10), (Counter::Listener(listener), 30)],
        );
        let rates = per_second(&older, &newer);
        assert_eq!(rates[&Counter::Listener(listener)], 15.0);
        assert_eq!(rates[&Counter::Worker(0)], 0.0, "restarted, not negative");
        assert!(
            per_second(&newer, &newer).is_empty(),
            "no time passed: no rate, not a division by zero"
        );
    }

    #[test]
    fn rates_are_over_the_two_newest_samples_and_the_first_counts_from_the_start() {
        let window = Window::default();
        assert!(
            window.rates().per_second.is_empty(),
            "nothing before a sample"
        );
        assert_eq!(window.rates().over, None);
        let started = Instant::now();
        let at = |ms| started + Duration::from_millis(ms);
        let record = |s| {
            window.inner.lock().unwrap().record(started, s);
        };
        // Requests served before the sampler first ran show in the first rates.
        record(sample(at(500), &[(Counter::Worker(0), 50)]));
        assert_eq!(window.rates().of(&Counter::Worker(0)), Some(100.0));
        assert_eq!(window.rates().over, Some(Duration::from_millis(500)));
        record(sample(at(1_500), &[(Counter::Worker(0), 80)]));
        record(sample(at(2_500), &[(Counter::Worker(0), 83)]));
        let rates = window.rates();
        assert_eq!(
            rates.of(&Counter::Worker(0)),
            Some(3.0),
            "the last second only"
        );
        assert_eq!(rates.over, Some(Duration::from_secs(1)));
        assert_eq!(rates.of(&Counter::Worker(1)), None, "never sampled");
    }

    #[test]
    fn the_window_keeps_a_base_a_minute_old_and_no_more() {
        let window = Window::default();
        let started = Instant::now();
        let mut inner = window.inner.lock().unwrap();
        for s in 1..=90 {
            inner.record(started, sample(started + Duration::from_secs(s), &[]));
        }
        let oldest = inner.samples.front().unwrap().at;
        assert_eq!(oldest, started + Duration::from_secs(30));
        assert_eq!(inner.samples.len(), 61);
    }
}
