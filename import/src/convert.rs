//! nginx directives to a pinlb configuration: what has an equivalent becomes the
//! configuration's raw types (so a key pinlb renames fails to compile here), everything else a
//! note naming its `file:line`, or a refusal where leaving it out makes pinlb less strict than
//! nginx ([`less_strict`]).

use std::collections::BTreeMap;

use pinlb::config::raw::{
    CpuList, Dur, OneOrMany, RawCertificate, RawConfig, RawLimits, RawListener, RawLog,
    RawRedirect, RawRespond, RawRoute, RawRouteTimeouts, RawRuntime, RawTls, RawUpstream, Size,
};
use pinlb::config::{Algorithm, Protocol};
use pinlb::modules::cache::zone::RawZone;
use pinlb::modules::client_cert::RawHeaders;
use pinlb::modules::conn_limit::RawConnLimit;
use pinlb::modules::header_rules;
use pinlb::modules::rate_limit::RawRateZone;
use toml::Spanned;

use super::access;
use super::client_cert;
use super::error_page::{self, Pages};
use super::files::{self, Left};
use super::matched::{Known, Matched};
use super::parse::Directive;
use super::proxy_protocol::{self, Accepting};
use super::rewrite;
use super::sticky;
use super::template::template;
use super::unix_socket;
use super::values::{
    backend, dur, listen_address, listener, one_backend, respond, spanned, text, upstream_at,
    with_port,
};

/// The converted configuration and what could not be.
pub struct Converted {
    pub config: RawConfig,
    pub notes: Vec<String>,
    /// The directives not converted that make pinlb answer where nginx would refuse, limit or
    /// ask for credentials (`file:line: ...`): see [`less_strict`].
    pub refused: Vec<String>,
    /// Whether any listener has a route: something proxies, redirects or answers.
    pub anything: bool,
}

struct Builder {
    runtime: RawRuntime,
    limits: RawLimits,
    /// `[log]`, from `access_log`.
    log: RawLog,
    /// The body limit pinlb gets (`limits.max_body`, 0 unlimited), which every
    /// `client_max_body_size` is held against.
    max_body: u64,
    /// `[[listener]]`s by address, in first-seen order.
    listeners: Vec<(String, Vec<Server>)>,
    upstreams: BTreeMap<String, RawUpstream>,
    /// http-level `keepalive_timeout`, for every upstream's `client_idle`.
    client_idle: Option<Dur>,
    notes: Vec<String>,
    refused: Vec<String>,
    /// nginx's configuration prefix (the main file's directory), for relative file names.
    conf_dir: std::path::PathBuf,
    /// `[limit.NAME]`, from `limit_req_zone` (see [`super::limits`]).
    limit_zones: BTreeMap<String, RawRateZone>,
    /// `[cache.NAME]`, from `proxy_cache_path` (see [`super::cache`]).
    cache_zones: BTreeMap<String, RawZone>,
    /// `limit_conn_zone`s keyed by the client's address: name → keys.
    conn_zones: BTreeMap<String, i64>,
    /// `http`'s `set_real_ip_from` values, for the servers that have none of their own.
    real_ip_from: Vec<(String, String)>,
    /// `proxy_set_header NAME $ssl_client_s_dn` and the like: `client_cert_headers`' field
    /// to the header's name, for the TLS listeners that ask for client certificates.
    client_cert_headers: RawHeaders,
    /// The upstreams whose `[buffering]` a location has decided ([`super::buffering`]).
    buffered: super::buffering::Decided,
    /// The upstreams a `proxy_pass` speaks HTTP to, which a `fastcgi_pass` can't also use.
    http_upstreams: std::collections::BTreeSet<String>,
    /// What the whole configuration says about the directives pinlb already matches.
    known: Known,
    /// The server's mirror targets ([`super::mirror`]), while its locations convert.
    mirrors: super::mirror::Targets,
    /// The `stream` block's TCP and UDP listeners ([`super::stream`]).
    stream_listeners: Vec<RawListener>,
}

/// One `server` block: its names (empty for the catch-all `_`), whether it is the default for
/// its address, and its routes, in the order nginx would match them.
struct Server {
    names: Vec<String>,
    default: bool,
    routes: Vec<RawRoute>,
    /// How its relative redirects are made absolute, once its address is known.
    redirects: Redirects,
    /// Where it was written, for notes.
    at: String,
    /// Its certificates, for the addresses it listens on with `ssl`.
    tls: Option<ServerTls>,
    /// Its `error_page`s and `proxy_intercept_errors`.
    pages: Pages,
    /// Its `limit_conn` as `(max, keys)`, for its listener's `conn_limit`.
    conn_limit: Option<(i64, i64)>,
    /// The addresses it takes the PROXY protocol on, and from whom.
    accepting: Accepting,
    /// Its locations left out, noted once its listener's routes are known ([`files`]).
    left: Vec<Left>,
}

impl Server {
    /// Whether it answers anything but the 404s of its locations that serve files: a server
    /// that does not is left out with its listener, as one that only serves files.
    fn answers(&self) -> bool {
        let files: Vec<usize> = self.left.iter().filter_map(|l| l.route).collect();
        (0..self.routes.len()).any(|i| !files.contains(&i))
    }
}

/// What one `location` becomes.
enum Location {
    Route(RawRoute),
    /// It serves files: the route that answers 404, and what it serves (for the note).
    Files(RawRoute, String),
    /// What answers its requests did not convert (noted): no route, and a note, once the
    /// server's routes are known, on which route takes them.
    Dropped(String),
    /// Left out, noted already.
    Gone,
}

/// What a server that listens with `ssl` brings to its listener's `[listener.tls]`.
#[derive(Debug, Clone)]
struct ServerTls {
    /// The addresses it listens on with `ssl`.
    addresses: Vec<String>,
    /// `(cert, key)` pairs, in the order written: nginx's first is the one it serves.
    certificates: Vec<(String, String)>,
    /// `listen ... http2` or `http2 on`.
    http2: bool,
    /// Its client certificate keys (`client_ca` and the others), when it asks for one.
    client: Option<RawTls>,
}

/// The TLS directives a server merges from `http`: `ssl_certificate` and `ssl_certificate_key`
/// as a whole level's list (nginx's array directives), `ssl_protocols` and `http2` from the
/// nearest level that sets them.
#[derive(Debug, Clone, Default)]
struct Ssl {
    certs: Vec<Directive>,
    keys: Vec<Directive>,
    protocols: Option<Directive>,
    http2: Option<bool>,
    /// `ssl_client_certificate`, `ssl_verify_client`, `ssl_crl`, `ssl_verify_depth`.
    client: client_cert::Levels,
}

impl Ssl {
    /// The directives converted this way.
    const NAMES: [&'static str; 4] = [
        "ssl_certificate",
        "ssl_certificate_key",
        "ssl_protocols",
        "http2",
    ];

    fn level(&self, block: &[Directive]) -> Ssl {
        let mut out = self.clone();
        let of = |name: &str| -> Vec<Directive> {
            block
                .iter()
                .filter(|d| d.name == name && d.block.is_none())
                .cloned()
                .collect()
        };
        let (certs, keys) = (of("ssl_certificate"), of("ssl_certificate_key"));
        if !certs.is_empty() {
            out.certs = certs;
        }
        if !keys.is_empty() {
            out.keys = keys;
        }
        if let Some(p) = of("ssl_protocols").pop() {
            out.protocols = Some(p);
        }
        if let Some(h) = of("http2").pop() {
            out.http2 = Some(h.args.first().map(String::as_str) == Some("on"));
        }
        out.client = self.client.level(block);
        out
    }
}

/// nginx's `absolute_redirect` and `port_in_redirect` (both on by default): a redirect to
/// `/new` goes out as `http://HOST:PORT/new`, the port left out when it is 80.
#[derive(Debug, Clone, Copy)]
struct Redirects {
    absolute: bool,
    port: bool,
}

/// What nginx merges into a `location` from the `server` and `http` blocks around it: the
/// `proxy_set_header` lines of the nearest level that has any (nginx inherits all of a level's
/// or none), each `proxy_*_timeout` from the nearest level that sets it, and [`Redirects`].
#[derive(Debug, Clone)]
struct Inherited {
    headers: Option<Vec<Directive>>,
    timeouts: Vec<Directive>,
    redirects: Redirects,
    /// `error_page`, `proxy_intercept_errors` and `root`.
    pages: error_page::Inherit,
    /// `allow`/`deny`, `auth_basic`, `auth_basic_user_file`, `satisfy` ([`access`]).
    access: access::Access,
    /// The `limit_req`s in force.
    limits: super::limits::Inherited,
    /// The gzip directives in force.
    gzip: super::gzip::Inherit,
    /// `limit_rate` and `limit_rate_after` in force.
    limit_rate: super::limit_rate::Inherit,
    /// The `proxy_cache` directives in force ([`super::cache`]).
    cache: super::cache::Inherit,
    /// `proxy_buffering` and the rest of [`super::buffering::NAMES`] in force.
    buffering: super::buffering::Inherited,
    /// The `fastcgi_param` lines (and standard includes) of the nearest level with any, and
    /// the nearest `fastcgi_index`: what a FastCGI location without its own inherits.
    fastcgi: Vec<Directive>,
}

impl Default for Inherited {
    fn default() -> Self {
        Inherited {
            headers: None,
            timeouts: Vec::new(),
            redirects: Redirects {
                absolute: true,
                port: true,
            },
            pages: error_page::Inherit::default(),
            access: access::Access::default(),
            limits: Default::default(),
            gzip: Default::default(),
            limit_rate: Default::default(),
            cache: Default::default(),
            buffering: Default::default(),
            fastcgi: Vec::new(),
        }
    }
}

impl Inherited {
    /// The directives merged this way (each level's loop leaves them to [`Inherited::level`]).
    const NAMES: [&'static str; 16] = [
        "proxy_set_header",
        "proxy_connect_timeout",
        "proxy_read_timeout",
        "proxy_send_timeout",
        "fastcgi_connect_timeout",
        "fastcgi_read_timeout",
        "fastcgi_send_timeout",
        "absolute_redirect",
        "port_in_redirect",
        error_page::Inherit::NAMES[0],
        error_page::Inherit::NAMES[1],
        "allow",
        "deny",
        "auth_basic",
        "auth_basic_user_file",
        "satisfy",
    ];

