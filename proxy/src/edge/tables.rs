//! The process's limit tables: one [`RateTable`] per rate zone and one [`ConnTable`] per
//! listener with a `conn_limit`, shared by every worker, with the counters of requests each
//! zone refused.
//!
//! The process holds one [`Tables`] for its whole life (in `process::shared::Process`). Each
//! worker asks it for its tables when it switches to a configuration generation, under a lock
//! taken then and never per request; a zone that a reload keeps (same name, key, rate and
//! keys) gets the same table, its keys' states and all, and a listener that keeps its address
//! and `conn_limit.keys` keeps its connections' counts. A changed zone starts anew. A reload
//! forgets the tables its file no longer names ([`Tables::keep`]); connections still open hold
//! their own table until they close.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::{Config, ConnLimit, RateZone};
use crate::modules::conn_limit::table::ConnTable;
use crate::modules::rate_limit::table::RateTable;

/// Requests one zone refused on one route: `pinlb_rate_limited_total{listener, route, zone}`.
pub(crate) struct Limited {
    /// The listener's configured address.
    pub listener: SocketAddr,
    /// The route's index and path (`0:/api/`), or `default` for the requests no route
    /// matches: routes have no names, and an index alone would not say which route it is.
    pub route: String,
    pub zone: String,
    pub count: Arc<AtomicU64>,
}

/// Every limit table and counter of the process.
pub(crate) struct Tables {
    /// The keys' hashes' seed, one per process, so a client cannot choose keys that share slots.
    seed: u64,
    rate: Mutex<Vec<(RateZone, Arc<RateTable>)>>,
    conn: Mutex<Vec<(SocketAddr, usize, Arc<ConnTable>)>>,
    limited: Mutex<Vec<Limited>>,
}

impl Default for Tables {
    fn default() -> Self {
        Tables {
            seed: fastrand::u64(..),
            rate: Mutex::default(),
            conn: Mutex::default(),
            limited: Mutex::default(),
        }
    }
}

impl Tables {
    /// `zone`'s table: the one already made for the same zone, or a new one.
    pub(crate) fn rate(&self, zone: &RateZone) -> Arc<RateTable> {
        let mut all = self.rate.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, t)) = all.iter().find(|(z, _)| z == zone) {
            return t.clone();
        }
        let t = Arc::new(RateTable::new(zone.keys, zone.interval_ns, self.seed));
        all.push((zone.clone(), t.clone()));
        t
    }

    /// The connection counts of the listener configured at `listener`.
    pub(crate) fn conn(&self, listener: SocketAddr, limit: &ConnLimit) -> Arc<ConnTable> {
        let mut all = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, _, t)) = all
            .iter()
            .find(|(a, k, _)| *a == listener && *k == limit.keys)
        {
            return t.clone();
        }
        let t = Arc::new(ConnTable::new(limit.keys, self.seed));
        all.push((listener, limit.keys, t.clone()));
        t
    }

    /// The counter of `zone`'s refusals on `route` of `listener`, kept across reloads.
    pub(crate) fn limited(&self, listener: SocketAddr, route: &str, zone: &str) -> Arc<AtomicU64> {
        let mut all = self.limited.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = all
            .iter()
            .find(|l| l.listener == listener && l.route == route && l.zone == zone)
        {
            return l.count.clone();
        }
        let count = Arc::new(AtomicU64::new(0));
        all.push(Limited {
            listener,
            route: route.to_string(),
            zone: zone.to_string(),
            count: count.clone(),
        });
        count
    }

    /// Forgets the tables `config` does not name, once a reload has replaced them. Counters
    /// stay: a Prometheus counter does not go back.
    pub(crate) fn keep(&self, config: &Config) {
        (self.rate.lock().unwrap_or_else(PoisonError::into_inner))
            .retain(|(z, _)| config.rate_zones.contains(z));
        (self.conn.lock().unwrap_or_else(PoisonError::into_inner)).retain(|(a, k, _)| {
            (config.listeners.iter())
                .any(|l| l.address == *a && l.conn_limit.is_some_and(|c| c.keys == *k))
        });
    }

    /// What `/metrics` shows: each counter's labels and value.
    pub(crate) fn limited_counts(&self) -> Vec<(SocketAddr, String, String, u64)> {
        let all = self.limited.lock().unwrap_or_else(PoisonError::into_inner);
        all.iter()
            .map(|l| {
                let n = l.count.load(std::sync::atomic::Ordering::Relaxed);
                (l.listener, l.route.clone(), l.zone.clone(), n)
            })
            .collect()
    }
}
