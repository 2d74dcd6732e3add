//! One attempt at one backend, in the upstream's protocol: a connection (pooled or new) or an
//! HTTP/2 stream, the request head and body, the response head; and how an attempt fails.

use std::cell::Cell;
use std::future::poll_fn;
use std::task::Poll;
use std::time::{Duration, Instant};

use http::StatusCode;
use tracing::debug;

use crate::config::Timeouts;
use crate::http1::client::{self, Conn, ConnectError, ConnectFailure, Outgoing, UpstreamError};
use crate::http1::common::RequestFraming;
use crate::http1::timer::Timer;
use crate::proxy::downstream::DownstreamBody;
use crate::proxy::request_body::RequestBody;
use crate::upstream::counters::ErrorKind;
use crate::upstream::local::WorkerUpstream;
use crate::upstream::proxy_header::Origin;

/// What every attempt at one request shares.
pub(crate) struct Plan<'a> {
    pub timeouts: &'a Timeouts,
    pub framing: RequestFraming,
    /// The method may be sent again once a backend may have acted on it.
    pub resendable: bool,
    /// The request asks to switch protocols, and the upstream lets it.
    pub upgrade: bool,
    /// The request's spans are measured (see `proxy::timing`).
    pub timed: bool,
    /// What the last attempt measured of itself, when `timed`: set here rather than returned,
    /// so an attempt's result (which the plain path moves) is no larger for it.
    pub spans: Cell<Spans>,
    /// The client and listener addresses, for an upstream with `proxy_protocol`: its
    /// connections are private to the client they name.
    pub origin: Option<&'a Origin>,
}

/// What an attempt that got its response head measured of itself, for `proxy::timing`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spans {
    /// Its connect; `None` on a pooled connection.
    pub connect: Option<Duration>,
    /// When its request head was written (handed to hyper, for HTTP/2); read only when the
    /// spans are measured.
    pub sent: Option<Instant>,
}

/// How one attempt at one backend failed.
pub(crate) enum Failure {
    /// No connection: nothing was sent, so another backend may always be tried.
    Connect(ConnectError),
    /// The request, or part of it, may have reached the backend.
    Exchange(UpstreamError),
}

impl Failure {
    /// The backend's fault, as `/metrics` counts it; `None` when the client's body failed, or
    /// pinlb had no descriptor for a connection.
    pub(crate) fn kind(&self) -> Option<ErrorKind> {
        Some(match self {
            Failure::Connect(e) if e.kind == ConnectFailure::Local => return None,
            Failure::Connect(_) => ErrorKind::Connect,
            Failure::Exchange(UpstreamError::Timeout | UpstreamError::SendTimeout) => {
                ErrorKind::Timeout
            }
            Failure::Exchange(UpstreamError::Io(_) | UpstreamError::ClosedBeforeResponse) => {
                ErrorKind::Reset
            }
            Failure::Exchange(
                UpstreamError::Invalid(_) | UpstreamError::Body(_) | UpstreamError::HeadTooLarge,
            ) => ErrorKind::Invalid,
            Failure::Exchange(UpstreamError::Client(_)) => return None,
        })
    }
}

/// One attempt at one backend: a pooled or new connection, the request, the response head.
///
/// A pooled connection that breaks before any response byte is most likely the keep-alive race
/// (the backend closed it while idle, just as the request went out); the request goes again on a
/// fresh connection to the same backend, and that does not count as an attempt or a failure. But
/// a backend that read the request and then died looks the same, so this resend follows the
/// retry rules too: only a `resendable` method, with a body that was kept whole, as nginx and
/// Go's HTTP client do. A POST caught in that race gets a 502 rather than being sent twice.
///
/// `waiter` is the client connection's timer, for the wait for the response head (see
/// `ConnState::read_head_within`); without one, the backend connection's own is used.
pub(crate) async fn attempt(
    upstream: &WorkerUpstream,
    backend: usize,
    plan: &Plan<'_>,
    req: &Outgoing<'_>,
    body: &mut RequestBody<'_, impl DownstreamBody>,
    mut waiter: Option<&mut Timer>,
) -> Result<(client::Head, Conn), Failure> {
    let &Plan {
        timeouts,
        framing,
        resendable,
        upgrade,
        timed,
        ..
    } = plan;
    let addr = upstream.shared.backends[backend].address;
    if timed {
        plan.spans.set(Spans::default());
    }
    let pooled = poll_fn(|cx| Poll::Ready(upstream.checkout(backend, plan.origin, cx))).await;
    let mut conn = match pooled {
        Some(conn) => conn,
        None => connect(upstream, backend, plan).await?,
    };
    loop {
        conn.expect_upgrade(upgrade);
        let waiter = waiter.as_deref_mut();
        let exchange = async {
            conn.write_head(req, framing, timeouts.send).await?;
            if timed {
                let connect = plan.spans.get().connect;
                let sent = Some(Instant::now());
                plan.spans.set(Spans { connect, sent });
            }
            if !body.is_empty() {
                let chunked = framing == RequestFraming::Chunked;
                let early = body
                    .send(&mut conn, chunked, req.method, timeouts.send)
                    .await?;
                if let Some(head) = early {
                    if head.status == StatusCode::SWITCHING_PROTOCOLS {
                        // The rest of the body would go into the new protocol as if it were
                        // the client's first bytes of it.
                        return Err(UpstreamError::Invalid(
                            "101 Switching Protocols before the whole request body was sent",
                        ));
                    }
                    // The backend answered before it had the whole request. The rest is not
                    // sent, and the connection, its request left incomplete, carries no other.
                    return Ok(client::Head {
                        keep_alive: false,
                        ..head
                    });
                }
            }
            conn.read_head_within(req.method, timeouts.response, waiter)
                .await
        };
        match exchange.await {
            Ok(head) => return Ok((head, conn)),
            Err(e) if conn.reused && e.is_stale() && resendable && body.replayable() => {
                debug!(backend = %addr, "stale pooled connection ({e}), reconnecting");
                conn = connect(upstream, backend, plan).await?;
            }
            Err(e) => return Err(Failure::Exchange(e)),
        }
    }
}

