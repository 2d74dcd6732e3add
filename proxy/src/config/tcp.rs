//! TCP listeners (`mode = "tcp"`, nginx's `stream` and HAProxy's `mode tcp`): which keys apply
//! to a connection whose bytes are relayed unread, and what an upstream such listeners name may
//! have. An upstream serves one kind of listener: its active check is a connect (with `send`
//! and `receive`, HAProxy's `tcp-check`) or an HTTP `GET`, never both.

use std::collections::BTreeMap;

use toml::Spanned;

use super::raw::{RawListener, RawUpstream};
use super::{Listener, ListenerMode, SniRoute, TcpCheck, UdpSessions, Upstream};
use crate::syntax::error::{ConfigError, ConfigErrors, Source};

type Result<T> = std::result::Result<T, ConfigError>;

/// The keys a TCP listener may have.
const LISTENER_KEYS: &str = "address, mode, upstream, tls, sni, backlog, access, conn_limit, rate_limit, proxy_protocol, proxy_protocol_from";

/// A listener's `mode`; a TCP listener's keys checked against what applies to it.
pub(super) fn mode(src: &Source, key: &str, l: &RawListener) -> Result<ListenerMode> {
    let mode = match l.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
        None | Some(("http", _)) => {
            if let Some(s) = l.sni.first() {
                return Err(src.at(
                    s.span(),
                    &format!("{key}.sni"),
                    "only for a TCP listener (mode = \"tcp\"), which reads the TLS server name without terminating TLS; a TLS listener picks routes by Host ([[listener.route]] host)",
                ));
            }
            ListenerMode::Http
        }
        Some(("tcp", _)) => ListenerMode::Tcp,
        Some(("udp", _)) => ListenerMode::Udp,
        Some((other, at)) => {
            return Err(src.at(
                at,
                &format!("{key}.mode"),
                format!("unknown mode \"{other}\", expected \"http\", \"tcp\" or \"udp\""),
            ));
        }
    };
    if mode == ListenerMode::Udp {
        return udp_keys(src, key, l).map(|()| mode);
    }
    let udp_only = [
        ("responses", l.responses.as_ref().map(Spanned::span)),
        ("session_idle", l.session_idle.as_ref().map(Spanned::span)),
    ];
    refuse_set(
        src,
        key,
        &udp_only,
        "only for a UDP listener (mode = \"udp\")",
    )?;
    if mode == ListenerMode::Http {
        return Ok(mode);
    }
    if let (Some(t), Some(s)) = (&l.tls, l.sni.first()) {
        let at = if t.span().start > s.span().start {
            t.span()
        } else {
            s.span()
        };
        return Err(src.at(
            at,
            &format!("{key}.tls"),
            "set together with [[listener.sni]], expected one of them: sni relays TLS untouched to the backend, tls terminates it here",
        ));
    }
    let http_only = [
        ("h2c", l.h2c.as_ref().map(Spanned::span)),
        ("http2", l.http2.as_ref().map(Spanned::span)),
        ("route", l.route.first().map(Spanned::span)),
    ];
    let what = format!(
        "not for a TCP listener (mode = \"tcp\" relays bytes without reading HTTP), expected only {LISTENER_KEYS}"
    );
    only(src, key, l, &http_only, &what)?;
    Ok(mode)
}

/// The keys a UDP listener may have.
const UDP_KEYS: &str = "address, mode, upstream, access, responses, session_idle";

/// A UDP listener's keys checked against what applies to it.
fn udp_keys(src: &Source, key: &str, l: &RawListener) -> Result<()> {
    let others = [
        ("tls", l.tls.as_ref().map(Spanned::span)),
        ("h2c", l.h2c.as_ref().map(Spanned::span)),
        ("http2", l.http2.as_ref().map(Spanned::span)),
        ("backlog", l.backlog.as_ref().map(Spanned::span)),
        ("rate_limit", l.rate_limit.as_ref().map(Spanned::span)),
        ("conn_limit", l.conn_limit.as_ref().map(Spanned::span)),
        (
            "proxy_protocol",
            l.proxy_protocol.as_ref().map(Spanned::span),
        ),
        ("route", l.route.first().map(Spanned::span)),
        ("sni", l.sni.first().map(Spanned::span)),
    ];
    let what = format!("not for a UDP listener (mode = \"udp\"), expected only {UDP_KEYS}");
    only(src, key, l, &others, &what)
}

