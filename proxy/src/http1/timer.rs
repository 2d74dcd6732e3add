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
//!
//! Polling the tokio timer again for the task it last registered would only register that task
//! again (about 115 instructions: the task budget, the timer's state, its waker). [`Timer`]
//! remembers which task that was, and while the timer is set where it was then and has not
//! fired, a poll for the same task is answered without polling it. A poll that tokio answered
//! Pending only because the task had spent its cooperative budget registered nothing, and is
//! not remembered: a wait that began so would otherwise never time out. That pays when one task
//! polls the timer wait after wait: the client side's response wait (`proxy::attempt`) and its
//! `Deadline`s; a pooled backend connection's own timer, polled by whichever client task has it
//! now, usually polls.

use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The timer of the wait under way, created by the first wait that needs one.
#[derive(Debug, Default)]
pub struct Timer {
    /// Set to `until`, or to an earlier deadline of a wait before.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the wait under way times out.
    until: Option<Instant>,
    /// The task `sleep` holds the waker of, since it was last polled Pending, unless it was
    /// set to another deadline since (see [`TaskId`]).
    registered: Option<TaskId>,
}

/// Which task a waker wakes, as its data pointer and its vtable: two wakers of one task compare
/// equal (as `Waker::will_wake` compares them). Kept as addresses, not as a clone of the waker,
/// so that remembering one costs no reference count; an address can't be taken by another task
/// while it counts, since the tokio timer holds a clone of that waker until it fires, and a
/// fired timer is polled again whoever asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TaskId(usize, usize);

impl TaskId {
    fn of(waker: &Waker) -> TaskId {
        TaskId(
            waker.data() as usize,
            std::ptr::from_ref(waker.vtable()) as usize,
        )
    }
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
            Some(sleep) => {
                sleep.as_mut().reset(until);
                self.registered = None;
            }
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
        let task = TaskId::of(cx.waker());
        // Not fired, so still in tokio's wheel, holding this task's waker from the last poll.
        if self.registered == Some(task) && !sleep.is_elapsed() {
            return false;
        }
        self.registered = None;
        // Twice at most: a timer that fired early is moved to `until`, which is later than now.
        for _ in 0..2 {
            if sleep.as_mut().poll(cx).is_pending() {
                // A task that has spent tokio's cooperative budget gets Pending without the
                // timer taking its waker (tokio wakes the task to poll again instead), so only a
                // Pending with budget left means the timer holds this task's waker.
                if tokio::task::coop::has_budget_remaining() {
                    self.registered = Some(task);
                }
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
    use std::future::{Future, poll_fn};
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

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn counter() -> (std::sync::Arc<Count>, std::task::Waker) {
        let count = std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (count.clone(), std::task::Waker::from(count))
    }

    fn woken(count: &Count) -> usize {
        count.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[tokio::test(start_paused = true)]
    async fn the_task_that_polled_last_is_woken_and_sees_the_timeout() {
        let (a_count, a) = counter();
        let (b_count, b) = counter();
        let mut timer = Timer::default();
        timer.arm(Duration::from_secs(5));
        // Task A polls twice (the second answered from what the first registered), then task B
        // polls: B is the one the timer must wake.
        assert!(!timer.poll_expired(&mut Context::from_waker(&a)));
        assert!(!timer.poll_expired(&mut Context::from_waker(&a)));
        assert!(!timer.poll_expired(&mut Context::from_waker(&b)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!((woken(&a_count), woken(&b_count)), (0, 1));
        // The same task, asking again after the wake, sees the timeout though it polled last.
        assert!(timer.poll_expired(&mut Context::from_waker(&b)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_polled_an_earlier_deadline_polls_the_timer_again() {
        let (count, waker) = counter();
        let mut cx = Context::from_waker(&waker);
        let mut timer = Timer::default();
        timer.arm(Duration::from_secs(30));
        assert!(!timer.poll_expired(&mut cx));
        // A shorter wait resets the timer to its deadline: the task's registration for the old
        // deadline no longer counts, and the timer wakes it at the new one.
        timer.arm(Duration::from_secs(2));
        assert!(!timer.poll_expired(&mut cx));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(woken(&count), 1);
        assert!(timer.poll_expired(&mut cx));
        // A longer wait after a shorter one: the timer fires at the old deadline, the task is
        // woken, polls, and the timer is moved on to the wait's own deadline.
        timer.arm(Duration::from_secs(1));
        assert!(!timer.poll_expired(&mut cx));
        tokio::time::advance(Duration::from_millis(500)).await;
        timer.arm(Duration::from_secs(10));
        assert!(!timer.poll_expired(&mut cx));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(woken(&count), 2);
        assert!(!timer.poll_expired(&mut cx));
        tokio::time::advance(Duration::from_millis(9_500)).await;
        assert_eq!(woken(&count), 3);
        assert!(timer.poll_expired(&mut cx));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_first_polled_with_the_tasks_budget_spent_still_times_out() {
        // A task that moved many bytes in one poll (an upload relayed to a backend) has spent
        // tokio's cooperative budget, and its timer's first poll then answers Pending without
        // registering the task. The wait must still end at its deadline, not when something
        // else happens to wake the task.
        let mut timer = Timer::default();
        timer.arm(Duration::from_secs(10));
        let start = Instant::now();
        let mut spent = false;
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            poll_fn(|cx| {
                if !std::mem::replace(&mut spent, true) {
                    // Bounded: the budget is 128 units, and each pass spends one or stops.
                    for _ in 0..1_000 {
                        let spend = std::pin::pin!(tokio::task::consume_budget());
                        if spend.poll(cx).is_pending() {
                            break;
                        }
                    }
                }
                if timer.poll_expired(cx) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }),
        )
        .await;
        assert!(waited.is_ok(), "the wait never timed out");
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_never_armed_never_expires() {
        let mut timer = Timer::default();
        let waker = std::task::Waker::noop();
        assert!(!timer.poll_expired(&mut Context::from_waker(waker)));
    }
}
