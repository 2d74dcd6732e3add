//! `pinlb check`'s lines for what a listener, a route or an upstream does besides routing:
//! limits, access rules and auth, compression, header rules, timeouts, error pages, the PROXY
//! protocol, buffering. Each line says what is configured, as configured, so that a converted
//! configuration (`pinlb import`) shows everything it converted; a feature left at its default
//! gets no line. A route that sets timeouts of its own shows all three its requests get (its
//! own marked), and its upstream lists it: the upstream's line alone would read as if the
//! route's were lost.

use std::time::Duration;

use pinlb::config::{Config, Listener, RateLimit, RouteAction, RouteRule, Upstream};

/// A listener's lines, without their indent: what applies to its requests that no route
/// replaces.
pub fn listener(l: &Listener, config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if !l.rate_limits.is_empty() {
        out.push(format!(
            "rate limit: {}",
            rate_limits(&l.rate_limits, config)
        ));
    }
    if let Some(c) = &l.conn_limit {
        out.push(format!(
            "conn limit: {} open connections per client address, {} addresses tracked",
            c.max, c.keys
        ));
    }
    if let Some(from) = &l.proxy_protocol {
        let nets: Vec<String> = from.iter().map(ToString::to_string).collect();
        out.push(format!(
            "PROXY protocol: every connection begins with one, from {}",
            nets.join(", ")
        ));
    }
    out.extend(l.modules.describe());
    out
}

/// A route's lines, without their indent: what it sets of its own, each replacing its
/// listener's, and the timeouts its requests get from the upstream it proxies to.
pub fn route(r: &RouteRule, l: &Listener, config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    match &r.rate_limits {
        Some(limits) if limits.is_empty() => {
            out.push("rate limit: none (its listener's lifted)".into())
        }
        Some(limits) => out.push(format!("rate limit: {}", rate_limits(limits, config))),
        None => {}
    }
    if let RouteAction::Proxy { upstream, .. } = &r.action {
        let u = config.upstreams.get(*upstream);
        if let Some(u) = u.filter(|_| !own_timeouts(r).is_empty()) {
            out.push(format!("timeouts: {}", timeouts(r, u)));
        }
    }
    // The feature modules, where the route's are not its listener's.
    out.extend(r.modules.describe_over(&l.modules));
    out
}

/// An upstream's lines, without their indent, for what `check`'s other upstream lines do not
/// show: buffering, upgrades where they differ from the default, the PROXY protocol, and the
/// routes whose requests get timeouts other than the upstream's.
pub fn upstream(index: usize, u: &Upstream, config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(b) = &u.buffering {
        let bodies = match (b.request, b.response) {
            (true, true) => "request and response bodies",
            (true, false) => "request bodies",
            (false, true) => "response bodies",
            (false, false) => "no bodies",
        };
        out.push(format!(
            "buffering: {bodies}, {} bytes in memory, then a temporary file in {} of at most {} bytes",
            b.memory,
            b.temp_dir.display(),
            b.max_temp
        ));
    }
    let upgrade = &u.upgrade;
    if *upgrade != pinlb::config::Upgrade::default() {
        out.push(match upgrade.enabled {
            false => "upgrades: refused (upgrade = false)".into(),
            true => format!(
                "upgrades: passed on, tunnels closed after {:?} idle, {:?} after one side's FIN",
                upgrade.tunnel_idle, upgrade.tunnel_fin
            ),
        });
    }
    if let Some(v) = &u.proxy_protocol {
        out.push(format!(
            "PROXY protocol {} header first on every backend connection",
            match v {
                pinlb::config::ProxyVersion::V1 => "v1",
                pinlb::config::ProxyVersion::V2 => "v2",
            }
        ));
    }
    for (li, l) in config.listeners.iter().enumerate() {
        for (ri, r) in l.routes.iter().enumerate() {
            let to_it =
                matches!(r.action, RouteAction::Proxy { upstream, .. } if upstream == index);
            let own = own_timeouts(r);
            if to_it && !own.is_empty() {
                out.push(format!(
                    "route[{ri}] of listener[{li}] {} sets its own timeouts: {}",
                    l.address,
                    own.join(", ")
                ));
            }
        }
    }
    out
}

/// `zone api (10r/s per client_ip, 163840 keys), burst 20, over it 503`, for each zone.
fn rate_limits(limits: &[RateLimit], config: &Config) -> String {
    let each: Vec<String> = limits
        .iter()
        .map(|l| {
            let zone = match config.rate_zones.get(l.zone) {
                Some(z) => format!(
                    "zone {} ({} per {}, {} keys)",
                    z.name, z.rate, z.key, z.keys
                ),
                None => format!("zone #{}", l.zone),
            };
            format!("{zone}, burst {}, over it {}", l.burst, l.status)
        })
        .collect();
    each.join("; ")
}

