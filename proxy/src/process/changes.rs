//! What a reload changes, one line each, for the log and `POST /reload`'s answer: upstreams,
//! backends and listeners added or removed, and every setting that differs between the running
//! configuration and the new one, named by its key as the file writes it (`upstream app:
//! health.interval 2s -> 5s`). What a running process cannot change comes in as `kept`, lines
//! that say so.

use std::fmt::{Debug, Write};

use crate::config::{Backend, Config, Listener, RouteRule, Upstream};
use crate::modules::Configs;
use crate::process::listen::listener_keys;

/// What a reload changes, one line each, for the log and the reply.
pub(crate) fn describe(
    before: &Config,
    after: &Config,
    bound: &[std::net::SocketAddr],
    kept: &[String],
) -> String {
    let mut s = String::new();
    for u in &after.upstreams {
        match before.upstreams.iter().find(|b| b.name == u.name) {
            None => {
                let _ = writeln!(s, "upstream {}: added", u.name);
            }
            Some(old) => {
                for b in &u.backends {
                    if !old.backends.iter().any(|o| o.address == b.address) {
                        let _ = writeln!(s, "upstream {}: backend {} added", u.name, b.address);
                    }
                }
                for o in &old.backends {
                    if !u.backends.iter().any(|b| b.address == o.address) {
                        let _ = writeln!(
                            s,
                            "upstream {}: backend {} removed; its requests in flight finish",
                            u.name, o.address
                        );
                    }
                }
                upstream_settings(&mut s, old, u);
            }
        }
    }
    for old in &before.upstreams {
        if !after.upstreams.iter().any(|u| u.name == old.name) {
            let _ = writeln!(s, "upstream {}: removed", old.name);
        }
    }
    for a in bound {
        let _ = writeln!(s, "listening on {a}");
    }
    let kept_keys = listener_keys(&after.listeners);
    for (i, key) in listener_keys(&before.listeners).iter().enumerate() {
        if !kept_keys.contains(key) {
            let _ = writeln!(
                s,
                "stopped listening on {} (was listener[{i}]); its connections finish",
                key.0
            );
        }
    }
    for l in &after.listeners {
        if let Some(old) = before.listeners.iter().find(|o| o.address == l.address) {
            listener_settings(&mut s, (before, old), (after, l));
        }
    }
    global_settings(&mut s, before, after);
    for k in kept {
        let _ = writeln!(s, "{k}");
    }
    s.trim_end().to_string()
}

/// Writes `place: key old -> new` when the two differ.
fn changed<T: PartialEq + Debug>(s: &mut String, place: &str, key: &str, old: &T, new: &T) {
    if old != new {
        let _ = writeln!(s, "{place}: {key} {old:?} -> {new:?}");
    }
}

