//! Where a listener's requests go, and the rules for its clients: what a connection, HTTP/1.1
//! or HTTP/2, reads anew for each request, so that open connections follow a reload.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};

use crate::config::{Http2, Limits, PathMatch, RouteAction};
use crate::edge::controls::rate_limits;
use crate::http1::common::Reply;
use crate::http1::common::{ERROR_PAGE_TYPE, RequestFraming};
use crate::http1::request::RequestHead;
use crate::modules::cache::Cached;
use crate::modules::conn_limit::table::ConnGate;
use crate::modules::rate_limit::check::RateLimits;
use crate::modules::{Answer, Configs, Locals, Paged, Response};
use crate::proxy::accesslog::Upstreamed;
use crate::proxy::body::{ProxyBody, local_reply, module_reply};
use crate::proxy::downstream::Downstream;
use crate::proxy::forward::{Overrides, PendingCopy};
use crate::route::table::Router;
use crate::syntax::template::Request;
use crate::tls::server::Terminator;
use crate::upstream::counters::ListenerStats;
use crate::upstream::local::WorkerUpstream;

/// One listener in one worker, for the listener's whole life: the plan of the running
/// generation, swapped whole by a reload (`process::worker`), and what stays across them.
/// Every request takes the plan once, at its head ([`Route::plan`]), and keeps it to its end,
/// so keep-alive connections follow a reload and a request never mixes two generations.
///
/// The plan is an `Rc`, not an `Arc`: the cell is the worker's own, never borrowed across an
/// await, and a request's clone is then a plain increment, not an atomic on a line every
/// pinned core shares. What every worker shares (the modules' configurations) is `Arc`s inside.
pub(crate) struct Route {
    plan: RefCell<Rc<Plan>>,
    /// This worker's counters for the listener, while metrics are on.
    pub stats: Option<Arc<ListenerStats>>,
    /// The address the listener is bound to: the destination a PROXY protocol header sent to
    /// a backend names (the wildcard address for a wildcard listener: no `getsockname` per
    /// connection).
    pub local: SocketAddr,
}

impl Route {
    /// A new listener's route, bound to `local`, with its `/metrics` counters when metrics are on.
    pub fn new(plan: Plan, stats: Option<Arc<ListenerStats>>, local: SocketAddr) -> Route {
        Route {
            plan: RefCell::new(Rc::new(plan)),
            stats,
            local,
        }
    }

    /// A kept listener takes a new generation's plan. Open connections take it at their next
    /// request; new handshakes get the new certificates.
    pub fn renew(&self, plan: Plan) {
        *self.plan.borrow_mut() = Rc::new(plan);
    }

    /// The running generation's plan.
    #[inline]
    pub fn plan(&self) -> Rc<Plan> {
        self.plan.borrow().clone()
    }
}

