//! The request path: pick a backend, forward the request, stream the response back.
//!
//! Per request this takes no lock. The client's body streams to the backend as it arrives, the
//! backend's body streams back, and the upstream connection returns to the worker's pool when the
//! response body ends.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::{Method, StatusCode};
use tracing::{debug, warn};

use crate::config::Limits;
use crate::config::{Algorithm, Protocol, Timeouts};
use crate::http1::client::{
    self, BackendStream, Conn, Finished, Outgoing, UpstreamBody, UpstreamError, connect,
};
use crate::http1::common::{
    ERROR_PAGE_TYPE, Reply, RequestFraming, content_length_line, error_page, header_lines,
};
use crate::http1::request::{ClientError, RequestHead};
use crate::proxy::accesslog::Upstreamed;
use crate::upstream::pool::{InFlight, WorkerUpstream};
use crate::upstream::stats::{BackendStats, ErrorKind};

/// A request's body as the proxy reads it off the client connection, which implements it: the
/// proxy knows nothing of the connection, so data flows from the connection to the proxy only.
pub(crate) trait ClientBody {
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

/// Everything one client connection's requests need to know about the client.
pub struct Client {
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
}

impl Client {
    /// Decided once per connection, from the peer's address.
    pub fn new(peer: SocketAddr, trusted: &[ipnet::IpNet]) -> Self {
        let ip = peer.ip().to_string();
        // An IP address is always a valid header value.
        let xff = HeaderValue::from_str(&ip).unwrap_or(HeaderValue::from_static("unknown"));
        Client {
            ip: peer.ip(),
            xff,
            trusted: trusted.iter().any(|n| n.contains(&peer.ip())),
            https: false,
        }
    }
}

/// Why a request could not be answered by a backend. Each kind maps to one status, in
/// [`ProxyError::status`]; a client's fault keeps [`ClientError::status`].
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No backend could be picked: each is down, skipped after failures, or at `max_conns`. The
    /// text says which.
    #[error("{0}")]
    NoBackend(String),
    /// Every backend was tried and failed to connect, or the chosen one failed mid-exchange.
    #[error("backend {backend} failed: {cause}")]
    BadGateway { backend: SocketAddr, cause: String },
    /// The backend did not send response headers within `timeouts.response`.
    #[error("backend {backend} sent no response headers within {after:?}")]
    Timeout {
        backend: SocketAddr,
        after: Duration,
    },
    /// The backend took no more of the request for `timeouts.send`.
    #[error("backend {backend} took no more of the request for {after:?}")]
    SendTimeout {
        backend: SocketAddr,
        after: Duration,
    },
    /// The client's request was refused, or its body failed, before any backend answered.
    #[error("{0}")]
    Client(ClientError),
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoBackend(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BadGateway { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } | ProxyError::SendTimeout { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::Client(e) => e.status(),
        }
    }
}

