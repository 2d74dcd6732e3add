//! The request path's retry loop: pick a backend, make an attempt, and on a failure decide
//! whether the next backend may be tried (nginx's `proxy_next_upstream` rules); every failure
//! that ends it becomes an error response.
//!
//! Per request this takes no lock. The client's body streams to the backend as it arrives, the
//! backend's body streams back, and the upstream connection returns to the worker's pool when the
//! response body ends. An upstream with a `[buffering]` table reads the client's body whole
//! before the pick (`request_buffering`) and drains the backend's body for a slow client
//! (`response_buffering`); one without pays a test of that `Option` at each of the two places.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};

use crate::backend_address::BackendAddress;
use crate::config::{Algorithm, Buffering, Limits, Protocol, Retry, Timeouts};
use crate::http1::client::{self, ConnectFailure, Outgoing, UpstreamBody, UpstreamError};
use crate::http1::common::{Reply, RequestFraming};
use crate::http1::request::RequestHead;
use crate::http1::timer::Timer;
use crate::modules::SideRequest;
use crate::modules::request_id::id::RequestId;
use crate::proxy::accesslog::Upstreamed;
use crate::proxy::attempt::{Failure, Plan, Spans, attempt, attempt_h2};
use crate::proxy::body::{ProxyBody, Release, h2_reply};
use crate::proxy::downstream::{Downstream, DownstreamBody, forwarded_for};
use crate::proxy::error::ProxyError;
use crate::proxy::fastcgi;
use crate::proxy::request_body::RequestBody;
use crate::proxy::request_buffering;
use crate::proxy::response_buffering;
use crate::proxy::timing::Timing;
use crate::sys::summed::summed_warn;
use crate::upstream::hash_key;
use crate::upstream::in_flight::InFlight;
use crate::upstream::local::WorkerUpstream;
use crate::upstream::queue::Queue;
use crate::upstream::shared::SharedUpstream;

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
    /// The backend a sticky cookie names (`modules::sticky`), tried before the upstream's
    /// algorithm; set only by [`sticky_forward`].
    pub preferred: Option<usize>,
    /// A mirror's copies that take the body too: sent once it has been read
    /// (`proxy::side_request`); empty for every other request.
    pub copies: Vec<PendingCopy>,
    /// The route's cache, when it has one (`proxy::cache`).
    pub cache: Option<crate::modules::cache::Cached>,
}

/// A mirror's copy of a request, with its body, waiting for the body to be read.
pub struct PendingCopy {
    pub upstream: Rc<WorkerUpstream>,
    pub side: SideRequest,
    /// The client's address, for the copy's X-Forwarded-For.
    pub peer: SocketAddr,
}

impl std::fmt::Debug for PendingCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingCopy({})", self.upstream.shared.config.name)
    }
}

/// The request as it goes upstream, but for its Host (a request without one gets its
/// backend's address). A route's header lines go with the request's Upgrade lines after them,
/// joined into `joined` only then.
#[inline(always)]
fn outgoing<'a>(
    head: &'a RequestHead,
    overrides: Option<&'a Overrides>,
    downstream: &'a Downstream,
    forwarded_for: &'a [u8],
    upgrade_on: bool,
    joined: &'a mut Vec<u8>,
    added: &'a [u8],
) -> Outgoing<'a> {
    Outgoing {
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
                *joined = [lines, &upgrading[head.lines().len()..]].concat();
                joined
            }
            (Some(lines), _) => lines,
        },
        trusted_lines: match (&head.proxied_lines, downstream.trusted) {
            (Some(lines), true) => lines,
            _ => b"",
        },
        forwarded_for,
        added,
        https: downstream.https,
    }
}

/// What pinlb adds to a response on its way to the client: the request's ID (`[request_id]`).
pub fn add_response_lines(headers: &mut Vec<u8>, id: Option<&RequestId>) {
    if let Some(id) = id {
        id.respond(headers);
    }
}

/// What every attempt at one request shares: the route's timeouts over the upstream's, and
/// whether the request may be sent again once a backend may have acted on it (that also needs
/// a whole body).
#[inline(always)]
fn plan<'a>(
    shared: &'a SharedUpstream,
    (head, overrides, downstream): (&RequestHead, Option<&'a Overrides>, &'a Downstream),
    framing: RequestFraming,
    upgrade_on: bool,
    timed: bool,
) -> Plan<'a> {
    let retry = &shared.config.retry;
    Plan {
        timeouts: overrides
            .and_then(|o| o.timeouts.as_ref())
            .unwrap_or(&shared.config.timeouts),
        framing,
        resendable: retry.non_idempotent || is_idempotent(&head.method),
        upgrade: upgrade_on && head.upgrade_lines().is_some(),
        timed,
        spans: Cell::new(Spans::default()),
        origin: shared.config.proxy_protocol.map(|_| &downstream.origin),
    }
}

