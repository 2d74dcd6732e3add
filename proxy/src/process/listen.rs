//! Listening sockets: binding them (one `SO_REUSEPORT` socket per listener per worker), their
//! identity across reloads, and accepting on them.

use std::net::SocketAddr;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

use crate::config::Listener;
use crate::sys::summed::summed_error;

/// A listening socket that could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address}: {source}")]
pub struct BindError {
    pub address: SocketAddr,
    pub source: std::io::Error,
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
            let sock = reuseport_listener(addr, l.backlog).map_err(bind_error)?;
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
