//! The supervisor of spawned backends (`[upstream.NAME.spawn]`): it starts each process pinned
//! to its core, logs its output, adds it to the upstream's pool once it answers, starts it
//! again with backoff when it exits, rolls the processes one at a time when a reload changes
//! the spawn table, and stops them after pinlb's workers have drained.
//!
//! It is one task on the control thread's runtime, and every process is forked from that
//! thread: `PR_SET_PDEATHSIG` (see `child`) follows the forking thread, and the control thread
//! lives as long as the server. The pool is changed by publishing a configuration generation
//! with the upstream's new backends (`reload::set_backends`), so that the request path sees a
//! spawned backend exactly as a configured one, and a backend that leaves the pool drains as
//! one removed by a reload does.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::config::{Spawn, Upstream};
use crate::process::shared::Process;
use crate::process::spawned::{Backoff, Record, State};
use crate::upstream::backend::BackendState;

/// How often a started process is probed until it answers.
const READY_POLL: Duration = Duration::from_millis(50);
/// How often a backend leaving the pool is checked for requests still in flight.
const DRAIN_POLL: Duration = Duration::from_millis(10);
/// Longest line of a process's output logged as one; a longer one is logged in pieces.
const MAX_LINE: u64 = 16 * 1024;

/// The running supervisor; [`Supervisor::stop`] ends it and its processes.
pub(crate) struct Supervisor {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Supervisor {
    /// Starts supervising the running generation's spawned upstreams, on the current runtime,
    /// which must be the control thread's.
    pub(crate) fn start(process: Arc<Process>) -> Supervisor {
        let (stop, stopping) = watch::channel(false);
        let task = tokio::spawn(supervise(process, stopping));
        Supervisor { stop, task }
    }

    /// Stops every process (SIGTERM, then SIGKILL after its `grace`) and reaps it. Called once
    /// the workers have drained, so no request is still on its way to one.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        if self.task.await.is_err() {
            error!("the spawned processes' supervisor panicked; its processes die with pinlb");
        }
        remove_socket_dir();
    }
}

/// A started process.
struct Running {
    pid: u32,
    started: Instant,
    /// Asks the process's task to stop it, with this grace before SIGKILL.
    stop: Option<oneshot::Sender<Duration>>,
    /// The process's task; ends with how the process ended once it is reaped.
    done: JoinHandle<String>,
}

/// Process `index` of an upstream, across its restarts.
struct Slot {
    index: usize,
    /// What this process was started from: a rolling restart that stopped half-way leaves the
    /// rest on the previous table.
    spawn: Spawn,
    /// Which of its two port ranges it listens on.
    bank: usize,
    run: Option<Running>,
    /// In the pool: it answered.
    in_pool: bool,
    /// Its backend's state in the running generation, while in the pool; a process leaving
    /// the pool is stopped once this counts no request in flight.
    state: Option<Arc<BackendState>>,
    restarts: u64,
    backoff: Backoff,
    restart_at: Option<Instant>,
    last_exit: Option<String>,
}

impl Slot {
    fn new(index: usize, spawn: Spawn, bank: usize) -> Slot {
        Slot {
            index,
            spawn,
            bank,
            run: None,
            in_pool: false,
            state: None,
            restarts: 0,
            backoff: Backoff::default(),
            restart_at: None,
            last_exit: None,
        }
    }

    fn address(&self) -> std::net::SocketAddr {
        self.spawn.address(self.index, self.bank)
    }

    /// Where pinlb reaches its process: the port, or its socket with `{socket}`.
    fn backend_address(&self) -> crate::backend_address::BackendAddress {
        self.spawn.backend_address(self.index, self.bank)
    }
}

/// A spawned upstream's processes.
struct Group {
    /// The upstream as the running generation has it (its pool aside): what readiness probes.
    upstream: Upstream,
    /// The spawn table the processes were last started or rolled to. A roll that stopped
    /// half-way is not tried again until a reload brings another table: generations that
    /// change nothing in it (the supervisor's own among them) must not start it over and over.
    target: Spawn,
    slots: Vec<Slot>,
}

struct Supervision {
    process: Arc<Process>,
    groups: Vec<Group>,
    /// Each process's task reports here when the process exits on its own.
    exits: mpsc::UnboundedSender<(u32, String)>,
    stopping: watch::Receiver<bool>,
}

