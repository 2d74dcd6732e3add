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
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::accesslog::AccessLog;
use crate::config::Config;
use crate::cpus::{format_cpu_list, pin_current_thread};
use crate::listen::{BindError, Sockets, bind_listeners, listener};
pub use crate::process::ServerError;
use crate::process::{Connections, Generation, Process};
use crate::reload;
use crate::stats::Registered;
use crate::supervisor::Supervisor;
use crate::upstream::SharedUpstream;
use crate::worker::worker_main;

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
            Some(a) => Some(listener(a.address, false, 128).map_err(|source| BindError {
                address: a.address,
                source,
            })?),
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
            connections: Connections::new(config.limits.max_connections),
            spawned: crate::spawn::Spawned::default(),
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

        // Spawned backends are forked from this thread, which lives as long as the server: their
        // parent-death signal follows it.
        let supervisor = {
            let _on_this_runtime = control.enter();
            Supervisor::start(process.clone())
        };
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
        let checks = crate::probe::run(upstreams);
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

/// The single-threaded runtime the control thread awaits shutdown on.
pub fn control_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
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
