//! Features as modules: one file owns one feature of a listener and its routes, its keys (in
//! `[[listener]]` and `[[listener.route]]`), its validated configuration, what `pinlb check`
//! says of it, and what it does to a response's body. The [`modules!`] call below is the
//! registry: a module is one line there, and the configuration's tables, the docs test, the
//! request pipeline and `pinlb check` find it from that line.
//!
//! A module's keys are taken out of the listener's and each route's table before serde reads
//! the rest (`config::raw`), read into the module's own [`Module::Raw`] type (errors at their
//! `file:line:col`, as any key's), and validated by [`Module::validate`]: a route's own keys
//! over the listener's, as nginx's `location` inherits from its `server`. Each generation's
//! configurations are shared by every worker ([`Configs`], `Arc`s). A module with a body filter
//! wraps the response's body in the response phase (`downstream::pipeline::finish`), so both
//! HTTP/1.1 and HTTP/2 send it filtered without knowing; a listener without such a module pays
//! for one flag.
//!
//! A module with a side request (`mirror`) asks, for each request its route proxies, for a
//! copy to go to another upstream ([`SideRequest`]); the request pipeline sends it
//! (`proxy::side_request`) and never waits for it. A listener without such a module pays for
//! one flag.
//!
//! A module that refuses requests (`access`) is asked for each request once its route is
//! known ([`Module::admit`]), with a state of its own in each worker ([`Module::Local`]: the
//! credentials verified recently). A module that answers requests itself (`redirect_https`) is
//! asked for each request before its route ([`Module::request`]); one that edits a proxied response's head
//! (`server_timing`) is asked in the response phase ([`Module::response`]). A listener
//! without such a module pays for one flag each.
//!
//! A feature whose table is the file's own, not a listener's or a route's, is a module too,
//! outside the registry: it owns its keys (read into its own `Raw` type where the file's
//! other tables are), their validation and what it does, and the request path calls it
//! where it joins (`request_id`; the cache's `[cache.NAME]` zones likewise). So is one whose
//! keys are an upstream's (`sticky`, `buffering`), or `[listener.tls]`'s (`client_cert`), and
//! the limits whose tables are the process's (`rate_limit` with its `[limit.NAME]` zones,
//! `conn_limit`): their keys, validation, tables and checks are here, and `edge/` hands them
//! the process's tables and compiles a route's zones once per generation.
//!
//! - [`access`]: nginx's `allow`/`deny`, `auth_basic` and `satisfy`: who may send a
//!   listener's or a route's requests.
//! - [`header_rules`]: what `request_headers` and `response_headers` share: their rules,
//!   validated and applied.
//! - [`request_headers`]: nginx's `proxy_set_header`: a proxied request's header lines edited.
//! - [`error_pages`]: nginx's `error_page` and `proxy_intercept_errors`: answers replaced by
//!   pages from files.
//! - [`response_headers`]: nginx's `add_header`: a response's header lines edited.
//! - [`compress`]: nginx's `gzip` (with brotli and zstd): a response's body compressed for a
//!   client that takes a coding.
//! - [`limit_rate`]: nginx's `limit_rate` and `limit_rate_after`: a response sent at a bounded
//!   rate after its first bytes.
//! - [`server_timing`]: a proxied response's `Server-Timing` header: the proxy's share of its
//!   time and the backend's.
//! - [`redirect_https`]: nginx's `return 301 https://$host$request_uri;`: a plain listener's
//!   requests answered with a redirect to https.
//! - [`mirror`]: nginx's `mirror`: a copy of a share of the requests to another upstream,
//!   whose answers are read and dropped.
//! - [`cache`]: nginx's `proxy_cache`: responses kept in a zone shared by every worker and
//!   served again while RFC 9111 says they are fresh.
//! - [`request_id`]: `[request_id]`, nginx's `$request_id`: an ID for every request on both
//!   sides and in the log, with the W3C trace context.
//! - [`sticky`]: an upstream's `sticky` cookie (HAProxy's `cookie NAME insert`): a client kept
//!   on the backend that first answered it.
//! - [`client_cert`]: `[listener.tls]`'s client certificates: their keys, CA and CRL files,
//!   and the lines that tell a backend what a request's certificate says.
//! - [`rate_limit`]: nginx's `limit_req_zone` and `limit_req`: `[limit.NAME]` zones and a
//!   route's `rate_limit`, counted per key in tables every worker shares.
//! - [`conn_limit`]: nginx's `limit_conn`: a listener's open connections per client address.
//! - [`buffering`]: an upstream's `[buffering]`, nginx's `proxy_request_buffering` and
//!   `proxy_buffering`: its keys and their validation.

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::http1::request::RequestHead;
use crate::syntax::error::{ConfigError, Source};
use crate::syntax::template::Request;

