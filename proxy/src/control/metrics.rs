//! `/metrics`: every counter in `stats`, and each backend's state, in Prometheus's text format;
//! `pinlb_build_info`; and the process's CPU, memory, file descriptors and start time under the
//! names every Prometheus client library exports them (`process_*`), read from `/proc`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::process::spawned::{Record, State};
use crate::upstream::counters::{
    BackendStats, CODES, ErrorKind, Histogram, ListenerStats, Refusal, Registered, Source,
    TlsFailure,
};
use crate::{upstream::backend::AdminState, upstream::shared::SharedUpstream};

/// Requests one rate zone refused: (configured listener, route, zone, count).
type RateLimited = (SocketAddr, String, String, u64);

/// Renders everything in Prometheus's text format (0.0.4). `routes` names each listener's
/// upstream, by its configured address; `tables` are the requests each rate zone refused and
/// each cache zone's figures.
pub fn render(
    upstreams: &[Arc<SharedUpstream>],
    registered: &Registered,
    generation: u64,
    routes: &[(SocketAddr, String)],
    dns: &[crate::upstream::discovery::NameStatus],
    spawned: &[Record],
    (rate_limited, caches): (&[RateLimited], &[crate::modules::cache::zone::Figures]),
) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessMetrics));
    registry
        .sub_registry_with_prefix("pinlb")
        .register_collector(Box::new(SpawnScrape(spawned.to_vec())));
    registry
        .sub_registry_with_prefix("pinlb")
        .register_collector(Box::new(Scrape {
            upstreams: upstreams.to_vec(),
            listeners: registered.all(),
            generation,
            routes: routes.to_vec(),
            dns: dns.to_vec(),
            rate_limited: rate_limited.to_vec(),
            caches: caches.to_vec(),
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
    /// Each listener's upstream, for the request duration's labels.
    routes: Vec<(SocketAddr, String)>,
    /// Backends' DNS names: what each resolved to, and its failed lookups.
    dns: Vec<crate::upstream::discovery::NameStatus>,
    /// Requests each rate zone refused, by (configured listener, route, zone).
    rate_limited: Vec<(SocketAddr, String, String, u64)>,
    /// Each cache zone's figures.
    caches: Vec<crate::modules::cache::zone::Figures>,
}

/// What 4xx pinlb answers itself says about the request, by code: the `cause` label of
/// `pinlb_client_errors_total`.
const CLIENT_ERRORS: [(u16, &str); 5] = [
    (400, "malformed"),
    (408, "timeout"),
    (413, "body_too_large"),
    (414, "uri_too_long"),
    (431, "head_too_large"),
];

/// The process's own figures, as the Prometheus client libraries export them (`process_*`).
/// One that `/proc` cannot give is left out rather than reported as 0.
#[derive(Debug)]
struct ProcessMetrics;

impl Collector for ProcessMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use procfs::WithCurrentSystemInfo as _;
        let Ok(me) = procfs::process::Process::myself() else {
            return Ok(());
        };
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            family(
                &mut e,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                MetricType::Counter,
                [(
                    Labels::new(),
                    ConstCounter::new((stat.utime + stat.stime) as f64 / ticks),
                )],
            )?;
            family(
                &mut e,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                MetricType::Gauge,
                [(
                    Labels::new(),
                    gauge(i64::try_from(stat.rss_bytes().get()).unwrap_or(i64::MAX)),
                )],
            )?;
            family(
                &mut e,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                MetricType::Gauge,
                [(
                    Labels::new(),
                    gauge(i64::try_from(stat.vsize).unwrap_or(i64::MAX)),
                )],
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                family(
                    &mut e,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    MetricType::Gauge,
                    [(
                        Labels::new(),
                        ConstGauge::new(boot as f64 + stat.starttime as f64 / ticks),
                    )],
                )?;
            }
        }
        if let Ok(n) = me.fd_count() {
            family(
                &mut e,
                "process_open_fds",
                "Number of open file descriptors.",
                MetricType::Gauge,
                [(Labels::new(), gauge(i64::try_from(n).unwrap_or(i64::MAX)))],
            )?;
        }
        if let Ok(limits) = me.limits() {
            if let procfs::process::LimitValue::Value(n) = limits.max_open_files.soft_limit {
                family(
                    &mut e,
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    MetricType::Gauge,
                    [(Labels::new(), gauge(i64::try_from(n).unwrap_or(i64::MAX)))],
                )?;
            }
        }
        Ok(())
    }
}

