//! `mirror`: nginx's `mirror`, Envoy's `request_mirror_policies`: a copy of a share of the
//! requests a listener or route proxies goes to another upstream (a canary, a new build), whose
//! answers are read and dropped.
//!
//! ```toml
//! mirror = { upstream = "canary", share = 0.1, header = "X-Mirrored-By: pinlb", max_in_flight = 64, body = true }
//! ```
//!
//! - `share` (default 1.0, every request, as nginx's `mirror`): exactly that share of the
//!   requests, spread evenly (the n-th is copied when n × share passes a whole number), across
//!   every worker.
//! - The client's request never waits for its copy: the copy is sent by a task of its own on
//!   the worker, through the mirror upstream's own balancing, pools and timeouts.
//! - `max_in_flight` (default 64): copies to the mirror upstream not yet answered, across the
//!   routes that mirror to it; past it a copy is dropped, counted
//!   (`pinlb_upstream_side_requests_dropped_total`) and logged (summed). A slow or dead mirror
//!   costs the main path that bound, no more.
//! - `header` marks each copy (default `X-Mirrored-By: pinlb`; `""` for none).
//! - The copy has the request's method, target and end-to-end header lines, and with `body`
//!   (default true, nginx's `mirror_request_body on`) its body: kept as the request sends it,
//!   at most `max_body` (64 KiB), and the copy goes once the body has been read (a larger body, or one
//!   never read whole, drops the copy, counted). `body = false` copies at once, without the
//!   body (`Content-Length: 0`).
//! - Its answers are counted as the mirror upstream's backends' (`/metrics`, the status page),
//!   so the canary's share of 5xx sits beside the main pool's.
//! - A route's `mirror` replaces the listener's; `mirror = { share = 0 }` turns it off there.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{Module, NoFilter, Place, SideRequest};
use crate::http1::request::RequestHead;
use crate::syntax::error::ConfigError;
use crate::syntax::values::Size;

/// The module.
pub(crate) enum Mirror {}

/// Its key as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub mirror: Option<Spanned<RawMirror>>,
}

/// `mirror = { … }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMirror {
    pub upstream: Option<Spanned<String>>,
    pub share: Option<Spanned<f64>>,
    pub header: Option<Spanned<String>>,
    pub max_in_flight: Option<usize>,
    pub body: Option<bool>,
    pub max_body: Option<Size>,
}

/// A mirror that is on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// The mirror upstream, by index, and its name.
    upstream: usize,
    name: String,
    /// Thousandths of the requests copied, 1 to 1000.
    share_per_mille: u64,
    /// Added to each copy, `name: value\r\n` (empty for none).
    lines: Arc<[u8]>,
    max_in_flight: usize,
    /// `body`: a copy takes the request's body too (nginx's `mirror_request_body on`).
    body: bool,
    /// `max_body`: the largest body a copy takes.
    max_body: usize,
    /// Requests seen, across workers, for the share.
    seen: Seen,
}

/// The requests a mirror has seen; not part of what makes two configurations equal.
#[derive(Debug, Default)]
struct Seen(AtomicU64);

impl Config {
    /// The mirror upstream, by index: an HTTP upstream, which a TCP listener's may not be.
    pub(crate) fn upstream(&self) -> usize {
        self.upstream
    }
}

impl PartialEq for Seen {
    fn eq(&self, _: &Seen) -> bool {
        true
    }
}

impl Eq for Seen {}

/// `max_in_flight`'s default.
const MAX_IN_FLIGHT: usize = 64;

/// `max_body`'s default: what 64 copies in flight may hold is 4 MiB.
const MAX_BODY: usize = 64 * 1024;

impl Module for Mirror {
    const KEYS: &'static [&'static str] = &["mirror"];
    type Raw = Raw;
    type Config = Config;
    type Local = ();
    type Filter = NoFilter;
    const SIDE: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<Config>>,
    ) -> Result<Option<Arc<Config>>, ConfigError> {
        let Some(table) = &raw.mirror else {
            return Ok(inherited.cloned());
        };
        let m = table.get_ref();
        let key = format!("{}.mirror", at.key);
        let share = match &m.share {
            None => 1.0,
            Some(s) if (0.0..=1.0).contains(s.get_ref()) => *s.get_ref(),
            Some(s) => {
                return Err(at.src.at(
                    s.span(),
                    &format!("{key}.share"),
                    "expected a share of the requests from 0.0 to 1.0, such as 0.1",
                ));
            }
        };
        let share_per_mille = (share * 1000.0).round() as u64;
        if share_per_mille == 0 {
            return Ok(None);
        }
        let (upstream, name) = match (&m.upstream, inherited) {
            (Some(u), _) => match at.upstreams.iter().position(|n| n == u.get_ref()) {
                Some(i) => (i, u.get_ref().clone()),
                None => {
                    return Err(at.src.at(
                        u.span(),
                        &format!("{key}.upstream"),
                        format!(
                            "unknown upstream \"{}\", expected one of: {}",
                            u.get_ref(),
                            at.upstreams.join(", ")
                        ),
                    ));
                }
            },
            (None, Some(c)) => (c.upstream, c.name.clone()),
            (None, None) => {
                return Err(at.src.at(
                    table.span(),
                    &format!("{key}.upstream"),
                    "missing, expected the upstream the copies go to",
                ));
            }
        };
        let lines = match &m.header {
            None => "X-Mirrored-By: pinlb\r\n".to_string(),
            Some(h) if h.get_ref().is_empty() => String::new(),
            Some(h) => header_line(h.get_ref()).ok_or_else(|| {
                at.src.at(
                    h.span(),
                    &format!("{key}.header"),
                    "expected \"Name: value\", a header name and a value without line breaks",
                )
            })?,
        };
        Ok(Some(Arc::new(Config {
            upstream,
            name,
            share_per_mille,
            lines: lines.into_bytes().into(),
            max_in_flight: m.max_in_flight.unwrap_or(MAX_IN_FLIGHT),
            body: m.body.or(inherited.map(|c| c.body)).unwrap_or(true),
            max_body: (m.max_body.as_ref().map(|s| usize::try_from(s.0).unwrap_or(usize::MAX)))
                .or(inherited.map(|c| c.max_body))
                .unwrap_or(MAX_BODY),
            seen: Seen::default(),
        })))
    }

    fn side_request(config: &Arc<Config>, _: &RequestHead) -> Option<SideRequest> {
        let n = config.seen.0.fetch_add(1, Ordering::Relaxed);
        let per = config.share_per_mille;
        // The n-th request is copied when n × share passes a whole number: exactly the share.
        if (n + 1) * per / 1000 == n * per / 1000 {
            return None;
        }
        Some(SideRequest {
            upstream: config.upstream,
            lines: config.lines.clone(),
            max_in_flight: config.max_in_flight,
            body: config.body,
            max_body: config.max_body,
        })
    }

    fn describe(config: &Config) -> String {
        format!(
            "mirror {:.1}% to upstream {} (at most {} in flight{})",
            config.share_per_mille as f64 / 10.0,
            config.name,
            config.max_in_flight,
            if config.body { "" } else { ", without the body" }
        )
    }
}

