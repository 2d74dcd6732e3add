//! Configuration: the TOML file, in two stages.
//!
//! 1. **Raw** types mirror the file. They deny unknown keys and keep the byte span of every value
//!    that validation may need to point at.
//! 2. [`Config`] is the validated plan: addresses parsed, durations resolved, cores checked against
//!    the process's allowed set, upstreams referenced by index. Nothing downstream re-parses a
//!    string.
//!
//! Every error is a [`ConfigError`] that reads `file:line:col: key: what was expected`.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

use crate::cpus::{format_cpu_list, parse_cpu_list};

/// A configuration error that points at the offending place in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{col}: {}{message}", key_prefix(.key))]
pub struct ConfigError {
    /// The file name as the user gave it.
    pub file: String,
    /// 1-based line of the offending value.
    pub line: usize,
    /// 1-based column (in characters) of the offending value.
    pub col: usize,
    /// Dotted key path, e.g. `upstream.app.algorithm`; empty for syntax errors.
    pub key: String,
    /// What was wrong and what was expected.
    pub message: String,
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{key}: ")
    }
}

/// Balancing rule for an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// nginx's smooth weighted round robin.
    RoundRobin,
    /// Fewest in-flight requests per unit of weight, across all workers.
    LeastConn,
}

impl Algorithm {
    const NAMES: &'static str = "round_robin, least_conn";

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::RoundRobin => "round_robin",
            Algorithm::LeastConn => "least_conn",
        }
    }
}

impl<'de> Deserialize<'de> for Algorithm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "round_robin" => Ok(Algorithm::RoundRobin),
            "least_conn" => Ok(Algorithm::LeastConn),
            other => Err(de::Error::custom(format!(
                "unknown value \"{other}\", expected one of {}",
                Algorithm::NAMES
            ))),
        }
    }
}

