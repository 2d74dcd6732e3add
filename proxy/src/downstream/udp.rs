//! A UDP listener's datagrams (`mode = "udp"`: nginx's `listen … udp`): a session per client
//! address and port, each with a socket of its own connected to one backend.
//!
//! The first datagram from a client address and port opens its session: `access` is checked,
//! a backend picked by the upstream's algorithm (`hash` on the client's address keeps a client
//! on one backend; `least_conn` counts open sessions; a backend at `max_conns` takes none), and
//! a socket connected to it. The client's datagrams go to that backend, and the backend's
//! answers back to the client from the listener's address, until the session ends: after
//! `responses` answers per client datagram (nginx's `proxy_responses`: 1 for DNS), or when no
//! datagram has moved either way for `session_idle`. With `responses`, a session whose backend
//! never answered counts as a failure in the passive checks (its backend is then skipped as
//! after a failed connect); a port the backend's host refuses (ICMP port unreachable) always
//! does; an answer counts as a success. The access log has one line per session.
//!
//! Every worker has its own `SO_REUSEPORT` socket, and the kernel spreads client addresses and
//! ports over them, so a session lives in one worker and takes no lock.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tracing::debug;

use crate::config::{Config, Listener};
use crate::modules::access::{Access, allows};
use crate::proxy::accesslog::{Batch, Session as Logged, Upstreamed};
use crate::proxy::timing::Timing;
use crate::sys::summed::summed_warn;
use crate::upstream::counters::{ErrorKind, ListenerStats, Refusal};
use crate::upstream::hash_key::client_key;
use crate::upstream::in_flight::InFlight;
use crate::upstream::local::WorkerUpstream;

/// The largest datagram relayed: UDP's own bound, so that nothing is cut.
const DATAGRAM: usize = 65_535;

/// One UDP listener in one worker: its settings, which a reload replaces whole, and what stays
/// for the listener's life.
pub(crate) struct UdpListening {
    pub relay: RefCell<Rc<UdpRelay>>,
    /// This worker's counters for the listener, while metrics are on.
    pub stats: Option<Arc<ListenerStats>>,
    /// The address it is bound to, the log's.
    pub local: SocketAddr,
}

/// A UDP listener's settings in one generation.
pub(crate) struct UdpRelay {
    pub upstream: Rc<WorkerUpstream>,
    /// `access`, when it has rules.
    pub access: Option<Arc<Access>>,
    /// `responses`: answers per client datagram that end a session; `None`: no limit.
    pub responses: Option<u32>,
    /// `session_idle`: how long a session lasts without a datagram either way.
    pub idle: Duration,
}

impl UdpRelay {
    /// Listener `l`'s settings under `config`, with this worker's `upstreams`.
    pub fn of(l: &Listener, upstreams: &[Rc<WorkerUpstream>], _config: &Config) -> UdpRelay {
        let udp = l.udp.unwrap_or_default();
        UdpRelay {
            upstream: upstreams[l.upstream].clone(),
            access: l.modules.access.clone().filter(|a| a.rules.is_some()),
            responses: udp.responses,
            idle: udp.idle,
        }
    }
}

/// One client address and port's session.
struct Session {
    /// Connected to its backend.
    socket: UdpSocket,
    /// Datagrams the backend is to answer with before the session ends; grows by `responses`
    /// with each client datagram.
    expected: Cell<u64>,
    /// When a datagram last moved either way.
    last: Cell<Instant>,
    /// Bytes from the client.
    up: Cell<u64>,
}

