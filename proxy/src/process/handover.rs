//! Binary upgrade (`pinlb upgrade`): a new pinlb process takes over the running one's listening
//! sockets, passed over a unix socket with `SCM_RIGHTS` as HAProxy (`expose-fd listeners`) and
//! Envoy do, while the old process drains and exits.
//!
//! # Why no connection is refused or lost
//!
//! A listening socket is a kernel object that lives as long as any process holds a descriptor
//! for it; `SCM_RIGHTS` gives the new process descriptors for the *same* objects, not copies
//! bound to the same port. So the port never stops listening, and nothing is rebound.
//!
//! With `SO_REUSEPORT` each worker has its own socket per listener, and the kernel hashes every
//! incoming connection to one of them, into that socket's own accept queue. A connection queued
//! on a socket that is closed for good is reset, which is why a restart (or a new process that
//! binds fresh `SO_REUSEPORT` sockets beside the old ones and lets the old ones close) drops
//! connections. Here the new process receives every worker's socket and accepts on all of them
//! (several per worker when it has fewer workers; fresh ones only for workers beyond the old
//! count), so every queue keeps a reader. The old process stops accepting by dropping its
//! accept loops, which closes its descriptors but not the sockets: the new process holds them,
//! and whatever the old process left queued is accepted by the new one.
//!
//! # The exchange
//!
//! The running process listens on `runtime.upgrade_socket` (`SOCK_SEQPACKET`, mode 0600, peers
//! of another user refused). Messages are JSON, one per packet, a socket's descriptor riding
//! with its tag:
//!
//! 1. `pinlb upgrade` sends `Upgrade { binary, config }`;
//! 2. the old process starts `binary serve -c config --upgrade-from SOCKET`, which connects and
//!    says `Hello { pid }`;
//! 3. the old process sends `Socket(tag)` for every listener socket of every worker, the admin
//!    listener and the upgrade socket itself, then `End`;
//! 4. the new process reads its configuration, maps the sockets to its listeners by key (binding
//!    fresh ones for listeners new in its file), starts its workers and, once all of them accept,
//!    says `Ready` (or `Failed { reason }`, for a bad file);
//! 5. the old process begins its graceful stop (in-flight requests finish, idle keep-alive
//!    connections close), tells systemd the new `MAINPID`, and answers `pinlb upgrade` with
//!    `Done { pid }`.
//!
//! A new process that fails, crashes or is not ready in time (`pinlb upgrade --timeout`) is
//! killed, the old one keeps serving, and `pinlb upgrade` exits non-zero with the reason.

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, accept4, bind, connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt,
};
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use crate::config::Listener;
use crate::process::listen::{
    BindError, Bound, ListenerKey, Sockets, bind_listeners, listener_keys,
};

/// How long the new process waits for the old one's sockets, and the old one for a first
/// message on a connection: both sides are local and answer at once unless stuck.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest message: a tag or a reason, far below it.
const MAX_MESSAGE: usize = 64 * 1024;

/// Why an upgrade did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The new process did not take over; the old one serves on.
    #[error("upgrade failed, the running process keeps serving: {0}")]
    Failed(String),
    #[error("unexpected message on the upgrade socket: {0}")]
    Protocol(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UpgradeError {
    let what = what.into();
    move |source| UpgradeError::Io { what, source }
}

/// What a passed socket is, so that the new process maps it to its own configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Tag {
    /// Worker `worker`'s socket for the listener with key (`address`, `index`).
    Listener {
        address: SocketAddr,
        index: usize,
        worker: usize,
    },
    /// The admin listener, by its configured address.
    Admin { address: SocketAddr },
    /// The unix socket `pinlb upgrade` connects to, so the path stays bound across upgrades.
    Upgrade { path: PathBuf },
}

#[derive(Debug, Serialize, Deserialize)]
enum Message {
    Upgrade {
        binary: PathBuf,
        config: PathBuf,
        timeout_ms: u64,
    },
    Hello {
        pid: u32,
    },
    Socket(Tag),
    End,
    Ready,
    Failed {
        reason: String,
    },
    Done {
        pid: u32,
    },
}

