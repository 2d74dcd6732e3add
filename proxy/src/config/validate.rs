//! Raw sections into validated ones, one function per section, in the order `Config::parse`
//! calls them. Each takes the [`Source`] to name the place of an error, and fills in what the
//! file leaves out from the validated type's `Default`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use toml::Spanned;

use super::raw::{
    RawAdmin, RawBackend, RawForwarded, RawHealth, RawHttp2, RawLimits, RawListener, RawLog,
    RawPassive, RawResolve, RawResolver, RawRuntime, RawSpawn, RawTimeouts, RawTls, RawUpstream,
    RawUpstreamTls, Size, positive,
};
use super::{
    AccessFormat, AccessLog, AccessTarget, AccessTemplate, Adaptive, Admin, Algorithm, Backend,
    DnsName, HashKey, Health, Http2, Limits, Listener, NamedBackend, Passive, Protocol, Resolve,
    Resolver, Runtime, Spawn, Timeouts, Upgrade, Upstream,
};
use crate::backend_address::BackendAddress;
use crate::http1::request::RequestLimits;
use crate::modules::{Configs, Place};
use crate::syntax::error::{ConfigError, ConfigErrors, Source};
use crate::sys::cpus::format_cpu_list;
use crate::tls::client::{BackendTls, Trust, TrustError};
use crate::tls::server::{CertFiles, Terminator};

type Result<T> = std::result::Result<T, ConfigError>;