/// How many backends one request may try: `retry.tries`, at most every backend once.
pub(crate) fn max_tries(retry: &Retry, backends: usize) -> usize {
    if retry.tries == 0 {
        backends
    } else {
        retry.tries.min(backends)
    }
}

/// A response head from a backend, with the body that streams the rest.
type Responded = (Reply<ProxyBody>, Option<Box<Upstreamed>>);

pub(crate) async fn forward(
    upstream: &Rc<WorkerUpstream>,
    downstream: &Downstream,
    limits: &Limits,
    (head, overrides, added): (&RequestHead, Option<&Overrides>, &[u8]),
    body: &mut impl DownstreamBody,
    timed: Option<(Instant, bool)>,
    mut waiter: Option<&mut Timer>,
) -> Result<Responded, ProxyError> {
    let (at, keep) = (timed.map(|t| t.0), timed.is_some_and(|t| t.1));
    let framing = body.framing();
    let forwarded_for = forwarded_for(head.forwarded_for.as_deref(), downstream);
    let shared = &*upstream.shared;
    // An HTTP/2 backend gets no Upgrade (extended CONNECT is not spoken): the request goes as
    // an ordinary one, as with `upgrade = false`.
    let upgrade_on = shared.config.upgrade.enabled && !shared.config.protocol.is_http2();
    let mut joined = Vec::new();
    let base = outgoing(
        head,
        overrides,
        downstream,
        &forwarded_for,
        upgrade_on,
        &mut joined,
        added,
    );
    let retry = &shared.config.retry;
    let mut body = RequestBody::new(body, retry.buffer, limits);
    let request = (head, overrides, downstream);
    let plan = plan(shared, request, framing, upgrade_on, at.is_some());

    // nginx's proxy_next_upstream: a failed attempt moves on to the next backend, each backend
    // at most once per request, within `tries` attempts and `timeout` since the first.
    let max_tries = max_tries(retry, shared.backends.len());
    let host_from_backend = head.host().is_none();
    // Only a `hash` upstream reads the key; only `ewma` times each attempt.
    let key = shared.config.hash.as_ref();
    let key = key.and_then(|spec| hash_key::request_key(spec, head, downstream.ip));
    let ewma = shared.config.algorithm == Algorithm::Ewma;
    let mut tried = Tried::new(shared.backends.len());
    let (mut first_try, mut last_error): (Option<Instant>, Option<ProxyError>) = (None, None);
    let mut queue_time = Duration::ZERO;
    let mut on = OnStatus::new(upstream, (max_tries, key), keep);
    loop {
        let out_of_budget = first_try.is_some_and(|t| t.elapsed() >= retry.timeout);
        let picked = if on.next.is_some() || tried.count >= max_tries || out_of_budget {
            on.next.take()
        } else if let Some(picked) = preferred(upstream, overrides, &tried) {
            Some(picked)
        } else if let (Some(queue), 0) = (&shared.queue, tried.count) {
            match upstream.pick_unqueued(queue, key) {
                picked @ Some(_) => picked,
                None => pick_queued(upstream, queue, key, &mut queue_time).await?,
            }
        } else {
            upstream.pick(key, |i| tried.contains(i))
        };
        let Some((backend, mut guard)) = picked else {
            return Err(last_error.unwrap_or_else(|| ProxyError::NoBackend(shared.unavailable())));
        };
        tried.insert(backend);
        // The answering attempt's start; a later one reads the clock only when it is timed.
        let begun = first_try.and(at).map(|_| Instant::now());
        let started = *first_try.get_or_insert_with(Instant::now);
        let begun = begun.unwrap_or(started);
        let sent = ewma.then(Instant::now);
        let addr = shared.backends[backend].address;
        let backend_host = host_from_backend.then(|| addr.host());
        let out = Outgoing {
            host: backend_host.as_deref().map_or(base.host, str::as_bytes),
            ..base
        };
        // What is recorded of every response, whichever protocol brought it.
        let served = |status, guard: &InFlight| {
            let now = guard.answered(shared, status, sent, started, at.is_some())?;
            let spans = plan.spans.get();
            let attempt = (started, begun, spans.connect, spans.sent);
            let timing = Timing::measured(at?, queue_time, attempt, now);
            guard.proxied(shared, timing.proxy());
            keep.then(|| Box::new(Upstreamed::answered(addr, timing)))
        };
        let (wait, at) = (waiter.as_deref_mut(), (started, backend));
        let failure = match shared.config.protocol {
            Protocol::Http1 => match attempt(upstream, backend, &plan, &out, &mut body, wait).await
            {
                Ok((answer, conn)) => {
                    if on.again(upstream, &plan, &body, &tried, at, answer.status) {
                        // Dropped, read no further: its connection closes.
                        let _ = guard.answered(shared, answer.status, sent, started, false);
                        continue;
                    }
                    let served = on.attach(served(answer.status, &guard));
                    let reply = h1_reply(upstream, backend, guard, (answer, conn), &head.method);
                    return Ok((reply, served));
                }
                Err(failure) => failure,
            },
            // Boxed: their state stays out of the HTTP/1.1 request's own.
            Protocol::H2c | Protocol::H2 | Protocol::Fastcgi => {
                let request = (head, downstream, &out, &served as Served);
                let other = attempt_other(upstream, backend, &plan, request, &mut body, guard);
                match Box::pin(other).await {
                    Ok(r) if on.again(upstream, &plan, &body, &tried, at, r.0.status) => continue,
                    Ok((reply, served)) => return Ok((reply, on.attach(served))),
                    Err((failure, back)) => {
                        guard = back;
                        failure
                    }
                }
            }
        };
        let error = give_up_or_retry(failure, guard, shared, &plan, &head.method, &body, addr)?;
        on.tried(addr, error.status().as_u16());
        last_error = Some(error);
    }
}