/// A duration written as a string with a unit: "250ms", "2s", "1m".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string with a unit, such as \"250ms\", \"2s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                humantime::parse_duration(s).map(Dur).map_err(|_| {
                    E::custom(format!(
                        "invalid duration \"{s}\", expected a number with a unit, such as \"250ms\", \"2s\" or \"1m\""
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// A list of cores: `[0, 2]`, `"2-5"`, `"0,2-3"` or `[0, "2-5"]`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CpuList(Vec<usize>);

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a core id, a range string like \"2-5\", or a list of them";
        impl<'de> Visitor<'de> for V {
            type Value = CpuList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<CpuList, E> {
                usize::try_from(v)
                    .map(|c| CpuList(vec![c]))
                    .map_err(|_| E::custom(format!("invalid core {v}, expected {EXPECTED}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<CpuList, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<CpuList, E> {
                parse_cpu_list(s).map(CpuList).map_err(|e| {
                    E::custom(format!(
                        "invalid core list \"{s}\" ({e}), expected {EXPECTED}"
                    ))
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CpuList, A::Error> {
                let mut out = Vec::new();
                while let Some(CpuList(part)) = seq.next_element::<CpuList>()? {
                    out.extend(part);
                }
                Ok(CpuList(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(default, rename = "listener")]
    listeners: Vec<RawListener>,
    #[serde(default)]
    upstream: BTreeMap<String, RawUpstream>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    cpus: Option<Spanned<CpuList>>,
    shutdown_timeout: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    address: Spanned<String>,
    upstream: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    #[serde(default = "default_algorithm")]
    algorithm: Algorithm,
    #[serde(default = "default_keepalive")]
    keepalive: usize,
    backends: Spanned<Vec<RawBackend>>,
    #[serde(default)]
    timeouts: RawTimeouts,
}

fn default_algorithm() -> Algorithm {
    Algorithm::RoundRobin
}

fn default_keepalive() -> usize {
    64
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    address: Spanned<String>,
    #[serde(default = "default_weight")]
    weight: Spanned<u32>,
    cpus: Option<Spanned<CpuList>>,
}

fn default_weight() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    connect: Option<Spanned<Dur>>,
    response: Option<Spanned<Dur>>,
    client_idle: Option<Spanned<Dur>>,
}

/// The validated plan pinlb runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub runtime: Runtime,
    pub listeners: Vec<Listener>,
    pub upstreams: Vec<Upstream>,
    /// Non-fatal findings (a backend pinned to a proxy core), shown by `check` and logged at start.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// One worker thread per entry, pinned to that core. Sorted, no duplicates.
    pub cpus: Vec<usize>,
    /// How long in-flight requests may run on after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: SocketAddr,
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub name: String,
    pub algorithm: Algorithm,
    /// Idle connections kept per backend, per worker.
    pub keepalive: usize,
    pub backends: Vec<Backend>,
    pub timeouts: Timeouts,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub address: SocketAddr,
    pub weight: u32,
    /// Cores the backend is pinned to, if the user said so; used only for warnings and the plan.
    pub cpus: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Budget for one TCP connect to a backend.
    pub connect: Duration,
    /// From the end of the request (its body fully sent) until the backend's response headers
    /// arrive, like nginx's proxy_read_timeout for the first byte; a slow upload is not cut off.
    pub response: Duration,
    /// An idle client keep-alive connection is closed after this.
    pub client_idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(60),
            client_idle: Duration::from_secs(60),
        }
    }
}

const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

impl Config {
    /// Reads and validates `path` against the cores this process may run on.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: name.clone(),
            line: 0,
            col: 0,
            key: String::new(),
            message: format!("cannot read file: {e}"),
        })?;
        let allowed = crate::cpus::allowed_cpus().unwrap_or_default();
        Config::parse(&name, &text, &allowed)
    }

    /// Parses and validates `text`; `file` is only used in messages. `allowed` is the set of cores
    /// the process may run on (the default for `runtime.cpus`).
    pub fn parse(file: &str, text: &str, allowed: &[usize]) -> Result<Config, ConfigError> {
        let at = |span: std::ops::Range<usize>, key: &str, message: String| {
            let (line, col) = line_col(text, span.start);
            ConfigError {
                file: file.to_string(),
                line,
                col,
                key: key.to_string(),
                message,
            }
        };

        let de = toml::Deserializer::parse(text)
            .map_err(|e| at(e.span().unwrap_or(0..0), "", e.message().to_string()))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            // `Spanned` values deserialize through a private field; users never wrote that key.
            let key = e
                .path()
                .to_string()
                .replace(".$__serde_spanned_private_value", "");
            let inner = e.into_inner();
            let key = if key == "." { String::new() } else { key };
            at(
                inner.span().unwrap_or(0..0),
                &key,
                inner.message().to_string(),
            )
        })?;

        let cpus = match &raw.runtime.cpus {
            None => {
                if allowed.is_empty() {
                    return Err(at(
                        0..0,
                        "runtime.cpus",
                        "cannot read the cores this process may run on; list them explicitly"
                            .into(),
                    ));
                }
                allowed.to_vec()
            }
            Some(list) => {
                let mut cpus = list.get_ref().0.clone();
                cpus.sort_unstable();
                cpus.dedup();
                if cpus.is_empty() {
                    return Err(at(
                        list.span(),
                        "runtime.cpus",
                        "expected at least one core".into(),
                    ));
                }
                if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
                    return Err(at(
                        list.span(),
                        "runtime.cpus",
                        format!(
                            "core {bad} is not in this process's allowed set {}",
                            format_cpu_list(allowed)
                        ),
                    ));
                }
                cpus
            }
        };
        let runtime = Runtime {
            cpus,
            shutdown_timeout: raw
                .runtime
                .shutdown_timeout
                .map_or(DEFAULT_SHUTDOWN_TIMEOUT, |d| d.0),
        };

        let mut warnings = Vec::new();
        let mut upstreams = Vec::with_capacity(raw.upstream.len());
        let mut seen = HashSet::new();
        for (name, up) in &raw.upstream {
            let key = format!("upstream.{name}");
            if up.backends.get_ref().is_empty() {
                return Err(at(
                    up.backends.span(),
                    &format!("{key}.backends"),
                    "an upstream needs at least one backend".into(),
                ));
            }
            let mut backends = Vec::with_capacity(up.backends.get_ref().len());
            for (i, b) in up.backends.get_ref().iter().enumerate() {
                let bkey = format!("{key}.backends[{i}]");
                let address: SocketAddr = b.address.get_ref().parse().map_err(|_| {
                    at(
                        b.address.span(),
                        &format!("{bkey}.address"),
                        format!(
                            "invalid address \"{}\", expected IP:PORT such as \"127.0.0.1:8881\"",
                            b.address.get_ref()
                        ),
                    )
                })?;
                if !seen.insert(address) {
                    return Err(at(
                        b.address.span(),
                        &format!("{bkey}.address"),
                        format!(
                            "duplicate backend address {address}; each backend may appear once"
                        ),
                    ));
                }
                let weight = *b.weight.get_ref();
                if weight == 0 {
                    return Err(at(
                        b.weight.span(),
                        &format!("{bkey}.weight"),
                        "weight 0 is not allowed, expected a positive integer".into(),
                    ));
                }
                let cpus = b.cpus.as_ref().map(|c| {
                    let mut v = c.get_ref().0.clone();
                    v.sort_unstable();
                    v.dedup();
                    v
                });
                if let Some(bcpus) = &cpus {
                    let shared: Vec<usize> = bcpus
                        .iter()
                        .copied()
                        .filter(|c| runtime.cpus.contains(c))
                        .collect();
                    if !shared.is_empty() {
                        warnings.push(format!(
                            "backend {address} (upstream {name}) is pinned to cores {}, which overlap pinlb's cores {}",
                            format_cpu_list(&shared),
                            format_cpu_list(&runtime.cpus)
                        ));
                    }
                }
                backends.push(Backend {
                    address,
                    weight,
                    cpus,
                });
            }
            let t = &up.timeouts;
            let d = Timeouts::default();
            // A zero timeout would fail every request or close every connection at once.
            let positive = |v: &Option<Spanned<Dur>>, field: &str, default: Duration| match v {
                None => Ok(default),
                Some(x) if x.get_ref().0.is_zero() => Err(at(
                    x.span(),
                    &format!("{key}.timeouts.{field}"),
                    "a timeout of 0 is not allowed, expected a positive duration such as \"1s\""
                        .into(),
                )),
                Some(x) => Ok(x.get_ref().0),
            };
            let timeouts = Timeouts {
                connect: positive(&t.connect, "connect", d.connect)?,
                response: positive(&t.response, "response", d.response)?,
                client_idle: positive(&t.client_idle, "client_idle", d.client_idle)?,
            };
            upstreams.push(Upstream {
                name: name.clone(),
                algorithm: up.algorithm,
                keepalive: up.keepalive,
                backends,
                timeouts,
            });
        }

        if raw.listeners.is_empty() {
            return Err(at(
                0..0,
                "listener",
                "expected at least one [[listener]]".into(),
            ));
        }
        let mut listeners = Vec::with_capacity(raw.listeners.len());
        for (i, l) in raw.listeners.iter().enumerate() {
            let key = format!("listener[{i}]");
            let address: SocketAddr = l.address.get_ref().parse().map_err(|_| {
                at(
                    l.address.span(),
                    &format!("{key}.address"),
                    format!(
                        "invalid address \"{}\", expected IP:PORT such as \"127.0.0.1:8888\"",
                        l.address.get_ref()
                    ),
                )
            })?;
            // SO_REUSEPORT would let both bind and the kernel would split one port's connections
            // between two upstreams. Port 0 asks the kernel for a fresh port each time.
            if address.port() != 0 && listeners.iter().any(|o: &Listener| o.address == address) {
                return Err(at(
                    l.address.span(),
                    &format!("{key}.address"),
                    format!(
                        "duplicate listener address {address}; each address may be listened on once"
                    ),
                ));
            }
            let wanted = l.upstream.get_ref();
            let upstream = upstreams
                .iter()
                .position(|u| &u.name == wanted)
                .ok_or_else(|| {
                    let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
                    at(
                        l.upstream.span(),
                        &format!("{key}.upstream"),
                        format!(
                            "unknown upstream \"{wanted}\", expected one of: {}",
                            if known.is_empty() {
                                "(none defined)".to_string()
                            } else {
                                known.join(", ")
                            }
                        ),
                    )
                })?;
            listeners.push(Listener { address, upstream });
        }

        Ok(Config {
            runtime,
            listeners,
            upstreams,
            warnings,
        })
    }

    /// The resolved plan as `pinlb check` prints it.
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let rt = &self.runtime;
        let _ = writeln!(
            s,
            "runtime: {} worker(s), shutdown_timeout {:?}",
            rt.cpus.len(),
            rt.shutdown_timeout
        );
        for (i, c) in rt.cpus.iter().enumerate() {
            let _ = writeln!(s, "  worker {i} -> core {c}");
        }
        for l in &self.listeners {
            let _ = writeln!(
                s,
                "listener {} -> upstream {}",
                l.address, self.upstreams[l.upstream].name
            );
        }
        for u in &self.upstreams {
            let t = &u.timeouts;
            let _ = writeln!(
                s,
                "upstream {}: {}, keepalive {} per backend per worker, timeouts connect {:?} response {:?} client_idle {:?}",
                u.name,
                u.algorithm.as_str(),
                u.keepalive,
                t.connect,
                t.response,
                t.client_idle
            );
            for b in &u.backends {
                let pinned = b
                    .cpus
                    .as_deref()
                    .map(|c| format!(", cores {}", format_cpu_list(c)))
                    .unwrap_or_default();
                let _ = writeln!(s, "  backend {} weight {}{pinned}", b.address, b.weight);
            }
        }
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

/// 1-based line and column (in characters) of byte offset `pos`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(text.len());
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..pos].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALLOWED: &[usize] = &[0, 1, 2, 3];

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse("pinlb.toml", text, ALLOWED)
    }

    fn err(text: &str) -> String {
        parse(text)
            .expect_err("config should be rejected")
            .to_string()
    }

    const MINIMAL: &str = r#"
