//! Waiting, bounded: every wait in the tests ends, one way or the other, within a limit of its
//! own or [`WAIT`].
//!
//! Wait on an event where there is one (a backend's counters, a log line, a channel). Where there
//! is none, poll with [`poll`] or [`poll_blocking`]: a state pinlb reaches on its own clock (a
//! backend taken down, a skip that ends), or one outside this process. pinlb's runtimes run on
//! their own threads on real time, so tokio's paused clock in a test does not reach them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bound for any single wait on an event in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// Calls `check` until it gives `Some`, and returns that; `None` when it never did. Bounded in
/// count and in time: at most `tries` calls, `every` apart, and no call once
/// `tries * every + WAIT` (the slack is for the checks themselves, which may send requests) has
/// passed since the first.
pub async fn poll<T>(
    tries: u32,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + every * tries + WAIT;
    for i in 0..tries {
        if i > 0 {
            tokio::time::sleep(every).await;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        if let Some(v) = check().await {
            return Some(v);
        }
    }
    None
}

/// [`poll`] for tests without a runtime: blocks the thread between calls.
pub fn poll_blocking<T>(
    tries: u32,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + every * tries + WAIT;
    for i in 0..tries {
        if i > 0 {
            std::thread::sleep(every);
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
        if let Some(v) = check() {
            return Some(v);
        }
    }
    None
}

/// Waits until `counter` stops moving (unchanged over 4 polls 50 ms apart; at most 200 polls)
/// and returns its value: how far a producer got before back-pressure stopped it.
///
/// Sleeps rather than awaits: what it waits for is the absence of progress, which no event
/// announces.
pub async fn settle(counter: &AtomicU64) -> u64 {
    let mut last = counter.load(Ordering::SeqCst);
    let mut still = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = counter.load(Ordering::SeqCst);
        if now == last {
            still += 1;
            if still == 4 {
                return now;
            }
        } else {
            still = 0;
            last = now;
        }
    }
    panic!("the producer never stopped: {last} bytes and counting");
}
