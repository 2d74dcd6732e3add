//! Metrics: counters the request path bumps, and their Prometheus rendering.
//!
//! Nothing here takes a lock on the request path. Per-backend counters are atomics beside the
//! backend's in-flight count (a cache line every worker already writes for each request); per
//! listener counters are kept per worker, so each has a single writer, and are summed when
//! scraped. Counting happens only while the admin listener is configured: without it nobody
//! could read them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::upstream::{AdminState, SharedUpstream};

/// Upper bounds of the latency buckets, in microseconds: fine at the bottom, where a proxy and
/// its backends on one machine live, and up to Prometheus's usual 10 s.
const BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A latency histogram with fixed buckets: one atomic add for the bucket, one for the sum.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last one is +Inf.
    counts: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_US.partition_point(|&b| b < us);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Sum in seconds, count, and each bucket's own count (the encoder makes them cumulative).
    fn snapshot(&self) -> HistogramValues {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            total += n;
            let le = BUCKETS_US
                .get(i)
                .map_or(f64::INFINITY, |&us| us as f64 / 1e6);
            buckets.push((le, n));
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        HistogramValues(sum, total, buckets)
    }
}

/// Why an attempt at a backend failed, as `/metrics` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Refused, unreachable or timed out while connecting.
    Connect = 0,
    /// No response head within `timeouts.response`.
    Timeout = 1,
    /// The connection broke (reset, closed) during the exchange.
    Reset = 2,
    /// The backend answered something that is not valid HTTP/1.1.
    Invalid = 3,
}

impl ErrorKind {
    const NAMES: [&str; 4] = ["connect", "timeout", "reset", "invalid"];
}

/// One backend's counters. They live in its [`crate::upstream::BackendState`], so they survive
/// a reload that keeps the backend.
#[derive(Debug, Default)]
pub struct BackendStats {
    /// Requests sent (attempts, so a retried request counts at each backend it reached).
    pub requests: AtomicU64,
    /// Response heads by status class, 1xx to 5xx.
    responses: [AtomicU64; 5],
    errors: [AtomicU64; 4],
    pub connections_opened: AtomicU64,
    pub connections_reused: AtomicU64,
    /// From the first attempt to the response head.
    pub response_time: Histogram,
    /// Each active health probe, from connect to the end of the body.
    pub check_time: Histogram,
}

impl BackendStats {
    pub fn response(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses[class].fetch_add(1, Ordering::Relaxed);
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed attempts of every kind.
    pub fn errors_total(&self) -> u64 {
        self.errors.iter().map(|e| e.load(Ordering::Relaxed)).sum()
    }
}

/// One worker's counters for one listener. Only that worker writes them.
#[derive(Debug)]
pub struct ListenerStats {
    pub listener: SocketAddr,
    pub worker: usize,
    pub core: usize,
    pub accepted: AtomicU64,
    /// Connections closed; active = accepted − closed, so each is a plain counter.
    pub closed: AtomicU64,
    pub requests: AtomicU64,
}

/// Every worker's listener counters, for the scrape. The lock is taken when a worker starts
/// listening on an address, and by a scrape; never per request.
#[derive(Debug, Default)]
pub struct Registered {
    listeners: Mutex<Vec<Arc<ListenerStats>>>,
}

impl Registered {
    /// Counters for `worker` listening on `listener`; the same ones again if it listened before
    /// (a reload that kept the address).
    pub fn listener(&self, listener: SocketAddr, worker: usize, core: usize) -> Arc<ListenerStats> {
        let mut all = self
            .listeners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(s) = all
            .iter()
            .find(|s| s.listener == listener && s.worker == worker)
        {
            return s.clone();
        }
        let s = Arc::new(ListenerStats {
            listener,
            worker,
            core,
            accepted: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        });
        all.push(s.clone());
        s
    }