/// A listener's plan in one worker for one generation: everything about it that a reload
/// changes, decided once, when the generation starts (`process::worker`), and never changed:
/// a reload makes a new one ([`Route::renew`]).
pub(crate) struct Plan {
    pub upstream: Rc<WorkerUpstream>,
    pub rules: Rc<DownstreamRules>,
    /// The listener's TLS certificates, for the handshakes of connections accepted under this
    /// plan; `None` for plain HTTP.
    pub tls: Option<Arc<Terminator>>,
    /// The listener has a module that answers requests itself before their route
    /// (`redirect_https`), so that a listener without asks none.
    pub answers: bool,
    /// `h2c`: a connection that begins with the HTTP/2 preface speaks HTTP/2.
    pub h2c: bool,
    /// Its requests' times are measured (`proxy::timing`): the access log, `/metrics` or
    /// `Server-Timing` reads them. A request of a listener that needs none reads the clock for
    /// none.
    pub timed: bool,
    /// Its answers carry their spans out of the proxy: the access log or `Server-Timing`
    /// reads them (`/metrics` alone takes what it counts inside).
    pub spans: bool,
    /// `[[listener.route]]`, compiled; empty for a listener whose requests all go to `upstream`.
    pub routes: Routes,
    /// The listener or one of its routes has a module that replaces answers by pages
    /// (`error_page`, `intercept_errors`), so that the answers of a listener without are not
    /// looked at.
    pub paged: bool,
    /// `conn_limit`: the open connections allowed per client address, checked once per
    /// connection; `None` (the common case) checks nothing.
    pub conn_limit: Option<Rc<ConnGate>>,
    /// `proxy_protocol`: the networks allowed to send a PROXY protocol header, which each
    /// connection accepted under this plan must begin with; `None` (the common case, one test
    /// per connection) for a listener that reads none.
    pub proxy_protocol: Option<Arc<Vec<ipnet::IpNet>>>,
    /// `[listener.tls] client_ca`: requests lose the client's own lines of the
    /// `client_cert_headers` names and get the verified certificate's, and their log entry
    /// the certificate (`modules::client_cert`).
    pub client_cert: bool,
    /// The listener or one of its routes has a module that acts on responses (`modules`:
    /// `response_headers`, `server_timing`'s line, `compress`, `limit_rate`), so that the
    /// answers of a listener without are not looked at.
    pub responds: bool,
    /// The listener or one of its routes has a module that sends side requests (`mirror`).
    pub sides: bool,
    /// The listener or one of its routes caches responses (`cache`).
    pub caches: bool,
}

impl Plan {
    /// Listener `l`'s plan under `config`, with this worker's `upstreams` and the process's
    /// edge `tables`. `counting`: the listener has `/metrics` counters (an admin listener).
    pub fn of(
        l: &crate::config::Listener,
        config: &crate::config::Config,
        upstreams: &[Rc<WorkerUpstream>],
        rules: &Rc<DownstreamRules>,
        (tables, zones): (
            &crate::edge::tables::Tables,
            &crate::modules::cache::zone::Zones,
        ),
        counting: bool,
    ) -> Plan {
        // Whether its answers carry their spans: the access log or `Server-Timing` reads them.
        let spans = config.access_log.is_some()
            || l.modules.timed()
            || l.routes.iter().any(|r| r.modules.timed());
        Plan {
            upstream: upstreams[l.upstream].clone(),
            rules: rules.clone(),
            tls: l.tls.clone(),
            answers: l.modules.answers_requests(),
            h2c: l.h2c,
            // Timed when something reads the times: the log, `Server-Timing` or `/metrics`.
            timed: counting || spans,
            spans,
            routes: Routes::new(l, upstreams, config, (tables, zones)),
            paged: l.modules.pages() || l.routes.iter().any(|r| r.modules.pages()),
            conn_limit: l.conn_limit.map(|c| {
                Rc::new(ConnGate {
                    table: tables.conn(l.address, &c),
                    max: c.max,
                })
            }),
            proxy_protocol: l.proxy_protocol.clone(),
            // It asks for client certificates (`client_ca`): its requests then carry the
            // certificate's lines (`client_cert_headers`) and log fields.
            client_cert: l.tls.as_ref().is_some_and(|t| t.client_auth.is_some()),
            responds: l.modules.responds() || l.routes.iter().any(|r| r.modules.responds()),
            sides: l.modules.sends_side_requests()
                || l.routes.iter().any(|r| r.modules.sends_side_requests()),
            caches: caches(l),
        }
    }
}

