//! A listener's or a route's `rate_limit` (nginx's `limit_req_zone` and `limit_req`, HAProxy's
//! `http-request deny if { sc_http_req_rate gt N }`), shaped after nginx so that `pinlb import`
//! converts it one to one:
//!
//! ```toml
//! [limit.one]                 # limit_req_zone $binary_remote_addr zone=one:10m rate=10r/s;
//! key = "client_ip"           # or "header:NAME", "cookie:NAME"
//! rate = "10r/s"              # or "r/m"
//! keys = 100000               # the most keys it tracks (16 bytes each)
//!
//! [[listener]]                # (or [[listener.route]]: its own list replaces the listener's)
//! rate_limit = [{ zone = "one", burst = 20, nodelay = true, status = 429 }]
//! ```
//!
//! This file has its keys (the `[limit.NAME]` zones, the file's own tables, and the
//! `rate_limit` lists of listeners and routes), their validated types and their validation.
//! The process keeps each zone's table across the reloads that keep the zone
//! (`edge::tables`); a route's zones are compiled once per generation (`edge::controls`), and
//! the route's decision asks them for each request (`route::decision`).
//!
//! - [`table`]: a zone's table of keys, shared by every worker (GCRA, no lock).
//! - [`check`]: a route's zones checked for each request (or a TCP listener's connection),
//!   and the answer to one over the rate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, ConfigErrors, Source};
use crate::syntax::request_key::HashKey;

pub(crate) mod check;
pub(crate) mod table;

/// `[limit.NAME]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateZone {
    pub key: Option<Spanned<String>>,
    pub rate: Spanned<String>,
    pub keys: Option<Spanned<i64>>,
}

/// One entry of `rate_limit = [...]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    pub zone: Spanned<String>,
    pub burst: Option<Spanned<i64>>,
    pub nodelay: Option<Spanned<bool>>,
    pub status: Option<Spanned<u16>>,
}

/// A listener's or a route's `rate_limit` as read.
pub(crate) type RawRateLimits = Option<Spanned<Vec<Spanned<RawRateLimit>>>>;

/// `[limit.NAME]`'s `keys` when left out: what nginx's `10m` zone holds, about.
pub const DEFAULT_KEYS: usize = 100_000;
/// `rate_limit`'s `status` when left out (nginx's `limit_req_status` is 503 by default; 429 is
/// what HTTP says a client over a rate gets).
pub const DEFAULT_STATUS: u16 = 429;

/// `[limit.NAME]`: a zone of keys, each limited to `rate`. A zone's state (every key's bucket)
/// survives a reload that keeps its name, key, rate and size; a changed zone starts anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateZone {
    pub name: String,
    /// What a request's key is: `client_ip`, `header:NAME` or `cookie:NAME`. A request without
    /// the header or cookie is not limited by the zone (nginx's empty key).
    pub key: HashKey,
    /// One request's share of the rate: 100 ms for `10r/s`.
    pub interval_ns: u64,
    /// The rate as written, for `/metrics` and the log.
    pub rate: String,
    /// The most keys the zone tracks at once.
    pub keys: usize,
}

/// One `rate_limit` entry: a request must pass each zone named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// Index into [`crate::config::Config::rate_zones`].
    pub zone: usize,
    /// Requests over the rate allowed at once (nginx's `burst`).
    pub burst: u32,
    /// The answer to a request over the limit.
    pub status: u16,
}

type Result<T> = std::result::Result<T, ConfigError>;

/// `"10r/s"` or `"600r/m"` as one request's share in nanoseconds.
fn rate(s: &str) -> std::result::Result<u64, String> {
    let expected = || {
        format!(
            "\"{s}\" is not a rate, expected requests per second or minute such as \"10r/s\" or \"30r/m\""
        )
    };
    let (n, per) = if let Some(n) = s.strip_suffix("r/s") {
        (n, 1_000_000_000u64)
    } else if let Some(n) = s.strip_suffix("r/m") {
        (n, 60_000_000_000)
    } else {
        return Err(expected());
    };
    let n: u64 = n.parse().map_err(|_| expected())?;
    if n == 0 {
        return Err(format!(
            "\"{s}\": a rate of 0 lets nothing through, expected at least 1"
        ));
    }
    if per / n == 0 {
        return Err(format!("\"{s}\" is over 1,000,000,000 requests per second"));
    }
    Ok(per / n)
}

/// The most keys a zone or a `conn_limit` may track: 1 GiB of rate slots. The table is
/// allocated whole when a worker first uses it.
pub const MAX_KEYS: usize = 1 << 26;

