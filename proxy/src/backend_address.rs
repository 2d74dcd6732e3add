//! A backend's address: a TCP socket address, or the path of a Unix-domain stream socket
//! (`unix:/run/app.sock`, nginx's `server unix:/…`).
//!
//! One type for every place that names a backend: the config, the backend's shared state, the
//! connect, the logs, metrics labels, the status page and the admin API's
//! `/backends/{address}/…` paths, which all show it as [`Display`](fmt::Display) writes it:
//! `IP:PORT` or `unix:/path`, and read it back with [`BackendAddress::parse`].
//!
//! It is `Copy`, as the `SocketAddr` it replaces was, so that the request path copies an address
//! as before and the TCP arm costs what a `SocketAddr` cost. A Unix path is kept once per
//! distinct path for the life of the process ([`intern`]): configs name a handful of sockets,
//! and a reload that names the same path again finds the one kept.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;

/// The prefix that marks a Unix socket's path, as nginx writes it.
pub const UNIX_PREFIX: &str = "unix:";

/// Where a backend listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendAddress {
    /// First, so that the plain path's match tests it first.
    Tcp(SocketAddr),
    /// An absolute path to a stream socket.
    Unix(&'static Path),
}

/// Why a `unix:` address cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("no socket path after \"unix:\", expected \"unix:/run/app.sock\"")]
    Empty,
    #[error(
        "socket path {0:?} is relative, expected an absolute path such as \"unix:/run/app.sock\""
    )]
    Relative(String),
    /// sun_path holds 108 bytes with its terminating NUL (unix(7)).
    #[error("socket path {0:?} is longer than a Unix socket's 107 bytes")]
    TooLong(String),
    /// Neither `IP:PORT` nor `unix:/path`.
    #[error("invalid address {0:?}, expected IP:PORT or unix:/path")]
    Invalid(String),
}

/// Longest path `connect(2)` takes in `sockaddr_un.sun_path`, without its NUL.
const MAX_PATH: usize = 107;

impl BackendAddress {
    /// Reads `IP:PORT` or `unix:/path`. `None` for text that is neither (a `NAME:PORT` for DNS,
    /// or garbage, which the caller tells apart); `Some(Err)` for a `unix:` path that cannot be
    /// a socket's.
    pub fn parse(text: &str) -> Option<Result<BackendAddress, AddressError>> {
        if let Some(path) = text.strip_prefix(UNIX_PREFIX) {
            return Some(unix_path(path).map(|p| BackendAddress::Unix(intern(p))));
        }
        text.parse::<SocketAddr>()
            .ok()
            .map(|a| Ok(BackendAddress::Tcp(a)))
    }

    /// The TCP address, for what only TCP has (a listening port in the core map, a DNS name's
    /// resolution).
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            BackendAddress::Tcp(a) => Some(*a),
            BackendAddress::Unix(_) => None,
        }
    }

    /// The socket's path, for a Unix backend.
    pub fn unix(&self) -> Option<&'static Path> {
        match self {
            BackendAddress::Tcp(_) => None,
            BackendAddress::Unix(p) => Some(p),
        }
    }

    /// The Host header sent when the client sent none: the TCP address, as before, or
    /// `localhost` for a socket (nginx sends its upstream group's name; a path is no host, and
    /// `localhost` is what an application behind a local socket sees from curl's
    /// `--unix-socket`).
    pub fn host(&self) -> String {
        match self {
            BackendAddress::Tcp(a) => a.to_string(),
            BackendAddress::Unix(_) => "localhost".to_string(),
        }
    }
}

impl std::str::FromStr for BackendAddress {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, AddressError> {
        BackendAddress::parse(text).unwrap_or_else(|| Err(AddressError::Invalid(text.into())))
    }
}

impl From<SocketAddr> for BackendAddress {
    fn from(a: SocketAddr) -> Self {
        BackendAddress::Tcp(a)
    }
}

impl fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendAddress::Tcp(a) => a.fmt(f),
            BackendAddress::Unix(p) => write!(f, "{UNIX_PREFIX}{}", p.display()),
        }
    }
}

/// Checks a socket path's form (not the file: config validation does that, as it names the key).
fn unix_path(path: &str) -> Result<&Path, AddressError> {
    if path.is_empty() {
        return Err(AddressError::Empty);
    }
    if !path.starts_with('/') {
        return Err(AddressError::Relative(path.to_string()));
    }
    if path.len() > MAX_PATH {
        return Err(AddressError::TooLong(path.to_string()));
    }
    Ok(Path::new(path))
}

/// The one kept copy of `path`. Called at config load and when a spawned backend's socket is
/// named, never on the request path, so the lock is never contended there. Bounded by the
/// distinct paths the process is ever told of.
pub fn intern(path: &Path) -> &'static Path {
    static KEPT: Mutex<BTreeSet<&'static Path>> = Mutex::new(BTreeSet::new());
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = kept.get(path) {
        return p;
    }
    let p: &'static Path = Box::leak(path.to_path_buf().into_boxed_path());
    kept.insert(p);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_address_and_a_socket_path_read_back_as_they_are_written() {
        for text in ["127.0.0.1:8080", "[::1]:80", "unix:/run/app.sock"] {
            let a = BackendAddress::parse(text).unwrap().unwrap();
            assert_eq!(a.to_string(), text);
        }
        let u = BackendAddress::parse("unix:/run/app.sock")
            .unwrap()
            .unwrap();
        assert_eq!(u.unix(), Some(Path::new("/run/app.sock")));
        assert_eq!(u.tcp(), None);
        assert_eq!(u.host(), "localhost");
        let t = BackendAddress::parse("127.0.0.1:8080").unwrap().unwrap();
        assert_eq!(t.host(), "127.0.0.1:8080");
    }

    #[test]
    fn a_name_is_neither_and_a_bad_path_says_why() {
        assert!(BackendAddress::parse("app.internal:80").is_none());
        assert_eq!(
            BackendAddress::parse("unix:"),
            Some(Err(AddressError::Empty))
        );
        assert!(matches!(
            BackendAddress::parse("unix:run/app.sock"),
            Some(Err(AddressError::Relative(_)))
        ));
        let long = format!("unix:/{}", "a".repeat(120));
        assert!(matches!(
            BackendAddress::parse(&long),
            Some(Err(AddressError::TooLong(_)))
        ));
    }

    /// The request path copies addresses (into log records, errors): a TCP one costs what a
    /// `SocketAddr` did.
    #[test]
    fn an_address_is_as_large_as_a_socket_address() {
        assert_eq!(
            std::mem::size_of::<BackendAddress>(),
            std::mem::size_of::<SocketAddr>()
        );
    }

    #[test]
    fn one_path_is_kept_once() {
        let a = intern(Path::new("/tmp/one.sock"));
        let b = intern(&Path::new("/tmp").join("one.sock"));
        assert!(std::ptr::eq(a, b));
    }
}