/// A listener's routes in one worker: the compiled table and each route's upstream.
pub(crate) struct Routes {
    pub router: Router,
    /// The upstream of each route that proxies, by route index; `None` for the others.
    pub upstreams: Vec<Option<Rc<WorkerUpstream>>>,
    /// Whether requests no route matches go to the listener's `upstream`; 404 otherwise.
    pub has_default: bool,
    /// Every request goes to the listener's `upstream` as it is: no routes, no edge control,
    /// no module that refuses requests or edits their lines (the common case, one test).
    pub direct: bool,
    /// The `rate_limit` zones of each route (its own, or the listener's it inherits), by route
    /// index; `None` where none apply.
    pub rate_limits: Vec<Option<RateLimits>>,
    /// The listener's own `rate_limit` zones, for the requests no route matches.
    pub default_rate_limits: Option<RateLimits>,
    /// The listener's feature modules, for its requests that no route with its own takes.
    pub default_modules: Configs,
    /// Each route's feature modules where they are not the listener's, by route index.
    pub own_modules: Vec<Option<Configs>>,
    /// A module of the listener or of a route may refuse requests (`access`).
    pub admits: bool,
    /// A module of the listener or of a route edits proxied requests' header lines
    /// (`request_headers`).
    pub forwards: bool,
    /// This worker's own state for the listener's modules that refuse requests, and for each
    /// route's where it has modules of its own (by route index).
    pub default_locals: Locals,
    pub own_locals: Vec<Option<Locals>>,
    /// This worker's upstreams, by config index, for the modules' side requests; empty when no
    /// module of the listener sends any.
    pub all_upstreams: Vec<Rc<WorkerUpstream>>,
    /// The process's cache zones, by config index; empty when the listener caches nothing.
    pub cache_zones: Vec<Arc<crate::modules::cache::zone::Zone>>,
}

impl Routes {
    /// What route `index` changes in an answer of pinlb's own: its own feature modules (a
    /// route's `limit_rate` paces its `respond` too), or nothing.
    fn answer_edits(&self, index: usize) -> Option<Box<Edits>> {
        let modules = self.own_modules.get(index).cloned().flatten()?;
        Some(Box::new(Edits {
            modules: Some(modules),
            ..Edits::default()
        }))
    }

