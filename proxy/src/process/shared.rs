//! What the whole process shares: the running configuration generation, the admission of
//! client connections under `limits.max_connections`, and the errors that stop pinlb. The control
//! thread, the admin listener and every worker hold one [`Process`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tracing::warn;

use crate::config::Config;
use crate::downstream::h1::Connections;
use crate::process::listen::{BindError, Bound, ListenerKey, Sockets};
use crate::proxy::accesslog::AccessHandle;
use crate::upstream::counters::Registered;
use crate::upstream::shared::SharedUpstream;

/// Errors that stop pinlb from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Bind(#[from] BindError),
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
    #[error(transparent)]
    Upgrade(#[from] crate::process::handover::UpgradeError),
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
    pub connections: Admission,
    /// Duplicates of every listening socket, for handing over to a new binary (`pinlb
    /// upgrade`); a reload adds and removes listeners here too.
    pub exposed: Arc<crate::process::handover::Exposed>,
    /// Set before the stop when a new process has taken over the listening sockets: workers
    /// then let idle connections linger for one more request (`Connections::drain_lingering`).
    pub handed_over: std::sync::atomic::AtomicBool,
    /// Set when a stop begins: `/ready` then answers 503 while the workers drain, so a load
    /// balancer in front (a Kubernetes Service) sends nothing new.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Backends' DNS names: the file's configuration, the last good answers, the failures.
    pub dns: crate::upstream::discovery::State,
    /// The spawned backends' records, kept by the supervisor for `/status` and `/metrics`.
    pub spawned: crate::process::spawned::Spawned,
    /// The rate zones' and connection limits' tables, shared by every worker and kept across
    /// reloads that keep them.
    pub edge: crate::edge::tables::Tables,
    /// The response cache's zones, shared by every worker and kept across reloads that keep
    /// them.
    pub caches: crate::modules::cache::zone::Zones,
}

/// One configuration generation: what a reload swaps as a whole.
pub(crate) struct Generation {
    /// 1 at start, one more per successful reload.
    pub number: u64,
    pub config: Arc<Config>,
    pub upstreams: Vec<Arc<SharedUpstream>>,
    /// Sockets for the listeners this generation adds, `[worker]` → (listener key, socket).
    /// Each worker takes its own.
    sockets: Vec<std::sync::Mutex<Vec<(ListenerKey, Bound)>>>,
    /// Each worker adds a permit once it has switched to this generation; the reload that sent
    /// it (or the start, for the first) waits for all of them.
    pub applied: Semaphore,
    /// Workers that have switched to this generation; a reload waits until all have.
    pub acked: std::sync::atomic::AtomicUsize,
    /// Told each time a worker switches, for a reload that waits for `acked`.
    pub switched: tokio::sync::Notify,
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
            switched: tokio::sync::Notify::new(),
        }
    }

    /// Called by each worker once it runs this generation.
    pub(crate) fn acknowledge(&self) {
        self.acked.fetch_add(1, Ordering::Relaxed);
        self.applied.add_permits(1);
        self.switched.notify_waiters();
    }

    pub(crate) fn take_sockets(&self, worker: usize) -> Vec<(ListenerKey, Bound)> {
        match self.sockets.get(worker) {
            Some(m) => std::mem::take(&mut *m.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
    }
}

/// The process's client connections, counted against `limits.max_connections` by every worker.
pub(crate) struct Admission {
    /// One permit per open client connection.
    slots: Arc<Semaphore>,
    /// Bumped while an accept loop waits for a slot: every worker's sweeper then closes its idle
    /// keep-alive connections to make room, as nginx does when it runs out of
    /// `worker_connections`, so that a flood of idle clients cannot lock out active ones.
    pub pressure: AtomicU64,
}

impl Admission {
    pub(crate) fn new(max_connections: usize) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(max_connections)),
            pressure: AtomicU64::new(0),
        }
    }

    /// Room for one more connection now, or `None` at `limits.max_connections` (a UDP session,
    /// which cannot wait: its datagram is dropped instead).
    pub(crate) fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Waits for room for one more connection. Until there is, nothing is accepted (new
    /// connections wait in the kernel's backlog) and idle connections are asked to close: this
    /// worker's at once, every worker's at its next tick, and again every 100 ms in case one
    /// became idle meanwhile.
    pub(crate) async fn slot(&self, clients: &Connections) -> OwnedSemaphorePermit {
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
