//! nginx's `stream {}` block as TCP and UDP listeners (`mode = "tcp"`, `mode = "udp"`): each
//! `server`'s `listen` a listener, its `proxy_pass` the upstream (an `upstream` block of the
//! stream level, or an address made one), `ssl_preread on` with a `map
//! $ssl_preread_server_name` as `[[listener.sni]]` tables, and the directives of the stream
//! proxy that pinlb has: `listen … ssl` with `ssl_certificate` and `ssl_certificate_key` as
//! `[listener.tls]` (pinlb terminates TLS there), `proxy_timeout`, `proxy_connect_timeout`, `proxy_responses`,
//! `proxy_protocol`, `listen … proxy_protocol` with `set_real_ip_from`, `limit_conn`, `allow`
//! and `deny`. What does not convert is noted, or refused where leaving it out would make pinlb
//! less strict (an `allow`/`deny` or `limit_conn` that does not convert).

use std::collections::BTreeMap;

use std::time::Duration;

use pinlb::config::raw::{
    Dur, OneOrMany, RawCertificate, RawListener, RawRetry, RawSni, RawTls, RawUpstream,
};
use pinlb::modules::conn_limit::RawConnLimit;
use toml::Spanned;

use crate::parse::Directive;
use crate::values::{listener, spanned};

/// What a `stream {}` block converts to.
#[derive(Default)]
pub struct Stream {
    /// Its servers' listeners, in file order.
    pub listeners: Vec<RawListener>,
    pub notes: Vec<String>,
    pub refused: Vec<String>,
}

/// A `map $ssl_preread_server_name $VAR { … }`: its entries in file order and its default.
struct NameMap {
    entries: Vec<(String, String)>,
    default: Option<String>,
}

/// Converts the `stream` block `block`. `upstream(name)` renames a stream-level upstream's
/// name to the one it has in the output (stream and http upstreams share pinlb's one table),
/// `None` for a name no `upstream` block has; `upstreams` are those converted tables, which
/// the servers' timeouts and `proxy_protocol` are written into.
pub fn convert(
    block: &[Directive],
    upstream: &dyn Fn(&str) -> Option<String>,
    upstreams: &mut BTreeMap<String, RawUpstream>,
) -> Stream {
    let mut out = Stream::default();
    let maps = name_maps(block, &mut out);
    let mut zones = BTreeMap::new();
    super::limits::conn_zones(block, &mut zones, &mut out.refused);
    // What every server inherits from the stream level unless it sets its own.
    let inherited: Vec<&Directive> = (block.iter())
        .filter(|d| d.block.is_none() && INHERITED.contains(&d.name.as_str()))
        .collect();
    for d in block {
        match (d.name.as_str(), d.block.as_deref()) {
            ("server", Some(server)) => {
                let s = Server {
                    maps: &maps,
                    zones: &zones,
                    upstream,
                    inherited: &inherited,
                };
                s.convert(d, server, upstreams, &mut out);
            }
            ("upstream" | "map" | "limit_conn_zone", _) => {}
            (name, None) if INHERITED.contains(&name) => {}
            ("log_format" | "access_log" | "error_log", _) => out.notes.push(format!(
                "{}: {} not converted: pinlb's [log] is one for every listener; its TCP and UDP lines are described in docs/configuration.md",
                d.at(),
                d.name
            )),
            _ => out
                .notes
                .push(format!("{}: {} not converted: no pinlb equivalent", d.at(), d.name)),
        }
    }
    out
}