/// A sticky request's first pick: the backend its cookie names, while that one can take it
/// (`WorkerUpstream::prefer`); `None` (at once, for every request without such a cookie) leaves
/// the pick to the algorithm.
#[inline(always)]
fn preferred(
    upstream: &WorkerUpstream,
    overrides: Option<&Overrides>,
    tried: &Tried,
) -> Option<(usize, InFlight)> {
    let b = overrides?.preferred?;
    if tried.count > 0 {
        return None;
    }
    upstream.prefer(b)
}

/// [`forward`] for an upstream with a sticky cookie (`modules::sticky`): the backend the cookie
/// names is tried first; the cookie goes no further than pinlb (HAProxy's `indirect`: the request
/// is sent with its other cookies only); and an answer from another backend than the one the
/// cookie named (or to a request without one) carries the cookie that names it. A valid cookie
/// is not sent again. pinlb's own answers (502, 503, 504) set none.
///
/// When the named backend is down, disabled, skipped after failures or at `max_conns`, the
/// request goes to the algorithm's pick (through the queue, with one) and moves there: HAProxy's
/// behaviour with `option redispatch`, not its wait in the full server's own queue, which pinlb
/// does not have.
#[cold]
#[inline(never)]
pub(crate) async fn sticky_forward(
    upstream: &Rc<WorkerUpstream>,
    downstream: &Downstream,
    limits: &Limits,
    (head, overrides, added): (&RequestHead, Option<&Overrides>, &[u8]),
    body: &mut impl DownstreamBody,
    timed: Option<(Instant, bool)>,
    waiter: Option<&mut Timer>,
) -> Result<Responded, ProxyError> {
    let request = (head, overrides, added);
    let Some(sticky) = upstream.shared.sticky.as_deref() else {
        return forward(upstream, downstream, limits, request, body, timed, waiter).await;
    };
    let route_lines = overrides.and_then(|o| o.lines.as_deref());
    let arrived = sticky.arrived(route_lines.unwrap_or(head.lines()));
    let mine = Overrides {
        copies: Vec::new(),
        path: overrides.and_then(|o| o.path.clone()),
        lines: arrived.stripped.or_else(|| route_lines.map(<[u8]>::to_vec)),
        timeouts: overrides.and_then(|o| o.timeouts),
        preferred: arrived.preferred,
        cache: None,
    };
    let request = (head, Some(&mine), added);
    let (mut reply, upstreamed) =
        forward(upstream, downstream, limits, request, body, timed, waiter).await?;
    if let Some(answered) = reply.body.answered_by() {
        sticky.respond(&mut reply.headers, answered, arrived.preferred);
    }
    Ok((reply, upstreamed))
}

