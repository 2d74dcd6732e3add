//! `pinlb check`: what it prints for a valid file. The resolved plan, then the core map
//! ([`crate::coremap`]) and its warnings, then the verdict.

use std::fmt::Write;
use std::path::Path;

use crate::coremap::CoreMap;
use pinlb::config::{AccessFormat, AccessTarget, Config};
use pinlb::sys::cpus::format_cpu_list;

/// Everything `pinlb check` prints for `config`, read from `file`. Looks for the backends'
/// processes on this machine.
pub fn report(config: &Config, file: &Path) -> String {
    let map = CoreMap::discover(config);
    let fds = descriptors(config);
    // The plan shows `limits.max_connections` as serve will apply it.
    let mut fitted = config.clone();
    fitted.limits.max_connections = fds.max_connections;
    let mut out = describe(&fitted);
    let _ = writeln!(out, "{}", fds.line);
    if let Some(lowered) = &fds.lowered {
        let _ = writeln!(out, "{lowered}");
    }
    out += &map.render();
    for w in map
        .warnings()
        .into_iter()
        .chain(fds.warning)
        .chain(taken_addresses(config))
    {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "{}: configuration is valid", file.display());
    out
}

/// What the open file limit allows, and `limits.max_connections` as serve will apply it (see
/// `sys::limits::fit_nofile`). `check` runs in a process of its own, so it reports the hard
/// limit: the one `serve` raises its soft limit to at start.
fn descriptors(config: &Config) -> pinlb::sys::limits::NofileFit {
    let limits = &config.limits;
    match pinlb::sys::limits::nofile() {
        Ok(limit) => {
            let mut fit = pinlb::sys::limits::fit_nofile(
                limit.hard,
                config.reserved_descriptors(),
                limits.max_connections,
                limits.max_connections_given,
            );
            fit.line += "; the hard limit, which serve raises its soft limit to";
            fit
        }
        Err(e) => pinlb::sys::limits::NofileFit {
            line: format!("open file limit: cannot be read: {e}"),
            max_connections: limits.max_connections,
            lowered: None,
            warning: None,
        },
    }
}

/// What `check` found of the backends' DNS names, looked up once now as `serve` would at start.
pub struct Names {
    /// The configuration with each name expanded into the addresses it gave.
    pub config: Config,
    /// One line per name: what it resolved to, or why it did not.
    pub lines: Vec<String>,
    /// The names that did not resolve, as `upstream NAME: name`.
    pub unresolved: Vec<String>,
}

/// Looks up every name of `config` once, with its `[resolver]`, on a runtime of its own.
pub fn resolve_names(config: &Config) -> Names {
    let mut names = Names {
        config: config.clone(),
        lines: Vec::new(),
        unresolved: Vec::new(),
    };
    let all: Vec<_> = config
        .upstreams
        .iter()
        .flat_map(|u| u.names.iter().map(move |n| (u, n)))
        .collect();
    if all.is_empty() {
        return names;
    }
    // A lookup that could not even start (no runtime, no resolv.conf) fails every name alike.
    let results: Vec<
        Result<pinlb::upstream::discovery::Answer, pinlb::upstream::discovery::DnsError>,
    > = pinlb::sys::runtime::current_thread()
        .map_err(|e| pinlb::upstream::discovery::DnsError::System(e.to_string()))
        .and_then(|rt| {
            rt.block_on(async {
                let lookup = pinlb::upstream::discovery::Lookup::new(&config.resolver.nameservers)?;
                let mut results = Vec::new();
                for (_, n) in &all {
                    results.push(lookup.resolve(&n.name, n.weight).await);
                }
                Ok(results)
            })
        })
        .unwrap_or_else(|e| all.iter().map(|_| Err(e.clone())).collect());
    let mut answers = pinlb::upstream::discovery::Answers::new();
    for ((u, n), r) in all.iter().zip(results) {
        match r {
            Ok(a) => {
                let to: Vec<String> = a
                    .addresses
                    .iter()
                    .map(|(addr, w)| format!("{addr} (weight {w})"))
                    .collect();
                names.lines.push(format!(
                    "dns: upstream {}: {} resolves to {} (TTL {:?})",
                    u.name,
                    n.name,
                    to.join(", "),
                    a.ttl
                ));
                answers.insert((u.name.clone(), n.name.clone()), a.addresses);
            }
            Err(e) => {
                names.lines.push(format!(
                    "dns: upstream {}: {} does not resolve: {e}; serve would start with no backends from it",
                    u.name, n.name
                ));
                names
                    .unresolved
                    .push(format!("upstream {}: {}", u.name, n.name));
            }
        }
    }
    names.config = pinlb::upstream::discovery::expand(config, &answers);
    names
}

