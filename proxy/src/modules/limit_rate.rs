//! `limit_rate` and `limit_rate_after`, as nginx's directives of those names (HAProxy's
//! `bwlim-out`): a response's body is sent at most `limit_rate` bytes a second, per request (per
//! stream over HTTP/2), once its first `limit_rate_after` bytes went out at full speed.
//!
//! On a listener or a route. A route's keys replace the listener's one by one, as nginx's
//! `location` inherits each directive from its `server`; `limit_rate = 0` turns it off (nginx's
//! `limit_rate 0`). `limit_rate_after` without a `limit_rate` here or on the listener would do
//! nothing, and is refused.
//!
//! The clock starts when the body's first byte is ready to go, and the body may have sent at
//! any time `after + rate × elapsed` bytes, as nginx reckons it. It goes out in slices of at
//! most an eighth of a second's worth (`Bytes::split_to`, no copy), so each wait is short and
//! a piece the backend sent whole never waits past the response timeout. The length is kept,
//! and so is the Content-Length.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, Sleep};
use toml::Spanned;

use super::{BodyFilter, Module, Place, Response};
use crate::syntax::error::ConfigError;
use crate::syntax::values::Size;

/// The module.
pub(crate) enum LimitRate {}

/// Its keys as the file writes them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub limit_rate: Option<Spanned<Size>>,
    pub limit_rate_after: Option<Spanned<Size>>,
}

/// A rate that is on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// Bytes a second, more than 0.
    rate: u64,
    /// Bytes sent before the rate applies.
    after: u64,
}

impl Module for LimitRate {
    const KEYS: &'static [&'static str] = &["limit_rate", "limit_rate_after"];
    type Raw = Raw;
    type Config = Config;
    type Local = ();
    type Filter = Pacer;
    const BODY: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<Config>>,
    ) -> Result<Option<Arc<Config>>, ConfigError> {
        let (src, key) = (at.src, at.key);
        if raw.limit_rate.is_none() && raw.limit_rate_after.is_none() {
            return Ok(inherited.cloned());
        }
        let rate = match &raw.limit_rate {
            Some(r) => r.get_ref().0,
            None => match inherited {
                Some(c) => c.rate,
                None => {
                    let after = raw.limit_rate_after.as_ref().map_or(0..0, Spanned::span);
                    return Err(src.at(
                        after,
                        &format!("{key}.limit_rate_after"),
                        "limit_rate_after does nothing without a limit_rate (here or on the listener), expected limit_rate beside it",
                    ));
                }
            },
        };
        if rate == 0 {
            return Ok(None);
        }
        let after = match &raw.limit_rate_after {
            Some(a) => a.get_ref().0,
            None => inherited.map_or(0, |c| c.after),
        };
        Ok(Some(Arc::new(Config { rate, after })))
    }

    fn filter(config: &Arc<Config>, _: &mut Response<'_>) -> Option<Pacer> {
        Some(Pacer::new(config))
    }

    fn describe(config: &Config) -> String {
        let rate = bytesize::ByteSize::b(config.rate).display().iec();
        match config.after {
            0 => format!("limit_rate {rate}/s"),
            n => format!(
                "limit_rate {rate}/s after {}",
                bytesize::ByteSize::b(n).display().iec()
            ),
        }
    }
}

/// One response's pacing.
pub(crate) struct Pacer {
    rate: u64,
    after: u64,
    /// Bytes let out so far.
    sent: u64,
    /// When the first byte was ready to go.
    start: Option<Instant>,
    /// The piece still to go, or what is left of it.
    held: Option<Bytes>,
    /// The wait for the next slice, kept across polls.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Pacer {
    /// A response's pacing at `config`'s rate, its clock not started.
    fn new(config: &Config) -> Pacer {
        Pacer {
            rate: config.rate,
            after: config.after,
            sent: 0,
            start: None,
            held: None,
            sleep: None,
        }
    }

    /// The most bytes that go out at once: an eighth of a second's worth.
    fn slice(&self) -> u64 {
        (self.rate / 8).max(1)
    }

    /// How many bytes may have gone out by `elapsed` after the start.
    fn allowed(&self, elapsed: Duration) -> u64 {
        let paced = u128::from(self.rate) * elapsed.as_nanos() / 1_000_000_000;
        self.after
            .saturating_add(u64::try_from(paced).unwrap_or(u64::MAX))
    }