/// `[runtime]`: the cores default to every core the process may run on.
pub(super) fn runtime(src: &Source, raw: &RawRuntime, allowed: &[usize]) -> Result<Runtime> {
    let d = Runtime::default();
    let cpus = match &raw.cpus {
        None => {
            if allowed.is_empty() {
                return Err(src.at(
                    0..0,
                    "runtime.cpus",
                    "cannot read the cores this process may run on; list them explicitly",
                ));
            }
            allowed.to_vec()
        }
        Some(list) => {
            let mut cpus = list.get_ref().0.clone();
            cpus.sort_unstable();
            cpus.dedup();
            if cpus.is_empty() {
                return Err(src.at(list.span(), "runtime.cpus", "expected at least one core"));
            }
            if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(src.at(
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
    Ok(Runtime {
        cpus,
        shutdown_timeout: raw.shutdown_timeout.map_or(d.shutdown_timeout, |d| d.0),
        upgrade_socket: upgrade_socket(src, &raw.upgrade_socket)?,
    })
}

/// `runtime.upgrade_socket`: an absolute path, since `pinlb upgrade` and the process it starts
/// may run in other directories than the one that bound it; short enough for a unix socket
/// address (108 bytes with its terminating NUL on Linux).
fn upgrade_socket(
    src: &Source,
    raw: &Option<Spanned<String>>,
) -> Result<Option<std::path::PathBuf>> {
    let Some(p) = raw else { return Ok(None) };
    let path = std::path::PathBuf::from(p.get_ref());
    if !path.is_absolute() {
        return Err(src.at(
            p.span(),
            "runtime.upgrade_socket",
            "expected an absolute path (for example \"/run/pinlb/upgrade.sock\")",
        ));
    }
    if p.get_ref().len() > 107 {
        return Err(src.at(
            p.span(),
            "runtime.upgrade_socket",
            format!(
                "expected at most 107 bytes (a unix socket's limit), not {}",
                p.get_ref().len()
            ),
        ));
    }
    Ok(Some(path))
}

/// `[limits]`.
pub(super) fn limits(src: &Source, l: &RawLimits) -> Result<Limits> {
    let d = Limits::default();
    let (lo, hi) = Limits::HEADER_BYTES;
    let max_header_bytes = match &l.max_header_bytes {
        None => d.max_header_bytes,
        Some(v) => usize::try_from(v.get_ref().0)
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| {
                src.at(
                    v.span(),
                    "limits.max_header_bytes",
                    format!(
                        "{} bytes is out of range, expected \"1KiB\" to \"64KiB\"",
                        v.get_ref().0
                    ),
                )
            })?,
    };
    let max_headers = match &l.max_headers {
        None => d.max_headers,
        Some(v) if (1..=RequestLimits::MAX_HEADERS).contains(v.get_ref()) => *v.get_ref(),
        Some(v) => {
            return Err(src.at(
                v.span(),
                "limits.max_headers",
                format!(
                    "{} is out of range, expected 1 to {}",
                    v.get_ref(),
                    RequestLimits::MAX_HEADERS
                ),
            ));
        }
    };
    let max_uri_bytes = match &l.max_uri_bytes {
        None => d.max_uri_bytes,
        Some(v) if v.get_ref().0 == 0 => {
            return Err(src.at(
                v.span(),
                "limits.max_uri_bytes",
                "0 is not allowed, expected a size such as \"8KiB\"",
            ));
        }
        Some(v) => usize::try_from(v.get_ref().0).unwrap_or(usize::MAX),
    };
    Ok(Limits {
        max_header_bytes,
        max_headers,
        max_uri_bytes,
        max_body: l.max_body.as_ref().map_or(d.max_body, |v| v.get_ref().0),
        header_timeout: positive(src, &l.header_timeout, "limits.header_timeout")?
            .unwrap_or(d.header_timeout),
        body_timeout: positive(src, &l.body_timeout, "limits.body_timeout")?
            .unwrap_or(d.body_timeout),
        max_connections: match &l.max_connections {
            None => d.max_connections,
            // tokio's semaphore holds at most usize::MAX >> 3 permits.
            Some(v) if (1..=1 << 40).contains(v.get_ref()) => *v.get_ref(),
            Some(v) => {
                return Err(src.at(
                    v.span(),
                    "limits.max_connections",
                    format!(
                        "{} is out of range, expected 1 to {}",
                        v.get_ref(),
                        1u64 << 40
                    ),
                ));
            }
        },
        max_connections_given: l.max_connections.is_some(),
    })
}

/// `[http2]`.
pub(super) fn http2(src: &Source, h: &RawHttp2) -> Result<Http2> {
    let d = Http2::default();
    let window = |v: &Option<Spanned<Size>>, key: &str, default: u32| -> Result<u32> {
        match v {
            None => Ok(default),
            Some(v) if (65_535..=Http2::MAX_WINDOW).contains(&v.get_ref().0) => {
                Ok(v.get_ref().0 as u32)
            }
            Some(v) => Err(src.at(
                v.span(),
                key,
                format!(
                    "{} bytes is out of range, expected 65535 bytes (\"64KiB\" - 1) to 2^31 - 1",
                    v.get_ref().0
                ),
            )),
        }
    };
    let max_concurrent_streams = match &h.max_concurrent_streams {
        None => d.max_concurrent_streams,
        Some(v) if *v.get_ref() >= 1 => *v.get_ref(),
        Some(v) => {
            return Err(src.at(
                v.span(),
                "http2.max_concurrent_streams",
                "0 is not allowed, expected 1 or more streams",
            ));
        }
    };
    Ok(Http2 {
        max_concurrent_streams,
        initial_stream_window: window(
            &h.initial_stream_window,
            "http2.initial_stream_window",
            d.initial_stream_window,
        )?,
        initial_connection_window: window(
            &h.initial_connection_window,
            "http2.initial_connection_window",
            d.initial_connection_window,
        )?,
        // "0s" turns the PINGs off, as leaving the key out does.
        ping_interval: h
            .ping_interval
            .as_ref()
            .map(|v| v.get_ref().0)
            .filter(|d| !d.is_zero()),
        ping_timeout: positive(src, &h.ping_timeout, "http2.ping_timeout")?
            .unwrap_or(d.ping_timeout),
    })
}

/// `[upstream.NAME]` and its tables. A backend pinned to one of `worker_cpus` adds a warning;
/// spawned processes must be pinned to cores in `allowed`, the set pinlb may use.
pub(super) fn upstream(
    src: &Source,
    name: &str,
    up: &RawUpstream,
    worker_cpus: &[usize],
    allowed: &[usize],
    max_connections: usize,
    warnings: &mut Vec<String>,
) -> Result<Upstream> {
    let key = format!("upstream.{name}");
    let algorithm = up
        .algorithm
        .as_ref()
        .map_or(Algorithm::default(), |a| *a.get_ref());
    backup_rules(src, &key, up, algorithm)?;
    let spawn = match (&up.spawn, &up.backends) {
        (Some(_), Some(b)) => {
            return Err(src.at(
                b.span(),
                &format!("{key}.backends"),
                "set together with [upstream.NAME.spawn], expected one of them: the spawned processes are this upstream's backends",
            ));
        }
        (None, None) => {
            // The table has no span of its own (it is a map entry); its header, when written
            // plainly, is the place to point at.
            let header = src.text.find(&format!("[upstream.{name}]"));
            let at = header.map_or(0..0, |h| h..h);
            return Err(src.at(
                at,
                &format!("{key}.backends"),
                "missing, expected a list of backends or an [upstream.NAME.spawn] table",
            ));
        }
        (Some(s), None) => Some(spawn(src, &key, up, s, allowed)?),
        (None, Some(_)) => None,
    };
    let (mut backends, mut names) = (Vec::new(), Vec::new());
    match &spawn {
        Some(s) => backends = spawned_backends(name, s, worker_cpus, warnings),
        None => {
            for entry in self::backends(src, name, &key, up, worker_cpus, warnings)? {
                match entry {
                    Entry::Address(b) => backends.push(b),
                    Entry::Name(n) => names.push(n),
                }
            }
        }
    }
    let limited = backends.iter().any(|b| b.max_conns > 0) || names.iter().any(|n| n.max_conns > 0);
    let adaptive = adaptive(src, &key, up, warnings)?;
    let queue = queue(
        &key,
        up,
        limited || adaptive.is_some(),
        max_connections,
        warnings,
    );
    super::fastcgi::warn_unbounded(&key, up, limited, warnings);
    Ok(Upstream {
        name: name.to_string(),
        algorithm,
        hash: hash_key(src, &key, up, algorithm)?,
        ewma_decay: positive(src, &up.ewma_decay, &format!("{key}.ewma_decay"))?
            .unwrap_or(Upstream::EWMA_DECAY),
        keepalive: up.keepalive,
        backends,
        names,
        resolve: resolve(src, &key, &up.resolve)?,
        queue,
        adaptive,
        max_connecting: up
            .max_connecting
            .as_ref()
            .map_or(Upstream::MAX_CONNECTING, |v| *v.get_ref()),
        spawn,
        timeouts: timeouts(src, &key, &up.timeouts)?,
        health: up
            .health
            .as_ref()
            .map(|h| health(src, &key, h))
            .transpose()?,
        passive: passive(src, &key, &up.passive)?,
        retry: super::retry::retry(src, &key, &up.retry)?,
        outlier: super::outlier::outlier(src, &key, &up.outlier)?,
        upgrade: upgrade(src, &key, up)?,
        protocol: protocol(src, &key, up)?,
        max_streams: match &up.max_streams {
            None => Upstream::MAX_STREAMS,
            Some(v) if *v.get_ref() >= 1 => *v.get_ref(),
            Some(v) => {
                return Err(src.at(
                    v.span(),
                    &format!("{key}.max_streams"),
                    "0 is not allowed, expected 1 or more streams per backend connection",
                ));
            }
        },
        tls: up
            .tls
            .as_ref()
            .map(|t| upstream_tls(src, &key, t, protocol(src, &key, up)?))
            .transpose()?
            .map(Arc::new),
        proxy_protocol: super::proxy_protocol::send(src, &key, up, protocol(src, &key, up)?)?,
        buffering: crate::modules::buffering::validate(
            src,
            &key,
            up.buffering.as_ref(),
            protocol(src, &key, up)?.is_http2(),
        )?,
        sticky: crate::modules::sticky::validate(src, &key, up.sticky.as_ref())?,
        fastcgi: super::fastcgi::fastcgi(src, &key, up, protocol(src, &key, up)?)?.map(Arc::new),
        // Set once the listeners that name it are known (`config::tcp`).
        tcp: false,
        udp: false,
    })
}

/// `queue`, `max_connections` by default; a warning when no backend has a limit (a
/// `max_conns`, or a learned one) for it to wait on.
fn queue(
    key: &str,
    up: &RawUpstream,
    limited: bool,
    max_connections: usize,
    warnings: &mut Vec<String>,
) -> usize {
    let queue = up.queue.as_ref().map_or(max_connections, |q| *q.get_ref());
    if up.queue.is_some() && queue > 0 && !limited && up.max_conns == 0 {
        warnings.push(format!(
            "{key}.queue: adaptive = false and no backend has max_conns, so no request ever \
             waits in the queue"
        ));
    }
    queue
}

/// `adaptive` (on by default), `adaptive_min` and `adaptive_max`: `None` when off.
fn adaptive(
    src: &Source,
    key: &str,
    up: &RawUpstream,
    warnings: &mut Vec<String>,
) -> Result<Option<Adaptive>> {
    let on = up.adaptive.as_ref().is_none_or(|a| *a.get_ref());
    let d = Adaptive::DEFAULT;
    let min = up.adaptive_min.as_ref();
    let max = up.adaptive_max.as_ref();
    if !on {
        if min.is_some() || max.is_some() {
            warnings.push(format!(
                "{key}: adaptive = false, so adaptive_min and adaptive_max have no effect"
            ));
        }
        return Ok(None);
    }
    if let Some(v) = min.filter(|v| *v.get_ref() == 0) {
        return Err(src.at(
            v.span(),
            &format!("{key}.adaptive_min"),
            "0 is not allowed, expected 1 or more requests per backend",
        ));
    }
    let bounds = Adaptive {
        min: min.map_or(d.min, |v| *v.get_ref()),
        max: max.map_or(d.max.max(min.map_or(0, |v| *v.get_ref())), |v| *v.get_ref()),
    };
    if let Some(v) = max.filter(|_| bounds.max < bounds.min) {
        return Err(src.at(
            v.span(),
            &format!("{key}.adaptive_max"),
            format!(
                "{} is below adaptive_min ({}), expected {} or more",
                bounds.max, bounds.min, bounds.min
            ),
        ));
    }
    Ok(Some(bounds))
}

/// `hash`, which `algorithm = "hash"` needs and no other algorithm takes.
fn hash_key(
    src: &Source,
    key: &str,
    up: &RawUpstream,
    algorithm: Algorithm,
) -> Result<Option<HashKey>> {
    match (&up.hash, algorithm) {
        (Some(h), Algorithm::Hash) => HashKey::parse(h.get_ref())
            .map(Some)
            .map_err(|e| src.at(h.span(), &format!("{key}.hash"), e)),
        (None, Algorithm::Hash) => Err(src.at(
            up.algorithm.as_ref().map_or(0..0, |a| a.span()),
            &format!("{key}.algorithm"),
            "algorithm \"hash\" needs a key: hash = \"client_ip\", \"uri\", \"header:NAME\" or \"cookie:NAME\"",
        )),
        (Some(h), other) => Err(src.at(
            h.span(),
            &format!("{key}.hash"),
            format!(
                "hash is the key of algorithm \"hash\", but this upstream balances by \"{}\"",
                other.as_str()
            ),
        )),
        (None, _) => Ok(None),
    }
}

/// `backup` backends need a primary to stand behind, and are not for `hash` upstreams: a key's
/// backend must not depend on whether others are up (nginx refuses the same pairing).
fn backup_rules(src: &Source, key: &str, up: &RawUpstream, algorithm: Algorithm) -> Result<()> {
    // Spawned backends are never backups.
    let Some(list) = &up.backends else {
        return Ok(());
    };
    let raw = list.get_ref();
    let is_backup = |b: &RawBackend| b.backup.as_ref().is_some_and(|v| *v.get_ref());
    let Some(first) = raw.iter().position(is_backup) else {
        return Ok(());
    };
    let at = raw[first].backup.as_ref().map_or(0..0, |v| v.span());
    let bkey = format!("{key}.backends[{first}].backup");
    if algorithm == Algorithm::Hash {
        return Err(src.at(
            at,
            &bkey,
            "backup backends can't be used with algorithm \"hash\" (a key's backend would move whenever another went down); use round_robin, least_conn, random_two or ewma",
        ));
    }
    if raw.iter().all(is_backup) {
        return Err(src.at(
            at,
            &bkey,
            "every backend is a backup: an upstream needs at least one primary backend (backup = false)",
        ));
    }
    Ok(())
}

/// `protocol`, which must agree with the `tls` table: `h2` is HTTP/2 over TLS, `h2c` cleartext.
fn protocol(src: &Source, key: &str, up: &RawUpstream) -> Result<Protocol> {
    let Some(spanned) = &up.protocol else {
        return Ok(Protocol::default());
    };
    let p = *spanned.get_ref();
    match (p, &up.tls) {
        (Protocol::H2, None) => Err(src.at(
            spanned.span(),
            &format!("{key}.protocol"),
            "\"h2\" is HTTP/2 over TLS, expected an [upstream.NAME.tls] table with it (or \"h2c\" for cleartext HTTP/2)",
        )),
        (Protocol::H2c, Some(t)) => Err(src.at(
            t.span(),
            &format!("{key}.tls"),
            "set together with protocol = \"h2c\" (cleartext HTTP/2), expected protocol = \"h2\" for HTTP/2 over TLS",
        )),
        _ => Ok(p),
    }
}

/// `[upstream.NAME.tls]`: the CA file (or the system's store) and the client certificate read
/// and checked now, for connections that speak `protocol` inside TLS (offered by ALPN).
fn upstream_tls(
    src: &Source,
    key: &str,
    raw: &Spanned<RawUpstreamTls>,
    protocol: Protocol,
) -> Result<BackendTls> {
    let t = raw.get_ref();
    let tkey = format!("{key}.tls");
    let sni = match &t.sni {
        None => None,
        Some(s) => Some(match ServerName::try_from(s.get_ref().clone()) {
            Ok(ServerName::DnsName(name)) => ServerName::DnsName(name),
            Ok(_) => {
                return Err(src.at(
                    s.span(),
                    &format!("{tkey}.sni"),
                    format!(
                        "\"{}\" is an IP address, which is never sent as SNI; expected a host name, or no sni to verify the backend's address",
                        s.get_ref()
                    ),
                ));
            }
            Err(_) => {
                return Err(src.at(
                    s.span(),
                    &format!("{tkey}.sni"),
                    format!(
                        "\"{}\" is not a valid host name, expected one such as api.internal",
                        s.get_ref()
                    ),
                ));
            }
        }),
    };
    let insecure = t
        .insecure_skip_verify
        .as_ref()
        .is_some_and(|i| *i.get_ref());
    let trust = match (&t.ca_file, insecure) {
        (Some(ca), true) => {
            return Err(src.at(
                ca.span(),
                &format!("{tkey}.ca_file"),
                "set together with insecure_skip_verify = true, expected one of them: nothing is verified against it",
            ));
        }
        (Some(ca), false) => Trust::File(ca.get_ref().into()),
        (None, true) => Trust::Nothing,
        (None, false) => Trust::System,
    };
    let client_cert = cert_pair(src, &tkey, &t.cert, &t.key)?;
    BackendTls::load(sni, trust, client_cert.clone(), protocol.is_http2()).map_err(|e| {
        let (k, span) = match &e {
            TrustError::Read { .. } | TrustError::Invalid { .. } => {
                ("ca_file", t.ca_file.as_ref().map(|c| c.span()))
            }
            TrustError::ClientCert(c) => match (c.file(), &client_cert) {
                (Some(f), Some(files)) if f == files.key => {
                    ("key", t.key.as_ref().map(|k| k.span()))
                }
                _ => ("cert", t.cert.as_ref().map(|c| c.span())),
            },
            TrustError::NoSystemRoots { .. } | TrustError::Config(_) => ("", None),
        };
        match span {
            Some(span) => src.at(span, &format!("{tkey}.{k}"), e.to_string()),
            None => src.at(raw.span(), &tkey, e.to_string()),
        }
    })
}

/// One entry of `backends`: an address, or a name looked up later.
enum Entry {
    Address(Backend),
    Name(NamedBackend),
}

/// An upstream's `backends`. An address may appear once in an upstream: twice would only be a
/// heavier weight, written confusingly. Another upstream may list it too, as nginx allows: it
/// then has a backend of its own at that address, with its own health, counters and pool.
/// A name may appear once too; what it resolves to is only known at run time (see `dns`).
fn backends(
    src: &Source,
    name: &str,
    key: &str,
    up: &RawUpstream,
    worker_cpus: &[usize],
    warnings: &mut Vec<String>,
) -> Result<Vec<Entry>> {
    let Some(list) = &up.backends else {
        return Ok(Vec::new());
    };
    let raw = list.get_ref();
    if raw.is_empty() {
        return Err(src.at(
            list.span(),
            &format!("{key}.backends"),
            "an upstream needs at least one backend",
        ));
    }
    let mut seen = HashSet::new();
    let mut names = HashSet::new();
    let mut entries = Vec::with_capacity(raw.len());
    for (i, b) in raw.iter().enumerate() {
        let bkey = format!("{key}.backends[{i}]");
        let entry = backend(src, &bkey, up, b, &mut seen, &mut names)?;
        let (shown, cpus) = match &entry {
            Entry::Address(b) => (b.address.to_string(), &b.cpus),
            Entry::Name(n) => (n.name.to_string(), &n.cpus),
        };
        warn_overlap(name, &shown, cpus.as_deref(), worker_cpus, warnings);
        entries.push(entry);
    }
    Ok(entries)
}

/// A warning when `backend` is pinned to cores among `worker_cpus`: it and pinlb's workers would
/// take turns on them.
fn warn_overlap(
    name: &str,
    shown: &str,
    cpus: Option<&[usize]>,
    worker_cpus: &[usize],
    warnings: &mut Vec<String>,
) {
    if let Some(bcpus) = cpus {
        let shared: Vec<usize> = bcpus
            .iter()
            .copied()
            .filter(|c| worker_cpus.contains(c))
            .collect();
        if !shared.is_empty() {
            warnings.push(format!(
                "backend {shown} (upstream {name}) is pinned to cores {}, which overlap pinlb's cores {}",
                format_cpu_list(&shared),
                format_cpu_list(worker_cpus)
            ));
        }
    }
}

/// The backends a `spawn` table stands for: each process's first address, on its core.
fn spawned_backends(
    name: &str,
    s: &Spawn,
    worker_cpus: &[usize],
    warnings: &mut Vec<String>,
) -> Vec<Backend> {
    (0..s.count)
        .map(|i| {
            let backend = s.backend(i, 0);
            warn_overlap(
                name,
                &backend.address.to_string(),
                backend.cpus.as_deref(),
                worker_cpus,
                warnings,
            );
            backend
        })
        .collect()
}

/// `[upstream.NAME.spawn]`.
fn spawn(
    src: &Source,
    key: &str,
    up: &RawUpstream,
    raw: &Spanned<RawSpawn>,
    allowed: &[usize],
) -> Result<Spawn> {
    let s = raw.get_ref();
    let skey = format!("{key}.spawn");
    let command: Vec<String> = s
        .command
        .get_ref()
        .iter()
        .map(|a| a.get_ref().clone())
        .collect();
    if command.first().is_none_or(|c| c.is_empty()) {
        return Err(src.at(
            s.command.span(),
            &format!("{skey}.command"),
            "expected the program and its arguments, such as [\"node\", \"app.js\"]",
        ));
    }
    let cpus = s.cpus.get_ref().0.clone();
    if cpus.is_empty() {
        return Err(src.at(
            s.cpus.span(),
            &format!("{skey}.cpus"),
            "expected at least one core",
        ));
    }
    // A child may be pinned outside pinlb's own affinity (`taskset -c 0 pinlb` with its
    // backends on 1-3), but not to a core the machine doesn't have.
    let mut possible = crate::sys::cpus::online_cpus().unwrap_or_default();
    possible.extend_from_slice(allowed);
    if let Some(bad) = cpus.iter().find(|c| !possible.contains(c)) {
        possible.sort_unstable();
        possible.dedup();
        return Err(src.at(
            s.cpus.span(),
            &format!("{skey}.cpus"),
            format!(
                "core {bad} is not a core of this machine ({}), so no process can be pinned to it",
                format_cpu_list(&possible)
            ),
        ));
    }
    // One process per listed core unless told otherwise.
    let count = match &s.count {
        None => cpus.len(),
        Some(c) if *c.get_ref() >= 1 => *c.get_ref(),
        Some(c) => {
            return Err(src.at(
                c.span(),
                &format!("{skey}.count"),
                "0 is not allowed, expected 1 or more processes",
            ));
        }
    };
    // Both port ranges (the running one and the one a rolling restart moves to) must fit.
    let base = *s.port_base.get_ref();
    let last = u64::from(base) + 2 * count as u64 - 1;
    let port_base = match u16::try_from(base) {
        Ok(p) if p >= 1 && last <= u64::from(u16::MAX) => p,
        _ => {
            return Err(src.at(
                s.port_base.span(),
                &format!("{skey}.port_base"),
                format!(
                    "{base} is out of range, expected a port from 1 such that port_base + 2 × count - 1 (here {last}) is at most 65535: a rolling restart starts each new process on port_base + count + i"
                ),
            ));
        }
    };
    let host = match &s.address {
        None => std::net::IpAddr::from([127, 0, 0, 1]),
        Some(a) => a.get_ref().parse().map_err(|_| {
            src.at(
                a.span(),
                &format!("{skey}.address"),
                format!(
                    "invalid address \"{}\", expected an IP address (no port) such as \"127.0.0.1\"",
                    a.get_ref()
                ),
            )
        })?,
    };
    let mut env = Vec::with_capacity(s.env.len());
    for (k, v) in &s.env {
        if k.is_empty() || k.contains(['=', '\0']) || v.get_ref().contains('\0') {
            return Err(src.at(
                v.span(),
                &format!("{skey}.env.{k}"),
                "expected a variable name without '=' and a value, neither with a NUL byte",
            ));
        }
        env.push((k.clone(), v.get_ref().clone()));
    }
    let cwd = match &s.cwd {
        None => None,
        Some(c) if std::path::Path::new(c.get_ref()).is_dir() => Some(c.get_ref().into()),
        Some(c) => {
            return Err(src.at(
                c.span(),
                &format!("{skey}.cwd"),
                format!(
                    "{} is not a directory, expected the processes' working directory",
                    c.get_ref()
                ),
            ));
        }
    };
    // The program must be one `exec` can run, found as it will find it; else every start
    // fails, the processes wait in their backoff for ever and clients get 503.
    let program = &s.command.get_ref()[0];
    let name = program.get_ref().replace("{port}", &port_base.to_string());
    if let Err(e) = find_program(&name, cwd.as_deref(), &env) {
        return Err(src.at(program.span(), &format!("{skey}.command[0]"), e));
    }
    let socket = match command.iter().any(|a| a.contains("{socket}")) {
        false => None,
        true => {
            let name = key.strip_prefix("upstream.").unwrap_or(key);
            let prefix = Spawn::socket_dir().join(name);
            // The longest path: the last process's, on the second range.
            let longest = format!("{}-{}-1.sock", prefix.display(), count.saturating_sub(1));
            if longest.len() > 107 || name.contains('/') {
                return Err(src.at(
                    s.command.span(),
                    &format!("{skey}.command"),
                    format!("{{socket}}: the socket path {longest} is not one a Unix socket can have (at most 107 bytes, no '/' in the upstream's name), expected a shorter upstream name or XDG_RUNTIME_DIR"),
                ));
            }
            Some(prefix)
        }
    };
    Ok(Spawn {
        socket,
        command,
        count,
        cpus,
        port_base,
        host,
        env,
        cwd,
        grace: s.grace.as_ref().map_or(Spawn::GRACE, |d| d.get_ref().0),
        ready_timeout: positive(src, &s.ready_timeout, &format!("{skey}.ready_timeout"))?
            .unwrap_or(Spawn::READY_TIMEOUT),
        max_conns: up.max_conns,
        slow_start: up.slow_start.map_or(Duration::ZERO, |d| d.0),
    })
}

/// Where `exec` finds `program` for a spawned process, as `execvp` looks for it in the child,
/// after its `chdir` to `cwd` and with `env` added to pinlb's environment: a name without `/`
/// in each directory of `PATH` (`env`'s, else pinlb's, else execvp's default), a path with `/`
/// from the working directory (`cwd`, else pinlb's). The error says what is wrong and what was
/// expected.
fn find_program(
    program: &str,
    cwd: Option<&std::path::Path>,
    env: &[(String, String)],
) -> std::result::Result<std::path::PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    // A regular file this process may execute (as root: one with an execute bit), or why not.
    let runnable = |path: &Path| -> std::result::Result<(), String> {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            _ => e.to_string(),
        })?;
        if meta.is_dir() {
            return Err("is a directory".to_string());
        }
        let exec = nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok();
        if !meta.is_file() || !exec {
            return Err(format!(
                "is not executable (mode {:o})",
                meta.permissions().mode() & 0o7777
            ));
        }
        Ok(())
    };
    let how = |what: &str| {
        if what.starts_with("is not executable") {
            format!(
                "expected a program: `chmod +x` it, or run it by its interpreter, such as [\"sh\", \"{program}\"]"
            )
        } else {
            "expected the path of a program".to_string()
        }
    };
    let base: Option<PathBuf> = match cwd {
        Some(c) => Some(c.to_path_buf()),
        None => std::env::current_dir().ok(),
    };
    let from = if cwd.is_some() {
        "the table's cwd"
    } else {
        "pinlb's working directory: start pinlb where the path leads to the program, or set cwd or give an absolute path"
    };
    if program.contains('/') {
        let path = match &base {
            Some(b) => b.join(program),
            None => PathBuf::from(program),
        };
        return match runnable(&path) {
            Ok(()) => Ok(path),
            Err(what) if what == "no such file" && Path::new(program).is_relative() => {
                let dir = base.as_deref().unwrap_or(Path::new("."));
                Err(format!(
                    "{program:?}: no such file in {} ({from}), {}",
                    dir.display(),
                    how(&what)
                ))
            }
            Err(what) if what == "no such file" => {
                Err(format!("{program:?}: no such file, {}", how(&what)))
            }
            Err(what) if what.starts_with("is ") => {
                Err(format!("{program:?} {what}, {}", how(&what)))
            }
            Err(what) => Err(format!("{program:?}: {what}, {}", how(&what))),
        };
    }
    let path_var = match env.iter().rev().find(|(k, _)| k == "PATH") {
        Some((_, v)) => v.clone(),
        // glibc's execvp without PATH.
        None => std::env::var("PATH").unwrap_or_else(|_| "/bin:/usr/bin".to_string()),
    };
    // As execvp: the first executable candidate wins; one that exists but can't be run is the
    // error if none can.
    let mut refused: Option<(String, String)> = None;
    for dir in path_var.split(':') {
        // An empty entry is the working directory.
        let dir = if dir.is_empty() { "." } else { dir };
        let dir_path = match &base {
            Some(b) => b.join(dir),
            None => PathBuf::from(dir),
        };
        let candidate = dir_path.join(program);
        match runnable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(what) if what.starts_with("is not executable") && refused.is_none() => {
                refused = Some((what, dir.to_string()));
            }
            Err(_) => {}
        }
    }
    match refused {
        Some((what, dir)) => Err(format!("{program:?} {what} in {dir}, {}", how(&what))),
        None => Err(format!(
            "{program:?} is not in PATH ({path_var}), expected a program in PATH or a path to one, such as \"./target/release/pinlb\" or \"/usr/bin/node\""
        )),
    }
}