pub(crate) fn keys(src: &Source, key: &str, v: &Option<Spanned<i64>>) -> Result<usize> {
    match v {
        None => Ok(DEFAULT_KEYS),
        Some(k) => match usize::try_from(*k.get_ref()) {
            Ok(n) if (1..=MAX_KEYS).contains(&n) => Ok(n),
            _ => Err(src.at(
                k.span(),
                key,
                format!(
                    "{} is out of range, expected a number of keys from 1 to {MAX_KEYS} (16 bytes each)",
                    k.get_ref()
                ),
            )),
        },
    }
}

/// `[limit.NAME]`, in name order.
pub(crate) fn zones(
    src: &Source,
    raw: &BTreeMap<String, RawRateZone>,
) -> std::result::Result<Vec<RateZone>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut zones = Vec::with_capacity(raw.len());
    for (name, z) in raw {
        let at = format!("limit.{name}");
        let one = || -> Result<RateZone> {
            let key = match &z.key {
                None => HashKey::ClientIp,
                Some(k) => match HashKey::parse(k.get_ref()) {
                    Ok(HashKey::Uri) | Err(_) => {
                        return Err(src.at(
                            k.span(),
                            &format!("{at}.key"),
                            format!("unknown value \"{}\", expected \"client_ip\", \"header:NAME\" or \"cookie:NAME\"", k.get_ref()),
                        ));
                    }
                    Ok(key) => key,
                },
            };
            let interval_ns = rate(z.rate.get_ref())
                .map_err(|e| src.at(z.rate.span(), &format!("{at}.rate"), e))?;
            Ok(RateZone {
                name: name.clone(),
                key,
                interval_ns,
                rate: z.rate.get_ref().clone(),
                keys: keys(src, &format!("{at}.keys"), &z.keys)?,
            })
        };
        match one() {
            Ok(z) => zones.push(z),
            Err(e) => errors.push(e),
        }
    }
    match ConfigErrors::new(errors) {
        Some(e) => Err(e),
        None => Ok(zones),
    }
}

/// One `rate_limit` list, its zones looked up in `zones`.
pub(crate) fn limits(
    src: &Source,
    key: &str,
    raw: &Spanned<Vec<Spanned<RawRateLimit>>>,
    zones: &[RateZone],
) -> Result<Vec<RateLimit>> {
    let mut out = Vec::with_capacity(raw.get_ref().len());
    for (i, r) in raw.get_ref().iter().enumerate() {
        let at = format!("{key}.rate_limit[{i}]");
        let r = r.get_ref();
        let Some(zone) = zones.iter().position(|z| z.name == *r.zone.get_ref()) else {
            return Err(src.at(
                r.zone.span(),
                &format!("{at}.zone"),
                format!(
                    "no [limit.{}], expected the name of a [limit.NAME] zone",
                    r.zone.get_ref()
                ),
            ));
        };
        if out.iter().any(|l: &RateLimit| l.zone == zone) {
            return Err(src.at(
                r.zone.span(),
                &format!("{at}.zone"),
                format!(
                    "zone \"{}\" is named twice, expected each zone once per list",
                    r.zone.get_ref()
                ),
            ));
        }
        let burst = match &r.burst {
            None => 0,
            Some(b) => u32::try_from(*b.get_ref()).map_err(|_| {
                src.at(
                    b.span(),
                    &format!("{at}.burst"),
                    format!(
                        "{} is out of range, expected a number of requests from 0 to 4294967295",
                        b.get_ref()
                    ),
                )
            })?,
        };
        // Without `nodelay` nginx holds the requests over the rate back until their turn;
        // pinlb answers at once (within the burst, or refused), which is the same whenever
        // there is no burst to hold back.
        let nodelay = r.nodelay.as_ref().is_some_and(|v| *v.get_ref());
        if burst > 0 && !nodelay {
            let span = r.nodelay.as_ref().map_or(r.zone.span(), |v| v.span());
            return Err(src.at(
                span,
                &format!("{at}.nodelay"),
                "pinlb does not delay requests over the rate, expected nodelay = true (the burst passes at once, as nginx's nodelay) or burst = 0",
            ));
        }
        let status = match &r.status {
            None => DEFAULT_STATUS,
            Some(s) if (400..=599).contains(s.get_ref()) => *s.get_ref(),
            Some(s) => {
                return Err(src.at(
                    s.span(),
                    &format!("{at}.status"),
                    format!(
                        "{} is not an error status, expected 400 to 599 (429 or nginx's 503)",
                        s.get_ref()
                    ),
                ));
            }
        };
        out.push(RateLimit {
            zone,
            burst,
            status,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_per_second_and_per_minute() {
        assert_eq!(rate("10r/s"), Ok(100_000_000));
        assert_eq!(rate("30r/m"), Ok(2_000_000_000));
        assert!(rate("0r/s").is_err());
        assert!(rate("10/s").is_err());
        assert!(rate("1.5r/s").is_err());
        assert!(rate("10r/h").is_err());
    }
}