/// What the retry loop records of a response (see `served` in [`forward`]).
type Served<'s> = &'s dyn Fn(StatusCode, &InFlight) -> Option<Box<Upstreamed>>;

/// An attempt in a protocol other than HTTP/1.1: HTTP/2, or FastCGI. Out of line, and boxed by
/// the caller: an HTTP/2 attempt's state (or a FastCGI one's) stays out of the request's own,
/// which every HTTP/1.1 request copies. The in-flight `guard` goes with the response, or back
/// with the failure.
async fn attempt_other(
    upstream: &Rc<WorkerUpstream>,
    backend: usize,
    plan: &Plan<'_>,
    (head, downstream, out, served): (&RequestHead, &Downstream, &Outgoing<'_>, Served<'_>),
    body: &mut RequestBody<'_, impl DownstreamBody>,
    guard: InFlight,
) -> Result<Responded, (Failure, InFlight)> {
    let method = &head.method;
    if upstream.shared.config.protocol == Protocol::Fastcgi {
        return match fastcgi::attempt(upstream, backend, plan, (head, downstream), body).await {
            Ok(answer) => {
                let served = served(answer.status, &guard);
                let reply = fastcgi::reply(answer, guard, upstream.clone(), backend, method);
                let reply = match &upstream.shared.config.buffering {
                    Some(b) => response_buffering::reply(b, reply, method),
                    None => reply,
                };
                Ok((reply, served))
            }
            Err(failure) => Err((failure, guard)),
        };
    }
    match attempt_h2(upstream, backend, plan, out, body).await {
        Ok((response, stream)) => {
            let served = served(response.status(), &guard);
            Ok((h2_reply(response, method, (guard, stream)), served))
        }
        Err(failure) => Err((failure, guard)),
    }
}

/// A request's first pick at an upstream with a `queue` (see [`WorkerUpstream::pick_queued`]),
/// and how long it waited. Boxed: the wait's state stays out of the request's own.
async fn pick_queued(
    upstream: &WorkerUpstream,
    queue: &Arc<Queue>,
    key: Option<u64>,
    queue_time: &mut Duration,
) -> Result<Option<(usize, InFlight)>, ProxyError> {
    match Box::pin(upstream.pick_queued(queue, key)).await {
        Ok(Some((backend, guard, waited))) => {
            *queue_time = waited;
            Ok(Some((backend, guard)))
        }
        Ok(None) => Ok(None),
        Err(refused) => Err(ProxyError::Queue(refused)),
    }
}

/// After a failed attempt: records it on the backend, and decides. `Ok` with the error to
/// answer if no other backend does, when the next backend may be tried; `Err` when the request
/// ends here.
fn give_up_or_retry(
    failure: Failure,
    guard: InFlight,
    shared: &SharedUpstream,
    plan: &Plan<'_>,
    method: &Method,
    body: &RequestBody<'_, impl DownstreamBody>,
    addr: BackendAddress,
) -> Result<ProxyError, ProxyError> {
    let timed_out = match &failure {
        Failure::Connect(e) => matches!(e.kind, ConnectFailure::TimedOut | ConnectFailure::Busy),
        Failure::Exchange(e) => matches!(e, UpstreamError::Timeout | UpstreamError::SendTimeout),
    };
    let retry = &shared.config.retry;
    let listed = match timed_out {
        true => retry
            .on_timeout
            .then_some(())
            .ok_or("retry.on has no \"timeout\""),
        false => retry
            .on_error
            .then_some(())
            .ok_or("retry.on has no \"error\""),
    };
    let excuse = match (&failure, failure.kind()) {
        (Failure::Connect(e), _) => guard.connect_failed(shared, e.kind),
        (_, Some(kind)) => {
            guard.failed(shared, kind);
            None
        }
        (_, None) => None,
    };
    let (error, sent) = failed(failure, addr, plan.timeouts)?;
    let error = match (error, excuse) {
        (ProxyError::BadGateway { backend, cause }, Some(excuse)) => ProxyError::BadGateway {
            backend,
            cause: format!("{cause} ({excuse})"),
        },
        (error, _) => error,
    };
    let why = match listed {
        Ok(()) => not_retried(sent, method, plan.resendable, body, retry.buffer),
        Err(off) => Some(off.to_owned()),
    };
    if let Some(why) = why {
        summed_warn!(backend = %addr; "{error}; not retried: {why}");
        return Err(error);
    }
    guard.retried(shared);
    summed_warn!(backend = %addr; "{error}; trying the next backend");
    Ok(error)
}