/// The X-Forwarded-For value sent upstream: the client's address, appended to the list the
/// client sent when the client is a trusted proxy, and replacing it otherwise, so that a client
/// cannot make a backend believe it comes from another address. The parser joined several
/// X-Forwarded-For lines into one list; exactly one line goes upstream.
pub fn forwarded_for<'a>(sent: Option<&'a [u8]>, client: &'a Client) -> std::borrow::Cow<'a, [u8]> {
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

/// What a route changes in the request it sends on: its path (a rewritten prefix), its header
/// lines (`request_headers`) and its timeouts. `None` keeps the request's own (the upstream's).
/// Requests without such a route pass no `Overrides` at all, so they carry none of its weight.
#[derive(Debug, Default)]
pub struct Overrides {
    pub path: Option<Vec<u8>>,
    /// The end-to-end lines to send, without the Upgrade lines (added when the request
    /// upgrades).
    pub lines: Option<Vec<u8>>,
    /// The upstream's timeouts with the route's own in their place.
    pub timeouts: Option<Timeouts>,
}

/// The proxy's answer to one request.
pub struct Answer {
    pub response: Reply<ProxyBody>,
    /// For the access log, when asked for: which backend answered, and how fast.
    pub upstreamed: Option<Upstreamed>,
    /// The client is at fault: its connection closes after the answer, since what follows on it
    /// (an unread body, a confused framing) can't be trusted.
    pub close: bool,
}

/// Forwards one request whose head `http1::request` parsed, or answers `refused` at once. Never
/// fails: every failure becomes an error response. With `log`, a response from a backend comes
/// with its [`Upstreamed`] for the access log.
///
/// The request goes upstream as HTTP/1.1, origin-form, with Host first and X-Forwarded-For and
/// X-Forwarded-Proto last. The parser already left out the hop-by-hop headers and Expect:
/// `100 Continue` is pinlb's own answer, sent when the body is first read, once a backend
/// connection is ready, as nginx does.
#[allow(clippy::too_many_arguments)]
pub async fn handle(
    upstream: Rc<WorkerUpstream>,
    client: Rc<Client>,
    limits: Limits,
    head: &RequestHead,
    overrides: Option<&Overrides>,
    body: &mut impl ClientBody,
    refused: Option<ClientError>,
    log: bool,
) -> Answer {
    let method = &head.method;
    let forwarded = match refused {
        Some(e) => Err(ProxyError::Client(e)),
        None => forward(&upstream, &client, &limits, head, overrides, body, log).await,
    };
    match forwarded {
        Ok((response, upstreamed)) => Answer {
            response,
            upstreamed,
            close: false,
        },
        Err(e) => {
            let status = e.status().as_u16();
            // The log line blames the side at fault: a client's bad request is not the
            // upstream's.
            let close = matches!(e, ProxyError::Client(_));
            if close {
                warn!(client = %client.ip, "{method} answered {status}: {e}");
            } else {
                warn!(upstream = %upstream.shared.config.name, "{method} answered {status}: {e}");
            }
            Answer {
                response: error_response(&e, method),
                upstreamed: None,
                close,
            }
        }
    }
}

async fn forward(
    upstream: &Rc<WorkerUpstream>,
    client: &Client,
    limits: &Limits,
    head: &RequestHead,
    overrides: Option<&Overrides>,
    body: &mut impl ClientBody,
    log: bool,
) -> Result<(Reply<ProxyBody>, Option<Upstreamed>), ProxyError> {
    let framing = body.framing();
    let forwarded_for = forwarded_for(head.forwarded_for.as_deref(), client);
    let shared = &*upstream.shared;
    let timeouts = overrides
        .and_then(|o| o.timeouts.as_ref())
        .unwrap_or(&shared.config.timeouts);
    // A route's header lines with the request's Upgrade lines after them; built only then.
    let joined: Vec<u8>;
    // An HTTP/2 backend gets no Upgrade (extended CONNECT is not spoken): the request goes as
    // an ordinary one, as with `upgrade = false`.
    let upgrade_on = shared.config.upgrade.enabled && !shared.config.protocol.is_http2();
    let base = Outgoing {
        method: &head.method,
        // A route that rewrote the prefix sends its path; otherwise the request's, as received.
        path: overrides
            .and_then(|o| o.path.as_deref())
            .unwrap_or(head.path()),
        // The parser refused HTTP/1.1 without Host: only HTTP/1.0 may come without it. It goes
        // upstream as HTTP/1.1, which needs one: the backend's address then, as the health
        // probes send.
        host: head.host().unwrap_or_default(),
        lines: match (
            overrides.and_then(|o| o.lines.as_deref()),
            head.upgrade_lines(),
        ) {
            (None, Some(lines)) if upgrade_on => lines,
            (None, _) => head.lines(),
            (Some(lines), Some(upgrading)) if upgrade_on => {
                joined = [lines, &upgrading[head.lines().len()..]].concat();
                &joined
            }
            (Some(lines), _) => lines,
        },
        trusted_lines: match (&head.proxied_lines, client.trusted) {
            (Some(lines), true) => lines,
            _ => b"",
        },
        forwarded_for: &forwarded_for,
        https: client.https,
    };
    let upgrade = upgrade_on && head.upgrade_lines().is_some();
    let retry = &shared.config.retry;
    let mut body = RequestBody::new(body, retry.buffer, limits);
    // Once a backend may have acted on the request, sending it again needs both of these.
    let method_resendable = retry.non_idempotent || is_idempotent(&head.method);

    // nginx's proxy_next_upstream: a failed attempt moves on to the next backend, each backend
    // at most once per request, within `tries` attempts and `timeout` since the first.
    let n = shared.backends.len();
    let max_tries = if retry.tries == 0 {
        n
    } else {
        retry.tries.min(n)
    };
    let host_from_backend = head.host().is_none();
    // Only a `hash` upstream reads the key; only `ewma` times each attempt.
    let key = shared
        .config
        .hash
        .as_ref()
        .and_then(|spec| crate::upstream::hash_key::request_key(spec, head, client.ip));
    let ewma = shared.config.algorithm == Algorithm::Ewma;
    let mut tried = Tried::new(n);
    let mut first_try: Option<Instant> = None;
    let mut last_error: Option<ProxyError> = None;
    loop {
        let out_of_budget = first_try.is_some_and(|t| t.elapsed() >= retry.timeout);
        if tried.count >= max_tries || out_of_budget {
            return Err(last_error.unwrap_or_else(|| ProxyError::NoBackend(shared.unavailable())));
        }
        let Some((backend, guard)) = upstream.pick(key, |i| tried.contains(i)) else {
            return Err(last_error.unwrap_or_else(|| ProxyError::NoBackend(shared.unavailable())));
        };
        tried.insert(backend);
        let started = *first_try.get_or_insert_with(Instant::now);
        let sent = ewma.then(Instant::now);
        let state = &shared.backends[backend];
        let addr = state.address;
        if shared.counting {
            state.stats.requests.fetch_add(1, Ordering::Relaxed);
        }
        let backend_host = host_from_backend.then(|| addr.to_string());
        let out = Outgoing {
            host: backend_host.as_deref().map_or(base.host, str::as_bytes),
            ..base
        };

        // What is done with every response, whichever protocol brought it.
        let answered = |status: StatusCode, guard: &InFlight| {
            if shared
                .config
                .passive
                .fail_on_status
                .contains(status.as_u16())
            {
                shared.record_failure(backend);
            } else {
                shared.record_success(guard);
            }
            if let Some(sent) = sent {
                state.observe_response_time(sent.elapsed(), shared.config.ewma_decay);
            }
            // The clock is read only when something uses it.
            let elapsed = (shared.counting || log).then(|| started.elapsed());
            if let (true, Some(elapsed)) = (shared.counting, elapsed) {
                state.stats.response(status.as_u16());
                state.stats.response_time.observe(elapsed);
            }
            match (log, elapsed) {
                (true, Some(upstream_time)) => Some(Upstreamed {
                    backend: addr,
                    upstream_time,
                }),
                _ => None,
            }
        };
        let failure = match shared.config.protocol {
            Protocol::Http1 => match attempt(
                upstream,
                backend,
                timeouts,
                &out,
                framing,
                &mut body,
                method_resendable,
                upgrade,
            )
            .await
            {
                Ok((answer, conn)) => {
                    let served = answered(answer.status, &guard);
                    let body = ProxyBody::Upstream {
                        body: UpstreamBody::new(conn, &answer),
                        release: Some(Release {
                            _guard: guard,
                            keep_alive: answer.keep_alive,
                            upstream: upstream.clone(),
                            backend,
                        }),
                    };
                    return Ok((client::response(answer, body, &head.method), served));
                }
                Err(failure) => failure,
            },
            // Boxed: an HTTP/2 attempt's state stays out of the request's own, which every
            // HTTP/1.1 request copies.
            Protocol::H2c | Protocol::H2 => {
                match Box::pin(attempt_h2(
                    upstream, backend, timeouts, &out, framing, &mut body,
                ))
                .await
                {
                    Ok((response, stream)) => {
                        let served = answered(response.status(), &guard);
                        let reply = h2_reply(response, &head.method, (guard, stream));
                        return Ok((reply, served));
                    }
                    Err(failure) => failure,
                }
            }
        };
        if let (true, Some(kind)) = (shared.counting, failure.kind()) {
            state.stats.error(kind);
        }

        let (error, sent) = match failure {
            Failure::Connect(cause) => (
                ProxyError::BadGateway {
                    backend: addr,
                    cause,
                },
                false,
            ),
            // The backend has the head and part of the body; dropping the connection without the
            // last chunk leaves it an incomplete request, never a complete one.
            Failure::Exchange(UpstreamError::Client(e)) => return Err(ProxyError::Client(e)),
            Failure::Exchange(UpstreamError::Timeout) => (
                ProxyError::Timeout {
                    backend: addr,
                    after: timeouts.response,
                },
                true,
            ),
            Failure::Exchange(UpstreamError::SendTimeout) => (
                ProxyError::SendTimeout {
                    backend: addr,
                    after: timeouts.send,
                },
                true,
            ),
            Failure::Exchange(e) => (
                ProxyError::BadGateway {
                    backend: addr,
                    cause: e.to_string(),
                },
                true,
            ),
        };
        shared.record_failure(backend);
        if sent && !method_resendable {
            warn!(backend = %addr, "{error}; not retried: {} is not idempotent and the backend may have processed it", head.method);
            return Err(error);
        }
        if sent && !body.replayable() {
            warn!(backend = %addr, "{error}; not retried: the request body was larger than retry.buffer ({} bytes)", retry.buffer);
            return Err(error);
        }
        if shared.counting {
            state.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        warn!(backend = %addr, "{error}; trying the next backend");
        last_error = Some(error);
    }
}

/// How one attempt at one backend failed.
enum Failure {
    /// No connection: nothing was sent, so another backend may always be tried.
    Connect(String),
    /// The request, or part of it, may have reached the backend.
    Exchange(UpstreamError),
}

impl Failure {
    /// The backend's fault, as `/metrics` counts it; `None` when the client's body failed.
    fn kind(&self) -> Option<ErrorKind> {
        Some(match self {
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
#[allow(clippy::too_many_arguments)]
async fn attempt(
    upstream: &WorkerUpstream,
    backend: usize,
    timeouts: &Timeouts,
    req: &Outgoing<'_>,
    framing: RequestFraming,
    body: &mut RequestBody<'_, impl ClientBody>,
    resendable: bool,
    upgrade: bool,
) -> Result<(client::Head, Conn), Failure> {
    let addr = upstream.shared.backends[backend].address;
    let stats = upstream
        .shared
        .counting
        .then(|| &upstream.shared.backends[backend].stats);
    let opened = || {
        if let Some(s) = stats {
            s.connections_opened.fetch_add(1, Ordering::Relaxed);
        }
    };
    let mut conn = match upstream.checkout(backend).await {
        Some(conn) => {
            if let Some(s) = stats {
                s.connections_reused.fetch_add(1, Ordering::Relaxed);
            }
            conn
        }
        None => {
            let conn = connect(addr, timeouts.connect, upstream.shared.tls(backend))
                .await
                .map_err(Failure::Connect)?;
            opened();
            conn
        }
    };
    loop {
        conn.expect_upgrade(upgrade);
        let exchange = async {
            conn.write_head(req, framing, timeouts.send).await?;
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
            conn.read_head_within(req.method, timeouts.response).await
        };
        match exchange.await {
            Ok(head) => return Ok((head, conn)),
            Err(e) if conn.reused && e.is_stale() && resendable && body.replayable() => {
                debug!(backend = %addr, "stale pooled connection ({e}), reconnecting");
                conn = connect(addr, timeouts.connect, upstream.shared.tls(backend))
                    .await
                    .map_err(Failure::Connect)?;
                opened();
            }
            Err(e) => return Err(Failure::Exchange(e)),
        }
    }
}

/// One attempt at one HTTP/2 backend: a stream on a multiplexed connection, the request, the
/// response head. A stream the backend refused unprocessed (REFUSED_STREAM, or a connection
/// that closed before the request went out) is sent again on another connection, once, as
/// RFC 9113 §8.7 allows for any method.
async fn attempt_h2(
    upstream: &WorkerUpstream,
    backend: usize,
    timeouts: &Timeouts,
    req: &Outgoing<'_>,
    framing: RequestFraming,
    body: &mut RequestBody<'_, impl ClientBody>,
) -> Result<
    (
        http::Response<hyper::body::Incoming>,
        crate::upstream::h2::Stream,
    ),
    Failure,
> {
    let shared = &upstream.shared;
    let addr = shared.backends[backend].address;
    let stats = shared.counting.then(|| &shared.backends[backend].stats);
    let length = match framing {
        RequestFraming::Length(n) => Some(n),
        _ => None,
    };
    let mut again = true;
    loop {
        let opened = upstream
            .multiplexed(backend)
            .open(
                addr,
                timeouts.connect,
                shared.config.max_streams,
                shared.tls(backend),
            )
            .await
            .map_err(Failure::Connect)?;
        if let Some(s) = stats {
            let counter = if opened.new {
                &s.connections_opened
            } else {
                &s.connections_reused
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let (feed, outbound) = crate::upstream::h2::channel(body.is_empty());
        let tls = shared.tls(backend).is_some();
        let request = crate::upstream::h2::request(req, length, tls, outbound).map_err(|e| {
            Failure::Exchange(UpstreamError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                e,
            )))
        })?;
        let mut send = opened.send;
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
            Ok(response) => return Ok((response, opened.stream.with_feed(feed))),
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

/// An HTTP/2 backend's response as the client side takes it: its fields as header lines
/// without the framing ones pinlb writes itself (Content-Length stays on a HEAD's or a 304's
/// answer, which has no body to count), and its body with its trailers.
fn h2_reply(
    response: http::Response<hyper::body::Incoming>,
    method: &Method,
    held: (InFlight, crate::upstream::h2::Stream),
) -> Reply<ProxyBody> {
    let (parts, body) = response.into_parts();
    let keep_length = method == Method::HEAD || parts.status == StatusCode::NOT_MODIFIED;
    let mut headers = Vec::with_capacity(256);
    header_lines(
        &parts.headers,
        |name| name == http::header::CONTENT_LENGTH && !keep_length,
        &mut headers,
    );
    Reply {
        status: parts.status,
        headers,
        body: ProxyBody::Http2(Box::new(Http2Body {
            body,
            has_date: parts.headers.contains_key(http::header::DATE),
            trailers: None,
            held: Some(held),
        })),
    }
}

/// Methods that may be sent twice with the effect of once (RFC 9110 §9.2.2).
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// The client's request body, streamed to the backend as it arrives. Up to `limit` bytes of it
/// are kept (`Bytes` are reference-counted: keeping a chunk copies nothing) so that a failed
/// attempt can send it again.
struct RequestBody<'b, B> {
    client: &'b mut B,
    kept: Vec<Bytes>,
    kept_len: usize,
    limit: usize,
    /// Part of the body was sent and not kept: it can no longer be sent again.
    lost: bool,
    /// Bytes read from the client so far.
    received: u64,
    /// `limits.max_body`; 0 = unlimited.
    max: u64,
    /// `limits.body_timeout`: the longest wait for the next piece of the body.
    timeout: Duration,
    /// Which of `kept` the current attempt has still to send again.
    replaying: std::ops::Range<usize>,
}

impl<'b, B: ClientBody> RequestBody<'b, B> {
    fn new(client: &'b mut B, limit: usize, limits: &Limits) -> Self {
        RequestBody {
            client,
            kept: Vec::new(),
            kept_len: 0,
            limit,
            lost: false,
            received: 0,
            max: limits.max_body,
            timeout: limits.body_timeout,
            replaying: 0..0,
        }
    }

    /// True for a request without a body.
    fn is_empty(&self) -> bool {
        self.kept.is_empty() && !self.lost && self.client.is_done()
    }

    /// Whether everything sent so far can be sent again.
    fn replayable(&self) -> bool {
        !self.lost
    }

    /// The next piece to send: what was kept from an earlier attempt first, then the rest as
    /// the client sends it, each wait for the client bounded by `limits.body_timeout`. While the
    /// client keeps the body waiting, `answer` is polled: a backend's final response that comes
    /// before the whole body was sent is returned instead, since a backend that answered may
    /// never read the rest.
    async fn next_piece<T>(
        &mut self,
        mut answer: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Result<Piece<T>, ClientError> {
        if let Some(i) = self.replaying.next() {
            if let Some(data) = self.kept.get(i) {
                return Ok(Piece::Data(data.clone()));
            }
        }
        // Only a client that sends nothing for the whole timeout is cut off: a slow but
        // steady upload goes on (nginx's client_body_timeout).
        let timeout = self.timeout;
        let next = {
            let mut piece = std::pin::pin!(tokio::time::timeout(timeout, self.client.next()));
            // The client's piece first: the backend is looked at only while the client
            // keeps the body waiting.
            std::future::poll_fn(|cx| match piece.as_mut().poll(cx) {
                Poll::Ready(piece) => Poll::Ready(Ok(piece)),
                Poll::Pending => answer(cx).map(Err),
            })
            .await
        };
        let piece = match next {
            Ok(piece) => piece,
            Err(answered) => return Ok(Piece::Answer(answered)),
        };
        let Some(data) = piece.map_err(|_| ClientError::BodyTimeout { after: timeout })?? else {
            return Ok(Piece::End);
        };
        // A Content-Length over the limit was refused up front; this catches chunked
        // bodies, before the byte over the limit goes anywhere.
        self.received += data.len() as u64;
        if self.max > 0 && self.received > self.max {
            return Err(ClientError::BodyTooLarge { limit: self.max });
        }
        if !self.lost && self.kept_len + data.len() <= self.limit {
            self.kept_len += data.len();
            self.kept.push(data.clone());
        } else if !self.lost {
            self.lost = true;
            self.kept = Vec::new();
        }
        Ok(Piece::Data(data))
    }

    /// Sends the body on an HTTP/1.1 connection, each wait for room at the backend bounded by
    /// `send_timeout`. Returns the backend's final response head when it comes before the whole
    /// body was sent; the rest is then left unsent (and unread).
    async fn send(
        &mut self,
        conn: &mut Conn,
        chunked: bool,
        method: &Method,
        send_timeout: Duration,
    ) -> Result<Option<client::Head>, UpstreamError> {
        self.replaying = 0..self.kept.len();
        // Bounded by the body: every pass sends a piece of it, or returns.
        loop {
            let piece = self
                .next_piece(|cx| conn.poll_response_head(cx, method))
                .await
                .map_err(UpstreamError::Client)?;
            let data = match piece {
                Piece::Data(data) => data,
                Piece::End => break,
                Piece::Answer(head) => return head.map(Some),
            };
            if let Some(head) = conn
                .write_body(&data, chunked, send_timeout, method)
                .await?
            {
                return Ok(Some(head));
            }
        }
        if chunked {
            return conn.finish_chunked(send_timeout, method).await;
        }
        Ok(None)
    }

    /// Sends the body on an HTTP/2 stream, as [`RequestBody::send`] does on a connection, with
    /// the client's trailers at its end. `response` is the stream's response, watched while the
    /// body goes; one that comes first is returned.
    async fn send_h2<R: Future>(
        &mut self,
        feed: &crate::upstream::h2::Feed,
        mut response: Pin<&mut R>,
        send_timeout: Duration,
    ) -> Result<Option<R::Output>, UpstreamError> {
        self.replaying = 0..self.kept.len();
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        // Bounded by the body: every pass sends a piece of it, or returns.
        loop {
            let piece = self
                .next_piece(|cx| response.as_mut().poll(cx))
                .await
                .map_err(UpstreamError::Client)?;
            let data = match piece {
                Piece::Data(data) => data,
                Piece::End => {
                    feed.end(self.client.take_trailers());
                    return Ok(None);
                }
                Piece::Answer(answered) => return Ok(Some(answered)),
            };
            // Room comes when hyper took the last piece, which flow control allows; a backend
            // that takes none for `send_timeout` fails the request.
            let mut armed = false;
            let room = std::future::poll_fn(|cx| {
                if let Poll::Ready(room) = feed.poll_room(cx) {
                    return Poll::Ready(Ok(room));
                }
                if let Poll::Ready(answered) = response.as_mut().poll(cx) {
                    return Poll::Ready(Err(Some(answered)));
                }
                if !armed {
                    armed = true;
                    let at = tokio::time::Instant::now() + send_timeout;
                    match timer.as_mut() {
                        Some(t) => t.as_mut().reset(at),
                        None => timer = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                match timer.as_mut().map(|t| t.as_mut().poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(Err(None)),
                    _ => Poll::Pending,
                }
            })
            .await;
            match room {
                Ok(Ok(())) => feed.send(data),
                // hyper stopped reading the body: the stream is over, and its response says why.
                Ok(Err(crate::upstream::h2::Abandoned)) => {
                    return Ok(Some(response.as_mut().await));
                }
                Err(Some(answered)) => return Ok(Some(answered)),
                Err(None) => return Err(UpstreamError::SendTimeout),
            }
        }
    }
}

/// What [`RequestBody::next_piece`] found.
enum Piece<T> {
    Data(Bytes),
    End,
    /// The backend answered first.
    Answer(T),
}

/// The set of backends already tried for one request.
struct Tried {
    small: u64,
    large: Vec<bool>,
    /// Backends tried so far.
    count: usize,
}

impl Tried {
    fn new(n: usize) -> Self {
        Tried {
            small: 0,
            count: 0,
            large: if n > 64 { vec![false; n] } else { Vec::new() },
        }
    }
    fn contains(&self, i: usize) -> bool {
        if self.large.is_empty() {
            self.small & (1 << i) != 0
        } else {
            self.large[i]
        }
    }
    fn insert(&mut self, i: usize) {
        self.count += 1;
        if self.large.is_empty() {
            self.small |= 1 << i;
        } else {
            self.large[i] = true;
        }
    }
}

/// A short text response for a request pinlb had to answer itself.
fn error_response(e: &ProxyError, method: &Method) -> Reply<ProxyBody> {
    let status = e.status();
    local_reply(
        status,
        ERROR_PAGE_TYPE,
        Bytes::from(error_page(status, e)),
        b"",
        method,
    )
}

/// A response pinlb makes itself: `status`, a `content-type` line, `lines` more header lines,
/// and `page` as the body (none for HEAD, which still gets the page's length).
pub fn local_reply(
    status: StatusCode,
    content_type: &[u8],
    page: Bytes,
    lines: &[u8],
    method: &Method,
) -> Reply<ProxyBody> {
    let len = page.len();
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        page
    };
    let mut headers = Vec::with_capacity(content_type.len() + lines.len() + 24);
    headers.extend_from_slice(content_type);
    headers.extend_from_slice(lines);
    if method == Method::HEAD {
        // The length of the page a GET would have had; the client side writes the framing of
        // every other response from its body.
        content_length_line(&mut headers, len as u64);
    }
    Reply {
        status,
        headers,
        body: ProxyBody::Local(Some(body)),
    }
}

/// What to do when an upstream response body is over.
pub struct Release {
    _guard: InFlight,
    /// Whether the backend's response allows the connection to carry another exchange.
    keep_alive: bool,
    upstream: Rc<WorkerUpstream>,
    backend: usize,
}

/// A backend connection that switched protocols (a `101`), for the client side to relay bytes
/// to and from until the tunnel closes.
pub struct Upgraded {
    pub stream: BackendStream,
    /// What the backend sent after its 101 head: the first bytes of the new protocol.
    pub early: BytesMut,
    pub open: OpenTunnel,
}

/// Held for a tunnel's life: it counts in flight on its backend (for least_conn and
/// `max_conns`) and as an open tunnel in `/metrics` until dropped. The backend connection is
/// never returned to the pool.
pub struct OpenTunnel {
    release: Release,
}

impl OpenTunnel {
    fn new(release: Release) -> OpenTunnel {
        let tunnel = OpenTunnel { release };
        if let Some(s) = tunnel.stats() {
            s.tunnels_open.fetch_add(1, Ordering::Relaxed);
        }
        tunnel
    }

    /// `timeouts.tunnel_idle` of the tunnel's upstream.
    pub fn idle(&self) -> Duration {
        self.release.upstream.shared.config.upgrade.tunnel_idle
    }

    /// The backend's counters, while metrics are on.
    pub fn stats(&self) -> Option<&BackendStats> {
        let shared = &self.release.upstream.shared;
        shared
            .counting
            .then(|| &shared.backends[self.release.backend].stats)
    }
}

impl Drop for OpenTunnel {
    fn drop(&mut self) {
        if let Some(s) = self.stats() {
            s.tunnels_open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A response body from an HTTP/2 backend.
pub struct Http2Body {
    body: hyper::body::Incoming,
    has_date: bool,
    /// The trailers, once the body is over.
    trailers: Option<http::HeaderMap>,
    /// The in-flight count and the stream's place on its connection, until the body ends.
    held: Option<(InFlight, crate::upstream::h2::Stream)>,
}

impl Http2Body {
    /// The next piece of the body, keeping its trailers. Out of line: `ProxyBody::poll_data`
    /// is inlined into every HTTP/1.1 response's write, and this would make it too large to be.
    #[inline(never)]
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        let Http2Body {
            body,
            trailers,
            held,
            ..
        } = self;
        // Bounded by the body: every pass takes a frame of it, or returns.
        loop {
            let frame = match ready!(http_body::Body::poll_frame(Pin::new(&mut *body), cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    *held = None;
                    let e = std::io::Error::other(format!("HTTP/2: {e}"));
                    return Poll::Ready(Some(Err(UpstreamError::Io(e))));
                }
                None => {
                    *held = None;
                    return Poll::Ready(None);
                }
            };
            match frame.into_data() {
                Ok(data) => {
                    // Released with the last piece, as an HTTP/1.1 body is.
                    if http_body::Body::is_end_stream(body) {
                        *held = None;
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        *trailers = Some(t);
                    }
                }
            }
        }
    }
}

/// The body of a response to a client.
pub enum ProxyBody {
    /// Streamed from a backend.
    Upstream {
        body: UpstreamBody,
        release: Option<Release>,
    },
    /// Streamed from an HTTP/2 backend, with the trailers that end it. Boxed: every HTTP/1.1
    /// response moves a `ProxyBody` several times, and a larger one costs each move a copy
    /// (benches/callgrind.sh: about 300 instructions per request unboxed).
    Http2(Box<Http2Body>),
    /// Made by pinlb (an error page).
    Local(Option<Bytes>),
}

impl ProxyBody {
    /// Drops the in-flight count and, after a complete exchange, returns the connection to the
    /// pool; an unfinished one is closed with the body.
    fn release(&mut self) {
        if let ProxyBody::Upstream { body, release } = self {
            if let Some(r) = release.take() {
                if let Finished::Reusable(conn) = body.finish(r.keep_alive) {
                    r.upstream.checkin(r.backend, conn);
                }
            }
        }
    }
}

impl ProxyBody {
    /// The backend connection of a `101` response, taken out to become a tunnel.
    pub fn upgrade(&mut self) -> Option<Upgraded> {
        let ProxyBody::Upstream { body, release } = self else {
            return None;
        };
        let release = release.take()?;
        let (stream, early) = body.take_conn()?.into_parts();
        Some(Upgraded {
            stream,
            early,
            open: OpenTunnel::new(release),
        })
    }

    /// The body's length still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            ProxyBody::Upstream { body, .. } => body.remaining(),
            ProxyBody::Http2(h) => http_body::Body::size_hint(&h.body).exact(),
            ProxyBody::Local(data) => Some(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }

    /// Whether the response carries a Date header of its own: a backend's may.
    pub fn has_date(&self) -> bool {
        match self {
            ProxyBody::Upstream { body, .. } => body.has_date(),
            ProxyBody::Http2(h) => h.has_date,
            ProxyBody::Local(_) => false,
        }
    }

    /// The next piece of the body; `None` once it is complete. An error means it broke off.
    pub fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, UpstreamError>>> {
        match self {
            ProxyBody::Upstream { body, .. } => {
                let polled = body.poll_data(cx);
                // Released with the body's last piece, before it is written to the client: a
                // client that has its whole response may send its next request at once, and it
                // must find the backend's in-flight count and pooled connection back.
                let ended = match &polled {
                    Poll::Ready(Some(Ok(_))) => body.is_done(),
                    Poll::Ready(_) => true,
                    Poll::Pending => false,
                };
                if ended {
                    self.release();
                }
                polled
            }
            ProxyBody::Http2(h) => h.poll_data(cx),
            ProxyBody::Local(data) => Poll::Ready(data.take().map(Ok)),
        }
    }

    /// The trailers an HTTP/2 backend sent after the body, once it is over. An HTTP/1.1 client
    /// does not get them (as nginx's `grpc_pass` to an HTTP/1.1 client): its response is not
    /// framed for trailers.
    pub fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        match self {
            ProxyBody::Http2(h) => h.trailers.take(),
            _ => None,
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // A body that is empty (HEAD, 204, 304, Content-Length: 0) is dropped without being
        // polled; that exchange is complete, and `finish` sees that.
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_is_the_client_appended_to_a_trusted_proxys_list() {
        let trusted = Client::new(
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
        let client = Client::new(
            "192.0.2.1:5555".parse().unwrap(),
            &["10.0.0.0/8".parse().unwrap()],
        );
        assert!(!client.trusted);
        assert_eq!(&*forwarded_for(Some(b"1.1.1.1"), &client), b"192.0.2.1");
        let v6 = Client::new("[::1]:1".parse().unwrap(), &[]);
        assert_eq!(&*forwarded_for(None, &v6), b"::1");
    }

    #[test]
    fn tried_set_handles_many_backends() {
        for n in [3, 64, 65, 300] {
            let mut t = Tried::new(n);
            assert!(!t.contains(n - 1));
            t.insert(n - 1);
            assert!(t.contains(n - 1));
            assert!(!t.contains(0));
        }
    }

    #[test]
    fn each_error_maps_to_one_status() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let client = |e| ProxyError::Client(e).status().as_u16();
        assert_eq!(client(ClientError::MissingHost), 400);
        assert_eq!(client(ClientError::DuplicateHost), 400);
        assert_eq!(client(ClientError::InvalidHost), 400);
        assert_eq!(client(ClientError::AsteriskForm), 400);
        assert_eq!(client(ClientError::TransferEncoding), 400);
        assert_eq!(client(ClientError::ContentLength("x")), 400);
        assert_eq!(client(ClientError::UriTooLong { len: 2, limit: 1 }), 414);
        assert_eq!(client(ClientError::BodyTooLarge { limit: 1 }), 413);
        assert_eq!(ProxyError::NoBackend(String::new()).status(), 503);
        assert_eq!(
            ProxyError::BadGateway {
                backend: a,
                cause: "x".into()
            }
            .status(),
            502
        );
        assert_eq!(
            ProxyError::Timeout {
                backend: a,
                after: Duration::from_secs(1)
            }
            .status(),
            504
        );
        assert_eq!(
            ProxyError::SendTimeout {
                backend: a,
                after: Duration::from_secs(1)
            }
            .status(),
            504
        );
    }
}