async fn supervise(process: Arc<Process>, mut stopping: watch::Receiver<bool>) {
    let (exits, mut exited) = mpsc::unbounded_channel();
    let mut generations = process.generations.subscribe();
    let mut s = Supervision {
        process,
        groups: Vec::new(),
        exits,
        stopping: stopping.clone(),
    };
    generations.borrow_and_update();
    s.reconcile().await;
    loop {
        let due = s.next_restart();
        tokio::select! {
            _ = stopping.changed() => break,
            changed = generations.changed() => {
                if changed.is_err() {
                    break;
                }
                generations.borrow_and_update();
                s.reconcile().await;
            }
            Some((pid, how)) = exited.recv() => s.exited(pid, how).await,
            () = sleep_until(due), if due.is_some() => s.restart_due().await,
        }
    }
    s.stop_all().await;
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Supervision {
    /// Takes slot `i` of group `g` out, to use it beside `&self`; [`Supervision::put`] puts it
    /// back.
    fn take(&mut self, g: usize, i: usize) -> Slot {
        let spawn = self.groups[g].slots[i].spawn.clone();
        std::mem::replace(&mut self.groups[g].slots[i], Slot::new(i, spawn, 0))
    }

    fn put(&mut self, g: usize, i: usize, slot: Slot) {
        self.groups[g].slots[i] = slot;
    }

    fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Brings the processes in line with the running generation's spawn tables: starts those
    /// of a new spawned upstream, rolls those whose table changed, stops those of an upstream
    /// that is gone or no longer spawned. A generation that changes no spawn table (the
    /// supervisor's own, or a reload of something else) changes no process.
    async fn reconcile(&mut self) {
        let config = self.process.generations.borrow().config.clone();
        let mut g = 0;
        while g < self.groups.len() {
            let name = &self.groups[g].upstream.name;
            let kept = config
                .upstreams
                .iter()
                .any(|u| &u.name == name && u.spawn.is_some());
            if kept {
                g += 1;
                continue;
            }
            let group = self.groups.remove(g);
            info!(
                "upstream {}: no longer spawned; stopping its processes",
                group.upstream.name
            );
            for slot in group.slots {
                self.drain_and_stop(&group.upstream.name, slot).await;
            }
            self.process.spawned.remove(&group.upstream.name, 0);
        }
        for u in &config.upstreams {
            let Some(spawn) = &u.spawn else { continue };
            match self.groups.iter().position(|g| g.upstream.name == u.name) {
                None => {
                    self.groups.push(Group {
                        upstream: u.clone(),
                        target: spawn.clone(),
                        slots: Vec::new(),
                    });
                    let g = self.groups.len() - 1;
                    self.start_group(g, spawn).await;
                }
                Some(g) => {
                    let group = &mut self.groups[g];
                    group.upstream = u.clone();
                    if group.target.same_processes(spawn) {
                        // What applies without a restart: grace, ready_timeout, max_conns,
                        // slow_start.
                        for slot in &mut group.slots {
                            if slot.spawn.same_processes(spawn) {
                                slot.spawn = spawn.clone();
                            }
                        }
                        group.target = spawn.clone();
                        self.publish(g).await;
                    } else {
                        group.target = spawn.clone();
                        self.roll(g, spawn).await;
                    }
                }
            }
            if self.stopping() {
                return;
            }
        }
    }

    /// Starts every process of new group `g` at once, then adds each to the pool as it answers.
    async fn start_group(&mut self, g: usize, spawn: &Spawn) {
        for i in 0..spawn.count {
            let mut slot = Slot::new(i, spawn.clone(), 0);
            self.launch(g, &mut slot);
            self.groups[g].slots.push(slot);
        }
        for i in 0..spawn.count {
            self.admit(g, i).await;
        }
    }

    /// Starts slot `i` of group `g` (unless it runs), waits until it answers and adds it to the
    /// pool; a process that can't start or doesn't answer is stopped and started again later.
    async fn bring_up(&mut self, g: usize, i: usize) {
        let mut slot = self.take(g, i);
        if slot.run.is_none() {
            self.launch(g, &mut slot);
        }
        self.put(g, i, slot);
        self.admit(g, i).await;
    }

    /// Waits until slot `i`'s process answers, then adds it to the pool.
    async fn admit(&mut self, g: usize, i: usize) {
        if self.groups[g].slots[i].run.is_none() {
            return;
        }
        let result = {
            let group = &self.groups[g];
            let slot = &group.slots[i];
            let done = &slot.run.as_ref().map(|r| &r.done);
            answers(slot, &group.upstream, done, &self.stopping).await
        };
        match result {
            Ok(()) => {
                self.publish_with(g, i).await;
                let name = self.groups[g].upstream.name.clone();
                let slot = &self.groups[g].slots[i];
                info!(
                    "upstream {name}: process {i} (pid {}) answers on {}, on core {}: in the pool",
                    slot.run.as_ref().map_or(0, |r| r.pid),
                    slot.backend_address(),
                    slot.spawn.core(i)
                );
            }
            Err(e) => {
                if self.stopping() {
                    return;
                }
                let name = self.groups[g].upstream.name.clone();
                let mut slot = self.take(g, i);
                warn!(
                    "upstream {name}: process {i} on {}: {e}; stopping it",
                    slot.backend_address()
                );
                let how = stop(&mut slot).await;
                self.schedule_restart(&name, &mut slot, how, Duration::ZERO);
                self.put(g, i, slot);
            }
        }
    }

    /// Forks slot's process, pinned to its core, from this (the control) thread.
    fn launch(&self, g: usize, slot: &mut Slot) {
        let name = self.groups.get(g).map_or("", |g| g.upstream.name.as_str());
        let name = name.to_string();
        match start(&name, slot, self.exits.clone()) {
            Ok(run) => {
                info!(
                    "upstream {name}: started process {} (pid {}) on core {}: {}",
                    slot.index,
                    run.pid,
                    slot.spawn.core(slot.index),
                    slot.spawn.argv(slot.index, slot.bank).join(" ")
                );
                slot.run = Some(run);
                slot.restart_at = None;
                self.record(&name, slot, State::Starting);
            }
            Err(e) => {
                error!("upstream {name}: cannot start process {}: {e}", slot.index);
                self.schedule_restart(&name, slot, e, Duration::ZERO);
            }
        }
    }

    /// Counts a restart of `slot`, whose process ended as `how` after running `ran`, and
    /// schedules it after its backoff.
    fn schedule_restart(&self, name: &str, slot: &mut Slot, how: String, ran: Duration) {
        slot.run = None;
        slot.in_pool = false;
        slot.state = None;
        slot.restarts += 1;
        let delay = slot.backoff.next(ran);
        slot.restart_at = Some(Instant::now() + delay);
        warn!(
            "upstream {name}: process {} {how}; starting it again in {delay:?} (restart {})",
            slot.index, slot.restarts
        );
        slot.last_exit = Some(how);
        self.record(name, slot, State::Waiting);
    }

    /// A process exited on its own: out of the pool, and started again after its backoff.
    async fn exited(&mut self, pid: u32, how: String) {
        for g in 0..self.groups.len() {
            let Some(i) = self.groups[g]
                .slots
                .iter()
                .position(|s| s.run.as_ref().is_some_and(|r| r.pid == pid))
            else {
                continue;
            };
            let name = self.groups[g].upstream.name.clone();
            let mut slot = self.take(g, i);
            let ran = slot
                .run
                .as_ref()
                .map_or(Duration::ZERO, |r| r.started.elapsed());
            let was_pooled = slot.in_pool;
            let how = format!("(pid {pid}) exited: {how}, after {ran:.1?}");
            self.schedule_restart(&name, &mut slot, how, ran);
            self.put(g, i, slot);
            if was_pooled {
                self.publish(g).await;
            }
            return;
        }
    }

    fn next_restart(&self) -> Option<Instant> {
        self.groups
            .iter()
            .flat_map(|g| &g.slots)
            .filter_map(|s| s.restart_at)
            .min()
    }

    async fn restart_due(&mut self) {
        let now = Instant::now();
        for g in 0..self.groups.len() {
            for i in 0..self.groups[g].slots.len() {
                let due = self.groups[g].slots[i].restart_at.is_some_and(|t| t <= now);
                if due && !self.stopping() {
                    self.groups[g].slots[i].restart_at = None;
                    self.bring_up(g, i).await;
                }
            }
        }
    }

    /// Rolls group `g` onto `spawn`, one process at a time: start the new one on a port the
    /// group's running processes don't hold, wait until it answers, swap it into the pool for
    /// the old one, drain the old one and stop it. A new process that doesn't answer stops the
    /// roll, the old one still serving.
    async fn roll(&mut self, g: usize, spawn: &Spawn) {
        let name = self.groups[g].upstream.name.clone();
        let began = Instant::now();
        info!(
            "upstream {name}: spawn table changed; rolling restart of {} process(es)",
            spawn.count
        );
        for i in 0..spawn.count {
            if self.stopping() {
                return;
            }
            // Already on this table (a roll that stopped half-way got this far).
            if let Some(slot) = self.groups[g].slots.get_mut(i)
                && slot.run.is_some()
                && slot.spawn.same_processes(spawn)
            {
                slot.spawn = spawn.clone();
                continue;
            }
            let held: Vec<u16> = self.groups[g]
                .slots
                .iter()
                .filter(|s| s.run.is_some())
                .map(|s| s.address().port())
                .collect();
            let free = (0..2).find(|&b| !held.contains(&spawn.address(i, b).port()));
            let bank = match free {
                Some(b) => b,
                None => {
                    // Both of its ports are held (the table's ports or count changed): stop the
                    // process on the first before starting this one there.
                    let port = spawn.address(i, 0).port();
                    if let Some(j) = self.groups[g]
                        .slots
                        .iter()
                        .position(|s| s.run.is_some() && s.address().port() == port)
                    {
                        let old = self.take(g, j);
                        self.publish(g).await;
                        self.drain_and_stop(&name, old).await;
                    }
                    0
                }
            };
            let mut fresh = Slot::new(i, spawn.clone(), bank);
            if let Some(old) = self.groups[g].slots.get(i) {
                fresh.restarts = old.restarts;
            }
            self.launch(g, &mut fresh);
            let Some(run) = &fresh.run else {
                error!(
                    "upstream {name}: rolling restart stopped at process {i}: it could not start; processes {i} and on keep running the previous spawn table"
                );
                return;
            };
            let answered = {
                let done = &Some(&run.done);
                answers(&fresh, &self.groups[g].upstream, done, &self.stopping).await
            };
            if let Err(e) = answered {
                if !self.stopping() {
                    error!(
                        "upstream {name}: rolling restart stopped at process {i} on {}: {e}; processes {i} and on keep running the previous spawn table",
                        fresh.address()
                    );
                }
                stop(&mut fresh).await;
                if let Some(old) = self.groups[g].slots.get(i) {
                    let state = if old.run.is_some() {
                        State::Ready
                    } else {
                        State::Waiting
                    };
                    self.record(&name, old, state);
                }
                return;
            }
            let old = if i < self.groups[g].slots.len() {
                Some(std::mem::replace(&mut self.groups[g].slots[i], fresh))
            } else {
                self.groups[g].slots.push(fresh);
                None
            };
            // The new process in and the old one out in one generation.
            self.publish_with(g, i).await;
            if let Some(old) = old {
                self.drain_and_stop(&name, old).await;
            }
            let slot = &self.groups[g].slots[i];
            self.record(&name, slot, State::Ready);
        }
        while self.groups[g].slots.len() > spawn.count {
            if let Some(old) = self.groups[g].slots.pop() {
                self.publish(g).await;
                self.drain_and_stop(&name, old).await;
            }
        }
        self.process.spawned.remove(&name, spawn.count);
        info!(
            "upstream {name}: rolling restart done in {:.1?}",
            began.elapsed()
        );
    }

    /// Publishes group `g`'s pool with slot `i` in it (it just answered).
    async fn publish_with(&mut self, g: usize, i: usize) {
        self.groups[g].slots[i].in_pool = true;
        self.publish(g).await;
        let name = self.groups[g].upstream.name.clone();
        let slot = &self.groups[g].slots[i];
        self.record(&name, slot, State::Ready);
    }

    /// Publishes group `g`'s pool, its pooled slots' backends, and remembers each one's state
    /// in the new generation, to drain it by when it leaves.
    async fn publish(&mut self, g: usize) {
        let group = &self.groups[g];
        let pool: Vec<_> = group
            .slots
            .iter()
            .filter(|s| s.in_pool)
            .map(|s| s.spawn.backend(s.index, s.bank))
            .collect();
        let name = group.upstream.name.clone();
        if let Err(e) = crate::process::reload::set_backends(&self.process, &name, pool).await {
            error!("upstream {name}: changing its spawned pool: {e}");
        }
        for i in 0..self.groups[g].slots.len() {
            if self.groups[g].slots[i].in_pool {
                let slot = &self.groups[g].slots[i];
                let address = slot.spawn.backend_address(slot.index, slot.bank);
                self.groups[g].slots[i].state = self.state_of(g, address);
            }
        }
    }

    /// The running generation's state of group `g`'s backend at `address`.
    fn state_of(
        &self,
        g: usize,
        address: crate::backend_address::BackendAddress,
    ) -> Option<Arc<BackendState>> {
        let generation = self.process.generations.borrow();
        let name = &self.groups[g].upstream.name;
        let up = generation
            .upstreams
            .iter()
            .find(|u| &u.config.name == name)?;
        up.backends.iter().find(|b| b.address == address).cloned()
    }

    /// Stops `slot`'s process, which is out of the pool, once its requests in flight have
    /// finished (for at most `runtime.shutdown_timeout`).
    async fn drain_and_stop(&self, name: &str, mut slot: Slot) {
        if let Some(state) = slot.state.take() {
            self.record(name, &slot, State::Stopping);
            let limit = self
                .process
                .generations
                .borrow()
                .config
                .runtime
                .shutdown_timeout;
            let deadline = Instant::now() + limit;
            while state.in_flight() > 0 && Instant::now() < deadline {
                tokio::time::sleep(DRAIN_POLL).await;
            }
            if state.in_flight() > 0 {
                warn!(
                    "upstream {name}: process {} still has {} request(s) in flight after {limit:?}; stopping it anyway",
                    slot.index,
                    state.in_flight()
                );
            }
        }
        let pid = slot.run.as_ref().map_or(0, |r| r.pid);
        let how = stop(&mut slot).await;
        if pid != 0 {
            info!(
                "upstream {name}: process {} (pid {pid}) on {} stopped: {how}",
                slot.index,
                slot.backend_address()
            );
        }
    }

    /// Stops every process at once (the workers have drained), and reaps them.
    async fn stop_all(&mut self) {
        let mut stopping = Vec::new();
        for group in &mut self.groups {
            for slot in &mut group.slots {
                if let Some(mut run) = slot.run.take() {
                    if let Some(tx) = run.stop.take() {
                        let _ = tx.send(slot.spawn.grace);
                    }
                    stopping.push((group.upstream.name.clone(), slot.index, run));
                }
            }
        }
        for (name, i, run) in stopping {
            let how = run
                .done
                .await
                .unwrap_or_else(|_| "its task ended".to_string());
            info!(
                "upstream {name}: process {i} (pid {}) stopped: {how}",
                run.pid
            );
        }
    }

    fn record(&self, name: &str, slot: &Slot, state: State) {
        self.process.spawned.set(Record {
            upstream: name.to_string(),
            index: slot.index,
            pid: slot.run.as_ref().map(|r| r.pid),
            address: slot.backend_address(),
            core: slot.spawn.core(slot.index),
            state,
            restarts: slot.restarts,
            last_exit: slot.last_exit.clone(),
        });
    }
}

/// Forks `slot`'s process pinned to its core, with its output logged under `name`, and the
/// task that reaps it.
fn start(
    name: &str,
    slot: &Slot,
    exits: mpsc::UnboundedSender<(u32, String)>,
) -> Result<Running, String> {
    let port = slot.address().port();
    let argv = slot.spawn.argv(slot.index, slot.bank);
    let socket = slot.spawn.socket_path(slot.index, slot.bank);
    if let Some(path) = &socket {
        prepare_socket(path)?;
    }
    let mut command = std::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env("PORT", port.to_string())
        .envs(socket.iter().map(|p| ("SOCKET", p)))
        .envs(slot.spawn.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = &slot.spawn.cwd {
        command.current_dir(cwd);
    }
    let core = slot.spawn.core(slot.index);
    crate::sys::child::pinned(&mut command, &[core]).map_err(|e| format!("core {core}: {e}"))?;
    let mut child = tokio::process::Command::from(command)
        .spawn()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    let pid = child.id().ok_or_else(|| "it exited at once".to_string())?;
    let prefix = format!("{name}[{}] pid {pid}", slot.index);
    if let Some(out) = child.stdout.take() {
        tokio::spawn(log_lines(out, format!("{prefix} stdout")));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(log_lines(err, format!("{prefix} stderr")));
    }
    let (stop, stopped) = oneshot::channel();
    let done = tokio::spawn(async move {
        let how = reap(child, pid, stopped, exits).await;
        // The process is gone: its socket goes with it.
        if let Some(path) = socket {
            let _ = std::fs::remove_file(path);
        }
        how
    });
    Ok(Running {
        pid,
        started: Instant::now(),
        stop: Some(stop),
        done,
    })
}

/// Makes the directory of spawned processes' sockets (mode 0700: only pinlb's user may reach
/// them) and removes a socket a process of an earlier run left at `path`, which would make the
/// new one's `listen` fail with EADDRINUSE.
fn prepare_socket(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    if let Some(dir) = path.parent() {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the old socket {}: {e}", path.display())),
        Ok(_) => Err(format!("{} is there and is not a socket", path.display())),
        Err(_) => Ok(()),
    }
}

/// The directory of spawned processes' sockets, removed when pinlb stops (after its processes
/// are reaped, which removed their sockets); nothing when no process had one.
pub(crate) fn remove_socket_dir() {
    let dir = crate::config::Spawn::socket_dir();
    if dir.is_dir() {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            warn!("cannot remove {}: {e}", dir.display());
        }
    }
}

/// Waits for the process to exit, reporting it on `exits`; or, when asked through `stop`,
/// sends it SIGTERM and, after the grace it was given, SIGKILL. How it ended, either way.
///
/// The pid is signalled only here, while the child is not yet reaped, so the signal can't
/// reach another process that got the pid since.
async fn reap(
    mut child: tokio::process::Child,
    pid: u32,
    stop: oneshot::Receiver<Duration>,
    exits: mpsc::UnboundedSender<(u32, String)>,
) -> String {
    let grace = tokio::select! {
        status = child.wait() => {
            let how = describe(status);
            let _ = exits.send((pid, how.clone()));
            return how;
        }
        Ok(grace) = stop => grace,
    };
    if let Ok(raw) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => describe(status),
        Err(_) => {
            let _ = child.start_kill();
            format!(
                "SIGKILL after {grace:?} of SIGTERM, {}",
                describe(child.wait().await)
            )
        }
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("cannot wait for it: {e}"),
    }
}

