//! The pinned runtime: one thread per configured core, each with its own single-threaded tokio
//! runtime, its own `SO_REUSEPORT` listening sockets and its own upstream connection pools.
//!
//! The kernel spreads incoming connections over the workers' sockets, and a connection stays on
//! the worker that accepted it, so nothing on the request path crosses threads. The thread that
//! calls [`Server::run`] is pinned to the whole `runtime.cpus` set first; every thread started
//! afterwards inherits that mask before narrowing it to its own core. That control thread also
//! runs the active health checks, so they need no thread of their own.

use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::LocalSet;
use tracing::{debug, error, info, warn};

use crate::config::{Config, Limits};
use crate::cpus::{format_cpu_list, pin_current_thread};
use crate::idle::{self, Activity, Expired, TrackedBody, TrackedIo};
use crate::proxy::{self, Client};
use crate::upstream::{SharedUpstream, WorkerUpstream};

/// Errors that stop pinlb from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot pin {what} to cores {cpus}: {source}")]
    Pin {
        what: String,
        cpus: String,
        source: nix::Error,
    },
    #[error("cannot start worker {worker}: {source}")]
    Worker {
        worker: usize,
        source: std::io::Error,
    },
    #[error("worker {worker} panicked")]
    WorkerPanicked { worker: usize },
}

/// Listening sockets bound for every worker, ready to run.
pub struct Server {
    config: Arc<Config>,
    /// `sockets[worker][listener]`: each worker has its own socket per listener, all sharing the
    /// port through `SO_REUSEPORT`.
    sockets: Vec<Vec<std::net::TcpListener>>,
    /// The address each listener actually got (port 0 resolved).
    local_addrs: Vec<SocketAddr>,
}

impl Server {
    /// Binds one socket per listener per worker. A listener on port 0 gets a port from the kernel
    /// for its first socket; the other workers bind that same port.
    pub fn bind(config: Config) -> Result<Server, ServerError> {
        let workers = config.runtime.cpus.len();
        let mut sockets: Vec<Vec<std::net::TcpListener>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut local_addrs = Vec::with_capacity(config.listeners.len());
        for l in &config.listeners {
            let mut addr = l.address;
            for per_worker in sockets.iter_mut() {
                let sock = reuseport_listener(addr).map_err(|source| ServerError::Bind {
                    address: addr,
                    source,
                })?;
                if addr.port() == 0 {
                    addr = sock.local_addr().map_err(|source| ServerError::Bind {
                        address: addr,
                        source,
                    })?;
                }
                per_worker.push(sock);
            }
            local_addrs.push(addr);
        }
        Ok(Server {
            config: Arc::new(config),
            sockets,
            local_addrs,
        })
    }

    /// The bound address of each listener, in config order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// Runs the workers until `shutdown` completes, then stops accepting, lets in-flight requests
    /// finish for up to `runtime.shutdown_timeout`, and returns.
    ///
    /// Blocks the calling thread, which it pins to `runtime.cpus` and uses to await `shutdown`.
    pub fn run<F: Future<Output = ()>>(self, shutdown: F) -> Result<(), ServerError> {
        let control = control_runtime().map_err(|source| ServerError::Worker {
            worker: usize::MAX,
            source,
        })?;
        self.run_on(control, shutdown)
    }

    /// Like [`Server::run`], awaiting `shutdown` on a runtime the caller built with
    /// [`control_runtime`]. A caller that waits for signals registers them on it before binding,
    /// so a SIGTERM that arrives once the port accepts connections is never lost.
    pub fn run_on<F: Future<Output = ()>>(
        self,
        control: tokio::runtime::Runtime,
        shutdown: F,
    ) -> Result<(), ServerError> {
        let Server {
            config,
            sockets,
            local_addrs,
        } = self;
        let cpus = config.runtime.cpus.clone();
        pin_current_thread(&cpus).map_err(|source| ServerError::Pin {
            what: "the control thread".into(),
            cpus: format_cpu_list(&cpus),
            source,
        })?;
        for w in &config.warnings {
            warn!("{w}");
        }
        for (l, addr) in config.listeners.iter().zip(&local_addrs) {
            info!(
                "listening on {addr} for upstream {}",
                config.upstreams[l.upstream].name
            );
        }

        let upstreams: Vec<Arc<SharedUpstream>> = config
            .upstreams
            .iter()
            .map(|u| Arc::new(SharedUpstream::new(u.clone())))
            .collect();
        let connections = Arc::new(Connections {
            slots: Arc::new(Semaphore::new(config.limits.max_connections)),
            pressure: Notify::new(),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut threads = Vec::with_capacity(cpus.len());
        for (worker, (core, listeners)) in cpus.iter().copied().zip(sockets).enumerate() {
            let config = config.clone();
            let upstreams = upstreams.clone();
            let stop = stop_rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("pinlb-w{worker}"))
                .spawn({
                    let connections = connections.clone();
                    move || {
                        worker_main(
                            worker,
                            core,
                            config,
                            upstreams,
                            connections,
                            listeners,
                            stop,
                        )
                    }
                })
                .map_err(|source| ServerError::Worker { worker, source })?;
            threads.push(handle);
        }

        // Health checks run on this thread, pinned to `runtime.cpus` like the workers, until
        // shutdown.
        let checks = crate::health::run(upstreams.clone());
        control.block_on(async {
            tokio::select! {
                () = shutdown => {}
                () = checks => {}
            }
        });
        info!(
            "shutting down: no new connections; in-flight requests get up to {:?}",
            config.runtime.shutdown_timeout
        );
        let _ = stop_tx.send(true);

        let mut result = Ok(());
        for (worker, t) in threads.into_iter().enumerate() {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(ServerError::WorkerPanicked { worker }),
            }
        }
        info!("stopped");
        result
    }
}

