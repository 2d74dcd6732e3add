//! The kernel's limits that decide how much load pinlb's own sockets take: the listen backlog's
//! ceiling (`net.core.somaxconn`) and the open file limit (`RLIMIT_NOFILE`), which bounds how
//! many connections can be proxied at once.

use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::resource::{Resource, getrlimit, rlim_t, setrlimit};

/// Where Linux says how long a listen queue may be; `listen(2)` silently caps any larger
/// backlog at it.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// The backlog when `/proc` cannot be read (no `/proc` in a sandbox, or a kernel without the
/// file): 4096 is Linux's own default for `somaxconn` since 5.4, so asking for it asks for what
/// an untuned kernel gives, and an older kernel caps it at its own value anyway.
const SOMAXCONN_UNKNOWN: u32 = 4096;

/// The kernel's ceiling on a listening socket's backlog, the default for `listener.backlog`.
pub fn somaxconn() -> u32 {
    std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(SOMAXCONN_UNKNOWN)
}

/// The process's open file limit, soft and hard (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

fn finite(v: rlim_t) -> Option<u64> {
    (v != nix::sys::resource::RLIM_INFINITY).then_some(v)
}

/// The limit as it is now.
pub fn nofile() -> nix::Result<Nofile> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok(Nofile {
        soft: finite(soft),
        hard: finite(hard),
    })
}

/// The soft open file limit before [`raise_nofile`] raised it; 0 while it has not.
static ORIGINAL_SOFT: AtomicU64 = AtomicU64::new(0);

/// Raises the soft open file limit to the hard one, as Go's runtime does at start and as
/// systemd expects of a service (its default soft limit stays 1024 for programs that still use
/// `select(2)`, with the hard limit for those that ask): a proxy needs two descriptors per
/// connection, and 1024 is a few hundred connections. Returns the limit as it is after. The
/// processes pinlb starts get the limit it started with back ([`original_soft_nofile`]).
pub fn raise_nofile() -> nix::Result<Nofile> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft != hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        ORIGINAL_SOFT.store(soft, Ordering::Relaxed);
    }
    nofile()
}

/// The soft open file limit this process started with, when [`raise_nofile`] raised it: a
/// child gets it back before it runs, as Go does for the programs it starts, since a program
/// that still uses `select(2)` breaks on a descriptor above 1023.
pub(crate) fn original_soft_nofile() -> Option<rlim_t> {
    Some(ORIGINAL_SOFT.load(Ordering::Relaxed)).filter(|&s| s != 0)
}

/// Descriptors kept out of the count of proxied connections: the listening sockets (each
/// worker has its own per listener, and with `runtime.upgrade_socket` a duplicate of each is
/// kept for a handover), one health probe per backend at a time, and 64 for the rest: stdin,
/// stdout, stderr and the access log, each thread's epoll and wake-up descriptors (three per
/// runtime, the control thread's included), the admin listener and a few of its clients, the
/// signal and DNS sockets, the upgrade socket. Generous on purpose: running out of these fails
/// a reload or a probe, which is worse than a connection fewer.
pub fn reserved_descriptors(
    workers: usize,
    listeners: usize,
    backends: usize,
    upgrade: bool,
) -> u64 {
    let sockets = workers * listeners * if upgrade { 2 } else { 1 };
    (64 + 3 * workers + sockets + backends) as u64
}

/// How many client connections `limit` descriptors allow at once: each proxied one holds the
/// client's descriptor and a backend's.
pub fn connections_allowed(limit: u64, reserved: u64) -> u64 {
    limit.saturating_sub(reserved) / 2
}

/// What the open file limit leaves room for, and what `limits.max_connections` is then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NofileFit {
    /// The limit and the connections it has room for, as a log line.
    pub line: String,
    /// `limits.max_connections` as it applies: the file's value, or when the file left it out,
    /// the default or what the limit has room for, whichever is less.
    pub max_connections: usize,
    /// Said once when the default was lowered to fit.
    pub lowered: Option<String>,
    /// A value the file set that does not fit.
    pub warning: Option<String>,
}

