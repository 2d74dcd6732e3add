//! The pinned runtime: one thread per configured core, each with its own single-threaded tokio
//! runtime, its own `SO_REUSEPORT` listening sockets and its own upstream connection pools.
//!
//! The kernel spreads incoming connections over the workers' sockets, and a connection stays on
//! the worker that accepted it, so nothing on the request path crosses threads. The thread that
//! calls [`Server::run`] is pinned to the whole `runtime.cpus` set first; every thread started
//! afterwards inherits that mask before narrowing it to its own core. That control thread also
//! runs the active health checks, so they need no thread of their own.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::LocalSet;
use tracing::{debug, error, info, warn};

use crate::accesslog::{AccessHandle, AccessLog, Batch};
use crate::config::{Config, Listener};
use crate::connection::{ClientRules, Held, Route};
use crate::cpus::{format_cpu_list, pin_current_thread};
use crate::idle::Clients;
use crate::metrics::Registered;
use crate::reload;
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
    /// `sockets[worker]`: each worker has its own socket per listener (keyed by the configured
    /// address), all sharing the port through `SO_REUSEPORT`.
    sockets: Sockets,
    /// The address each listener actually got (port 0 resolved).
    local_addrs: Vec<SocketAddr>,
    /// The admin listener, bound with the others so that its port is known before `run`.
    admin: Option<std::net::TcpListener>,
    /// The file `SIGHUP` and `POST /reload` read again; without one there is nothing to reload.
    config_path: Option<PathBuf>,
    /// SIGHUP and SIGUSR1, registered by the caller before binding.
    hangups: Option<Hangups>,
    /// The cores the process may use, read before any thread is pinned; a reload validates
    /// `runtime.cpus` against them.
    allowed: Vec<usize>,
}

impl Server {
    /// Binds one socket per listener per worker, and the admin listener. A listener on port 0
    /// gets a port from the kernel for its first socket; the other workers bind that same port.
    pub fn bind(config: Config) -> Result<Server, ServerError> {
        let workers = config.runtime.cpus.len();
        let (sockets, local_addrs) = bind_listeners(&config.listeners, workers, |_| false)?;
        let admin = match &config.admin {
            None => None,
            Some(a) => {
                Some(
                    listener(a.address, false, 128).map_err(|source| ServerError::Bind {
                        address: a.address,
                        source,
                    })?,
                )
            }
        };
        Ok(Server {
            config: Arc::new(config),
            sockets,
            local_addrs,
            admin,
            config_path: None,
            hangups: None,
            allowed: crate::cpus::allowed_cpus().unwrap_or_default(),
        })
    }

    /// The bound address of each listener, in config order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// The admin listener's bound address, when `[admin]` is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Names the file a reload (`SIGHUP`, `POST /reload`) reads.
    pub fn reload_from(mut self, path: PathBuf) -> Self {
        self.config_path = Some(path);
        self
    }