type Labels = Vec<(&'static str, String)>;

/// The spawned backends' records, by upstream and process index: an index is the same process
/// across its restarts and rolling restarts, while its address and pid change.
#[derive(Debug)]
struct SpawnScrape(Vec<Record>);

impl Collector for SpawnScrape {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        let labels = |r: &Record| -> Labels {
            vec![
                ("upstream", r.upstream.clone()),
                ("process", r.index.to_string()),
            ]
        };
        family(
            &mut e,
            "spawn_restarts",
            "Times a spawned backend exited (or failed to start) and was started again; rolling restarts are not counted.",
            MetricType::Counter,
            self.0.iter().map(|r| (labels(r), counter(r.restarts))),
        )?;
        family(
            &mut e,
            "spawn_ready",
            "1 while the spawned backend answers and is in the pool, else 0.",
            MetricType::Gauge,
            self.0
                .iter()
                .map(|r| (labels(r), gauge(i64::from(r.state == State::Ready)))),
        )?;
        family(
            &mut e,
            "spawn_pid",
            "The spawned backend's process id, with its address and core; absent while it waits to be started again.",
            MetricType::Gauge,
            self.0.iter().filter_map(|r| {
                let pid = r.pid?;
                let mut l = labels(r);
                l.push(("address", r.address.to_string()));
                l.push(("core", r.core.to_string()));
                Some((l, gauge(i64::from(pid))))
            }),
        )
    }
}

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
            "build_info",
            "Always 1: the version of pinlb running and how it was built.",
            MetricType::Gauge,
            [(
                vec![
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                    (
                        "profile",
                        if cfg!(debug_assertions) {
                            "debug"
                        } else {
                            "release"
                        }
                        .to_string(),
                    ),
                ],
                gauge(1),
            )],
        )?;
        family(
            &mut e,
            "config_generation",
            "Configuration generation: 1 at start, one more per successful reload.",
            MetricType::Gauge,
            [(Labels::new(), gauge(self.generation as i64))],
        )?;
        if !self.dns.is_empty() {
            let name_labels = |n: &crate::upstream::discovery::NameStatus| -> Labels {
                vec![
                    ("upstream", n.upstream.clone()),
                    ("name", n.name.to_string()),
                ]
            };
            family(
                &mut e,
                "dns_failures",
                "Failed lookups of a backend's DNS name (its last good set stays).",
                MetricType::Counter,
                self.dns
                    .iter()
                    .map(|n| (name_labels(n), counter(n.failures))),
            )?;
            family(
                &mut e,
                "dns_backend",
                "Always 1: an address a backend's DNS name resolved to, with its weight.",
                MetricType::Gauge,
                self.dns.iter().flat_map(|n| {
                    n.addresses.iter().map(move |(a, w)| {
                        let mut l = name_labels(n);
                        l.push(("backend", a.to_string()));
                        l.push(("weight", w.to_string()));
                        (l, gauge(1))
                    })
                }),
            )?;
        }

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

        family(
            &mut e,
            "http2_connections",
            "Client connections that spoke HTTP/2 (ALPN h2, or h2c); their streams count in pinlb_listener_requests.",
            MetricType::Counter,
            per_listener(&|l| load(&l.http2_connections))
                .into_iter()
                .map(|(l, v)| (l, counter(v))),
        )?;
        family(
            &mut e,
            "http2_protocol_errors",
            "HTTP/2 connections closed with GOAWAY for a client's protocol error (rapid resets, a SETTINGS or CONTINUATION flood, a header list over limits.max_header_bytes, a malformed frame).",
            MetricType::Counter,
            per_listener(&|l| load(&l.http2_errors))
                .into_iter()
                .map(|(l, v)| (l, counter(v))),
        )?;
        family(
            &mut e,
            "tls_handshakes",
            "TLS handshakes completed on a listener.",
            MetricType::Counter,
            per_listener(&|l| load(&l.tls_handshakes))
                .into_iter()
                .map(|(l, v)| (l, counter(v))),
        )?;
        family(
            &mut e,
            "tls_resumed",
            "TLS handshakes that resumed a session (a ticket or the session cache).",
            MetricType::Counter,
            per_listener(&|l| load(&l.tls_resumed))
                .into_iter()
                .map(|(l, v)| (l, counter(v))),
        )?;
        family(
            &mut e,
            "tls_handshake_failures",
            "TLS handshakes that failed, by reason: plain_http (answered 400), timeout (limits.header_timeout), closed, unknown_name (no certificate for the SNI name and no default), invalid, client_cert (a client certificate missing or refused: listener.tls.client_ca).",
            MetricType::Counter,
            TlsFailure::NAMES
                .iter()
                .enumerate()
                .flat_map(|(i, reason)| {
                    per_listener(&|l| load(&l.tls_failures[i])).into_iter().map(
                        move |(mut l, v)| {
                            l.push(("reason", reason.to_string()));
                            (l, counter(v))
                        },
                    )
                }),
        )?;

        family(
            &mut e,
            "refused",
            "Connections and requests refused by the edge controls, by cause: proxy_protocol_invalid, proxy_protocol_timeout, proxy_protocol_untrusted, rate_limit, conn_limit, denied, unauthorized, client_cert.",
            MetricType::Counter,
            Refusal::NAMES.iter().enumerate().flat_map(|(i, cause)| {
                per_listener(&|l| load(&l.refused[i]))
                    .into_iter()
                    .map(move |(mut l, v)| {
                        l.push(("cause", cause.to_string()));
                        (l, counter(v))
                    })
            }),
        )?;

        // By the listener's bound address, as the others: the configured one may be port 0.
        let bound = |configured: SocketAddr| {
            (self.listeners.iter())
                .find(|l| l.configured == configured)
                .map_or(configured, |l| l.listener)
        };
        family(
            &mut e,
            "rate_limited",
            "Requests a rate_limit zone refused, by listener, route (its index and path, or default for the requests no route matches) and zone.",
            MetricType::Counter,
            self.rate_limited.iter().map(|(l, route, zone, n)| {
                (
                    vec![
                        ("listener", bound(*l).to_string()),
                        ("route", route.clone()),
                        ("zone", zone.clone()),
                    ],
                    counter(*n),
                )
            }),
        )?;

        let zone = |f: &crate::modules::cache::zone::Figures| vec![("zone", f.zone.clone())];
        family(
            &mut e,
            "cache_requests",
            "Requests a cache zone looked up, by zone and what it did: hit (answered from it), miss (nothing stored), expired (what was stored was stale, and the backend answered), stale (a stale response served: the backend failed, or another request updates it), revalidated (a stale response the backend said is still good), bypass (not looked up: bypass held).",
            MetricType::Counter,
            self.caches.iter().flat_map(|f| {
                [
                    ("hit", f.hits),
                    ("miss", f.misses),
                    ("expired", f.expired),
                    ("stale", f.stale),
                    ("revalidated", f.revalidated),
                    ("bypass", f.bypassed),
                ]
                .map(|(s, n)| {
                    let mut labels = zone(f);
                    labels.push(("status", s.to_string()));
                    (labels, counter(n))
                })
            }),
        )?;
        family(
            &mut e,
            "cache_collapsed",
            "Requests that missed a key while another request's miss of it was with a backend, and waited for its response (lock).",
            MetricType::Counter,
            self.caches.iter().map(|f| (zone(f), counter(f.collapsed))),
        )?;
        family(
            &mut e,
            "cache_stored",
            "Responses stored, by zone.",
            MetricType::Counter,
            self.caches.iter().map(|f| (zone(f), counter(f.stored))),
        )?;
        family(
            &mut e,
            "cache_evicted",
            "Entries a cache zone evicted to stay within its max_size (S3-FIFO: the keys asked for once go first).",
            MetricType::Counter,
            self.caches.iter().map(|f| (zone(f), counter(f.evicted))),
        )?;
        family(
            &mut e,
            "cache_entries",
            "Entries a cache zone holds (each response, and each key whose responses vary).",
            MetricType::Gauge,
            self.caches
                .iter()
                .map(|f| (zone(f), gauge(f.entries as i64))),
        )?;
        family(
            &mut e,
            "cache_bytes",
            "What a cache zone's entries take against its max_size: their heads, bodies and keys, and 256 bytes each.",
            MetricType::Gauge,
            self.caches.iter().map(|f| (zone(f), gauge(f.bytes as i64))),
        )?;

        // Every response written to a client, by listener, source and code: only the codes seen,
        // since there are 900 possible; by class, every class, so a dashboard has its zeros.
        let mut by_code: Vec<(Labels, ConstCounter<u64>)> = Vec::new();
        let mut by_class: Vec<(Labels, ConstCounter<u64>)> = Vec::new();
        let mut client_errors: Vec<(Labels, ConstCounter<u64>)> = Vec::new();
        for a in &addrs {
            let mine: Vec<&Arc<ListenerStats>> =
                self.listeners.iter().filter(|l| l.listener == *a).collect();
            let sum = |source: Source, code: u16| -> u64 {
                mine.iter().map(|l| l.responses(source, code)).sum()
            };
            let mut classes = [0u64; 5];
            for (source, name) in [Source::Backend, Source::Pinlb]
                .into_iter()
                .zip(Source::NAMES)
            {
                for code in (100..).take(CODES) {
                    let n = sum(source, code);
                    if n == 0 {
                        continue;
                    }
                    if let Some(c) = classes.get_mut(usize::from(code / 100) - 1) {
                        *c += n;
                    }
                    by_code.push((
                        vec![
                            ("listener", a.to_string()),
                            ("code", code.to_string()),
                            ("source", name.to_string()),
                        ],
                        counter(n),
                    ));
                }
            }
            for (i, n) in classes.iter().enumerate() {
                by_class.push((
                    vec![
                        ("listener", a.to_string()),
                        ("class", format!("{}xx", i + 1)),
                    ],
                    counter(*n),
                ));
            }
            for (code, cause) in CLIENT_ERRORS {
                client_errors.push((
                    vec![("listener", a.to_string()), ("cause", cause.to_string())],
                    counter(sum(Source::Pinlb, code)),
                ));
            }
        }
        family(
            &mut e,
            "responses",
            "Responses written to clients, by status code and source: backend (passed on) or pinlb (its own error pages and redirects: 400, 408, 431, 502, 503, 504, ...).",
            MetricType::Counter,
            by_code,
        )?;
        family(
            &mut e,
            "responses_by_class",
            "Responses written to clients, by status class, whoever made them.",
            MetricType::Counter,
            by_class,
        )?;
        family(
            &mut e,
            "client_errors",
            "Requests pinlb refused itself as the client's fault, by cause: malformed (400), timeout (408: the head or body came too slowly), body_too_large (413), uri_too_long (414), head_too_large (431).",
            MetricType::Counter,
            client_errors,
        )?;
        family(
            &mut e,
            "request_duration_seconds",
            "Client requests, from the request head read to the response's last byte written, by listener and the upstream it routes to.",
            MetricType::Histogram,
            addrs.iter().map(|a| {
                let merged = Histogram::default();
                for l in self.listeners.iter().filter(|l| l.listener == *a) {
                    merged.add(&l.request_time);
                }
                let configured = self
                    .listeners
                    .iter()
                    .find(|l| l.listener == *a)
                    .map(|l| l.configured);
                let upstream = self
                    .routes
                    .iter()
                    .find(|(l, _)| Some(*l) == configured)
                    .map_or_else(String::new, |(_, u)| u.clone());
                let (sum, count, buckets) = merged.snapshot();
                (
                    vec![("listener", a.to_string()), ("upstream", upstream)],
                    HistogramValues(sum, count, buckets),
                )
            }),
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

        let backends: Vec<(Labels, &crate::upstream::backend::BackendState)> = self
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
        let each = |f: &dyn Fn(&crate::upstream::backend::BackendState) -> u64| {
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
            "backend_retries",
            "Attempts that failed at the backend and went on to another one (proxy_next_upstream).",
            MetricType::Counter,
            each(&|b| load(&b.stats.retries)),
        )?;
        family(
            &mut e,
            "backend_ejections",
            "Times outlier detection ejected the backend for its answers ([upstream.NAME.outlier]).",
            MetricType::Counter,
            each(&|b| load(&b.stats.ejections)),
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
        // Only the backends that learn a limit (`adaptive`): one with a `max_conns`, or in an
        // upstream with `adaptive = false`, has no series.
        family(
            &mut e,
            "backend_concurrency_limit",
            "The concurrency limit the backend learned (adaptive): most requests awaiting their response head at once, across workers.",
            MetricType::Gauge,
            backends.iter().filter_map(|(l, b)| {
                let limit = b.limiter.limit()?;
                Some((l.clone(), gauge(i64::try_from(limit).unwrap_or(i64::MAX))))
            }),
        )?;
        family(
            &mut e,
            "backend_min_rtt_seconds",
            "The backend's time to the response head without queueing, that its learned concurrency limit is set against (adaptive), once measured.",
            MetricType::Gauge,
            backends.iter().filter_map(|(l, b)| {
                b.limiter.limit()?;
                let rtt = b.limiter.min_rtt()?;
                Some((l.clone(), ConstGauge::new(rtt.as_secs_f64())))
            }),
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
        family(
            &mut e,
            "backend_tunnels_open",
            "Tunnels open to the backend: WebSocket and other upgraded connections, and TCP listeners' connections.",
            MetricType::Gauge,
            backends.iter().map(|(l, b)| {
                let open = load(&b.stats.tunnels_open);
                (l.clone(), gauge(i64::try_from(open).unwrap_or(i64::MAX)))
            }),
        )?;
        family(
            &mut e,
            "backend_tunnel_fin_timeouts",
            "Tunnels closed because one side had closed and the other did not within timeouts.tunnel_fin.",
            MetricType::Counter,
            each(&|b| load(&b.stats.tunnel_fin_timeouts)),
        )?;
        family(
            &mut e,
            "backend_tunnel_bytes",
            "Bytes relayed through tunnels (upgraded connections, TCP listeners' connections), by direction.",
            MetricType::Counter,
            backends.iter().flat_map(|(l, b)| {
                ["to_backend", "to_client"]
                    .into_iter()
                    .zip(&b.stats.tunnel_bytes)
                    .map(|(direction, c)| {
                        let mut l = l.clone();
                        l.push(("direction", direction.to_string()));
                        (l, counter(load(c)))
                    })
            }),
        )?;
        let histograms = |pick: fn(&BackendStats) -> &Histogram| {
            backends.iter().map(move |(l, b)| {
                let (sum, count, buckets) = pick(&b.stats).snapshot();
                (l.clone(), HistogramValues(sum, count, buckets))
            })
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
        family(
            &mut e,
            "backend_connect_seconds",
            "New connections to the backend: the connect and any TLS handshake, with the wait for a max_connecting slot.",
            MetricType::Histogram,
            histograms(|s| &s.connect_time),
        )?;
        // Per upstream: the proxy's share does not depend on the backend, so its backends'
        // histograms are summed.
        family(
            &mut e,
            "proxy_added_seconds",
            "The proxy's own share of each request a backend answered: from the request head to the response head, less the queue, the connects and the wait on backends.",
            MetricType::Histogram,
            self.upstreams.iter().map(|u| {
                let merged = Histogram::default();
                for b in &u.backends {
                    merged.add(&b.stats.proxy_added);
                }
                let (sum, count, buckets) = merged.snapshot();
                (
                    vec![("upstream", u.config.name.clone())],
                    HistogramValues(sum, count, buckets),
                )
            }),
        )?;
        self.encode_side_requests(&mut e)?;
        self.encode_queues(&mut e)
    }
}

impl Scrape {
    /// The side requests (`mirror`'s copies) of the upstreams that have had any.
    fn encode_side_requests(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let sides: Vec<(Labels, &crate::upstream::shared::SharedUpstream)> =
            (self.upstreams.iter())
                .filter(|u| {
                    u.side_dropped.load(Ordering::Relaxed) != 0
                        || u.side_in_flight.load(Ordering::Relaxed) != 0
                })
                .map(|u| (vec![("upstream", u.config.name.clone())], &**u))
                .collect();
        family(
            e,
            "upstream_side_requests_in_flight",
            "Mirrored copies sent to the upstream and not yet answered.",
            MetricType::Gauge,
            sides.iter().map(|(l, u)| {
                let n = u.side_in_flight.load(Ordering::Relaxed);
                (l.clone(), gauge(i64::try_from(n).unwrap_or(i64::MAX)))
            }),
        )?;
        family(
            e,
            "upstream_side_requests_dropped",
            "Mirrored copies dropped because max_in_flight were in flight to the upstream already.",
            MetricType::Counter,
            sides
                .iter()
                .map(|(l, u)| (l.clone(), counter(u.side_dropped.load(Ordering::Relaxed)))),
        )?;
        family(
            e,
            "upstream_retry_budget_refused",
            "Retries on a status that the retry budget refused (retry.budget).",
            MetricType::Counter,
            (self.upstreams.iter())
                .filter(|u| !u.config.retry.on_status.is_empty())
                .map(|u| {
                    let n = u.budget_refused.load(Ordering::Relaxed);
                    (vec![("upstream", u.config.name.clone())], counter(n))
                }),
        )
    }

    /// The queues of the upstreams that have one (`queue`).
    fn encode_queues(&self, e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let queues: Vec<(Labels, &crate::upstream::queue::Queue)> = self
            .upstreams
            .iter()
            .filter_map(|u| {
                let q = u.queue.as_deref()?;
                Some((vec![("upstream", u.config.name.clone())], q))
            })
            .collect();
        let each = |f: &dyn Fn(&crate::upstream::queue::Queue) -> u64| {
            queues
                .iter()
                .map(move |(l, q)| (l.clone(), counter(f(q))))
                .collect::<Vec<_>>()
        };
        family(
            e,
            "upstream_queue_waiting",
            "Requests waiting in the upstream's queue for a backend below max_conns.",
            MetricType::Gauge,
            queues.iter().map(|(l, q)| {
                (
                    l.clone(),
                    gauge(i64::try_from(q.waiting()).unwrap_or(i64::MAX)),
                )
            }),
        )?;
        family(
            e,
            "upstream_queue_timeouts",
            "Requests that waited timeouts.queue in the queue and got a 503.",
            MetricType::Counter,
            each(&|q| q.stats.timeouts.load(Ordering::Relaxed)),
        )?;
        family(
            e,
            "upstream_queue_overflows",
            "Requests that found the queue full and got a 503 at once.",
            MetricType::Counter,
            each(&|q| q.stats.overflows.load(Ordering::Relaxed)),
        )?;
        family(
            e,
            "upstream_queue_wait_seconds",
            "Time spent in the queue by requests that then went to a backend.",
            MetricType::Histogram,
            queues.iter().map(|(l, q)| {
                let (sum, count, buckets) = q.stats.wait_time.snapshot();
                (l.clone(), HistogramValues(sum, count, buckets))
            }),
        )
    }
}
