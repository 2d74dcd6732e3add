//! The downstream side as the proxy sees it: who the client is (its address, whether it is a
//! trusted proxy, whether it came over TLS) and its request body, which the client connection
//! implements, so the proxy knows nothing of the connection: data flows from the connection to
//! the proxy only.

use std::net::{IpAddr, SocketAddr};

use bytes::Bytes;
use http::header::HeaderValue;

use crate::http1::common::RequestFraming;
use crate::http1::request::ClientError;
use crate::upstream::proxy_header::Origin;

/// A request's body as the proxy reads it off the client connection, which implements it.
pub(crate) trait DownstreamBody {
    /// How the client framed the body, as it goes upstream.
    fn framing(&self) -> RequestFraming;
    /// True once the whole body has been read (at once, for a request without one).
    fn is_done(&self) -> bool;
    /// The next piece of the body; `None` once it is complete.
    async fn next(&mut self) -> Result<Option<Bytes>, ClientError>;
    /// The trailers that came after the body, once it is complete: only an HTTP/2 client
    /// sends them, and only an HTTP/2 backend gets them.
    fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        None
    }
}

/// A body the session keeps (HTTP/2's stream), lent to the proxy for the request.
impl<B: DownstreamBody> DownstreamBody for &mut B {
    fn framing(&self) -> RequestFraming {
        (**self).framing()
    }

    fn is_done(&self) -> bool {
        (**self).is_done()
    }

    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        (**self).next().await
    }

    fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        (**self).take_trailers()
    }
}

/// Everything one client connection's requests need to know about the client.
pub struct Downstream {
    /// The client's IP, for the log lines that blame it.
    pub ip: IpAddr,
    /// The client's IP, rendered once per connection for X-Forwarded-For.
    pub xff: HeaderValue,
    /// Whether the client is in `forwarded.trusted`: a proxy whose X-Forwarded-For is kept and
    /// appended to. Anyone else's is replaced, so a client cannot make a backend believe it
    /// comes from another address.
    pub trusted: bool,
    /// The client came over TLS: `X-Forwarded-Proto: https`.
    pub https: bool,
    /// The client's address (its port too) and the listener address it connected to: what a
    /// PROXY protocol header to a backend names (`proxy_header`).
    pub origin: Origin,
}

impl Downstream {
    /// Decided once per connection, from the peer's address.
    pub fn new(peer: SocketAddr, trusted: &[ipnet::IpNet]) -> Self {
        let ip = peer.ip().to_string();
        // An IP address is always a valid header value.
        let xff = HeaderValue::from_str(&ip).unwrap_or(HeaderValue::from_static("unknown"));
        Downstream {
            ip: peer.ip(),
            xff,
            trusted: trusted.iter().any(|n| n.contains(&peer.ip())),
            https: false,
            origin: (peer, SocketAddr::from(([0, 0, 0, 0], 0))),
        }
    }
}

/// The X-Forwarded-For value sent upstream: the client's address, appended to the list the
/// client sent when the client is a trusted proxy, and replacing it otherwise, so that a client
/// cannot make a backend believe it comes from another address. The parser joined several
/// X-Forwarded-For lines into one list; exactly one line goes upstream.
pub fn forwarded_for<'a>(
    sent: Option<&'a [u8]>,
    client: &'a Downstream,
) -> std::borrow::Cow<'a, [u8]> {
    match sent {
        Some(list) if client.trusted && !list.is_empty() => {
            let mut joined = Vec::with_capacity(list.len() + 2 + client.xff.len());
            joined.extend_from_slice(list);
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(client.xff.as_bytes());
            std::borrow::Cow::Owned(joined)
        }
        _ => std::borrow::Cow::Borrowed(client.xff.as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_is_the_client_appended_to_a_trusted_proxys_list() {
        let trusted = Downstream::new(
            "10.1.2.3:5555".parse().unwrap(),
            &["10.0.0.0/8".parse().unwrap()],
        );
        assert!(trusted.trusted);
        assert_eq!(&*forwarded_for(None, &trusted), b"10.1.2.3");
        assert_eq!(
            &*forwarded_for(Some(b"1.1.1.1, 2.2.2.2"), &trusted),
            b"1.1.1.1, 2.2.2.2, 10.1.2.3"
        );
    }

    #[test]
    fn an_untrusted_clients_forwarded_for_is_replaced() {
        let client = Downstream::new(
            "192.0.2.1:5555".parse().unwrap(),
            &["10.0.0.0/8".parse().unwrap()],
        );
        assert!(!client.trusted);
        assert_eq!(&*forwarded_for(Some(b"1.1.1.1"), &client), b"192.0.2.1");
        let v6 = Downstream::new("[::1]:1".parse().unwrap(), &[]);
        assert_eq!(&*forwarded_for(None, &v6), b"::1");
    }
}