/// The single-threaded runtime the control thread awaits shutdown on.
pub fn control_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    // nginx's default backlog on Linux.
    listener(addr, true, 511)
}

/// A non-blocking listening socket with `SO_REUSEADDR` (a restarted process gets its port
/// back from TIME_WAIT at once), and `SO_REUSEPORT` when `reuse_port`.
pub(crate) fn listener(
    addr: SocketAddr,
    reuse_port: bool,
    backlog: i32,
) -> std::io::Result<std::net::TcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    if reuse_port {
        sock.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(backlog)?;
    Ok(sock.into())
}

fn worker_main(
    worker: usize,
    core: usize,
    config: Arc<Config>,
    upstreams: Vec<Arc<SharedUpstream>>,
    connections: Arc<Connections>,
    sockets: Vec<std::net::TcpListener>,
    stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    pin_current_thread(&[core]).map_err(|source| ServerError::Pin {
        what: format!("worker {worker}"),
        cpus: core.to_string(),
        source,
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Worker { worker, source })?;
    info!("worker {worker} running on core {core}");

    let local = LocalSet::new();
    local.block_on(&rt, async move {
        let graceful = Rc::new(GracefulShutdown::new());
        let mut accepting = Vec::with_capacity(sockets.len());
        for (l, sock) in config.listeners.iter().zip(sockets) {
            let listener = TcpListener::from_std(sock)
                .map_err(|source| ServerError::Worker { worker, source })?;
            let upstream = WorkerUpstream::new(upstreams[l.upstream].clone());
            let idle = upstream.shared.config.timeouts.client_idle;
            accepting.push(tokio::task::spawn_local(accept_loop(
                listener,
                upstream,
                Rc::new(ClientRules {
                    trusted: config.trusted.clone(),
                    connections: connections.clone(),
                    limits: config.limits,
                }),
                idle,
                graceful.clone(),
                stop.clone(),
            )));
        }
        for a in accepting {
            let _ = a.await;
        }
        // The listening sockets are closed now; wait for open connections to finish.
        let timeout = config.runtime.shutdown_timeout;
        // The accept loops have ended and dropped their handles, so this is the last one.
        let Ok(graceful) = Rc::try_unwrap(graceful) else {
            error!("worker {worker}: connection tracker still shared at shutdown; not waiting for open connections");
            return Ok(());
        };
        if tokio::time::timeout(timeout, graceful.shutdown())
            .await
            .is_err()
        {
            warn!("worker {worker}: connections still open after {timeout:?}, closing them");
        }
        Ok(())
    })
}

async fn accept_loop(
    listener: TcpListener,
    upstream: Rc<WorkerUpstream>,
    rules: Rc<ClientRules>,
    client_idle: Duration,
    graceful: Rc<GracefulShutdown>,
    mut stop: watch::Receiver<bool>,
) {
    let limits = rules.limits;
    let connections = &rules.connections;
    let mut builder = http1::Builder::new();
    // Idle connections and late request heads (`limits.header_timeout`) are handled by the
    // per-connection watchdog in `idle` instead: hyper's header read timeout arms a new boxed
    // timer for every request, also runs while a keep-alive connection waits between requests,
    // and closes without a 408.
    builder.header_read_timeout(None);
    // hyper answers a head over either limit with 431 and closes; complete or not, the head
    // never grows past `max_header_bytes` in memory.
    builder.max_header_size(limits.max_header_bytes);
    builder.max_headers(limits.max_headers);
    loop {
        let slot = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            slot = connections.slot() => slot,
        };
        let (stream, peer) = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            a = accept(&listener) => a,
        };
        let client = Rc::new(Client::new(peer, &rules.trusted));
        let upstream = upstream.clone();
        let activity = Rc::new(Activity::accepted());
        let io = TrackedIo::new(TokioIo::new(stream), activity.clone());
        let requests = activity.clone();
        let service = service_fn(move |req| {
            let active = requests.request();
            let forwarded = proxy::handle(upstream.clone(), client.clone(), limits, req);
            async move {
                forwarded
                    .await
                    .map(|resp| resp.map(|body| TrackedBody::new(body, active)))
            }
        });
        let conn = graceful.watch(builder.serve_connection(io, service));
        let header_timeout = limits.header_timeout;
        let connections = connections.clone();
        // The connection and its watchdog are two tasks, so that the watchdog (its timer, and
        // the shared notification of `max_connections` pressure, whose polling takes a lock) is
        // polled only when it has something to check, never on the connection's every wake.
        let mut serving = tokio::task::spawn_local(async move {
            // The connection's slot is free again when this task ends or is aborted.
            let _slot = slot;
            if let Err(e) = conn.await {
                log_connection_error(peer, &e);
            }
        });
        tokio::task::spawn_local(async move {
            let expired = tokio::select! {
                biased;
                _ = &mut serving => return,
                e = idle::watchdog(activity.clone(), client_idle, header_timeout, &connections.pressure) => e,
            };
            match expired {
                Expired::Pressure => {
                    debug!(client = %peer, "closing idle client connection: at limits.max_connections");
                }
                Expired::Idle => {
                    debug!(client = %peer, "closing client connection idle for {client_idle:?}");
                }
                Expired::Head { bytes: false } => {
                    debug!(client = %peer, "closing client connection that sent nothing within {header_timeout:?}");
                }
                Expired::Head { bytes: true } => {
                    warn!(client = %peer, "answered 408: no complete request head within {header_timeout:?} (limits.header_timeout)");
                    // Woken, hyper reads again; that read writes the 408 and ends the stream,
                    // and hyper closes. Bounded in case hyper is not reading after all.
                    activity.wake_reader();
                    if tokio::time::timeout(Duration::from_secs(1), &mut serving)
                        .await
                        .is_ok()
                    {
                        return;
                    }
                }
            }
            // Dropping the connection closes its socket.
            serving.abort();
        });
    }
}

