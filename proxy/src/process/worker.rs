//! A worker: one thread pinned to one core, with its own single-threaded runtime, its own
//! listening sockets and upstream pools. It accepts connections, starts a task for each, and
//! follows the running configuration generation.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::config::{Listener, ListenerMode};
use crate::downstream::h1::{Connections, Held};
use crate::downstream::stream::DownstreamStream;
use crate::downstream::tcp::{Relay, TcpListening};
use crate::downstream::udp::{UdpListening, UdpRelay};
use crate::process::listen::Bound;
use crate::process::listen::{ListenerKey, accept, listener_keys};
use crate::process::shared::{Generation, Process, ServerError};
use crate::proxy::accesslog::Batch;
use crate::route::decision::{DownstreamRules, Plan, Route};
use crate::sys::runtime::{self, PinnedError};
use crate::upstream::counters::ListenerStats;
use crate::upstream::local::WorkerUpstream;

/// How long, after a binary upgrade, an idle keep-alive connection of the old process stays
/// open for a request already on its way: a client that sends within it gets its response
/// (with `Connection: close`) and reconnects to the new process, instead of a closed socket.
/// Longer than a busy client's gap between requests, short enough not to hold the old process.
const UPGRADE_LINGER: Duration = Duration::from_secs(1);

pub(crate) fn worker_main(
    worker: usize,
    core: usize,
    process: Arc<Process>,
    first: Arc<Generation>,
    mut generations: watch::Receiver<Arc<Generation>>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let rt = runtime::pinned(core).map_err(|e| match e {
        PinnedError::Pin(source) => ServerError::Pin {
            what: format!("worker {worker}"),
            cpus: core.to_string(),
            source,
        },
        PinnedError::Runtime(source) => ServerError::Worker { worker, source },
    })?;
    info!("worker {worker} running on core {core}");

    let work = async move {
        let mut state = WorkerState {
            worker,
            core,
            process,
            clients: Rc::new(Connections::with_parking()),
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
                let mut every = tokio::time::interval(crate::proxy::accesslog::FLUSH);
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
        // The summed warnings of this thread are written once a second (see sys::summed).
        tokio::task::spawn_local(async {
            let mut every = tokio::time::interval(crate::sys::summed::WINDOW);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                crate::sys::summed::flush();
            }
        });
        tokio::task::spawn_local(crate::downstream::h1::unparker(state.clients.clone()));
        let pressured = state.process.clone();
        tokio::task::spawn_local(crate::downstream::idle::sweeper(
            state.clients.clone(),
            move || pressured.connections.pressure.load(Ordering::Relaxed),
        ));
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
                        Ok(removed) => {
                            state.clients.reloaded();
                            closed(removed).await;
                        }
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
            process,
            ..
        } = state;
        drop(upstreams);
        // Connections still open hold the batch too; what it has now goes out, the rest when
        // they end.
        if let Some(b) = batch {
            b.flush();
        }
        for (_, l) in listeners {
            for t in l.tasks {
                let _ = t.await;
            }
        }
        // The listening sockets are closed now: idle connections close, busy ones once their
        // response is out, as long as the running configuration allows. After an upgrade the
        // sockets live on in the new process, and idle connections get one more request.
        if process.handed_over.load(Ordering::Relaxed) {
            clients.drain_lingering(UPGRADE_LINGER);
        } else {
            clients.drain();
        }
        drop(process);
        let timeout = generations.borrow().config.runtime.shutdown_timeout;
        if tokio::time::timeout(timeout, clients.all_closed())
            .await
            .is_err()
        {
            warn!("worker {worker}: connections still open after {timeout:?}, closing them");
        }
        // What the last second summed is written before the thread ends.
        crate::sys::summed::flush();
        Ok(())
    };
    // The worker's loop runs as a task rather than as the future `block_on` drives, so that
    // its `select!` (two watch receivers, their wakers registered again, about 400 instructions)
    // is polled only when one of them changed; `block_on` polls a join handle, which is a load
    // and a compare when nothing is new (benches/slowhead.sh measured the difference under a
    // `LocalSet`, which polled that future on every wakeup of any task).
    rt.block_on(async move {
        match tokio::task::spawn_local(work).await {
            Ok(done) => done,
            // A panic goes on up to the thread's join, as it did before the loop was a task.
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => Err(ServerError::Worker {
                    worker,
                    source: std::io::Error::other(e),
                }),
            },
        }
    })
}