/// No two spawned upstreams, and no listener or admin address, may use the same port on the
/// same address: a child that can't bind would be restarted for ever.
pub(super) fn spawn_ports(
    src: &Source,
    raw: &std::collections::BTreeMap<String, RawUpstream>,
    upstreams: &[Upstream],
    taken: &[SocketAddr],
) -> Result<()> {
    let mut used: Vec<(SocketAddr, &str)> = Vec::new();
    for (up, (name, r)) in upstreams.iter().zip(raw) {
        let (Some(s), Some(rs)) = (&up.spawn, &r.spawn) else {
            continue;
        };
        let span = rs.get_ref().port_base.span();
        let key = format!("upstream.{name}.spawn.port_base");
        for bank in 0..2 {
            for i in 0..s.count {
                let a = s.address(i, bank);
                let clash = |o: &SocketAddr| {
                    o.port() == a.port()
                        && (o.ip() == a.ip() || o.ip().is_unspecified() || a.ip().is_unspecified())
                };
                if let Some((_, other)) = used.iter().find(|(o, _)| clash(o)) {
                    return Err(src.at(
                        span,
                        &key,
                        format!("port {} is also a port of upstream {other}'s spawned processes, expected ranges that don't overlap (each takes 2 × count ports from port_base)", a.port()),
                    ));
                }
                if taken.iter().any(clash) {
                    return Err(src.at(
                        span,
                        &key,
                        format!("port {} (one of port_base to port_base + 2 × count - 1) is also a listener's or the admin port, expected a range of its own", a.port()),
                    ));
                }
                used.push((a, name));
            }
        }
    }
    Ok(())
}