[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
backends = [{ address = "127.0.0.1:8881" }]
"#;

    #[test]
    fn minimal_config_takes_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.runtime.cpus, ALLOWED);
        assert_eq!(c.runtime.shutdown_timeout, Duration::from_secs(30));
        let u = &c.upstreams[0];
        assert_eq!(u.algorithm, Algorithm::RoundRobin);
        assert_eq!(u.keepalive, 64);
        assert_eq!(u.backends[0].weight, 1);
        assert_eq!(u.timeouts, Timeouts::default());
        assert_eq!(c.listeners[0].upstream, 0);
    }

    #[test]
    fn full_contract_parses() {
        let c = parse(
            r#"
[runtime]
cpus = [0, "2-3"]
shutdown_timeout = "250ms"

[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
algorithm = "least_conn"
keepalive = 8
backends = [
  { address = "127.0.0.1:8881", weight = 5 },
  { address = "127.0.0.1:8882", cpus = [1] },
  { address = "127.0.0.1:8883", cpus = "2" },
]

[upstream.app.timeouts]
connect = "1s"
response = "1m"
client_idle = "2s"
"#,
        )
        .unwrap();
        assert_eq!(c.runtime.cpus, vec![0, 2, 3]);
        assert_eq!(c.runtime.shutdown_timeout, Duration::from_millis(250));
        let u = &c.upstreams[0];
        assert_eq!(u.algorithm, Algorithm::LeastConn);
        assert_eq!(u.keepalive, 8);
        assert_eq!(
            u.backends.iter().map(|b| b.weight).collect::<Vec<_>>(),
            vec![5, 1, 1]
        );
        assert_eq!(u.timeouts.response, Duration::from_secs(60));
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("127.0.0.1:8883"), "{:?}", c.warnings);
    }

    #[test]
    fn unknown_algorithm_names_place_key_and_choices() {
        let e = err(&MINIMAL.replace(
            "[upstream.app]\n",
            "[upstream.app]\nalgorithm = \"leastconn\"\n",
        ));
        assert_eq!(
            e,
            "pinlb.toml:7:13: upstream.app.algorithm: unknown value \"leastconn\", expected one of round_robin, least_conn"
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = err(&MINIMAL.replace(
            "[upstream.app]\n",
            "[upstream.app]\nalgoritm = \"least_conn\"\n",
        ));
        assert!(
            e.starts_with("pinlb.toml:7:1: upstream.app.algoritm: unknown field `algoritm`"),
            "{e}"
        );
    }

    #[test]
    fn weight_zero_is_rejected_at_the_weight() {
        let e = err(&MINIMAL.replace("8881\" }", "8881\", weight = 0 }"));
        assert_eq!(
            e,
            "pinlb.toml:7:52: upstream.app.backends[0].weight: weight 0 is not allowed, expected a positive integer"
        );
    }

    #[test]
    fn empty_upstream_is_rejected() {
        let e = err(&MINIMAL.replace("[{ address = \"127.0.0.1:8881\" }]", "[]"));
        assert_eq!(
            e,
            "pinlb.toml:7:12: upstream.app.backends: an upstream needs at least one backend"
        );
    }

    #[test]
    fn listener_to_unknown_upstream_is_rejected() {
        let e = err(&MINIMAL.replace("upstream = \"app\"", "upstream = \"web\""));
        assert_eq!(
            e,
            "pinlb.toml:4:12: listener[0].upstream: unknown upstream \"web\", expected one of: app"
        );
    }

    #[test]
    fn duplicate_backends_are_rejected() {
        let e = err(&MINIMAL.replace(
            "[{ address = \"127.0.0.1:8881\" }]",
            "[{ address = \"127.0.0.1:8881\" }, { address = \"127.0.0.1:8881\" }]",
        ));
        assert!(e.starts_with("pinlb.toml:7:57: upstream.app.backends[1].address: duplicate backend address 127.0.0.1:8881"), "{e}");
    }

    #[test]
    fn duplicate_listeners_are_rejected_but_port_0_may_repeat() {
        let two = |addr: &str| {
            format!("{MINIMAL}\n[[listener]]\naddress = \"{addr}\"\nupstream = \"app\"\n")
                .replace("127.0.0.1:8888", addr)
        };
        let e = err(&two("127.0.0.1:8888"));
        assert!(
            e.starts_with(
                "pinlb.toml:10:11: listener[1].address: duplicate listener address 127.0.0.1:8888"
            ),
            "{e}"
        );
        assert_eq!(parse(&two("127.0.0.1:0")).unwrap().listeners.len(), 2);
    }

    #[test]
    fn core_outside_allowed_set_names_core_and_set() {
        let e = err(&format!("[runtime]\ncpus = \"2-7\"\n{MINIMAL}"));
        assert_eq!(
            e,
            "pinlb.toml:2:8: runtime.cpus: core 4 is not in this process's allowed set 0-3"
        );
    }

    #[test]
    fn bad_duration_says_what_is_expected() {
        let e = err(&format!("[runtime]\nshutdown_timeout = \"30\"\n{MINIMAL}"));
        assert!(
            e.starts_with("pinlb.toml:2:20: runtime.shutdown_timeout: invalid duration \"30\""),
            "{e}"
        );
    }

    #[test]
    fn type_errors_inside_spanned_values_name_the_users_key() {
        let e = err(&MINIMAL.replace("8881\" }", "8881\", weight = \"heavy\" }"));
        assert!(
            e.starts_with("pinlb.toml:7:52: upstream.app.backends[0].weight: "),
            "{e}"
        );
        let e = err(&format!(
            "{MINIMAL}\n[upstream.app.timeouts]\nresponse = \"30\"\n"
        ));
        assert!(
            e.starts_with("pinlb.toml:10:12: upstream.app.timeouts.response: invalid duration"),
            "{e}"
        );
    }

    #[test]
    fn zero_timeouts_are_rejected() {
        let e = err(&format!(
            "{MINIMAL}\n[upstream.app.timeouts]\nclient_idle = \"0s\"\n"
        ));
        assert_eq!(
            e,
            "pinlb.toml:10:15: upstream.app.timeouts.client_idle: a timeout of 0 is not allowed, expected a positive duration such as \"1s\""
        );
    }

    #[test]
    fn bad_address_says_what_is_expected() {
        let e = err(&MINIMAL.replace("127.0.0.1:8888", "localhost"));
        assert!(
            e.starts_with("pinlb.toml:3:11: listener[0].address: invalid address \"localhost\""),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let e = err("[runtime\ncpus = [0]\n");
        assert!(e.starts_with("pinlb.toml:1:"), "{e}");
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncé d", 7), (2, 4));
        assert_eq!(line_col("", 0), (1, 1));
    }
}