/// Where a module's keys are validated: the file, the table's key (`listener[0]`,
/// `listener[0].route[1]`), and the names of the file's upstreams, in order (a module that
/// names one keeps its index).
pub(crate) struct Place<'a> {
    pub src: &'a Source<'a>,
    pub key: &'a str,
    pub upstreams: &'a [&'a str],
    /// The names of the file's `[cache.NAME]` zones, in order.
    pub caches: &'a [&'a str],
    /// The span of the listener's `[listener.tls]`, when it has one.
    pub tls: Option<std::ops::Range<usize>>,
}

/// An answer of a module's own to a request, instead of the proxy's: sent as pinlb's own
/// answers are (text, with the error page for its status, if there is one: the listener's
/// for an answer before the route, the route's for a refusal after it).
pub(crate) struct Answer {
    pub status: StatusCode,
    /// Its header lines, `name: value\r\n` each.
    pub lines: Vec<u8>,
    /// Its text.
    pub body: Bytes,
    /// The connection closes after it.
    pub close: bool,
    /// The edge control that refused the request, as `/metrics` counts it.
    pub refused: Option<Refusal>,
}

/// Why pinlb's edge controls refused a connection or a request, as `/metrics` counts it
/// (`pinlb_refused_total{listener, cause}`). Each refusal is counted once, where it is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A PROXY protocol header that is malformed, truncated or oversized (connection closed).
    ProxyInvalid = 0,
    /// No whole PROXY protocol header within `limits.header_timeout` (connection closed).
    ProxyTimeout = 1,
    /// A PROXY protocol header from an address not allowed to send one, or none from one that
    /// must (connection closed before any byte reaches a backend).
    ProxyUntrusted = 2,
    /// Over a route's request rate (`429`, or the status configured).
    RateLimit = 3,
    /// Over the connections allowed per client address (connection refused).
    ConnLimit = 4,
    /// Refused by `allow`/`deny` (`403`).
    Denied = 5,
    /// No or wrong basic-auth credentials (`401`).
    Unauthorized = 6,
    /// A client certificate missing, unverifiable or revoked where one is required.
    ClientCert = 7,
}

impl Refusal {
    pub(crate) const COUNT: usize = 8;
    pub(crate) const NAMES: [&str; Refusal::COUNT] = [
        "proxy_protocol_invalid",
        "proxy_protocol_timeout",
        "proxy_protocol_untrusted",
        "rate_limit",
        "conn_limit",
        "denied",
        "unauthorized",
        "client_cert",
    ];
}

/// An answer's body replaced by a page ([`Module::page`]).
pub(crate) struct Paged {
    /// Its `content-type: …\r\n` line.
    pub content_type: Vec<u8>,
    /// The answer's other header lines that stay.
    pub lines: Vec<u8>,
    pub body: Bytes,
}