/// The next client connection, with TCP_NODELAY set. Accept errors (out of file descriptors
/// and the like) are logged and retried after 50 ms instead of spinning.
pub(crate) async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                // Small requests and responses must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e) => {
                error!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// What applies to every client of a listener, whatever its upstream.
struct ClientRules {
    /// `forwarded.trusted`.
    trusted: Vec<ipnet::IpNet>,
    connections: Arc<Connections>,
    limits: Limits,
}

/// The process's client connections, counted against `limits.max_connections` by every worker.
pub(crate) struct Connections {
    /// One permit per open client connection.
    slots: Arc<Semaphore>,
    /// Notified while an accept loop waits for a slot: idle keep-alive connections close to make
    /// room, as nginx does when it runs out of `worker_connections`, so a flood of idle clients
    /// cannot lock out active ones.
    pressure: Notify,
}

impl Connections {
    /// Waits for room for one more connection. Until there is, nothing is accepted (new
    /// connections wait in the kernel's backlog) and idle connections are asked to close, again
    /// every 100 ms in case one became idle meanwhile.
    async fn slot(&self) -> OwnedSemaphorePermit {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return slot;
        }
        warn!("at limits.max_connections: not accepting, closing idle connections to make room");
        loop {
            self.pressure.notify_waiters();
            tokio::select! {
                slot = self.slots.clone().acquire_owned() => {
                    // The semaphore is never closed.
                    if let Ok(slot) = slot {
                        return slot;
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
}

/// Logs why a client connection ended early. hyper's parser refusing a request is worth a
/// warning (it answered the client itself, so nothing else logs it); a client going away is not.
fn log_connection_error(peer: SocketAddr, e: &hyper::Error) {
    // This also covers hyper's 414 for a target over 64 KiB, which config validation keeps out
    // of reach: `max_header_bytes` stays below that, and a longer head gets 431 first.
    if e.is_parse_too_large() {
        warn!(client = %peer, "answered 431: request head over limits.max_header_bytes or limits.max_headers ({e})");
    } else if e.is_parse() {
        // hyper answers every other parse error it can name with 400.
        warn!(client = %peer, "answered 400: malformed request ({e})");
    } else {
        debug!(client = %peer, "client connection ended: {e}");
    }
}

/// SIGTERM and SIGINT, registered up front: a process that waits for them registers before it
/// binds, so that from the moment its ports accept connections a SIGTERM means a graceful stop,
/// not the default action.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Must run inside a tokio runtime with I/O enabled (the control runtime).
    pub fn register() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Completes on the first SIGTERM or SIGINT.
    pub async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
