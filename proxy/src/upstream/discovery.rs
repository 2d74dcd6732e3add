//! Backends from DNS: the names in `backends` (`address = "NAME:PORT"` for A/AAAA records,
//! `srv = "_service._tcp.NAME"` for SRV) looked up with hickory-resolver, and a configuration
//! with each name expanded into the backends its answer gives.
//!
//! Lookups run on the control thread only (at start, in `pinlb check`, and in `dns_watch`'s
//! loop); workers see resolved addresses as ordinary backends of a configuration generation, so
//! the request path does no DNS and takes no lock.
//!
//! An SRV answer gives its records of the most preferred priority (the lowest number), each
//! target's addresses at the record's port with the record's weight (0, "rarely", counts as 1:
//! pinlb has no weight 0). A lookup that fails, or answers with no record, keeps the name's last
//! good set: a DNS outage must not empty an upstream.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;

use crate::config::{Backend, Config, DnsName};

/// How long one lookup (with its SRV targets) may take before it counts as failed.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a name could not be looked up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DnsError {
    #[error("cannot read /etc/resolv.conf: {0}")]
    System(String),
    #[error("{0}")]
    Lookup(String),
    #[error("no answer within {LOOKUP_TIMEOUT:?}")]
    Timeout,
}

/// The addresses one name gave, each with its weight.
pub type Addresses = Vec<(SocketAddr, u32)>;

/// A name's answer: its addresses, and how long the answer may be kept (its smallest TTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub addresses: Addresses,
    pub ttl: Duration,
}

/// Looks names up, with `[resolver]`'s nameservers or the system's.
pub struct Lookup {
    resolver: TokioResolver,
}

impl Lookup {
    /// A resolver for `nameservers` (UDP, and TCP when an answer is truncated), or
    /// `/etc/resolv.conf`'s when empty. It caches nothing: each lookup asks the server, so
    /// every answer's TTL is the server's and a change shows at the next lookup.
    pub fn new(nameservers: &[SocketAddr]) -> Result<Lookup, DnsError> {
        let (config, mut opts) = if nameservers.is_empty() {
            hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| DnsError::System(e.to_string()))?
        } else {
            let mut config = ResolverConfig::new();
            for &ns in nameservers {
                config.add_name_server(NameServerConfig::new(ns, Protocol::Udp));
                config.add_name_server(NameServerConfig::new(ns, Protocol::Tcp));
            }
            (config, ResolverOpts::default())
        };
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.cache_size = 0;
        // One try of a second per nameserver: a lookup that fails does not hold up the next
        // names' for long, and is tried again at the name's `min_interval` anyway.
        opts.timeout = Duration::from_secs(1);
        opts.attempts = 1;
        let resolver =
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
                .with_options(opts)
                .build();
        Ok(Lookup { resolver })
    }

    /// `name`'s addresses now, with `weight` for a host name's; bounded by [`LOOKUP_TIMEOUT`].
    pub async fn resolve(&self, name: &DnsName, weight: u32) -> Result<Answer, DnsError> {
        match tokio::time::timeout(LOOKUP_TIMEOUT, self.lookup(name, weight)).await {
            Ok(r) => r,
            Err(_) => Err(DnsError::Timeout),
        }
    }

    async fn lookup(&self, name: &DnsName, weight: u32) -> Result<Answer, DnsError> {
        self.resolver.clear_cache();
        let now = Instant::now();
        let failed = |e: hickory_resolver::ResolveError| DnsError::Lookup(e.to_string());
        match name {
            DnsName::Host { host, port } => {
                let (ips, ttl) = self.ips(host).await.map_err(failed)?;
                let mut addresses: Addresses = ips
                    .into_iter()
                    .map(|ip| (SocketAddr::new(ip, *port), weight))
                    .collect();
                addresses.sort();
                addresses.dedup_by_key(|a| a.0);
                Ok(Answer { addresses, ttl })
            }
            DnsName::Srv(srv) => {
                let answer = self
                    .resolver
                    .srv_lookup(srv.as_str())
                    .await
                    .map_err(failed)?;
                let mut ttl = answer
                    .as_lookup()
                    .valid_until()
                    .saturating_duration_since(now);
                let best = answer.iter().map(|r| r.priority()).min();
                let mut addresses = Addresses::new();
                for r in answer.iter().filter(|r| Some(r.priority()) == best) {
                    let target = r.target().to_ascii();
                    let (ips, target_ttl) = self
                        .ips(&target)
                        .await
                        .map_err(|e| DnsError::Lookup(format!("SRV target {target}: {e}")))?;
                    ttl = ttl.min(target_ttl);
                    for ip in ips {
                        addresses
                            .push((SocketAddr::new(ip, r.port()), u32::from(r.weight()).max(1)));
                    }
                }
                addresses.sort();
                addresses.dedup_by_key(|a| a.0);
                if addresses.is_empty() {
                    return Err(DnsError::Lookup(format!("{srv}: no SRV record")));
                }
                Ok(Answer { addresses, ttl })
            }
        }
    }

    /// A host's A and AAAA addresses, and for how long the answer holds.
    async fn ips(
        &self,
        host: &str,
    ) -> Result<(Vec<IpAddr>, Duration), hickory_resolver::ResolveError> {
        let now = Instant::now();
        let found = self.resolver.lookup_ip(host).await?;
        let ttl = found.valid_until().saturating_duration_since(now);
        Ok((found.iter().collect(), ttl))
    }
}