    /// The refusal of `head` from `client` on route `index` (the listener's requests no route
    /// matches for `None`): its `rate_limit` zones first, then the modules that refuse requests
    /// (`access`), as pinlb's answer counted in `stats`; `None` lets it go on. A route with
    /// neither pays for two tests.
    #[inline]
    fn refusal(
        &self,
        index: Option<usize>,
        head: &RequestHead,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Option<Reply<ProxyBody>> {
        let rate = match index {
            Some(i) => self.rate_limits.get(i).and_then(Option::as_ref),
            None => self.default_rate_limits.as_ref(),
        };
        let answer = match rate.and_then(|r| r.check(head, client)) {
            Some(answer) => answer,
            None if self.admits => self.admit(index, head, client)?,
            None => return None,
        };
        Some(module_reply(answer, &head.method, stats))
    }

    /// The answer of the modules of route `index` (the listener's for `None`) that refuse
    /// `head` from `client`; `None` lets it go on.
    #[inline(never)]
    fn admit(&self, index: Option<usize>, head: &RequestHead, client: IpAddr) -> Option<Answer> {
        let own = index.and_then(|i| {
            let modules = self.own_modules.get(i)?.as_ref()?;
            Some((modules, self.own_locals.get(i)?.as_ref()?))
        });
        let (modules, locals) = own.unwrap_or((&self.default_modules, &self.default_locals));
        modules.admit(locals, head, client)
    }

    /// The feature modules of route `index`'s requests (the listener's for `None`): its own,
    /// or the listener's.
    fn modules(&self, index: Option<usize>) -> &Configs {
        let own = index.and_then(|i| self.own_modules.get(i)?.as_ref());
        own.unwrap_or(&self.default_modules)
    }

    /// A listener's routes, each proxying route's upstream taken from this worker's
    /// `upstreams` (by config index).
    pub fn new(
        listener: &crate::config::Listener,
        upstreams: &[Rc<WorkerUpstream>],
        config: &crate::config::Config,
        (tables, caches_of): (
            &crate::edge::tables::Tables,
            &crate::modules::cache::zone::Zones,
        ),
    ) -> Routes {
        let zones = &config.rate_zones;
        let own_modules: Vec<Option<Configs>> = (listener.routes.iter())
            .map(|r| (r.modules != listener.modules).then(|| r.modules.clone()))
            .collect();
        let mut routes = Routes {
            upstreams: listener
                .routes
                .iter()
                .map(|r| match &r.action {
                    RouteAction::Proxy { upstream, .. } => upstreams.get(*upstream).cloned(),
                    _ => None,
                })
                .collect(),
            router: Router::new(listener.routes.clone()),
            has_default: listener.has_default,
            direct: false,
            rate_limits: (listener.routes.iter())
                .map(|r| rate_limits(listener, Some(r), zones, tables))
                .collect(),
            default_rate_limits: rate_limits(listener, None, zones, tables),
            default_modules: listener.modules.clone(),
            own_locals: (own_modules.iter())
                .map(|m| m.as_ref().map(Configs::locals))
                .collect(),
            own_modules,
            admits: listener.modules.admits() || listener.routes.iter().any(|r| r.modules.admits()),
            forwards: listener.modules.forwards()
                || listener.routes.iter().any(|r| r.modules.forwards()),
            default_locals: listener.modules.locals(),
            all_upstreams: match listener.modules.sends_side_requests()
                || listener
                    .routes
                    .iter()
                    .any(|r| r.modules.sends_side_requests())
            {
                true => upstreams.to_vec(),
                false => Vec::new(),
            },
            // Asked even when nothing here caches: a reload that drops every cache lets the
            // zones go.
            cache_zones: match (caches_of.of(&config.cache_zones), caches(listener)) {
                (zones, true) => zones,
                (_, false) => Vec::new(),
            },
        };
        routes.direct = routes.router.is_empty()
            && routes.default_rate_limits.is_none()
            && !routes.admits
            && !routes.forwards;
        routes
    }
}

/// Where one request goes.
pub(crate) enum Decision {
    /// To this upstream, with what its route changes (`None`: nothing, the common case, which
    /// then carries only a null pointer).
    Proxy(Rc<WorkerUpstream>, Option<Box<Edits>>),
    /// A response of pinlb's own (a redirect, a fixed answer, or 404 when no route matches),
    /// with what its route changes in it (its own feature modules; `None` for most).
    Answer(Reply<ProxyBody>, Option<Box<Edits>>),
}

/// What a route changes in one exchange; nothing for most requests.
#[derive(Default)]
pub(crate) struct Edits {
    /// What the proxy sends differently: the path, the header lines, the timeouts.
    pub request: Overrides,
    /// The route's own feature modules, over the listener's.
    pub modules: Option<Configs>,
}

impl Edits {
    /// What the request's route's cache did for it, when it has one.
    pub(crate) fn cache_status(&self) -> Option<crate::modules::cache::CacheStatus> {
        self.request.cache.as_ref()?.status.get()
    }
}

impl Plan {
    /// The proxy's answer replaced by its error page, where the request's route (or the
    /// listener) has one for its status: pinlb's own 502, 503, 504 or 413, and with
    /// `intercept_errors` a backend's error. A listener without pages pays for one flag.
    #[inline]
    pub fn error_page(&self, reply: &mut Reply<ProxyBody>, edits: Option<&Edits>, method: &Method) {
        if self.paged {
            self.replace_by_page(reply, edits.and_then(|e| e.modules.as_ref()), method);
        }
    }

    #[inline(never)]
    fn replace_by_page(
        &self,
        reply: &mut Reply<ProxyBody>,
        own: Option<&Configs>,
        method: &Method,
    ) {
        paged(reply, own.unwrap_or(&self.routes.default_modules), method);
    }

    /// What its route's modules (or the listener's) do to a response, when the listener or a
    /// route has a module that acts on responses (`response_headers`, `server_timing`,
    /// `compress`, `limit_rate`): `proxied` says it is the proxy's answer for a backend, not the
    /// route's own, and `upstreamed` what the backend's answer measured. A listener without
    /// pays for one flag.
    #[inline]
    pub fn respond<'r>(
        &self,
        reply: &mut Reply<ProxyBody>,
        edits: Option<&Edits>,
        request: impl FnOnce() -> Request<'r>,
        proxied: bool,
        upstreamed: Option<&Upstreamed>,
    ) {
        if self.responds {
            let own = edits.and_then(|e| e.modules.as_ref());
            self.modules_respond(reply, own, request(), proxied, upstreamed);
        }
    }