/// A new connection to `backend`, its connect time in the plan's spans when they are measured.
/// The connect is boxed: its state (the wait for a connect slot, the timers) stays out of the
/// attempt's own, which a request on a pooled connection never needs.
pub(crate) async fn connect(
    upstream: &WorkerUpstream,
    backend: usize,
    plan: &Plan<'_>,
) -> Result<Conn, Failure> {
    let begun = plan.timed.then(Instant::now);
    let conn = Box::pin(upstream.connect(backend, plan.timeouts.connect, plan.origin))
        .await
        .map_err(Failure::Connect)?;
    if let Some(begun) = begun {
        let connect = Some(begun.elapsed());
        plan.spans.set(Spans {
            connect,
            sent: None,
        });
    }
    Ok(conn)
}

/// One attempt at one HTTP/2 backend: a stream on a multiplexed connection, the request, the
/// response head. A stream the backend refused unprocessed (REFUSED_STREAM, or a connection
/// that closed before the request went out) is sent again on another connection, once, as
/// RFC 9113 §8.7 allows for any method.
pub(crate) async fn attempt_h2(
    upstream: &WorkerUpstream,
    backend: usize,
    plan: &Plan<'_>,
    req: &Outgoing<'_>,
    body: &mut RequestBody<'_, impl DownstreamBody>,
) -> Result<
    (
        http::Response<hyper::body::Incoming>,
        crate::upstream::h2::Stream,
    ),
    Failure,
> {
    let shared = &upstream.shared;
    let &Plan {
        timeouts,
        framing,
        timed,
        ..
    } = plan;
    let addr = shared.backends[backend].address;
    let length = match framing {
        RequestFraming::Length(n) => Some(n),
        _ => None,
    };
    let mut again = true;
    loop {
        let begun = timed.then(Instant::now);
        let opened = upstream
            .open_stream(backend, timeouts.connect)
            .await
            .map_err(|cause| Failure::Connect(cause.into()))?;
        let connect = begun.filter(|_| opened.new).map(|b| b.elapsed());
        let (feed, outbound) = crate::upstream::h2::channel(body.is_empty());
        let tls = shared.tls(backend).is_some();
        let request = crate::upstream::h2::request(req, length, tls, outbound).map_err(|e| {
            Failure::Exchange(UpstreamError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                e,
            )))
        })?;
        let mut send = opened.send;
        let sent = timed.then(Instant::now);
        let response = send.send_request(request);
        let mut response = std::pin::pin!(response);
        let early = if body.is_empty() {
            None
        } else {
            body.send_h2(&feed, response.as_mut(), timeouts.send)
                .await
                .map_err(Failure::Exchange)?
        };
        let response = match early {
            Some(r) => r,
            None => tokio::time::timeout(timeouts.response, response)
                .await
                .map_err(|_| Failure::Exchange(UpstreamError::Timeout))?,
        };
        match response {
            // The feed goes with the response: a body the backend answered before it had
            // whole stays open (unended) until the response is over, then resets.
            Ok(response) => {
                plan.spans.set(Spans { connect, sent });
                return Ok((response, opened.stream.with_feed(feed)));
            }
            Err(e) if again && unprocessed(&e) && body.replayable() => {
                debug!(backend = %addr, "HTTP/2 stream not processed ({e}), sending it again");
                again = false;
            }
            Err(e) => {
                return Err(Failure::Exchange(UpstreamError::Io(std::io::Error::other(
                    format!("HTTP/2: {e}"),
                ))));
            }
        }
    }
}

/// A request the backend did not process: it never went out, or the stream was refused.
fn unprocessed(e: &hyper::Error) -> bool {
    e.is_canceled()
        || std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<h2::Error>())
            .and_then(h2::Error::reason)
            == Some(h2::Reason::REFUSED_STREAM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_without_a_descriptor_is_not_the_backends_fault() {
        let emfile = ConnectError::io(&std::io::Error::from_raw_os_error(24));
        assert_eq!(emfile.kind, ConnectFailure::Local);
        assert!(Failure::Connect(emfile).kind().is_none());
        let refused = Failure::Connect("connection refused".to_string().into());
        assert!(matches!(refused.kind(), Some(ErrorKind::Connect)));
    }
}
