//! A connection on a `proxy_protocol` listener: its PROXY protocol header read before anything
//! else (before TLS, before the HTTP/2 preface), and its client's address taken from it.
//!
//! As HAProxy's `accept-proxy` behind an allow list: a connection from an address outside
//! `proxy_protocol_from` is refused whatever it sends, header or not (a client allowed to
//! speak without a header could not be told from a load balancer that forgot it); one from
//! inside must begin with a v1 or v2 header, within `limits.header_timeout` of the accept.
//! A connection from inside that sends no header is counted `proxy_protocol_untrusted` with
//! the outsiders; a bad, truncated or oversized one `proxy_protocol_invalid`; one not whole in
//! time `proxy_protocol_timeout`. Each refusal closes the connection before a byte of it reaches a backend, is counted
//! (`pinlb_refused_total{cause}`) and logged once per client per second.
//!
//! Only the header's bytes are read (v1: up to its LF, found by peeking; v2: 16 bytes, then the
//! length they give), so the request behind it is read by the ordinary path from the socket.
//! All of this runs once per connection; the requests on it cost what they cost without.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tracing::debug;

use crate::downstream::h1::{Held, Slot, Start, serve, serve_tls};
use crate::downstream::stream::DownstreamStream;
use crate::proxy::accesslog::Batch;
use crate::proxy_protocol::{Header, Invalid, V1_MAX, header_len, parse};
use crate::route::decision::Route;
use crate::sys::summed::summed_warn;
use crate::upstream::counters::{ListenerStats, Refusal};

/// Why a header could not be read off the socket.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0}")]
    Invalid(#[from] Invalid),
    /// The client closed after `0` bytes of a header.
    #[error("connection closed after {0} bytes of a PROXY protocol header")]
    Closed(usize),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Serves a connection accepted on a listener with `proxy_protocol`: refused unless `peer` is in
/// `from` and its header comes whole in time; then served as any other, as from the header's
/// source. Out of line: no listener without `proxy_protocol` runs any of it.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_proxied(
    mut tcp: TcpStream,
    peer: SocketAddr,
    from: Arc<Vec<ipnet::IpNet>>,
    slot: Slot,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    held: Held,
    start: Start,
) {
    let limit = route.plan().rules.limits.header_timeout;
    let stats = route.stats.as_deref();
    let Some(client) = client_address(&mut tcp, peer, &from, (start.accepted, limit), stats).await
    else {
        return;
    };
    if route.plan().tls.is_some() {
        serve_tls(tcp, client, slot, route, batch, held, start).await;
    } else {
        let stream = DownstreamStream::Plain(tcp);
        serve(stream, client, slot, route, batch, held, start).await;
    }
}

/// The client's address on a connection from `peer` that must begin with a PROXY protocol
/// header (from an address in `from`, within `limit` of its accept): its source, or `peer` itself for a
/// `LOCAL` header (a load balancer's own check). `None` when the connection is refused,
/// counted on `stats` and logged, or closed before a byte.
pub(crate) async fn client_address(
    tcp: &mut TcpStream,
    peer: SocketAddr,
    from: &[ipnet::IpNet],
    (accepted, limit): (tokio::time::Instant, std::time::Duration),
    stats: Option<&ListenerStats>,
) -> Option<SocketAddr> {
    let refuse = |cause: Refusal| {
        if let Some(s) = stats {
            s.refuse(cause);
        }
    };
    if !from.iter().any(|n| n.contains(&peer.ip())) {
        refuse(Refusal::ProxyUntrusted);
        summed_warn!(client = %peer; "refused a connection from {}: not in proxy_protocol_from, the addresses allowed to send a PROXY protocol header", peer.ip());
        return None;
    }
    let read = tokio::time::timeout_at(accepted + limit, read_header(tcp)).await;
    match read {
        Ok(Ok(Header::Proxied { source, .. })) => Some(source),
        Ok(Ok(Header::Local)) => Some(peer),
        // A connect and a close with nothing sent: a TCP check, not a bad header.
        Ok(Err(ReadError::Closed(0))) => {
            debug!(client = %peer, "closed before a PROXY protocol header");
            None
        }
        // No header where one must be: counted as an untrusted client, since a direct client
        // of an allowed address is what sends none.
        Ok(Err(e @ ReadError::Invalid(Invalid::NotAHeader))) => {
            refuse(Refusal::ProxyUntrusted);
            summed_warn!(client = %peer; "refused a connection from {}: {e}, which every connection from proxy_protocol_from must begin with", peer.ip());
            None
        }
        Ok(Err(e)) => {
            refuse(Refusal::ProxyInvalid);
            summed_warn!(client = %peer; "refused a connection from {}: {e}", peer.ip());
            None
        }
        Err(_) => {
            refuse(Refusal::ProxyTimeout);
            summed_warn!(client = %peer; "refused a connection from {}: no whole PROXY protocol header within {limit:?} (limits.header_timeout)", peer.ip());
            None
        }
    }
}

/// Reads exactly one header off `tcp`: bytes are peeked, and only those the header takes are
/// read, so what follows it stays in the socket. Bounded: every pass reads at least one byte of
/// the header, and the header is at most `V2_MAX` bytes (`header_len` refuses longer).
async fn read_header(tcp: &mut TcpStream) -> Result<Header, ReadError> {
    let mut buf = Vec::with_capacity(V1_MAX);
    let mut peeked = [0u8; V1_MAX];
    loop {
        let known = header_len(&buf)?;
        if let Some(n) = known {
            if buf.len() == n {
                return Ok(parse(&buf)?);
            }
            // The rest of a v2 header, its length known: read exactly that.
            let have = buf.len();
            buf.resize(n, 0);
            return match tcp.read_exact(&mut buf[have..]).await {
                Ok(_) => Ok(parse(&buf)?),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    Err(ReadError::Closed(have))
                }
                Err(e) => Err(e.into()),
            };
        }
        let room = V1_MAX - buf.len().min(V1_MAX - 1);
        let n = tcp.peek(&mut peeked[..room]).await?;
        if n == 0 {
            return Err(ReadError::Closed(buf.len()));
        }
        let have = buf.len();
        buf.extend_from_slice(&peeked[..n]);
        // Keep only the header's bytes of what was peeked.
        let take = match header_len(&buf)? {
            Some(len) => len.min(buf.len()) - have,
            None => n,
        };
        buf.truncate(have + take);
        tcp.read_exact(&mut buf[have..]).await?;
    }
}
