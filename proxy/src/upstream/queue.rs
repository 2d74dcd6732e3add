//! The upstream's queue (HAProxy's `maxqueue` and `timeout queue`): requests that found every
//! backend at `max_conns` wait here, in arrival order, and go out as slots free, whichever
//! worker frees them.
//!
//! It is the one place on the request path that takes a lock, and only for upstreams that set
//! `queue`: a request that waits enters under it, and a request that ends on a backend of such
//! an upstream wakes the first waiter under it. A wake is a oneshot message, which the waiter's
//! own worker (another thread, another runtime) receives; the woken request then picks by the
//! upstream's algorithm among the backends that have room. Without a queue nothing here runs:
//! [`crate::upstream::backend::BackendState`] holds no queue, and the in-flight guard's drop
//! finds none.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::upstream::counters::Histogram;

/// One upstream's queue, shared by every worker and kept across reloads that keep the upstream.
#[derive(Debug, Default)]
pub struct Queue {
    /// One sender per waiting request, oldest first. A waiter that left (timed out, or its
    /// client went away) leaves its closed sender behind; a wake skips it.
    waiters: Mutex<VecDeque<oneshot::Sender<()>>>,
    /// Requests waiting now: what `queue` bounds and `/metrics` shows.
    waiting: AtomicUsize,
    /// `queue`; 0 after a reload that turned the queue off (those still waiting are served).
    max: AtomicUsize,
    /// What `/metrics` and `/status` report.
    pub stats: QueueStats,
}

/// A queue's counters.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Time spent queued, by each request that waited and then went to a backend.
    pub wait_time: Histogram,
    /// Requests that waited `timeouts.queue` and got a 503.
    pub timeouts: AtomicU64,
    /// Requests that found the queue full and got a 503 at once.
    pub overflows: AtomicU64,
    /// Requests that waited and went to a backend.
    pub dequeued: AtomicU64,
}

/// Why a request got no place, or no backend, from the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `queue` requests were waiting already.
    Full { max: usize },
    /// It waited `timeouts.queue`.
    TimedOut { after: Duration },
}

impl Queue {
    pub fn new(max: usize) -> Self {
        let q = Queue::default();
        q.set_max(max);
        q
    }

    /// Applies `queue` from a (re)loaded config.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Whether requests are waiting: a new one then queues behind them rather than take the
    /// slot one of them is being woken for.
    #[inline]
    pub(super) fn is_busy(&self) -> bool {
        self.waiting() > 0
    }

    /// A slot freed on one of the upstream's backends: wakes the oldest waiter still there.
    /// Costs one load when nobody waits.
    #[inline]
    pub(super) fn slot_freed(&self) {
        if self.waiting() == 0 {
            return;
        }
        self.wake_one();
    }

    #[cold]
    fn wake_one(&self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(w) = waiters.pop_front() {
            if w.send(()).is_ok() {
                return;
            }
        }
    }

    /// A place in the queue, at its end, or at its front for a request that was woken and
    /// found the slot taken meanwhile (it keeps its turn). `Err` when `queue` requests wait
    /// already.
    pub(super) fn enter(self: &Arc<Self>, front: bool) -> Result<Ticket, Refused> {
        let max = self.max.load(Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            let waiting = self.waiting.load(Ordering::Relaxed);
            if !front && waiting >= max {
                drop(waiters);
                self.stats.overflows.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Full { max });
            }
            // Waiters that left are dropped here too, so the list stays near `waiting` long.
            if waiters.len() > 2 * waiting + 16 {
                waiters.retain(|w| !w.is_closed());
            }
            if front {
                waiters.push_front(tx);
            } else {
                waiters.push_back(tx);
            }
            self.waiting.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Ticket {
            queue: self.clone(),
            woken: rx,
        })
    }
}

/// One request's place in the queue. Dropping it leaves the queue; a wake it received but did
/// not use (it timed out at that moment, or its client left) goes on to the next waiter, so a
/// freed slot is never lost.
pub(super) struct Ticket {
    queue: Arc<Queue>,
    woken: oneshot::Receiver<()>,
}

impl Ticket {
    /// Waits for a slot to free, at most until `deadline`; true when one did.
    pub(super) async fn woken(&mut self, deadline: tokio::time::Instant) -> bool {
        matches!(
            tokio::time::timeout_at(deadline, &mut self.woken).await,
            Ok(Ok(()))
        )
    }

    /// Leaves the queue having used the wake (or needing none).
    pub(super) fn used(mut self) {
        self.woken.close();
        // A wake that raced with the close was not used: it goes on in drop.
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::Relaxed);
        if self.woken.try_recv().is_ok() {
            self.queue.slot_freed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline(ms: u64) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn waiters_are_woken_in_arrival_order_and_the_front_keeps_its_turn() {
        let q = Arc::new(Queue::new(10));
        let mut a = q.enter(false).unwrap();
        let mut b = q.enter(false).unwrap();
        let mut c = q.enter(true).unwrap();
        assert_eq!(q.waiting(), 3);
        q.slot_freed();
        assert!(c.woken(deadline(100)).await);
        q.slot_freed();
        assert!(a.woken(deadline(100)).await);
        assert!(!b.woken(deadline(20)).await);
        for t in [a, b, c] {
            t.used();
        }
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn a_full_queue_refuses_and_counts_the_overflow() {
        let q = Arc::new(Queue::new(1));
        let _a = q.enter(false).unwrap();
        assert_eq!(q.enter(false).err(), Some(Refused::Full { max: 1 }));
        assert_eq!(q.stats.overflows.load(Ordering::Relaxed), 1);
        // A woken request that lost its slot goes back to the front even when full.
        assert!(q.enter(true).is_ok());
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_passes_its_wake_on_and_leaves_no_count() {
        let q = Arc::new(Queue::new(10));
        let a = q.enter(false).unwrap();
        let mut b = q.enter(false).unwrap();
        let c = q.enter(false).unwrap();
        // c leaves before any wake: its sender stays behind, closed, and is skipped.
        drop(c);
        q.slot_freed();
        // a was woken but leaves without using it: b gets the slot.
        drop(a);
        assert!(b.woken(deadline(100)).await);
        b.used();
        assert_eq!(q.waiting(), 0);
        // Nobody waits: a freed slot wakes nobody and is not remembered.
        q.slot_freed();
        let mut d = q.enter(false).unwrap();
        assert!(!d.woken(deadline(20)).await);
    }
}
