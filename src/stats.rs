//! Counters the request path bumps, read by `/metrics` (rendered in `metrics`).
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
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
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
        (sum, total, buckets)
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
    pub(crate) const NAMES: [&str; 4] = ["connect", "timeout", "reset", "invalid"];
}

/// Why a TLS handshake on a listener failed, as `/metrics` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The client sent plain HTTP (it got a 400).
    PlainHttp = 0,
    /// No handshake within `limits.header_timeout`.
    Timeout = 1,
    /// The client closed or broke the connection mid-handshake.
    Closed = 2,
    /// The client asked for a name no certificate has, and there is no default.
    UnknownName = 3,
    /// Not TLS, or TLS the server refuses (no common version, cipher or ALPN protocol, a bad
    /// record).
    Invalid = 4,
}

impl TlsFailure {
    pub(crate) const NAMES: [&str; 5] =
        ["plain_http", "timeout", "closed", "unknown_name", "invalid"];
}

/// One backend's counters. They live in its [`crate::upstream::BackendState`], so they survive
/// a reload that keeps the backend.
#[derive(Debug, Default)]
pub struct BackendStats {
    /// Requests sent (attempts, so a retried request counts at each backend it reached).
    pub requests: AtomicU64,
    /// Response heads by status class, 1xx to 5xx.
    pub(crate) responses: [AtomicU64; 5],
    pub(crate) errors: [AtomicU64; 4],
    pub connections_opened: AtomicU64,
    pub connections_reused: AtomicU64,
    /// Tunnels (connections that switched protocols after a 101) open now; a gauge.
    pub tunnels_open: AtomicU64,
    /// Bytes relayed through tunnels: `[to the backend, to the client]`.
    pub tunnel_bytes: [AtomicU64; 2],
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
    /// TLS handshakes completed, and those of them that resumed a session.
    pub tls_handshakes: AtomicU64,
    pub tls_resumed: AtomicU64,
    /// TLS handshakes failed, by [`TlsFailure`].
    pub tls_failures: [AtomicU64; 5],
    /// Connections that spoke HTTP/2 (each of their streams counts in `requests`).
    pub http2_connections: AtomicU64,
    /// HTTP/2 connections closed for a protocol error of the client's (GOAWAY sent): a flood
    /// of resets or SETTINGS, a malformed frame, a header list over the limit.
    pub http2_errors: AtomicU64,
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
            tls_handshakes: AtomicU64::new(0),
            tls_resumed: AtomicU64::new(0),
            tls_failures: Default::default(),
            http2_connections: AtomicU64::new(0),
            http2_errors: AtomicU64::new(0),
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
        let (sum, count, buckets) = h.snapshot();
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