/// One worker's listeners and upstreams in the running generation.
struct WorkerState {
    worker: usize,
    core: usize,
    process: Arc<Process>,
    /// This worker's open client connections, which a stop lets finish.
    clients: Rc<Connections>,
    stop: watch::Receiver<bool>,
    listeners: HashMap<ListenerKey, Listening>,
    /// This worker's view of each upstream, in config order.
    upstreams: Vec<Rc<WorkerUpstream>>,
    /// This worker's access log entries, when the access log is on.
    batch: Option<Rc<Batch>>,
}

/// One of a worker's listeners.
struct Listening {
    /// What serves its connections.
    serving: Serving,
    /// Tells the accept loop to stop, when a reload removes the listener.
    removed: watch::Sender<bool>,
    /// The accept loops, one per socket (usually one).
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The sockets those loops accept on, so that a reload can give them a new backlog.
    sockets: Vec<Socket>,
    /// The backlog they listen with.
    backlog: u32,
}

/// One of a listener's sockets in this worker.
enum Socket {
    Stream(Rc<TcpListener>),
    Datagram(Rc<tokio::net::UdpSocket>),
}

impl Socket {
    fn stream(&self) -> Option<&Rc<TcpListener>> {
        match self {
            Socket::Stream(s) => Some(s),
            Socket::Datagram(_) => None,
        }
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        match self {
            Socket::Stream(s) => s.local_addr(),
            Socket::Datagram(s) => s.local_addr(),
        }
    }
}