/// The stream level's `map $ssl_preread_server_name $VAR` blocks, by `$VAR`; other maps are
/// noted (a `proxy_pass` that names their variable does not convert).
fn name_maps(block: &[Directive], out: &mut Stream) -> BTreeMap<String, NameMap> {
    let mut maps = BTreeMap::new();
    for d in block.iter().filter(|d| d.name == "map") {
        let (Some(source), Some(var), Some(entries)) =
            (d.args.first(), d.args.get(1), d.block.as_deref())
        else {
            continue;
        };
        if source != "$ssl_preread_server_name" {
            out.notes.push(format!(
                "{}: map {source} not converted: pinlb routes a TCP listener by the TLS server name only ($ssl_preread_server_name)",
                d.at()
            ));
            continue;
        }
        let mut map = NameMap {
            entries: Vec::new(),
            default: None,
        };
        for e in entries {
            match (e.name.as_str(), e.args.first()) {
                // pinlb matches names as `map hostnames` does, with it or without.
                ("hostnames", None) => {}
                ("default", Some(v)) => map.default = Some(v.clone()),
                (name, Some(v)) if !name.starts_with('~') => {
                    // nginx's `.example.com` is the name and every name below it.
                    match name.strip_prefix('.') {
                        Some(base) => {
                            map.entries.push((base.to_string(), v.clone()));
                            map.entries.push((format!("*.{base}"), v.clone()));
                        }
                        None => map.entries.push((name.to_string(), v.clone())),
                    }
                }
                _ => out.notes.push(format!(
                    "{}: map entry {} not converted: pinlb matches server names exactly or by a leading *. wildcard, not by regular expression",
                    e.at(),
                    e.name
                )),
            }
        }
        maps.insert(var.clone(), map);
    }
    maps
}

/// Server names, and the upstream their connections go to.
type ByName = (Vec<String>, String);

/// Directives a stream server inherits from the stream level, as nginx's do.
const INHERITED: [&str; 14] = [
    "allow",
    "deny",
    "limit_conn",
    "set_real_ip_from",
    "proxy_protocol",
    "proxy_timeout",
    "proxy_connect_timeout",
    "proxy_responses",
    "proxy_next_upstream_tries",
    "proxy_next_upstream_timeout",
    "ssl_preread",
    "ssl_certificate",
    "ssl_certificate_key",
    "ssl_protocols",
];

/// Of the inherited directives, those that are lists: a server's own list replaces the
/// inherited one whole (nginx's `allow`/`deny` and `limit_conn` in a block with their own;
/// `ssl_certificate` and `ssl_certificate_key` each, as nginx merges them).
const LISTS: [&[&str]; 5] = [
    &["allow", "deny"],
    &["limit_conn"],
    &["set_real_ip_from"],
    &["ssl_certificate"],
    &["ssl_certificate_key"],
];

/// What a stream `server` reads from its level.
struct Server<'a> {
    maps: &'a BTreeMap<String, NameMap>,
    zones: &'a BTreeMap<String, i64>,
    upstream: &'a dyn Fn(&str) -> Option<String>,
    /// The stream level's [`INHERITED`] directives.
    inherited: &'a [&'a Directive],
}

