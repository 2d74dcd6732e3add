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
/// its backends on one machine live, and up to 60 s, nginx's default `proxy_read_timeout`, so a
/// request that waits out a timeout still lands in a bucket of its own.
const BUCKETS_US: [u64; 18] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// Status codes counted one by one: 100 to 999, all that `http::StatusCode` can hold.
pub(crate) const CODES: usize = 900;

/// Who made a response that pinlb wrote to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A backend's, passed on.
    Backend = 0,
    /// pinlb's own: an error page (400, 408, 431, 502, 503, 504, ...) or a redirect.
    Pinlb = 1,
}

impl Source {
    pub(crate) const NAMES: [&str; 2] = ["backend", "pinlb"];
}

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

    /// Adds `other`'s counts into this one: a scrape sums the workers' histograms.
    pub fn add(&self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter().zip(&other.counts) {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.sum_us
            .fetch_add(other.sum_us.load(Ordering::Relaxed), Ordering::Relaxed);
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
    /// The client's certificate was missing or did not verify (`[listener.tls] client_ca`).
    ClientCert = 5,
}

impl TlsFailure {
    pub(crate) const NAMES: [&str; 6] = [
        "plain_http",
        "timeout",
        "closed",
        "unknown_name",
        "invalid",
        "client_cert",
    ];
}

pub use crate::modules::Refusal;

/// One backend's counters. They live in its [`crate::upstream::backend::BackendState`], so they survive
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
    /// Tunnels closed because one side had closed its sending half and the other did not
    /// close its own within `timeouts.tunnel_fin`.
    pub tunnel_fin_timeouts: AtomicU64,
    /// Bytes relayed through tunnels: `[to the backend, to the client]`.
    pub tunnel_bytes: [AtomicU64; 2],
    /// From the first attempt to the response head.
    pub response_time: Histogram,
    /// Each active health probe, from connect to the end of the body.
    pub check_time: Histogram,
    /// The proxy's own share of each request this backend answered, while the request's spans
    /// are measured (see `proxy::timing`): `pinlb_proxy_added_seconds`, summed per upstream.
    pub proxy_added: Histogram,
    /// Each new connection's connect (and TLS handshake), the wait for a `max_connecting`
    /// slot included.
    pub connect_time: Histogram,
    /// Attempts that failed here and went on to another backend (nginx's
    /// `proxy_next_upstream`).
    pub retries: AtomicU64,
    /// Times outlier detection ejected this backend (`[upstream.NAME.outlier]`).
    pub ejections: AtomicU64,
    /// The last active health probe: when (ms since the Unix epoch, shifted left one bit) and
    /// whether it passed (the low bit); 0 before the first.
    last_check: AtomicU64,
}

impl BackendStats {
    pub fn response(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses[class].fetch_add(1, Ordering::Relaxed);
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Records an active health probe's result, now.
    pub fn checked(&self, passed: bool) {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX >> 1));
        self.last_check
            .store(ms << 1 | u64::from(passed), Ordering::Relaxed);
    }

    /// The last probe's time (ms since the Unix epoch) and whether it passed.
    pub fn last_check(&self) -> Option<(u64, bool)> {
        let v = self.last_check.load(Ordering::Relaxed);
        (v != 0).then_some((v >> 1, v & 1 == 1))
    }

    /// Failed attempts of every kind.
    pub fn errors_total(&self) -> u64 {
        self.errors.iter().map(|e| e.load(Ordering::Relaxed)).sum()
    }
}

