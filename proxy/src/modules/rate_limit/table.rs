//! A rate zone's table (nginx's `limit_req_zone`): the request rate of every key, shared by
//! every worker exactly, in a fixed amount of memory.
//!
//! Each key's state is one generic cell rate algorithm (GCRA) value, its theoretical arrival
//! time (TAT): the moment the key's bucket is full again. A request at `now` passes when
//! `max(tat, now) - now <= burst × interval` and moves the TAT one interval on; it is refused
//! otherwise, and may try again when that sum fits. That is nginx's leaky bucket with
//! `nodelay`: `burst + 1` requests pass at once, then one per interval.
//!
//! The table is open-addressed, sized once by the zone's `keys`: a slot is one 128-bit atomic
//! holding the key's 64-bit hash (seeded per process, so a client cannot aim its keys at one
//! slot) and its TAT in nanoseconds since the table was made, changed by compare-and-swap, so
//! the key and its state always move together and no worker takes a lock (`cmpxchg16b` on
//! x86_64, found at run time by `portable-atomic`; a CPU without it, none made in 15 years,
//! would get that crate's lock-based fallback). 16 bytes per key. A
//! key is looked for in [`WINDOW`] slots from its hash's place; a slot whose TAT has passed
//! holds a full bucket, the same as no state, and is taken over by the next new key that needs
//! room. When all of a new key's slots hold keys that are still limited, the table is full for
//! it: the request is refused as over the limit ([`Verdict::Full`]), as nginx refuses what it
//! cannot store, so that a flood of new keys cannot buy a way past the limit.

use portable_atomic::{AtomicU128, Ordering};

use crate::sys::clock::monotonic_ns;

/// Slots a key may sit in, from its hash's own: one or two cache lines, so that a table
/// mostly full still finds room for a new key and a lookup stays cheap.
pub(crate) const WINDOW: usize = 8;

/// What a zone's table says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Within the rate (or its burst): counted, it goes on.
    Pass,
    /// Over it: the same key's next request passes in `retry_after_ns`.
    Refused { retry_after_ns: u64 },
    /// A new key, and every slot it may use holds a key still limited.
    Full,
}

/// One zone's keys and their states, shared by every worker and kept across reloads that keep
/// the zone (see [`crate::edge::tables`]).
pub(crate) struct RateTable {
    /// `(hash << 64) | tat`; 0 is an empty slot (no key hashes to 0, see [`RateTable::tag`]).
    slots: Box<[AtomicU128]>,
    /// What the TATs count from: `CLOCK_MONOTONIC` in nanoseconds when the table was made.
    epoch: u64,
    /// The process's seed for the keys' hashes.
    seed: u64,
    /// One request's share of the rate, in nanoseconds (100 ms for `10r/s`).
    interval: u64,
}

impl RateTable {
    /// A table of `keys` slots for a rate of one request per `interval_ns`.
    pub(crate) fn new(keys: usize, interval_ns: u64, seed: u64) -> RateTable {
        RateTable {
            slots: (0..keys.max(WINDOW)).map(|_| AtomicU128::new(0)).collect(),
            epoch: monotonic_ns(),
            seed,
            interval: interval_ns.max(1),
        }
    }

    /// Nanoseconds since the table was made: the clock its TATs are on.
    pub(crate) fn now(&self) -> u64 {
        monotonic_ns().saturating_sub(self.epoch)
    }