/// One request's retries on a status (`retry.on`'s `http_NNN`, HAProxy's `retry-on 503`), and
/// the attempts before its answer, for the access log.
struct OnStatus {
    /// The upstream retries on a status.
    on: bool,
    max_tries: usize,
    key: Option<u64>,
    /// The backend a retry picked, for the next attempt (before any other pick, and past the
    /// checks of attempts and time, which it passed when it was picked).
    next: Option<(usize, InFlight)>,
    /// A retry on a status was made, and holds one of the worker's retry budget.
    retried: bool,
    /// The access log wants the attempts before the answering one ([`Upstreamed::tried`]).
    keep: bool,
    tried: Vec<(BackendAddress, u16)>,
}

impl OnStatus {
    /// A request's; at an upstream that retries on a status, the request adds its share to
    /// the worker's retry budget.
    #[inline(always)]
    fn new(
        upstream: &WorkerUpstream,
        (max_tries, key): (usize, Option<u64>),
        keep: bool,
    ) -> OnStatus {
        let retry = &upstream.shared.config.retry;
        let on = !retry.on_status.is_empty();
        if on {
            upstream.retry_budget.deposit(retry);
        }
        OnStatus {
            on,
            max_tries,
            key,
            next: None,
            retried: false,
            keep,
            tried: Vec::new(),
        }
    }

    /// An attempt at `backend` that came to `status` and went on to another backend, for the
    /// access log.
    #[inline(always)]
    fn tried(&mut self, backend: BackendAddress, status: u16) {
        if self.keep {
            self.tried.push((backend, status));
        }
    }

    /// The answering attempt's log record with the attempts before it.
    #[inline(always)]
    fn attach(&mut self, upstreamed: Option<Box<Upstreamed>>) -> Option<Box<Upstreamed>> {
        let mut upstreamed = upstreamed?;
        if !self.tried.is_empty() {
            upstreamed.tried = Some(std::mem::take(&mut self.tried).into_boxed_slice());
        }
        Some(upstreamed)
    }

    /// Whether the answer with `status` from `backend` is dropped (read no further) for
    /// another backend's, which is then picked (`self.next`).
    #[inline(always)]
    fn again(
        &mut self,
        upstream: &WorkerUpstream,
        plan: &Plan<'_>,
        body: &RequestBody<'_, impl DownstreamBody>,
        tried: &Tried,
        (started, backend): (Instant, usize),
        status: StatusCode,
    ) -> bool {
        self.on && self.after(upstream, plan, body, tried, (started, status, backend))
    }