/// An upstream's own settings and each kept backend's.
fn upstream_settings(s: &mut String, old: &Upstream, new: &Upstream) {
    let place = format!("upstream {}", new.name);
    let p = place.as_str();
    if old.algorithm != new.algorithm {
        let (a, b) = (old.algorithm.as_str(), new.algorithm.as_str());
        let _ = writeln!(s, "{p}: algorithm {a} -> {b}");
    }
    if old.protocol != new.protocol {
        let (a, b) = (old.protocol.as_str(), new.protocol.as_str());
        let _ = writeln!(s, "{p}: protocol {a} -> {b}");
    }
    changed(s, p, "keepalive", &old.keepalive, &new.keepalive);
    changed(s, p, "max_streams", &old.max_streams, &new.max_streams);
    changed(s, p, "queue", &old.queue, &new.queue);
    changed(
        s,
        p,
        "max_connecting",
        &old.max_connecting,
        &new.max_connecting,
    );
    changed(s, p, "ewma_decay", &old.ewma_decay, &new.ewma_decay);
    if old.hash != new.hash {
        let show = |h: &Option<_>| h.as_ref().map_or("none".to_string(), |h| format!("{h}"));
        let _ = writeln!(s, "{p}: hash {} -> {}", show(&old.hash), show(&new.hash));
    }
    let (a, b) = (&old.timeouts, &new.timeouts);
    changed(s, p, "timeouts.connect", &a.connect, &b.connect);
    changed(s, p, "timeouts.response", &a.response, &b.response);
    changed(s, p, "timeouts.send", &a.send, &b.send);
    changed(s, p, "timeouts.client_idle", &a.client_idle, &b.client_idle);
    changed(s, p, "timeouts.queue", &a.queue, &b.queue);
    match (&old.health, &new.health) {
        (Some(a), Some(b)) => {
            changed(s, p, "health.path", &a.path, &b.path);
            changed(s, p, "health.interval", &a.interval, &b.interval);
            changed(s, p, "health.timeout", &a.timeout, &b.timeout);
            changed(s, p, "health.rise", &a.rise, &b.rise);
            changed(s, p, "health.fall", &a.fall, &b.fall);
            changed(s, p, "health.host", &a.host, &b.host);
            if a.expect != b.expect {
                let _ = writeln!(s, "{p}: health.expect {} -> {}", a.expect, b.expect);
            }
        }
        (None, Some(_)) => {
            let _ = writeln!(s, "{p}: health checks on");
        }
        (Some(_), None) => {
            let _ = writeln!(s, "{p}: health checks off");
        }
        (None, None) => {}
    }
    let (a, b) = (&old.passive, &new.passive);
    changed(s, p, "passive.max_fails", &a.max_fails, &b.max_fails);
    changed(
        s,
        p,
        "passive.fail_timeout",
        &a.fail_timeout,
        &b.fail_timeout,
    );
    if a.fail_on_status != b.fail_on_status {
        let (x, y) = (&a.fail_on_status, &b.fail_on_status);
        let _ = writeln!(s, "{p}: passive.fail_on_status {x} -> {y}");
    }
    let (a, b) = (&old.retry, &new.retry);
    changed(s, p, "retry.tries", &a.tries, &b.tries);
    changed(s, p, "retry.timeout", &a.timeout, &b.timeout);
    changed(
        s,
        p,
        "retry.non_idempotent",
        &a.non_idempotent,
        &b.non_idempotent,
    );
    changed(s, p, "retry.buffer", &a.buffer, &b.buffer);
    let (a, b) = (&old.upgrade, &new.upgrade);
    changed(s, p, "upgrade.enabled", &a.enabled, &b.enabled);
    changed(s, p, "upgrade.tunnel_idle", &a.tunnel_idle, &b.tunnel_idle);
    if old.tls != new.tls {
        let _ = writeln!(s, "{p}: [tls] changed (files, name or trust)");
    }
    changed(
        s,
        p,
        "resolve.interval",
        &old.resolve.interval,
        &new.resolve.interval,
    );
    for b in &new.backends {
        if let Some(o) = old.backends.iter().find(|o| o.address == b.address) {
            backend_settings(s, p, o, b);
        }
    }
}

fn backend_settings(s: &mut String, upstream: &str, old: &Backend, new: &Backend) {
    let place = format!("{upstream}: backend {}", new.address);
    let p = place.as_str();
    changed(s, p, "weight", &old.weight, &new.weight);
    changed(s, p, "max_conns", &old.max_conns, &new.max_conns);
    changed(s, p, "slow_start", &old.slow_start, &new.slow_start);
    changed(s, p, "backup", &old.backup, &new.backup);
    changed(s, p, "cpus", &old.cpus, &new.cpus);
}

/// A kept listener's settings; its upstream by name, as the file writes it.
fn listener_settings(s: &mut String, old: (&Config, &Listener), new: (&Config, &Listener)) {
    let ((before, a), (after, b)) = (old, new);
    let place = format!("listener {}", b.address);
    let p = place.as_str();
    let name = |c: &Config, l: &Listener| c.upstreams.get(l.upstream).map(|u| u.name.clone());
    changed(s, p, "mode", &a.mode, &b.mode);
    changed(s, p, "upstream", &name(before, a), &name(after, b));
    changed(s, p, "h2c", &a.h2c, &b.h2c);
    if a.sni != b.sni {
        let _ = writeln!(
            s,
            "{p}: sni changed ({} -> {} tables)",
            a.sni.len(),
            b.sni.len()
        );
    }
    changed(s, p, "udp sessions", &a.udp, &b.udp);
    // Applied to the running sockets: Linux takes listen(2) again on a listening socket.
    changed(s, p, "backlog", &a.backlog, &b.backlog);
    if a.tls != b.tls {
        let _ = writeln!(s, "{p}: [listener.tls] changed (certificates or protocols)");
    }
    // A route's modules hold what it inherits from its listener too: the routes changed when
    // what they match or do did, and a route's module when its own did, not its listener's.
    let own = |r: &RouteRule| RouteRule {
        modules: Configs::default(),
        ..r.clone()
    };
    let pairs = || a.routes.iter().zip(&b.routes);
    if a.routes.len() != b.routes.len() || pairs().any(|(x, y)| own(x) != own(y)) {
        let (x, y) = (a.routes.len(), b.routes.len());
        let _ = writeln!(s, "{p}: routes changed ({x} -> {y} routes)");
    }
    let listener = b.modules.changed(&a.modules);
    for key in &listener {
        let _ = writeln!(s, "{p}: {key} changed");
    }
    if a.routes.len() == b.routes.len() {
        for (i, (x, y)) in pairs().enumerate() {
            for key in y.modules.changed(&x.modules) {
                if !listener.contains(&key) {
                    let _ = writeln!(s, "{p}: route[{i}] {key} changed");
                }
            }
        }
    }
}

