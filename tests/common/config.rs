//! Proxy configurations: the cores the tests may use, the TOML a test proxy runs with, and
//! config files written for the binary or a reload.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Pki, Proto, TLS_NAME};

/// The cores this test process may run on.
pub fn allowed() -> Vec<usize> {
    pinlb::sys::cpus::allowed_cpus().expect("read this process's allowed cores")
}

/// The first allowed core: a one-worker proxy runs there.
pub fn first_core() -> usize {
    allowed()[0]
}

/// A proxy configuration with one listener on a kernel-chosen port and one upstream `app`.
#[derive(Debug, Clone)]
pub struct Setup {
    pub cpus: Vec<usize>,
    pub algorithm: &'static str,
    pub backends: Vec<(SocketAddr, u32)>,
    pub keepalive: usize,
    pub connect_timeout: &'static str,
    pub response_timeout: &'static str,
    /// `timeouts.send`, when not the default.
    pub send_timeout: Option<&'static str>,
    pub client_idle: &'static str,
    /// `timeouts.tunnel_idle`, when not the default.
    pub tunnel_idle: Option<&'static str>,
    /// `timeouts.tunnel_fin`, when not the default.
    pub tunnel_fin: Option<&'static str>,
    /// `timeouts.queue`, when not the default.
    pub queue_timeout: Option<&'static str>,
    pub shutdown_timeout: &'static str,
    /// More TOML appended to the file, e.g. `[upstream.app.health]` and its keys.
    pub extra: String,
    /// More keys of the `[[listener]]` table, e.g. `h2c = true`, one per line.
    pub listener_keys: String,
    /// The keys of the listener's `[listener.tls]`, one per line (the table is written after
    /// `listener_keys`, so that a key added there stays the listener's); none: plain.
    pub tls: Option<String>,
    /// More keys of the `[upstream.app]` table itself, e.g. `max_conns = 1`, one per line.
    pub upstream_keys: String,
    /// More keys for each backend's inline table, by position in `backends`, e.g.
    /// `max_conns = 1` (several joined with ", "). Missing entries add nothing.
    pub backend_keys: Vec<String>,
}

impl Setup {
    /// Round robin through one worker on the first allowed core.
    pub fn new(backends: &[(SocketAddr, u32)]) -> Setup {
        Setup {
            cpus: vec![first_core()],
            algorithm: "round_robin",
            backends: backends.to_vec(),
            keepalive: 64,
            connect_timeout: "1s",
            response_timeout: "10s",
            send_timeout: None,
            client_idle: "30s",
            tunnel_idle: None,
            tunnel_fin: None,
            queue_timeout: None,
            shutdown_timeout: "3s",
            extra: String::new(),
            listener_keys: String::new(),
            tls: None,
            upstream_keys: String::new(),
            backend_keys: Vec::new(),
        }
    }

    /// Equal weights.
    pub fn with(backends: &[SocketAddr]) -> Setup {
        Setup::new(&backends.iter().map(|&a| (a, 1)).collect::<Vec<_>>())
    }

    /// A listener for `proto` to `backends` (equal weights): `h2c = true` for
    /// [`Proto::H2c`], a `[listener.tls]` with a certificate of `pki` for [`TLS_NAME`] for
    /// [`Proto::Http11Tls`] and [`Proto::H2Tls`], plain HTTP/1.1 for [`Proto::Http11`].
    pub fn for_proto(proto: Proto, backends: &[SocketAddr], pki: &Pki) -> Setup {
        let mut setup = Setup::with(backends);
        match proto {
            Proto::Http11 => {}
            Proto::H2c => setup.listener_keys += "h2c = true\n",
            Proto::Http11Tls | Proto::H2Tls => {
                let cert = pki.issue("listener", &[TLS_NAME], false);
                setup.tls = Some(format!("cert = {:?}\nkey = {:?}\n", cert.cert, cert.key));
            }
        }
        setup
    }

    pub fn toml(&self) -> String {
        let cpus = self
            .cpus
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let backends = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, (a, w))| match self.backend_keys.get(i) {
                Some(k) if !k.is_empty() => {
                    format!("  {{ address = \"{a}\", weight = {w}, {k} }},\n")
                }
                _ => format!("  {{ address = \"{a}\", weight = {w} }},\n"),
            })
            .collect::<String>();
        format!(
            r#"[runtime]
cpus = [{cpus}]
shutdown_timeout = "{shutdown}"

[[listener]]
address = "127.0.0.1:0"
upstream = "app"
{listener_keys}{tls}
[upstream.app]
algorithm = "{algorithm}"
keepalive = {keepalive}
{upstream_keys}
backends = [
{backends}]

[upstream.app.timeouts]
connect = "{connect}"
response = "{response}"
{send}client_idle = "{client_idle}"
{tunnel_idle}{tunnel_fin}{queue}
{extra}"#,
            shutdown = self.shutdown_timeout,
            algorithm = self.algorithm,
            keepalive = self.keepalive,
            connect = self.connect_timeout,
            response = self.response_timeout,
            send = self
                .send_timeout
                .map_or(String::new(), |t| format!("send = \"{t}\"\n")),
            client_idle = self.client_idle,
            tunnel_idle = self
                .tunnel_idle
                .map_or(String::new(), |t| format!("tunnel_idle = \"{t}\"\n")),
            tunnel_fin = self
                .tunnel_fin
                .map_or(String::new(), |t| format!("tunnel_fin = \"{t}\"\n")),
            queue = self
                .queue_timeout
                .map_or(String::new(), |t| format!("queue = \"{t}\"\n")),
            extra = self.extra,
            listener_keys = self.listener_keys,
            tls = self
                .tls
                .as_ref()
                .map_or(String::new(), |t| format!("[listener.tls]\n{t}")),
            upstream_keys = self.upstream_keys,
        )
    }
}

/// Writes `text` to a fresh file under cargo's scratch directory for integration tests.
pub fn temp_config(text: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pinlb-{}-{}.toml",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::write(&path, text).expect("write config");
    path
}
