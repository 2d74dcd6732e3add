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
//! The I/O around them is thin: [`probe`] sends one `GET` and reads the status, and [`run`] probes
//! every backend of every upstream that has a `health` table, on the control thread (pinned to
//! `runtime.cpus`), spreading the probes over the interval. Results reach the request path through
//! the atomics in [`crate::upstream::BackendState`]; only state changes are logged.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::config::Health;
use crate::http1::client::{Conn, UpstreamBody, describe_io};
use crate::upstream::SharedUpstream;

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
/// [`crate::upstream::WEIGHT_SCALE`]), so even weight 1 ramps in fine steps.
pub fn ramped_weight(weight: u64, elapsed: Duration, slow_start: Duration) -> u64 {
    if elapsed >= slow_start || slow_start.is_zero() {
        return weight;
    }
    let w = u128::from(weight) * elapsed.as_micros() / slow_start.as_micros().max(1);
    u64::try_from(w).unwrap_or(weight).clamp(1, weight)
}

/// Sends one health probe: `GET path` with `Connection: close`, and checks the status against
/// `expect`. The whole exchange, connect included, must fit in `timeout`. Returns why it failed.
pub async fn probe(addr: SocketAddr, health: &Health) -> Result<(), String> {
    match tokio::time::timeout(health.timeout, exchange(addr, health)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no response within {:?}", health.timeout)),
    }
}

async fn exchange(addr: SocketAddr, health: &Health) -> Result<(), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| describe_io(&e))?;
    let _ = stream.set_nodelay(true);
    let host = health.host.clone().unwrap_or_else(|| addr.to_string());
    let request = format!(
        "GET {} HTTP/1.1\r\nhost: {host}\r\nuser-agent: pinlb-health\r\nconnection: close\r\n\r\n",
        health.path
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("sending the probe failed: {e}"))?;
    let mut conn = Conn::new(stream);
    let head = conn
        .read_head(&Method::GET)
        .await
        .map_err(|e| e.to_string())?;
    let status = head.status.as_u16();
    // Read the body to its end so the backend sees an orderly close rather than a reset.
    let mut body = UpstreamBody::new(conn, &head);
    while let Some(piece) = poll_fn(|cx| body.poll_data(cx)).await {
        piece.map_err(|e| format!("reading the body failed: {e}"))?;
    }
    if health.expect.contains(status) {
        Ok(())
    } else {
        Err(format!("status {status}, expected {}", health.expect))
    }
}

/// Probes every backend of every upstream that has a `health` table, until dropped; never
/// returns. A reload drops it and starts it again with the new generation's upstreams.
///
/// Each backend has its own loop. Their first probes are spread evenly over the interval, and
/// every wait gets up to ±10% jitter, so probes of many backends (or many pinlb processes) do not
/// fire together. Runs on the caller's runtime: the control thread's, pinned to `runtime.cpus`.
pub async fn run(upstreams: Vec<Arc<SharedUpstream>>) {
    let mut loops = tokio::task::JoinSet::new();
    for up in upstreams {
        let Some(health) = up.config.health.clone() else {
            continue;
        };
        let n = up.backends.len() as u32;
        for i in 0..up.backends.len() {
            let offset = health.interval / n.max(1) * i as u32;
            loops.spawn(check_loop(up.clone(), i, health.clone(), offset));
        }
    }
    // The loops run until the set is dropped with this future.
    while loops.join_next().await.is_some() {}
    std::future::pending::<()>().await;
}

async fn check_loop(up: Arc<SharedUpstream>, backend: usize, health: Health, offset: Duration) {
    let state = &up.backends[backend];
    // After a reload the loop starts again, from the backend's state and the streak the last
    // loop left: frequent reloads must not keep a failing backend from ever reaching `fall`.
    let mut checks = Checks {
        up: state.is_up(),
        streak: state.check_streak(),
    };
    let mut next = tokio::time::Instant::now() + offset;
    loop {
        tokio::time::sleep_until(next).await;
        // From now when behind (the thread stalled, or a probe ran long), so missed probes are
        // skipped rather than fired back to back.
        next = next.max(tokio::time::Instant::now()) + jittered(health.interval);
        let started = std::time::Instant::now();
        let result = probe(state.address, &health).await;
        if up.counting {
            state.stats.check_time.observe(started.elapsed());
        }
        let changed = checks.record(result.is_ok(), health.rise, health.fall);
        state.set_check_streak(checks.streak);
        let Some(up_now) = changed else {
            continue;
        };
        state.set_up(up_now);
        match result {
            Ok(()) => info!(
                upstream = %up.config.name,
                "backend {} UP after {} passing checks",
                state.address, health.rise
            ),
            Err(cause) => warn!(
                upstream = %up.config.name,
                "backend {} DOWN after {} failed checks: {cause}",
                state.address, health.fall
            ),
        }
    }
}

/// `interval` changed by a random amount of up to ±10%.
fn jittered(interval: Duration) -> Duration {
    let tenth = interval / 10;
    interval - tenth + tenth.mul_f64(2.0 * fastrand::f64())
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

    #[test]
    fn jitter_stays_within_ten_percent() {
        let i = Duration::from_secs(2);
        for _ in 0..1000 {
            let j = jittered(i);
            assert!(j >= Duration::from_millis(1800) && j <= Duration::from_millis(2200));
        }
    }
}