    /// Reloads on SIGHUP and reopens the access log on SIGUSR1.
    pub fn on_signals(mut self, hangups: Hangups) -> Self {
        self.hangups = Some(hangups);
        self
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
            admin,
            config_path,
            hangups,
            allowed,
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

        // Started from this thread, the access log's thread inherits its cores.
        let access = match &config.access_log {
            None => None,
            Some(a) => Some(AccessLog::start(a).map_err(|source| ServerError::Worker {
                worker: usize::MAX,
                source,
            })?),
        };
        let counting = config.admin.is_some();
        let upstreams: Vec<Arc<SharedUpstream>> = config
            .upstreams
            .iter()
            .map(|u| Arc::new(SharedUpstream::new(u.clone(), counting)))
            .collect();
        let first = Arc::new(Generation::new(1, config.clone(), upstreams, sockets));
        let (generations, generation_rx) = watch::channel(first.clone());
        let process = Arc::new(Process {
            generations,
            registered: Registered::default(),
            started: std::time::Instant::now(),
            config_path,
            allowed,
            workers: cpus.len(),
            reloading: tokio::sync::Mutex::new(()),
            access: access.as_ref().map(AccessLog::handle),
            connections: Connections {
                slots: Arc::new(Semaphore::new(config.limits.max_connections)),
                pressure: AtomicU64::new(0),
            },
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut threads = Vec::with_capacity(cpus.len());
        for (worker, core) in cpus.iter().copied().enumerate() {
            let process = process.clone();
            let (first, generations) = (first.clone(), generation_rx.clone());
            let stop = stop_rx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("pinlb-w{worker}"))
                .spawn(move || worker_main(worker, core, process, first, generations, stop))
                .map_err(|source| ServerError::Worker { worker, source })?;
            threads.push(handle);
        }

        // Health checks and the admin listener run on this thread, pinned to `runtime.cpus`
        // like the workers, until shutdown.
        control.block_on(async {
            if let Some(sock) = admin {
                match TcpListener::from_std(sock) {
                    Ok(listener) => {
                        tokio::spawn(crate::admin::serve(listener, process.clone()));
                    }
                    Err(e) => error!("admin listener failed: {e}"),
                }
            }
            tokio::select! {
                () = shutdown => {}
                () = control_loop(process.clone(), hangups, access.as_ref()) => {}
            }
        });
        info!(
            "shutting down: no new connections; in-flight requests get up to {:?}",
            process.generations.borrow().config.runtime.shutdown_timeout
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
        // Workers are gone, and with them every sender: the log thread writes what is left.
        drop(process);
        if let Some(a) = access {
            a.stop();
        }
        info!("stopped");
        result
    }
}

/// A listener's identity across reloads: its configured address, and which of the listeners
/// with that address it is (several may ask for port 0).
pub(crate) type ListenerKey = (SocketAddr, usize);

/// The keys of `listeners`, in order.
pub(crate) fn listener_keys(listeners: &[Listener]) -> Vec<ListenerKey> {
    let mut keys: Vec<ListenerKey> = Vec::with_capacity(listeners.len());
    for l in listeners {
        let n = keys.iter().filter(|(a, _)| *a == l.address).count();
        keys.push((l.address, n));
    }
    keys
}

/// Sockets per worker, each with its listener's key.
pub(crate) type Sockets = Vec<Vec<(ListenerKey, std::net::TcpListener)>>;

/// Binds every listener for every worker, except those `skip` names (already listening).
pub(crate) fn bind_listeners(
    listeners: &[Listener],
    workers: usize,
    skip: impl Fn(&ListenerKey) -> bool,
) -> Result<(Sockets, Vec<SocketAddr>), ServerError> {
    let mut sockets: Sockets = (0..workers).map(|_| Vec::new()).collect();
    let mut local_addrs = Vec::with_capacity(listeners.len());
    for (l, key) in listeners.iter().zip(listener_keys(listeners)) {
        if skip(&key) {
            continue;
        }
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
            per_worker.push((key, sock));
        }
        local_addrs.push(addr);
    }
    Ok((sockets, local_addrs))
}

/// Runs health checks for the running generation, starting them again after each reload, and
/// reloads on SIGHUP and reopens the access log on SIGUSR1. Never returns.
async fn control_loop(process: Arc<Process>, hangups: Option<Hangups>, access: Option<&AccessLog>) {
    let mut generations = process.generations.subscribe();
    let (mut hup, mut usr1) = match hangups {
        Some(h) => (Some(h.hup), Some(h.usr1)),
        None => (None, None),
    };
    loop {
        let upstreams = generations.borrow_and_update().upstreams.clone();
        let checks = crate::health::run(upstreams);
        tokio::pin!(checks);
        loop {
            tokio::select! {
                () = &mut checks => {}
                changed = generations.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    break;
                }
                Some(()) = recv_signal(&mut hup) => {
                    info!("SIGHUP: reloading the configuration");
                    match reload::reload(&process).await {
                        Ok(summary) => info!("{summary}"),
                        Err(e) => error!("{e}"),
                    }
                }
                Some(()) = recv_signal(&mut usr1) => {
                    match access {
                        Some(a) => {
                            info!("SIGUSR1: reopening the access log");
                            a.reopen();
                        }
                        None => info!("SIGUSR1: no access log to reopen"),
                    }
                }
            }
        }
    }
}