/// One worker's counters for one listener. Only that worker writes them.
#[derive(Debug)]
pub struct ListenerStats {
    /// The bound address (the kernel's port for a configured port 0).
    pub listener: SocketAddr,
    /// The address as configured: what names the listener in the config, across reloads.
    pub configured: SocketAddr,
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
    pub tls_failures: [AtomicU64; 6],
    /// Connections that spoke HTTP/2 (each of their streams counts in `requests`).
    pub http2_connections: AtomicU64,
    /// HTTP/2 connections closed for a protocol error of the client's (GOAWAY sent): a flood
    /// of resets or SETTINGS, a malformed frame, a header list over the limit.
    pub http2_errors: AtomicU64,
    /// Responses written to clients, by [`Source`] and by code (`code - 100`): every one pinlb
    /// sends, its own error pages included.
    pub(crate) responses: [[AtomicU64; CODES]; 2],
    /// From a request's head read to its response's last byte written.
    pub request_time: Histogram,
    /// Connections and requests the edge controls refused, by [`Refusal`].
    pub refused: [AtomicU64; Refusal::COUNT],
}

impl ListenerStats {
    fn new(
        listener: SocketAddr,
        configured: SocketAddr,
        worker: usize,
        core: usize,
    ) -> ListenerStats {
        ListenerStats {
            listener,
            configured,
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
            responses: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            request_time: Histogram::default(),
            refused: Default::default(),
        }
    }

    /// Counts a connection or request refused by an edge control.
    pub fn refuse(&self, cause: Refusal) {
        self.refused[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a response written (or about to be) to a client.
    pub fn response(&self, status: http::StatusCode, source: Source) {
        let i = usize::from(status.as_u16())
            .saturating_sub(100)
            .min(CODES - 1);
        self.responses[source as usize][i].fetch_add(1, Ordering::Relaxed);
    }

    /// The responses of `source` with code `code`.
    pub fn responses(&self, source: Source, code: u16) -> u64 {
        usize::from(code)
            .checked_sub(100)
            .and_then(|i| self.responses[source as usize].get(i))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// Every worker's listener counters, for the scrape. The lock is taken when a worker starts
/// listening on an address, and by a scrape; never per request.
#[derive(Debug, Default)]
pub struct Registered {
    listeners: Mutex<Vec<Arc<ListenerStats>>>,
}

impl Registered {
    /// Counters for `worker` listening on `listener` (configured as `configured`); the same ones
    /// again if it listened before (a reload that kept the address).
    pub fn listener(
        &self,
        listener: SocketAddr,
        configured: SocketAddr,
        worker: usize,
        core: usize,
    ) -> Arc<ListenerStats> {
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
        let s = Arc::new(ListenerStats::new(listener, configured, worker, core));
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
        h.observe(Duration::from_secs(61));
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(count, 4);
        assert_eq!(buckets[0], (0.0001, 2), "le is inclusive");
        assert_eq!(buckets[1], (0.00025, 1));
        assert_eq!(buckets[buckets.len() - 2].1, 0);
        assert_eq!(buckets[buckets.len() - 1], (f64::INFINITY, 1));
        assert!((sum - 61.000251).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn responses_are_counted_by_source_and_code() {
        let a = "127.0.0.1:80".parse().unwrap();
        let s = ListenerStats::new(a, a, 0, 0);
        s.response(http::StatusCode::SERVICE_UNAVAILABLE, Source::Pinlb);
        s.response(http::StatusCode::OK, Source::Backend);
        s.response(http::StatusCode::from_u16(999).unwrap(), Source::Backend);
        assert_eq!(s.responses(Source::Pinlb, 503), 1);
        assert_eq!(s.responses(Source::Backend, 503), 0);
        assert_eq!(s.responses(Source::Backend, 200), 1);
        assert_eq!(s.responses(Source::Backend, 999), 1);
        assert_eq!(s.responses(Source::Backend, 42), 0);
    }

    #[test]
    fn the_last_check_keeps_its_result_and_time() {
        let s = BackendStats::default();
        assert_eq!(s.last_check(), None);
        s.checked(false);
        let (ms, passed) = s.last_check().unwrap();
        assert!(!passed && ms > 1_700_000_000_000, "{ms}");
        s.checked(true);
        assert!(s.last_check().unwrap().1);
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