/// What the open file limit allows (`limit`, `None` when unlimited) for `max_connections`,
/// which the file set when `given`. A value the user set is theirs: when it does not fit, it is
/// kept and warned about, as they may raise the limit instead. The default is pinlb's choice,
/// so it is lowered to fit, and that is said once, not warned about: a machine whose limit is
/// 20,000 has room for fewer than 10,000 proxied connections, and nothing is wrong with it.
pub fn fit_nofile(
    limit: Option<u64>,
    reserved: u64,
    max_connections: usize,
    given: bool,
) -> NofileFit {
    let Some(limit) = limit else {
        return NofileFit {
            line: "open file limit: unlimited, so limits.max_connections decides".to_string(),
            max_connections,
            lowered: None,
            warning: None,
        };
    };
    let allowed = connections_allowed(limit, reserved);
    let line = format!(
        "open file limit {limit}: room for {allowed} proxied connections (a client's descriptor and a backend's each, {reserved} kept for listeners, probes, logs and the admin listener)"
    );
    let fits = max_connections as u64 <= allowed;
    if fits {
        return NofileFit {
            line,
            max_connections,
            lowered: None,
            warning: None,
        };
    }
    if !given {
        // At least one: a limit too small for even that fails every accept anyway, and the
        // semaphore must have a permit.
        let fitted = usize::try_from(allowed).unwrap_or(max_connections).max(1);
        return NofileFit {
            line,
            max_connections: fitted,
            lowered: Some(format!(
                "limits.max_connections is {fitted}, what the open file limit {limit} has room for (the default, {max_connections}, does not fit; set it to choose)"
            )),
            warning: None,
        };
    }
    NofileFit {
        line,
        max_connections,
        lowered: None,
        warning: Some(format!(
            "limits.max_connections = {max_connections} does not fit in the open file limit {limit}, which has room for {allowed}: past that, accepts and backend connects fail with EMFILE (clients wait in the backlog, requests get 502); raise the hard limit (systemd's LimitNOFILE=, ulimit -Hn) or lower limits.max_connections"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn somaxconn_is_read_from_proc() {
        let from_proc: u32 = std::fs::read_to_string(SOMAXCONN)
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(SOMAXCONN_UNKNOWN);
        assert_eq!(somaxconn(), from_proc);
    }

    #[test]
    fn each_connection_takes_two_descriptors_beside_the_reserve() {
        let reserved = reserved_descriptors(2, 1, 3, false);
        assert_eq!(reserved, 64 + 6 + 2 + 3);
        assert_eq!(reserved_descriptors(2, 1, 3, true), reserved + 2);
        assert_eq!(connections_allowed(1024, reserved), (1024 - 75) / 2);
        assert_eq!(connections_allowed(10, reserved), 0);
    }

    #[test]
    fn max_connections_set_over_the_limit_is_kept_and_warned_about() {
        let fit = fit_nofile(Some(1024), 100, 462, true);
        assert_eq!(
            fit.line,
            "open file limit 1024: room for 462 proxied connections (a client's descriptor and a backend's each, 100 kept for listeners, probes, logs and the admin listener)"
        );
        assert_eq!(
            (fit.max_connections, fit.lowered, fit.warning),
            (462, None, None)
        );
        let fit = fit_nofile(Some(1024), 100, 463, true);
        assert_eq!((fit.max_connections, fit.lowered), (463, None));
        assert!(
            fit.warning
                .unwrap()
                .starts_with("limits.max_connections = 463 does not fit in the open file limit 1024, which has room for 462")
        );
        assert_eq!(fit_nofile(None, 100, 1 << 40, true).warning, None);
    }

    #[test]
    fn the_default_max_connections_is_lowered_to_fit_and_said_without_a_warning() {
        let fit = fit_nofile(Some(20_000), 72, 10_000, false);
        assert_eq!(fit.max_connections, 9_964);
        assert_eq!(fit.warning, None);
        assert_eq!(
            fit.lowered.as_deref(),
            Some(
                "limits.max_connections is 9964, what the open file limit 20000 has room for (the default, 10000, does not fit; set it to choose)"
            )
        );
        // A default that fits is left alone; so is any value without a limit.
        let fit = fit_nofile(Some(1 << 20), 72, 10_000, false);
        assert_eq!((fit.max_connections, fit.lowered), (10_000, None));
        assert_eq!(fit_nofile(None, 72, 10_000, false).max_connections, 10_000);
        // A limit with no room at all still leaves one permit.
        assert_eq!(fit_nofile(Some(10), 72, 10_000, false).max_connections, 1);
    }
}
