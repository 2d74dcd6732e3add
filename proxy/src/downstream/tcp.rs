//! A TCP listener's connection (`mode = "tcp"`: nginx's `stream`, HAProxy's `mode tcp`): bytes
//! relayed to a backend without being read.
//!
//! In order, once per connection: the client's address (from a PROXY protocol header on a
//! `proxy_protocol` listener), the edge controls that apply to a connection (`access`'s
//! allow/deny rules, `conn_limit`), a backend picked as a request's is (every algorithm; `hash`
//! on the client's address; the upstream's queue when every backend is at its limit), its
//! connect (a failed one is counted by the passive checks, and the next backend is tried, as
//! nginx's `proxy_next_upstream` does within `retry.tries` and `retry.timeout`), then the
//! tunnel's relay (`downstream::tunnel`), half-closes passed on, until both sides have closed,
//! no byte moved for `timeouts.tunnel_idle`, or one side stayed open `timeouts.tunnel_fin`
//! after the other closed. The connection counts in flight on its backend until it closes (for
//! `least_conn` and `max_conns`), and as an open tunnel in `/metrics`; the access log has one
//! line for it when it ends.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use socket2::SockRef;
use tokio::net::TcpStream;
use tracing::debug;

use crate::config::{Config, HostPattern, Listener, SniRoute};
use crate::downstream::h1::{Held, Slot};
use crate::downstream::proxied::client_address;
use crate::downstream::stream::{
    DownstreamStream, Refused as TlsRefused, StreamIo, count_handshake, handshake,
};
use crate::downstream::tunnel::{self, Dir, End};
use crate::modules::access::{Access, allows};
use crate::modules::conn_limit::table::ConnGate;
use crate::modules::rate_limit::check::RateLimits;
use crate::proxy::accesslog::{Batch, Session, Upstreamed};
use crate::proxy::forward::{Tried, max_tries};
use crate::proxy::timing::Timing;
use crate::sys::summed::summed_warn;
use crate::tls::client_hello::{self, Hello, Preread};
use crate::tls::server::Terminator;
use crate::upstream::counters::{ListenerStats, Refusal};
use crate::upstream::hash_key::client_key;
use crate::upstream::in_flight::InFlight;
use crate::upstream::local::WorkerUpstream;
use crate::upstream::queue::Refused;

/// One TCP listener in one worker: its settings, which a reload replaces whole, and what stays
/// for the listener's life.
pub(crate) struct TcpListening {
    pub relay: RefCell<Rc<Relay>>,
    /// This worker's counters for the listener, while metrics are on.
    pub stats: Option<Arc<ListenerStats>>,
    /// The address it is bound to: the log's, and the destination of a PROXY protocol header
    /// sent to a backend.
    pub local: SocketAddr,
}

/// A TCP listener's settings in one generation.
pub(crate) struct Relay {
    pub upstream: Rc<WorkerUpstream>,
    /// `[listener.tls]`: the connections are TLS, terminated here, and plain to the backend.
    pub tls: Option<Arc<Terminator>>,
    /// `[[listener.sni]]`, each with its upstream; empty: no ClientHello is read.
    pub sni: Vec<(SniRoute, Rc<WorkerUpstream>)>,
    /// `access`, when it has rules.
    pub access: Option<Arc<Access>>,
    pub conn_limit: Option<Rc<ConnGate>>,
    /// `rate_limit`: new connections per client address, in zones keyed by it.
    pub rate: Option<RateLimits>,
    /// `proxy_protocol`: the networks whose connections begin with a PROXY protocol header.
    pub proxy_protocol: Option<Arc<Vec<ipnet::IpNet>>>,
    /// `limits.header_timeout`: how long a PROXY protocol header may take.
    pub header_timeout: Duration,
}

impl Relay {
    /// Listener `l`'s settings under `config`, with this worker's `upstreams` and the
    /// process's edge `tables`.
    pub fn of(
        l: &Listener,
        config: &Config,
        upstreams: &[Rc<WorkerUpstream>],
        tables: &crate::edge::tables::Tables,
    ) -> Relay {
        Relay {
            upstream: upstreams[l.upstream].clone(),
            tls: l.tls.clone(),
            sni: (l.sni.iter())
                .map(|s| (s.clone(), upstreams[s.upstream].clone()))
                .collect(),
            access: l.modules.access.clone().filter(|a| a.rules.is_some()),
            conn_limit: l.conn_limit.map(|c| {
                Rc::new(ConnGate {
                    table: tables.conn(l.address, &c),
                    max: c.max,
                })
            }),
            proxy_protocol: l.proxy_protocol.clone(),
            rate: crate::edge::controls::rate_limits(l, None, &config.rate_zones, tables),
            header_timeout: config.limits.header_timeout,
        }
    }
}