/// `Name: value` as a header line, or `None` when it is not one (by the `http` crate's rules).
fn header_line(text: &str) -> Option<String> {
    let (name, value) = text.split_once(':')?;
    let (name, value) = (name.trim(), value.trim());
    http::HeaderName::from_bytes(name.as_bytes()).ok()?;
    http::HeaderValue::from_str(value).ok()?;
    Some(format!("{name}: {value}\r\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(text: &str, inherited: Option<&Arc<Config>>) -> Result<Option<Arc<Config>>, ConfigError> {
        let raw: Raw = toml::from_str(text).unwrap();
        let src = crate::syntax::error::Source { file: "pinlb.toml", text };
        let at = Place { src: &src, key: "listener[0]", upstreams: &["app", "canary"], caches: &[], tls: None };
        Mirror::validate(&at, &raw, inherited)
    }

    #[test]
    fn a_share_copies_exactly_that_many_requests_spread_evenly() {
        let m = validate("mirror = { upstream = \"canary\", share = 0.1 }", None).unwrap().unwrap();
        let mut text = bytes::BytesMut::from("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
        let limits = crate::http1::request::RequestLimits::default();
        let head = crate::http1::request::parse_request(&mut text, &limits).unwrap().unwrap();
        let chosen: Vec<usize> = (0..100).filter(|_| Mirror::side_request(&m, &head).is_some()).collect();
        assert_eq!(chosen.len(), 10);
        let picked: Vec<bool> = (0..20).map(|_| Mirror::side_request(&m, &head).is_some()).collect();
        assert_eq!(picked.iter().filter(|p| **p).count(), 2);
        let copy = Mirror::side_request(&validate("mirror = { upstream = \"canary\" }", None).unwrap().unwrap(), &head).unwrap();
        assert_eq!((copy.upstream, &*copy.lines), (1, &b"X-Mirrored-By: pinlb\r\n"[..]));
    }

    #[test]
    fn a_route_inherits_replaces_or_turns_off_the_listeners_mirror() {
        let listener = validate("mirror = { upstream = \"canary\", share = 0.5, header = \"X-Canary: 1\" }", None)
            .unwrap()
            .unwrap();
        assert_eq!(&*listener.lines, b"X-Canary: 1\r\n");
        assert_eq!(validate("", Some(&listener)).unwrap(), Some(listener.clone()));
        let own = validate("mirror = { share = 1.0 }", Some(&listener)).unwrap().unwrap();
        assert_eq!((own.upstream, own.share_per_mille), (1, 1000));
        assert_eq!(validate("mirror = { share = 0 }", Some(&listener)).unwrap(), None);
    }

    #[test]
    fn its_mistakes_are_refused_at_their_place() {
        let e = |t| validate(t, None).unwrap_err().to_string();
        assert_eq!(
            e("mirror = { upstream = \"nope\" }"),
            "pinlb.toml:1:23: listener[0].mirror.upstream: unknown upstream \"nope\", expected one of: app, canary"
        );
        assert_eq!(
            e("mirror = { upstream = \"canary\", share = 10 }"),
            "pinlb.toml:1:41: listener[0].mirror.share: expected a share of the requests from 0.0 to 1.0, such as 0.1"
        );
        assert_eq!(
            e("mirror = { share = 0.5 }"),
            "pinlb.toml:1:10: listener[0].mirror.upstream: missing, expected the upstream the copies go to"
        );
        assert_eq!(
            e("mirror = { upstream = \"canary\", header = \"no colon\" }"),
            "pinlb.toml:1:42: listener[0].mirror.header: expected \"Name: value\", a header name and a value without line breaks"
        );
    }

    #[test]
    fn check_says_where_copies_go() {
        let m = validate("mirror = { upstream = \"canary\", share = 0.1 }", None).unwrap().unwrap();
        assert_eq!(Mirror::describe(&m), "mirror 10.0% to upstream canary (at most 64 in flight)");
    }
}