/// Every socket the running process would hand over: duplicates of the descriptors its workers
/// accept on, kept current by reloads. A duplicate keeps its socket listening (the kernel
/// completes handshakes into its queue) after the workers close theirs, so one a reload removes
/// is forgotten here at once, and all of them when a stop begins: a stopped listener must
/// refuse connections, not queue them unread.
#[derive(Default)]
pub(crate) struct Exposed {
    /// Only with `runtime.upgrade_socket`: without it nothing is ever handed over.
    enabled: bool,
    sockets: Mutex<Vec<(Tag, OwnedFd)>>,
}

impl Exposed {
    pub(crate) fn new(enabled: bool) -> Exposed {
        Exposed {
            enabled,
            sockets: Mutex::default(),
        }
    }

    /// Forgets every socket: a stop has begun.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Adds a duplicate of every socket in `sockets`.
    pub(crate) fn add_listeners(&self, sockets: &Sockets) {
        for (worker, per_worker) in sockets.iter().enumerate() {
            for ((address, index), sock) in per_worker {
                let tag = Tag::Listener {
                    address: *address,
                    index: *index,
                    worker,
                };
                self.add(tag, sock.as_fd());
            }
        }
    }

    /// Adds a duplicate of `fd`. Without one (out of descriptors) an upgrade binds a fresh
    /// socket in its place, which is logged now.
    pub(crate) fn add(&self, tag: Tag, fd: BorrowedFd<'_>) {
        if !self.enabled {
            return;
        }
        match fd.try_clone_to_owned() {
            Ok(dup) => self.lock().push((tag, dup)),
            Err(e) => error!("cannot keep {tag:?} for an upgrade: {e}"),
        }
    }