/// A TCP or UDP listener's keys: the first in the file of those it may not have (`refused`,
/// each with its place when set, and every module's but `access`) is an error saying `what`;
/// then its `upstream` must be set.
fn only(
    src: &Source,
    key: &str,
    l: &RawListener,
    refused: &[(&str, Option<std::ops::Range<usize>>)],
    what: &str,
) -> Result<()> {
    let set = (refused.iter()).filter_map(|(k, at)| at.clone().map(|at| (*k, at)));
    let modules = (l.module_keys.iter())
        .filter(|(k, _)| k != "access")
        .map(|(k, at)| (k.as_str(), at.clone()));
    if let Some((k, at)) = set.chain(modules).min_by_key(|(_, at)| at.start) {
        return Err(src.at(at, &format!("{key}.{k}"), what));
    }
    if l.upstream.is_none() {
        return Err(src.at(
            l.address.span(),
            &format!("{key}.upstream"),
            "missing, expected the name of an [upstream.NAME] for its connections",
        ));
    }
    Ok(())
}

/// The first of `keys` (each a key and its place when it is set), in their order, that is set:
/// an error at its place, the key under `table`, saying `what`.
fn refuse_set(
    src: &Source,
    table: &str,
    keys: &[(&str, Option<std::ops::Range<usize>>)],
    what: &str,
) -> Result<()> {
    match keys.iter().find_map(|(k, at)| Some((*k, at.clone()?))) {
        Some((k, at)) => Err(src.at(at, &format!("{table}.{k}"), what)),
        None => Ok(()),
    }
}

/// A UDP listener's sessions; `None` for other listeners.
pub(super) fn udp(
    src: &Source,
    key: &str,
    l: &RawListener,
    mode: ListenerMode,
) -> Result<Option<UdpSessions>> {
    if mode != ListenerMode::Udp {
        return Ok(None);
    }
    let d = UdpSessions::default();
    let responses = match &l.responses {
        None => None,
        Some(v) => {
            match u32::try_from(*v.get_ref()) {
                Ok(n) if n >= 1 => Some(n),
                _ => {
                    return Err(src.at(
                    v.span(),
                    &format!("{key}.responses"),
                    format!("{} is out of range, expected 1 or more answers per datagram (1 for DNS)", v.get_ref()),
                ));
                }
            }
        }
    };
    let idle = match &l.session_idle {
        None => d.idle,
        Some(v) if v.get_ref().0.is_zero() => {
            return Err(src.at(
                v.span(),
                &format!("{key}.session_idle"),
                "0 is not allowed, expected a duration such as \"30s\"",
            ));
        }
        Some(v) => v.get_ref().0,
    };
    Ok(Some(UdpSessions { responses, idle }))
}

/// A TCP listener's `[[listener.sni]]` tables, their upstreams as indexes into `upstreams`.
pub(super) fn sni(
    src: &Source,
    key: &str,
    l: &RawListener,
    upstreams: &[&str],
) -> Result<Vec<SniRoute>> {
    let mut out = Vec::with_capacity(l.sni.len());
    for (i, s) in l.sni.iter().enumerate() {
        let (s, skey) = (s.get_ref(), format!("{key}.sni[{i}]"));
        let names =
            super::routes::host_patterns(src, &format!("{skey}.server_name"), &s.server_name)?;
        let alpn = match &s.alpn {
            None => Vec::new(),
            Some(list) => {
                let mut alpn = Vec::with_capacity(list.get_ref().len());
                for a in list.get_ref() {
                    let v = a.get_ref();
                    if v.is_empty() || v.len() > 255 {
                        return Err(src.at(
                            a.span(),
                            &format!("{skey}.alpn"),
                            "expected a protocol name of 1 to 255 bytes, such as \"h2\" or \"http/1.1\"",
                        ));
                    }
                    alpn.push(v.as_bytes().to_vec());
                }
                alpn
            }
        };
        let upstream = upstreams
            .iter()
            .position(|u| u == s.upstream.get_ref())
            .ok_or_else(|| {
                src.at(
                    s.upstream.span(),
                    &format!("{skey}.upstream"),
                    format!(
                        "unknown upstream \"{}\", expected one of: {}",
                        s.upstream.get_ref(),
                        upstreams.join(", ")
                    ),
                )
            })?;
        out.push(SniRoute {
            names,
            alpn,
            upstream,
        });
    }
    Ok(out)
}