    /// [`OnStatus::again`] at an upstream that retries on a status: when `status` is one to
    /// retry and the request may go again (a method that may be sent twice, or
    /// `non_idempotent`; its body kept whole; attempts and time left; another backend that can
    /// take it; and the worker's retry budget has one). A retry answered with another status
    /// gives its budget back. The answer retried is counted on its backend as a retry.
    #[cold]
    #[inline(never)]
    fn after(
        &mut self,
        upstream: &WorkerUpstream,
        plan: &Plan<'_>,
        body: &RequestBody<'_, impl DownstreamBody>,
        tried: &Tried,
        (started, status, backend): (Instant, StatusCode, usize),
    ) -> bool {
        let shared = &*upstream.shared;
        let retry = &shared.config.retry;
        if !retry.on_status.contains(status.as_u16()) {
            if std::mem::take(&mut self.retried) {
                upstream.retry_budget.give_back();
            }
            return false;
        }
        let addr = shared.backends[backend].address;
        let why = if !plan.resendable {
            "the method is not idempotent (retry.non_idempotent is off)"
        } else if !body.replayable() {
            "the request body was larger than retry.buffer"
        } else if tried.count >= self.max_tries || started.elapsed() >= retry.timeout {
            "no attempt or time left (retry.tries, retry.timeout)"
        } else if !upstream.retry_budget.take(retry) {
            shared
                .budget_refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            "the retry budget is spent (retry.budget)"
        } else if let Some(picked) = upstream.pick(self.key, |i| tried.contains(i)) {
            if shared.counting {
                let stats = &shared.backends[backend].stats;
                stats
                    .retries
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.retried = true;
            self.next = Some(picked);
            self.tried(addr, status.as_u16());
            summed_warn!(backend = %addr; "the backend answered {status}; trying the next backend");
            return true;
        } else {
            upstream.retry_budget.give_back();
            "no other backend can take it"
        };
        summed_warn!(backend = %addr; "the backend answered {status}; not retried: {why}");
        false
    }
}

/// What a failed attempt means for the request: the error it is answered with if no other
/// backend answers, and whether the backend may have acted on it. A client whose body failed
/// ends the request at once (`Err`): the backend has the head and part of the body, and dropping
/// the connection without the last chunk leaves it an incomplete request, never a complete one.
fn failed(
    failure: Failure,
    backend: BackendAddress,
    timeouts: &Timeouts,
) -> Result<(ProxyError, bool), ProxyError> {
    Ok(match failure {
        Failure::Connect(e) => (
            ProxyError::BadGateway {
                backend,
                cause: e.cause,
            },
            false,
        ),
        Failure::Exchange(UpstreamError::Client(e)) => return Err(ProxyError::Downstream(e)),
        Failure::Exchange(UpstreamError::Timeout) => (
            ProxyError::Timeout {
                backend,
                after: timeouts.response,
            },
            true,
        ),
        Failure::Exchange(UpstreamError::SendTimeout) => (
            ProxyError::SendTimeout {
                backend,
                after: timeouts.send,
            },
            true,
        ),
        Failure::Exchange(e) => (
            ProxyError::BadGateway {
                backend,
                cause: e.to_string(),
            },
            true,
        ),
    })
}

/// Why a request that failed on a backend that may have acted on it (`sent`) must not go to
/// the next one; `None` when it may.
fn not_retried(
    sent: bool,
    method: &Method,
    resendable: bool,
    body: &RequestBody<'_, impl DownstreamBody>,
    buffer: usize,
) -> Option<String> {
    if sent && !resendable {
        return Some(format!(
            "{method} is not idempotent and the backend may have processed it"
        ));
    }
    if sent && !body.replayable() {
        return Some(format!(
            "the request body was larger than retry.buffer ({buffer} bytes)"
        ));
    }
    None
}

/// Methods that may be sent twice with the effect of once (RFC 9110 §9.2.2).
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// The set of backends already tried for one request (or one TCP listener's connection).
pub(crate) struct Tried {
    small: u64,
    large: Vec<bool>,
    /// Backends tried so far.
    pub count: usize,
}

impl Tried {
    pub fn new(n: usize) -> Self {
        Tried {
            small: 0,
            count: 0,
            large: if n > 64 { vec![false; n] } else { Vec::new() },
        }
    }
    pub fn contains(&self, i: usize) -> bool {
        if self.large.is_empty() {
            self.small & (1 << i) != 0
        } else {
            self.large[i]
        }
    }
    pub fn insert(&mut self, i: usize) {
        self.count += 1;
        if self.large.is_empty() {
            self.small |= 1 << i;
        } else {
            self.large[i] = true;
        }
    }
}

/// The reply to a backend's HTTP/1.1 answer: its body streamed, holding the in-flight count and
/// the connection until it ends; at an upstream with a `[buffering]` table, drained for a slow
/// client when that response is buffered (`response_buffering`).
#[inline(always)]
fn h1_reply(
    upstream: &Rc<WorkerUpstream>,
    backend: usize,
    guard: InFlight,
    (answer, conn): (client::Head, client::Conn),
    method: &Method,
) -> Reply<ProxyBody> {
    let release = Release::new(guard, answer.keep_alive, upstream.clone(), backend);
    let body = ProxyBody::Upstream {
        body: UpstreamBody::new(conn, &answer),
        release: Some(release),
    };
    let reply = client::response(answer, body, method);
    match &upstream.shared.config.buffering {
        Some(b) => response_buffering::reply(b, reply, method),
        None => reply,
    }
}

/// [`forward`] with the client's body read whole first (`buffering.request`), so that a slow
/// upload holds no backend, `max_conns` slot or queue place while it arrives. Out of line: the
/// plain path's future and code carry none of it.
pub(crate) async fn forward_buffered(
    upstream: &Rc<WorkerUpstream>,
    downstream: &Downstream,
    limits: &Limits,
    buffering: &Buffering,
    request: (&RequestHead, Option<&Overrides>, &[u8]),
    body: &mut impl DownstreamBody,
    timed: Option<(Instant, bool)>,
) -> Result<Responded, ProxyError> {
    let mut whole = request_buffering::read_whole(body, buffering, limits).await?;
    // `sticky_forward` is `forward` for an upstream without a sticky cookie. The backend
    // connection's timer serves the response wait: this path is out of line, and its attempt
    // does not carry the client's.
    sticky_forward(
        upstream, downstream, limits, request, &mut whole, timed, None,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