/// The last good answer of every name, by upstream and name.
pub type Answers = BTreeMap<(String, DnsName), Addresses>;

/// Each upstream's backends from the file followed by those its names gave in `answers`, in
/// the order the names are written, with that entry's settings; an address already present
/// (written as an IP, or given by an earlier name) is kept once, its first place.
pub fn expand(source: &Config, answers: &Answers) -> Config {
    let mut config = source.clone();
    for u in &mut config.upstreams {
        for n in &u.names {
            let Some(addresses) = answers.get(&(u.name.clone(), n.name.clone())) else {
                continue;
            };
            for &(address, weight) in addresses {
                if u.backends.iter().any(|b| b.address == address.into()) {
                    continue;
                }
                u.backends.push(Backend {
                    address: address.into(),
                    weight,
                    cpus: n.cpus.clone(),
                    max_conns: n.max_conns,
                    slow_start: n.slow_start,
                    backup: n.backup,
                });
            }
        }
    }
    config
}

/// What the control thread knows of names: the configuration as the file says (names
/// unexpanded), the last good answers, and the failures, for `/metrics` and `/status`.
#[derive(Default)]
pub struct State {
    /// A std mutex: only the control thread and the admin listener (on the same thread) take
    /// it, and nothing awaits while it is held.
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    source: Option<std::sync::Arc<Config>>,
    answers: Answers,
    /// Failed lookups, by upstream and name, since start.
    failures: BTreeMap<(String, DnsName), u64>,
    /// Names whose last lookup failed (warned about once, until one succeeds).
    failing: std::collections::BTreeSet<(String, DnsName)>,
}

/// A name's figures for `/status` and `/metrics`.
#[derive(Debug, Clone)]
pub struct NameStatus {
    pub upstream: String,
    pub name: DnsName,
    pub addresses: Addresses,
    pub failures: u64,
    pub failing: bool,
}

impl State {
    /// Keeps `source` as the file's configuration and returns it expanded with the answers so
    /// far of the names it still has (a reload keeps what a name it keeps resolved to).
    pub fn expand_new(&self, source: Config) -> Config {
        let mut inner = self.lock();
        let wanted: std::collections::BTreeSet<(String, DnsName)> = source
            .upstreams
            .iter()
            .flat_map(|u| u.names.iter().map(|n| (u.name.clone(), n.name.clone())))
            .collect();
        inner.answers.retain(|k, _| wanted.contains(k));
        let expanded = expand(&source, &inner.answers);
        inner.source = Some(std::sync::Arc::new(source));
        expanded
    }

    /// The file's configuration, as [`State::expand_new`] last kept it.
    pub fn source(&self) -> Option<std::sync::Arc<Config>> {
        self.lock().source.clone()
    }

    /// Records a good answer; returns whether it changed the name's set, and whether the name
    /// was failing before (so that its recovery is logged once).
    pub fn answered(&self, upstream: &str, name: &DnsName, addresses: Addresses) -> (bool, bool) {
        let mut inner = self.lock();
        let key = (upstream.to_string(), name.clone());
        let recovered = inner.failing.remove(&key);
        let changed = inner.answers.get(&key) != Some(&addresses);
        inner.answers.insert(key, addresses);
        (changed, recovered)
    }

