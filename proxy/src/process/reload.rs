//! Hot reload (SIGHUP, `POST /reload`): read the file again, validate it, and hand every worker a
//! new configuration generation.
//!
//! Validation comes first: an invalid file changes nothing. A valid one becomes a new
//! configuration generation that every worker switches to between two requests:
//!
//! - backends still present (same upstream, same address) keep their state: health, passive
//!   failures, in-flight count, admin state, counters, and each worker's pooled connections;
//! - removed backends get no new requests; those in flight finish;
//! - open client connections stay open, and their next request follows the new config;
//! - new listener addresses are bound here, before anything is swapped, so a port that is taken
//!   fails the reload instead of half-applying it; removed ones stop accepting and their
//!   connections finish;
//! - backends' DNS names the file keeps keep the addresses they resolved to; new names are
//!   looked up by `dns_watch`, which publishes its own changed answers through [`publish`] too.
//!
//! What a running process cannot change is kept as it was, and the reply says so: the worker
//! cores (`runtime.cpus`), the admin listener, the access log, `limits.max_connections` and
//! `runtime.upgrade_socket`.
//! `limits.max_header_bytes`, `max_headers`, `header_timeout` and `timeouts.client_idle` are
//! fixed per client connection when it is accepted, so they apply to connections accepted after
//! the reload; everything else applies to the next request on every connection.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Backend, Config};
use crate::process::changes::describe;
use crate::process::listen::{bind_listeners, listener_keys};
use crate::process::shared::{Generation, Process};
use crate::upstream::shared::SharedUpstream;

/// How long a reload waits for every worker to switch. A worker switches between two polls of
/// its runtime, so only a stuck worker takes longer.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a reload did not (fully) happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    /// Nothing changed: no file, an invalid one, a port that can't be bound, or an earlier
    /// reload still being applied.
    #[error("reload failed, the running configuration stays: {0}")]
    Refused(String),
    /// The new generation went out but not every worker confirmed it in time: some may still
    /// run the previous one.
    #[error("{0}")]
    Unconfirmed(String),
}

/// Whether all `workers` run `generation`, waiting up to [`SWITCH_TIMEOUT`] for them.
async fn all_switched(generation: &Generation, workers: usize) -> bool {
    let until = tokio::time::Instant::now() + SWITCH_TIMEOUT;
    // Bounded: each pass returns, or waits for a worker's switch, until `until`.
    loop {
        // Listening before looking, so that a switch between the two is not missed.
        let switch = generation.switched.notified();
        let mut switch = std::pin::pin!(switch);
        switch.as_mut().enable();
        if generation.acked.load(std::sync::atomic::Ordering::Relaxed) >= workers {
            return true;
        }
        if tokio::time::timeout_at(until, switch).await.is_err() {
            return false;
        }
    }
}

/// Reloads the configuration file; returns a summary of what changed, or why nothing did.
pub(crate) async fn reload(process: &Process) -> Result<String, ReloadError> {
    let _one_at_a_time = process.reloading.lock().await;
    let refused = |e: String| ReloadError::Refused(e);
    let path = process.config_path.as_ref().ok_or_else(|| {
        refused(
            "pinlb was started without a configuration file, so there is nothing to read again"
                .into(),
        )
    })?;
    let mut config =
        Config::load_for(path, &process.allowed).map_err(|e| refused(e.to_string()))?;
    let current = process.generations.borrow().clone();
    // A worker that skipped a generation would never take that generation's new sockets, so a
    // reload right after the start (or after another reload that timed out) waits for every
    // worker to run the current one, as long as a reload waits for its own.
    if !all_switched(&current, process.workers).await {
        let switched = current.acked.load(std::sync::atomic::Ordering::Relaxed);
        return Err(refused(format!(
            "generation {} is not running on every worker yet ({switched} of {} after {SWITCH_TIMEOUT:?}); try again",
            current.number, process.workers
        )));
    }
    let before = &current.config;

    let mut kept = Vec::new();
    if config.runtime.cpus != before.runtime.cpus {
        kept.push(format!(
            "runtime.cpus changed to {:?}, which needs a restart; workers stay on cores {:?}",
            config.runtime.cpus, before.runtime.cpus
        ));
        config.runtime.cpus = before.runtime.cpus.clone();
    }
    if config.admin != before.admin {
        kept.push(
            "[admin] changed, which needs a restart; the admin listener stays as it was".into(),
        );
        config.admin = before.admin.clone();
    }
    if config.access_log != before.access_log {
        kept.push("[log] changed, which needs a restart; the access log stays as it was".into());
        config.access_log = before.access_log.clone();
    }
    if config.runtime.upgrade_socket != before.runtime.upgrade_socket {
        kept.push(
            "runtime.upgrade_socket changed, which needs a restart or an upgrade; the running process listens where it did".into(),
        );
        config.runtime.upgrade_socket = before.runtime.upgrade_socket.clone();
    }
    if config.resolver != before.resolver {
        kept.push(
            "[resolver] changed, which needs a restart; names are looked up as before".into(),
        );
        config.resolver = before.resolver.clone();
    }
    // A default lowered at start to fit the open file limit is no change while the file
    // still leaves the key out.
    let limits = (&config.limits, &before.limits);
    let set = limits.0.max_connections_given || limits.1.max_connections_given;
    if set && limits.0.max_connections != limits.1.max_connections {
        kept.push(format!(
            "limits.max_connections changed, which needs a restart; it stays {}",
            before.limits.max_connections
        ));
    }
    config.limits.max_connections = before.limits.max_connections;
    config.limits.max_connections_given = before.limits.max_connections_given;

    let spawn_changes = spawn_changes(before, &config);
    spawned_pools(&mut config, Some(&current));
    // Names the new file keeps keep what they resolved to; new ones are looked up by
    // `dns_watch` once this generation runs.
    let config = process.dns.expand_new(config);

    let running_keys = listener_keys(&before.listeners);
    let running = |k: &_| running_keys.contains(k);
    let (sockets, bound) = bind_listeners(&config.listeners, process.workers, running)
        .map_err(|e| refused(e.to_string()))?;
    process.exposed.add_listeners(&sockets);
    let mut summary = describe(before, &config, &bound, &kept);
    for line in spawn_changes {
        summary.push_str(if summary.is_empty() { "" } else { "\n" });
        summary.push_str(&line);
    }
    let number = publish(process, current, config, sockets).await?;
    if summary.is_empty() {
        summary.push_str("no change");
    }
    Ok(format!("reloaded: generation {number}\n{summary}"))
}