/// A warning for each address pinlb would listen on that a process already listens on:
/// `serve` would fail there, unless that process is a pinlb sharing it (SO_REUSEPORT).
fn taken_addresses(config: &Config) -> Vec<String> {
    let mut addrs: Vec<(String, std::net::SocketAddr)> = config
        .listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (format!("listener[{i}]"), l.address))
        .collect();
    if let Some(a) = &config.admin {
        addrs.push(("admin".into(), a.address));
    }
    addrs
        .into_iter()
        // Port 0 is the kernel's choice: never taken.
        .filter(|(_, a)| a.port() != 0)
        .filter_map(|(what, a)| {
            crate::coremap::describe_holders(&crate::coremap::listening_on(a)).map(|who| {
                format!("{what} {a} is already listened on by {who}: serve will fail there unless that is a pinlb sharing it")
            })
        })
        .collect()
}

/// The resolved plan, section by section, as `pinlb check` prints it: every listener's and
/// route's features as configured ([`super::features`]), so that nothing a file sets (or an
/// import converted) is hidden.
pub fn describe(config: &Config) -> String {
    let mut s = String::new();
    let rt = &config.runtime;
    let _ = writeln!(
        s,
        "runtime: {} worker(s), shutdown_timeout {:?}",
        rt.cpus.len(),
        rt.shutdown_timeout
    );
    for (i, c) in rt.cpus.iter().enumerate() {
        let _ = writeln!(s, "  worker {i} -> core {c}");
    }
    let l = &config.limits;
    let _ = writeln!(
        s,
        "limits: request head {} bytes and {} headers, uri {} bytes, body {}, head within {:?}, body reads {:?} apart at most, {} connections",
        l.max_header_bytes,
        l.max_headers,
        l.max_uri_bytes,
        if l.max_body == 0 {
            "unlimited".to_string()
        } else {
            format!("{} bytes", l.max_body)
        },
        l.header_timeout,
        l.body_timeout,
        l.max_connections
    );
    let _ = writeln!(
        s,
        "forwarded: X-Forwarded-For {}",
        if config.trusted.is_empty() {
            "replaced by the client's address for every client".to_string()
        } else {
            let nets: Vec<String> = config.trusted.iter().map(|n| n.to_string()).collect();
            format!(
                "kept and appended to for {}, replaced for every other client",
                nets.join(", ")
            )
        }
    );
    for l in &config.listeners {
        let default = if l.has_default || l.routes.is_empty() {
            format!("upstream {}", config.upstreams[l.upstream].name)
        } else {
            "404 (no default upstream)".to_string()
        };
        // listen(2) silently caps a longer queue at the kernel's ceiling.
        let ceiling = pinlb::sys::limits::somaxconn();
        let backlog = if l.backlog > ceiling {
            format!(
                "{}, capped by the kernel at net.core.somaxconn = {ceiling}",
                l.backlog
            )
        } else {
            l.backlog.to_string()
        };
        let _ = match (&l.tls, l.modules.answers_all()) {
            (_, Some(what)) => writeln!(s, "listener {} (backlog {backlog}) -> {what}", l.address),
            (Some(t), None) => writeln!(
                s,
                "listener {} (backlog {backlog}; TLS: {} certificates{}{}) -> {}",
                l.address,
                t.certificates.count(),
                if t.certificates.has_default() {
                    ", one default"
                } else {
                    ", no default"
                },
                match (l.mode, t.offers_h2()) {
                    (pinlb::config::ListenerMode::Tcp, _) =>
                        ", no ALPN; TCP, relayed in clear to the backends",
                    (_, true) => ", ALPN h2 and http/1.1",
                    (_, false) => ", ALPN http/1.1",
                },
                default
            ),
            (None, None) if l.mode == pinlb::config::ListenerMode::Udp => {
                let u = l.udp.unwrap_or_default();
                writeln!(
                    s,
                    "listener {} (UDP, a session per client address and port, ended by {}{:?} without a datagram) -> {}",
                    l.address,
                    u.responses
                        .map(|n| format!("{n} answer(s) per datagram or "))
                        .unwrap_or_default(),
                    u.idle,
                    default
                )
            }
            (None, None) => writeln!(
                s,
                "listener {} (backlog {backlog}{}) -> {}",
                l.address,
                match (l.mode, l.h2c) {
                    (pinlb::config::ListenerMode::Tcp, _) => "; TCP, bytes relayed unread".into(),
                    (_, true) => "; HTTP/1.1 and h2c".into(),
                    _ => String::new(),
                },
                default
            ),
        };
        for r in &l.sni {
            let names: Vec<String> = r.names.iter().map(ToString::to_string).collect();
            let alpn: Vec<String> = (r.alpn.iter())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let _ = writeln!(
                s,
                "  TLS server name {}{} -> upstream {} (relayed untouched)",
                names.join(", "),
                if alpn.is_empty() {
                    String::new()
                } else {
                    format!(" offering ALPN {}", alpn.join(" or "))
                },
                config.upstreams[r.upstream].name
            );
        }
        for line in super::features::listener(l, config) {
            let _ = writeln!(s, "  {line}");
        }
        for (i, r) in l.routes.iter().enumerate() {
            let _ = writeln!(s, "  route[{i}] {}", describe_route(r, &config.upstreams));
            for line in super::features::route(r, l, config) {
                let _ = writeln!(s, "    {line}");
            }
        }
        if !l.routes.is_empty() {
            let _ = writeln!(s, "  no route matches -> {default}");
        }
    }
    for (index, u) in config.upstreams.iter().enumerate() {
        let t = &u.timeouts;
        let _ = if u.udp && !u.tcp {
            writeln!(
                s,
                "upstream {}: {}, UDP listeners' (a session to one backend each)",
                u.name,
                u.algorithm.as_str()
            )
        } else if u.tcp {
            writeln!(
                s,
                "upstream {}: {}, TCP listeners' (a connection to one backend each), timeouts connect {:?} tunnel_idle {:?} tunnel_fin {:?}",
                u.name,
                u.algorithm.as_str(),
                t.connect,
                u.upgrade.tunnel_idle,
                u.upgrade.tunnel_fin
            )
        } else {
            writeln!(
                s,
                "upstream {}: {}, keepalive {} per backend per worker, timeouts connect {:?} response {:?} send {:?} client_idle {:?}",
                u.name,
                u.algorithm.as_str(),
                u.keepalive,
                t.connect,
                t.response,
                t.send,
                t.client_idle
            )
        };
        if let Some(key) = &u.hash {
            let _ = writeln!(
                s,
                "  hash on {key}: rendezvous (consistent) hashing by weight; requests without the key go round robin"
            );
        }
        for line in super::features::upstream(index, u, config) {
            let _ = writeln!(s, "  {line}");
        }
        if let Some(st) = &u.sticky {
            let _ = writeln!(
                s,
                "  sticky: cookie {}=VALUE{}; its backend first while that one can take the request, others by {}",
                st.cookie,
                st.attributes(),
                u.algorithm.as_str()
            );
        }
        if u.algorithm == pinlb::config::Algorithm::Ewma {
            let _ = writeln!(
                s,
                "  ewma: two random choices on peak response time x (in flight + 1), decay {:?}",
                u.ewma_decay
            );
        }
        match &u.health {
            None => {
                let _ = writeln!(s, "  health checks: off");
            }
            Some(h) if h.tcp.is_some() => {
                let check = h.tcp.as_ref().map(|c| {
                    let mut what = match c.mysql {
                        true => "connect, read the MySQL greeting".to_string(),
                        false => "connect".to_string(),
                    };
                    if !c.send.is_empty() {
                        what += &format!(", send \"{}\"", c.send.escape_ascii());
                    }
                    if !c.receive.is_empty() {
                        what += &format!(", expect \"{}\"", c.receive.escape_ascii());
                    }
                    what
                });
                let _ = writeln!(
                    s,
                    "  health checks: {} every {:?}, timeout {:?}, rise {} fall {}",
                    check.unwrap_or_default(),
                    h.interval,
                    h.timeout,
                    h.rise,
                    h.fall
                );
            }
            Some(h) => {
                let _ = writeln!(
                    s,
                    "  health checks: GET {} every {:?}, timeout {:?}, rise {} fall {}, expect {}{}",
                    h.path,
                    h.interval,
                    h.timeout,
                    h.rise,
                    h.fall,
                    h.expect,
                    h.host
                        .as_deref()
                        .map(|h| format!(", host {h}"))
                        .unwrap_or_default()
                );
            }
        }
        if u.protocol.is_http2() {
            let _ = writeln!(
                s,
                "  HTTP/2 to backends ({}): up to {} streams per connection",
                u.protocol.as_str(),
                u.max_streams
            );
        }
        if let Some(f) = &u.fastcgi {
            let _ = writeln!(s, "  FastCGI to backends: {}", f.summary());
        }
        if let Some(tls) = &u.tls {
            let _ = writeln!(s, "  TLS to backends: {}", tls.summary());
        }
        let p = &u.passive;
        if p.max_fails == 0 {
            let _ = writeln!(s, "  passive checks: off");
        } else {
            let _ = writeln!(
                s,
                "  passive checks: max_fails {} within fail_timeout {:?}{}",
                p.max_fails,
                p.fail_timeout,
                if p.fail_on_status.is_empty() {
                    String::new()
                } else {
                    format!(", statuses {} count as failures", p.fail_on_status)
                }
            );
        }
        // The learned limit (or the fixed max_conns) and the queue, as the start-up log says.
        let _ = writeln!(s, "  {}", pinlb::upstream::adaptive::summary(u));
        let r = &u.retry;
        let tries = if r.tries == 0 {
            "every backend once".to_string()
        } else {
            format!("at most {} tries", r.tries)
        };
        let _ = if u.udp && !u.tcp {
            Ok(())
        } else if u.tcp {
            writeln!(
                s,
                "  retry: a failed connect moves on to the next backend, {tries} within {:?}",
                r.timeout
            )
        } else {
            writeln!(
                s,
                "  retry: {tries} within {:?}, non_idempotent {}, bodies up to {} bytes kept for replay",
                r.timeout, r.non_idempotent, r.buffer
            )
        };
        if let Some(sp) = &u.spawn {
            let last = |bank| sp.address(sp.count - 1, bank).port();
            let _ = writeln!(
                s,
                "  spawn: {} process(es) of `{}` on cores {}, ports {}-{} ({}-{} while a rolling restart replaces them), on {}, grace {:?}, ready_timeout {:?}",
                sp.count,
                sp.command.join(" "),
                format_cpu_list(&sp.cpus),
                sp.port_base,
                last(0),
                sp.address(0, 1).port(),
                last(1),
                sp.host,
                sp.grace,
                sp.ready_timeout
            );
        }
        for b in &u.backends {
            let mut extra = String::new();
            if let Some(c) = b.cpus.as_deref() {
                let _ = write!(extra, ", cores {}", format_cpu_list(c));
            }
            if b.max_conns > 0 {
                let _ = write!(extra, ", max_conns {}", b.max_conns);
            }
            if !b.slow_start.is_zero() {
                let _ = write!(extra, ", slow_start {:?}", b.slow_start);
            }
            if b.backup {
                extra.push_str(", backup (only while no primary is available)");
            }
            let _ = writeln!(s, "  backend {} weight {}{extra}", b.address, b.weight);
        }
    }
    match &config.admin {
        None => {
            let _ = writeln!(s, "admin: off");
        }
        Some(a) => {
            let _ = writeln!(
                s,
                "admin: http://{}/ (metrics, status, control, reload){}",
                a.address,
                if a.token.is_some() {
                    ", bearer token required"
                } else {
                    ""
                }
            );
        }
    }
    match &config.access_log {
        None => {
            let _ = writeln!(s, "access log: off");
        }
        Some(a) => {
            let _ = writeln!(
                s,
                "access log: {} ({})",
                match &a.target {
                    AccessTarget::Stdout => "stdout".to_string(),
                    AccessTarget::File(p) => p.display().to_string(),
                },
                match a.format {
                    AccessFormat::Combined => "combined",
                    AccessFormat::Json => "json",
                    AccessFormat::Template(_) => "template",
                }
            );
        }
    }
    for w in &config.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}