/// One entry of `backends`, whose address must not be in `seen` (the upstream's addresses so
/// far) nor its name in `names`; `max_conns` and `slow_start` default to the upstream's.
fn backend(
    src: &Source,
    bkey: &str,
    up: &RawUpstream,
    b: &RawBackend,
    seen: &mut HashSet<BackendAddress>,
    names: &mut HashSet<DnsName>,
) -> Result<Entry> {
    let weight = *b.weight.get_ref();
    if weight == 0 {
        return Err(src.at(
            b.weight.span(),
            &format!("{bkey}.weight"),
            "weight 0 is not allowed, expected a positive integer",
        ));
    }
    let cpus = b.cpus.as_ref().map(|c| {
        let mut v = c.get_ref().0.clone();
        v.sort_unstable();
        v.dedup();
        v
    });
    let max_conns = b.max_conns.unwrap_or(up.max_conns);
    let backup = b.backup.as_ref().is_some_and(|v| *v.get_ref());
    let slow_start = b
        .slow_start
        .or(up.slow_start)
        .map_or(Duration::ZERO, |d| d.0);
    let (name, span, key) = match (&b.address, &b.srv) {
        (Some(a), Some(s)) => {
            return Err(src.at(
                s.span(),
                &format!("{bkey}.srv"),
                format!(
                    "set together with address = {:?}, expected one of address (IP:PORT or NAME:PORT) or srv (an SRV name)",
                    a.get_ref()
                ),
            ));
        }
        (None, None) => {
            return Err(src.at(
                up.backends.as_ref().map_or(0..0, |b| b.span()),
                bkey,
                "no address, expected address = \"IP:PORT\" (or \"NAME:PORT\"), or srv = \"_service._tcp.NAME\"",
            ));
        }
        (Some(a), None) => {
            let text = a.get_ref();
            if let Some(address) = BackendAddress::parse(text) {
                let akey = format!("{bkey}.address");
                let address = address.map_err(|e| src.at(a.span(), &akey, e.to_string()))?;
                if let BackendAddress::Unix(path) = address {
                    super::unix_backend::check(path, up.tls.is_some())
                        .map_err(|what| src.at(a.span(), &akey, what))?;
                }
                if !seen.insert(address) {
                    return Err(src.at(
                        a.span(),
                        &format!("{bkey}.address"),
                        format!(
                            "duplicate backend address {address}; each backend may appear once"
                        ),
                    ));
                }
                return Ok(Entry::Address(Backend {
                    address,
                    weight,
                    cpus,
                    max_conns,
                    slow_start,
                    backup,
                }));
            }
            let name = host_and_port(text).ok_or_else(|| {
                src.at(
                    a.span(),
                    &format!("{bkey}.address"),
                    bad_address(text, "127.0.0.1:8881"),
                )
            })?;
            (name, a.span(), format!("{bkey}.address"))
        }
        (None, Some(s)) => {
            let text = s.get_ref().trim_end_matches('.');
            if !is_dns_name(text) {
                return Err(src.at(
                    s.span(),
                    &format!("{bkey}.srv"),
                    format!(
                        "invalid SRV name {:?}, expected a DNS name such as \"_http._tcp.app.internal\"",
                        s.get_ref()
                    ),
                ));
            }
            (
                DnsName::Srv(text.to_string()),
                s.span(),
                format!("{bkey}.srv"),
            )
        }
    };
    if !names.insert(name.clone()) {
        return Err(src.at(
            span,
            &key,
            format!("duplicate backend {name}; each name may appear once"),
        ));
    }
    Ok(Entry::Name(NamedBackend {
        name,
        weight,
        cpus,
        max_conns,
        slow_start,
        backup,
    }))
}