/// Hands every worker `config` as the generation after `current`, the backends that stay
/// keeping their state, with `sockets` for the listeners it adds; waits for every worker to
/// switch and returns the new generation's number. The caller holds `process.reloading`.
pub(crate) async fn publish(
    process: &Process,
    current: Arc<Generation>,
    config: Config,
    sockets: crate::process::listen::Sockets,
) -> Result<u64, ReloadError> {
    let counting = config.admin.is_some();
    let upstreams: Vec<Arc<SharedUpstream>> = config
        .upstreams
        .iter()
        .map(|u| {
            Arc::new(SharedUpstream::reloaded(
                u.clone(),
                counting,
                &current.upstreams,
            ))
        })
        .collect();

    let number = current.number + 1;
    let generation = Arc::new(Generation::new(
        number,
        Arc::new(config),
        upstreams,
        sockets,
    ));
    drop(current);
    process.generations.send_replace(generation.clone());
    // A removed listener's socket must close with the workers' copies, not live on here.
    process
        .exposed
        .keep_listeners(&listener_keys(&generation.config.listeners));
    let workers = u32::try_from(process.workers).unwrap_or(u32::MAX);
    match tokio::time::timeout(SWITCH_TIMEOUT, generation.applied.acquire_many(workers)).await {
        Ok(Ok(permits)) => {
            permits.forget();
            // Every worker runs on the new tables now; the ones it no longer names can go.
            process.edge.keep(&generation.config);
        }
        _ => {
            return Err(ReloadError::Unconfirmed(format!(
                "generation {number} was sent, but not every worker confirmed it within {SWITCH_TIMEOUT:?}; some may still run generation {}",
                number - 1
            )));
        }
    }
    Ok(number)
}

/// Gives each spawned upstream of `config` the pool that runs: the running generation's
/// backends of the same spawned upstream, or none yet (at start, or for an upstream that is new
/// or newly spawned). The file's `backends` for it are only the processes' first addresses; the
/// supervisor adds each process to the pool once it answers, and rolls them when the spawn
/// table changed.
pub(crate) fn spawned_pools(config: &mut Config, running: Option<&Generation>) {
    for u in config.upstreams.iter_mut().filter(|u| u.spawn.is_some()) {
        let template = u.backends.first().cloned();
        let live = running
            .and_then(|g| g.upstreams.iter().find(|r| r.config.name == u.name))
            .filter(|r| r.config.spawn.is_some())
            .map(|r| r.config.backends.clone())
            .unwrap_or_default();
        // The reloaded file's per-backend settings (all spawned backends share them).
        u.backends = live
            .into_iter()
            .map(|b| match &template {
                Some(t) => Backend {
                    address: b.address,
                    cpus: b.cpus,
                    ..t.clone()
                },
                None => b,
            })
            .collect();
    }
}

/// One line per spawned upstream whose spawn table a reload changes.
fn spawn_changes(before: &Config, after: &Config) -> Vec<String> {
    after
        .upstreams
        .iter()
        .filter_map(|u| {
            let s = u.spawn.as_ref()?;
            let old = before.upstreams.iter().find(|o| o.name == u.name);
            match old.and_then(|o| o.spawn.as_ref()) {
                Some(o) if o == s => None,
                Some(_) => Some(format!(
                    "upstream {}: spawn table changed; its processes are restarted one at a time",
                    u.name
                )),
                None => Some(format!(
                    "upstream {}: starting {} spawned process(es)",
                    u.name, s.count
                )),
            }
        })
        .collect()
}

/// Replaces the pool of spawned upstream `upstream` with `backends`, in a new generation that
/// changes nothing else: the supervisor's step when a process answers, exits, or is rolled.
/// Waits, as a reload does, until every worker runs it, so that once this returns no new
/// request goes to a backend it left out.
pub(crate) async fn set_backends(
    process: &Process,
    upstream: &str,
    backends: Vec<Backend>,
) -> Result<(), ReloadError> {
    let _one_at_a_time = process.reloading.lock().await;
    let current = process.generations.borrow().clone();
    let mut config = (*current.config).clone();
    let Some(u) = config.upstreams.iter_mut().find(|u| u.name == upstream) else {
        return Err(ReloadError::Refused(format!(
            "upstream {upstream} is not in the running configuration"
        )));
    };
    if u.backends == backends {
        return Ok(());
    }
    u.backends = backends;
    let sockets = (0..process.workers).map(|_| Vec::new()).collect();
    publish(process, current, config, sockets).await.map(|_| ())
}