    /// What a block's own directives make of what it inherits.
    fn level(&self, block: &[Directive]) -> Inherited {
        let mut out = self.clone();
        out.pages = self.pages.level(block);
        out.access = self.access.level(block);
        out.limits = self.limits.level(block);
        out.gzip = self.gzip.level(block);
        out.limit_rate = self.limit_rate.level(block);
        out.cache = self.cache.level(block);
        out.buffering = self.buffering.level(block);
        out.fastcgi = super::fastcgi::inherit(&self.fastcgi, block);
        let headers: Vec<Directive> = block
            .iter()
            .filter(|d| d.name == "proxy_set_header" && d.block.is_none())
            .cloned()
            .collect();
        if !headers.is_empty() {
            out.headers = Some(headers);
        }
        for d in block.iter().filter(|d| d.block.is_none()) {
            let on = d.args.first().map(String::as_str) != Some("off");
            match d.name.as_str() {
                "proxy_connect_timeout"
                | "proxy_read_timeout"
                | "proxy_send_timeout"
                | "fastcgi_connect_timeout"
                | "fastcgi_read_timeout"
                | "fastcgi_send_timeout" => {
                    out.timeouts.retain(|t| t.name != d.name);
                    out.timeouts.push(d.clone());
                }
                "absolute_redirect" => out.redirects.absolute = on,
                "port_in_redirect" => out.redirects.port = on,
                _ => {}
            }
        }
        out
    }
}

/// The request headers pinlb writes itself besides the hop-by-hop ones ([`pinlb::http1::hop`]), which
/// a route can't set (proxy/src/config/routes.rs).
const MANAGED: [&str; 4] = [
    "host",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-proto",
];

/// `directives` converted; `conf_dir` is nginx's configuration prefix (the main file's
/// directory), which its relative file names are relative to.
pub fn convert(directives: &[Directive], conf_dir: &std::path::Path) -> Converted {
    let mut b = Builder {
        conf_dir: conf_dir.to_path_buf(),
        runtime: RawRuntime::default(),
        limits: RawLimits::default(),
        log: RawLog::default(),
        max_body: 0,
        listeners: Vec::new(),
        upstreams: BTreeMap::new(),
        client_idle: None,
        notes: Vec::new(),
        refused: Vec::new(),
        limit_zones: BTreeMap::new(),
        cache_zones: BTreeMap::new(),
        conn_zones: BTreeMap::new(),
        real_ip_from: Vec::new(),
        client_cert_headers: RawHeaders::default(),
        buffered: Default::default(),
        http_upstreams: Default::default(),
        known: Known::read(directives),
        mirrors: Default::default(),
        stream_listeners: Vec::new(),
    };
    // The http block's upstream names, which a stream upstream of the same name yields to.
    let http_upstreams: Vec<String> = (directives.iter())
        .filter(|d| d.name == "http")
        .flat_map(|d| d.block.iter().flatten())
        .filter(|d| d.name == "upstream" && d.block.is_some())
        .filter_map(|d| d.args.first().cloned())
        .collect();
    let mut workers: Option<(usize, String)> = None;
    let mut affinity: Option<Vec<usize>> = None;
    let mut connections: Option<usize> = None;
    for d in directives {
        match (d.name.as_str(), d.block.as_deref()) {
            ("worker_processes", None) => match d.args.first().map(String::as_str) {
                Some("auto") | None => {}
                Some(n) => workers = n.parse().ok().map(|n| (n, d.at())),
            },
            ("worker_cpu_affinity", None) => affinity = cpu_affinity(&d.args),
            ("events", Some(events)) => {
                for e in events {
                    match e.name.as_str() {
                        "worker_connections" => {
                            connections = e.args.first().and_then(|n| n.parse().ok())
                        }
                        _ => b.skip(
                            e,
                            "event-loop tuning: pinlb's runtime is tokio's, one per core",
                        ),
                    }
                }
            }
            ("http", Some(http)) => b.http(http),
            ("stream", Some(block)) => b.stream(block, &http_upstreams),
            _ => b.other(d),
        }
    }
    match (affinity, &workers) {
        (Some(cores), _) => b.runtime.cpus = Some(spanned(CpuList(cores))),
        (None, Some((n, at))) => {
            let n = *n;
            b.runtime.cpus = Some(spanned(CpuList((0..n.max(1)).collect())));
            b.notes.push(format!(
                "{at}: worker_processes {n} without worker_cpu_affinity: pinlb pins {} (nginx left {}); change runtime.cpus to the cores pinlb should own",
                pinned_workers(n),
                if n == 1 { "it unpinned" } else { "them unpinned" }
            ));
        }
        (None, None) => {}
    }
    if let Some(c) = connections {
        let total = c * workers.as_ref().map_or(1, |w| w.0).max(1);
        b.limits.max_connections = Some(spanned(total));
    }
    b.finish()
}

impl Builder {
    /// `d` is not converted: a note, or a refusal where leaving it out makes pinlb less strict
    /// than nginx ([`less_strict`]).
    fn skip(&mut self, d: &Directive, why: &str) {
        match less_strict(d) {
            Some(what) => self.refused.push(format!(
                "{}: {} not converted: {why}; without it pinlb {what}",
                d.at(),
                d.name
            )),
            None => self
                .notes
                .push(format!("{}: {} not converted: {why}", d.at(), d.name)),
        }
    }

    /// A directive no arm of its level converts: nothing where pinlb already does what it asks
    /// ([`super::matched`]), else a note, or a refusal where leaving it out makes pinlb less
    /// strict.
    fn other(&mut self, d: &Directive) {
        match self.known.directive(d) {
            Matched::Same => {}
            Matched::Differs(why) => self.skip(d, why),
            Matched::Unknown => self.skip(d, "no pinlb equivalent"),
        }
    }

    /// A route's `access`, `auth_basic` and `satisfy`, from what its location merges; each
    /// note or refusal once, however many routes share the directive.
    fn access(&mut self, inherit: &Inherited, route: &mut RawRoute) {
        for said in inherit.access.apply(route, &self.conf_dir) {
            let (access::Said::Note(s) | access::Said::Refused(s)) = &said;
            let list = match said {
                access::Said::Note(_) => &mut self.notes,
                access::Said::Refused(_) => &mut self.refused,
            };
            if !list.contains(s) {
                list.push(s.clone());
            }
        }
    }

    /// `d` is not converted because nginx never reaches it: a note whatever it does.
    fn unreached(&mut self, d: &Directive, why: &str) {
        self.notes
            .push(format!("{}: {} not converted: {why}", d.at(), d.name));
    }

    /// The `stream` block: its upstreams (renamed `NAME_stream` where the http block has one
    /// of the same name: nginx keeps the two apart, pinlb has one table), then its servers.
    fn stream(&mut self, block: &[Directive], http_upstreams: &[String]) {
        let http = std::mem::take(&mut self.upstreams);
        let mut renamed = BTreeMap::new();
        for d in block {
            if let ("upstream", Some(b), Some(name)) =
                (d.name.as_str(), d.block.as_deref(), d.args.first())
            {
                self.upstream(d, b);
                let out = match http_upstreams.contains(name) {
                    true => format!("{name}_stream"),
                    false => name.clone(),
                };
                if let Some(up) = self.upstreams.remove(name) {
                    self.upstreams.insert(out.clone(), up);
                }
                renamed.insert(name.clone(), out);
            }
        }
        let mut stream_upstreams = std::mem::replace(&mut self.upstreams, http);
        let name = |n: &str| renamed.get(n).cloned();
        let converted = super::stream::convert(block, &name, &mut stream_upstreams);
        // An upstream no listener names (nginx's too would take no connection) is left out.
        let named: std::collections::BTreeSet<String> = (converted.listeners.iter())
            .flat_map(|l| {
                let by_name = l
                    .sni
                    .iter()
                    .map(|s| s.get_ref().upstream.get_ref().as_str());
                text(&l.upstream).into_iter().chain(by_name)
            })
            .map(str::to_string)
            .collect();
        for (name, up) in stream_upstreams {
            if named.contains(&name) {
                self.upstreams.insert(name, up);
            }
        }
        self.notes.extend(converted.notes);
        self.refused.extend(converted.refused);
        self.stream_listeners.extend(converted.listeners);
    }

    fn http(&mut self, http: &[Directive]) {
        // Upstreams first: a server may name one defined further down, as nginx allows.
        for d in http {
            if let ("upstream", Some(block)) = (d.name.as_str(), d.block.as_deref()) {
                self.upstream(d, block);
            }
        }
        self.body_limits(http);
        super::limits::zones(http, &mut self.limit_zones, &mut self.refused);
        super::limits::conn_zones(http, &mut self.conn_zones, &mut self.refused);
        self.cache_zones = super::cache::zones(http, &mut self.notes, size);
        let inherit = Inherited::default().level(http);
        let ssl = Ssl::default().level(http);
        let any_tls = http.iter().any(listens_tls);
        let proxied = proxy_protocol::any_server_accepts(http);
        self.real_ip_from = proxy_protocol::from(http, &[]);
        for d in http {
            if proxy_protocol::real_ip(d, proxied, &mut self.notes) {
                continue;
            }
            match (d.name.as_str(), d.block.as_deref()) {
                ("upstream", Some(_)) => {}
                ("server", Some(block)) => self.server(d, block, &inherit, &ssl),
                (n, None)
                    if (Ssl::NAMES.contains(&n) || client_cert::NAMES.contains(&n)) && any_tls => {}
                (n, None) if Inherited::NAMES.contains(&n) => {}
                (n, None) if super::buffering::NAMES.contains(&n) => {}
                (_, None) if super::fastcgi::inherited(d) => {}
                (n, None) if super::limits::NAMES.contains(&n) => {}
                (n, None) if super::limit_rate::NAMES.contains(&n) => {}
                (n, None) if super::cache::NAMES.contains(&n) => {}
                (_, None) if super::cache::is_status_header(d) => {}
                (n, None) if super::gzip::NAMES.contains(&n) => {
                    super::gzip::note(d, &mut self.notes)
                }
                ("client_max_body_size", None) => self.body_limit(d),
                ("access_log", None) => self.access_log(d, http),
                ("log_format", None) => {} // Read by access_log.
                ("large_client_header_buffers", None) => {
                    match (
                        d.args.first().and_then(|n| n.parse::<u64>().ok()),
                        d.args.get(1).and_then(|s| size(s)),
                    ) {
                        (Some(n), Some(s)) => {
                            self.limits.max_header_bytes = Some(spanned(Size(n * s)));
                            self.notes.push(format!(
                                "{}: large_client_header_buffers {n} {s} became limits.max_header_bytes = {}: pinlb bounds the whole head; nginx also bounds each line to {s} bytes",
                                d.at(),
                                n * s
                            ));
                        }
                        _ => self.skip(d, "expected a count and a size"),
                    }
                }
                ("keepalive_timeout", None) => match d.args.first().and_then(|t| dur(t)) {
                    Some(t) => self.client_idle = Some(t),
                    None => self.skip(d, "not a duration"),
                },
                (n, None) if (is_ssl(n) || n == "http2") && !any_tls => self.notes.push(format!(
                    "{}: {n} not converted: no server listens with ssl, so it has no effect",
                    d.at()
                )),
                _ => self.other(d),
            }
        }
    }