    /// The side requests (`mirror`'s copies) the modules of the route that proxies `head` ask
    /// for: sent now, or, when one takes a body the request has, put in `edits` for the proxy
    /// to send once the body has been read. Nothing waits for them.
    #[inline]
    pub fn side_requests(
        &self,
        head: &RequestHead,
        edits: &mut Option<Box<Edits>>,
        peer: SocketAddr,
    ) {
        if self.sides {
            self.send_side_requests(head, edits, peer);
        }
    }

    #[inline(never)]
    fn send_side_requests(
        &self,
        head: &RequestHead,
        edits: &mut Option<Box<Edits>>,
        peer: SocketAddr,
    ) {
        let routes = &self.routes;
        let own = edits.as_ref().and_then(|e| e.modules.as_ref());
        let sides = own.unwrap_or(&routes.default_modules).side_requests(head);
        for side in sides {
            let Some(upstream) = routes.all_upstreams.get(side.upstream) else {
                continue;
            };
            if side.body && head.body != RequestFraming::None {
                let upstream = upstream.clone();
                let copy = PendingCopy {
                    upstream,
                    side,
                    peer,
                };
                let edits = edits.get_or_insert_with(Box::default);
                edits.request.copies.push(copy);
            } else {
                crate::proxy::side_request::send(upstream, head, peer, &side, None);
            }
        }
    }

    /// Puts the route's cache (or the listener's) in `edits`, for a request that is proxied,
    /// when the listener or a route has one; a listener without pays for one flag.
    #[inline]
    pub fn cache(&self, edits: &mut Option<Box<Edits>>) {
        if self.caches {
            self.attach_cache(edits);
        }
    }

    #[inline(never)]
    fn attach_cache(&self, edits: &mut Option<Box<Edits>>) {
        let routes = &self.routes;
        let own = edits.as_ref().and_then(|e| e.modules.as_ref());
        let Some(config) = own.unwrap_or(&routes.default_modules).cache.clone() else {
            return;
        };
        let Some(zone) = routes.cache_zones.get(config.zone).cloned() else {
            return;
        };
        edits.get_or_insert_with(Box::default).request.cache = Some(Cached {
            config,
            zone,
            status: Cell::new(None),
        });
    }

    #[inline(never)]
    fn modules_respond(
        &self,
        reply: &mut Reply<ProxyBody>,
        own: Option<&Configs>,
        request: Request<'_>,
        proxied: bool,
        upstreamed: Option<&Upstreamed>,
    ) {
        let routes = &self.routes;
        let Reply {
            status,
            headers,
            body,
        } = reply;
        let mut response = Response {
            status: *status,
            length: body.remaining(),
            headers,
            request,
            proxied,
            timing: upstreamed.map(|u| u.timing.shown()),
        };
        own.unwrap_or(&routes.default_modules)
            .respond(&mut response, |filter| {
                let inner = std::mem::replace(body, ProxyBody::Local(None));
                *body = inner.filtered(filter);
            });
    }

    /// The answer of the listener's first module that answers `head` itself, before its route
    /// (`redirect_https`); only asked when [`Plan::answers`] says one may.
    #[cold]
    #[inline(never)]
    pub fn module_answer(&self, head: &RequestHead) -> Option<Answer> {
        self.routes.default_modules.request(head)
    }

    /// The listener's page for `status`, for an answer to a request head no route has seen
    /// (malformed, too large, too late).
    #[inline]
    pub fn listener_page(&self, status: StatusCode) -> Option<Paged> {
        if !self.paged {
            return None;
        }
        self.routes.default_modules.page(status.as_u16(), true, b"")
    }