impl Server<'_> {
    /// One `server` block as one listener per `listen`.
    fn convert(
        &self,
        d: &Directive,
        block: &[Directive],
        upstreams: &mut BTreeMap<String, RawUpstream>,
        out: &mut Stream,
    ) {
        let mut listens = Vec::new();
        // The listener keys of each of its listens (its address aside).
        let mut keys = listener(String::new());
        // The upstream's keys this server sets.
        let mut upstream_keys = RawUpstream::default();
        let mut pass: Option<&Directive> = None;
        let mut preread = false;
        let mut access = Vec::new();
        let (mut certs, mut cert_keys) = (Vec::new(), Vec::new());
        let own = |names: &[&str]| block.iter().any(|s| names.contains(&s.name.as_str()));
        let from_level = (self.inherited.iter().copied())
            .filter(|d| !LISTS.iter().any(|l| l.contains(&d.name.as_str()) && own(l)));
        for s in from_level.chain(block) {
            let arg = s.args.first().map(String::as_str);
            match (s.name.as_str(), arg) {
                ("listen", Some(_)) => listens.push(s),
                ("proxy_pass", Some(_)) => pass = Some(s),
                ("ssl_preread", Some(v)) => preread = v == "on",
                ("ssl_certificate", Some(_)) => certs.push(s),
                ("ssl_certificate_key", Some(_)) => cert_keys.push(s),
                ("ssl_protocols", Some(_)) => {
                    super::values::ssl_protocols(s, &mut out.notes, &mut out.refused)
                }
                ("proxy_timeout", Some(v)) => match super::values::dur(v) {
                    Some(t) => {
                        upstream_keys.timeouts.tunnel_idle = Some(spanned(t));
                        keys.session_idle = Some(spanned(t));
                    }
                    None => out.notes.push(format!("{}: proxy_timeout {v} not converted: not a duration", s.at())),
                },
                ("proxy_connect_timeout", Some(v)) => {
                    if let Some(t) = super::values::dur(v) {
                        upstream_keys.timeouts.connect = Some(spanned(t));
                    }
                }
                ("proxy_responses", Some(v)) => match v.parse::<i64>() {
                    Ok(n) if n >= 1 => keys.responses = Some(spanned(n)),
                    // nginx's 0 answers nothing back: no pinlb equivalent.
                    _ => out.notes.push(format!("{}: proxy_responses {v} not converted: pinlb relays every answer, expected 1 or more", s.at())),
                },
                ("proxy_protocol", Some("on")) => {
                    // nginx's stream module writes version 1.
                    upstream_keys.proxy_protocol = Some(spanned("v1".into()));
                }
                ("proxy_protocol", Some(_)) => {}
                ("proxy_next_upstream_tries" | "proxy_next_upstream_timeout", Some(v)) => {
                    if s.name.ends_with("tries") {
                        if let Ok(n) = v.parse() {
                            upstream_keys.retry.tries = Some(n);
                        }
                    } else if let Some(t) = super::values::dur(v) {
                        upstream_keys.retry.timeout = Some(spanned(t));
                    }
                }
                ("allow" | "deny", Some(who)) => {
                    access.push(spanned(format!("{} {who}", s.name)))
                }
                ("limit_conn", Some(zone)) => {
                    match (self.zones.get(zone), s.args.get(1).and_then(|n| n.parse::<i64>().ok())) {
                        (Some(keys_of), Some(max)) => {
                            let limit = RawConnLimit {
                                max: spanned(max),
                                keys: Some(spanned(*keys_of)),
                            };
                            keys.conn_limit = Some(spanned(limit));
                        }
                        _ => out.refused.push(format!(
                            "{}: limit_conn not converted: its zone is not a limit_conn_zone on the client's address; without it pinlb lets through connections nginx limits",
                            s.at()
                        )),
                    }
                }
                ("set_real_ip_from", Some(net)) => {
                    let from = keys.proxy_protocol_from.get_or_insert_with(|| spanned(Vec::new()));
                    from.get_mut().push(spanned(net.to_string()));
                }
                _ => out.notes.push(format!(
                    "{}: {} not converted: no pinlb equivalent for a TCP or UDP listener",
                    s.at(),
                    s.name
                )),
            }
        }
        // nginx's default `proxy_timeout`, written out: pinlb's own defaults differ.
        if upstream_keys.timeouts.tunnel_idle.is_none() {
            let ten_minutes = Dur(Duration::from_secs(600));
            upstream_keys.timeouts.tunnel_idle = Some(spanned(ten_minutes));
            keys.session_idle = Some(spanned(ten_minutes));
        }
        let Some(pass) = pass else {
            out.notes.push(format!(
                "{}: server not converted: it has no proxy_pass (pinlb's TCP and UDP listeners relay to an upstream)",
                d.at()
            ));
            return;
        };
        let target = pass.args[0].as_str();
        let (default, sni) = match target.strip_prefix('$') {
            None => match self.target(target, upstreams) {
                Some(u) => (u, Vec::new()),
                None => return out.notes.push(format!("{}: proxy_pass {target} not converted: neither an upstream of the stream block nor an address", pass.at())),
            },
            Some(_) => match (self.maps.get(target), preread) {
                (Some(map), true) => match self.by_name(map, pass, upstreams, out) {
                    Some(routed) => routed,
                    None => return,
                },
                (Some(_), false) => {
                    return out.notes.push(format!(
                        "{}: proxy_pass {target} not converted: its map reads $ssl_preread_server_name, which needs ssl_preread on",
                        pass.at()
                    ));
                }
                (None, _) => {
                    return out.notes.push(format!(
                        "{}: proxy_pass {target} not converted: only a variable mapped from $ssl_preread_server_name converts",
                        pass.at()
                    ));
                }
            },
        };
        // The upstream's own keys, from the servers that pass to it (nginx sets them per
        // server; pinlb per upstream, which the first server decides).
        for name in std::iter::once(&default).chain(sni.iter().map(|(_, u)| u)) {
            let Some(up) = upstreams.get_mut(name) else {
                continue;
            };
            let mut differs = Vec::new();
            let diff = &mut differs;
            keep_first(
                &mut up.proxy_protocol,
                &upstream_keys.proxy_protocol,
                "proxy_protocol",
                diff,
            );
            let unset = RawRetry::default();
            match (&up.retry, &upstream_keys.retry) {
                (was, own) if *own == unset || was == own => {}
                (was, own) if *was == unset => up.retry = own.clone(),
                _ => diff.push("retry"),
            }
            let (t, own_t) = (&mut up.timeouts, &upstream_keys.timeouts);
            keep_first(&mut t.connect, &own_t.connect, "timeouts.connect", diff);
            keep_first(
                &mut t.tunnel_idle,
                &own_t.tunnel_idle,
                "timeouts.tunnel_idle",
                diff,
            );
            if !differs.is_empty() {
                out.notes.push(format!(
                    "{}: this server's {} for upstream {name} differ from an earlier server's; pinlb sets them per upstream and keeps the earlier server's",
                    d.at(),
                    differs.join(", ")
                ));
            }
        }
        let ssl = |l: &&Directive| l.args.iter().any(|a| a == "ssl");
        let tls = match listens.iter().copied().find(ssl) {
            Some(l) => tls(l, &certs, &cert_keys, out),
            None => None,
        };
        for l in listens {
            self.listener(l, (&keys, &access, tls.as_ref()), (&default, &sni), out);
        }
    }

    /// One `listen` of a server that passes to `default` (and by server name to `sni`).
    fn listener(
        &self,
        l: &Directive,
        (keys, access, tls): (&RawListener, &[Spanned<String>], Option<&RawTls>),
        (default, sni): (&str, &[ByName]),
        out: &mut Stream,
    ) {
        let udp = l.args.iter().any(|a| a == "udp");
        let mut t = listener(super::values::listen_address(&l.args[0]));
        t.mode = Some(spanned(if udp { "udp" } else { "tcp" }.into()));
        t.upstream = Some(spanned(default.to_string()));
        for a in &l.args[1..] {
            match a.as_str() {
                "udp" | "reuseport" => {}
                "proxy_protocol" if !udp => t.proxy_protocol = Some(spanned(true)),
                "ssl" if !udp => match tls {
                    // pinlb's TCP listener terminates TLS or routes it by name, not both.
                    Some(_) if !sni.is_empty() => out.refused.push(format!(
                        "{}: listen … ssl not converted: with ssl_preread routing by name, pinlb relays the TLS untouched (a TCP listener terminates TLS or routes it by server name, not both); the clients' TLS ends at the backends instead",
                        l.at()
                    )),
                    Some(tls) => t.tls = Some(spanned(tls.clone())),
                    // `tls` said why.
                    None => {}
                },
                other => out.notes.push(format!("{}: listen parameter {other} not converted", l.at())),
            }
        }
        match udp {
            true => {
                t.responses = keys.responses.clone();
                t.session_idle = keys.session_idle.clone();
            }
            false => {
                t.conn_limit = keys.conn_limit.clone();
                if t.proxy_protocol.is_some() {
                    t.proxy_protocol_from = keys.proxy_protocol_from.clone();
                }
            }
        }
        if t.proxy_protocol.is_some() && t.proxy_protocol_from.is_none() {
            // As the http block's: the header is taken only from the balancers in front.
            out.refused.push(format!(
                "{}: listen … proxy_protocol without set_real_ip_from: pinlb takes the header only from proxy_protocol_from, written as everyone (0.0.0.0/0, ::/0); without it anyone could claim any client address",
                l.at()
            ));
            let all = ["0.0.0.0/0", "::/0"].map(|n| spanned(n.to_string()));
            t.proxy_protocol_from = Some(spanned(all.to_vec()));
        }
        if !access.is_empty() {
            t.modules.access.access = Some(spanned(access.to_vec()));
        }
        if !udp {
            t.sni = (sni.iter())
                .map(|(names, up)| {
                    spanned(RawSni {
                        server_name: spanned(OneOrMany::Many(names.clone())),
                        alpn: None,
                        upstream: spanned(up.clone()),
                    })
                })
                .collect();
        }
        out.listeners.push(t);
    }

    /// The upstream a `proxy_pass` (or a map's value) names: a stream `upstream` block, or an
    /// address, made an upstream of its own.
    fn target(
        &self,
        target: &str,
        upstreams: &mut BTreeMap<String, RawUpstream>,
    ) -> Option<String> {
        if let Some(name) = (self.upstream)(target) {
            return Some(name);
        }
        let address = super::values::with_port(target);
        address.parse::<std::net::SocketAddr>().ok()?;
        let name = format!(
            "stream_{}",
            address.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        if !upstreams.contains_key(&name) {
            upstreams.insert(name.clone(), super::values::one_backend(&address));
        }
        Some(name)
    }

    /// A `proxy_pass $VAR` whose map reads the server name: the default's upstream, and the
    /// names of each other upstream. `None` (noted) without a default.
    fn by_name(
        &self,
        map: &NameMap,
        pass: &Directive,
        upstreams: &mut BTreeMap<String, RawUpstream>,
        out: &mut Stream,
    ) -> Option<(String, Vec<ByName>)> {
        let Some(default) = map.default.as_deref() else {
            out.notes.push(format!(
                "{}: proxy_pass {} not converted: its map has no default, and pinlb relays a connection that names no server to the listener's upstream",
                pass.at(),
                pass.args[0]
            ));
            return None;
        };
        let default = self.target(default, upstreams)?;
        let mut routes: Vec<ByName> = Vec::new();
        for (name, value) in &map.entries {
            let Some(up) = self.target(value, upstreams) else {
                out.notes.push(format!(
                    "{}: map entry {name} not converted: {value} is neither an upstream nor an address",
                    pass.at()
                ));
                continue;
            };
            match routes.iter_mut().find(|(_, u)| *u == up) {
                Some((names, _)) => names.push(name.clone()),
                None => routes.push((vec![name.clone()], up)),
            }
        }
        Some((default, routes))
    }
}