    fn upstream(&mut self, d: &Directive, block: &[Directive]) {
        let Some(name) = d.args.first() else {
            return self.skip(d, "an upstream needs a name");
        };
        let mut up = RawUpstream::default();
        let mut backends = Vec::new();
        for s in block {
            match s.name.as_str() {
                "server" => {
                    let Some(address) = s.args.first() else {
                        continue;
                    };
                    let converted = match address.starts_with("unix:") {
                        true => unix_socket::server_address(address),
                        false => Ok(with_port(address)),
                    };
                    let converted = match converted {
                        Ok(a) => a,
                        Err(why) => {
                            self.skip(s, &why);
                            continue;
                        }
                    };
                    let mut backend = backend(converted);
                    let mut down = false;
                    let passive = &mut up.passive;
                    for param in &s.args[1..] {
                        let (key, value) = param.split_once('=').unwrap_or((param, ""));
                        match key {
                            "weight" => {
                                if let Ok(n) = value.parse() {
                                    backend.weight = spanned(n);
                                }
                            }
                            "max_conns" => backend.max_conns = value.parse().ok(),
                            "max_fails" => {
                                if let Ok(n) = value.parse() {
                                    passive.max_fails.get_or_insert(n);
                                }
                            }
                            "fail_timeout" => {
                                if let Some(t) = dur(value) {
                                    passive.fail_timeout.get_or_insert(spanned(t));
                                }
                            }
                            "backup" => backend.backup = Some(spanned(true)),
                            "down" => down = true,
                            _ => self.notes.push(format!(
                                "{}: server parameter {param} not converted",
                                s.at()
                            )),
                        }
                    }
                    if down {
                        self.notes.push(format!(
                            "{}: server {address} is marked down: left out (add it back, or drain it at run time with POST /backends/{address}/drain)",
                            s.at()
                        ));
                    } else {
                        backends.push(backend);
                    }
                }
                "least_conn" => up.algorithm = Some(spanned(Algorithm::LeastConn)),
                "ip_hash" => {
                    up.algorithm = Some(spanned(Algorithm::Hash));
                    up.hash = Some(spanned("client_ip".into()));
                    self.notes.push(format!(
                        "{}: ip_hash became hash = \"client_ip\": each client keeps one backend, but pinlb hashes the whole address (nginx the first three octets), so which backend differs from nginx's",
                        s.at()
                    ));
                }
                "hash" => match s.args.first().and_then(|k| hash_key(k)) {
                    Some(key) => {
                        self.notes.push(format!(
                            "{}: hash {} became hash = \"{key}\": each key keeps one backend, but pinlb hashes by rendezvous (always consistent; nginx's hash is a modulo unless `consistent`, then ketama), so which backend differs from nginx's",
                            s.at(),
                            s.args.join(" "),
                        ));
                        up.algorithm = Some(spanned(Algorithm::Hash));
                        up.hash = Some(spanned(key));
                    }
                    None => self.skip(
                        s,
                        "only $remote_addr, $request_uri, $http_NAME and $cookie_NAME keys convert",
                    ),
                },
                "random" => {
                    up.algorithm = Some(spanned(Algorithm::RandomTwo));
                    if s.args.first().map(String::as_str) != Some("two") {
                        self.notes.push(format!("{}: random became random_two (two random choices, fewer in flight wins)", s.at()));
                    }
                }
                "keepalive" => {
                    if let Some(n) = s.args.first().and_then(|n| n.parse().ok()) {
                        up.keepalive = n;
                    }
                }
                "sticky" => match sticky::convert(s, &mut self.notes) {
                    Ok(sticky) => up.sticky = Some(spanned(sticky)),
                    Err(why) => self.skip(s, &why),
                },
                _ => self.other(s),
            }
        }
        up.backends = Some(spanned(backends));
        self.upstreams.insert(name.clone(), up);
    }

    fn server(&mut self, d: &Directive, block: &[Directive], parent: &Inherited, ssl: &Ssl) {
        let ssl = ssl.level(block);
        let mut tls_addresses = Vec::new();
        let mut listen_http2 = false;
        let mut addresses = Vec::new();
        let mut names = Vec::new();
        let mut default = false;
        let mut locations = Vec::new();
        let inherit = parent.level(block);
        let (pages, served) = error_page::convert(&inherit.pages, block, &mut self.notes);
        // The server's own rewrite phase, before any location: its redirects, in order, and a
        // `return`, which answers every request so that no location is ever reached.
        let mut first: Vec<RawRoute> = Vec::new();
        let mut answers_all = false;
        let mut accepting = Accepting {
            from: proxy_protocol::from(block, &self.real_ip_from),
            ..Accepting::default()
        };
        let proxied = block
            .iter()
            .any(|s| s.name == "listen" && s.args.iter().skip(1).any(|a| a == "proxy_protocol"));
        for s in block {
            if proxy_protocol::real_ip(s, proxied, &mut self.notes) {
                continue;
            }
            match s.name.as_str() {
                "listen" => {
                    if let Some(a) = s.args.first() {
                        addresses.push(listen_address(a));
                        if s.args.iter().skip(1).any(|f| f == "ssl") {
                            tls_addresses.push(listen_address(a));
                        }
                    }
                    default |= s
                        .args
                        .iter()
                        .any(|a| a == "default_server" || a == "default");
                    for flag in s.args.iter().skip(1) {
                        let address = s.args.first().map(|a| listen_address(a));
                        let address = address.unwrap_or_default();
                        if proxy_protocol::listen_flag(&mut accepting, s, &address, flag) {
                            continue;
                        }
                        if flag == "http2" {
                            listen_http2 = true;
                        } else if !["ssl", "default_server", "default"].contains(&flag.as_str()) {
                            self.notes
                                .push(format!("{}: listen parameter {flag} not converted", s.at()));
                        }
                    }
                }
                "server_name" => {
                    for n in &s.args {
                        match n.as_str() {
                            "_" | "" => {}
                            n if n.starts_with('~') || n.contains('*') && !n.starts_with("*.") => {
                                self.notes.push(format!(
                                    "{}: server_name {n} not converted: routes match a name or *.suffix, not regexes or trailing wildcards",
                                    s.at()
                                ));
                            }
                            n => names.push(n.to_string()),
                        }
                    }
                }
                "location" => locations.push(s),
                "return" | "rewrite" if answers_all => self.unreached(
                    s,
                    "never reached: an earlier return or rewrite answers every request",
                ),
                "return" => {
                    if let Some(action) = self.return_action(s) {
                        let mut r = RawRoute {
                            path: Some(spanned("/".into())),
                            ..RawRoute::default()
                        };
                        action.set(&mut r);
                        first.push(r);
                        answers_all = true;
                    }
                }
                "rewrite" => match rewrite::convert(&s.args) {
                    Ok(rd) => {
                        let mut r = RawRoute::default();
                        match &rd.matches {
                            rewrite::Match::All => {
                                r.path = Some(spanned("/".into()));
                                answers_all = true;
                            }
                            rewrite::Match::Prefix(p) => r.path = Some(spanned(p.clone())),
                            rewrite::Match::Exact(p) => r.path_exact = Some(spanned(p.clone())),
                        }
                        r.redirect = Some(redirect_value(rd.status, rd.location));
                        if !first.iter().any(|earlier| route_covers(earlier, &r)) {
                            first.push(r);
                        }
                    }
                    Err(why) => self.skip(s, &why),
                },
                n if Inherited::NAMES.contains(&n) => {}
                n if super::buffering::NAMES.contains(&n) && s.block.is_none() => {}
                _ if super::fastcgi::inherited(s) => {}
                n if super::limits::NAMES.contains(&n) && s.block.is_none() => {}
                n if super::limit_rate::NAMES.contains(&n) && s.block.is_none() => {}
                n if super::cache::NAMES.contains(&n) && s.block.is_none() => {}
                _ if super::cache::is_status_header(s) => {}
                n if super::gzip::NAMES.contains(&n) && s.block.is_none() => {
                    super::gzip::note(s, &mut self.notes)
                }
                "client_max_body_size" => self.body_limit(s),
                // A FastCGI location's `fastcgi.root` (read through `Inherited`).
                "root" if block.iter().any(|l| l.name == "location" && super::fastcgi::passes(l.block.as_deref().unwrap_or_default())) => {}
                n if (Ssl::NAMES.contains(&n) || client_cert::NAMES.contains(&n))
                    && !tls_addresses.is_empty() => {}
                n if (is_ssl(n) || n == "http2") && n != "ssl" && !listens_tls(d) => self.notes.push(format!(
                    "{}: {n} not converted: the server does not listen with ssl, so it has no effect",
                    s.at()
                )),
                _ => self.other(s),
            }
        }
        for r in &mut first {
            self.access(&inherit, r);
        }
        if addresses.is_empty() {
            addresses.push("0.0.0.0:80".into());
        }
        let tls = match tls_addresses.is_empty() {
            true => None,
            false => self.server_tls(d, &ssl, tls_addresses, listen_http2),
        };
        // nginx matches `location = ...` first, then the longest prefix; see
        // [`Builder::precedence`] for the regexes.
        let mut routes: Vec<(u8, usize, RawRoute)> = Vec::new();
        let mut placed: Vec<&Directive> = Vec::new();
        let mut fronts: Vec<(&Directive, String)> = Vec::new();
        // Its locations left out, each with the 404 route of one that serves files.
        let mut left: Vec<(Left, Option<RawRoute>)> = Vec::new();
        self.mirrors = super::mirror::Targets::of(&locations);
        let targets: Vec<String> = self.mirrors.upstreams().map(str::to_string).collect();
        for upstream in targets {
            self.address_upstream(&upstream);
        }
        for l in locations {
            if self.mirrors.is_target(l) {
                self.notes.push(format!(
                    "{}: location {} serves only mirror subrequests: converted as the mirror's upstream, not a route (a request from outside for it takes the route that matches it, where nginx answers 404)",
                    l.at(),
                    l.args.last().map_or("", String::as_str)
                ));
                continue;
            }
            if answers_all {
                self.unreached(
                    l,
                    "never reached: the server's return or rewrite answers every request first",
                );
                continue;
            }
            if let Some(script) = super::fastcgi::front_controller(l) {
                fronts.push((l, script));
                continue;
            }
            let route = match self.location(l, &inherit) {
                Location::Route(route) => route,
                Location::Files(route, what) => {
                    let why = match served.contains(&l.line) {
                        true => "it serves error_page's file, which pinlb reads as the page".into(),
                        false => format!("it serves {what}"),
                    };
                    let Some(placed_route) =
                        self.place(l, route, &inherit, block, &first, &mut routes)
                    else {
                        continue;
                    };
                    placed.push(l);
                    left.push((Left::new(l, why), Some(placed_route)));
                    continue;
                }
                Location::Dropped(why) => {
                    left.push((Left::new(l, why), None));
                    continue;
                }
                Location::Gone => continue,
            };
            if self
                .place(l, route, &inherit, block, &first, &mut routes)
                .is_some()
            {
                placed.push(l);
            }
        }
        for (l, script) in fronts {
            if let Some(route) = self.front_controller(l, &script, &routes, &inherit) {
                let longest_first = usize::MAX - l.args.last().map_or(0, String::len);
                routes.push((3, longest_first, route));
                placed.push(l);
                continue;
            }
            // No location of the server runs the script: nginx serves the location's files.
            let Location::Files(route, what) = self.location(l, &inherit) else {
                continue;
            };
            let why =
                format!("it serves {what}, and no FastCGI location of the server runs {script}");
            if let Some(placed_route) = self.place(l, route, &inherit, block, &first, &mut routes) {
                placed.push(l);
                left.push((Left::new(l, why), Some(placed_route)));
            }
        }
        self.precedence(&mut routes, &placed);
        // nginx answers a request for a proxying prefix location's path without its slash
        // (`/api` for `location /api/`) with 301 to the path with it, unless an exact location
        // takes that path.
        let mut slash = Vec::new();
        for (_, _, r) in &routes {
            let Some(prefix) = text(&r.path) else {
                continue;
            };
            let Some(bare) = prefix.strip_suffix('/').filter(|b| !b.is_empty()) else {
                continue;
            };
            let taken = (routes.iter()).any(|(_, _, o)| text(&o.path_exact) == Some(bare));
            if r.upstream.is_none() || taken {
                continue;
            }
            let t = RawRoute {
                path_exact: Some(spanned(bare.to_string())),
                // nginx appends the query, when there is one.
                redirect: Some(redirect_value(
                    301,
                    format!(
                        "{}/{{is_args}}{{query}}",
                        bare.replace('{', "{{").replace('}', "}}")
                    ),
                )),
                ..RawRoute::default()
            };
            if !first.iter().any(|earlier| route_covers(earlier, &t)) {
                slash.push((0, 0, t));
            }
        }
        routes.extend(slash);
        routes.sort_by_key(|(rank, len, _)| (*rank, *len));
        let routes: Vec<RawRoute> = first
            .into_iter()
            .chain(routes.into_iter().map(|(_, _, r)| r))
            .collect();
        // A 404 route that precedence refused is gone, and its location noted as refused.
        let left: Vec<Left> = (left.into_iter())
            .filter_map(|(mut l, route)| match route {
                None => Some(l),
                Some(r) => {
                    l.route = Some(routes.iter().position(|x| *x == r)?);
                    Some(l)
                }
            })
            .collect();
        let conn_limit =
            super::limits::conn_limit(&inherit.limits, &self.conn_zones, &mut self.refused);
        for address in addresses {
            let server = Server {
                names: names.clone(),
                default,
                routes: routes.clone(),
                redirects: inherit.redirects,
                at: d.at(),
                tls: tls.clone(),
                pages: pages.clone(),
                conn_limit,
                accepting: accepting.clone(),
                left: left.clone(),
            };
            match self.listeners.iter_mut().find(|(a, _)| *a == address) {
                Some((_, servers)) => servers.push(server),
                None => self.listeners.push((address, vec![server])),
            }
        }
    }