    /// Where `head` goes: the first route that matches it, or the listener's upstream.
    /// Inlined for a listener without routes, the common case, so that its requests pay for
    /// one check and not for the route decision's moves; the routes are looked at out of line.
    #[inline]
    pub fn decide(
        &self,
        head: &RequestHead,
        https: bool,
        peer: &SocketAddr,
        stats: Option<&ListenerStats>,
    ) -> Decision {
        if self.routes.direct {
            return Decision::Proxy(self.upstream.clone(), None);
        }
        self.decide_by_routes(head, https, peer.ip(), stats)
    }

    /// A request no route matches: the listener's controls, then its upstream, or 404.
    #[inline(never)]
    fn no_route(&self, request: &Request<'_>, stats: Option<&ListenerStats>) -> Decision {
        let (head, client) = (request.head, request.client);
        let routes = &self.routes;
        if let Some(mut refused) = routes.refusal(None, head, client, stats) {
            paged(&mut refused, &routes.default_modules, &head.method);
            return Decision::Answer(refused, None);
        }
        if routes.has_default {
            let lines = routes
                .forwards
                .then(|| routes.default_modules.forward(request));
            let edits = lines.flatten().map(|lines| {
                Box::new(Edits {
                    request: Overrides {
                        lines: Some(lines),
                        ..Overrides::default()
                    },
                    ..Edits::default()
                })
            });
            return Decision::Proxy(self.upstream.clone(), edits);
        }
        let mut reply = local_reply(
            StatusCode::NOT_FOUND,
            ERROR_PAGE_TYPE,
            Bytes::from_static(b"404 Not Found: no route matches this request\n"),
            b"",
            &head.method,
        );
        paged(&mut reply, &routes.default_modules, &head.method);
        Decision::Answer(reply, None)
    }

    #[inline(never)]
    fn decide_by_routes(
        &self,
        head: &RequestHead,
        https: bool,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Decision {
        let routes = &self.routes;
        let request = Request {
            head,
            https,
            client,
        };
        if routes.router.is_empty() {
            // No route to look for (that would normalise the path for nothing).
            return self.no_route(&request, stats);
        }
        let Some((index, rule, path)) = routes.router.find(head) else {
            return self.no_route(&request, stats);
        };
        if let Some(mut refused) = routes.refusal(Some(index), head, client, stats) {
            paged(&mut refused, routes.modules(Some(index)), &head.method);
            return Decision::Answer(refused, routes.answer_edits(index));
        }
        match &rule.action {
            RouteAction::Proxy { rewrite_prefix, .. } => {
                let Some(upstream) = routes.upstreams.get(index).cloned().flatten() else {
                    return Decision::Proxy(self.upstream.clone(), None);
                };
                let rewritten = match (rewrite_prefix, &rule.path) {
                    (Some(to), PathMatch::Prefix(from)) => {
                        let query = head
                            .path()
                            .iter()
                            .position(|&b| b == b'?')
                            .map(|q| &head.path()[q..]);
                        let mut out = Vec::with_capacity(
                            to.len() + path.len() + query.map_or(0, <[u8]>::len),
                        );
                        out.extend_from_slice(to.as_bytes());
                        out.extend_from_slice(&path[from.len()..]);
                        out.extend_from_slice(query.unwrap_or_default());
                        Some(out)
                    }
                    _ => None,
                };
                let lines = routes
                    .forwards
                    .then(|| routes.modules(Some(index)).forward(&request));
                let timeouts = rule.timeouts.over(upstream.shared.config.timeouts);
                let edits = Edits {
                    request: Overrides {
                        path: rewritten,
                        lines: lines.flatten(),
                        timeouts,
                        preferred: None,
                        copies: Vec::new(),
                        cache: None,
                    },
                    modules: routes.own_modules.get(index).cloned().flatten(),
                };
                let changes = edits.request.path.is_some()
                    || edits.request.lines.is_some()
                    || edits.request.timeouts.is_some()
                    || edits.modules.is_some();
                Decision::Proxy(upstream, changes.then(|| Box::new(edits)))
            }
            RouteAction::Redirect { status, location } => {
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::FOUND);
                let mut line = b"location: ".to_vec();
                location.render(&request, &mut line);
                line.extend_from_slice(b"\r\n");
                let page = format!(
                    "{} {}\n",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("")
                );
                let reply = local_reply(
                    status,
                    ERROR_PAGE_TYPE,
                    Bytes::from(page),
                    &line,
                    &head.method,
                );
                Decision::Answer(reply, routes.answer_edits(index))
            }
            RouteAction::Respond { status, body } => {
                let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::OK);
                let mut reply = local_reply(
                    status,
                    ERROR_PAGE_TYPE,
                    Bytes::from(body.clone()),
                    b"",
                    &head.method,
                );
                if body.is_empty() {
                    // As nginx's `return 404;`: without a text of its own, the status's page.
                    paged(&mut reply, routes.modules(Some(index)), &head.method);
                }
                Decision::Answer(reply, routes.answer_edits(index))
            }
        }
    }
}