/// Relays `socket`'s datagrams until the worker stops or a reload removes the listener; the
/// sessions open then run on to their end. `try_slot` gives a new session its place among
/// `limits.max_connections`, or none at that limit.
pub(crate) async fn serve(
    socket: Rc<UdpSocket>,
    listening: Rc<UdpListening>,
    try_slot: impl Fn() -> Option<OwnedSemaphorePermit>,
    batch: Option<Rc<Batch>>,
    mut stop: watch::Receiver<bool>,
    mut removed: watch::Receiver<bool>,
) {
    let sessions: Rc<RefCell<HashMap<SocketAddr, Rc<Session>>>> = Rc::default();
    let mut buf = vec![0u8; DATAGRAM];
    loop {
        let (n, client) = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            _ = removed.wait_for(|s| *s) => return,
            got = socket.recv_from(&mut buf) => match got {
                Ok(got) => got,
                Err(e) => {
                    // An ICMP error for an earlier answer, or a short of memory: the socket
                    // itself is fine.
                    debug!("udp {}: {e}", listening.local);
                    continue;
                }
            },
        };
        let datagram = &buf[..n];
        let open = sessions.borrow().get(&client).cloned();
        match open {
            Some(session) => forward(&session, datagram, &listening.relay.borrow()),
            None => {
                let Some(permit) = try_slot() else {
                    summed_warn!(client = %client; "udp {}: dropped a datagram from {client}: at limits.max_connections", listening.local);
                    continue;
                };
                let relay = listening.relay.borrow().clone();
                let started = Started {
                    listening: &listening,
                    relay,
                    client,
                    batch: batch.as_ref(),
                };
                if let Some((session, task)) = started.open(datagram).await {
                    sessions.borrow_mut().insert(client, session.clone());
                    let ending = Ending {
                        listener: socket.clone(),
                        sessions: sessions.clone(),
                        client,
                        permit,
                        removed: removed.clone(),
                    };
                    tokio::task::spawn_local(task.run(session, ending));
                }
            }
        }
    }
}

/// A client datagram for an open session: sent to its backend (dropped, as UDP may, when the
/// socket has no room). Sent by the system call itself, not by tokio's `try_send`, which
/// knows a socket writable only once the reactor has seen it so: a new session's first
/// datagram would be dropped.
fn forward(session: &Session, datagram: &[u8], relay: &UdpRelay) {
    if socket2::SockRef::from(&session.socket)
        .send(datagram)
        .is_ok()
    {
        session.up.set(session.up.get() + datagram.len() as u64);
        session.last.set(Instant::now());
        if let Some(r) = relay.responses {
            session.expected.set(session.expected.get() + u64::from(r));
        }
    }
}

/// A session about to open.
struct Started<'a> {
    listening: &'a UdpListening,
    relay: Rc<UdpRelay>,
    client: SocketAddr,
    batch: Option<&'a Rc<Batch>>,
}

/// What a session's task holds besides the session.
struct Task {
    relay: Rc<UdpRelay>,
    backend: usize,
    guard: InFlight,
    log: Logged,
}

/// What ends with a session: its place among the listener's sessions and the process's
/// connections.
struct Ending {
    listener: Rc<UdpSocket>,
    sessions: Rc<RefCell<HashMap<SocketAddr, Rc<Session>>>>,
    client: SocketAddr,
    permit: OwnedSemaphorePermit,
    /// Set when a reload removes the listener: its sessions end, and its socket is let go.
    removed: watch::Receiver<bool>,
}

impl Started<'_> {
    /// The session of a client's first datagram, with its backend's socket connected and the
    /// datagram sent; `None` when it is refused or no backend can take it.
    async fn open(self, datagram: &[u8]) -> Option<(Rc<Session>, Task)> {
        let Started {
            listening,
            relay,
            client,
            batch,
        } = self;
        let at = Instant::now();
        let mut log = Logged::start(client, listening.local, at, batch);
        log.datagrams();
        if let Some(rules) = relay.access.as_ref().and_then(|a| a.rules.as_deref()) {
            if !allows(rules, client.ip()) {
                if let Some(s) = &listening.stats {
                    s.refuse(Refusal::Denied);
                }
                summed_warn!(client = %client; "dropped datagrams from {}: denied by access rules", client.ip());
                log.status(403);
                return None;
            }
        }
        let upstream = &relay.upstream;
        let shared = &upstream.shared;
        let key = shared.config.hash.as_ref().map(|_| client_key(client.ip()));
        let Some((backend, guard)) = upstream.pick(key, |_| false) else {
            summed_warn!(upstream = %shared.config.name; "dropped a datagram from {}: {}", client.ip(), shared.unavailable());
            log.status(503);
            return None;
        };
        let address = shared.backends[backend].address;
        let socket = match connected(address).await {
            Ok(s) => s,
            // pinlb's own shortage (descriptors, local ports), or a backend that takes no
            // datagrams: nothing the backend's health is judged by.
            Err(e) => {
                summed_warn!(upstream = %shared.config.name; "backend {address}: cannot open a UDP session for {}: {e}", client.ip());
                log.status(502);
                return None;
            }
        };
        let session = Rc::new(Session {
            socket,
            expected: Cell::new(0),
            last: Cell::new(at),
            up: Cell::new(0),
        });
        forward(&session, datagram, &relay);
        let timing = Timing::measured(at, Duration::ZERO, (at, at, None, None), Instant::now());
        log.connected(Upstreamed::answered(address, timing));
        let task = Task {
            relay,
            backend,
            guard,
            log,
        };
        Some((session, task))
    }
}