    /// Location `l`'s route, its own error pages written, ranked into `routes` as nginx's
    /// precedence orders it ([`Builder::precedence`]); a copy of what was placed, or `None`
    /// (noted) when a server-level rewrite (`first`) answers all it would get.
    fn place(
        &mut self,
        l: &Directive,
        mut route: RawRoute,
        inherit: &Inherited,
        server: &[Directive],
        first: &[RawRoute],
        routes: &mut Vec<(u8, usize, RawRoute)>,
    ) -> Option<RawRoute> {
        let own = l.block.as_deref().unwrap_or_default();
        if error_page::Inherit::own(own) {
            let level = inherit.level(own).pages;
            error_page::convert(&level, server, &mut self.notes)
                .0
                .write(&mut route.modules.error_pages, true);
        }
        if first.iter().any(|earlier| route_covers(earlier, &route)) {
            self.unreached(
                l,
                "never reached: a server-level rewrite answers every request it would get",
            );
            return None;
        }
        let longest_first = usize::MAX - l.args.last().map_or(0, String::len);
        let (rank, len) = match l.args.first().map(String::as_str) {
            Some("=") => (0, 0),
            Some("^~") => (1, longest_first),
            Some("~" | "~*") => (2, routes.len()),
            _ => (3, longest_first),
        };
        routes.push((rank, len, route.clone()));
        Some(route)
    }

    /// nginx's location precedence as pinlb's first-match order, for `routes` ranked by
    /// [`Builder::server`] (0 `=`, 1 `^~`, 2 regex in file order, 3 prefix; `placed[i]` is
    /// route i's location): nginx takes an exact match, else the longest prefix if it is `^~`,
    /// else the first regex that matches, else the longest prefix. In first-match order that
    /// is: exact, `^~` prefixes longest first, regexes, the other prefixes longest first. Without
    /// regexes a `^~` is a plain prefix. A plain prefix under a `^~` one (`/static/img/` under
    /// `^~ /static/`) can't be placed both before the `^~` (it is longer) and after the regexes
    /// (it is plain): it is refused, not converted to something else.
    fn precedence(&mut self, routes: &mut Vec<(u8, usize, RawRoute)>, placed: &[&Directive]) {
        if !routes.iter().any(|(rank, _, _)| *rank == 2) {
            for (rank, _, _) in routes.iter_mut() {
                if *rank == 1 {
                    *rank = 3;
                }
            }
            return;
        }
        let path = |r: &RawRoute| text(&r.path).map(str::to_string);
        let stops: Vec<(String, String)> = (routes.iter().zip(placed))
            .filter(|((rank, _, _), _)| *rank == 1)
            .filter_map(|((_, _, r), l)| Some((path(r)?, l.at())))
            .collect();
        let mut keep = Vec::with_capacity(routes.len());
        for ((rank, len, r), l) in routes.drain(..).zip(placed) {
            let under = path(&r).filter(|_| rank == 3).and_then(|q| {
                stops
                    .iter()
                    .find(|(p, _)| q.len() > p.len() && q.starts_with(p.as_str()))
            });
            match under {
                Some((p, at)) => self.refused.push(format!(
                    "{}: location {} not converted: it lies under location ^~ {p} ({at}), and with regex locations in the server pinlb's first-match routes can't put it before the ^~ one (it is longer) and after the regexes (it is a plain prefix) as nginx's precedence does; without it pinlb answers its requests as the ^~ location",
                    l.at(),
                    l.args.join(" ")
                )),
                None => keep.push((rank, len, r)),
            }
        }
        *routes = keep;
    }

    /// `limits.max_body`: the one limit every server has (its own `client_max_body_size`, else
    /// `http`'s, else nginx's default 1m), or `http`'s where they differ; pinlb's is one for the
    /// process. Each directive is then held against it by [`Builder::body_limit`].
    fn body_limits(&mut self, http: &[Directive]) {
        let own = |block: &[Directive]| {
            block
                .iter()
                .rfind(|d| d.name == "client_max_body_size" && d.block.is_none())
                .and_then(|d| d.args.first())
                .and_then(|s| size(s))
        };
        let in_http = own(http).unwrap_or(1 << 20);
        let servers: Vec<u64> = http
            .iter()
            .filter(|d| d.name == "server")
            .map(|d| own(d.block.as_deref().unwrap_or_default()).unwrap_or(in_http))
            .collect();
        self.max_body = match servers.split_first() {
            Some((first, rest)) if rest.iter().all(|v| v == first) => *first,
            _ => in_http,
        };
        self.limits.max_body = Some(spanned(Size(self.max_body)));
    }

    /// A `client_max_body_size` against pinlb's one limit: refused where it is smaller (pinlb
    /// would take bodies nginx answers 413), noted where it is larger.
    fn body_limit(&mut self, d: &Directive) {
        let Some(v) = d.args.first().and_then(|s| size(s)) else {
            return self.skip(d, "not a size");
        };
        let unlimited = |n: u64| if n == 0 { u64::MAX } else { n };
        let (mine, pinlb) = (unlimited(v), unlimited(self.max_body));
        let written = d.args.join(" ");
        let limit = match self.max_body {
            0 => "unlimited".to_string(),
            n => format!("{n} bytes"),
        };
        if mine < pinlb {
            self.refused.push(format!(
                "{}: client_max_body_size {written} not converted: pinlb's limits.max_body is one for the process ({limit}); without it pinlb takes bodies nginx refuses (413)",
                d.at()
            ));
        } else if mine > pinlb {
            self.notes.push(format!(
                "{}: client_max_body_size {written}: pinlb's limits.max_body is one for the process ({limit}), so pinlb answers 413 to bodies nginx takes here",
                d.at()
            ));
        }
    }

    /// `access_log PATH [FORMAT] ...` at `http` level as `[log]`: its path, and pinlb's format
    /// nearest FORMAT (`json` for a JSON one, else `combined`), with a note naming FORMAT's
    /// fields pinlb's lines don't carry. `off` writes none.
    fn access_log(&mut self, d: &Directive, http: &[Directive]) {
        let Some(path) = d.args.first() else {
            return self.skip(d, "it needs a path");
        };
        if path == "off" {
            return;
        }
        if self.log.access.is_some() {
            return self.skip(d, "pinlb writes one access log; the first access_log is it");
        }
        if path.starts_with("syslog:") || path.contains('$') {
            return self.skip(
                d,
                "pinlb writes to a file or stdout, named without variables",
            );
        }
        let name = d.args.get(1).filter(|a| !a.contains('='));
        let params: Vec<&str> = d.args[1 + usize::from(name.is_some())..]
            .iter()
            .map(String::as_str)
            .collect();
        let format = name.and_then(|n| {
            http.iter()
                .find(|f| f.name == "log_format" && f.args.first() == Some(n))
        });
        let (pinlb_format, carried): (&str, &[&str]) = match format {
            Some(f)
                if f.args.iter().any(|a| a == "escape=json")
                    || f.args
                        .get(1)
                        .is_some_and(|a| a.trim_start().starts_with('{')) =>
            {
                ("json", &JSON_FIELDS)
            }
            _ => ("combined", &COMBINED_FIELDS),
        };
        let target = match path.as_str() {
            "/dev/stdout" => "stdout".to_string(),
            p => super::values::conf_path(d, p),
        };
        self.log.access = Some(spanned(target));
        let mut lost = Vec::new();
        // A line format of nginx's own (not JSON) becomes a template of the same fields.
        let template = format
            .filter(|_| pinlb_format == "combined")
            .map(|f| log_template(&f.args[1..], &mut lost));
        let pinlb_format = match &template {
            Some(_) => "template",
            None => pinlb_format,
        };
        self.log.format = Some(spanned(template.unwrap_or_else(|| pinlb_format.into())));
        match (name.map(String::as_str), format) {
            (None | Some("combined"), _) => {}
            (Some(n), None) => {
                return self.notes.push(format!(
                    "{}: access_log {}: no log_format {n} in http: pinlb's {pinlb_format} format",
                    d.at(),
                    d.args.join(" ")
                ));
            }
            (Some(_), Some(_)) if pinlb_format == "template" => {}
            (Some(_), Some(f)) => {
                for v in variables(&f.args[1..].join(" ")) {
                    if !carried.contains(&v.as_str()) && !lost.contains(&format!("${v}")) {
                        lost.push(format!("${v}"));
                    }
                }
            }
        }
        let mut why = Vec::new();
        if !lost.is_empty() {
            why.push(format!("without {}", lost.join(", ")));
        }
        if !params.is_empty() {
            why.push(format!("{} not converted", params.join(" ")));
        }
        if !why.is_empty() {
            self.notes.push(format!(
                "{}: access_log {}: pinlb's {pinlb_format} format, {}",
                d.at(),
                d.args.join(" "),
                why.join("; ")
            ));
        }
    }