/// `connect 5s, response 30s (its own), send 60s`: what the route's requests get.
fn timeouts(r: &RouteRule, u: &Upstream) -> String {
    let t = &r.timeouts;
    let one = |name: &str, own: Option<Duration>, upstream: Duration| match own {
        Some(v) => format!("{name} {v:?} (its own)"),
        None => format!("{name} {upstream:?}"),
    };
    [
        one("connect", t.connect, u.timeouts.connect),
        one("response", t.response, u.timeouts.response),
        one("send", t.send, u.timeouts.send),
    ]
    .join(", ")
}

/// The timeouts a route sets, as `response 30s`.
fn own_timeouts(r: &RouteRule) -> Vec<String> {
    let t = &r.timeouts;
    [
        ("connect", t.connect),
        ("response", t.response),
        ("send", t.send),
    ]
    .into_iter()
    .filter_map(|(name, v)| v.map(|v| format!("{name} {v:?}")))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every feature a listener, a route and an upstream can set gets its line, as written.
    #[test]
    fn every_configured_feature_has_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("50x.html");
        std::fs::write(&page, "<p>down</p>").unwrap();
        let text = format!(
            r#"
[limit.api]
key = "header:X-Key"
rate = "5r/s"
keys = 1000

[[listener]]
address = "127.0.0.1:0"
access = ["allow 10.0.0.0/8", "deny all"]
rate_limit = [{{ zone = "api", burst = 3, nodelay = true }}]
conn_limit = {{ max = 50, keys = 2000 }}
compress = {{ algorithms = ["br", "gzip"], types = ["text/html"], min_length = 100 }}
proxy_protocol = true
proxy_protocol_from = ["10.0.0.0/8"]
server_timing = true
error_page = [{{ status = [502, 503], file = "{page}" }}]
limit_rate = "100KiB"
limit_rate_after = "1MiB"

[[listener.route]]
path = "/api/"
upstream = "app"
limit_rate = 0
rate_limit = []
compress = false
server_timing = false
intercept_errors = true
request_headers = {{ set = {{ "X-Real-IP" = "{{client_ip}}" }}, remove = ["X-Debug"] }}
response_headers = {{ add = {{ "X-Served-By" = "pinlb" }} }}
timeouts = {{ response = "30s" }}

[[listener.route]]
path = "/"
upstream = "app"

[upstream.app]
backends = [{{ address = "127.0.0.1:8081" }}]
upgrade = false
proxy_protocol = "v2"

[upstream.app.buffering]
response = false
temp_dir = "{dir}"
"#,
            page = page.display(),
            dir = dir.path().display()
        );
        let c = Config::parse("pinlb.toml", &text, &[0]).unwrap_or_else(|e| panic!("{e}"));
        let l = &c.listeners[0];
        assert_eq!(
            listener(l, &c),
            [
                "rate limit: zone api (5r/s per header:x-key, 1000 keys), burst 3, over it 429",
                "conn limit: 50 open connections per client address, 2000 addresses tracked",
                "PROXY protocol: every connection begins with one, from 10.0.0.0/8",
                "access: 2 rule(s), first allow 10.0.0.0/8",
                "error pages: 502, 503 from files",
                "server_timing on",
                "compress: br level 4, gzip level 1, types text/html, from 100 bytes",
                "limit_rate 100.0 KiB/s after 1.0 MiB",
            ]
        );
        assert_eq!(
            route(&l.routes[0], l, &c),
            [
                "rate limit: none (its listener's lifted)",
                "timeouts: connect 5s, response 30s (its own), send 60s",
                "request headers: set x-real-ip: {client_ip}; remove x-debug",
                "error pages: 502, 503 from files, intercept_errors on",
                "response headers: add x-served-by: pinlb",
                "server_timing: off",
                "compress: off",
                "limit_rate: off",
            ]
        );
        // Nothing of its own: its listener's apply, shown there.
        assert!(route(&l.routes[1], l, &c).is_empty());
        assert_eq!(
            upstream(0, &c.upstreams[0], &c),
            [
                format!(
                    "buffering: request bodies, 65536 bytes in memory, then a temporary file in {} of at most 1073741824 bytes",
                    dir.path().display()
                ),
                "upgrades: refused (upgrade = false)".into(),
                "PROXY protocol v2 header first on every backend connection".into(),
                "route[0] of listener[0] 127.0.0.1:0 sets its own timeouts: response 30s".into(),
            ]
        );
    }
}