/// Serves one connection accepted on a TCP listener until it closes. `held` (its
/// `limits.max_connections` permit and counters) and `slot` (its place among the worker's
/// connections, which a stop waits for) are kept until then.
pub(crate) async fn serve(
    mut tcp: TcpStream,
    peer: SocketAddr,
    listening: Rc<TcpListening>,
    batch: Option<Rc<Batch>>,
    mut held: Held,
    slot: Slot,
) {
    let accepted = Instant::now();
    let relay = listening.relay.borrow().clone();
    let stats = listening.stats.as_deref();
    let client = match &relay.proxy_protocol {
        None => peer,
        Some(from) => {
            let at = (
                tokio::time::Instant::from_std(accepted),
                relay.header_timeout,
            );
            match client_address(&mut tcp, peer, from, at, stats).await {
                Some(client) => client,
                None => return,
            }
        }
    };
    let mut log = Session::start(client, listening.local, accepted, batch.as_ref());
    if let Some(rules) = relay.access.as_ref().and_then(|a| a.rules.as_deref()) {
        if !allows(rules, client.ip()) {
            if let Some(s) = stats {
                s.refuse(Refusal::Denied);
            }
            summed_warn!(client = %client; "closed a connection from {}: denied by access rules", client.ip());
            log.status(403);
            return;
        }
    }
    if let Some(status) = (relay.rate.as_ref()).and_then(|r| r.admit_connection(client.ip())) {
        if let Some(s) = stats {
            s.refuse(Refusal::RateLimit);
        }
        log.status(status);
        return;
    }
    if let Some(gate) = &relay.conn_limit {
        if !held.admit(gate, client, stats) {
            log.status(503);
            return;
        }
    }
    let (upstream, early) = match relay.sni.is_empty() {
        true => (&relay.upstream, BytesMut::new()),
        false => {
            let deadline = tokio::time::Instant::from_std(accepted) + relay.header_timeout;
            match by_server_name(&mut tcp, &relay, deadline).await {
                Ok(chosen) => chosen,
                Err(why) => {
                    debug!(client = %client, "closed before its ClientHello: {why}");
                    log.status(400);
                    return;
                }
            }
        }
    };
    // With `tls`, the handshake: the backend gets what the client sends inside it.
    let stream = match relay.tls.clone() {
        None => DownstreamStream::Plain(tcp),
        Some(tls) => {
            let deadline = tokio::time::Instant::from_std(accepted) + relay.header_timeout;
            match terminated(tcp, &tls, deadline, stats).await {
                Ok(stream) => stream,
                Err(why) => {
                    debug!(client = %client, "TLS handshake failed: {why}");
                    log.status(400);
                    return;
                }
            }
        }
    };
    let origin = (client, listening.local);
    let Some((backend, guard, conn, upstreamed)) =
        connect(upstream, client, origin, accepted, &mut log).await
    else {
        return;
    };
    log.connected(upstreamed);
    let (up, down, end) = relayed(&stream, conn, early, (upstream, backend), client).await;
    log.relayed(up, down, end);
    drop((guard, slot, held));
}