    /// A server's TLS as pinlb's: its certificate pairs, checked; `None` when they can't be
    /// (refused: pinlb would serve plain HTTP, or another certificate, where nginx serves TLS).
    fn server_tls(
        &mut self,
        d: &Directive,
        ssl: &Ssl,
        addresses: Vec<String>,
        listen_http2: bool,
    ) -> Option<ServerTls> {
        let refuse = |b: &mut Builder, at: String, why: &str| {
            b.refused.push(format!(
                "{at}: listen ... ssl not converted: {why}; without it pinlb serves plain HTTP where nginx serves TLS"
            ));
        };
        if let Some(p) = &ssl.protocols {
            super::values::ssl_protocols(p, &mut self.notes, &mut self.refused);
        }
        if ssl.certs.is_empty() {
            refuse(self, d.at(), "the server has no ssl_certificate");
            return None;
        }
        if ssl.certs.len() != ssl.keys.len() {
            refuse(
                self,
                d.at(),
                "each ssl_certificate needs its ssl_certificate_key, in the same order",
            );
            return None;
        }
        let mut certificates = Vec::new();
        for (c, k) in ssl.certs.iter().zip(&ssl.keys) {
            let (Some(cert), Some(key)) = (c.args.first(), k.args.first()) else {
                refuse(
                    self,
                    c.at(),
                    "ssl_certificate and ssl_certificate_key need a file",
                );
                return None;
            };
            if cert.contains('$') || key.contains('$') || key.starts_with("data:") {
                refuse(
                    self,
                    c.at(),
                    "a certificate named by variables or given inline is not a file pinlb can read",
                );
                return None;
            }
            certificates.push((
                super::values::conf_path(c, cert),
                super::values::conf_path(k, key),
            ));
        }
        let client =
            (ssl.client).convert(super::values::conf_path, &mut self.notes, &mut self.refused);
        Some(ServerTls {
            addresses,
            certificates,
            http2: listen_http2 || ssl.http2 == Some(true),
            client,
        })
    }

    /// `return`'s action: `("redirect", ...)` or `("respond", ...)`; `None` (noted) for one
    /// pinlb has no equivalent for.
    fn return_action(&mut self, d: &Directive) -> Option<Action> {
        let code = d.args.first().and_then(|c| c.parse::<u16>().ok());
        match (code, d.args.get(1), d.args.first()) {
            (Some(444), _, _) => {
                self.skip(
                    d,
                    "444 closes the connection without an answer, which a route can't do",
                );
                None
            }
            (Some(c @ (301 | 302 | 303 | 307 | 308)), Some(url), _) => match template(url) {
                Some(t) => Some(Action::Redirect(redirect_value(c, t))),
                None => {
                    self.skip(d, "its URL uses a variable pinlb has no equivalent for");
                    None
                }
            },
            (Some(c), body, _) => {
                if body.is_some_and(|b| b.contains('$')) {
                    self.skip(d, "its text uses variables; a fixed answer's body is fixed");
                    return None;
                }
                Some(Action::Respond(respond(c, body.cloned())))
            }
            (None, _, Some(url)) => match template(url) {
                Some(t) => Some(Action::Redirect(redirect_value(302, t))),
                None => {
                    self.skip(d, "its URL uses a variable pinlb has no equivalent for");
                    None
                }
            },
            _ => {
                self.skip(d, "return without a code");
                None
            }
        }
    }

    /// One `location` as a route without its host, or what else it becomes ([`Location`]).
    fn location(&mut self, l: &Directive, parent: &Inherited) -> Location {
        let mut route = RawRoute::default();
        let block = l.block.as_deref().unwrap_or_default();
        let exact = match l.args.as_slice() {
            [modifier, path] if modifier == "=" => {
                route.path_exact = Some(spanned(path.clone()));
                true
            }
            [modifier, path] if modifier == "^~" => {
                route.path = Some(spanned(path.clone()));
                false
            }
            [path] if path.starts_with('/') => {
                route.path = Some(spanned(path.clone()));
                false
            }
            [modifier, re] if modifier == "~" || modifier == "~*" => {
                // nginx's `~*` ignores case; pinlb's regex says so itself.
                let pattern = match modifier.as_str() {
                    "~*" => format!("(?i){re}"),
                    _ => re.clone(),
                };
                if let Err(e) = regex::bytes::Regex::new(&pattern) {
                    let e = e.to_string();
                    let why = e.lines().last().unwrap_or_default().trim();
                    let why = why.strip_prefix("error: ").unwrap_or(why);
                    self.skip(
                        l,
                        &format!("its regular expression is not one pinlb's engine takes ({why}; no look-around or backreferences)"),
                    );
                    return Location::Gone;
                }
                route.path_regex = Some(spanned(pattern));
                false
            }
            _ => {
                self.skip(
                    l,
                    "only exact (=), prefix and regex (~, ~*) locations convert; named (@) ones don't",
                );
                return Location::Gone;
            }
        };
        let fastcgi = super::fastcgi::passes(block);
        let inherit = parent.level(block);
        super::limits::location_conns(block, &mut self.refused);
        let mut proxy_at = None;
        let mut action: Option<Action> = None;
        // What no arm converts: noted after the loop, or, in a location that serves files,
        // named in its one note (they shape the file's answer, which pinlb does not send).
        let mut others = Vec::new();
        for d in block {
            match d.name.as_str() {
                // The rewrite phase runs before the content phase: a redirect or return decides
                // before proxy_pass would.
                "rewrite" | "return" if action.is_some() => self.unreached(
                    d,
                    "never reached: an earlier return or rewrite answers first",
                ),
                "rewrite" => match rewrite::convert(&d.args) {
                    Ok(rd) if rd.matches == rewrite::Match::All => {
                        action = Some(Action::Redirect(redirect_value(rd.status, rd.location)));
                    }
                    Ok(_) => self.skip(
                        d,
                        "inside a location only a rewrite of every path (^, ^(.*)$) converts; pinlb does what the rest of the location says for the requests nginx would redirect",
                    ),
                    Err(why) => self.skip(
                        d,
                        &format!("{why}; pinlb does what the rest of the location says for the requests nginx would redirect"),
                    ),
                },
                "return" => action = self.return_action(d),
                "fastcgi_pass" => match self.fastcgi_pass(d, &inherit) {
                    Ok(name) => {
                        route.upstream = Some(spanned(name));
                        proxy_at = Some(d);
                    }
                    Err(why) => {
                        let why = match why.starts_with(&d.file.display().to_string()) {
                            true => why,
                            false => format!("{}: fastcgi_pass not converted: {why}", d.at()),
                        };
                        self.refused.push(format!(
                            "{why}; without it pinlb does not run the location's scripts as nginx does"
                        ));
                        return Location::Gone;
                    }
                },
                n if fastcgi && super::fastcgi::NAMES.contains(&n) => {}
                "try_files" if fastcgi => {}
                "include"
                    if fastcgi
                        && d.args
                            .first()
                            .is_some_and(|a| super::parse::is_standard_include(a)) => {}
                n if Inherited::NAMES.contains(&n) || super::buffering::NAMES.contains(&n) => {}
                n if n.starts_with("fastcgi_") && FASTCGI_TUNING.contains(&n) => self.skip(
                    d,
                    "pinlb's buffers are its own ([upstream.NAME.buffering] bounds them)",
                ),
                n if n.starts_with("fastcgi_") => self.refused.push(format!(
                    "{}: {n} not converted: no pinlb equivalent; without it pinlb answers other than nginx does",
                    d.at()
                )),
                "proxy_pass" => {
                    let Some((upstream, uri)) = d.args.first().and_then(|u| proxy_target(u)) else {
                        self.skip(d, "only http:// targets without variables convert");
                        continue;
                    };
                    let protocol = (self.upstreams.get(&upstream))
                        .and_then(|u| u.protocol.as_ref())
                        .map(|p| *p.get_ref());
                    if protocol == Some(Protocol::Fastcgi) {
                        self.skip(
                            d,
                            "its upstream is a FastCGI location's too, and pinlb speaks one protocol per upstream",
                        );
                        continue;
                    }
                    self.http_upstreams.insert(upstream.clone());
                    if exact && uri.is_some() {
                        self.skip(
                            d,
                            "a URI part replaces an exact location's path, which a route's rewrite_prefix (prefix routes only) can't",
                        );
                        continue;
                    }
                    self.address_upstream(&upstream);
                    route.upstream = Some(spanned(upstream.clone()));
                    if let Some(uri) = uri {
                        route.rewrite_prefix = Some(spanned(uri));
                    }
                    proxy_at = Some(d);
                }
                "client_max_body_size" => self.body_limit(d),
                "proxy_next_upstream"
                | "proxy_next_upstream_tries"
                | "proxy_next_upstream_timeout" => {
                    self.next_upstream(d, &route);
                }
                n if Inherited::NAMES.contains(&n) => {}
                n if super::buffering::NAMES.contains(&n) && d.block.is_none() => {}
                n if super::limits::NAMES.contains(&n) && d.block.is_none() => {}
                n if super::limit_rate::NAMES.contains(&n) && d.block.is_none() => {}
                n if super::cache::NAMES.contains(&n) && d.block.is_none() => {}
                _ if super::cache::is_status_header(d) => {}
                n if super::mirror::NAMES.contains(&n) => {}
                n if super::gzip::NAMES.contains(&n) && d.block.is_none() => {
                    super::gzip::note(d, &mut self.notes)
                }
                _ => others.push(d),
            }
        }
        if action.is_none() && proxy_at.is_none() && files::serves_files(block) {
            return self.files(l, route, &inherit, &others);
        }
        for d in others {
            self.other(d);
        }
        if let Some(action) = action {
            route.upstream = None;
            route.rewrite_prefix = None;
            action.set(&mut route);
            self.access(&inherit, &mut route);
            return Location::Route(route);
        }
        let Some(proxy) = proxy_at else {
            let content = (block.iter())
                .filter(|d| files::answers(d))
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            return Location::Dropped(format!(
                "what answers its requests ({content}) did not convert"
            ));
        };
        if let Some((name, up)) = text(&route.upstream).and_then(|n| {
            let up = self.upstreams.get_mut(n)?;
            Some((n, up))
        }) {
            let file = (self.conf_dir.as_path(), size as fn(&str) -> Option<u64>);
            let decided = &mut self.buffered;
            super::buffering::apply(
                if fastcgi { "fastcgi" } else { "proxy" },
                &inherit.buffering,
                (name, up),
                decided,
                proxy,
                file,
                &mut self.notes,
            );
        }
        let mut set = BTreeMap::new();
        let mut remove = Vec::new();
        // nginx sends no proxy_set_header lines to a FastCGI server (and no Host of its own).
        let mut host_set = fastcgi;
        let headers = inherit.headers.iter().flatten().filter(|_| !fastcgi);
        for h in headers {
            match (h.args.first(), h.args.get(1)) {
                (Some(name), Some(value)) => {
                    host_set |= name.eq_ignore_ascii_case("host");
                    self.set_header(h, name, value, &mut set, &mut remove);
                }
                _ => self.skip(h, "expected a name and a value"),
            }
        }
        if !host_set {
            self.notes.push(format!(
                "{}: proxy_pass: nginx sends Host: $proxy_host (the upstream's name) unless proxy_set_header sets it; pinlb sends the client's Host",
                proxy.at()
            ));
        }
        if !set.is_empty() || !remove.is_empty() {
            let rules = header_rules::Raw {
                set,
                add: BTreeMap::new(),
                remove,
            };
            route.modules.request_headers.request_headers = Some(spanned(rules));
        }
        let mut timeouts = RawRouteTimeouts::default();
        let kind = if fastcgi { "fastcgi_" } else { "proxy_" };
        for t in inherit.timeouts.iter().filter(|t| t.name.starts_with(kind)) {
            let key = match &t.name[kind.len()..] {
                "connect_timeout" => &mut timeouts.connect,
                "read_timeout" => &mut timeouts.response,
                _ => &mut timeouts.send,
            };
            match t.args.first().and_then(|v| dur(v)) {
                Some(v) => *key = Some(spanned(v)),
                None => self.skip(t, "not a duration"),
            }
        }
        if timeouts != RawRouteTimeouts::default() {
            route.timeouts = Some(timeouts);
        }
        self.access(&inherit, &mut route);
        super::limits::route(
            &inherit.limits,
            &self.limit_zones,
            &mut route,
            &mut self.refused,
        );
        super::gzip::route(&inherit.gzip, &mut route, &mut self.notes, size);
        super::limit_rate::route(&inherit.limit_rate, &mut route, &mut self.notes, size);
        super::cache::route(
            &inherit.cache,
            &mut route,
            (&mut self.notes, &mut self.refused),
        );
        if let Err((d, why)) = self.mirrors.route(block, &mut route) {
            self.skip(d, &why);
        }
        Location::Route(route)
    }

