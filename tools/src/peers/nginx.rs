//! nginx's configuration for one layout, as `benches/peers/nginx.conf` but generated: a worker
//! per proxy core pinned to it, every backend kept alive, pinlb's timeouts, no access log, and
//! every path it writes inside the proxy's own directory.

use std::fmt::Write as _;

use super::{KEEPALIVE, Spec, Timeouts, secs};

/// The configuration for `nginx -p DIR -c DIR/nginx.conf`. `built` is what `nginx -V` printed:
/// a temporary path is only set for the modules it was built with (Debian's light builds leave
/// some out, and the directive of a missing module is an error). `nofile` is the hard open file
/// limit, which the workers raise theirs to, as pinlb does.
pub fn config(spec: &Spec, built: &str, nofile: Option<u64>) -> String {
    let t = Timeouts::default();
    let dir = spec.dir.display();
    let mut s = String::from(
        "# Written by pinlb for one layout (benches/peers/nginx.conf, generated).\ndaemon off;\nmaster_process on;\n",
    );
    let _ = writeln!(s, "worker_processes {};", spec.cores.len());
    let _ = writeln!(s, "worker_cpu_affinity {};", affinity(spec.cores));
    if let Some(n) = nofile {
        let _ = writeln!(s, "worker_rlimit_nofile {};", n.min(1 << 20));
    }
    let _ = writeln!(s, "pid {dir}/nginx.pid;\nerror_log {dir}/error.log warn;\n");
    // A worker's connections count the backends' too: room for every client and its backend.
    let _ = writeln!(
        s,
        "events {{\n    worker_connections {};\n}}\n",
        2 * spec.max_connections
    );
    s.push_str("http {\n");
    let _ = writeln!(s, "    client_body_temp_path {dir}/tmp/body;");
    for m in ["proxy", "fastcgi", "uwsgi", "scgi"] {
        if !built.contains(&format!("--without-http_{m}_module")) {
            let _ = writeln!(s, "    {m}_temp_path {dir}/tmp/{m};");
        }
    }
    let _ = writeln!(
        s,
        "    access_log off;\n    gzip off;\n    server_tokens off;\n    client_header_timeout {};\n    client_body_timeout {};\n    keepalive_timeout {};\n    # Client side: like pinlb and HAProxy, no limit of requests per connection.\n    keepalive_requests 1000000;\n",
        secs(t.header),
        secs(t.body),
        secs(t.client_idle)
    );
    s.push_str("    upstream app {\n");
    for b in spec.backends {
        let _ = writeln!(s, "        server {b};");
    }
    let _ = writeln!(
        s,
        "        keepalive {};\n        keepalive_requests 1000000;\n        keepalive_timeout 300s;\n    }}\n",
        KEEPALIVE * spec.backends.len().max(1)
    );
    let _ = writeln!(
        s,
        "    server {{\n        listen 127.0.0.1:{} backlog=4096;\n        location / {{\n            proxy_pass http://app;\n            proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n            proxy_connect_timeout {};\n            proxy_read_timeout {};\n            proxy_send_timeout {};\n        }}\n    }}\n}}",
        spec.port,
        secs(t.connect),
        secs(t.response),
        secs(t.send)
    );
    s
}

/// `worker_cpu_affinity`'s masks, worker `i` on `cores[i]`: core 0 is the rightmost bit, so
/// cores 0 and 2 are `001 100`.
fn affinity(cores: &[usize]) -> String {
    let width = cores.iter().max().map_or(1, |m| m + 1);
    cores
        .iter()
        .map(|&c| {
            let mut mask = "0".repeat(width);
            mask.replace_range(width - 1 - c..width - c, "1");
            mask
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn workers_are_pinned_one_per_core_by_mask() {
        assert_eq!(affinity(&[0]), "1");
        assert_eq!(affinity(&[0, 2]), "001 100");
        assert_eq!(affinity(&[3, 1]), "1000 0010");
    }

    #[test]
    fn the_configuration_keeps_alive_and_writes_only_in_its_directory() {
        let backends = [
            "127.0.0.1:81".parse().unwrap(),
            "127.0.0.1:82".parse().unwrap(),
        ];
        let spec = Spec {
            cores: &[1, 2],
            port: 8080,
            backends: &backends,
            max_connections: 10_000,
            dir: Path::new("/x/p1"),
            admin: None,
        };
        let c = config(
            &spec,
            "configure arguments: --without-http_uwsgi_module",
            Some(4096),
        );
        for want in [
            "worker_processes 2;",
            "worker_cpu_affinity 010 100;",
            "worker_rlimit_nofile 4096;",
            "pid /x/p1/nginx.pid;",
            "error_log /x/p1/error.log warn;",
            "worker_connections 20000;",
            "proxy_temp_path /x/p1/tmp/proxy;",
            "server 127.0.0.1:81;",
            "server 127.0.0.1:82;",
            "keepalive 128;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "access_log off;",
            "listen 127.0.0.1:8080",
            "proxy_connect_timeout 5s;",
            "keepalive_timeout 60s;",
        ] {
            assert!(c.contains(want), "{want} in:\n{c}");
        }
        assert!(!c.contains("uwsgi_temp_path"), "{c}");
    }
}