/// Relays between the client's `stream` and `conn`, to `backend` of `upstream`, until the
/// tunnel ends (`early`: the client's bytes read before, which go first): the bytes each way
/// and how it ended, for the log; counted as an open tunnel and its bytes in `/metrics`.
async fn relayed(
    stream: &DownstreamStream,
    conn: crate::http1::client::Conn,
    early: BytesMut,
    (upstream, backend): (&WorkerUpstream, usize),
    client: SocketAddr,
) -> (u64, u64, &'static str) {
    let shared = &upstream.shared;
    let counters = shared.counting.then(|| &shared.backends[backend].stats);
    let _open = counters.map(OpenTunnel::new);
    let (mut to_backend, backend_early) = conn.into_parts();
    let limits = tunnel::Limits {
        idle: shared.config.upgrade.tunnel_idle,
        fin: shared.config.upgrade.tunnel_fin,
        splice: true,
    };
    let relayed = tunnel::relay(
        &mut StreamIo(stream),
        &mut to_backend,
        early,
        backend_early,
        limits,
        |dir, n| {
            if let Some(c) = counters {
                c.tunnel_bytes[dir as usize].fetch_add(n, Ordering::Relaxed);
            }
        },
    )
    .await;
    let (up, down) = (relayed.up, relayed.down);
    let end = match relayed.end {
        End::Closed => "closed",
        End::Idle => {
            debug!(client = %client, up, down, "closed: no data either way for {:?} (timeouts.tunnel_idle)", limits.idle);
            "idle"
        }
        End::HalfClosed(dir) => {
            if let Some(c) = counters {
                c.tunnel_fin_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            debug!(client = %client, up, down, "closed: one side closed its half and the other did not close its own within {:?} (timeouts.tunnel_fin)", limits.fin);
            if dir == Dir::Up {
                "client_closed"
            } else {
                "backend_closed"
            }
        }
        End::Failed(dir, e) => {
            debug!(client = %client, up, down, "cut: {e}");
            // Reset both: a cut relay must not look like a clean close to either peer.
            let _ = SockRef::from(stream.tcp()).set_linger(Some(Duration::ZERO));
            let _ = SockRef::from(&to_backend).set_linger(Some(Duration::ZERO));
            // Which way the bytes were going: a read of one side or a write to the other.
            if dir == Dir::Up {
                "reset_client_to_backend"
            } else {
                "reset_backend_to_client"
            }
        }
    };
    (up, down, end)
}

/// A relay counted open in `/metrics` for as long as it lives, however it ends (a stop that
/// cuts it included).
struct OpenTunnel<'a>(&'a crate::upstream::counters::BackendStats);

impl<'a> OpenTunnel<'a> {
    fn new(stats: &'a crate::upstream::counters::BackendStats) -> OpenTunnel<'a> {
        stats.tunnels_open.fetch_add(1, Ordering::Relaxed);
        OpenTunnel(stats)
    }
}

impl Drop for OpenTunnel<'_> {
    fn drop(&mut self) {
        self.0.tunnels_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The server side of a TLS handshake on a listener with `tls`, by `deadline`; counted on
/// `stats` as an HTTP listener's handshakes are.
async fn terminated(
    tcp: TcpStream,
    tls: &Terminator,
    deadline: tokio::time::Instant,
    stats: Option<&ListenerStats>,
) -> Result<DownstreamStream, String> {
    let shaken = tokio::time::timeout_at(deadline, handshake(tcp, tls)).await;
    count_handshake(stats, &shaken);
    match shaken {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(TlsRefused::PlainHttp(_))) => Err("the client spoke plain HTTP".into()),
        Ok(Err(TlsRefused::ClientCert(why) | TlsRefused::Failed(_, why))) => Err(why),
        Err(_) => Err("not done within limits.header_timeout".into()),
    }
}

/// The upstream of the first `[[listener.sni]]` the connection's ClientHello matches, or the
/// listener's own for a connection that names none or speaks no TLS, with the bytes read to
/// tell (they go to the backend first). `Err` when the client closed or stalled first: the
/// hello must come whole within `limits.header_timeout` of the accept.
async fn by_server_name<'a>(
    tcp: &mut TcpStream,
    relay: &'a Relay,
    deadline: tokio::time::Instant,
) -> Result<(&'a Rc<WorkerUpstream>, BytesMut), String> {
    use tokio::io::AsyncReadExt;
    let mut buf = BytesMut::with_capacity(2048);
    let mut reader = client_hello::Reader::default();
    // Bounded: every pass reads at least one byte, and the reader gives up past its `MAX`.
    loop {
        let before = buf.len();
        let read = tokio::time::timeout_at(deadline, tcp.read_buf(&mut buf)).await;
        match read {
            Err(_) => {
                return Err(format!(
                    "none within {:?} (limits.header_timeout)",
                    relay.header_timeout
                ));
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Ok(Ok(0)) => return Err(format!("the client closed after {before} bytes")),
            Ok(Ok(_)) => {}
        }
        let hello = match reader.feed(&buf[before..]) {
            Preread::More => continue,
            Preread::NotTls => None,
            Preread::Hello(h) => Some(h),
        };
        let chosen = hello
            .as_ref()
            .and_then(|h| best(&relay.sni, h))
            .unwrap_or(&relay.upstream);
        return Ok((chosen, buf));
    }
}

/// The upstream of the route that matches `hello` best: an exact name before a wildcard, a
/// longer wildcard before a shorter one, then the first in file order (nginx's `map
/// hostnames`); a route with `alpn` only when the client offers one of them.
fn best<'a>(
    routes: &'a [(SniRoute, Rc<WorkerUpstream>)],
    hello: &Hello,
) -> Option<&'a Rc<WorkerUpstream>> {
    let name = hello.server_name.as_deref()?.as_bytes();
    let offered = |r: &SniRoute| r.alpn.is_empty() || r.alpn.iter().any(|a| hello.alpn.contains(a));
    let score = |p: &HostPattern| match p {
        HostPattern::Exact(_) => usize::MAX,
        HostPattern::Suffix(s) => s.len(),
    };
    let mut chosen: Option<(usize, &Rc<WorkerUpstream>)> = None;
    for (route, upstream) in routes.iter().filter(|(r, _)| offered(r)) {
        let Some(s) = (route.names.iter())
            .filter(|p| p.matches(name))
            .map(score)
            .max()
        else {
            continue;
        };
        if chosen.is_none_or(|(c, _)| s > c) {
            chosen = Some((s, upstream));
        }
    }
    chosen.map(|(_, u)| u)
}

