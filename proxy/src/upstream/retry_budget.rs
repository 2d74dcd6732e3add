//! One worker's budget of retries on a status (`retry.on = ["http_503", ...]`), Finagle's
//! `RetryBudget`: every request to the upstream adds `budget` (0.2 by default) to a balance, a
//! retry takes 1 from it, and `budget_min` a second come on top. A retry that is answered
//! without a status to retry gives its 1 back: retries that help cost nothing, while a pool
//! that fails as a whole (every backend answers 503) gets at most `budget` more requests than
//! its clients send, plus `budget_min` a second, not a retry storm. The balance holds at most
//! [`BURST`]: what quiet times save is a short burst, not a storm later.
//!
//! Per worker (a `Cell` in its single-threaded runtime, no lock): the bound holds for each
//! worker's share of the traffic, so for the whole.

use std::cell::Cell;
use std::time::Instant;

use crate::config::Retry;

/// The most retries a worker's balance holds.
pub(crate) const BURST: u64 = 100;

/// One retry, in the balance's unit (a thousandth of a retry).
const ONE: u64 = 1000;

/// A worker's retries on a status, for one upstream.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    /// Thousandths of a retry.
    balance: Cell<u64>,
    /// When `budget_min` was last added.
    refilled: Cell<Instant>,
}

impl RetryBudget {
    /// A new worker's budget: one second of `budget_min` to start with.
    pub(crate) fn new(retry: &Retry) -> RetryBudget {
        RetryBudget {
            balance: Cell::new(u64::from(retry.budget_min).min(BURST) * ONE),
            refilled: Cell::new(Instant::now()),
        }
    }

    /// A request to the upstream: its share of a retry.
    #[inline]
    pub(crate) fn deposit(&self, retry: &Retry) {
        self.add(u64::from(retry.budget_per_mille));
    }

    /// Takes one retry if the balance has it, after adding `budget_min` for the time since it
    /// was last added.
    pub(crate) fn take(&self, retry: &Retry) -> bool {
        let now = Instant::now();
        let since = now.saturating_duration_since(self.refilled.get());
        // budget_min retries a second are budget_min thousandths a millisecond.
        let min = u64::try_from(since.as_micros()).unwrap_or(u64::MAX) / 1000
            * u64::from(retry.budget_min);
        if min > 0 {
            self.refilled.set(now);
            self.add(min);
        }
        let balance = self.balance.get();
        let took = balance >= ONE;
        if took {
            self.balance.set(balance - ONE);
        }
        took
    }

    /// A retry that helped: it was answered without a status to retry.
    pub(crate) fn give_back(&self) {
        self.add(ONE);
    }

    fn add(&self, n: u64) {
        self.balance
            .set(self.balance.get().saturating_add(n).min(BURST * ONE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(per_mille: u32, min: u32) -> Retry {
        Retry {
            budget_per_mille: per_mille,
            budget_min: min,
            ..Retry::default()
        }
    }

    #[test]
    fn a_pool_that_fails_as_a_whole_gets_its_share_and_no_more() {
        // No minimum: 1,000 requests at 20% buy 200 retries, each failing (none given back).
        let r = retry(200, 0);
        let b = RetryBudget::new(&r);
        let mut retried = 0;
        for _ in 0..1000 {
            b.deposit(&r);
            while b.take(&r) {
                retried += 1;
            }
        }
        assert_eq!(retried, 200);
    }

    #[test]
    fn retries_that_help_cost_nothing() {
        // A third of the requests retried once, each retry answered: all of them go.
        let r = retry(200, 0);
        let b = RetryBudget::new(&r);
        b.deposit(&r);
        b.deposit(&r);
        b.deposit(&r);
        b.deposit(&r);
        b.deposit(&r);
        for i in 0..3000 {
            b.deposit(&r);
            if i % 3 == 0 {
                assert!(b.take(&r), "request {i}");
                b.give_back();
            }
        }
    }

    #[test]
    fn the_minimum_starts_with_one_second_and_adds_by_the_clock() {
        let r = retry(0, 10);
        let start = Instant::now();
        let b = RetryBudget::new(&r);
        let took = (0..50).filter(|_| b.take(&r)).count() as f64;
        // One second's minimum, and 10 a second for however long the loop took.
        let most = 10.0 + start.elapsed().as_secs_f64() * 10.0;
        assert!((10.0..=most).contains(&took), "{took} of at most {most}");
    }

    #[test]
    fn the_balance_stops_at_the_burst() {
        let r = retry(1000, 0);
        let b = RetryBudget::new(&r);
        for _ in 0..1000 {
            b.deposit(&r);
        }
        let took = (0..1000).filter(|_| b.take(&r)).count();
        assert_eq!(took as u64, BURST);
    }
}
