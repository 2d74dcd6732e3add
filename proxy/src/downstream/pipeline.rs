//! A request's steps between its head and its response, written once for every protocol.
//! [`run`] is the whole exchange, over any [`Session`]: HTTP/1.1 ([`h1`](super::h1)) and
//! HTTP/2 ([`h2`](super::h2)) each read a head and write a response their own way, and the
//! phases between run here, in this order:
//!
//! 1. [`begin`]: the request counted, its ID, its access-log entry, the client certificate's
//!    lines;
//! 2. [`decide`]: a module's own answer (`redirect_https`'s), else the route, its
//!    `rate_limit` and the modules that may refuse it (`access`): an upstream and what the
//!    route changes (its request lines from `request_headers`), or an answer of pinlb's own;
//! 3. forwarded (`proxy::handle`, through the route's cache when it has one), racing the
//!    client's leaving as its protocol shows it (`Session::forwarding`);
//! 4. [`finish`]: whatever made the response, its error page, the modules that act on
//!    responses (`response_headers`, `Server-Timing`, the body filters of `compress` and
//!    `limit_rate`), then the request ID's line; then the response counted and its log entry
//!    responded;
//! 5. the session sends it (`Session::send`), or turns into a tunnel after a
//!    `101 Switching Protocols` (`Session::upgrade`).
//!
//! The log entry starts before anything can answer, so every answer is logged with its status,
//! over every protocol. A head that can't be parsed is the session's own business (answered
//! before any of this, unlogged, as nginx's 400 for a broken head is by pinlb's sessions).
//!
//! Every phase reads the one [`Plan`] the session took for the request at its head, so a
//! reload in the middle of a request does not mix two generations. Each phase is inlined into
//! `run`: a listener without features pays for the flags it tests (the plan's, set per
//! generation), as it did when each session had its own copy.

use std::net::SocketAddr;
use std::ops::Deref;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use http::StatusCode;

use crate::downstream::session::{Ending, Forwarding, Session};
use crate::http1::common::Reply;
use crate::http1::request::RequestHead;
use crate::modules::request_id::id::RequestId;
use crate::proxy::accesslog::{Batch, Logged, Pending, Upstreamed};
use crate::proxy::body::{ProxyBody, module_reply};
use crate::proxy::downstream::DownstreamBody;
use crate::proxy::exchange::{Answer, DownstreamRequest};
use crate::proxy::forward::add_response_lines;
use crate::proxy::handle;
use crate::route::decision::{Decision, Edits, Plan, Route};
use crate::syntax::template::Request;
use crate::tls::client_identity::ClientIdentity;
use crate::upstream::counters::{ListenerStats, Source};
use crate::upstream::local::WorkerUpstream;

/// Where a request is served: its listener's route (its counters and address) and the plan
/// the session took for it at its head.
#[derive(Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub route: &'a Route,
    pub plan: &'a Plan,
}

impl<'a> Scope<'a> {
    pub fn new(route: &'a Route, plan: &'a Plan) -> Scope<'a> {
        Scope { route, plan }
    }
}