/// `NAME:PORT` with a DNS name (not an IP address), as [`DnsName::Host`].
fn host_and_port(text: &str) -> Option<DnsName> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    let host = host.trim_end_matches('.');
    (host.parse::<std::net::IpAddr>().is_err() && is_dns_name(host)).then(|| DnsName::Host {
        host: host.to_string(),
        port,
    })
}

/// Letters, digits, `-` and `_` (SRV labels start with one) in dot-separated labels of 1 to
/// 63 characters, 253 in all.
fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// `[upstream.NAME.resolve]`.
fn resolve(src: &Source, key: &str, r: &RawResolve) -> Result<Resolve> {
    let d = Resolve::default();
    let interval = positive(src, &r.interval, &format!("{key}.resolve.interval"))?;
    let min_interval = positive(src, &r.min_interval, &format!("{key}.resolve.min_interval"))?;
    let interval = interval.unwrap_or(d.interval);
    // A shorter interval than the default minimum lowers the minimum with it.
    let min_interval = min_interval.unwrap_or(d.min_interval.min(interval));
    if min_interval > interval {
        let span = r.min_interval.as_ref().map_or(0..0, |v| v.span());
        return Err(src.at(
            span,
            &format!("{key}.resolve.min_interval"),
            format!(
                "{min_interval:?} is longer than resolve.interval ({interval:?}), expected at most the interval"
            ),
        ));
    }
    Ok(Resolve {
        interval,
        min_interval,
    })
}