/// A backend for `client`'s connection, connected: picked (waiting in the upstream's queue
/// when every backend is at its limit), and the next one tried when a connect fails. `None`
/// when none could be: the reason is logged, and the session's status set (`502`: every
/// connect failed; `503`: no backend to try, or the queue's wait ran out).
async fn connect(
    upstream: &WorkerUpstream,
    client: SocketAddr,
    origin: (SocketAddr, SocketAddr),
    accepted: Instant,
    log: &mut Session,
) -> Option<(usize, InFlight, crate::http1::client::Conn, Upstreamed)> {
    let shared = &*upstream.shared;
    let config = &shared.config;
    let key = config.hash.as_ref().map(|_| client_key(client.ip()));
    let n = shared.backends.len();
    let tries = max_tries(&config.retry, n);
    let mut tried = Tried::new(n);
    let mut queue = Duration::ZERO;
    let mut failed = 0;
    let started = Instant::now();
    // Bounded by `tries`: every pass tries one more backend, each at most once.
    while failed < tries && (failed == 0 || started.elapsed() < config.retry.timeout) {
        let picked = match (&shared.queue, failed) {
            (Some(q), 0) => match Box::pin(upstream.pick_queued(q, key)).await {
                Ok(p) => p.map(|(b, guard, waited)| {
                    queue = waited;
                    (b, guard)
                }),
                Err(Refused::TimedOut { after }) => {
                    summed_warn!(upstream = %config.name; "closed a connection from {}: no backend had room within {after:?} (timeouts.queue)", client.ip());
                    log.status(503);
                    return None;
                }
                Err(Refused::Full { max }) => {
                    summed_warn!(upstream = %config.name; "closed a connection from {}: {max} connections wait for a backend already (queue)", client.ip());
                    log.status(503);
                    return None;
                }
            },
            _ => upstream.pick(key, |b| tried.contains(b)),
        };
        let Some((b, guard)) = picked else {
            break;
        };
        tried.insert(b);
        let begun = Instant::now();
        let wanted = config.proxy_protocol.is_some().then_some(&origin);
        match Box::pin(upstream.connect(b, config.timeouts.connect, wanted)).await {
            Ok(conn) => {
                guard.connected(shared);
                let now = Instant::now();
                let attempt = (started, begun, Some(now - begun), None);
                let timing = Timing::measured(accepted, queue, attempt, now);
                let upstreamed = Upstreamed::answered(shared.backends[b].address, timing);
                return Some((b, guard, conn, upstreamed));
            }
            Err(e) => {
                let excuse = guard.connect_failed(shared, e.kind);
                summed_warn!(upstream = %config.name; "backend {}: connect failed for a connection from {}: {}{}", shared.backends[b].address, client.ip(), e.cause, excuse.map(|x| format!(" ({x})")).unwrap_or_default());
                failed += 1;
            }
        }
    }
    if failed == 0 {
        summed_warn!(upstream = %config.name; "closed a connection from {}: {}", client.ip(), shared.unavailable());
        log.status(503);
    } else {
        log.status(502);
    }
    None
}