/// A copy of a request that a module sends to another upstream, beside the request, never
/// waited for: its answer is read and dropped.
pub(crate) struct SideRequest {
    /// The upstream, by its index in the configuration.
    pub upstream: usize,
    /// Header lines added to the copy, `name: value\r\n` each.
    pub lines: Arc<[u8]>,
    /// Copies to that upstream not yet answered past which this one is dropped.
    pub max_in_flight: usize,
    /// The copy takes the request's body too (sent once the body has been read); without, it
    /// goes at once, with no body.
    pub body: bool,
    /// The largest body a copy takes; a larger one drops the copy.
    pub max_body: usize,
}

/// A response on its way to the client, as a module deciding on its body filter sees it.
pub(crate) struct Response<'a> {
    pub status: StatusCode,
    /// Its header lines, `name: value\r\n` each, which the module may edit.
    pub headers: &'a mut Vec<u8>,
    /// The request it answers.
    pub request: Request<'a>,
    /// Its body's length, when known (before this module's filter).
    pub length: Option<u64>,
    /// The proxy's answer for a backend (a backend's response, or pinlb's 502/503/504 in its
    /// place), not a route's own answer.
    pub proxied: bool,
    /// Where a backend's answer's time went, when the listener measures it (a module with
    /// [`Module::TIMED`], the access log or `/metrics`); `None` for pinlb's own answers.
    pub timing: Option<Timing>,
}

/// Where a proxied request's time went up to its response head (`proxy::timing` cuts it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// In the upstream's queue.
    pub queue: Duration,
    /// The proxy's own share: the access log's `proxy_time`.
    pub proxy: Duration,
    /// Waiting on backends: the connects, failed attempts and the answer's head.
    pub upstream: Duration,
}

/// The body filter of a module that filters no body.
pub(crate) enum NoFilter {}

impl BodyFilter for NoFilter {
    fn push(&mut self, _: Option<Bytes>) -> io::Result<()> {
        match *self {}
    }
    fn poll_out(&mut self, _: &mut Context<'_>) -> Poll<Option<Bytes>> {
        match *self {}
    }
    fn is_empty(&self) -> bool {
        match *self {}
    }
    fn keeps_length(&self) -> bool {
        match *self {}
    }
}

