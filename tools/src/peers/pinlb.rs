//! pinlb's configuration for one layout: a worker per proxy core, one listener, every backend.

use super::{KEEPALIVE, Spec};

/// The configuration `pinlb serve` runs on; its timeouts are its defaults, which the peers'
/// configurations copy. With `spec.admin`, its admin listener there, last (a reader of the
/// file finds the listener's address first).
pub fn config(spec: &Spec) -> String {
    let list: Vec<String> = spec
        .backends
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    let cpus: Vec<String> = spec.cores.iter().map(|c| c.to_string()).collect();
    let admin = spec
        .admin
        .map(|a| format!("\n[admin]\naddress = \"{a}\"\n"))
        .unwrap_or_default();
    format!(
        "# Written by pinlb for one layout (benches/peers/pinlb.toml, generated).\n[runtime]\ncpus = [{}]\nshutdown_timeout = \"1s\"\n\n[limits]\nmax_connections = {}\n\n[[listener]]\naddress = \"127.0.0.1:{}\"\nupstream = \"app\"\n\n[upstream.app]\nalgorithm = \"round_robin\"\nkeepalive = {KEEPALIVE}\nbackends = [{}]\n{admin}",
        cpus.join(", "),
        spec.max_connections,
        spec.port,
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_worker_per_core_and_every_backend() {
        let backends = [
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        let spec = Spec {
            cores: &[0, 1],
            port: 8080,
            backends: &backends,
            max_connections: 40_000,
            dir: Path::new("/tmp"),
            admin: Some("127.0.0.1:9902".parse().unwrap()),
        };
        let toml = config(&spec);
        let cores = pinlb::sys::cpus::allowed_cpus().unwrap();
        // Parsed as `pinlb serve` would, when this machine has the cores.
        if cores.len() >= 2 {
            let toml = toml.replace(
                "cpus = [0, 1]",
                &format!("cpus = [{}, {}]", cores[0], cores[1]),
            );
            let c = pinlb::Config::parse("sweep.toml", &toml, &cores).unwrap();
            assert_eq!(c.runtime.cpus, [cores[0], cores[1]]);
        }
        assert!(toml.contains("max_connections = 40000"), "{toml}");
        assert!(toml.contains("keepalive = 64"), "{toml}");
        assert!(toml.contains("{ address = \"127.0.0.1:1\" }, { address = \"127.0.0.1:2\" }"));
        // The admin listener last: the first address in the file is the listener's.
        assert!(
            toml.ends_with("\n[admin]\naddress = \"127.0.0.1:9902\"\n"),
            "{toml}"
        );
        let first = toml.lines().find_map(|l| l.strip_prefix("address = "));
        assert_eq!(first, Some("\"127.0.0.1:8080\""));
    }
}
