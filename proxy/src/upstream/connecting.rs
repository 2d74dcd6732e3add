//! Connects in progress to one backend, across workers, and their bound (`max_connecting`).
//!
//! A backend whose accept queue is full drops the SYNs it gets, and each dropped connect waits
//! a second for its retransmission. Opening thousands of connects into a 511-slot backlog at
//! once gets none of them in sooner; past the bound, a connect waits for one in progress to
//! finish instead, within its own connect timeout. The count also tells a busy backend from a
//! dead one: requests in flight that are not connecting have a connection the backend took.
//!
//! Only opening a connection passes here: a request on a pooled connection does not. The
//! bound is a semaphore whose permits a reload can raise or lower; taking a free permit is one
//! compare-and-swap, and only a connect that has to wait takes the semaphore's lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

/// The connects in progress to one backend.
#[derive(Debug)]
pub struct Connecting {
    in_progress: AtomicUsize,
    slots: Semaphore,
    /// The permits there should be in all, taken and free: `max_connecting`, or
    /// `Semaphore::MAX_PERMITS` when unbounded.
    total: AtomicUsize,
    /// Permits to forget as they come back, after a reload lowered the bound while more were
    /// taken than the new bound allows.
    owed: AtomicUsize,
    /// When a connect last succeeded (ms on the process clock; 0 = never): a backend that
    /// takes connections is alive, whatever the SYNs its full queue dropped meanwhile.
    connected_ms: AtomicU64,
}

impl Default for Connecting {
    fn default() -> Self {
        Connecting {
            in_progress: AtomicUsize::new(0),
            slots: Semaphore::new(Semaphore::MAX_PERMITS),
            total: AtomicUsize::new(Semaphore::MAX_PERMITS),
            owed: AtomicUsize::new(0),
            connected_ms: AtomicU64::new(0),
        }
    }
}

/// One connect in progress; dropping it ends it.
pub struct Slot<'a> {
    of: &'a Connecting,
    permit: Option<SemaphorePermit<'a>>,
}

impl Connecting {
    /// Applies `max_connecting` (0 = unbounded) from a (re)loaded config. Called by one thread
    /// at a time (the one that builds a generation).
    pub fn set_max(&self, max: usize) {
        let want = match max {
            0 => Semaphore::MAX_PERMITS,
            n => n.min(Semaphore::MAX_PERMITS),
        };
        let had = self.total.swap(want, Ordering::Relaxed);
        if want > had {
            // Permits still owed are cancelled first; the rest are new.
            let mut more = want - had;
            let owed = self.owed.load(Ordering::Relaxed);
            let cancelled = owed.min(more);
            self.owed.fetch_sub(cancelled, Ordering::Relaxed);
            more -= cancelled;
            self.slots.add_permits(more);
        } else if want < had {
            let fewer = had - want;
            let forgotten = self.slots.forget_permits(fewer);
            self.owed.fetch_add(fewer - forgotten, Ordering::Relaxed);
        }
    }

    /// Records a connect that succeeded at `now_ms`.
    pub fn connected(&self, now_ms: u64) {
        self.connected_ms.fetch_max(now_ms, Ordering::Relaxed);
    }

    /// Whether a connect succeeded at or after `ms`.
    pub fn connected_since(&self, ms: u64) -> bool {
        let last = self.connected_ms.load(Ordering::Relaxed);
        last != 0 && last >= ms
    }

    /// Connects in progress now.
    pub fn in_progress(&self) -> usize {
        self.in_progress.load(Ordering::Relaxed)
    }

    /// A slot for one connect, waiting at most `timeout` for one to free; `None` when none
    /// did. Also returns how long it waited (zero when a slot was free).
    pub async fn enter(&self, timeout: Duration) -> Option<(Slot<'_>, Duration)> {
        let mut waited = Duration::ZERO;
        let permit = match self.slots.try_acquire() {
            Ok(p) => p,
            Err(_) => {
                let started = std::time::Instant::now();
                match tokio::time::timeout(timeout, self.slots.acquire()).await {
                    Ok(Ok(p)) => {
                        waited = started.elapsed();
                        p
                    }
                    // Timed out (the semaphore is never closed).
                    _ => return None,
                }
            }
        };
        self.in_progress.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            of: self,
            permit: Some(permit),
        };
        Some((slot, waited))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.of.in_progress.fetch_sub(1, Ordering::Relaxed);
        let Some(permit) = self.permit.take() else {
            return;
        };
        let owed = &self.of.owed;
        if owed.load(Ordering::Relaxed) > 0
            && owed
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::from_millis(20);

    #[tokio::test]
    async fn past_the_bound_a_connect_waits_for_one_to_end() {
        let c = Connecting::default();
        c.set_max(2);
        let a = c.enter(NOW).await.unwrap();
        let _b = c.enter(NOW).await.unwrap();
        assert_eq!(c.in_progress(), 2);
        assert!(c.enter(NOW).await.is_none());
        drop(a);
        assert!(c.enter(NOW).await.is_some());
    }

    #[tokio::test]
    async fn a_lowered_bound_applies_as_connects_end_and_a_raised_one_at_once() {
        let c = Connecting::default();
        c.set_max(3);
        let a = c.enter(NOW).await.unwrap();
        let b = c.enter(NOW).await.unwrap();
        c.set_max(1);
        assert!(c.enter(NOW).await.is_none());
        drop(a);
        // One of the two taken is owed: still at the bound.
        assert!(c.enter(NOW).await.is_none());
        drop(b);
        let only = c.enter(NOW).await.unwrap();
        assert!(c.enter(NOW).await.is_none());
        c.set_max(0);
        let _many: Vec<_> = enter_many(&c, 100).await;
        drop(only);
    }

    async fn enter_many(c: &Connecting, n: usize) -> Vec<Slot<'_>> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(c.enter(NOW).await.expect("unbounded").0);
        }
        v
    }
}