    /// Counts a failed lookup; returns whether it is the first of a run (to warn once).
    pub fn failed(&self, upstream: &str, name: &DnsName) -> bool {
        let mut inner = self.lock();
        let key = (upstream.to_string(), name.clone());
        *inner.failures.entry(key.clone()).or_default() += 1;
        inner.failing.insert(key)
    }

    /// The file's configuration expanded with every answer so far.
    pub fn expanded(&self) -> Option<Config> {
        let inner = self.lock();
        inner.source.as_ref().map(|s| expand(s, &inner.answers))
    }

    /// Every name of the running configuration, with its addresses and failures.
    pub fn names(&self) -> Vec<NameStatus> {
        let inner = self.lock();
        let Some(source) = &inner.source else {
            return Vec::new();
        };
        source
            .upstreams
            .iter()
            .flat_map(|u| {
                u.names.iter().map(|n| {
                    let key = (u.name.clone(), n.name.clone());
                    NameStatus {
                        upstream: u.name.clone(),
                        name: n.name.clone(),
                        addresses: inner.answers.get(&key).cloned().unwrap_or_default(),
                        failures: inner.failures.get(&key).copied().unwrap_or(0),
                        failing: inner.failing.contains(&key),
                    }
                })
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// When to look a name up again after `answer`: its TTL within `[min, max]`.
pub fn next_lookup(ttl: Duration, min: Duration, max: Duration) -> Duration {
    ttl.clamp(min, max.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse("t.toml", text, &[0]).unwrap()
    }

    const TOML: &str = r#"
[[listener]]
address = "127.0.0.1:0"
upstream = "app"
[upstream.app]
backends = [
  { address = "127.0.0.1:9000" },
  { address = "app.internal:8080", weight = 3, max_conns = 7 },
  { srv = "_http._tcp.app.internal" },
]
"#;

    #[test]
    fn names_are_kept_apart_from_addresses_and_expanded_in_order_once_each() {
        let c = config(TOML);
        let u = &c.upstreams[0];
        assert_eq!(u.backends.len(), 1);
        assert_eq!(u.names.len(), 2);
        assert_eq!(u.names[0].name.to_string(), "app.internal:8080");
        assert_eq!(u.names[1].name.to_string(), "srv _http._tcp.app.internal");
        let a: SocketAddr = "127.0.0.1:9001".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:9002".parse().unwrap();
        let mut answers = Answers::new();
        answers.insert(("app".into(), u.names[0].name.clone()), vec![(a, 3)]);
        // The SRV name gives a again (kept once, at its first place) and b with its weight.
        answers.insert(
            ("app".into(), u.names[1].name.clone()),
            vec![(a, 5), (b, 5), ("127.0.0.1:9000".parse().unwrap(), 1)],
        );
        let e = expand(&c, &answers);
        let got: Vec<(String, u32, usize)> = e.upstreams[0]
            .backends
            .iter()
            .map(|b| (b.address.to_string(), b.weight, b.max_conns))
            .collect();
        assert_eq!(
            got,
            [
                ("127.0.0.1:9000".into(), 1, 0),
                ("127.0.0.1:9001".into(), 3, 7),
                ("127.0.0.1:9002".into(), 5, 0),
            ]
        );
        assert_eq!(expand(&c, &Answers::new()), c);
    }

    #[test]
    fn the_next_lookup_follows_the_ttl_within_the_bounds() {
        let s = Duration::from_secs;
        assert_eq!(next_lookup(s(2), s(1), s(5)), s(2));
        assert_eq!(next_lookup(s(0), s(1), s(5)), s(1));
        assert_eq!(next_lookup(s(3600), s(1), s(5)), s(5));
    }

    #[test]
    fn a_failure_is_reported_once_until_an_answer_comes_back() {
        let st = State::default();
        let name = DnsName::Srv("_x._tcp.y".into());
        assert!(st.failed("app", &name));
        assert!(!st.failed("app", &name));
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(st.answered("app", &name, vec![(a, 1)]), (true, true));
        assert_eq!(st.answered("app", &name, vec![(a, 1)]), (false, false));
        assert!(st.failed("app", &name));
    }
}