/// `[resolver]`.
pub(super) fn resolver(src: &Source, r: &RawResolver) -> Result<Resolver> {
    let mut nameservers = Vec::new();
    for (i, ns) in r.nameservers.iter().flatten().enumerate() {
        let text = ns.get_ref();
        let addr = text
            .parse::<SocketAddr>()
            .or_else(|_| {
                text.parse::<std::net::IpAddr>()
                    .map(|ip| SocketAddr::new(ip, 53))
            })
            .map_err(|_| {
                src.at(
                    ns.span(),
                    &format!("resolver.nameservers[{i}]"),
                    format!(
                        "invalid nameserver {text:?}, expected an IP address, or IP:PORT such as \"10.96.0.10:53\""
                    ),
                )
            })?;
        nameservers.push(addr);
    }
    Ok(Resolver { nameservers })
}

/// `[upstream.NAME.timeouts]`.
fn timeouts(src: &Source, key: &str, t: &RawTimeouts) -> Result<Timeouts> {
    let d = Timeouts::default();
    let tkey = |field: &str| format!("{key}.timeouts.{field}");
    Ok(Timeouts {
        connect: positive(src, &t.connect, &tkey("connect"))?.unwrap_or(d.connect),
        response: positive(src, &t.response, &tkey("response"))?.unwrap_or(d.response),
        send: positive(src, &t.send, &tkey("send"))?.unwrap_or(d.send),
        client_idle: positive(src, &t.client_idle, &tkey("client_idle"))?.unwrap_or(d.client_idle),
        queue: positive(src, &t.queue, &tkey("queue"))?.unwrap_or(d.queue),
    })
}

/// `upgrade`, `timeouts.tunnel_idle` and `timeouts.tunnel_fin` of `[upstream.NAME]`.
fn upgrade(src: &Source, key: &str, up: &RawUpstream) -> Result<Upgrade> {
    let d = Upgrade::default();
    let (tunnel_idle, tunnel_fin) = (&up.timeouts.tunnel_idle, &up.timeouts.tunnel_fin);
    Ok(Upgrade {
        enabled: up.upgrade.unwrap_or(d.enabled),
        tunnel_idle: positive(src, tunnel_idle, &format!("{key}.timeouts.tunnel_idle"))?
            .unwrap_or(d.tunnel_idle),
        tunnel_fin: positive(src, tunnel_fin, &format!("{key}.timeouts.tunnel_fin"))?
            .unwrap_or(d.tunnel_fin),
    })
}

/// `[upstream.NAME.health]`: checks are on when the table is there.
fn health(src: &Source, key: &str, h: &RawHealth) -> Result<Health> {
    let d = Health::default();
    let hkey = format!("{key}.health");
    let interval = positive(src, &h.interval, &format!("{hkey}.interval"))?.unwrap_or(d.interval);
    let timeout = positive(src, &h.timeout, &format!("{hkey}.timeout"))?.unwrap_or(d.timeout);
    const DAY: Duration = Duration::from_secs(24 * 3600);
    if interval > DAY {
        let span = h.interval.as_ref().map_or(0..0, |d| d.span());
        return Err(src.at(
            span,
            &format!("{hkey}.interval"),
            format!("{interval:?} is too long, expected at most 1 day"),
        ));
    }
    if timeout >= interval {
        let span = h
            .timeout
            .as_ref()
            .or(h.interval.as_ref())
            .map_or(0..0, |d| d.span());
        return Err(src.at(
            span,
            &hkey,
            format!("timeout ({timeout:?}) must be less than interval ({interval:?})"),
        ));
    }
    let count = |v: &Option<Spanned<u32>>, field: &str, default: u32| match v {
        None => Ok(default),
        Some(x) if *x.get_ref() == 0 => Err(src.at(
            x.span(),
            &format!("{hkey}.{field}"),
            "0 is not allowed, expected a positive number of checks",
        )),
        Some(x) => Ok(*x.get_ref()),
    };
    let path = match &h.path {
        None => d.path,
        Some(p) => {
            let v = p.get_ref();
            // A fragment is never sent on the wire.
            if !v.starts_with('/')
                || v.contains('#')
                || http::uri::PathAndQuery::try_from(v.as_str()).is_err()
            {
                return Err(src.at(
                    p.span(),
                    &format!("{hkey}.path"),
                    format!(
                        "invalid path \"{v}\", expected an origin-form path such as \"/health\""
                    ),
                ));
            }
            v.clone()
        }
    };
    let host = match &h.host {
        None => d.host,
        Some(v) => {
            if v.get_ref().is_empty()
                || http::HeaderValue::from_str(v.get_ref()).is_err()
                || v.get_ref().contains([' ', '\t'])
            {
                return Err(src.at(
                    v.span(),
                    &format!("{hkey}.host"),
                    format!(
                        "invalid host \"{}\", expected a host name such as \"app.local\"",
                        v.get_ref()
                    ),
                ));
            }
            Some(v.get_ref().clone())
        }
    };
    Ok(Health {
        path,
        interval,
        timeout,
        rise: count(&h.rise, "rise", d.rise)?,
        fall: count(&h.fall, "fall", d.fall)?,
        expect: match &h.expect {
            None => d.expect,
            // Nothing would pass: every backend would go down after `fall`.
            Some(e) if e.get_ref().is_empty() => {
                return Err(src.at(
                    e.span(),
                    &format!("{hkey}.expect"),
                    "an empty list passes no probe, expected a status such as 200, a range such as \"200-399\", or a list of them",
                ));
            }
            Some(e) => e.get_ref().clone(),
        },
        host,
        // A TCP upstream's, once the listeners that name it are known (`config::tcp`).
        tcp: None,
    })
}

/// `[upstream.NAME.passive]`.
fn passive(src: &Source, key: &str, p: &RawPassive) -> Result<Passive> {
    let d = Passive::default();
    Ok(Passive {
        max_fails: p.max_fails.unwrap_or(d.max_fails),
        fail_timeout: positive(src, &p.fail_timeout, &format!("{key}.passive.fail_timeout"))?
            .unwrap_or(d.fail_timeout),
        fail_on_status: p.fail_on_status.clone().unwrap_or(d.fail_on_status),
    })
}

/// `[[listener]]`: at least one, each to a known upstream; every listener's error, not only the
/// first one's. `upstreams` are the names of the file's upstreams, valid or not, in the order
/// of the validated ones: a listener that names one that failed is not an error of its own.
pub(super) fn listeners(
    src: &Source,
    raw: &[RawListener],
    upstreams: &[&str],
    caches: &[&str],
) -> std::result::Result<Vec<Listener>, ConfigErrors> {
    if raw.is_empty() {
        return Err(src
            .at(0..0, "listener", "expected at least one [[listener]]")
            .into());
    }
    let mut listeners = Vec::with_capacity(raw.len());
    let mut errors = Vec::new();
    let mut seen = Vec::with_capacity(raw.len());
    for (i, l) in raw.iter().enumerate() {
        match listener(
            src,
            &format!("listener[{i}]"),
            l,
            (upstreams, caches),
            &mut seen,
        ) {
            Ok(l) => listeners.push(l),
            Err(e) => errors.push(e),
        }
    }
    // With no upstreams, a listener that names one has said so already.
    if upstreams.is_empty() && errors.is_empty() {
        errors.push(src.at(
            0..0,
            "upstream",
            "expected at least one [upstream.NAME], for the listeners to proxy to",
        ));
    }
    match ConfigErrors::new(errors) {
        Some(errors) => Err(errors),
        None => Ok(listeners),
    }
}