    /// The nonzero tag that stands for `key` in this table.
    fn tag(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed) | 1
    }

    /// Counts a request of `key` at `now` (from [`RateTable::now`]) against the rate with
    /// `burst` requests over it allowed at once.
    pub(crate) fn check(&self, key: &[u8], burst: u32, now: u64) -> Verdict {
        let tag = self.tag(key);
        let tolerance = self.interval.saturating_mul(u64::from(burst));
        let n = self.slots.len();
        // Lemire's reduction: the hash's place among `n` slots without a division.
        let home = ((u128::from(tag) * n as u128) >> 64) as usize;
        // The common case first: the key in its home slot with room in its bucket. Anything
        // else (another slot, a refusal, a lost race) is decided by the loop below.
        let v = self.slots[home].load(Ordering::Acquire);
        if (v >> 64) as u64 == tag {
            let start = (v as u64).max(now);
            if start - now <= tolerance {
                let new = u128::from(tag) << 64 | u128::from(start + self.interval);
                let swapped =
                    self.slots[home].compare_exchange(v, new, Ordering::AcqRel, Ordering::Acquire);
                if swapped.is_ok() {
                    return Verdict::Pass;
                }
            }
        }
        // Bounded: each pass either decides or loses a race to another worker, which has then
        // decided for its own request; a few such losses in a row and the key is refused as
        // if the table were full, rather than spin.
        for _ in 0..16 {
            let mut free = None;
            let mut found = None;
            for i in 0..WINDOW {
                // `home < n` and `WINDOW <= n` (the table has at least WINDOW slots): one
                // subtraction wraps it, where `%` would divide.
                let at = if home + i >= n {
                    home + i - n
                } else {
                    home + i
                };
                let v = self.slots[at].load(Ordering::Acquire);
                let (t, tat) = ((v >> 64) as u64, v as u64);
                if t == tag {
                    found = Some((at, v, tat));
                    break;
                }
                // An empty slot, or one whose key's bucket is full again: room for a new key.
                if free.is_none() && (t == 0 || tat <= now) {
                    free = Some((at, v));
                }
            }
            let (at, old, tat) = match (found, free) {
                (Some(f), _) => f,
                // A new key starts with a full bucket, as if its TAT were now.
                (None, Some((at, old))) => (at, old, now),
                (None, None) => return Verdict::Full,
            };
            let start = tat.max(now);
            if start - now > tolerance {
                return Verdict::Refused {
                    retry_after_ns: start - now - tolerance,
                };
            }
            let new = u128::from(tag) << 64 | u128::from(start + self.interval);
            if self.slots[at]
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Verdict::Pass;
            }
        }
        Verdict::Full
    }
}

/// `Retry-After`'s whole seconds for a wait of `ns`: rounded up, so a client that waits that
/// long passes, and at least 1.
pub(crate) fn retry_after_secs(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_burst_passes_at_once_then_one_request_per_interval() {
        let t = RateTable::new(64, 100 * MS, 7);
        let now = 5 * MS;
        for _ in 0..=3 {
            assert_eq!(t.check(b"a", 3, now), Verdict::Pass);
        }
        assert_eq!(
            t.check(b"a", 3, now),
            Verdict::Refused {
                retry_after_ns: 100 * MS
            }
        );
        assert_eq!(t.check(b"a", 3, now + 100 * MS), Verdict::Pass);
        assert!(matches!(
            t.check(b"a", 3, now + 100 * MS),
            Verdict::Refused { .. }
        ));
    }

    #[test]
    fn without_burst_one_request_passes_per_interval() {
        let t = RateTable::new(64, 100 * MS, 7);
        assert_eq!(t.check(b"a", 0, 0), Verdict::Pass);
        assert_eq!(
            t.check(b"a", 0, 40 * MS),
            Verdict::Refused {
                retry_after_ns: 60 * MS
            }
        );
        assert_eq!(t.check(b"a", 0, 100 * MS), Verdict::Pass);
    }

    #[test]
    fn keys_are_limited_apart() {
        let t = RateTable::new(64, 100 * MS, 7);
        assert_eq!(t.check(b"a", 0, 0), Verdict::Pass);
        assert_eq!(t.check(b"b", 0, 0), Verdict::Pass);
        assert!(matches!(t.check(b"a", 0, 0), Verdict::Refused { .. }));
    }

    #[test]
    fn a_full_table_refuses_new_keys_until_a_bucket_refills() {
        // WINDOW slots in all: every key may use every slot.
        let t = RateTable::new(WINDOW, 1000 * MS, 7);
        for k in 0..WINDOW as u32 {
            assert_eq!(t.check(&k.to_be_bytes(), 0, 0), Verdict::Pass);
        }
        assert_eq!(t.check(b"new", 0, 0), Verdict::Full);
        // Known keys are still told apart.
        assert!(matches!(
            t.check(&0u32.to_be_bytes(), 0, 0),
            Verdict::Refused { .. }
        ));
        // Once the buckets have refilled, their slots hold nothing worth keeping.
        assert_eq!(t.check(b"new", 0, 1000 * MS), Verdict::Pass);
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn the_slots_are_lock_free_on_this_machine() {
        assert!(AtomicU128::is_lock_free());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000_000_000), 1);
        assert_eq!(retry_after_secs(1_000_000_001), 2);
        assert_eq!(retry_after_secs(0), 1);
    }

    #[test]
    fn threads_share_the_rate_exactly() {
        let t = std::sync::Arc::new(RateTable::new(1024, 1000 * MS, 7));
        let passed = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if t.check(b"k", 9, 0) == Verdict::Pass {
                            passed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(passed.into_inner(), 10);
    }
}
