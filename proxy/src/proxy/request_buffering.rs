//! Request buffering (nginx's `proxy_request_buffering on`): the client's body read whole,
//! before a backend is picked, so that a slow upload holds no backend connection, no
//! `max_conns` slot and no place in the queue while it arrives. The body then goes to the
//! backend framed by its length: a chunked upload arrives with a Content-Length, as nginx sends
//! it.
//!
//! An `Expect: 100-continue` is answered by the client connection when the body is first read,
//! which is now at once (nginx answers it the same way when it buffers).
//!
//! What one request holds: at most `buffering.memory` bytes of its body in memory (plus the
//! client connection's read buffer), the rest in its temporary file, which closes (and, being
//! unlinked, vanishes) when the request is over.

use std::path::Path;

use bytes::Bytes;

use crate::config::{Buffering, Limits};
use crate::http1::common::RequestFraming;
use crate::http1::request::ClientError;
use crate::proxy::downstream::DownstreamBody;
use crate::proxy::error::ProxyError;
use crate::proxy::spool::Spool;

/// A request body read whole, as the retry loop reads it: framed by its length.
pub(crate) struct BufferedBody {
    spool: Spool,
    length: u64,
    /// The client's trailers (an HTTP/2 client's), for an HTTP/2 backend.
    trailers: Option<http::HeaderMap>,
}

/// Reads the client's body whole into memory and, past `buffering.memory`, a temporary file.
/// Errors are the client's: its body broke off, or was sent too slowly (`limits.body_timeout`
/// between two pieces), or is larger than `limits.max_body` or than what buffering may hold
/// (`memory` + `max_temp`), which is a 413. A temporary file that cannot be written is pinlb's
/// own trouble: a 500 whose log line names the directory.
#[inline(never)]
pub(crate) async fn read_whole(
    body: &mut impl DownstreamBody,
    buffering: &Buffering,
    limits: &Limits,
) -> Result<BufferedBody, ProxyError> {
    let client = ProxyError::Downstream;
    let mut spool = Spool::new(buffering);
    let bound = bound(limits.max_body, buffering);
    // A length over the bound is refused before a byte of the body is read.
    if let RequestFraming::Length(n) = body.framing() {
        if n > bound {
            return Err(client(ClientError::BodyTooLarge { limit: bound }));
        }
    }
    let mut length = 0u64;
    // Bounded by the body, and the body by `bound`: every pass takes a piece of it, or ends.
    loop {
        let piece = tokio::time::timeout(limits.body_timeout, body.next())
            .await
            .map_err(|_| {
                client(ClientError::BodyTimeout {
                    after: limits.body_timeout,
                })
            })?
            .map_err(client)?;
        let Some(data) = piece else { break };
        length += data.len() as u64;
        if length > bound {
            return Err(client(ClientError::BodyTooLarge { limit: bound }));
        }
        push(&mut spool, data, &buffering.temp_dir)?;
    }
    Ok(BufferedBody {
        spool,
        length,
        trailers: body.take_trailers(),
    })
}

/// The largest body buffering takes: `limits.max_body` (0 = unlimited) and what memory and the
/// temporary file may hold, whichever is less.
fn bound(max_body: u64, b: &Buffering) -> u64 {
    let held = (b.memory as u64).saturating_add(b.max_temp);
    match max_body {
        0 => held,
        max => max.min(held),
    }
}

/// Keeps a piece, in memory or in the temporary file in `dir`.
fn push(spool: &mut Spool, data: Bytes, dir: &Path) -> Result<(), ProxyError> {
    spool
        .push(data, dir)
        .map_err(|e| ProxyError::Buffering(format!("a temporary file in {}: {e}", dir.display())))
}

impl DownstreamBody for BufferedBody {
    fn framing(&self) -> RequestFraming {
        match self.length {
            0 => RequestFraming::None,
            n => RequestFraming::Length(n),
        }
    }

    fn is_done(&self) -> bool {
        self.spool.len() == 0
    }

    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        self.spool.pop().map_err(|e| {
            ClientError::BodyBrokeOff(format!("reading the buffered body: {e}").into())
        })
    }

    fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        self.trailers.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_max_body_or_what_buffering_holds_whichever_is_less() {
        let b = Buffering {
            memory: 10,
            max_temp: 100,
            ..Buffering::on(std::env::temp_dir())
        };
        assert_eq!(bound(0, &b), 110);
        assert_eq!(bound(50, &b), 50);
        assert_eq!(bound(1000, &b), 110);
    }
}