/// The sections every listener shares: `[limits]`, `[http2]`, `forwarded.trusted`.
fn global_settings(s: &mut String, before: &Config, after: &Config) {
    let (a, b) = (&before.limits, &after.limits);
    let p = "[limits]";
    changed(
        s,
        p,
        "max_header_bytes",
        &a.max_header_bytes,
        &b.max_header_bytes,
    );
    changed(s, p, "max_headers", &a.max_headers, &b.max_headers);
    changed(s, p, "max_uri_bytes", &a.max_uri_bytes, &b.max_uri_bytes);
    changed(s, p, "max_body", &a.max_body, &b.max_body);
    changed(s, p, "header_timeout", &a.header_timeout, &b.header_timeout);
    changed(s, p, "body_timeout", &a.body_timeout, &b.body_timeout);
    let (a, b) = (&before.http2, &after.http2);
    let p = "[http2]";
    changed(
        s,
        p,
        "max_concurrent_streams",
        &a.max_concurrent_streams,
        &b.max_concurrent_streams,
    );
    changed(
        s,
        p,
        "initial_stream_window",
        &a.initial_stream_window,
        &b.initial_stream_window,
    );
    changed(
        s,
        p,
        "initial_connection_window",
        &a.initial_connection_window,
        &b.initial_connection_window,
    );
    changed(s, p, "ping_interval", &a.ping_interval, &b.ping_interval);
    changed(s, p, "ping_timeout", &a.ping_timeout, &b.ping_timeout);
    if before.trusted != after.trusted {
        let _ = writeln!(s, "[forwarded]: trusted changed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listener_keys: &str) -> Config {
        let text = format!(
            "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n{listener_keys}\n[upstream.app]\nbackends = [{{ address = \"127.0.0.1:8881\" }}]\n"
        );
        Config::parse("pinlb.toml", &text, &[0]).expect("valid")
    }

    #[test]
    fn a_changed_backlog_is_listed() {
        let before = config("backlog = 128");
        assert_eq!(
            describe(&before, &config("backlog = 64"), &[], &[]),
            "listener 127.0.0.1:8888: backlog 128 -> 64"
        );
        assert_eq!(describe(&before, &config("backlog = 128"), &[], &[]), "");
    }

    #[test]
    fn a_changed_module_is_listed_by_its_keys() {
        let before = config("compress = true");
        assert_eq!(
            describe(&before, &config("compress = { gzip_level = 6 }"), &[], &[]),
            "listener 127.0.0.1:8888: compress changed"
        );
        assert_eq!(
            describe(
                &before,
                &config("limit_rate = \"1MiB\"\ncompress = true"),
                &[],
                &[]
            ),
            "listener 127.0.0.1:8888: limit_rate or limit_rate_after changed"
        );
        assert_eq!(describe(&before, &config("compress = true"), &[], &[]), "");
    }

    #[test]
    fn a_listeners_module_changed_is_not_its_routes_changing() {
        let routes = "[[listener.route]]\npath = \"/a/\"\nupstream = \"app\"\n";
        let before = config(&format!("compress = true\n{routes}"));
        let after = config(&format!("compress = {{ gzip_level = 6 }}\n{routes}"));
        assert_eq!(
            describe(&before, &after, &[], &[]),
            "listener 127.0.0.1:8888: compress changed"
        );
        let own = config(&format!("compress = true\n{routes}limit_rate = \"1MiB\"\n"));
        assert_eq!(
            describe(&before, &own, &[], &[]),
            "listener 127.0.0.1:8888: route[0] limit_rate or limit_rate_after changed"
        );
    }
}
