//! `[cache.NAME]`: a zone of the process's memory where responses are stored, shared by every
//! worker, and the misses in flight for each key.
//!
//! The store is `quick_cache`'s: sharded locks held for a lookup or an insert only, never
//! across an await; eviction by S3-FIFO, which keeps the keys asked for again over those seen
//! once, so a scan of cold URLs does not push the hot set out; bounded by the weight of what it
//! holds ([`Entry::weight`]: the bytes of heads and bodies and a fixed share per entry) against
//! `max_size`. A zone lives as long as the process: a reload that keeps its name keeps what it
//! holds (a changed `max_size` applies at once), as nginx's cache survives a reload.
//!
//! The misses in flight are a map of keys to a [`Notify`], under a lock taken only on a miss:
//! the first request that misses a key leads ([`Lead`]), the others wait to be woken and look
//! again (`lock` in the route's `cache`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use toml::Spanned;

use super::stored::Entry;
use crate::syntax::error::{ConfigErrors, Source};
use crate::syntax::values::Size;

/// `[cache.NAME]` as the file writes it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawZone {
    pub max_size: Option<Spanned<Size>>,
    pub max_object: Option<Spanned<Size>>,
}

/// `max_size` when left out.
pub(crate) const DEFAULT_MAX_SIZE: u64 = 64 << 20;

/// A zone as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    pub name: String,
    /// What its entries may weigh in all.
    pub max_size: u64,
    /// The largest body it stores (a sixteenth of `max_size` by default).
    pub max_object: u64,
}

/// The `[cache.NAME]` tables, in name order (a route's `cache.zone` is an index into them).
pub(crate) fn zones(
    src: &Source,
    raw: &BTreeMap<String, RawZone>,
) -> Result<Vec<ZoneConfig>, ConfigErrors> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (name, z) in raw {
        let key = |k: &str| format!("cache.{name}.{k}");
        let max_size = z.max_size.as_ref().map_or(DEFAULT_MAX_SIZE, |s| s.get_ref().0);
        if let Some(s) = z.max_size.as_ref().filter(|s| s.get_ref().0 < 64 << 10) {
            errors.push(src.at(s.span(), &key("max_size"), "too small to hold anything worth it, expected at least \"64KiB\""));
            continue;
        }
        let max_object = z.max_object.as_ref().map_or(max_size / 16, |s| s.get_ref().0);
        if let Some(s) = z.max_object.as_ref().filter(|s| s.get_ref().0 == 0 || s.get_ref().0 > max_size) {
            errors.push(src.at(s.span(), &key("max_object"), "expected a size more than 0 and at most max_size"));
            continue;
        }
        out.push(ZoneConfig {
            name: name.clone(),
            max_size,
            max_object,
        });
    }
    match ConfigErrors::new(errors) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// What a zone counts, for `/metrics`.
#[derive(Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub expired: AtomicU64,
    /// Requests `bypass` sent past the cache.
    pub bypassed: AtomicU64,
    /// Stale responses served (`STALE` and `UPDATING`).
    pub stale: AtomicU64,
    /// Stale responses a `304` refreshed.
    pub revalidated: AtomicU64,
    /// Requests that waited for another's response to the same key.
    pub collapsed: AtomicU64,
    pub stored: AtomicU64,
    /// Entries the store evicted for room (shared with its [`Evictions`]).
    pub evicted: Arc<AtomicU64>,
}

/// The weight of an entry, for the store.
#[derive(Clone)]
pub(crate) struct Weigh;

impl quick_cache::Weighter<Vec<u8>, Arc<Entry>> for Weigh {
    fn weight(&self, key: &Vec<u8>, entry: &Arc<Entry>) -> u64 {
        entry.weight(key)
    }
}

/// Counts the store's evictions.
#[derive(Clone)]
pub(crate) struct Evictions(Arc<AtomicU64>);