/// A TCP server's `[listener.tls]`, for a `listen … ssl`: its `ssl_certificate` and
/// `ssl_certificate_key` pairs in order, the first as the default and the rest as
/// `[[listener.tls.certificate]]`. pinlb picks one of those by the server name the client asks
/// for (docs/configuration.md); nginx offers a server's several certificates by key type (RSA
/// and ECDSA), so a second one whose names are the first's is served only to clients that ask
/// for none of them. `None` (refused) when they don't pair up.
fn tls(
    l: &Directive,
    certs: &[&Directive],
    keys: &[&Directive],
    out: &mut Stream,
) -> Option<RawTls> {
    let mut refuse = |why: &str| {
        out.refused.push(format!(
            "{}: listen … ssl not converted: {why}; without it pinlb would relay the clients' bytes in clear where nginx asks for TLS",
            l.at()
        ));
        None
    };
    if certs.is_empty() {
        return refuse("the server has no ssl_certificate");
    }
    if certs.len() != keys.len() {
        return refuse("each ssl_certificate needs its ssl_certificate_key, in the same order");
    }
    let mut pairs = Vec::new();
    for (c, k) in certs.iter().zip(keys) {
        let (cert, key) = (&c.args[0], &k.args[0]);
        if cert.contains('$') || key.contains('$') || key.starts_with("data:") {
            return refuse(
                "a certificate named by variables or given inline is not a file pinlb can read",
            );
        }
        pairs.push(RawCertificate {
            cert: spanned(super::values::conf_path(c, cert)),
            key: spanned(super::values::conf_path(k, key)),
        });
    }
    let first = pairs.remove(0);
    Some(RawTls {
        cert: Some(first.cert),
        key: Some(first.key),
        certificates: pairs,
        ..RawTls::default()
    })
}

/// An upstream's key `was`, set by the first server that passes to it: `own`, a later server's,
/// where it has none yet; its `key` added to `differs` where the two differ.
fn keep_first<T: Clone + PartialEq>(
    was: &mut Option<T>,
    own: &Option<T>,
    key: &'static str,
    differs: &mut Vec<&'static str>,
) {
    match (was.as_ref(), own) {
        (_, None) => {}
        (None, Some(_)) => *was = own.clone(),
        (Some(a), Some(b)) if a != b => differs.push(key),
        (Some(_), Some(_)) => {}
    }
}
