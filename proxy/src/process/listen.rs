//! Listening sockets: binding them (one `SO_REUSEPORT` socket per listener per worker), their
//! identity across reloads, and accepting on them.

use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

use crate::config::{Listener, ListenerMode};
use crate::sys::summed::summed_error;

/// A listening socket that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address}: {source}")]
pub struct BindError {
    pub address: SocketAddr,
    pub source: std::io::Error,
}

/// A listener's identity across reloads: its configured address, and which of the listeners
/// with that address it is (several may ask for port 0). UDP listeners count from
/// [`UDP_KEYS`], so that a TCP and a UDP listener on one address never share a key, and a
/// listener that changes between the two gets a socket of the other kind.
pub(crate) type ListenerKey = (SocketAddr, usize);

/// Where UDP listeners' indexes start (an index is carried as is by `pinlb upgrade`, so a
/// process without UDP listeners reads the same keys as before).
const UDP_KEYS: usize = 1 << 20;

/// The keys of `listeners`, in order.
pub(crate) fn listener_keys(listeners: &[Listener]) -> Vec<ListenerKey> {
    let mut keys: Vec<ListenerKey> = Vec::with_capacity(listeners.len());
    for l in listeners {
        let base = if l.mode == ListenerMode::Udp {
            UDP_KEYS
        } else {
            0
        };
        let same = |(a, i): &&ListenerKey| *a == l.address && (*i >= UDP_KEYS) == (base > 0);
        let n = keys.iter().filter(same).count();
        keys.push((l.address, base + n));
    }
    keys
}

/// One worker's socket for one listener: listening for TCP connections, or bound for UDP
/// datagrams.
#[derive(Debug)]
pub(crate) enum Bound {
    Stream(std::net::TcpListener),
    Datagram(std::net::UdpSocket),
}

impl Bound {
    /// A socket inherited from the process before an upgrade, as the kind it is.
    pub(crate) fn from_fd(fd: std::os::fd::OwnedFd) -> Bound {
        let datagram = socket2::SockRef::from(&fd).r#type().ok() == Some(Type::DGRAM);
        if datagram {
            Bound::Datagram(fd.into())
        } else {
            Bound::Stream(fd.into())
        }
    }

    /// A fresh socket for `l` at `addr`: `SO_REUSEPORT`, with the listener's backlog for TCP.
    pub(crate) fn fresh(l: &Listener, addr: SocketAddr) -> std::io::Result<Bound> {
        Ok(match l.mode {
            ListenerMode::Udp => Bound::Datagram(reuseport_datagram(addr)?),
            _ => Bound::Stream(reuseport_listener(addr, l.backlog)?),
        })
    }

    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Bound::Stream(s) => s.local_addr(),
            Bound::Datagram(s) => s.local_addr(),
        }
    }
}

impl std::os::fd::AsFd for Bound {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Bound::Stream(s) => s.as_fd(),
            Bound::Datagram(s) => s.as_fd(),
        }
    }
}

/// Sockets per worker, each with its listener's key.
pub(crate) type Sockets = Vec<Vec<(ListenerKey, Bound)>>;

/// Binds every listener for every worker, except those `skip` names (already listening).
pub(crate) fn bind_listeners(
    listeners: &[Listener],
    workers: usize,
    skip: impl Fn(&ListenerKey) -> bool,
) -> Result<(Sockets, Vec<SocketAddr>), BindError> {
    let mut sockets: Sockets = (0..workers).map(|_| Vec::new()).collect();
    let mut local_addrs = Vec::with_capacity(listeners.len());
    for (l, key) in listeners.iter().zip(listener_keys(listeners)) {
        if skip(&key) {
            continue;
        }
        let mut addr = l.address;
        for per_worker in sockets.iter_mut() {
            let bind_error = |source| BindError {
                address: addr,
                source,
            };
            let sock = Bound::fresh(l, addr).map_err(bind_error)?;
            if addr.port() == 0 {
                addr = sock.local_addr().map_err(bind_error)?;
            }
            per_worker.push((key, sock));
        }
        local_addrs.push(addr);
    }
    Ok((sockets, local_addrs))
}

/// A worker's socket for a listener, with the listener's `backlog`.
pub(crate) fn reuseport_listener(
    addr: SocketAddr,
    backlog: u32,
) -> std::io::Result<std::net::TcpListener> {
    listener(addr, true, backlog_arg(backlog))
}

/// A worker's UDP socket for a listener: non-blocking, `SO_REUSEPORT`, so that the kernel
/// spreads clients over the workers by their address and port.
pub(crate) fn reuseport_datagram(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    Ok(sock.into())
}

/// `backlog` as `listen(2)` takes it; validation keeps it within an int.
fn backlog_arg(backlog: u32) -> i32 {
    i32::try_from(backlog).unwrap_or(i32::MAX)
}

/// Gives a socket that is listening already a new backlog: Linux takes `listen(2)` again on
/// a listening socket and only changes its queue's length, keeping the connections queued.
pub(crate) fn set_backlog(listener: &impl std::os::fd::AsFd, backlog: u32) -> std::io::Result<()> {
    socket2::SockRef::from(listener).listen(backlog_arg(backlog))
}

/// A non-blocking listening socket with `SO_REUSEADDR` (a restarted process gets its port
/// back from TIME_WAIT at once), and `SO_REUSEPORT` when `reuse_port`.
pub fn listener(
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

/// The next client connection, with TCP_NODELAY set. Accept errors (out of file descriptors
/// and the like) are logged, summed per second, and retried after 50 ms instead of spinning.
pub async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                // Small requests and responses must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(e) => {
                summed_error!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