    /// When `n` more bytes may go out.
    fn when(&self, start: Instant, n: u64) -> Instant {
        let paced = (self.sent + n).saturating_sub(self.after);
        let nanos = u128::from(paced) * 1_000_000_000 / u128::from(self.rate);
        start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

impl BodyFilter for Pacer {
    fn push(&mut self, piece: Option<Bytes>) -> std::io::Result<()> {
        // The body's end needs no pacing: `poll_out` says `None` once nothing is held.
        if let Some(piece) = piece.filter(|p| !p.is_empty()) {
            self.held = Some(piece);
        }
        Ok(())
    }

    fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let Some(held) = &self.held else {
            return Poll::Ready(None);
        };
        let len = held.len() as u64;
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let budget = self.allowed(now - start).saturating_sub(self.sent);
        // At least a slice (or what is left), so the waits are few; at most what is allowed.
        let need = len.min(self.slice());
        if budget < need {
            let at = self.when(start, need);
            let sleep = match &mut self.sleep {
                Some(sleep) => {
                    sleep.as_mut().reset(at);
                    sleep
                }
                none => none.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        let budget = budget.max(need);
        let out = match self.held.take() {
            Some(mut piece) if budget < len => {
                let out = piece.split_to(budget as usize);
                self.held = Some(piece);
                out
            }
            piece => piece.unwrap_or_default(),
        };
        self.sent += out.len() as u64;
        Poll::Ready(Some(out))
    }

    fn is_empty(&self) -> bool {
        self.held.is_none()
    }

    fn keeps_length(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    fn pacer(rate: u64, after: u64) -> Pacer {
        Pacer::new(&Config { rate, after })
    }

    /// Sends `total` bytes through `p` in pieces of `piece`, returning when the last went out.
    async fn send(p: &mut Pacer, total: usize, piece: usize) -> Duration {
        let begun = Instant::now();
        let mut left = total;
        let mut out = 0;
        while left > 0 {
            let n = piece.min(left);
            left -= n;
            p.push(Some(Bytes::from(vec![0u8; n]))).unwrap();
            while !p.is_empty() {
                let sent = poll_fn(|cx| p.poll_out(cx)).await.expect("a piece");
                out += sent.len();
            }
        }
        p.push(None).unwrap();
        assert_eq!(poll_fn(|cx| p.poll_out(cx)).await, None);
        assert_eq!(out, total);
        begun.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_goes_out_at_the_rate_after_its_first_bytes() {
        // 1 MB at 100 KiB/s: the first slice goes at once, the rest over 9.6 s.
        let took = send(&mut pacer(102_400, 0), 1_000_000, 16_384).await;
        assert!(took >= Duration::from_millis(9_500), "{took:?}");
        assert!(took <= Duration::from_millis(9_800), "{took:?}");
        // The same after 500 KB at full speed: half the time.
        let took = send(&mut pacer(102_400, 500_000), 1_000_000, 16_384).await;
        assert!(took >= Duration::from_millis(4_600), "{took:?}");
        assert!(took <= Duration::from_millis(4_900), "{took:?}");
        // A body within `after` is not paced at all.
        let took = send(&mut pacer(1_000, 10_000), 10_000, 4_096).await;
        assert_eq!(took, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_piece_is_sent_in_slices_of_an_eighth_of_a_second() {
        let mut p = pacer(8_000, 0);
        p.push(Some(Bytes::from(vec![0u8; 4_000]))).unwrap();
        let mut slices = Vec::new();
        while !p.is_empty() {
            slices.push(poll_fn(|cx| p.poll_out(cx)).await.unwrap().len());
        }
        assert!(slices.iter().all(|&n| n <= 1_000), "{slices:?}");
        assert_eq!(slices.iter().sum::<usize>(), 4_000);
    }

    fn validate(text: &str, inherited: Option<&Arc<Config>>) -> Result<Option<Arc<Config>>, ConfigError> {
        let raw: Raw = toml::from_str(text).unwrap();
        let src = crate::syntax::error::Source { file: "pinlb.toml", text };
        let at = Place { src: &src, key: "listener[0]", upstreams: &[], caches: &[], tls: None };
        LimitRate::validate(&at, &raw, inherited)
    }

    #[test]
    fn a_routes_keys_replace_the_listeners_one_by_one_and_0_turns_it_off() {
        let listener = validate("limit_rate = \"100KiB\"\nlimit_rate_after = \"1MiB\"", None)
            .unwrap()
            .unwrap();
        assert_eq!(*listener, Config { rate: 102_400, after: 1 << 20 });
        let route = validate("limit_rate = \"10KiB\"", Some(&listener)).unwrap().unwrap();
        assert_eq!(*route, Config { rate: 10_240, after: 1 << 20 });
        let route = validate("limit_rate_after = 0", Some(&listener)).unwrap().unwrap();
        assert_eq!(*route, Config { rate: 102_400, after: 0 });
        assert_eq!(validate("limit_rate = 0", Some(&listener)).unwrap(), None);
        assert_eq!(validate("", Some(&listener)).unwrap(), Some(listener));
        assert_eq!(validate("", None).unwrap(), None);
    }

    #[test]
    fn limit_rate_after_alone_is_refused_at_its_place() {
        let e = validate("limit_rate_after = \"1MiB\"", None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pinlb.toml:1:20: listener[0].limit_rate_after: limit_rate_after does nothing without a limit_rate (here or on the listener), expected limit_rate beside it"
        );
    }

    #[test]
    fn check_says_the_rate_and_what_goes_before_it() {
        let c = Config { rate: 102_400, after: 1 << 20 };
        assert_eq!(LimitRate::describe(&c), "limit_rate 100.0 KiB/s after 1.0 MiB");
    }
}