    /// Every worker's counters for every listener it has listened on.
    pub fn all(&self) -> Vec<Arc<ListenerStats>> {
        self.listeners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// Renders everything in Prometheus's text format (0.0.4).
pub fn render(
    upstreams: &[Arc<SharedUpstream>],
    registered: &Registered,
    generation: u64,
) -> String {
    let mut registry = Registry::with_prefix("pinlb");
    registry.register_collector(Box::new(Scrape {
        upstreams: upstreams.to_vec(),
        listeners: registered.all(),
        generation,
    }));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

/// One scrape's view, encoded when the registry asks.
#[derive(Debug)]
struct Scrape {
    upstreams: Vec<Arc<SharedUpstream>>,
    listeners: Vec<Arc<ListenerStats>>,
    generation: u64,
}

type Labels = Vec<(&'static str, String)>;

/// One metric family: its samples, each a label set and a value.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, m) in samples {
        m.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(v: u64) -> ConstCounter<u64> {
    ConstCounter::new(v)
}

fn gauge(v: i64) -> ConstGauge<i64> {
    ConstGauge::new(v)
}

/// A histogram's values, encodable as a metric.
#[derive(Debug)]
struct HistogramValues(f64, u64, Vec<(f64, u64)>);

impl EncodeMetric for HistogramValues {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.0, self.1, &self.2, None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        family(
            &mut e,
            "config_generation",
            "Configuration generation: 1 at start, one more per successful reload.",
            MetricType::Gauge,
            [(Labels::new(), gauge(self.generation as i64))],
        )?;

        // Per listener, summed over workers.
        let mut addrs: Vec<SocketAddr> = self.listeners.iter().map(|l| l.listener).collect();
        addrs.sort_unstable();
        addrs.dedup();
        let per_listener = |f: &dyn Fn(&ListenerStats) -> u64| -> Vec<(Labels, u64)> {
            addrs
                .iter()
                .map(|a| {
                    let v = self
                        .listeners
                        .iter()
                        .filter(|l| l.listener == *a)
                        .map(|l| f(l))
                        .sum();
                    (vec![("listener", a.to_string())], v)
                })
                .collect()
        };
        family(
            &mut e,
            "listener_connections_accepted",
            "Client connections accepted.",
            MetricType::Counter,
            per_listener(&|l| load(&l.accepted))
                .into_iter()
                .map(|(l, v)| (l, counter(v))),
        )?;
        family(
            &mut e,
            "listener_connections_active",
            "Client connections open now.",
            MetricType::Gauge,
            per_listener(&|l| load(&l.accepted).saturating_sub(load(&l.closed)))
                .into_iter()
                .map(|(l, v)| (l, gauge(v as i64))),
        )?;
        family(
            &mut e,
            "listener_requests",
            "Client requests received.",
            MetricType::Counter,
            per_listener(&|l| load(&l.requests))
                .into_iter()
                .map(|(l, v)| (l, counter(v))),
        )?;

        // Per worker, summed over listeners: an imbalance between cores shows here.
        let mut workers: Vec<(usize, usize)> =
            self.listeners.iter().map(|l| (l.worker, l.core)).collect();
        workers.sort_unstable();
        workers.dedup();
        family(
            &mut e,
            "worker_requests",
            "Client requests served by each worker thread.",
            MetricType::Counter,
            workers.iter().map(|&(w, core)| {
                let v = self
                    .listeners
                    .iter()
                    .filter(|l| l.worker == w)
                    .map(|l| load(&l.requests))
                    .sum();
                (
                    vec![("worker", w.to_string()), ("core", core.to_string())],
                    counter(v),
                )
            }),
        )?;

        let backends: Vec<(Labels, &crate::upstream::BackendState)> = self
            .upstreams
            .iter()
            .flat_map(|u| {
                u.backends.iter().map(|b| {
                    (
                        vec![
                            ("upstream", u.config.name.clone()),
                            ("backend", b.address.to_string()),
                        ],
                        &**b,
                    )
                })
            })
            .collect();
        let each = |f: &dyn Fn(&crate::upstream::BackendState) -> u64| {
            backends
                .iter()
                .map(move |(l, b)| (l.clone(), counter(f(b))))
                .collect::<Vec<_>>()
        };
        family(
            &mut e,
            "backend_requests",
            "Requests sent to the backend (each attempt counts).",
            MetricType::Counter,
            each(&|b| load(&b.stats.requests)),
        )?;
        family(
            &mut e,
            "backend_responses",
            "Response heads from the backend, by status class.",
            MetricType::Counter,
            backends.iter().flat_map(|(l, b)| {
                b.stats.responses.iter().enumerate().map(|(i, c)| {
                    let mut l = l.clone();
                    l.push(("class", format!("{}xx", i + 1)));
                    (l, counter(load(c)))
                })
            }),
        )?;
        family(
            &mut e,
            "backend_errors",
            "Failed attempts at the backend, by kind.",
            MetricType::Counter,
            backends.iter().flat_map(|(l, b)| {
                b.stats.errors.iter().enumerate().map(|(i, c)| {
                    let mut l = l.clone();
                    l.push(("kind", ErrorKind::NAMES[i].to_string()));
                    (l, counter(load(c)))
                })
            }),
        )?;
        family(
            &mut e,
            "backend_in_flight",
            "Requests in flight to the backend, across workers.",
            MetricType::Gauge,
            backends
                .iter()
                .map(|(l, b)| (l.clone(), gauge(b.in_flight() as i64))),
        )?;
        family(
            &mut e,
            "backend_up",
            "1 while health checks hold the backend up (always 1 without checks).",
            MetricType::Gauge,
            backends
                .iter()
                .map(|(l, b)| (l.clone(), gauge(i64::from(b.is_up())))),
        )?;
        family(
            &mut e,
            "backend_admin_state",
            "The state set through the admin API: 1 for the current one.",
            MetricType::Gauge,
            backends.iter().flat_map(|(l, b)| {
                let now = b.admin_state();
                AdminState::ALL.iter().map(move |s| {
                    let mut l = l.clone();
                    l.push(("state", s.as_str().to_string()));
                    (l, gauge(i64::from(*s == now)))
                })
            }),
        )?;
        family(
            &mut e,
            "backend_connections_opened",
            "New connections opened to the backend.",
            MetricType::Counter,
            each(&|b| load(&b.stats.connections_opened)),
        )?;
        family(
            &mut e,
            "backend_connections_reused",
            "Requests sent on a pooled keep-alive connection.",
            MetricType::Counter,
            each(&|b| load(&b.stats.connections_reused)),
        )?;
        let histograms = |pick: fn(&BackendStats) -> &Histogram| {
            backends
                .iter()
                .map(move |(l, b)| (l.clone(), pick(&b.stats).snapshot()))
        };
        family(
            &mut e,
            "backend_response_time_seconds",
            "From the first attempt to the backend's response head.",
            MetricType::Histogram,
            histograms(|s| &s.response_time),
        )?;
        family(
            &mut e,
            "backend_health_check_duration_seconds",
            "Active health probes, from connect to the end of the response.",
            MetricType::Histogram,
            histograms(|s| &s.check_time),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_have_inclusive_bounds_and_an_overflow() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_micros(101));
        h.observe(Duration::from_secs(60));
        let HistogramValues(sum, count, buckets) = h.snapshot();
        assert_eq!(count, 4);
        assert_eq!(buckets[0], (0.0001, 2), "le is inclusive");
        assert_eq!(buckets[1], (0.00025, 1));
        assert_eq!(buckets[buckets.len() - 2].1, 0);
        assert_eq!(buckets[buckets.len() - 1], (f64::INFINITY, 1));
        assert!((sum - 60.000251).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn status_classes_clamp_to_1xx_to_5xx() {
        let s = BackendStats::default();
        for status in [100, 204, 299, 302, 404, 503, 599] {
            s.response(status);
        }
        let counts: Vec<u64> = s
            .responses
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        assert_eq!(counts, vec![1, 2, 1, 1, 2]);
    }
}
