//! Backend health: whether a backend may be picked, and how that changes.
//!
//! Three small pure parts decide, each over plain data and unit-tested without I/O:
//!
//! - [`Checks`]: HAProxy's active-check counter (`fall` failed probes in a row take a backend
//!   down, `rise` passing ones bring it back);
//! - [`FailWindow`]: nginx's passive accounting (`max_fails` failed requests within
//!   `fail_timeout` skip the backend for `fail_timeout`, then one trial request goes through);
//! - [`ramped_weight`]: slow start, a weight that grows linearly after a backend comes back.
//!
//! The probes that feed [`Checks`] are in `probe`. Results reach the request path through the
//! atomics in `upstream::BackendState`; only state changes are logged.

use std::time::Duration;

/// Active-check state of one backend: HAProxy's `rise`/`fall` counter.
///
/// A backend starts up, so traffic flows at once. While up, `fall` consecutive failures take it
/// down; while down, `rise` consecutive passes bring it back. A result that agrees with the
/// current state resets the streak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    pub up: bool,
    /// Consecutive results that disagree with `up`.
    pub streak: u32,
}

impl Default for Checks {
    fn default() -> Self {
        Checks {
            up: true,
            streak: 0,
        }
    }
}

impl Checks {
    /// Records one probe result; returns the new state when it changed.
    pub fn record(&mut self, passed: bool, rise: u32, fall: u32) -> Option<bool> {
        if passed == self.up {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if self.up { fall } else { rise };
        if self.streak < needed {
            return None;
        }
        self.up = passed;
        self.streak = 0;
        Some(self.up)
    }
}

/// Passive failure accounting of one backend, nginx's `max_fails`/`fail_timeout`. Times are
/// milliseconds on one monotonic clock; zero means "never".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailWindow {
    /// Failed attempts counted since `since`.
    pub fails: u32,
    /// When the current counting window began.
    pub since: u64,
    /// While non-zero the backend has failed too often: it is skipped until this instant, and
    /// past it one trial request may go (claiming the trial moves `until` forward again).
    pub until: u64,
}

impl FailWindow {
    /// Records a failed attempt at `now`. Returns true when this failure makes the backend
    /// skipped (it was not already).
    pub fn fail(&mut self, now: u64, max_fails: u32, fail_timeout: u64) -> bool {
        if max_fails == 0 {
            return false;
        }
        if self.fails == 0 || now.saturating_sub(self.since) > fail_timeout {
            self.since = now;
            self.fails = 0;
        }
        self.fails = self.fails.saturating_add(1);
        if self.fails < max_fails {
            return false;
        }
        // A failed trial (or a failure racing with one) finds `until` already set.
        let newly = self.until == 0;
        self.until = now.saturating_add(fail_timeout);
        newly
    }

    /// Whether the backend is inside its skip window.
    pub fn skipped(&self, now: u64) -> bool {
        self.until != 0 && now < self.until
    }

    /// Records the success of the trial request. Returns true when it ends a skip: the backend
    /// is back. Without a skip it changes nothing: successes between failures do not erase
    /// them, so `max_fails` failures within `fail_timeout` count even with successes between.
    /// (Only the trial's success is recorded at all; see `SharedUpstream::record_success`.)
    pub fn succeed(&mut self) -> bool {
        if self.until == 0 {
            return false;
        }
        *self = FailWindow::default();
        true
    }
}

/// Slow start: the weight of a backend `elapsed` into a ramp of `slow_start`, growing linearly
/// from 1 to `weight`. Weights are in the balancer's fixed-point units (see
/// [`crate::upstream::backend::WEIGHT_SCALE`]), so even weight 1 ramps in fine steps.
pub fn ramped_weight(weight: u64, elapsed: Duration, slow_start: Duration) -> u64 {
    if elapsed >= slow_start || slow_start.is_zero() {
        return weight;
    }
    let w = u128::from(weight) * elapsed.as_micros() / slow_start.as_micros().max(1);
    u64::try_from(w).unwrap_or(weight).clamp(1, weight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_checks(results: &str, rise: u32, fall: u32) -> String {
        let mut c = Checks::default();
        results
            .chars()
            .map(|r| match c.record(r == '+', rise, fall) {
                Some(true) => 'U',
                Some(false) => 'D',
                None => '.',
            })
            .collect()
    }

    #[test]
    fn fall_consecutive_failures_take_a_backend_down() {
        assert_eq!(run_checks("--+---", 2, 3), ".....D");
    }

    #[test]
    fn rise_consecutive_passes_bring_it_back_and_a_failure_restarts_the_count() {
        assert_eq!(run_checks("---++-+++", 2, 3), "..D.U....");
        assert_eq!(run_checks("---+-++", 2, 3), "..D...U");
    }

    #[test]
    fn rise_and_fall_of_1_follow_every_result() {
        assert_eq!(run_checks("+-+-", 1, 1), ".DUD");
    }

    #[test]
    fn a_backend_starts_up() {
        let c = Checks::default();
        assert!(c.up);
        assert_eq!(run_checks("++++", 2, 3), "....");
    }

    const FT: u64 = 10_000;

    #[test]
    fn one_failure_with_max_fails_1_skips_for_fail_timeout() {
        let mut w = FailWindow::default();
        assert!(w.fail(1_000, 1, FT));
        assert!(w.skipped(1_000));
        assert!(w.skipped(10_999));
        assert!(!w.skipped(11_000));
    }

    #[test]
    fn max_fails_counts_failures_within_fail_timeout_only() {
        let mut w = FailWindow::default();
        assert!(!w.fail(1_000, 3, FT));
        assert!(!w.fail(5_000, 3, FT));
        // The window that began at 1 s ended at 11 s: this failure starts a new count.
        assert!(!w.fail(11_001, 3, FT));
        assert_eq!(w.fails, 1);
        assert!(!w.fail(12_000, 3, FT));
        assert!(!w.succeed(), "a success inside the window erases nothing");
        assert!(w.fail(13_000, 3, FT));
        assert!(w.skipped(13_000));
    }

    #[test]
    fn a_passing_trial_brings_the_backend_back_and_a_failing_one_skips_it_again() {
        let mut w = FailWindow::default();
        w.fail(0, 1, FT);
        assert!(!w.skipped(FT), "past the window a trial may go");
        // The trial fails: skipped for another fail_timeout, and not reported as new.
        assert!(!w.fail(FT, 1, FT));
        assert!(w.skipped(FT + 1));
        assert!(!w.skipped(2 * FT));
        assert!(w.succeed());
        assert_eq!(w, FailWindow::default());
        assert!(!w.skipped(2 * FT));
    }

    #[test]
    fn max_fails_0_turns_passive_checks_off() {
        let mut w = FailWindow::default();
        for t in 0..10 {
            assert!(!w.fail(t, 0, FT));
        }
        assert!(!w.skipped(5));
    }

    #[test]
    fn slow_start_ramps_linearly_from_about_zero() {
        let s = Duration::from_secs(30);
        assert_eq!(ramped_weight(1000, Duration::ZERO, s), 1);
        assert_eq!(ramped_weight(1000, Duration::from_secs(3), s), 100);
        assert_eq!(ramped_weight(1000, Duration::from_secs(15), s), 500);
        assert_eq!(ramped_weight(1000, Duration::from_secs(30), s), 1000);
        assert_eq!(ramped_weight(1000, Duration::from_secs(99), s), 1000);
        assert_eq!(
            ramped_weight(1000, Duration::from_secs(1), Duration::ZERO),
            1000
        );
    }
}