/// One route as `check` prints it: what it matches, then what it does.
fn describe_route(r: &pinlb::config::RouteRule, upstreams: &[pinlb::config::Upstream]) -> String {
    use pinlb::config::RouteAction;
    let mut out = String::new();
    if !r.hosts.is_empty() {
        let hosts: Vec<String> = r.hosts.iter().map(ToString::to_string).collect();
        let _ = write!(out, "host {} ", hosts.join(","));
    }
    let _ = write!(out, "path {}", r.path);
    if !r.methods.is_empty() {
        let methods: Vec<&str> = r.methods.iter().map(http::Method::as_str).collect();
        let _ = write!(out, " methods {}", methods.join(","));
    }
    for (name, value) in &r.headers {
        let _ = write!(out, " header {name}: {value}");
    }
    match &r.action {
        RouteAction::Proxy {
            upstream,
            rewrite_prefix,
        } => {
            let _ = write!(out, " -> upstream {}", upstreams[*upstream].name);
            if let Some(p) = rewrite_prefix {
                let _ = write!(out, ", prefix rewritten to {p}");
            }
        }
        RouteAction::Redirect { status, location } => {
            let _ = write!(out, " -> redirect {status} to {location}");
        }
        RouteAction::Respond { status, body } => {
            let _ = write!(out, " -> respond {status} ({} bytes)", body.len());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_gives_the_body_limit_in_bytes() {
        let c = Config::parse(
            "pinlb.toml",
            "[limits]\nmax_body = \"1MiB\"\n[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n[upstream.app]\nbackends = [{ address = \"127.0.0.1:8881\" }]\n",
            &[0],
        )
        .unwrap();
        assert!(
            describe(&c).contains("body 1048576 bytes"),
            "{}",
            describe(&c)
        );
    }
}
