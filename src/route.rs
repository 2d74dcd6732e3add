//! Where a listener's requests go, and the rules for its clients: what a connection, HTTP/1.1
//! or HTTP/2, reads anew for each request, so that open connections follow a reload.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use crate::config::{Http2, Limits};
use crate::http1::request::RequestHead;
use crate::proxy;
use crate::stats::ListenerStats;
use crate::tls::Terminator;
use crate::upstream::WorkerUpstream;

/// Where one listener's requests go in the running generation. A reload replaces the contents,
/// and every request reads them anew, so keep-alive connections follow a reload too.
pub(crate) struct Route {
    pub upstream: RefCell<Rc<WorkerUpstream>>,
    pub rules: RefCell<Rc<ClientRules>>,
    /// This worker's counters for the listener, while metrics are on.
    pub stats: Option<Arc<ListenerStats>>,
    /// The listener's TLS certificates, for the handshakes of connections accepted from now
    /// on; `None` for plain HTTP.
    pub tls: RefCell<Option<Arc<Terminator>>>,
    /// `redirect_https`: every request gets a 301 to https instead of a backend.
    pub redirect_https: Cell<bool>,
    /// `h2c`: a connection that begins with the HTTP/2 preface speaks HTTP/2.
    pub h2c: Cell<bool>,
}

/// What applies to every client of a listener, whatever its upstream.
pub(crate) struct ClientRules {
    /// `forwarded.trusted`.
    pub trusted: Vec<ipnet::IpNet>,
    pub limits: Limits,
    pub http2: Http2,
}

impl ClientRules {
    /// What the proxy needs to know of a client at `peer`, over TLS or not.
    pub fn client(&self, peer: SocketAddr, tls: bool) -> proxy::Client {
        proxy::Client {
            https: tls,
            ..proxy::Client::new(peer, &self.trusted)
        }
    }
}

/// The `location` header line of a `redirect_https` answer: the same host (without its
/// port) and target over https, as nginx's `return 301 https://$host$request_uri;`. `None`
/// for a request without a Host to redirect to.
pub(crate) fn https_location(head: &RequestHead) -> Option<Vec<u8>> {
    let host = host_without_port(head.host()?);
    let mut location = Vec::with_capacity(32 + host.len() + head.path().len());
    location.extend_from_slice(b"location: https://");
    location.extend_from_slice(host);
    location.extend_from_slice(head.path());
    location.extend_from_slice(b"\r\n");
    Some(location)
}

/// A Host value without its port: `example.com:8080` → `example.com`, `[::1]:8080` → `[::1]`.
fn host_without_port(host: &[u8]) -> &[u8] {
    let end = match host.iter().rposition(|&b| b == b':') {
        // An IPv6 literal's colons are inside its brackets.
        Some(i) if !host[i..].contains(&b']') => i,
        _ => host.len(),
    };
    &host[..end]
}

#[cfg(test)]
mod tests {
    use super::host_without_port;

    #[test]
    fn a_redirect_keeps_the_host_and_drops_its_port() {
        assert_eq!(host_without_port(b"example.com:8080"), b"example.com");
        assert_eq!(host_without_port(b"example.com"), b"example.com");
        assert_eq!(host_without_port(b"[::1]:8443"), b"[::1]");
        assert_eq!(host_without_port(b"[::1]"), b"[::1]");
        assert_eq!(host_without_port(b"10.0.0.1:80"), b"10.0.0.1");
    }
}