/// `reply` answered with its status's page from `modules`, if one has a page for it (a
/// backend's only with `intercept_errors`). A HEAD gets the page's headers without its body.
fn paged(reply: &mut Reply<ProxyBody>, modules: &Configs, method: &Method) {
    let own = matches!(reply.body, ProxyBody::Local(_));
    if let Some(page) = modules.page(reply.status.as_u16(), own, &reply.headers) {
        let Paged {
            content_type,
            lines,
            body,
        } = page;
        *reply = local_reply(reply.status, &content_type, body, &lines, method);
    }
}

/// What applies to every client of a listener, whatever its upstream.
pub(crate) struct DownstreamRules {
    /// `forwarded.trusted`.
    pub trusted: Vec<ipnet::IpNet>,
    pub limits: Limits,
    pub http2: Http2,
    /// `[request_id]`, when request IDs are on.
    pub request_ids: Option<crate::modules::request_id::RequestIds>,
}

impl DownstreamRules {
    /// What the proxy needs to know of a client at `peer`, over TLS or not.
    pub fn downstream(&self, peer: SocketAddr, tls: bool, local: SocketAddr) -> Downstream {
        Downstream {
            https: tls,
            origin: (peer, local),
            ..Downstream::new(peer, &self.trusted)
        }
    }
}

/// Who one connection's client is ([`DownstreamRules::downstream`]), under the rules it was
/// worked out for: worked out again only when a reload has changed the listener's rules, so an
/// open connection follows them. HTTP/1.1 connections and HTTP/2 connections keep one each.
pub(crate) struct KnownClient {
    cached: RefCell<(Rc<DownstreamRules>, Rc<Downstream>)>,
    /// The connection's: the client's address, whether it came over TLS, the listener's.
    peer: SocketAddr,
    tls: bool,
    local: SocketAddr,
}

impl KnownClient {
    /// The client at `peer` under `rules`.
    pub fn new(rules: Rc<DownstreamRules>, peer: SocketAddr, tls: bool, local: SocketAddr) -> Self {
        let client = Rc::new(rules.downstream(peer, tls, local));
        KnownClient {
            cached: RefCell::new((rules, client)),
            peer,
            tls,
            local,
        }
    }

    /// The client under the rules in force `now` (the request's plan's).
    #[inline]
    pub fn under(&self, now: &Rc<DownstreamRules>) -> Rc<Downstream> {
        let cached = self.cached.borrow();
        if Rc::ptr_eq(&cached.0, now) {
            return cached.1.clone();
        }
        drop(cached);
        self.renew(now)
    }

    /// After a reload changed the rules: the client worked out again.
    #[cold]
    #[inline(never)]
    fn renew(&self, now: &Rc<DownstreamRules>) -> Rc<Downstream> {
        let client = Rc::new(now.downstream(self.peer, self.tls, self.local));
        *self.cached.borrow_mut() = (now.clone(), client.clone());
        client
    }
}

/// Whether listener `l` or one of its routes caches responses.
fn caches(l: &crate::config::Listener) -> bool {
    l.modules.cache.is_some() || l.routes.iter().any(|r| r.modules.cache.is_some())
}