    /// `upstream`, when no `upstream {}` block has that name: a plain address, made an
    /// upstream of one backend named after it.
    fn address_upstream(&mut self, upstream: &str) {
        if !self.upstreams.contains_key(upstream) {
            (self.upstreams).insert(upstream.to_string(), one_backend(upstream));
        }
    }

    /// A location that serves files ([`files`]) as a route (`route` holds its path) that
    /// answers 404 after its access rules and rate limits, which nginx checks before it looks
    /// for the file; `others`, the directives it holds that no arm converts, are named in
    /// what it serves instead of noted one by one (they shape the file's answer).
    fn files(
        &mut self,
        l: &Directive,
        mut route: RawRoute,
        inherit: &Inherited,
        others: &[&Directive],
    ) -> Location {
        let block = l.block.as_deref().unwrap_or_default();
        // Before `respond`, so that access notes no `return` answered before it.
        self.access(inherit, &mut route);
        super::limits::route(
            &inherit.limits,
            &self.limit_zones,
            &mut route,
            &mut self.refused,
        );
        route.respond = Some(files::respond());
        let alias = block.iter().find(|d| d.name == "alias");
        let mut what = match (alias, inherit.pages.root()) {
            (Some(a), _) => format!("files from alias {}", a.args.join(" ")),
            (None, Some(root)) => format!("files from {root}"),
            (None, None) => "files".to_string(),
        };
        let also: Vec<&str> = (others.iter())
            .filter(|d| !["root", "alias"].contains(&d.name.as_str()))
            .filter(|d| self.known.directive(d) != Matched::Same)
            .map(|d| d.name.as_str())
            .collect();
        if !also.is_empty() {
            what = format!("{what} (with {})", also.join(", "));
        }
        Location::Files(route, what)
    }

    /// A front controller's `location` ([`super::fastcgi::front_controller`]) as a route to
    /// the FastCGI upstream of the server's location that runs `script`, with `script` set;
    /// `None` when no location of the server does (it then serves files, as in nginx).
    fn front_controller(
        &mut self,
        l: &Directive,
        script: &str,
        routes: &[(u8, usize, RawRoute)],
        parent: &Inherited,
    ) -> Option<RawRoute> {
        let runs = |r: &RawRoute| {
            let re = text(&r.path_regex)?;
            let up = text(&r.upstream)?.to_string();
            let matches = regex::bytes::Regex::new(re)
                .ok()?
                .is_match(script.as_bytes());
            let fastcgi = self.upstreams.get(&up)?.fastcgi.as_ref()?.get_ref().clone();
            matches.then_some((up, fastcgi))
        };
        let (base, mut fastcgi) = routes.iter().find_map(|(_, _, r)| runs(r))?;
        fastcgi.script = Some(spanned(script.into()));
        let base = base.split('#').next().unwrap_or(&base).to_string();
        let name = super::fastcgi::upstream_name(&base, &fastcgi, &self.upstreams);
        if !self.upstreams.contains_key(&name) {
            let mut up = self.upstreams.get(&base).cloned().unwrap_or_default();
            up.fastcgi = Some(spanned(fastcgi));
            self.upstreams.insert(name.clone(), up);
        }
        let try_files = l.block.as_deref().unwrap_or_default().first();
        self.notes.push(format!(
            "{}: try_files {} became a route to upstream {name} with script = \"{script}\": every request under {} runs {script} (REQUEST_URI the client's, as after nginx's try_files); pinlb serves no files, so a file or directory nginx would send as it is runs {script} too",
            try_files.map_or(l.at(), Directive::at),
            try_files.map(|t| t.args.join(" ")).unwrap_or_default(),
            l.args.join(" "),
        ));
        let mut route = RawRoute {
            path: Some(spanned(l.args.join(""))),
            upstream: Some(spanned(name)),
            ..RawRoute::default()
        };
        self.access(
            &parent.level(l.block.as_deref().unwrap_or_default()),
            &mut route,
        );
        Some(route)
    }

    /// A `fastcgi_pass`: the name of the upstream with `protocol = "fastcgi"` it becomes, made
    /// or found ([`super::fastcgi`]); why not, for one that can't convert.
    fn fastcgi_pass(&mut self, d: &Directive, inherit: &Inherited) -> Result<String, String> {
        let Some(address) = d.args.first() else {
            return Err("expected an address".into());
        };
        let table = super::fastcgi::table(&inherit.fastcgi, inherit.pages.root(), &mut self.notes)?;
        let at = super::fastcgi::backend(address)?;
        let named = at.is_none();
        let (base, mut up) = match at {
            Some(address) => {
                let up = upstream_at(address.clone());
                (address, up)
            }
            None => match self.upstreams.get(address) {
                _ if self.http_upstreams.contains(address) => {
                    return Err(format!(
                        "upstream {address} is proxied to over HTTP too (proxy_pass), and pinlb speaks one protocol per upstream"
                    ));
                }
                Some(up) => {
                    let mut up = up.clone();
                    up.fastcgi = None;
                    (address.clone(), up)
                }
                None => {
                    return Err(format!(
                        "no upstream {address}, and it is not an address with a port"
                    ));
                }
            },
        };
        // An upstream block is the FastCGI one itself, unless a location made it so with
        // another table already.
        let unclaimed = named && (self.upstreams.get(&base)).is_some_and(|u| u.fastcgi.is_none());
        let name = match unclaimed {
            true => base,
            false => super::fastcgi::upstream_name(&base, &table, &self.upstreams),
        };
        if self
            .upstreams
            .get(&name)
            .is_none_or(|u| u.fastcgi.is_none())
        {
            up.protocol = Some(spanned(Protocol::Fastcgi));
            up.fastcgi = Some(spanned(table));
            self.upstreams.insert(name.clone(), up);
        }
        let note = format!(
            "{}: fastcgi_pass: {}",
            d.at(),
            super::fastcgi::STANDARD_NOTE
        );
        if !self
            .notes
            .iter()
            .any(|n| n.ends_with(super::fastcgi::STANDARD_NOTE))
        {
            self.notes.push(note);
        }
        Ok(name)
    }

    fn set_header(
        &mut self,
        d: &Directive,
        name: &str,
        value: &str,
        set: &mut BTreeMap<String, Spanned<String>>,
        remove: &mut Vec<Spanned<String>>,
    ) {
        let lower = name.to_ascii_lowercase();
        if self.known.header(&lower, value) {
            return;
        }
        let managed = match (lower.as_str(), value) {
            ("host", "$http_host") => Some("pinlb sends Host as the client sent it".to_string()),
            ("host", "$host") => Some(
                "pinlb sends Host as the client sent it, with its port if it had one ($host drops the port)".into(),
            ),
            ("host", v) => Some(format!(
                "pinlb always sends the client's Host, not {v}"
            )),
            ("x-forwarded-for", "$proxy_add_x_forwarded_for") => Some(
                "pinlb sets it to the client's address (appended to the client's own only for [forwarded] trusted clients)".into(),
            ),
            ("x-forwarded-proto", "$scheme") => Some("pinlb sends X-Forwarded-Proto itself".into()),
            ("upgrade", "$http_upgrade") | ("connection", _) => {
                Some("pinlb passes upgrades (WebSocket) on by default and manages Connection".into())
            }
            (n, _) if MANAGED.contains(&n) || pinlb::http1::hop::Hop::of(n.as_bytes()).is_some() => {
                Some("pinlb writes this header itself".into())
            }
            _ => None,
        };
        if let Some(why) = managed {
            self.notes.push(format!(
                "{}: proxy_set_header {name} {value}: nothing to convert, {why}",
                d.at()
            ));
            return;
        }
        if value.is_empty() {
            // nginx sends no such header at all.
            remove.push(spanned(name.to_string()));
            return;
        }
        if let Some(field) = client_cert::header_field(value) {
            let header = field.of(&mut self.client_cert_headers);
            header.get_or_insert_with(|| spanned(name.to_string()));
            return;
        }
        match template(value) {
            Some(t) => {
                set.insert(name.to_string(), spanned(t));
            }
            None => self.skip(d, "its value uses a variable pinlb has no equivalent for"),
        }
    }

