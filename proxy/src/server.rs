//! Starting and stopping pinlb: binding every listener, one pinned worker thread per configured
//! core (`worker`), the control thread (health checks, the admin listener, reloads, signals),
//! and the graceful stop.
//!
//! The kernel spreads incoming connections over the workers' sockets, and a connection stays on
//! the worker that accepted it, so nothing on the request path crosses threads. The thread that
//! calls [`Server::run`] is pinned to the whole `runtime.cpus` set first; every thread started
//! afterwards inherits that mask before narrowing it to its own core. That control thread also
//! runs the active health checks, so they need no thread of their own.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::control::supervisor::Supervisor;
use crate::process::handover::{Exposed, Handover, Inherited, Tag, listen_at};
use crate::process::listen::{BindError, Sockets, bind_listeners, listener};
use crate::process::reload;
pub use crate::process::shared::ServerError;
use crate::process::shared::{Admission, Generation, Process};
use crate::process::worker::worker_main;
use crate::proxy::accesslog::AccessLog;
use crate::sys::cpus::{format_cpu_list, pin_current_thread};
use crate::upstream::counters::Registered;
use crate::upstream::shared::SharedUpstream;

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
    /// The unix socket `pinlb upgrade` connects to (`runtime.upgrade_socket`), bound here or
    /// inherited from the process this one upgrades.
    upgrade_socket: Option<OwnedFd>,
    /// When this process is an upgrade: the connection to the one it takes over from, told
    /// `Ready` once every worker accepts.
    upgrading: Option<Inherited>,
}

impl Server {
    /// Binds one socket per listener per worker, and the admin listener. A listener on port 0
    /// gets a port from the kernel for its first socket; the other workers bind that same port.
    pub fn bind(config: Config) -> Result<Server, ServerError> {
        let workers = config.runtime.cpus.len();
        let (sockets, local_addrs) = bind_listeners(&config.listeners, workers, |_| false)?;
        let admin = match &config.admin {
            None => None,
            Some(a) => Some(listener(a.address, false, 128).map_err(|source| BindError {
                address: a.address,
                source,
            })?),
        };
        let upgrade_socket = match &config.runtime.upgrade_socket {
            None => None,
            Some(path) => Some(listen_at(path)?),
        };
        Ok(Server::assemble(
            config,
            (sockets, local_addrs),
            admin,
            upgrade_socket,
        ))
    }

    /// A server of the sockets bound (or inherited) for `config`, not yet running.
    fn assemble(
        config: Config,
        (sockets, local_addrs): (Sockets, Vec<SocketAddr>),
        admin: Option<std::net::TcpListener>,
        upgrade_socket: Option<OwnedFd>,
    ) -> Server {
        Server {
            config: Arc::new(config),
            sockets,
            local_addrs,
            admin,
            config_path: None,
            hangups: None,
            allowed: crate::sys::cpus::allowed_cpus().unwrap_or_default(),
            upgrade_socket,
            upgrading: None,
        }
    }

    /// Like [`Server::bind`], for a binary upgrade: takes the listening sockets `inherited`
    /// holds for the listeners, the admin listener and the upgrade socket `config` keeps, and
    /// binds the rest. On an error the old process is told why (it keeps serving).
    pub fn bind_inherited(config: Config, mut inherited: Inherited) -> Result<Server, ServerError> {
        let result = Self::bind_taking(config, &mut inherited);
        match result {
            Ok(mut server) => {
                server.upgrading = Some(inherited);
                Ok(server)
            }
            Err(e) => {
                inherited.failed(&e.to_string());
                Err(e)
            }
        }
    }

