//! The send side of the PROXY protocol (`[upstream.NAME] proxy_protocol = "v1" | "v2"`): the
//! header written first on every new backend connection, before its TLS handshake, naming the
//! client and the listener address it connected to.
//!
//! A header names one client for the connection's whole life, so such a connection is private
//! to the client it names, as HAProxy makes a `send-proxy` server's connections: a request
//! reuses a pooled one only if it named the same client address and port (in practice, the
//! same client connection, whose later requests find it warm), and opens one otherwise. The
//! pool keeps its `keepalive` bound; past it, the oldest idle connection makes room.
//! Health checks send v1 `UNKNOWN` / v2 `LOCAL`: pinlb's own connection, no client's.

use std::net::SocketAddr;

use crate::config::ProxyVersion;
use crate::proxy_protocol;

/// The client's address and the listener address it connected to, as a header names them.
pub(crate) type Origin = (SocketAddr, SocketAddr);

/// The header of a connection carrying `origin`'s requests.
#[cold]
pub(crate) fn header(version: ProxyVersion, (source, destination): Origin) -> Vec<u8> {
    match version {
        ProxyVersion::V1 => proxy_protocol::v1(source, destination),
        ProxyVersion::V2 => proxy_protocol::v2(source, destination),
    }
}

/// The header of a health check's connection: empty for an upstream that sends none.
pub(crate) fn for_probe(version: Option<ProxyVersion>) -> Vec<u8> {
    match version {
        None => Vec::new(),
        Some(ProxyVersion::V1) => proxy_protocol::local(1),
        Some(ProxyVersion::V2) => proxy_protocol::local(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_names_the_client_and_a_probe_names_none() {
        let origin = (
            "203.0.113.7:4000".parse().unwrap(),
            "10.0.0.1:80".parse().unwrap(),
        );
        assert_eq!(
            header(ProxyVersion::V1, origin),
            b"PROXY TCP4 203.0.113.7 10.0.0.1 4000 80\r\n".to_vec()
        );
        let v2 = header(ProxyVersion::V2, origin);
        assert_eq!(
            proxy_protocol::parse(&v2),
            Ok(proxy_protocol::Header::Proxied {
                source: origin.0,
                destination: origin.1
            })
        );
        assert!(for_probe(None).is_empty());
        assert_eq!(
            for_probe(Some(ProxyVersion::V1)),
            b"PROXY UNKNOWN\r\n".to_vec()
        );
        assert_eq!(
            proxy_protocol::parse(&for_probe(Some(ProxyVersion::V2))),
            Ok(proxy_protocol::Header::Local)
        );
    }
}