thread_local! {
    /// The worker's buffer for every session's answers: a session waiting for its backend
    /// holds none of its own.
    static ANSWER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The backend's next datagram on `socket`, copied out of the worker's buffer at its length.
async fn answer(socket: &UdpSocket) -> std::io::Result<Vec<u8>> {
    // Bounded: each pass waits for the socket to be readable; a spurious wake-up reads
    // nothing and waits again.
    loop {
        socket.readable().await?;
        let got = ANSWER.with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < DATAGRAM {
                b.resize(DATAGRAM, 0);
            }
            socket.try_recv(&mut b).map(|n| b[..n].to_vec())
        });
        match got {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// A UDP socket connected to `backend`, bound to the wildcard address of its family.
async fn connected(backend: crate::backend_address::BackendAddress) -> std::io::Result<UdpSocket> {
    let crate::backend_address::BackendAddress::Tcp(addr) = backend else {
        return Err(std::io::Error::other(
            "a Unix-socket backend takes no datagrams",
        ));
    };
    let any = match addr.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).await?;
    socket.connect(addr).await?;
    Ok(socket)
}

impl Task {
    /// Relays the backend's answers to the client until the session ends, then logs it and
    /// records what it says about the backend.
    async fn run(self, session: Rc<Session>, mut ending: Ending) {
        let Task {
            relay,
            backend,
            guard,
            mut log,
        } = self;
        let shared = &relay.upstream.shared;
        let (mut answers, mut down) = (0u64, 0u64);
        // Bounded by the idle timeout: every pass moves a datagram, or ends the session.
        let end = loop {
            let deadline = session.last.get() + relay.idle;
            let waited = tokio::time::timeout_at(deadline.into(), answer(&session.socket));
            let got = tokio::select! {
                got = waited => got,
                _ = ending.removed.wait_for(|r| *r) => break "listener_removed",
            };
            match got {
                // A client datagram may have moved the deadline meanwhile.
                Err(_) if Instant::now() < session.last.get() + relay.idle => continue,
                Err(_) => break "idle",
                Ok(Err(e)) => {
                    debug!(client = %ending.client, "udp session: {e}");
                    break "backend_refused";
                }
                Ok(Ok(datagram)) => {
                    let n = datagram.len();
                    if ending
                        .listener
                        .send_to(&datagram, ending.client)
                        .await
                        .is_err()
                    {
                        break "client_unreachable";
                    }
                    if answers == 0 {
                        guard.connected(shared);
                    }
                    answers += 1;
                    down += n as u64;
                    session.last.set(Instant::now());
                    if relay.responses.is_some() && answers >= session.expected.get() {
                        break "answered";
                    }
                }
            }
        };
        // Without `responses` no answer is expected (syslog, statsd): silence is no failure.
        if answers == 0 && (relay.responses.is_some() || end == "backend_refused") {
            guard.failed(shared, ErrorKind::Timeout);
            summed_warn!(upstream = %shared.config.name; "backend {}: no answer to {}'s datagrams ({end})", shared.backends[backend].address, ending.client.ip());
        }
        log.relayed(session.up.get(), down, end);
        ending.sessions.borrow_mut().remove(&ending.client);
        drop((guard, ending.permit));
    }
}