/// Asks `slot`'s process to stop and waits until it is reaped; how it ended.
async fn stop(slot: &mut Slot) -> String {
    let Some(mut run) = slot.run.take() else {
        return "not running".to_string();
    };
    if let Some(tx) = run.stop.take() {
        let _ = tx.send(slot.spawn.grace);
    }
    run.done
        .await
        .unwrap_or_else(|_| "its task ended".to_string())
}

/// Waits until `slot`'s process answers: the upstream's health probe when it has one, else a
/// TCP connect (HAProxy's default check). Gives up after the spawn table's `ready_timeout`,
/// when the process exits (`done` finished) or when pinlb stops.
async fn answers(
    slot: &Slot,
    upstream: &Upstream,
    done: &Option<&JoinHandle<String>>,
    stopping: &watch::Receiver<bool>,
) -> Result<(), String> {
    let address = slot.backend_address();
    let limit = slot.spawn.ready_timeout;
    let deadline = Instant::now() + limit;
    let connector = upstream.tls.as_ref().map(|t| t.connector(address.tcp()));
    loop {
        if done.is_none_or(|d| d.is_finished()) {
            return Err("it exited before it answered".into());
        }
        if *stopping.borrow() {
            return Err("pinlb is stopping".into());
        }
        let result = match &upstream.health {
            Some(h) => {
                crate::upstream::probe::probe(
                    address,
                    h,
                    upstream.protocol,
                    connector.as_ref(),
                    &crate::upstream::proxy_header::for_probe(upstream.proxy_protocol),
                )
                .await
            }
            // A TCP connect, or a Unix socket's: the socket accepts.
            None => crate::http1::client::connect(address, READY_POLL * 10, None, &[])
                .await
                .map(drop)
                .map_err(|e| e.cause),
        };
        let last = match result {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "no answer within ready_timeout ({limit:?}): {last}"
            ));
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// Logs each line `from` writes, under `prefix`, until it closes.
async fn log_lines(from: impl AsyncRead + Unpin, prefix: String) {
    let mut reader = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                info!("{prefix}: {}", text.trim_end_matches(['\n', '\r']));
            }
        }
    }
}