/// One feature of a listener and its routes.
pub(crate) trait Module {
    /// Its keys, the same in `[[listener]]` and `[[listener.route]]`.
    const KEYS: &'static [&'static str];
    /// Its keys as the file writes them: every key optional (`Option`), unknown ones denied.
    type Raw: for<'de> Deserialize<'de> + Serialize + Default + fmt::Debug;
    /// Validated: what a worker needs, shared by every worker of a generation.
    type Config: fmt::Debug + Eq + Send + Sync + 'static;
    /// What each worker keeps of its own for one listener's or route's configuration, made
    /// anew for each generation (`()` for nothing).
    type Local: Default;
    /// What it does to a response's body ([`NoFilter`] for nothing).
    type Filter: BodyFilter;
    /// Whether its keys may be written in a route too, not only in a listener.
    const ON_ROUTES: bool = true;
    /// Whether it may answer requests itself, before their route ([`Module::request`]).
    const REQUEST: bool = false;
    /// Whether it may refuse requests once their route is known ([`Module::admit`]).
    const ADMIT: bool = false;
    /// What it answers every request with, for `pinlb check`'s listener line, when it answers
    /// every one itself (`redirect_https`): such a listener needs no upstream.
    const ANSWERS_ALL: Option<&'static str> = None;
    /// Whether it edits the header lines of the requests its route proxies
    /// ([`Module::forward`]).
    const FORWARD: bool = false;
    /// Whether it may replace an answer's body by a page ([`Module::page`]).
    const PAGES: bool = false;
    /// Whether it acts on every response's head ([`Module::response`]).
    const RESPONSE: bool = false;
    /// Whether it reads where a request's time went ([`Response::timing`]): the listener
    /// measures it then.
    const TIMED: bool = false;
    /// Whether it may filter response bodies ([`Module::filter`]).
    const BODY: bool = false;
    /// Whether it may ask for side requests ([`Module::side_request`]).
    const SIDE: bool = false;

    /// The configuration of the table at `at` from its keys `raw`; `inherited` is the
    /// listener's, for a route. `None`: off.
    fn validate(
        at: &Place<'_>,
        raw: &Self::Raw,
        inherited: Option<&Arc<Self::Config>>,
    ) -> Result<Option<Arc<Self::Config>>, ConfigError>;

    /// Its answer to `head`, a request of a listener it is on, instead of the route's; only
    /// asked of a module with [`Module::REQUEST`], before the route is looked for.
    fn request(config: &Arc<Self::Config>, head: &RequestHead) -> Option<Answer> {
        let _ = (config, head);
        None
    }

    /// Its answer to `head`, a request from `client` of a route (or listener) it is on,
    /// instead of the route's: a refusal. Only asked of a module with [`Module::ADMIT`], once
    /// the route is known, before the route's own answer; `local` is this worker's.
    fn admit(
        config: &Arc<Self::Config>,
        local: &Self::Local,
        head: &RequestHead,
        client: IpAddr,
    ) -> Option<Answer> {
        let _ = (config, local, head, client);
        None
    }

    /// The header lines `request` goes to its backend with: `lines` holds them when a module
    /// before this one changed them (`None`: the request's own). Only asked of a module with
    /// [`Module::FORWARD`], for a request its route proxies.
    fn forward(config: &Arc<Self::Config>, request: &Request<'_>, lines: &mut Option<Vec<u8>>) {
        let _ = (config, request, lines);
    }

    /// The page that replaces an answer with `status` and header lines `headers` (`own`: an
    /// answer of pinlb's own, not a backend's), if it has one. Only asked of a module with
    /// [`Module::PAGES`], before the response phase.
    fn page(config: &Arc<Self::Config>, status: u16, own: bool, headers: &[u8]) -> Option<Paged> {
        let _ = (config, status, own, headers);
        None
    }

    /// What it does to a response's head, whatever made it, before the body filters are
    /// chosen; only asked of a module with [`Module::RESPONSE`].
    fn response(config: &Arc<Self::Config>, response: &mut Response<'_>) {
        let _ = (config, response);
    }

    /// The filter of `response`'s body, if it gets one; it may edit the response's headers
    /// as it decides. Only asked of a module with [`Module::BODY`].
    fn filter(config: &Arc<Self::Config>, response: &mut Response<'_>) -> Option<Self::Filter> {
        let _ = (config, response);
        None
    }

    /// A copy of `head`, a request its route proxies, to send elsewhere; only asked of a
    /// module with [`Module::SIDE`].
    fn side_request(config: &Arc<Self::Config>, head: &RequestHead) -> Option<SideRequest> {
        let _ = (config, head);
        None
    }

    /// What `pinlb check` says of it.
    fn describe(config: &Self::Config) -> String;
}