    /// `proxy_next_upstream*` apply to the upstream the location proxies to.
    fn next_upstream(&mut self, d: &Directive, route: &RawRoute) {
        let Some(name) = text(&route.upstream) else {
            return self.skip(d, "put it after proxy_pass to convert it");
        };
        let Some(up) = self.upstreams.get_mut(name) else {
            return;
        };
        let retry = &mut up.retry;
        match d.name.as_str() {
            "proxy_next_upstream_tries" => {
                if let Some(n) = d.args.first().and_then(|n| n.parse().ok()) {
                    retry.tries = Some(n);
                }
            }
            "proxy_next_upstream_timeout" => {
                if let Some(t) = (d.args.first())
                    .and_then(|t| dur(t))
                    .filter(|t| !t.0.is_zero())
                {
                    retry.timeout = Some(spanned(t));
                }
            }
            _ => {
                if d.args.iter().any(|a| a == "off") {
                    retry.tries = Some(1);
                }
                if d.args.iter().any(|a| a == "non_idempotent") {
                    retry.non_idempotent = Some(true);
                }
                // The conditions, nginx's names: `retry.on` takes them as they are.
                let on = (d.args.iter())
                    .filter(|a| {
                        matches!(a.as_str(), "error" | "timeout" | "invalid_header")
                            || a.strip_prefix("http_")
                                .is_some_and(|n| n.parse::<u16>().is_ok())
                    })
                    .map(|a| spanned(a.clone()))
                    .collect();
                if !d.args.iter().any(|a| a == "off") {
                    retry.on = Some(spanned(on));
                }
            }
        }
    }

    /// The notes on `s`'s locations left out ([`files`]), where its routes are pinlb's: a
    /// location that serves files answers 404, and the note names the route that would take
    /// its requests without that 404 (the choice the reader has); one whose content did not
    /// convert names the route that takes them.
    fn left_heard(&mut self, s: &Server, catch_all: &Server) {
        for l in &s.left {
            let is_root = |i: usize| s.routes.get(i).and_then(|r| text(&r.path)) == Some("/");
            let others_whole = (0..s.routes.len()).any(|i| Some(i) != l.route && is_root(i));
            let nothing = "no route, so pinlb answers 404";
            // As [`Builder::finish`] writes a named server's routes: a 404 for its other paths
            // unless a route takes every path; without one, the default server's routes.
            let otherwise = match (std::ptr::eq(s, catch_all), l.route.is_some_and(is_root)) {
                (true, _) => nothing.to_string(),
                (false, true) if !others_whole => l.destination(&catch_all.routes, None, nothing),
                (false, _) => format!(
                    "the 404 pinlb answers for the paths of {} that no location takes",
                    s.names.join(" ")
                ),
            };
            let to = l.destination(&s.routes, l.route, &otherwise);
            let Some(i) = l.route else {
                self.skip(&l.location, &format!("{}; its requests go to {to}", l.why));
                continue;
            };
            let own = (s.routes.get(i)).map(files::describe).unwrap_or_default();
            self.notes.push(format!(
                "{}: {} not converted: {}, and pinlb serves no files: pinlb answers its requests 404 ({own}). If the backend serves these paths, delete that route: they then go to {to}",
                l.location.at(),
                l.name(),
                l.why
            ));
        }
    }

    /// The notes on `s`'s locations left out ([`files`]), where `s` is not converted.
    fn left_unheard(&mut self, s: &Server) {
        for l in &s.left {
            match l.route {
                Some(_) => self.notes.push(format!(
                    "{}: {} not converted: {}, and pinlb serves no files",
                    l.location.at(),
                    l.name(),
                    l.why
                )),
                None => self.skip(&l.location, &l.why),
            }
        }
    }

    fn finish(mut self) -> Converted {
        let typed = RawConfig {
            runtime: std::mem::take(&mut self.runtime),
            limits: std::mem::take(&mut self.limits),
            limit: std::mem::take(&mut self.limit_zones),
            cache: std::mem::take(&mut self.cache_zones),
            log: std::mem::take(&mut self.log),
            ..RawConfig::default()
        };
        let mut listeners = Vec::new();
        let mut anything = false;
        for (address, mut servers) in std::mem::take(&mut self.listeners) {
            if !servers.iter().any(Server::answers) {
                for s in &servers {
                    self.left_unheard(s);
                    self.notes.push(format!(
                        "{}: server on {address} not converted: it only serves files (pinlb serves no files), so pinlb does not listen there",
                        s.at
                    ));
                }
                continue;
            }
            anything = true;
            let port = address
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(80);
            for s in &mut servers {
                for r in &mut s.routes {
                    absolute_redirect(r, s.redirects, port);
                }
            }
            let conn_limit = servers[0].conn_limit;
            if let Some(other) = servers.iter().find(|s| s.conn_limit != conn_limit) {
                self.refused.push(format!(
                    "{}: limit_conn not converted: the servers on {address} limit connections differently, and pinlb's conn_limit is one per listener; without it pinlb lets through what nginx limits",
                    other.at
                ));
            }
            // The default server: the one marked so, else the first, as nginx picks it.
            let default = servers.iter().position(|s| s.default).unwrap_or(0);
            let catch_all = servers.remove(default);
            for s in servers.iter().chain([&catch_all]) {
                match s.names.is_empty() && !std::ptr::eq(s, &catch_all) {
                    true => self.left_unheard(s),
                    false => self.left_heard(s, &catch_all),
                }
            }
            let mut routes = Vec::new();
            for s in &servers {
                if s.names.is_empty() {
                    self.notes.push(format!(
                        "{}: server not converted: none of its names converts, and it is not the default server for {address}",
                        s.at
                    ));
                    continue;
                }
                let hosts: Vec<String> = s.names.iter().flat_map(|n| host_names(n)).collect();
                let hosts = || Some(spanned(OneOrMany::Many(hosts.clone())));
                for r in &s.routes {
                    let mut r = r.clone();
                    Pages::settle(&mut r, &s.pages, &catch_all.pages);
                    r.host = hosts();
                    routes.push(r);
                }
                // nginx answers a request for this server that no location matches from the
                // server's files (404 without them); without this, the default server's routes
                // would take it.
                let whole = s.routes.iter().any(|r| text(&r.path) == Some("/"));
                if !whole {
                    let mut r = RawRoute {
                        host: hosts(),
                        respond: Some(files::respond()),
                        ..RawRoute::default()
                    };
                    Pages::settle(&mut r, &s.pages, &catch_all.pages);
                    routes.push(r);
                    self.notes.push(format!(
                        "{}: requests for {} that none of its locations takes get 404 from pinlb (nginx looks for a file)",
                        s.at,
                        s.names.join(" ")
                    ));
                }
            }
            let tls = listener_tls(&address, &catch_all, &servers).map(|(mut tls, h2)| {
                let on_it = (servers.iter().chain([&catch_all]))
                    .filter_map(|s| s.tls.as_ref())
                    .filter(|t| t.addresses.contains(&address))
                    .map(|t| t.client.as_ref());
                if let Some(client) = client_cert::merge(on_it, &catch_all.at, &mut self.notes) {
                    tls.client_ca = client.client_ca;
                    tls.client_auth = client.client_auth;
                    tls.crl = client.crl;
                }
                client_cert::add_headers(&mut tls, &self.client_cert_headers);
                (tls, h2)
            });
            let with_certificates = servers
                .iter()
                .chain([&catch_all])
                .filter(|s| s.tls.is_some())
                .count();
            if with_certificates > 1 {
                self.notes.push(format!(
                    "{}: the certificates of the servers on {address} are chosen by the names each certificate carries (nginx: by server_name); the default server's first is the default",
                    catch_all.at
                ));
            }
            let pages = catch_all.pages.clone();
            let catch_accepting = catch_all.accepting;
            routes.extend(catch_all.routes.into_iter().map(|mut r| {
                Pages::settle(&mut r, &pages, &pages);
                r
            }));
            let mut l = listener(address.clone());
            let accepting: Vec<&Accepting> = (servers.iter().map(|s| &s.accepting))
                .chain([&catch_accepting])
                .collect();
            proxy_protocol::listener(
                &mut l,
                &address,
                &accepting,
                &mut self.notes,
                &mut self.refused,
            );
            pages.write(&mut l.modules.error_pages, false);
            if let Some((tls, http2)) = tls {
                l.tls = Some(spanned(tls));
                if !http2 {
                    // nginx offers h2 only with `http2`; pinlb's TLS listeners do by default.
                    l.http2 = Some(spanned(false));
                }
            }
            if let Some((max, keys)) = conn_limit {
                let limit = RawConnLimit {
                    max: spanned(max),
                    keys: Some(spanned(keys)),
                };
                l.conn_limit = Some(spanned(limit));
            }
            l.route = routes.into_iter().map(spanned).collect();
            listeners.push(l);
        }
        client_cert::unsent_headers(&listeners, &self.client_cert_headers, &mut self.notes);
        anything |= !self.stream_listeners.is_empty();
        listeners.append(&mut self.stream_listeners);
        let mut upstreams = std::mem::take(&mut self.upstreams);
        for up in upstreams.values_mut() {
            if let Some(idle) = self.client_idle {
                up.timeouts.client_idle = Some(spanned(idle));
            }
        }
        let typed = RawConfig {
            listeners,
            upstream: upstreams,
            ..typed
        };
        // A directive inherited by several locations is noted once.
        let mut seen = std::collections::HashSet::new();
        self.notes.retain(|n| seen.insert(n.clone()));
        self.refused.retain(|n| seen.insert(n.clone()));
        Converted {
            config: typed,
            notes: self.notes,
            refused: self.refused,
            anything,
        }
    }
}

/// `fastcgi_*` directives that tune buffers and connections, not what is answered: notes (every
/// other `fastcgi_*` pinlb does not read is refused).
const FASTCGI_TUNING: [&str; 5] = [
    "fastcgi_buffers",
    "fastcgi_buffer_size",
    "fastcgi_busy_buffers_size",
    "fastcgi_temp_file_write_size",
    "fastcgi_socket_keepalive",
];

/// Directives that make nginx refuse, limit or ask for credentials: left out, pinlb would
/// answer what nginx does not. `allow`, `deny`, `auth_basic*` and `satisfy` reach this only in
/// the forms [`access`] can't convert, or inside a block that does not convert.
const RESTRICTING: [&str; 15] = [
    "deny",
    "allow",
    "auth_basic",
    "auth_basic_user_file",
    "auth_request",
    "auth_jwt",
    "limit_req",
    "limit_conn",
    "limit_except",
    "satisfy",
    "internal",
    "valid_referers",
    "secure_link",
    "client_max_body_size",
    "return",
];