impl quick_cache::Lifecycle<Vec<u8>, Arc<Entry>> for Evictions {
    type RequestState = ();
    fn on_evict(&self, _: &mut (), _: Vec<u8>, _: Arc<Entry>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

type Store = quick_cache::sync::Cache<Vec<u8>, Arc<Entry>, Weigh, quick_cache::DefaultHashBuilder, Evictions>;

/// One zone's store.
pub(crate) struct Zone {
    pub name: String,
    pub max_object: u64,
    store: Store,
    /// The keys whose miss is in flight, each with the requests waiting for it.
    in_flight: Mutex<HashMap<Vec<u8>, Arc<Notify>>>,
    /// For `min_uses`: the misses of each key seen lately, by the key's hash; made when a route
    /// first asks (a bounded table of its own: an evicted count starts again).
    uses: std::sync::OnceLock<quick_cache::sync::Cache<u64, u32>>,
    pub counters: Counters,
}

impl Zone {
    fn new(c: &ZoneConfig) -> Zone {
        // The store's estimate of its entries, for its tables: a small response a key.
        let items = (c.max_size / 4096).clamp(64, 1 << 20) as usize;
        let counters = Counters::default();
        let evictions = Evictions(counters.evicted.clone());
        let hasher = quick_cache::DefaultHashBuilder::default();
        // The store bounds each of its shards to `max_size / shards` and refuses a larger
        // entry: as many shards as keep room for two of the largest, at most 64.
        let room = (c.max_size / c.max_object.saturating_mul(2).max(1)).clamp(1, 64);
        let shards = 1usize << (63 - room.leading_zeros());
        let options = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(items)
            .weight_capacity(c.max_size)
            .shards(shards)
            .build();
        let store = match options {
            Ok(o) => Store::with_options(o, Weigh, hasher, evictions),
            // Unreachable with the values above; the store's own sharding otherwise.
            Err(_) => Store::with(items, c.max_size, Weigh, hasher, evictions),
        };
        Zone {
            name: c.name.clone(),
            max_object: c.max_object,
            store,
            in_flight: Mutex::default(),
            uses: std::sync::OnceLock::new(),
            counters,
        }
    }

    /// What `key` holds.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Arc<Entry>> {
        self.store.get(key)
    }

    pub(crate) fn insert(&self, key: Vec<u8>, entry: Arc<Entry>) {
        if matches!(*entry, Entry::Response(_)) {
            self.counters.stored.fetch_add(1, Ordering::Relaxed);
        }
        self.store.insert(key, entry);
    }

    /// Forgets what `key` holds (its variants go with it: nothing finds them without it).
    pub(crate) fn remove(&self, key: &[u8]) {
        self.store.remove(key);
    }

    /// For a request that missed `key`: the lead, when no other request's miss of the key is in
    /// flight, or what to wait on for that one's.
    pub(crate) fn lead(self: &Arc<Self>, key: &[u8]) -> Result<Lead, Arc<Notify>> {
        let mut all = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = all.get(key) {
            return Err(n.clone());
        }
        all.insert(key.to_vec(), Arc::new(Notify::new()));
        Ok(Lead {
            zone: self.clone(),
            key: key.to_vec(),
        })
    }

    /// Counts a miss of `key`: how many it has had, this one included (at most about 64K keys
    /// are counted at once; two workers counting at once may count one miss for both).
    pub(crate) fn used(&self, key: &[u8]) -> u32 {
        let uses = self
            .uses
            .get_or_init(|| quick_cache::sync::Cache::new(1 << 16));
        let h = xxhash_rust::xxh3::xxh3_64(key);
        let n = uses.get(&h).unwrap_or(0).saturating_add(1);
        uses.insert(h, n);
        n
    }

    /// Whether `notify` is still that of a miss of `key` in flight.
    pub(crate) fn waits_on(&self, key: &[u8], notify: &Arc<Notify>) -> bool {
        let all = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        all.get(key).is_some_and(|n| Arc::ptr_eq(n, notify))
    }

    fn set_max_size(&self, max_size: u64) {
        self.store.set_capacity(max_size);
    }
}

/// A request's lead on a key's miss: dropped once its response is stored (or won't be), which
/// wakes the requests waiting for it.
pub(crate) struct Lead {
    zone: Arc<Zone>,
    key: Vec<u8>,
}

impl Drop for Lead {
    fn drop(&mut self) {
        let mut all = (self.zone.in_flight.lock()).unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = all.remove(&self.key) {
            n.notify_waiters();
        }
    }
}

/// The process's zones, for its whole life: each worker asks for its generation's when it
/// switches to it, never per request.
#[derive(Default)]
pub struct Zones {
    all: Mutex<Vec<Arc<Zone>>>,
}

impl Zones {
    /// The zones of `configs`, in their order: those a reload keeps (by name) with what they
    /// hold, the others new. Zones no longer configured are let go.
    pub(crate) fn of(&self, configs: &[ZoneConfig]) -> Vec<Arc<Zone>> {
        let mut all = self.all.lock().unwrap_or_else(PoisonError::into_inner);
        let out: Vec<Arc<Zone>> = configs
            .iter()
            .map(|c| match all.iter().find(|z| z.name == c.name) {
                Some(z) if z.max_object == c.max_object => {
                    z.set_max_size(c.max_size);
                    z.clone()
                }
                _ => Arc::new(Zone::new(c)),
            })
            .collect();
        *all = out.clone();
        out
    }

