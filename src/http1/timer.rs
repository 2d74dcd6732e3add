//! A connection's one timer for its waits, moved only when it would fire too late: a backend
//! connection's response and send timeouts, and the client side's waits for a slow body or a
//! full socket (`downstream::h1`'s `Deadline`).
//!
//! Every request on a pooled connection waits for its response within `timeouts.response`.
//! Setting a tokio timer to a new deadline for each wait cost about 140 instructions per request
//! (`Sleep::reset` and its conversion to the wheel's ticks, `benches/callgrind.sh`). As nginx's
//! timers do, [`Timer`] keeps the deadline of the wait under way apart from the one the tokio
//! timer is set to: a later deadline leaves the timer where it is, and a timer that fires before
//! the deadline is moved to it then and waits on. A connection in steady use moves its timer
//! once per timeout, not once per request.

use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The timer of the wait under way, created by the first wait that needs one.
#[derive(Debug, Default)]
pub struct Timer {
    /// Set to `until`, or to an earlier deadline of a wait before.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the wait under way times out.
    until: Option<Instant>,
}

impl Timer {
    /// Starts a wait that times out `timeout` from now.
    #[inline]
    pub fn arm(&mut self, timeout: Duration) {
        let now = Instant::now();
        // A timeout too large to add is as good as none (as `tokio::time::timeout` treats it).
        let until = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30));
        self.until = Some(until);
        match self.sleep.as_mut() {
            // Fires at `until` or before: seen to in `poll_expired`.
            Some(sleep) if sleep.deadline() <= until => {}
            Some(sleep) => sleep.as_mut().reset(until),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(until))),
        }
    }

    /// Whether the wait under way has timed out; when not, `cx` is woken when it may have. A
    /// timer that is not armed never times out.
    #[inline]
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let (Some(sleep), Some(until)) = (self.sleep.as_mut(), self.until) else {
            return false;
        };
        // Twice at most: a timer that fired early is moved to `until`, which is later than now.
        for _ in 0..2 {
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            if Instant::now() >= until {
                return true;
            }
            sleep.as_mut().reset(until);
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Poll;

    /// Waits until `timer` expires, and says how long that took on the (paused) clock.
    async fn expiry(timer: &mut Timer) -> Duration {
        let start = Instant::now();
        poll_fn(|cx| {
            if timer.poll_expired(cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_times_out_after_its_own_timeout_whatever_the_waits_before_set() {
        let mut timer = Timer::default();
        timer.arm(Duration::from_secs(10));
        // A later wait, begun 4 s on: the timer still set for the first fires at 10 s, is moved,
        // and the wait times out at 14 s.
        tokio::time::advance(Duration::from_secs(4)).await;
        timer.arm(Duration::from_secs(10));
        assert_eq!(expiry(&mut timer).await, Duration::from_secs(10));
        // A shorter timeout than the one the timer is set for moves it back at once.
        let mut timer = Timer::default();
        timer.arm(Duration::from_secs(30));
        timer.arm(Duration::from_secs(2));
        assert_eq!(expiry(&mut timer).await, Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_never_armed_never_expires() {
        let mut timer = Timer::default();
        let waker = std::task::Waker::noop();
        assert!(!timer.poll_expired(&mut Context::from_waker(waker)));
    }
}