/// Marks the upstreams TCP listeners name (`tcp`), with their checks (`health.send`,
/// `health.receive`), and refuses what they cannot have: the keys of HTTP, and being named by
/// HTTP listeners too.
pub(super) fn upstreams(
    src: &Source,
    raw_listeners: &[RawListener],
    listeners: &[Listener],
    raw: &BTreeMap<String, RawUpstream>,
    upstreams: &mut [Upstream],
) -> std::result::Result<(), ConfigErrors> {
    let mut errors = Vec::new();
    let mut named_by_http = vec![false; upstreams.len()];
    for l in listeners.iter().filter(|l| l.mode == ListenerMode::Http) {
        if l.has_default {
            named_by_http[l.upstream] = true;
        }
        for r in &l.routes {
            if let super::RouteAction::Proxy { upstream, .. } = r.action {
                named_by_http[upstream] = true;
            }
        }
        // A mirror's copies are HTTP requests too.
        let modules = std::iter::once(&l.modules).chain(l.routes.iter().map(|r| &r.modules));
        for m in modules.filter_map(|m| m.mirror.as_ref()) {
            named_by_http[m.upstream()] = true;
        }
    }
    for (i, (l, rl)) in listeners.iter().zip(raw_listeners).enumerate() {
        if l.mode == ListenerMode::Http {
            continue;
        }
        let default = (l.upstream, rl.upstream.as_ref().map_or(0..0, Spanned::span));
        let by_name = l.sni.iter().zip(&rl.sni).enumerate().map(|(j, (s, r))| {
            let at = r.get_ref().upstream.span();
            (s.upstream, at, format!("listener[{i}].sni[{j}].upstream"))
        });
        let named = std::iter::once((default.0, default.1, format!("listener[{i}].upstream")));
        for (index, at, key) in named.chain(by_name) {
            let up = &mut upstreams[index];
            let udp = l.mode == ListenerMode::Udp;
            if (udp && up.udp) || (!udp && up.tcp) {
                continue;
            }
            if named_by_http[index] {
                errors.push(src.at(
                    at,
                    &key,
                    format!(
                        "upstream \"{}\" is named by HTTP listeners too, expected an upstream of its own for TCP listeners (its health check is a connect, not a GET)",
                        up.name
                    ),
                ));
                continue;
            }
            // Its kind is known whether or not its keys are right, so that its errors are
            // said once.
            match udp {
                true => up.udp = true,
                false => up.tcp = true,
            }
            let datagrams = match (udp, raw.get(&up.name)) {
                (true, Some(r)) => udp_upstream(src, up, r),
                _ => Ok(()),
            };
            if let Err(e) = datagrams {
                errors.push(e);
                continue;
            }
            match raw.get(&up.name).map(|r| tcp_upstream(src, &up.name, r)) {
                Some(Ok(check)) => {
                    if let Some(h) = &mut up.health {
                        h.tcp = Some(check);
                    }
                }
                Some(Err(e)) => errors.push(e),
                None => {}
            }
        }
    }
    for up in upstreams
        .iter()
        .filter(|u| u.udp && !u.tcp && u.health.is_some())
    {
        let header = src.text.find(&format!("[upstream.{}.health]", up.name));
        errors.push(src.at(
            header.map_or(0..0, |h| h..h),
            &format!("upstream.{}.health", up.name),
            "not for the upstream of UDP listeners only, expected none: its backends are checked by their answers (a session with none counts as a failure, as passive checks count)",
        ));
    }
    for (up, named) in upstreams.iter().zip(&named_by_http) {
        if let (false, false, Some(r)) = (up.tcp, up.udp, raw.get(&up.name)) {
            let tcp_keys = r.health.as_ref().map(|h| (&h.send, &h.receive, &h.check));
            let set = tcp_keys.and_then(|(s, r, c)| s.as_ref().or(r.as_ref()).or(c.as_ref()));
            if let Some(v) = set {
                let why = if *named {
                    "only for the upstream of a TCP listener (mode = \"tcp\"), expected path and expect for an HTTP check"
                } else {
                    "only for the upstream of a TCP listener (mode = \"tcp\")"
                };
                let which = match r.health.as_ref() {
                    Some(h) if h.send.is_some() => "send",
                    Some(h) if h.receive.is_some() => "receive",
                    _ => "check",
                };
                errors.push(src.at(
                    v.span(),
                    &format!("upstream.{}.health.{which}", up.name),
                    why,
                ));
            }
        }
    }
    match ConfigErrors::new(errors) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What a UDP listener's upstream may not have: TLS, a PROXY protocol header, or a Unix
/// socket's backend, none of which a datagram can go through.
fn udp_upstream(src: &Source, up: &Upstream, r: &RawUpstream) -> Result<()> {
    let key = format!("upstream.{}", up.name);
    let stream_only = [
        ("tls", r.tls.as_ref().map(Spanned::span)),
        (
            "proxy_protocol",
            r.proxy_protocol.as_ref().map(Spanned::span),
        ),
    ];
    refuse_set(
        src,
        &key,
        &stream_only,
        "not for the upstream of a UDP listener (mode = \"udp\"), expected none: datagrams go to the backends as they came",
    )?;
    let unix = (up.backends.iter())
        .find(|b| matches!(b.address, crate::backend_address::BackendAddress::Unix(_)));
    if let Some(b) = unix {
        let at = r.backends.as_ref().map_or(0..0, Spanned::span);
        return Err(src.at(
            at,
            &format!("{key}.backends"),
            format!(
                "{} is a Unix socket, expected IP:PORT backends for a UDP listener",
                b.address
            ),
        ));
    }
    Ok(())
}

/// The check of a TCP listener's upstream `name`, after refusing its HTTP keys.
fn tcp_upstream(src: &Source, name: &str, r: &RawUpstream) -> Result<TcpCheck> {
    let key = format!("upstream.{name}");
    let refuse = |k: &str, at: std::ops::Range<usize>, expected: &str| {
        src.at(
            at,
            &format!("{key}.{k}"),
            format!("not for the upstream of a TCP listener (mode = \"tcp\"), {expected}"),
        )
    };
    if let Some(p) = &r.protocol {
        return Err(refuse(
            "protocol",
            p.span(),
            "expected none: its connections carry bytes, not requests",
        ));
    }
    let http_tables = [
        ("sticky", r.sticky.as_ref().map(Spanned::span)),
        ("buffering", r.buffering.as_ref().map(Spanned::span)),
        ("fastcgi", r.fastcgi.as_ref().map(Spanned::span)),
        ("outlier", r.outlier.as_ref().map(Spanned::span)),
        ("retry.on", r.retry.on.as_ref().map(Spanned::span)),
    ];
    refuse_set(
        src,
        &key,
        &http_tables,
        "not for the upstream of a TCP listener (mode = \"tcp\"), expected none: it reads HTTP (a connect that fails moves on to the next backend by itself)",
    )?;
    if let Some(h) = &r.hash {
        if h.get_ref() != "client_ip" {
            return Err(refuse(
                "hash",
                h.span(),
                "expected \"client_ip\": a connection has no URI, header or cookie",
            ));
        }
    }
    let Some(h) = &r.health else {
        return Ok(TcpCheck::default());
    };
    let http_check = [
        ("path", h.path.as_ref().map(Spanned::span)),
        ("host", h.host.as_ref().map(Spanned::span)),
        ("expect", h.expect.as_ref().map(Spanned::span)),
    ];
    refuse_set(
        src,
        &format!("{key}.health"),
        &http_check,
        "an HTTP check's key, expected send and receive for the upstream of a TCP listener (or neither: a connect)",
    )?;
    let bytes = |v: &Option<Spanned<String>>| v.as_ref().map(|v| v.get_ref().as_bytes().to_vec());
    let mut check = TcpCheck {
        send: bytes(&h.send).unwrap_or_default(),
        receive: bytes(&h.receive).unwrap_or_default(),
        mysql: false,
    };
    if let Some(named) = &h.check {
        let custom = h.send.as_ref().or(h.receive.as_ref());
        match (named.get_ref().as_str(), custom) {
            ("connect", _) => {}
            (_, Some(v)) => {
                return Err(src.at(
                    v.span(),
                    &format!("{key}.health"),
                    format!(
                        "send and receive set together with check = \"{}\", expected one of them",
                        named.get_ref()
                    ),
                ));
            }
            // HAProxy's `redis-check`.
            ("redis", None) => {
                check.send = b"PING\r\n".to_vec();
                check.receive = b"+PONG".to_vec();
            }
            ("mysql", None) => check.mysql = true,
            (other, None) => {
                return Err(src.at(
                    named.span(),
                    &format!("{key}.health.check"),
                    format!(
                        "unknown check \"{other}\", expected \"connect\", \"redis\" or \"mysql\""
                    ),
                ));
            }
        }
    }
    if let (Some(v), true) = (&h.receive, check.receive.len() > 1024) {
        return Err(src.at(
            v.span(),
            &format!("{key}.health.receive"),
            "longer than 1024 bytes, expected the first bytes of the answer",
        ));
    }
    Ok(check)
}
