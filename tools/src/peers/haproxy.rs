//! HAProxy's configuration for one layout, as `benches/peers/haproxy.cfg` but generated: a
//! thread per proxy core pinned to it, every backend reused across requests, pinlb's timeouts,
//! no log.

use std::fmt::Write as _;

use super::{Spec, Timeouts, secs};

/// The configuration for `haproxy -db -f FILE`. `nofile` is the hard open file limit: HAProxy
/// refuses to start when its `maxconn` needs more descriptors (two per connection and a few),
/// so `maxconn` is the spec's or what fits in it, whichever is less.
pub fn config(spec: &Spec, nofile: Option<u64>) -> String {
    let t = Timeouts::default();
    let mut s = String::from(
        "# Written by pinlb for one layout (benches/peers/haproxy.cfg, generated).\nglobal\n",
    );
    let _ = writeln!(s, "    nbthread {}", spec.cores.len());
    // Thread i (from 1) of process 1 (or, from 2.7, of thread group 1) on its core.
    for (i, c) in spec.cores.iter().enumerate() {
        let _ = writeln!(s, "    cpu-map 1/{} {c}", i + 1);
    }
    let _ = writeln!(
        s,
        "    maxconn {}\n    pidfile {}/haproxy.pid\n",
        max_connections(spec.max_connections, nofile),
        spec.dir.display()
    );
    let _ = writeln!(
        s,
        "defaults\n    mode http\n    option http-keep-alive\n    option forwardfor\n    http-reuse always\n    timeout connect {}\n    timeout server {}\n    timeout client {}\n    timeout http-keep-alive {}\n    timeout http-request {}\n",
        secs(t.connect),
        secs(t.response),
        secs(t.client_idle),
        secs(t.client_idle),
        secs(t.header)
    );
    let _ = writeln!(
        s,
        "frontend fe\n    bind 127.0.0.1:{}\n    default_backend app\n\nbackend app\n    balance roundrobin",
        spec.port
    );
    for (i, b) in spec.backends.iter().enumerate() {
        let _ = writeln!(s, "    server b{i} {b}");
    }
    s
}

/// `maxconn`: `wanted`, or what `nofile` descriptors allow (two per connection, and 100 for
/// HAProxy's own), whichever is less.
fn max_connections(wanted: usize, nofile: Option<u64>) -> usize {
    match nofile {
        Some(n) => wanted.min(usize::try_from(n.saturating_sub(100) / 2).unwrap_or(usize::MAX)),
        None => wanted,
    }
    .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_thread_per_core_pinned_and_every_backend_reused() {
        let backends = [
            "127.0.0.1:81".parse().unwrap(),
            "127.0.0.1:82".parse().unwrap(),
        ];
        let spec = Spec {
            cores: &[2, 3],
            port: 8080,
            backends: &backends,
            max_connections: 10_000,
            dir: Path::new("/x/p2"),
            admin: None,
        };
        let c = config(&spec, None);
        for want in [
            "nbthread 2\n",
            "cpu-map 1/1 2\n",
            "cpu-map 1/2 3\n",
            "maxconn 10000\n",
            "pidfile /x/p2/haproxy.pid\n",
            "option http-keep-alive\n",
            "http-reuse always\n",
            "timeout connect 5s\n",
            "bind 127.0.0.1:8080\n",
            "server b0 127.0.0.1:81\n",
            "server b1 127.0.0.1:82\n",
        ] {
            assert!(c.contains(want), "{want:?} in:\n{c}");
        }
        assert!(!c.contains("\n    log "), "no log: {c}");
        assert!(config(&spec, Some(20_000)).contains("maxconn 9950\n"));
        assert_eq!(max_connections(10_000, Some(1_048_576)), 10_000);
    }
}