/// What serves a listener's connections, by its `mode`.
#[derive(Clone)]
enum Serving {
    /// HTTP: where its requests go.
    Http(Rc<Route>),
    /// TCP: where its connections are relayed.
    Tcp(Rc<TcpListening>),
    /// UDP: where its sessions are relayed.
    Udp(Rc<UdpListening>),
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
        let rules = Rc::new(DownstreamRules {
            trusted: config.trusted.clone(),
            limits: config.limits,
            http2: config.http2,
            request_ids: config.request_ids.clone(),
        });
        // The sweeper's tick follows the shortest timeout it keeps.
        let shortest = config
            .upstreams
            .iter()
            .map(|u| u.timeouts.client_idle)
            .fold(config.limits.header_timeout, Duration::min);
        self.clients.set_shortest_timeout(shortest);
        let mut sockets = generation.take_sockets(self.worker);
        // The accept loops this generation stops: those of removed listeners, and of listeners
        // whose mode changed.
        let mut stopped = Vec::new();
        let keys = listener_keys(&config.listeners);
        for (l, key) in config.listeners.iter().zip(&keys) {
            let tables = (&self.process.edge, &self.process.caches);
            let plan = |counting| Plan::of(l, config, &upstreams, &rules, tables, counting);
            if let Some(kept) = self.listeners.get_mut(key) {
                if kept.backlog != l.backlog {
                    // On the worker's own sockets: each worker has one per listener.
                    for sock in kept.sockets.iter().filter_map(Socket::stream) {
                        if let Err(e) = crate::process::listen::set_backlog(&**sock, l.backlog) {
                            error!(
                                "worker {}: listener {}: cannot change the backlog to {}: {e}",
                                self.worker, l.address, l.backlog
                            );
                        }
                    }
                    kept.backlog = l.backlog;
                }
                match &kept.serving {
                    Serving::Http(route) if l.mode == ListenerMode::Http => {
                        route.renew(plan(route.stats.is_some()));
                        continue;
                    }
                    Serving::Tcp(t) if l.mode == ListenerMode::Tcp => {
                        *t.relay.borrow_mut() = Rc::new(Relay::of(l, config, &upstreams, tables.0));
                        continue;
                    }
                    Serving::Udp(u) if l.mode == ListenerMode::Udp => {
                        *u.relay.borrow_mut() = Rc::new(UdpRelay::of(l, &upstreams, config));
                        continue;
                    }
                    _ => {}
                }
            }
            // Its mode changed: its sockets are served anew, and its open connections finish
            // as they were.
            if let Some(mut kept) = self.listeners.remove(key) {
                let _ = kept.removed.send(true);
                let (bound, stats) = kept.serving.bound();
                let serving = self.serving(l, config, (&upstreams, &rules), bound, stats);
                let (removed, tasks) = self.accept_loops(&kept.sockets, &serving);
                stopped.extend(std::mem::replace(&mut kept.tasks, tasks));
                kept.removed = removed;
                kept.serving = serving;
                self.listeners.insert(*key, kept);
                continue;
            }
            // Usually one socket per listener; after an upgrade from a process with more
            // workers, several (see `upgrade`), each with its own accept loop.
            let mut mine = Vec::new();
            let mut i = 0;
            while i < sockets.len() {
                if sockets[i].0 == *key {
                    let (_, sock) = sockets.swap_remove(i);
                    let worker = self.worker;
                    let failed = |source| ServerError::Worker { worker, source };
                    mine.push(match sock {
                        Bound::Stream(s) => {
                            Socket::Stream(Rc::new(TcpListener::from_std(s).map_err(failed)?))
                        }
                        Bound::Datagram(s) => Socket::Datagram(Rc::new(
                            tokio::net::UdpSocket::from_std(s).map_err(failed)?,
                        )),
                    });
                } else {
                    i += 1;
                }
            }
            let Some(first) = mine.first() else {
                error!(
                    "worker {}: no socket for new listener {}",
                    self.worker, l.address
                );
                continue;
            };
            let bound = first.local_addr().unwrap_or(l.address);
            let stats = config.admin.is_some().then(|| {
                self.process
                    .registered
                    .listener(bound, l.address, self.worker, self.core)
            });
            let serving = self.serving(l, config, (&upstreams, &rules), bound, stats);
            let (removed, tasks) = self.accept_loops(&mine, &serving);
            self.listeners.insert(
                *key,
                Listening {
                    serving,
                    removed,
                    tasks,
                    sockets: mine,
                    backlog: l.backlog,
                },
            );
        }
        let gone: Vec<ListenerKey> = self
            .listeners
            .keys()
            .filter(|k| !keys.contains(k))
            .copied()
            .collect();
        for key in gone {
            if let Some(l) = self.listeners.remove(&key) {
                let _ = l.removed.send(true);
                debug!(
                    "worker {}: stopped accepting on {}; its connections finish",
                    self.worker, key.0
                );
                stopped.extend(l.tasks);
            }
        }
        self.upstreams = upstreams;
        Ok(stopped)
    }
}

impl WorkerState {
    /// What serves listener `l`'s connections in this generation, bound to `bound`, with its
    /// `/metrics` counters when metrics are on.
    fn serving(
        &self,
        l: &Listener,
        config: &crate::config::Config,
        (upstreams, rules): (&[Rc<WorkerUpstream>], &Rc<DownstreamRules>),
        bound: std::net::SocketAddr,
        stats: Option<Arc<ListenerStats>>,
    ) -> Serving {
        let tables = &self.process.edge;
        match l.mode {
            ListenerMode::Http => {
                let tables = (tables, &self.process.caches);
                let plan = Plan::of(l, config, upstreams, rules, tables, stats.is_some());
                Serving::Http(Rc::new(Route::new(plan, stats, bound)))
            }
            ListenerMode::Tcp => Serving::Tcp(Rc::new(TcpListening {
                relay: RefCell::new(Rc::new(Relay::of(l, config, upstreams, tables))),
                stats,
                local: bound,
            })),
            ListenerMode::Udp => Serving::Udp(Rc::new(UdpListening {
                relay: RefCell::new(Rc::new(UdpRelay::of(l, upstreams, config))),
                stats,
                local: bound,
            })),
        }
    }