/// One request over `session`, from its head to its answer sent: the exchange future itself
/// (HTTP/1.1 makes it in the worker's recycled block, HTTP/2 hands it to hyper as the stream's
/// service future), not a future inside the session's. `route` is borrowed (HTTP/1.1's
/// connection outlives it) or shared (hyper's future must own what it uses). One more layer of future between the session and these steps
/// cost the plain path 3.3% of its instructions (docs/pipeline-design.md).
pub(crate) async fn run<S: Session>(route: impl Deref<Target = Route>, mut session: S) -> S::Out {
    let route = &*route;
    let plan = session.plan(route);
    let limits = plan.rules.limits;
    let mut head = match session.head(&plan) {
        Ok(head) => head,
        Err(partial) => match session.read_head(&plan, partial).await {
            Ok(head) => head,
            Err(out) => return out,
        },
    };
    let refused = head.refused.take();
    // The clock is read only when something reads what it measures.
    let at = session.started(&plan);
    let scope = Scope::new(route, &plan);
    let client = session.client(&plan);
    let (https, peer) = (client.https, session.peer());
    let cert = || session.client_identity();
    let begun = begin(scope, &mut head, peer, https, session.batch(), at, cert);
    let Decided {
        upstream,
        edits,
        local,
        close,
    } = decide(scope, &head, refused.is_some(), https, &peer);
    let timeouts = edits
        .as_ref()
        .and_then(|e| e.request.timeouts)
        .unwrap_or(upstream.shared.config.timeouts);
    let proxied = local.is_none();
    let (answer, body_read) = {
        let Forwarding {
            mut body,
            gone,
            waiter,
        } = session.forwarding(&head);
        let answer = if let Some(response) = local {
            Answer {
                response,
                upstreamed: None,
                close: false,
            }
        } else {
            // Pinned where it is made, so that `select!` holds a reference to the proxy's
            // future (all of a request's states) instead of copying it.
            let forwarded = std::pin::pin!(handle::handle(
                upstream,
                client,
                limits,
                at,
                DownstreamRequest {
                    head: &head,
                    overrides: edits.as_ref().map(|e| &e.request),
                    body: &mut body,
                    refused,
                    added: begun.id.as_ref().map_or(&[][..], |i| i.upstream_lines()),
                    spans: plan.spans,
                    waiter,
                },
            ));
            tokio::select! {
                biased;
                answer = forwarded => answer,
                // Dropping the proxy's future abandons the request; the access log records 499.
                out = gone => return out,
            }
        };
        (answer, body.is_done())
    };
    let Answer {
        mut response,
        upstreamed,
        close: backend_closes,
    } = answer;
    let edits = edits.as_deref();
    let logged = finish(
        scope,
        &mut response,
        proxied,
        edits,
        &head,
        begun,
        upstreamed,
    );
    let ending = Ending {
        head: &head,
        plan: &plan,
        timeouts,
        close: close || backend_closes,
        body_read,
        at,
    };
    if response.status == StatusCode::SWITCHING_PROTOCOLS {
        return session.upgrade(response, logged, ending).await;
    }
    let sent = session.send(response, logged, &ending).await;
    session.sent(sent, &ending)
}

/// What [`begin`] started: the request's ID and its access-log entry.
pub(crate) struct Begun {
    /// Behind a pointer: the exchange's state carries that, not the ID, and the access log's
    /// entry shares it.
    pub id: Option<Arc<RequestId>>,
    pub pending: Option<Pending>,
    /// The client's address and whether it came over TLS, for the response's modules.
    pub peer: SocketAddr,
    pub https: bool,
}

/// A request whose head was parsed: counted, given its ID (`[request_id]`), its access-log
/// entry started (with `batch`, when `at` says its time is measured), and, on a listener with
/// `client_cert_headers`, its certificate's lines (`client` is asked only then).
#[inline(always)]
pub(crate) fn begin<'c>(
    Scope { route, plan }: Scope<'_>,
    head: &mut RequestHead,
    peer: SocketAddr,
    https: bool,
    batch: Option<&Rc<Batch>>,
    at: Option<Instant>,
    client: impl FnOnce() -> Option<&'c Arc<ClientIdentity>>,
) -> Begun {
    if let Some(s) = &route.stats {
        s.requests.fetch_add(1, Ordering::Relaxed);
    }
    let id = (plan.rules.request_ids.as_ref()).map(|config| Arc::new(RequestId::of(head, config)));
    let mut pending = batch
        .zip(at)
        .map(|(batch, at)| Pending::start(head, peer, batch, at, id.as_ref()));
    if plan.client_cert {
        client_cert(plan, client(), head, pending.as_mut());
    }
    Begun {
        id,
        pending,
        peer,
        https,
    }
}

/// On a listener with `client_ca`: the certificate to the access log's entry, and the
/// request's lines as `client_cert_headers` say (`modules::client_cert`). Out of line: few
/// listeners verify client certificates.
#[inline(never)]
fn client_cert(
    plan: &Plan,
    client: Option<&Arc<ClientIdentity>>,
    head: &mut RequestHead,
    pending: Option<&mut Pending>,
) {
    if let Some(p) = pending {
        p.client_cert(client);
    }
    if let Some(auth) = plan.tls.as_ref().and_then(|t| t.client_auth.as_ref()) {
        crate::modules::client_cert::lines::edit(&auth.headers, client, head);
    }
}