/// One `[[listener]]`, whose address must not be in `seen` (the earlier listeners' addresses,
/// each with whether it is UDP), and goes there.
fn listener(
    src: &Source,
    key: &str,
    l: &RawListener,
    (upstreams, caches): (&[&str], &[&str]),
    seen: &mut Vec<(SocketAddr, bool)>,
) -> Result<Listener> {
    let address: SocketAddr = l.address.get_ref().parse().map_err(|_| {
        src.at(
            l.address.span(),
            &format!("{key}.address"),
            bad_address(l.address.get_ref(), "127.0.0.1:8888"),
        )
    })?;
    let mode = super::tcp::mode(src, key, l)?;
    // SO_REUSEPORT would let both bind and the kernel would split one port's connections
    // between two upstreams. Port 0 asks the kernel for a fresh port each time. A UDP port is
    // another port than the TCP one of the same number (DNS listens on both).
    let udp = mode == super::ListenerMode::Udp;
    if address.port() != 0 && seen.contains(&(address, udp)) {
        return Err(src.at(
            l.address.span(),
            &format!("{key}.address"),
            format!(
                "duplicate listener address {address}{}; each address may be listened on once",
                if udp { " (UDP)" } else { "" }
            ),
        ));
    }
    seen.push((address, udp));
    let mut routes = super::routes::routes(src, key, &l.route, |rkey, u| {
        upstream_index(src, rkey, u, upstreams)
    })?;
    let modules = Configs::validate(
        &Place {
            src,
            key,
            upstreams,
            caches,
            tls: l.tls.as_ref().map(Spanned::span),
        },
        &l.modules,
        None,
    )?;
    for (i, (rule, r)) in routes.iter_mut().zip(&l.route).enumerate() {
        let (r, rkey) = (r.get_ref(), format!("{key}.route[{i}]"));
        let at = Place {
            src,
            key: &rkey,
            upstreams,
            caches,
            tls: l.tls.as_ref().map(Spanned::span),
        };
        rule.modules = Configs::validate(&at, &r.modules, Some(&modules))?;
    }
    let upstream = match &l.upstream {
        Some(u) => upstream_index(src, key, u, upstreams)?,
        // It proxies nothing by default; any index will do, and there is one once any
        // listener proxies.
        None if modules.answers_all().is_some() || !routes.is_empty() => 0,
        None => {
            return Err(src.at(
                l.address.span(),
                &format!("{key}.upstream"),
                "missing, expected the name of an [upstream.NAME] (or [[listener.route]]s, or redirect_https = true)",
            ));
        }
    };
    let h2c = l.h2c.as_ref().is_some_and(|v| *v.get_ref());
    if let (true, Some(t)) = (h2c, &l.tls) {
        return Err(src.at(
            t.span(),
            &format!("{key}.tls"),
            "set together with h2c, expected one of them: h2c is HTTP/2 on a plain listener; a TLS listener offers h2 by ALPN (listener.http2)",
        ));
    }
    if let (Some(v), None) = (&l.http2, &l.tls) {
        return Err(src.at(
            v.span(),
            &format!("{key}.http2"),
            "only applies to a TLS listener (ALPN), expected h2c = true for HTTP/2 on a plain listener",
        ));
    }
    let backlog = match &l.backlog {
        None => crate::sys::limits::somaxconn(),
        // listen(2) takes an int; the kernel caps it at net.core.somaxconn.
        Some(v) => match u32::try_from(*v.get_ref()) {
            Ok(n) if (1..=i32::MAX as u32).contains(&n) => n,
            _ => {
                return Err(src.at(
                    v.span(),
                    &format!("{key}.backlog"),
                    format!(
                        "{} is out of range, expected a number of connections from 1 to {}",
                        v.get_ref(),
                        i32::MAX
                    ),
                ));
            }
        },
    };
    let alpn = match (mode, l.http2.as_ref().is_none_or(|v| *v.get_ref())) {
        // A TCP listener's clients may ask for any protocol; it offers none.
        (super::ListenerMode::Tcp, _) => &[][..],
        (_, true) => crate::tls::server::ALPN_H2,
        (_, false) => crate::tls::server::ALPN_H1,
    };
    let tls = l
        .tls
        .as_ref()
        .map(|t| tls(src, key, t, alpn))
        .transpose()?
        .map(Arc::new);
    Ok(Listener {
        address,
        mode,
        sni: super::tcp::sni(src, key, l, upstreams)?,
        udp: super::tcp::udp(src, key, l, mode)?,
        upstream,
        tls,
        h2c,
        has_default: l.upstream.is_some(),
        routes,
        backlog,
        rate_limits: Vec::new(),
        conn_limit: None,
        proxy_protocol: super::proxy_protocol::accept(src, key, l)?.map(Arc::new),
        modules,
    })
}

/// A listener's `upstream`, as an index into `upstreams`.
fn upstream_index(
    src: &Source,
    key: &str,
    wanted: &Spanned<String>,
    upstreams: &[&str],
) -> Result<usize> {
    upstreams
        .iter()
        .position(|u| u == wanted.get_ref())
        .ok_or_else(|| {
            src.at(
                wanted.span(),
                &format!("{key}.upstream"),
                format!(
                    "unknown upstream \"{}\", expected one of: {}",
                    wanted.get_ref(),
                    if upstreams.is_empty() {
                        "(none defined)".to_string()
                    } else {
                        upstreams.join(", ")
                    }
                ),
            )
        })
}

/// `[listener.tls]`: every certificate and key read and checked now, so that a bad file fails
/// the start or the reload, naming the file, and a reload that fails keeps the certificates
/// that run.
fn tls(src: &Source, key: &str, raw: &Spanned<RawTls>, alpn: &[&[u8]]) -> Result<Terminator> {
    let t = raw.get_ref();
    let tkey = format!("{key}.tls");
    // Each certificate's files, the keys they were given under and their places.
    let mut entries = Vec::with_capacity(t.certificates.len() + 1);
    let default = cert_pair(src, &tkey, &t.cert, &t.key)?;
    if let (Some(files), Some(c), Some(k)) = (&default, &t.cert, &t.key) {
        entries.push((tkey.clone(), files.clone(), c.span(), k.span()));
    }
    let mut by_name = Vec::with_capacity(t.certificates.len());
    for (i, c) in t.certificates.iter().enumerate() {
        let files = CertFiles {
            cert: c.cert.get_ref().into(),
            key: c.key.get_ref().into(),
        };
        let ckey = format!("{tkey}.certificate[{i}]");
        entries.push((ckey, files.clone(), c.cert.span(), c.key.span()));
        by_name.push(files);
    }
    if entries.is_empty() {
        return Err(src.at(
            raw.span(),
            &tkey,
            "no certificate, expected cert and key (the default certificate), [[listener.tls.certificate]] tables, or both",
        ));
    }
    let provider = crate::tls::server::provider();
    let client_auth = crate::modules::client_cert::validate(src, &tkey, t.client_cert(), provider)?;
    Terminator::load(default.as_ref(), &by_name, alpn, client_auth).map_err(|e| {
        let place = e.file().and_then(|file| {
            entries.iter().find_map(|(k, files, cert, key)| {
                if files.key == file {
                    Some((format!("{k}.key"), key.clone()))
                } else if files.cert == file {
                    Some((format!("{k}.cert"), cert.clone()))
                } else {
                    None
                }
            })
        });
        let (k, span) = place.unwrap_or((tkey.clone(), raw.span()));
        src.at(span, &k, e.to_string())
    })
}