async fn recv_signal(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// What the control thread, the admin listener and every worker share.
pub(crate) struct Process {
    /// The running configuration generation. Workers watch it and switch when a reload sends a
    /// new one; the request path never reads it.
    pub generations: watch::Sender<Arc<Generation>>,
    /// Every worker's listener counters, for `/metrics`.
    pub registered: Registered,
    pub started: std::time::Instant,
    pub config_path: Option<PathBuf>,
    /// The cores the process may use, as read at start.
    pub allowed: Vec<usize>,
    pub workers: usize,
    /// Held for a whole reload, so a SIGHUP and a `POST /reload` never interleave.
    pub reloading: tokio::sync::Mutex<()>,
    /// Where finished requests go, when the access log is on.
    pub access: Option<AccessHandle>,
    pub connections: Connections,
}

/// One configuration generation: what a reload swaps as a whole.
pub(crate) struct Generation {
    /// 1 at start, one more per successful reload.
    pub number: u64,
    pub config: Arc<Config>,
    pub upstreams: Vec<Arc<SharedUpstream>>,
    /// Sockets for the listeners this generation adds, `[worker]` → (listener key, socket).
    /// Each worker takes its own.
    sockets: Vec<std::sync::Mutex<Vec<(ListenerKey, std::net::TcpListener)>>>,
    /// Each worker adds a permit once it has switched to this generation; a reload waits for
    /// all of them.
    pub applied: Semaphore,
    /// Workers that have switched to this generation; a reload is refused until all have.
    pub acked: std::sync::atomic::AtomicUsize,
}

impl Generation {
    pub fn new(
        number: u64,
        config: Arc<Config>,
        upstreams: Vec<Arc<SharedUpstream>>,
        sockets: Sockets,
    ) -> Self {
        Generation {
            number,
            config,
            upstreams,
            sockets: sockets.into_iter().map(std::sync::Mutex::new).collect(),
            applied: Semaphore::new(0),
            acked: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Called by each worker once it runs this generation.
    fn acknowledge(&self) {
        self.acked.fetch_add(1, Ordering::Relaxed);
        self.applied.add_permits(1);
    }

    fn take_sockets(&self, worker: usize) -> Vec<(ListenerKey, std::net::TcpListener)> {
        match self.sockets.get(worker) {
            Some(m) => std::mem::take(&mut *m.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
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
    process: Arc<Process>,
    first: Arc<Generation>,
    mut generations: watch::Receiver<Arc<Generation>>,
    mut stop: watch::Receiver<bool>,
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
        let mut state = WorkerState {
            worker,
            core,
            process,
            clients: Rc::new(Clients::with_parking()),
            stop: stop.clone(),
            listeners: HashMap::new(),
            upstreams: Vec::new(),
            batch: None,
        };
        // Entries for the access log collect per worker and go to the log thread in batches.
        if let Some(handle) = &state.process.access {
            let batch = Batch::new(handle.clone());
            let flushing = Rc::downgrade(&batch);
            tokio::task::spawn_local(async move {
                let mut every = tokio::time::interval(crate::accesslog::FLUSH);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    every.tick().await;
                    match flushing.upgrade() {
                        Some(b) => b.flush(),
                        None => return,
                    }
                }
            });
            state.batch = Some(batch);
        }
        tokio::task::spawn_local(crate::connection::unparker(state.clients.clone()));
        let pressured = state.process.clone();
        tokio::task::spawn_local(crate::idle::sweeper(state.clients.clone(), move || {
            pressured.connections.pressure.load(Ordering::Relaxed)
        }));
        // The first generation is the one this worker's sockets were bound for. A reload that
        // came before the thread got here is seen as a change right after, so its new
        // listeners' sockets are taken too.
        state.apply(&first)?;
        first.acknowledge();
        drop(first);
        // A reload is acknowledged once the listeners it removed are closed, so that when it
        // returns, connecting to them is refused.
        let closed = |tasks: Vec<tokio::task::JoinHandle<()>>| async move {
            for t in tasks {
                let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
            }
        };
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                changed = generations.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let generation = generations.borrow_and_update().clone();
                    match state.apply(&generation) {
                        Ok(removed) => closed(removed).await,
                        Err(e) => error!("worker {worker}: {e}"),
                    }
                    generation.acknowledge();
                }
            }
        }
        let WorkerState {
            clients,
            listeners,
            upstreams,
            batch,
            ..
        } = state;
        drop(upstreams);
        // Connections still open hold the batch too; what it has now goes out, the rest when
        // they end.
        if let Some(b) = batch {
            b.flush();
        }
        for (_, l) in listeners {
            let _ = l.task.await;
        }
        // The listening sockets are closed now: idle connections close, busy ones once their
        // response is out, as long as the running configuration allows.
        clients.drain();
        let timeout = generations.borrow().config.runtime.shutdown_timeout;
        if tokio::time::timeout(timeout, clients.all_closed())
            .await
            .is_err()
        {
            warn!("worker {worker}: connections still open after {timeout:?}, closing them");
        }
        Ok(())
    })
}