    /// Forgets the listener sockets whose key is not in `keys`.
    pub(crate) fn keep_listeners(&self, keys: &[ListenerKey]) {
        self.lock().retain(|(tag, _)| match tag {
            Tag::Listener { address, index, .. } => keys.contains(&(*address, *index)),
            _ => true,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Tag, OwnedFd)>> {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn seqpacket() -> std::io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

fn connect_to(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = seqpacket()?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}

/// Listens on `path` for `pinlb upgrade`, mode 0600. A socket file nobody listens on (left by
/// a process that was killed) is replaced; one a live process listens on is an error, as a
/// taken port is.
pub(crate) fn listen_at(path: &Path) -> Result<OwnedFd, UpgradeError> {
    let what = || format!("runtime.upgrade_socket {}", path.display());
    if std::fs::symlink_metadata(path).is_ok() {
        match connect_to(path) {
            Ok(_) => {
                return Err(UpgradeError::Io {
                    what: what(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        "another process listens on it",
                    ),
                });
            }
            Err(_) => std::fs::remove_file(path).map_err(io(what()))?,
        }
    }
    let fd = seqpacket().map_err(io(what()))?;
    let addr = UnixAddr::new(path).map_err(|e| io(what())(e.into()))?;
    bind(fd.as_raw_fd(), &addr).map_err(|e| io(what())(e.into()))?;
    // Nobody can connect before `listen`, so the mode is set before anyone could.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io(what()))?;
    let backlog = Backlog::new(16).map_err(|e| io(what())(e.into()))?;
    listen(&fd, backlog).map_err(|e| io(what())(e.into()))?;
    Ok(fd)
}

fn send(fd: BorrowedFd<'_>, m: &Message, with: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    let raw = with.map(|f| [f.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage<'_>> = raw.iter().map(|r| ControlMessage::ScmRights(r)).collect();
    sendmsg::<()>(
        fd.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// Waits until `fd` is readable or `until` passes (`TimedOut`).
fn wait_readable(fd: BorrowedFd<'_>, until: Instant) -> std::io::Result<()> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The next message on `fd` and the descriptor that came with it; `UnexpectedEof` when the peer
/// closed, `TimedOut` when nothing came by `until`.
fn recv(fd: BorrowedFd<'_>, until: Instant) -> std::io::Result<(Message, Option<OwnedFd>)> {
    wait_readable(fd, until)?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let (n, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel has just installed these descriptors in this process for
                // this message; nothing else knows them, so each gets exactly one owner.
                fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        (msg.bytes, fds, truncated)
    };
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if truncated || fds.len() > 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a truncated message, or more than one descriptor",
        ));
    }
    let m = serde_json::from_slice(&buf[..n])
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((m, fds.into_iter().next()))
}

/// `pinlb upgrade`: asks the process listening on `socket` to start `binary` with `config` and
/// hand over to it; returns the new process's pid once it serves.
pub fn request(
    socket: &Path,
    binary: &Path,
    config: &Path,
    timeout: Duration,
) -> Result<u32, UpgradeError> {
    let what = format!("cannot reach the running pinlb on {}", socket.display());
    let conn = connect_to(socket).map_err(io(&what))?;
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let ask = Message::Upgrade {
        binary: binary.to_path_buf(),
        config: config.to_path_buf(),
        timeout_ms,
    };
    send(conn.as_fd(), &ask, None).map_err(io(&what))?;
    // The old process gives up on the new one at `timeout`; its answer follows at once.
    let until = Instant::now() + timeout + EXCHANGE_TIMEOUT;
    match recv(conn.as_fd(), until).map_err(io("no answer from the running pinlb"))? {
        (Message::Done { pid }, _) => Ok(pid),
        (Message::Failed { reason }, _) => Err(UpgradeError::Failed(reason)),
        (other, _) => Err(UpgradeError::Protocol(format!("{other:?}"))),
    }
}

/// The new process's side: the sockets received from the process it takes over from, and the
/// connection on which it says it is ready.
pub struct Inherited {
    conn: OwnedFd,
    sockets: Vec<(Tag, OwnedFd)>,
}

/// Connects to the running process on `socket` (the new process's first step) and receives
/// every socket it hands over.
pub fn inherit(socket: &Path) -> Result<Inherited, UpgradeError> {
    let what = format!("upgrade socket {}", socket.display());
    let conn = connect_to(socket).map_err(io(&what))?;
    let hello = Message::Hello {
        pid: std::process::id(),
    };
    send(conn.as_fd(), &hello, None).map_err(io(&what))?;
    let until = Instant::now() + EXCHANGE_TIMEOUT;
    let mut sockets = Vec::new();
    loop {
        match recv(conn.as_fd(), until).map_err(io(&what))? {
            (Message::Socket(tag), Some(fd)) => sockets.push((tag, fd)),
            (Message::End, _) => break,
            (other, _) => return Err(UpgradeError::Protocol(format!("{other:?}"))),
        }
    }
    info!(
        "received {} sockets from the running process",
        sockets.len()
    );
    Ok(Inherited { conn, sockets })
}

impl Inherited {
    /// Tells the old process this one will not take over, and why.
    pub fn failed(&self, reason: &str) {
        let m = Message::Failed {
            reason: reason.to_string(),
        };
        if let Err(e) = send(self.conn.as_fd(), &m, None) {
            warn!("cannot tell the old process the upgrade failed: {e}");
        }
    }

    /// Every worker accepts: the old process may stop accepting.
    pub(crate) fn ready(&self) {
        if let Err(e) = send(self.conn.as_fd(), &Message::Ready, None) {
            error!("cannot tell the old process this one is ready: {e}");
        }
    }

    /// Sockets for `listeners` on `workers` workers: the inherited ones by listener key (socket
    /// `i` of a key goes to worker `i % workers`, so none is left without a reader), fresh
    /// `SO_REUSEPORT` ones on the same port for workers beyond the inherited count, and fresh
    /// ones for listeners the old process did not have.
    pub(crate) fn take_listeners(
        &mut self,
        listeners: &[Listener],
        workers: usize,
    ) -> Result<(Sockets, Vec<SocketAddr>), BindError> {
        let keys = listener_keys(listeners);
        let mut inherited: Vec<Vec<(usize, Bound)>> = Vec::new();
        for key in &keys {
            let mut mine = Vec::new();
            let mut i = 0;
            while i < self.sockets.len() {
                match &self.sockets[i].0 {
                    Tag::Listener {
                        address,
                        index,
                        worker,
                    } if (*address, *index) == *key => {
                        let worker = *worker;
                        let (_, fd) = self.sockets.swap_remove(i);
                        mine.push((worker, Bound::from_fd(fd)));
                    }
                    _ => i += 1,
                }
            }
            mine.sort_by_key(|(w, _)| *w);
            inherited.push(mine);
        }
        let (mut sockets, fresh_addrs) = bind_listeners(listeners, workers, |k| {
            keys.iter()
                .zip(&inherited)
                .any(|(key, got)| key == k && !got.is_empty())
        })?;
        let mut fresh_addrs = fresh_addrs.into_iter();
        let mut local_addrs = Vec::with_capacity(keys.len());
        for ((l, key), mine) in listeners.iter().zip(&keys).zip(inherited) {
            if mine.is_empty() {
                local_addrs.extend(fresh_addrs.next());
                continue;
            }
            let bind_error = |source| BindError {
                address: l.address,
                source,
            };
            let addr = mine[0].1.local_addr().map_err(bind_error)?;
            let count = mine.len();
            for (i, (_, sock)) in mine.into_iter().enumerate() {
                // The old process's backlog goes with its sockets; this file's is the one now.
                if let Bound::Stream(s) = &sock {
                    crate::process::listen::set_backlog(s, l.backlog).map_err(bind_error)?;
                }
                sockets[i % workers].push((*key, sock));
            }
            for per_worker in sockets.iter_mut().skip(count) {
                let sock = Bound::fresh(l, addr).map_err(|source| BindError {
                    address: addr,
                    source,
                })?;
                per_worker.push((*key, sock));
            }
            local_addrs.push(addr);
        }
        Ok((sockets, local_addrs))
    }

    /// The old process's admin listener, when it was configured at `address` too.
    pub(crate) fn take_admin(&mut self, address: SocketAddr) -> Option<std::net::TcpListener> {
        let i = self
            .sockets
            .iter()
            .position(|(t, _)| *t == Tag::Admin { address })?;
        Some(std::net::TcpListener::from(self.sockets.swap_remove(i).1))
    }

    /// The old process's upgrade socket, when it listened on `path` too.
    pub(crate) fn take_upgrade(&mut self, path: &Path) -> Option<OwnedFd> {
        let i = self
            .sockets
            .iter()
            .position(|(t, _)| matches!(t, Tag::Upgrade { path: p } if p == path))?;
        Some(self.sockets.swap_remove(i).1)
    }
}

/// The old process's side: listens for `pinlb upgrade` on its own thread (blocking calls, all
/// bounded once an upgrade starts) and hands over.
pub(crate) struct Handover {
    pub listener: OwnedFd,
    pub path: PathBuf,
    pub exposed: Arc<Exposed>,
    /// The cores the new process may use: the whole allowed set this process started with, not
    /// the `runtime.cpus` the control thread is pinned to, so a new file may use other cores.
    pub allowed: Vec<usize>,
    /// Notified once a new process serves: the server's graceful stop begins.
    pub upgraded: Arc<tokio::sync::Notify>,
}

impl Handover {
    pub(crate) fn start(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("pinlb-upgrade".into())
            .spawn(move || self.run())
            .map(drop)
    }

    fn run(self) {
        // The new process inherits this thread's mask.
        if !self.allowed.is_empty() {
            if let Err(e) = crate::sys::cpus::pin_current_thread(&self.allowed) {
                warn!("upgrade: cannot widen the upgrade thread to the allowed cores: {e}");
            }
        }
        loop {
            let conn = match self.accept(None) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(e) => {
                    error!("upgrade socket {}: {e}", self.path.display());
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let first = recv(conn.as_fd(), Instant::now() + EXCHANGE_TIMEOUT);
            let (binary, config, timeout) = match first {
                Ok((
                    Message::Upgrade {
                        binary,
                        config,
                        timeout_ms,
                    },
                    _,
                )) => (binary, config, Duration::from_millis(timeout_ms)),
                Ok((other, _)) => {
                    warn!("upgrade socket: unexpected {other:?}");
                    continue;
                }
                Err(e) => {
                    warn!("upgrade socket: {e}");
                    continue;
                }
            };
            info!(
                "upgrade: starting {} serve -c {}",
                binary.display(),
                config.display()
            );
            let outcome = self.upgrade(&binary, &config, timeout);
            let answer = match &outcome {
                Ok(pid) => Message::Done { pid: *pid },
                Err(reason) => Message::Failed {
                    reason: reason.clone(),
                },
            };
            // Answered before the stop begins: once it does, this process may exit at any
            // moment.
            if let Err(e) = send(conn.as_fd(), &answer, None) {
                warn!("upgrade: cannot answer pinlb upgrade: {e}");
            }
            match outcome {
                Ok(pid) => {
                    info!("upgrade: pid {pid} serves now; this process drains and exits");
                    crate::sys::notify::main_pid(pid, "handed over to a new process; draining");
                    self.upgraded.notify_one();
                    return;
                }
                Err(reason) => error!("upgrade failed, this process keeps serving: {reason}"),
            }
        }
    }

    /// The next connection from a peer of this user (or root); `None` when `until` passes first
    /// or a peer was refused. Without `until`, waits as long as it takes.
    fn accept(&self, until: Option<Instant>) -> std::io::Result<Option<OwnedFd>> {
        if let Some(until) = until {
            match wait_readable(self.listener.as_fd(), until) {
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Ok(None),
                r => r?,
            }
        }
        let raw = match accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(fd) => fd,
            Err(Errno::EINTR | Errno::EAGAIN | Errno::ECONNABORTED) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // SAFETY: accept4 has just returned this new descriptor; nothing else owns it.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        let peer = getsockopt(&conn, sockopt::PeerCredentials)?;
        let me = nix::unistd::geteuid().as_raw();
        if peer.uid() != me && peer.uid() != 0 {
            warn!(
                "upgrade socket: refused pid {} of uid {}",
                peer.pid(),
                peer.uid()
            );
            return Ok(None);
        }
        Ok(Some(conn))
    }

    /// Starts the new process and hands over to it; on any failure it is killed and reaped.
    fn upgrade(&self, binary: &Path, config: &Path, timeout: Duration) -> Result<u32, String> {
        let until = Instant::now() + timeout;
        let mut child = Command::new(binary)
            .arg("serve")
            .arg("-c")
            .arg(config)
            .arg("--upgrade-from")
            .arg(&self.path)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let pid = child.id();
        match self.hand_over(&mut child, until, timeout) {
            Ok(()) => Ok(pid),
            Err(reason) => {
                if matches!(child.try_wait(), Ok(None)) {
                    let _ = child.kill();
                }
                // Killed or exited: reaping it is immediate.
                let _ = child.wait();
                Err(reason)
            }
        }
    }

    fn hand_over(
        &self,
        child: &mut Child,
        until: Instant,
        timeout: Duration,
    ) -> Result<(), String> {
        let pid = child.id();
        let exited = |child: &mut Child, when: &str| match child.try_wait() {
            Ok(Some(status)) => Some(format!("the new process (pid {pid}) {status} {when}")),
            _ => None,
        };
        let late = || format!("the new process (pid {pid}) was not ready within {timeout:?}");
        // Its connection, among any others: a second `pinlb upgrade` meanwhile is told no.
        let conn = loop {
            if let Some(e) = exited(child, "before it connected") {
                return Err(e);
            }
            if Instant::now() >= until {
                return Err(late());
            }
            let tick = until.min(Instant::now() + Duration::from_millis(100));
            let Some(conn) = self.accept(Some(tick)).map_err(|e| e.to_string())? else {
                continue;
            };
            match recv(conn.as_fd(), until.min(Instant::now() + EXCHANGE_TIMEOUT)) {
                Ok((Message::Hello { pid: p }, _)) if p == pid => break conn,
                Ok((Message::Upgrade { .. }, _)) => {
                    let no = Message::Failed {
                        reason: "another upgrade is in progress".into(),
                    };
                    let _ = send(conn.as_fd(), &no, None);
                }
                Ok((other, _)) => warn!("upgrade socket: unexpected {other:?}"),
                Err(e) => warn!("upgrade socket: {e}"),
            }
        };
        {
            let sockets = self.exposed.lock();
            for (tag, fd) in sockets.iter() {
                send(
                    conn.as_fd(),
                    &Message::Socket(tag.clone()),
                    Some(fd.as_fd()),
                )
                .map_err(|e| format!("cannot pass {tag:?}: {e}"))?;
            }
        }
        send(conn.as_fd(), &Message::End, None).map_err(|e| e.to_string())?;
        loop {
            let tick = until.min(Instant::now() + Duration::from_millis(100));
            match recv(conn.as_fd(), tick) {
                Ok((Message::Ready, _)) => return Ok(()),
                Ok((Message::Failed { reason }, _)) => return Err(reason),
                Ok((other, _)) => return Err(format!("unexpected {other:?}")),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    if let Some(e) = exited(child, "before it was ready") {
                        return Err(e);
                    }
                    if Instant::now() >= until {
                        return Err(late());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    // It closed the connection: it exits, or has.
                    let status = wait_exit(child, Duration::from_secs(1));
                    return Err(format!(
                        "the new process (pid {pid}) {} before it was ready",
                        status.unwrap_or_else(|| "closed the upgrade connection".into())
                    ));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

/// The child's exit status, if it exits within `within` (polled every 10 ms: std has no
/// waitpid with a timeout).
fn wait_exit(child: &mut Child, within: Duration) -> Option<String> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status.to_string());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