/// A listener's `[listener.tls]`, when a server on `address` listens there with `ssl`: the
/// default server's first certificate as the default, every other as a
/// `[[listener.tls.certificate]]`; and whether it offers h2 (any server's `http2`).
fn listener_tls(address: &str, default: &Server, others: &[Server]) -> Option<(RawTls, bool)> {
    let on_it = |s: &Server| {
        s.tls
            .as_ref()
            .filter(|t| t.addresses.iter().any(|a| a == address))
            .cloned()
    };
    let all: Vec<ServerTls> = std::iter::once(default)
        .chain(others)
        .filter_map(on_it)
        .collect();
    if all.is_empty() {
        return None;
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    for p in all.iter().flat_map(|t| &t.certificates) {
        if !pairs.contains(p) {
            pairs.push(p.clone());
        }
    }
    let mut tls = RawTls::default();
    let mut rest = pairs.into_iter();
    if on_it(default).is_some()
        && let Some((cert, key)) = rest.next()
    {
        tls.cert = Some(spanned(cert));
        tls.key = Some(spanned(key));
    }
    tls.certificates = rest
        .map(|(cert, key)| RawCertificate {
            cert: spanned(cert),
            key: spanned(key),
        })
        .collect();
    Some((tls, all.iter().any(|t| t.http2)))
}

/// TLS directives that tune performance, not what a handshake accepts: notes, not refusals
/// (pinlb's session tickets and cache are fixed, docs/configuration.md; it has no 0-RTT).
const SSL_TUNING: [&str; 8] = [
    "ssl_session_cache",
    "ssl_session_timeout",
    "ssl_session_tickets",
    "ssl_prefer_server_ciphers",
    "ssl_buffer_size",
    "ssl_early_data",
    "ssl_stapling",
    "ssl_stapling_verify",
];

/// The nginx variables pinlb's `combined` log line carries: nginx's combined, `$request`'s
/// parts, then the backend and the two times it appends.
const COMBINED_FIELDS: [&str; 14] = [
    "remote_addr",
    "remote_user",
    "time_local",
    "request",
    "request_method",
    "request_uri",
    "server_protocol",
    "status",
    "body_bytes_sent",
    "http_referer",
    "http_user_agent",
    "upstream_addr",
    "upstream_response_time",
    "request_time",
];

/// The nginx variables pinlb's `json` log line carries (`time`, `client`, `method`, `path`,
/// `protocol`, `status`, `bytes`, `backend`, `upstream_time`, `total_time`, `referer`,
/// `user_agent`).
const JSON_FIELDS: [&str; 14] = [
    "time_iso8601",
    "time_local",
    "remote_addr",
    "request_method",
    "request_uri",
    "uri",
    "server_protocol",
    "status",
    "body_bytes_sent",
    "upstream_addr",
    "upstream_response_time",
    "request_time",
    "http_referer",
    "http_user_agent",
];

/// A `log_format`'s strings (after its name; nginx joins them as they are) as a pinlb
/// template: `$name` and `${name}` become `{name}` where pinlb has that field
/// (`config::log_format`), and `-` where it does not, so the line keeps its columns; those are
/// added to `lost`. Literal braces are doubled.
fn log_template(args: &[String], lost: &mut Vec<String>) -> String {
    let text: String = args
        .iter()
        .filter(|a| !a.starts_with("escape="))
        .map(String::as_str)
        .collect();
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(c) = rest.chars().next() {
        let body = rest.strip_prefix('$').map(|b| {
            let braced = b.starts_with('{');
            let inner = if braced { &b[1..] } else { b };
            let end = inner
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(inner.len());
            let closed = !braced || inner[end..].starts_with('}');
            (&inner[..end], &inner[end + usize::from(braced && closed)..])
        });
        match body {
            Some((name, after)) if !name.is_empty() => {
                if pinlb::config::log_format::Field::named(name).is_some() {
                    out.push('{');
                    out.push_str(name);
                    out.push('}');
                } else {
                    out.push('-');
                    let v = format!("${name}");
                    if !lost.contains(&v) {
                        lost.push(v);
                    }
                }
                rest = after;
            }
            _ => {
                match c {
                    '{' => out.push_str("{{"),
                    '}' => out.push_str("}}"),
                    c => out.push(c),
                }
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// The variables a `log_format` string names: `$name` and `${name}`.
fn variables(format: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = format;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let braced = rest.starts_with('{');
        let body = if braced { &rest[1..] } else { rest };
        let end = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(body.len());
        if end > 0 {
            out.push(body[..end].to_string());
        }
        rest = &body[end..];
    }
    out
}

/// `ssl` and the `ssl_*` directives.
fn is_ssl(name: &str) -> bool {
    name == "ssl" || name.starts_with("ssl_")
}

/// Whether `d` is a `server` block that serves TLS: a `listen ... ssl`, or `ssl on`.
fn listens_tls(d: &Directive) -> bool {
    d.name == "server"
        && d.block.iter().flatten().any(|s| {
            (s.name == "listen" && s.args.iter().skip(1).any(|a| a == "ssl"))
                || (s.name == "ssl" && s.args.first().map(String::as_str) == Some("on"))
        })
}

/// What pinlb does without `d` that nginx does not (for the refusal), or `None` when leaving it
/// out only loses convenience: a [`RESTRICTING`] directive, an `ssl`/`ssl_*` one (TLS settings
/// left out weaken or drop the encryption), or a block (a regex or named `location`, an `if`)
/// holding either.
fn less_strict(d: &Directive) -> Option<String> {
    let name = d.name.as_str();
    if is_ssl(name) && !SSL_TUNING.contains(&name) {
        return Some("serves TLS other than nginx's settings, or none".into());
    }
    if RESTRICTING.contains(&name) {
        let what = match name {
            "return" => "proxies what nginx answers itself",
            "client_max_body_size" => "takes bodies nginx refuses (413)",
            n if n.starts_with("limit_") => "lets through what nginx limits",
            n if n.starts_with("auth_") || n == "satisfy" || n == "secure_link" => {
                "answers without the credentials nginx asks for"
            }
            _ => "answers requests nginx refuses",
        };
        return Some(what.into());
    }
    let inner = d.block.as_deref()?.iter().find_map(|i| {
        less_strict(i).map(|what| format!("{what} ({} at line {})", i.name, i.line))
    })?;
    Some(inner)
}

/// A relative redirect made absolute as nginx sends it (`absolute_redirect on`): the client's
/// host, and the listener's port unless it is 80 (`port_in_redirect on`).
fn absolute_redirect(route: &mut RawRoute, redirects: Redirects, port: u16) {
    if !redirects.absolute {
        return;
    }
    let Some(rd) = &mut route.redirect else {
        return;
    };
    let location = rd.get_mut().location.get_mut();
    if location.starts_with('/') {
        let port = match (redirects.port, port) {
            (false, _) | (_, 80) => String::new(),
            (true, p) => format!(":{p}"),
        };
        *location = format!("{{scheme}}://{{host}}{port}{location}");
    }
}

/// Whether route `a`, first, takes every request route `b` (same hosts) would.
fn route_covers(a: &RawRoute, b: &RawRoute) -> bool {
    match (text(&a.path), text(&a.path_exact)) {
        // A regex route is covered by nothing narrower than every path.
        (Some(p), _) if b.path_regex.is_some() => p == "/",
        (None, Some(_)) if b.path_regex.is_some() => false,
        _ if a.path_regex.is_some() => false,
        (Some(p), _) => (text(&b.path).or(text(&b.path_exact))).is_some_and(|q| q.starts_with(p)),
        (None, Some(e)) => text(&b.path_exact) == Some(e),
        (None, None) => true,
    }
}

/// What a `return` or `rewrite` makes a route do instead of proxying.
enum Action {
    Redirect(Spanned<RawRedirect>),
    Respond(Spanned<RawRespond>),
}

impl Action {
    fn set(self, route: &mut RawRoute) {
        match self {
            Action::Redirect(rd) => route.redirect = Some(rd),
            Action::Respond(rs) => route.respond = Some(rs),
        }
    }
}

fn redirect_value(status: u16, location: String) -> Spanned<RawRedirect> {
    spanned(RawRedirect {
        status: Some(spanned(status)),
        location: spanned(location),
    })
}

/// A `server_name` as route hosts: `.example.com` (nginx: the name and every subdomain) is
/// `example.com` and `*.example.com`.
fn host_names(n: &str) -> Vec<String> {
    match n.strip_prefix('.') {
        Some(rest) => vec![
            rest.to_ascii_lowercase(),
            format!("*.{}", rest.to_ascii_lowercase()),
        ],
        None => vec![n.to_ascii_lowercase()],
    }
}

/// `http://NAME[/uri]` → the upstream (or address) and the URI part, if any.
fn proxy_target(url: &str) -> Option<(String, Option<String>)> {
    let rest = url.strip_prefix("http://")?;
    if rest.contains('$') {
        return None;
    }
    if let Some(socket) = rest.strip_prefix("unix:") {
        return unix_socket::proxy_target(socket);
    }
    match rest.find('/') {
        Some(i) => Some((rest[..i].to_string(), Some(rest[i..].to_string()))),
        None => Some((rest.to_string(), None)),
    }
}

/// What `runtime.cpus = [0, …, n - 1]` does, in words: "its worker to core 0", "its 4 workers
/// to cores 0-3".
fn pinned_workers(n: usize) -> String {
    match n {
        0 | 1 => "its worker to core 0".into(),
        2 => "its 2 workers to cores 0 and 1".into(),
        n => format!("its {n} workers to cores 0-{}", n - 1),
    }
}

/// `worker_cpu_affinity 0001 0010` → cores 0 and 1 (each mask one worker's cores).
fn cpu_affinity(args: &[String]) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for mask in args {
        if mask == "auto" {
            return None;
        }
        for (i, bit) in mask.chars().rev().enumerate() {
            if bit == '1' && !cores.contains(&i) {
                cores.push(i);
            }
        }
    }
    cores.sort_unstable();
    Some(cores)
}

/// nginx sizes: `10m`, `8k`, `1g`, or bytes.
fn size(s: &str) -> Option<u64> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        "g" | "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// `hash`'s key as pinlb's.
fn hash_key(k: &str) -> Option<String> {
    match k {
        "$remote_addr" | "$binary_remote_addr" => Some("client_ip".into()),
        "$request_uri" => Some("uri".into()),
        _ => {
            if let Some(h) = k.strip_prefix("$http_") {
                return Some(format!("header:{}", h.replace('_', "-")));
            }
            k.strip_prefix("$cookie_").map(|c| format!("cookie:{c}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_units_convert() {
        assert_eq!(size("10m"), Some(10 << 20));
        assert_eq!(size("8k"), Some(8192));
        let duration = |s: &str| dur(s).map(|d| d.to_string());
        assert_eq!(duration("65").as_deref(), Some("65s"));
        assert_eq!(duration("1m30s").as_deref(), Some("90s"));
        assert_eq!(duration("500ms").as_deref(), Some("500ms"));
        assert_eq!(
            cpu_affinity(&["0001".into(), "0010".into()]),
            Some(vec![0, 1])
        );
        assert_eq!(listen_address("8081"), "0.0.0.0:8081");
        assert_eq!(pinned_workers(1), "its worker to core 0");
        assert_eq!(pinned_workers(2), "its 2 workers to cores 0 and 1");
        assert_eq!(pinned_workers(4), "its 4 workers to cores 0-3");
        assert_eq!(
            template("$scheme://$host$request_uri").as_deref(),
            Some("{scheme}://{host}{uri}")
        );
        assert_eq!(template("${host}x").as_deref(), Some("{host}x"));
        assert_eq!(template("$server_port"), None);
        assert_eq!(hash_key("$http_x_user").as_deref(), Some("header:x-user"));
        assert_eq!(
            variables("$remote_addr [${time_local}] \"$request\" $ $http_x_id,"),
            ["remote_addr", "time_local", "request", "http_x_id"]
        );
    }
}
