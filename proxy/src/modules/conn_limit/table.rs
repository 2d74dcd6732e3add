//! Open connections per client address on a listener (nginx's `limit_conn`, HAProxy's
//! `src_conn_cur`), counted by every worker exactly in a table of a fixed size.
//!
//! A slot is one `AtomicU64`: the address's hash (seeded per process) in the high 40 bits, its
//! open connections in the low 24, changed by compare-and-swap, so the key and its count move
//! together. An address is looked for in [`WINDOW`] slots from its hash's place; a slot whose
//! count is 0 holds nothing worth keeping and is taken by the next new address that needs room.
//! When every slot a new address may use counts open connections of other addresses, the
//! table is full for it and its connection is refused, as nginx refuses what its zone cannot
//! store. 8 bytes per address.
//!
//! A connection admitted holds a [`ClientSlot`], which gives its count back when dropped: the
//! connection's end, however it ends (closed, timed out, parked, upgraded to a tunnel and
//! closed, drained at a stop).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots an address may sit in, from its hash's own: one cache line.
pub(crate) const WINDOW: usize = 8;

const COUNT_BITS: u32 = 24;
const COUNT: u64 = (1 << COUNT_BITS) - 1;

// A slot's count holds the most a `conn_limit` may allow.
const _: () = assert!(super::MAX_CONNS_PER_CLIENT as u64 <= COUNT);

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The address has `max` connections open already.
    Over,
    /// A new address, and every slot it may use counts other addresses' open connections.
    Full,
}

/// One listener's open connections by client address, shared by every worker and kept across
/// reloads that keep the listener (`edge::tables`).
pub(crate) struct ConnTable {
    slots: Box<[AtomicU64]>,
    seed: u64,
}

impl ConnTable {
    pub(crate) fn new(keys: usize, seed: u64) -> ConnTable {
        ConnTable {
            slots: (0..keys.max(WINDOW)).map(|_| AtomicU64::new(0)).collect(),
            seed,
        }
    }

    /// The nonzero tag that stands for `client`, in the high bits.
    fn tag(&self, client: IpAddr) -> u64 {
        // An IPv4 client counts as itself however it came (`::ffff:a.b.c.d` on an IPv6
        // socket, or a PROXY header naming either form), as the access rules match it.
        let h = match client.to_canonical() {
            IpAddr::V4(ip) => xxhash_rust::xxh3::xxh3_64_with_seed(&ip.octets(), self.seed),
            IpAddr::V6(ip) => xxhash_rust::xxh3::xxh3_64_with_seed(&ip.octets(), self.seed),
        };
        (h | 1 << 63) & !COUNT
    }

    /// One more connection from `client`, unless it has `max` open already.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        client: IpAddr,
        max: u32,
    ) -> Result<ClientSlot, Refused> {
        let tag = self.tag(client);
        let n = self.slots.len();
        let home = ((u128::from(tag >> COUNT_BITS) * n as u128) >> (64 - COUNT_BITS)) as usize % n;
        // Bounded: a pass either decides or lost a race to another worker's decision.
        for _ in 0..16 {
            let mut free = None;
            let mut found = None;
            for i in 0..WINDOW {
                let at = (home + i) % n;
                let v = self.slots[at].load(Ordering::Acquire);
                if v & !COUNT == tag {
                    found = Some((at, v));
                    break;
                }
                if free.is_none() && v & COUNT == 0 {
                    free = Some((at, v));
                }
            }
            let (at, old, count) = match (found, free) {
                (Some((at, v)), _) => (at, v, v & COUNT),
                (None, Some((at, v))) => (at, v, 0),
                (None, None) => return Err(Refused::Full),
            };
            if count >= u64::from(max) {
                return Err(Refused::Over);
            }
            if self.slots[at]
                .compare_exchange(old, tag | (count + 1), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(ClientSlot {
                    table: self.clone(),
                    at,
                });
            }
        }
        Err(Refused::Full)
    }

    /// Open connections counted for `client` now.
    #[cfg(test)]
    fn open(&self, client: IpAddr) -> u64 {
        let tag = self.tag(client);
        (self.slots.iter())
            .map(|s| s.load(Ordering::Acquire))
            .find(|v| v & !COUNT == tag)
            .map_or(0, |v| v & COUNT)
    }
}

/// A listener's `conn_limit` in one generation: its table (the process's) and its `max`.
pub(crate) struct ConnGate {
    pub table: Arc<ConnTable>,
    pub max: u32,
}

impl ConnGate {
    /// A place for one more connection from `client`.
    pub(crate) fn admit(&self, client: IpAddr) -> Result<ClientSlot, Refused> {
        self.table.acquire(client, self.max)
    }
}

/// One admitted connection's place in its address's count, given back when dropped.
pub(crate) struct ClientSlot {
    table: Arc<ConnTable>,
    at: usize,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        // The slot keeps this address's tag while its count is above 0, so the count is ours
        // to decrement; a count of 0 leaves the tag behind as room for another address.
        let _ = self.table.slots[self.at].fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            (v & COUNT > 0).then(|| v - 1)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn an_address_gets_max_connections_and_one_more_after_a_close() {
        let t = Arc::new(ConnTable::new(64, 3));
        let a: Vec<_> = (0..3).map(|_| t.acquire(ip(1), 3).unwrap()).collect();
        assert_eq!(t.acquire(ip(1), 3).err(), Some(Refused::Over));
        assert!(
            t.acquire(ip(2), 3).is_ok(),
            "another address has its own count"
        );
        drop(a);
        assert_eq!(t.open(ip(1)), 0);
        assert!(t.acquire(ip(1), 3).is_ok());
    }

    #[test]
    fn a_full_table_refuses_new_addresses_until_one_closes() {
        let t = Arc::new(ConnTable::new(WINDOW, 3));
        let mut held: Vec<_> = (0..WINDOW as u8)
            .map(|i| t.acquire(ip(i), 1).unwrap())
            .collect();
        assert_eq!(t.acquire(ip(200), 1).err(), Some(Refused::Full));
        held.pop();
        assert!(t.acquire(ip(200), 1).is_ok());
    }

    #[test]
    fn threads_count_one_address_exactly() {
        let t = Arc::new(ConnTable::new(1024, 3));
        let admitted = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        if let Ok(slot) = t.acquire(ip(9), 10) {
                            admitted.lock().unwrap().push(slot);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.lock().unwrap().len(), 10);
        assert_eq!(t.open(ip(9)), 10);
    }
}