/// A table's `cert` and `key` (under `tkey`): both, or neither.
fn cert_pair(
    src: &Source,
    tkey: &str,
    cert: &Option<Spanned<String>>,
    key: &Option<Spanned<String>>,
) -> Result<Option<CertFiles>> {
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some(CertFiles {
            cert: c.get_ref().into(),
            key: k.get_ref().into(),
        })),
        (None, None) => Ok(None),
        (Some(c), None) => Err(src.at(
            c.span(),
            &format!("{tkey}.key"),
            "missing, expected the private key file of this cert",
        )),
        (None, Some(k)) => Err(src.at(
            k.span(),
            &format!("{tkey}.cert"),
            "missing, expected the certificate chain file for this key",
        )),
    }
}

/// `[forwarded] trusted`: networks, or addresses as networks of one.
pub(super) fn forwarded(src: &Source, raw: &RawForwarded) -> Result<Vec<ipnet::IpNet>> {
    let mut trusted = Vec::with_capacity(raw.trusted.len());
    for (i, t) in raw.trusted.iter().enumerate() {
        let v = t.get_ref();
        let net = v
            .parse::<ipnet::IpNet>()
            .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                src.at(
                    t.span(),
                    &format!("forwarded.trusted[{i}]"),
                    format!(
                        "invalid network \"{v}\", expected an address or a CIDR block such as \"10.0.0.0/8\""
                    ),
                )
            })?;
        trusted.push(net);
    }
    Ok(trusted)
}

/// Why `text` is not an `IP:PORT`. A host name gets told that names are not resolved: pinlb
/// reads addresses once, at load, and a name would have to be looked up then and its answer
/// kept (nginx's behaviour), which hides an address that changes and picks one of
/// `localhost`'s two (127.0.0.1 or ::1) silently. Writing the IP makes that choice visible.
fn bad_address(text: &str, example: &str) -> String {
    let named_host = text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && port.parse::<u16>().is_ok()
            && host.parse::<std::net::IpAddr>().is_err()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    });
    if named_host {
        let like = match text.strip_prefix("localhost:") {
            Some(port) => format!("\"127.0.0.1:{port}\" or \"[::1]:{port}\""),
            None => format!("\"{example}\""),
        };
        format!(
            "invalid address \"{text}\": host names are not resolved; write the IP address and port, such as {like}"
        )
    } else {
        format!("invalid address \"{text}\", expected IP:PORT such as \"{example}\"")
    }
}

/// `[admin]`: off loopback it needs a token, and it may not share a listener's address (one of
/// `listeners`).
pub(super) fn admin(src: &Source, a: &RawAdmin, listeners: &[SocketAddr]) -> Result<Admin> {
    let address = match &a.address {
        None => Admin::DEFAULT_ADDRESS.parse().ok(),
        Some(v) => v.get_ref().parse::<SocketAddr>().ok(),
    }
    .ok_or_else(|| {
        let v = a.address.as_ref().map_or(Default::default(), |v| v.span());
        let text = a.address.as_ref().map_or("", |v| v.get_ref().as_str());
        src.at(
            v,
            "admin.address",
            bad_address(text, Admin::DEFAULT_ADDRESS),
        )
    })?;
    // A token file keeps the secret out of the config, as container and systemd secrets are
    // mounted; its trailing newline is not part of the secret.
    let (key, token) = match (&a.token, &a.token_file) {
        (Some(_), Some(f)) => {
            return Err(src.at(
                f.span(),
                "admin.token_file",
                "set together with admin.token, expected one of them",
            ));
        }
        (None, Some(f)) => {
            let secret = std::fs::read_to_string(f.get_ref()).map_err(|e| {
                src.at(
                    f.span(),
                    "admin.token_file",
                    format!("cannot read {}: {e}", f.get_ref()),
                )
            })?;
            (
                "admin.token_file",
                Some((f.span(), secret.trim_end().to_string())),
            )
        }
        (t, None) => (
            "admin.token",
            t.as_ref().map(|t| (t.span(), t.get_ref().clone())),
        ),
    };
    let token = match token {
        Some((span, t)) if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) => {
            return Err(src.at(
                span,
                key,
                "expected a non-empty secret of printable ASCII characters without spaces (it is sent in an HTTP header)",
            ));
        }
        t => t.map(|(_, t)| t),
    };
    let span = a.address.as_ref().map_or(0..0, |v| v.span());
    if token.is_none() && !address.ip().is_loopback() {
        return Err(src.at(
            span,
            "admin.address",
            format!(
                "{address} is not a loopback address, so admin.token or admin.token_file must be set: anyone who can reach it could take backends out and reload the config"
            ),
        ));
    }
    if address.port() != 0 && listeners.contains(&address) {
        return Err(src.at(
            span,
            "admin.address",
            format!("{address} is also a [[listener]] address, expected an address of its own"),
        ));
    }
    Ok(Admin { address, token })
}

/// Where byte `at` of a string value lies in the file: exact for a literal string (`'…'`,
/// as templates are written) or a basic one without escapes; the value's start otherwise.
fn within(src: &Source, span: std::ops::Range<usize>, at: usize) -> std::ops::Range<usize> {
    let raw = src.text.get(span.clone()).unwrap_or_default();
    let quote = raw.chars().next();
    let plain = matches!(quote, Some('\''))
        || (matches!(quote, Some('"')) && !raw.contains('\\') && !raw.starts_with("\"\"\""));
    if plain && span.start + 1 + at < span.end {
        let start = span.start + 1 + at;
        start..span.end
    } else {
        span
    }
}

/// `[log]`: `format` only with `access`.
pub(super) fn log(src: &Source, raw: &RawLog) -> Result<Option<AccessLog>> {
    let access_log = match &raw.access {
        None => None,
        Some(v) if v.get_ref().is_empty() => {
            return Err(src.at(v.span(), "log.access", "expected \"stdout\" or a file path"));
        }
        Some(v) => Some(AccessLog {
            target: if v.get_ref() == "stdout" {
                AccessTarget::Stdout
            } else {
                AccessTarget::File(v.get_ref().into())
            },
            format: AccessFormat::Combined,
        }),
    };
    match (&raw.format, access_log) {
        (None, a) => Ok(a),
        (Some(f), None) => Err(src.at(
            f.span(),
            "log.format",
            "set without log.access, expected log.access too (\"stdout\" or a file path)",
        )),
        (Some(f), a) => {
            let format = match f.get_ref().as_str() {
                "combined" => AccessFormat::Combined,
                "json" => AccessFormat::Json,
                t if t.contains('{') => match AccessTemplate::parse(t) {
                    Ok(t) => AccessFormat::Template(Arc::new(t)),
                    Err(e) => {
                        return Err(src.at(within(src, f.span(), e.at), "log.format", e.message));
                    }
                },
                other => {
                    return Err(src.at(
                        f.span(),
                        "log.format",
                        format!(
                            "unknown value \"{other}\", expected combined, json, or a template with fields such as '{{remote_addr}} {{status}} {{request_time}}'"
                        ),
                    ));
                }
            };
            Ok(a.map(|a| AccessLog { format, ..a }))
        }
    }
}