    fn bind_taking(config: Config, inherited: &mut Inherited) -> Result<Server, ServerError> {
        let workers = config.runtime.cpus.len();
        let (sockets, local_addrs) = inherited.take_listeners(&config.listeners, workers)?;
        let admin = match &config.admin {
            None => None,
            Some(a) => match inherited.take_admin(a.address) {
                Some(l) => Some(l),
                None => Some(listener(a.address, false, 128).map_err(|source| BindError {
                    address: a.address,
                    source,
                })?),
            },
        };
        let upgrade_socket = match &config.runtime.upgrade_socket {
            None => None,
            Some(path) => match inherited.take_upgrade(path) {
                Some(fd) => Some(fd),
                None => Some(listen_at(path)?),
            },
        };
        Ok(Server::assemble(
            config,
            (sockets, local_addrs),
            admin,
            upgrade_socket,
        ))
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
            upgrade_socket,
            upgrading,
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
        let max_connections = fit_open_file_limit(&config);
        // Names in `backends` are looked up before the workers start, so the first generation
        // has their addresses; `dns_watch` follows them from then on.
        let dns = crate::upstream::discovery::State::default();
        let has_names = config.upstreams.iter().any(|u| !u.names.is_empty());
        let lookup = match crate::upstream::discovery::Lookup::new(&config.resolver.nameservers) {
            Ok(l) => Some(l),
            Err(e) => {
                if has_names {
                    error!("backends' names cannot be looked up: {e}");
                }
                None
            }
        };
        // What limits each upstream's backends, said of the file as written (a DNS name once,
        // not once per address it gives).
        let limits: Vec<String> = config
            .upstreams
            .iter()
            .map(|u| {
                format!(
                    "upstream {}: {}",
                    u.name,
                    crate::upstream::adaptive::summary(u)
                )
            })
            .collect();
        let (mut expanded, due) = control.block_on(crate::control::dns_refresh::initial(
            lookup.as_ref(),
            &dns,
            (*config).clone(),
        ));
        expanded.limits.max_connections = max_connections;
        let config = Arc::new(expanded);
        for (l, addr) in config.listeners.iter().zip(&local_addrs) {
            info!(
                "listening on {addr} for upstream {}",
                config.upstreams[l.upstream].name
            );
        }
        for line in &limits {
            info!("{line}");
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
        // Spawned upstreams start with an empty pool: their processes join it as they answer.
        let config = if config.upstreams.iter().any(|u| u.spawn.is_some()) {
            let mut c = (*config).clone();
            reload::spawned_pools(&mut c, None);
            Arc::new(c)
        } else {
            config
        };
        let upstreams: Vec<Arc<SharedUpstream>> = config
            .upstreams
            .iter()
            .map(|u| Arc::new(SharedUpstream::new(u.clone(), counting)))
            .collect();
        let exposed = Arc::new(Exposed::new(upgrade_socket.is_some()));
        exposed.add_listeners(&sockets);
        if let (Some(a), Some(sock)) = (&config.admin, &admin) {
            exposed.add(Tag::Admin { address: a.address }, sock.as_fd());
        }
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
            connections: Admission::new(config.limits.max_connections),
            exposed: exposed.clone(),
            handed_over: std::sync::atomic::AtomicBool::new(false),
            stopping: std::sync::atomic::AtomicBool::new(false),
            dns,
            spawned: crate::process::spawned::Spawned::default(),
            edge: crate::edge::tables::Tables::default(),
            caches: crate::modules::cache::zone::Zones::default(),
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

        let upgraded = Arc::new(tokio::sync::Notify::new());
        let upgrade_path = config.runtime.upgrade_socket.clone();
        if let (Some(sock), Some(path)) = (upgrade_socket, &upgrade_path) {
            exposed.add(Tag::Upgrade { path: path.clone() }, sock.as_fd());
            let handover = Handover {
                listener: sock,
                path: path.clone(),
                exposed,
                allowed: process.allowed.clone(),
                upgraded: upgraded.clone(),
            };
            handover.start().map_err(|source| ServerError::Worker {
                worker: usize::MAX,
                source,
            })?;
        }
        let all_accepting = first.clone();

        // Spawned backends are forked from this thread, which lives as long as the server: their
        // parent-death signal follows it.
        let supervisor = {
            let _on_this_runtime = control.enter();
            Supervisor::start(process.clone())
        };
        // Health checks and the admin listener run on this thread, pinned to `runtime.cpus`
        // like the workers, until shutdown.
        let handed_over = control.block_on(async {
            if let Some(sock) = admin {
                match TcpListener::from_std(sock) {
                    Ok(listener) => {
                        tokio::spawn(crate::control::admin::serve(listener, process.clone()));
                    }
                    Err(e) => error!("admin listener failed: {e}"),
                }
            }
            // Ready (for systemd, or the process this one upgrades) once every worker has
            // started accepting on the first generation's sockets.
            let workers = u32::try_from(cpus.len()).unwrap_or(u32::MAX);
            let ready = async {
                if let Ok(permits) = all_accepting.applied.acquire_many(workers).await {
                    permits.forget();
                }
                drop(all_accepting);
                let status = format!("serving on {local_addrs:?}");
                match &upgrading {
                    Some(old) => old.ready(),
                    None => crate::sys::notify::ready(&status),
                }
                std::future::pending::<()>().await
            };
            if let Some(lookup) = lookup {
                tokio::spawn(crate::control::dns_refresh::run(
                    process.clone(),
                    lookup,
                    due,
                ));
            }
            tokio::select! {
                () = shutdown => false,
                () = control_loop(process.clone(), hangups, access.as_ref()) => false,
                () = upgraded.notified() => true,
                () = ready => false,
            }
        });
        drop(upgrading);
        // The duplicates kept for an upgrade would keep the ports listening after the workers
        // close them.
        process.exposed.clear();
        if handed_over {
            info!("handed over to the new process: draining");
            process
                .handed_over
                .store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            crate::sys::notify::stopping();
            // The socket is this process's alone unless it handed it over.
            if let Some(path) = &upgrade_path {
                let _ = std::fs::remove_file(path);
            }
        }
        info!(
            "shutting down: no new connections; in-flight requests get up to {:?}",
            process.generations.borrow().config.runtime.shutdown_timeout
        );
        process
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = stop_tx.send(true);

        // Joined on a blocking thread while the control runtime goes on running, so the admin
        // listener answers through the drain (`/ready` 503, `/live` 200, `/metrics`).
        let result = control
            .block_on(async { tokio::task::spawn_blocking(move || join_workers(threads)).await })
            .unwrap_or(Err(ServerError::WorkerPanicked { worker: usize::MAX }));
        // The workers have drained: now the spawned backends can stop.
        control.block_on(supervisor.stop());
        // Workers are gone, and with them every sender: the log thread writes what is left.
        drop(process);
        if let Some(a) = access {
            a.stop();
        }
        info!("stopped");
        result
    }
}

/// Waits for every worker thread to end; the last error (or panic) among them.
/// Raises the soft open file limit to the hard one (see [`crate::sys::limits::raise_nofile`]),
/// says how many connections that leaves room for, and returns `limits.max_connections` as it
/// applies: a default that does not fit is lowered (and that said once), a value the file set
/// is kept and warned about. Before the workers start, so each of their threads has the limit.
fn fit_open_file_limit(config: &Config) -> usize {
    let limits = &config.limits;
    let limit = match crate::sys::limits::raise_nofile() {
        Ok(l) => l.soft,
        Err(e) => {
            warn!("cannot raise the open file limit to its hard limit: {e}");
            match crate::sys::limits::nofile() {
                Ok(l) => l.soft,
                Err(_) => return limits.max_connections,
            }
        }
    };
    let fit = crate::sys::limits::fit_nofile(
        limit,
        config.reserved_descriptors(),
        limits.max_connections,
        limits.max_connections_given,
    );
    info!("{}", fit.line);
    if let Some(lowered) = fit.lowered {
        info!("{lowered}");
    }
    if let Some(w) = fit.warning {
        warn!("{w}");
    }
    fit.max_connections
}

fn join_workers(
    threads: Vec<std::thread::JoinHandle<Result<(), ServerError>>>,
) -> Result<(), ServerError> {
    let mut result = Ok(());
    for (worker, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(e),
            Err(_) => result = Err(ServerError::WorkerPanicked { worker }),
        }
    }
    result
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
        let checks = crate::upstream::probe::run(upstreams);
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
                    crate::sys::notify::reloading();
                    // READY=1 either way: a refused reload leaves the running configuration
                    // serving, which is what systemd should show.
                    match reload::reload(&process).await {
                        Ok(summary) => {
                            crate::sys::notify::ready("reloaded");
                            info!("{summary}");
                        }
                        Err(e) => {
                            crate::sys::notify::ready(&format!("{e}"));
                            error!("{e}");
                        }
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

/// The single-threaded runtime the control thread awaits shutdown on.
pub fn control_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    crate::sys::runtime::current_thread()
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