    /// An accept loop on each of `sockets` for `serving`, and the sender that stops them.
    fn accept_loops(
        &self,
        sockets: &[Socket],
        serving: &Serving,
    ) -> (watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>) {
        let (removed, removed_rx) = watch::channel(false);
        let tasks = sockets
            .iter()
            .map(|socket| match (socket, serving) {
                (Socket::Datagram(s), Serving::Udp(u)) => {
                    let process = self.process.clone();
                    tokio::task::spawn_local(crate::downstream::udp::serve(
                        s.clone(),
                        u.clone(),
                        move || process.connections.try_slot(),
                        self.batch.clone(),
                        self.stop.clone(),
                        removed_rx.clone(),
                    ))
                }
                (Socket::Stream(listener), _) => tokio::task::spawn_local(accept_loop(
                    listener.clone(),
                    serving.clone(),
                    self.process.clone(),
                    self.batch.clone(),
                    self.clients.clone(),
                    self.stop.clone(),
                    removed_rx.clone(),
                )),
                // Listener keys tell UDP sockets from TCP ones, so a socket always comes to a
                // listener of its kind.
                (Socket::Datagram(_), _) => {
                    error!("worker {}: a UDP socket for a TCP listener", self.worker);
                    tokio::task::spawn_local(async {})
                }
            })
            .collect();
        (removed, tasks)
    }
}

impl Serving {
    /// The address it is bound to, and its `/metrics` counters.
    fn bound(&self) -> (std::net::SocketAddr, Option<Arc<ListenerStats>>) {
        match self {
            Serving::Http(r) => (r.local, r.stats.clone()),
            Serving::Tcp(t) => (t.local, t.stats.clone()),
            Serving::Udp(u) => (u.local, u.stats.clone()),
        }
    }
}

async fn accept_loop(
    listener: Rc<TcpListener>,
    serving: Serving,
    process: Arc<Process>,
    batch: Option<Rc<Batch>>,
    clients: Rc<Connections>,
    mut stop: watch::Receiver<bool>,
    mut removed: watch::Receiver<bool>,
) {
    let connections = &process.connections;
    let stats = serving.bound().1;
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
        let route = match &serving {
            Serving::Http(route) => route,
            Serving::Tcp(listening) => {
                // Never idle: it is relayed from its accept (the tunnel's timeouts bound it).
                let registered = clients.open(Duration::MAX, Duration::MAX);
                let held = Held::new(slot, stats.clone());
                tokio::task::spawn_local(crate::downstream::tcp::serve(
                    stream,
                    peer,
                    listening.clone(),
                    batch.clone(),
                    held,
                    registered,
                ));
                continue;
            }
            // Never: its sockets are UDP ones, served by `downstream::udp`.
            Serving::Udp(_) => return,
        };
        // The timeouts that decide when the connection is idle are taken now, from the plan
        // running now; each request takes the plan anew.
        let plan = route.plan();
        let header_timeout = plan.rules.limits.header_timeout;
        let client_idle = plan.upstream.shared.config.timeouts.client_idle;
        let registered = clients.open(client_idle, header_timeout);
        let held = Held::new(slot, stats.clone());
        let start = crate::downstream::h1::Start::accepted();
        if let Some(from) = plan.proxy_protocol.clone() {
            tokio::task::spawn_local(crate::downstream::proxied::serve_proxied(
                stream,
                peer,
                from,
                registered,
                route.clone(),
                batch.clone(),
                held,
                start,
            ));
        } else if plan.tls.is_some() {
            tokio::task::spawn_local(crate::downstream::h1::serve_tls(
                stream,
                peer,
                registered,
                route.clone(),
                batch.clone(),
                held,
                start,
            ));
        } else {
            tokio::task::spawn_local(crate::downstream::h1::serve(
                DownstreamStream::Plain(stream),
                peer,
                registered,
                route.clone(),
                batch.clone(),
                held,
                start,
            ));
        }
    }
}
