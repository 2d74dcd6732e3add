//! Waiting on events, bounded: every wait in the tests ends, one way or the other, within a
//! limit of its own or [`WAIT`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bound for any single wait on an event in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// Waits until `counter` stops moving (unchanged over 4 polls 50 ms apart; at most 200 polls)
/// and returns its value: how far a producer got before back-pressure stopped it.
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