/// Where a request goes ([`decide`]).
pub(crate) struct Decided {
    /// The upstream it is proxied to (for an answer of pinlb's own, the listener's, whose
    /// timeouts bound the answer's writing).
    pub upstream: Rc<WorkerUpstream>,
    /// What its route changes (in an answer of pinlb's own, its own feature modules); `None`
    /// for most requests.
    pub edits: Option<Box<Edits>>,
    /// An answer of pinlb's own instead of a backend's: `redirect_https`'s, a route's
    /// (`redirect`, `respond`, 404 for no route), an edge control's refusal.
    pub local: Option<Reply<ProxyBody>>,
    /// The connection closes after the answer (a request `redirect_https` can't redirect).
    pub close: bool,
}

/// Where the request goes: an answer of a module's own, on a listener with a module that
/// answers before the route (`redirect_https`); a head the parser `refused` to its own answer
/// (made by the proxy, which knows why); else its route.
#[inline(always)]
pub(crate) fn decide(
    Scope { route, plan }: Scope<'_>,
    head: &RequestHead,
    refused: bool,
    https: bool,
    peer: &SocketAddr,
) -> Decided {
    if plan.answers {
        if let Some(answered) = module_answer(plan, head, route.stats.as_deref()) {
            return answered;
        }
    }
    let (upstream, edits, local) = if refused {
        (plan.upstream.clone(), None, None)
    } else {
        match plan.decide(head, https, peer, route.stats.as_deref()) {
            Decision::Proxy(upstream, mut edits) => {
                plan.side_requests(head, &mut edits, *peer);
                plan.cache(&mut edits);
                (upstream, edits, None)
            }
            Decision::Answer(reply, edits) => (plan.upstream.clone(), edits, Some(reply)),
        }
    };
    Decided {
        upstream,
        edits,
        local,
        close: false,
    }
}

/// A module's own answer to `head` (`redirect_https`'s 301, or its 400 for a request without
/// a Host), as pinlb's own answers go: text, with the listener's page for its status.
#[cold]
#[inline(never)]
fn module_answer(
    plan: &Plan,
    head: &RequestHead,
    stats: Option<&ListenerStats>,
) -> Option<Decided> {
    let answer = plan.module_answer(head)?;
    let close = answer.close;
    let mut reply = module_reply(answer, &head.method, stats);
    plan.error_page(&mut reply, None, &head.method);
    Some(Decided {
        upstream: plan.upstream.clone(),
        edits: None,
        local: Some(reply),
        close,
    })
}

/// A response on its way out, whatever made it: the proxy's answer (`proxied`: a backend's, or
/// pinlb's 502/503/504 in its place) gets its error page if it has one (an answer of the
/// route's own got its page in the route's decision); every response what its modules do
/// (`Plan::respond`: `response_headers`, `Server-Timing`, the body filters of `compress`, for
/// a proxied one, and `limit_rate`), then the request ID's line. Then the response is counted
/// for `/metrics` and its log entry responded; the returned [`Logged`] writes the line when
/// the body is done.
#[inline(always)]
pub(crate) fn finish(
    Scope { route, plan }: Scope<'_>,
    response: &mut Reply<ProxyBody>,
    proxied: bool,
    edits: Option<&Edits>,
    head: &RequestHead,
    begun: Begun,
    upstreamed: Option<Box<Upstreamed>>,
) -> Logged {
    if proxied {
        plan.error_page(response, edits, &head.method);
    }
    let request = || Request {
        head,
        https: begun.https,
        client: begun.peer.ip(),
    };
    plan.respond(response, edits, request, proxied, upstreamed.as_deref());
    // After the modules: a backend's own X-Request-ID that `response_headers` removed is
    // replaced by pinlb's, as before they were modules.
    add_response_lines(&mut response.headers, begun.id.as_deref());
    let mut pending = begun.pending;
    if let (Some(p), Some(status)) = (&mut pending, edits.and_then(Edits::cache_status)) {
        p.cache(status);
    }
    if let Some(s) = &route.stats {
        let source = match response.body {
            ProxyBody::Local(_) => Source::Pinlb,
            _ => Source::Backend,
        };
        s.response(response.status, source);
    }
    Logged::new(pending.and_then(|p| p.responded(response.status, upstreamed)))
}