/// One worker's listeners and upstreams in the running generation.
struct WorkerState {
    worker: usize,
    core: usize,
    process: Arc<Process>,
    /// This worker's open client connections, which a stop lets finish.
    clients: Rc<Clients>,
    stop: watch::Receiver<bool>,
    listeners: HashMap<ListenerKey, Listening>,
    /// This worker's view of each upstream, in config order.
    upstreams: Vec<Rc<WorkerUpstream>>,
    /// This worker's access log entries, when the access log is on.
    batch: Option<Rc<Batch>>,
}

/// One of a worker's listeners.
struct Listening {
    /// Where its requests go.
    route: Rc<Route>,
    /// Tells the accept loop to stop, when a reload removes the listener.
    removed: watch::Sender<bool>,
    /// The accept loop; it owns the listening socket.
    task: tokio::task::JoinHandle<()>,
}

impl WorkerState {
    /// Switches to `generation`: new upstream views (keeping the pools of backends that stay),
    /// every kept listener pointed at its (possibly new) upstream, accept loops started for new
    /// listeners and stopped for removed ones. Open connections are untouched: their next
    /// request reads the new route. Returns the accept loops it stopped.
    fn apply(
        &mut self,
        generation: &Generation,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, ServerError> {
        let config = &generation.config;
        let upstreams: Vec<Rc<WorkerUpstream>> = generation
            .upstreams
            .iter()
            .map(|u| {
                let previous = self
                    .upstreams
                    .iter()
                    .find(|p| p.shared.config.name == u.config.name);
                WorkerUpstream::reloaded(u.clone(), previous.map(|p| &**p))
            })
            .collect();
        let rules = Rc::new(ClientRules {
            trusted: config.trusted.clone(),
            limits: config.limits,
        });
        // The sweeper's tick follows the shortest timeout it keeps.
        let shortest = config
            .upstreams
            .iter()
            .map(|u| u.timeouts.client_idle)
            .fold(config.limits.header_timeout, Duration::min);
        self.clients.set_shortest_timeout(shortest);
        let mut sockets = generation.take_sockets(self.worker);
        let keys = listener_keys(&config.listeners);
        for (l, key) in config.listeners.iter().zip(&keys) {
            let upstream = upstreams[l.upstream].clone();
            if let Some(l) = self.listeners.get(key) {
                *l.route.upstream.borrow_mut() = upstream;
                *l.route.rules.borrow_mut() = rules.clone();
                continue;
            }
            let Some(i) = sockets.iter().position(|(k, _)| k == key) else {
                error!(
                    "worker {}: no socket for new listener {}",
                    self.worker, l.address
                );
                continue;
            };
            let (_, sock) = sockets.swap_remove(i);
            let listener = TcpListener::from_std(sock).map_err(|source| ServerError::Worker {
                worker: self.worker,
                source,
            })?;
            let bound = listener.local_addr().unwrap_or(l.address);
            let stats = config.admin.is_some().then(|| {
                self.process
                    .registered
                    .listener(bound, self.worker, self.core)
            });
            let route = Rc::new(Route {
                upstream: RefCell::new(upstream),
                rules: RefCell::new(rules.clone()),
                stats,
            });
            let (removed, removed_rx) = watch::channel(false);
            let task = tokio::task::spawn_local(accept_loop(
                listener,
                route.clone(),
                self.process.clone(),
                self.batch.clone(),
                self.clients.clone(),
                self.stop.clone(),
                removed_rx,
            ));
            self.listeners.insert(
                *key,
                Listening {
                    route,
                    removed,
                    task,
                },
            );
        }
        let gone: Vec<ListenerKey> = self
            .listeners
            .keys()
            .filter(|k| !keys.contains(k))
            .copied()
            .collect();
        let mut stopped = Vec::with_capacity(gone.len());
        for key in gone {
            if let Some(l) = self.listeners.remove(&key) {
                let _ = l.removed.send(true);
                debug!(
                    "worker {}: stopped accepting on {}; its connections finish",
                    self.worker, key.0
                );
                stopped.push(l.task);
            }
        }
        self.upstreams = upstreams;
        Ok(stopped)
    }
}

async fn accept_loop(
    listener: TcpListener,
    route: Rc<Route>,
    process: Arc<Process>,
    batch: Option<Rc<Batch>>,
    clients: Rc<Clients>,
    mut stop: watch::Receiver<bool>,
    mut removed: watch::Receiver<bool>,
) {
    let connections = &process.connections;
    let stats = route.stats.clone();
    loop {
        let slot = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            _ = removed.wait_for(|s| *s) => return,
            slot = connections.slot(&clients) => slot,
        };
        let (stream, peer) = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            _ = removed.wait_for(|s| *s) => return,
            a = accept(&listener) => a,
        };
        // The timeouts that decide when the connection is idle are taken now; the rest of the
        // rules and the route are read per request.
        let header_timeout = route.rules.borrow().limits.header_timeout;
        let client_idle = route.upstream.borrow().shared.config.timeouts.client_idle;
        let registered = clients.open(client_idle, header_timeout);
        let held = Held::new(slot, stats.clone());
        tokio::task::spawn_local(crate::connection::serve(
            stream,
            peer,
            registered,
            route.clone(),
            batch.clone(),
            held,
            crate::connection::Start::accepted(),
        ));
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

/// The process's client connections, counted against `limits.max_connections` by every worker.
pub(crate) struct Connections {
    /// One permit per open client connection.
    slots: Arc<Semaphore>,
    /// Bumped while an accept loop waits for a slot: every worker's sweeper then closes its idle
    /// keep-alive connections to make room, as nginx does when it runs out of
    /// `worker_connections`, so that a flood of idle clients cannot lock out active ones.
    pub pressure: AtomicU64,
}

impl Connections {
    /// Waits for room for one more connection. Until there is, nothing is accepted (new
    /// connections wait in the kernel's backlog) and idle connections are asked to close: this
    /// worker's at once, every worker's at its next tick, and again every 100 ms in case one
    /// became idle meanwhile.
    async fn slot(&self, clients: &Clients) -> OwnedSemaphorePermit {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return slot;
        }
        warn!("at limits.max_connections: not accepting, closing idle connections to make room");
        loop {
            self.pressure.fetch_add(1, Ordering::Relaxed);
            clients.close_idle();
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

/// SIGHUP (reload) and SIGUSR1 (reopen the access log), registered before binding like
/// [`Signals`], for the same reason: their default action ends the process.
pub struct Hangups {
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

impl Hangups {
    /// Must run inside a tokio runtime with I/O enabled (the control runtime).
    pub fn register() -> std::io::Result<Hangups> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Hangups {
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
        })
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
