//! Following backends' DNS names while pinlb runs, on the control thread: each name is looked
//! up again when its answer's TTL runs out (within `[upstream.NAME.resolve]`'s bounds), and a
//! changed set becomes a new configuration generation, as a reload does (`reload::publish`):
//! new addresses join with the upstream's slow start, removed ones get no new requests and
//! their requests in flight finish, the backends that stay keep their state.
//!
//! A failed lookup keeps the name's last good set, warns once (and once more when the name
//! resolves again), and counts in `pinlb_dns_failures_total`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::{Config, DnsName};
use crate::process::changes::describe;
use crate::process::listen::bind_listeners;
use crate::process::reload::publish;
use crate::process::shared::Process;
use crate::upstream::discovery::{Addresses, Lookup, next_lookup};

/// When each name is looked up next, by upstream and name.
pub(crate) type Due = BTreeMap<(String, DnsName), Instant>;

/// How soon a change that could not be applied (a reload was still being applied) is tried
/// again.
const RETRY_APPLY: Duration = Duration::from_millis(200);

/// Looks up every name of `source` once, records the answers in `process_dns`, and returns the
/// configuration expanded with them, and when to look each up next. A name that does not
/// resolve adds no backend (its upstream answers 503 until one of its names does) and is
/// logged.
pub(crate) async fn initial(
    lookup: Option<&Lookup>,
    dns: &crate::upstream::discovery::State,
    source: Config,
) -> (Config, Due) {
    let mut due = Due::new();
    let expanded = dns.expand_new(source);
    let Some(lookup) = lookup else {
        return (expanded, due);
    };
    let names = names(&expanded);
    if names.is_empty() {
        return (expanded, due);
    }
    for (upstream, name, weight, resolve) in names {
        let next = match lookup.resolve(&name, weight).await {
            Ok(answer) => {
                info!(upstream = %upstream, "{name} resolves to {}", shown(&answer.addresses));
                dns.answered(&upstream, &name, answer.addresses);
                next_lookup(answer.ttl, resolve.min_interval, resolve.interval)
            }
            Err(e) => {
                dns.failed(&upstream, &name);
                warn!(
                    upstream = %upstream,
                    "cannot resolve {name}: {e}; starting with no backends from it, looking it up again every {:?}",
                    resolve.min_interval
                );
                resolve.min_interval
            }
        };
        due.insert((upstream, name), Instant::now() + next);
    }
    let expanded = dns.expanded().unwrap_or(expanded);
    (expanded, due)
}

/// Every name of `config`: its upstream, the name, the entry's weight, the upstream's bounds.
fn names(config: &Config) -> Vec<(String, DnsName, u32, crate::config::Resolve)> {
    config
        .upstreams
        .iter()
        .flat_map(|u| {
            u.names
                .iter()
                .map(|n| (u.name.clone(), n.name.clone(), n.weight, u.resolve))
        })
        .collect()
}

/// "127.0.0.1:8081 (weight 1), ..." or "nothing".
fn shown(addresses: &Addresses) -> String {
    if addresses.is_empty() {
        return "nothing".into();
    }
    addresses
        .iter()
        .map(|(a, w)| format!("{a} (weight {w})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Looks names up as they come due and applies changed answers, until the control runtime
/// stops. A reload that brings new names wakes it, and they are looked up at once.
pub(crate) async fn run(process: Arc<Process>, lookup: Lookup, mut due: Due) {
    let mut generations = process.generations.subscribe();
    let mut unapplied = false;
    loop {
        let Some(source) = process.dns.source() else {
            return;
        };
        let names = names(&source);
        due.retain(|k, _| names.iter().any(|n| n.0 == k.0 && n.1 == k.1));
        let mut changed = false;
        for (upstream, name, weight, resolve) in names {
            let key = (upstream.clone(), name.clone());
            if due.get(&key).is_some_and(|at| *at > Instant::now()) {
                continue;
            }
            let next = match lookup.resolve(&name, weight).await {
                Ok(answer) => {
                    let (differs, recovered) =
                        process
                            .dns
                            .answered(&upstream, &name, answer.addresses.clone());
                    if recovered {
                        info!(upstream = %upstream, "{name} resolves again: {}", shown(&answer.addresses));
                    } else if differs {
                        info!(upstream = %upstream, "{name} now resolves to {}", shown(&answer.addresses));
                    }
                    changed |= differs;
                    next_lookup(answer.ttl, resolve.min_interval, resolve.interval)
                }
                Err(e) => {
                    if process.dns.failed(&upstream, &name) {
                        warn!(
                            upstream = %upstream,
                            "cannot resolve {name}: {e}; keeping its last good set (warned once, until it resolves again)"
                        );
                    }
                    resolve.min_interval
                }
            };
            due.insert(key, Instant::now() + next);
        }
        if changed || unapplied {
            unapplied = !apply(&process).await;
        }
        let mut wake = due
            .values()
            .min()
            .copied()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        if unapplied {
            wake = wake.min(Instant::now() + RETRY_APPLY);
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            changed = generations.changed() => {
                if changed.is_err() {
                    tokio::time::sleep_until(wake).await;
                }
            }
        }
    }
}

/// Publishes the file's configuration expanded with the latest answers as a new generation,
/// if it differs from the running one; false when it must be tried again (a reload or an
/// earlier generation still being applied).
async fn apply(process: &Process) -> bool {
    let Ok(_one_at_a_time) = process.reloading.try_lock() else {
        return false;
    };
    let Some(mut config) = process.dns.expanded() else {
        return true;
    };
    let current = process.generations.borrow().clone();
    // Spawned upstreams' pools are the supervisor's, as it last published them.
    crate::process::reload::spawned_pools(&mut config, Some(&current));
    if *current.config == config {
        return true;
    }
    if current.acked.load(std::sync::atomic::Ordering::Relaxed) < process.workers {
        return false;
    }
    // Same listeners: nothing is bound.
    let sockets = match bind_listeners(&config.listeners, process.workers, |_| true) {
        Ok((sockets, _)) => sockets,
        Err(e) => {
            warn!("DNS change not applied: {e}");
            return false;
        }
    };
    let summary = describe(&current.config, &config, &[], &[]);
    match publish(process, current, config, sockets).await {
        Ok(number) => {
            info!("DNS answers changed: generation {number}\n{summary}");
            true
        }
        Err(e) => {
            warn!("DNS change: {e}");
            true
        }
    }
}