    /// Forgets, in zone `name`, the keys `what` names: one key (with its variants), every key
    /// that begins with a prefix, or every key. How many entries went; `None` for no such zone.
    pub fn purge(&self, name: &str, what: Purge<'_>) -> Option<usize> {
        let zone = {
            let all = self.all.lock().unwrap_or_else(PoisonError::into_inner);
            all.iter().find(|z| z.name == name)?.clone()
        };
        let before = zone.store.len();
        zone.store.retain(|k, _| match what {
            // A variant's key is its key, a 0 byte, then the values it varies by.
            Purge::Key(key) => !(k.starts_with(key) && matches!(k.get(key.len()), None | Some(0))),
            Purge::Prefix(prefix) => !k.starts_with(prefix),
            Purge::All => false,
        });
        Some(before.saturating_sub(zone.store.len()))
    }

    /// Every zone's figures, for `/metrics`.
    pub fn figures(&self) -> Vec<Figures> {
        let all = self.all.lock().unwrap_or_else(PoisonError::into_inner);
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        all.iter()
            .map(|z| Figures {
                zone: z.name.clone(),
                hits: n(&z.counters.hits),
                misses: n(&z.counters.misses),
                expired: n(&z.counters.expired),
                stale: n(&z.counters.stale),
                revalidated: n(&z.counters.revalidated),
                bypassed: n(&z.counters.bypassed),
                collapsed: n(&z.counters.collapsed),
                stored: n(&z.counters.stored),
                evicted: n(&z.counters.evicted),
                entries: z.store.len() as u64,
                bytes: z.store.weight(),
            })
            .collect()
    }
}

/// What a purge forgets ([`Zones::purge`]).
#[derive(Debug, Clone, Copy)]
pub enum Purge<'a> {
    Key(&'a [u8]),
    Prefix(&'a [u8]),
    All,
}

/// One zone's figures at a scrape.
#[derive(Debug, Clone)]
pub struct Figures {
    pub zone: String,
    pub hits: u64,
    pub misses: u64,
    pub expired: u64,
    pub stale: u64,
    pub revalidated: u64,
    pub bypassed: u64,
    pub collapsed: u64,
    pub stored: u64,
    pub evicted: u64,
    pub entries: u64,
    /// What its entries weigh ([`Entry::weight`]).
    pub bytes: u64,
}