/// A response body's filter: the body's pieces go in as they come, and what it lets out goes
/// to the client, when it lets it out.
pub(crate) trait BodyFilter {
    /// Takes the body's next piece; `None`: the body ended. An error breaks the body off.
    fn push(&mut self, piece: Option<Bytes>) -> io::Result<()>;
    /// The body has nothing more for now: what the filter holds back may be let out (a
    /// compressor flushes). An error breaks the body off.
    fn idle(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// What goes out now: a piece; `Ready(None)` once what was pushed is all out; `Pending`
    /// while it waits (the waker registered for when it may go on).
    fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>>;
    /// Whether it holds nothing that is to go out now: the body is read on then.
    fn is_empty(&self) -> bool;
    /// Whether what goes out is as long as what came in, so the response keeps its
    /// Content-Length.
    fn keeps_length(&self) -> bool;
}

/// A module's keys taken out of a table of the file, with their values as the file has them.
pub(crate) type Taken<'a> = toml::de::DeTable<'a>;

/// Reads `M`'s keys out of `taken`, the module keys of the table at `key`; an error names the
/// key under that table and points at its value.
fn read<M: Module>(
    src: &Source,
    key: &str,
    taken: &Taken<'_>,
    errors: &mut Vec<ConfigError>,
) -> M::Raw {
    let mut own = Taken::new();
    for (k, v) in taken.iter() {
        if M::KEYS.contains(&k.get_ref().as_ref()) {
            own.insert(k.clone(), v.clone());
        }
    }
    if own.is_empty() {
        return M::Raw::default();
    }
    let de = toml::Deserializer::from(toml::Spanned::new(0..0, own));
    serde_path_to_error::deserialize(de).unwrap_or_else(|e| {
        let path = e.path().to_string();
        let path = path.split(".$__serde_spanned").next().unwrap_or_default();
        let inner = e.into_inner();
        let at = inner.span().unwrap_or(0..0);
        errors.push(src.at(at, &format!("{key}.{path}"), inner.message()));
        M::Raw::default()
    })
}

/// `a`, `a or b`, `a, b or c`.
fn either(keys: &[&str]) -> String {
    match keys.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The registry: `name: Type` for each module, `name` its file.
macro_rules! modules {
    ($($name:ident: $ty:ident),* $(,)?) => {
        $(pub mod $name;)*

        /// Every module key, in registry order.
        pub(crate) const KEYS: &[&[&str]] = &[$(<$name::$ty as Module>::KEYS),*];

        /// The module keys a route may have, in registry order.
        pub(crate) const ROUTE_KEYS: &[&[&str]] = &[$(
            if <$name::$ty as Module>::ON_ROUTES { <$name::$ty as Module>::KEYS } else { &[] }
        ),*];

        /// Every module's keys of one listener or route, as the file writes them.
        /// Serialized into the listener's or route's table: each module's keys among the
        /// table's own.
        #[derive(Debug, Clone, Default, PartialEq, Serialize)]
        pub struct RawModules {
            $(#[serde(flatten)] pub $name: $name::Raw,)*
        }

        impl RawModules {
            /// The module keys `taken` out of the table at `key`, each module's read; the
            /// errors of wrong ones are added to `errors` (that module then reads none).
            pub(crate) fn read(src: &Source, key: &str, taken: &Taken<'_>, errors: &mut Vec<ConfigError>) -> RawModules {
                RawModules {
                    $($name: read::<$name::$ty>(src, key, taken, errors),)*
                }
            }

            /// The tables of every module's keys, for `config::keys`, each with whether a
            /// route may have them.
            pub(crate) fn tables() -> Vec<(crate::syntax::keys::Tables, bool)> {
                vec![$((
                    crate::syntax::keys::of::<<$name::$ty as Module>::Raw>(),
                    <$name::$ty as Module>::ON_ROUTES,
                )),*]
            }
        }

        /// What each worker keeps of its own for one listener's or route's modules that are on
        /// and refuse requests ([`Module::ADMIT`]).
        #[derive(Default)]
        pub(crate) struct Locals {
            $($name: Option<<$name::$ty as Module>::Local>,)*
        }

        /// Every module's configuration for one listener or route; `None`: off.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Configs {
            $(pub(crate) $name: Option<Arc<<$name::$ty as Module>::Config>>,)*
        }

        impl Configs {
            /// The modules of the table at `at` from its keys `raw`, over `inherited` (the
            /// listener's, for a route).
            pub(crate) fn validate(
                at: &Place<'_>,
                raw: &RawModules,
                inherited: Option<&Configs>,
            ) -> Result<Configs, ConfigError> {
                Ok(Configs {
                    $($name: <$name::$ty as Module>::validate(
                        at,
                        &raw.$name,
                        inherited.and_then(|c| c.$name.as_ref()),
                    )?,)*
                })
            }

            /// Whether a module that is on may answer requests itself.
            pub(crate) fn answers_requests(&self) -> bool {
                false $(|| (<$name::$ty as Module>::REQUEST && self.$name.is_some()))*
            }

            /// The answer of the first module, in registry order, that answers `head` itself.
            pub(crate) fn request(&self, head: &RequestHead) -> Option<Answer> {
                $(if let (true, Some(c)) = (<$name::$ty as Module>::REQUEST, &self.$name) {
                    if let Some(a) = <$name::$ty as Module>::request(c, head) {
                        return Some(a);
                    }
                })*
                None
            }

            /// Whether a module that is on may refuse requests once their route is known.
            pub(crate) fn admits(&self) -> bool {
                false $(|| (<$name::$ty as Module>::ADMIT && self.$name.is_some()))*
            }

            /// This worker's own state for the modules that are on and refuse requests.
            pub(crate) fn locals(&self) -> Locals {
                Locals {
                    $($name: (<$name::$ty as Module>::ADMIT && self.$name.is_some())
                        .then(Default::default),)*
                }
            }

            /// The refusal of the first module, in registry order, that refuses `head` from
            /// `client`; `locals` are this worker's, made by [`Configs::locals`].
            pub(crate) fn admit(&self, locals: &Locals, head: &RequestHead, client: IpAddr) -> Option<Answer> {
                $(if let (true, Some(c), Some(l)) = (<$name::$ty as Module>::ADMIT, &self.$name, &locals.$name) {
                    if let Some(a) = <$name::$ty as Module>::admit(c, l, head, client) {
                        return Some(a);
                    }
                })*
                None
            }

            /// What answers every request, when a module that is on does
            /// (`redirect to https`): the listener then needs no upstream.
            pub fn answers_all(&self) -> Option<&'static str> {
                $(if let (Some(what), Some(_)) = (<$name::$ty as Module>::ANSWERS_ALL, &self.$name) {
                    return Some(what);
                })*
                None
            }

            /// The keys of each module whose configuration differs from `other`'s, for a
            /// reload's report: `limit_rate or limit_rate_after`.
            pub fn changed(&self, other: &Configs) -> Vec<String> {
                let mut out = Vec::new();
                $(if self.$name != other.$name {
                    out.push(either(<$name::$ty as Module>::KEYS));
                })*
                out
            }

            /// Whether a module that is on may replace answers by pages.
            pub(crate) fn pages(&self) -> bool {
                false $(|| (<$name::$ty as Module>::PAGES && self.$name.is_some()))*
            }

            /// The page of the first module, in registry order, that has one for an answer
            /// with `status` and `headers` (`own`: pinlb's own answer).
            pub(crate) fn page(&self, status: u16, own: bool, headers: &[u8]) -> Option<Paged> {
                $(if let (true, Some(c)) = (<$name::$ty as Module>::PAGES, &self.$name) {
                    if let Some(p) = <$name::$ty as Module>::page(c, status, own, headers) {
                        return Some(p);
                    }
                })*
                None
            }

            /// Whether a module that is on edits the header lines of proxied requests.
            pub(crate) fn forwards(&self) -> bool {
                false $(|| (<$name::$ty as Module>::FORWARD && self.$name.is_some()))*
            }

            /// The header lines `request` goes to its backend with, when a module that is on
            /// changes them; `None` keeps the request's own.
            pub(crate) fn forward(&self, request: &Request<'_>) -> Option<Vec<u8>> {
                let mut lines = None;
                $(if let (true, Some(c)) = (<$name::$ty as Module>::FORWARD, &self.$name) {
                    <$name::$ty as Module>::forward(c, request, &mut lines);
                })*
                lines
            }

            /// Whether a module that is on may ask for side requests.
            pub(crate) fn sends_side_requests(&self) -> bool {
                false $(|| (<$name::$ty as Module>::SIDE && self.$name.is_some()))*
            }

            /// The side requests the modules that are on ask for `head`, in registry order.
            pub(crate) fn side_requests(&self, head: &RequestHead) -> Vec<SideRequest> {
                let mut out = Vec::new();
                $(if let (true, Some(c)) = (<$name::$ty as Module>::SIDE, &self.$name) {
                    out.extend(<$name::$ty as Module>::side_request(c, head));
                })*
                out
            }

            /// Whether a module that is on acts on responses: their heads or their bodies.
            pub(crate) fn responds(&self) -> bool {
                false $(|| ((<$name::$ty as Module>::RESPONSE || <$name::$ty as Module>::BODY) && self.$name.is_some()))*
            }

            /// Whether a module that is on reads where a request's time went.
            pub(crate) fn timed(&self) -> bool {
                false $(|| (<$name::$ty as Module>::TIMED && self.$name.is_some()))*
            }

            /// What the modules that are on do to `response`: each one's response phase, in
            /// registry order, then their body filters, each handed to `wrap` in registry order
            /// (the first wraps the body first, so the last is outermost).
            pub(crate) fn respond(&self, response: &mut Response<'_>, mut wrap: impl FnMut(Filter)) {
                $(if let (true, Some(c)) = (<$name::$ty as Module>::RESPONSE, &self.$name) {
                    <$name::$ty as Module>::response(c, response);
                })*
                $(if let (true, Some(c)) = (<$name::$ty as Module>::BODY, &self.$name) {
                    if let Some(f) = <$name::$ty as Module>::filter(c, response) {
                        if !f.keeps_length() {
                            response.length = None;
                        }
                        wrap(Filter::$ty(f));
                    }
                })*
            }

            /// What `pinlb check` says of each module that is on.
            pub fn describe(&self) -> Vec<String> {
                let mut out = Vec::new();
                $(if let Some(c) = &self.$name {
                    out.push(<$name::$ty as Module>::describe(c));
                })*
                out
            }

            /// What `pinlb check` says of each module whose configuration here is not
            /// `outer`'s (a route's over its listener's): its own, or that it is off.
            pub fn describe_over(&self, outer: &Configs) -> Vec<String> {
                let mut out = Vec::new();
                $(match &self.$name {
                    own if own == &outer.$name => {}
                    Some(c) => out.push(<$name::$ty as Module>::describe(c)),
                    None => out.push(format!("{}: off", <$name::$ty as Module>::KEYS[0])),
                })*
                out
            }
        }

        /// One module's filter of a response's body.
        pub(crate) enum Filter {
            $($ty(<$name::$ty as Module>::Filter),)*
        }

        impl BodyFilter for Filter {
            fn push(&mut self, piece: Option<Bytes>) -> io::Result<()> {
                match *self { $(Filter::$ty(ref mut f) => f.push(piece),)* }
            }
            fn idle(&mut self) -> io::Result<()> {
                match *self { $(Filter::$ty(ref mut f) => f.idle(),)* }
            }
            fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
                match *self { $(Filter::$ty(ref mut f) => f.poll_out(cx),)* }
            }
            fn is_empty(&self) -> bool {
                match *self { $(Filter::$ty(ref f) => f.is_empty(),)* }
            }
            fn keeps_length(&self) -> bool {
                match *self { $(Filter::$ty(ref f) => f.keeps_length(),)* }
            }
        }
    };
}

pub mod header_rules;

pub mod buffering;
pub mod client_cert;
pub mod conn_limit;
pub mod rate_limit;
pub mod request_id;
pub mod sticky;

modules! {
    access: AccessControl,
    redirect_https: RedirectHttps,
    request_headers: RequestHeaders,
    error_pages: ErrorPage,
    response_headers: ResponseHeaders,
    server_timing: ServerTiming,
    compress: Compression,
    limit_rate: LimitRate,
    mirror: Mirror,
    cache: Cache,
}
