//! The request rate and connection limits per client, shaped after nginx so that `pinlb
//! import` converts them one to one:
//!
//! ```toml
//! [limit.one]                 # limit_req_zone $binary_remote_addr zone=one:10m rate=10r/s;
//! key = "client_ip"           # or "header:NAME", "cookie:NAME"
//! rate = "10r/s"              # or "r/m"
//! keys = 100000               # the most keys it tracks (16 bytes each)
//!
//! [[listener]]                # (or [[listener.route]]: its own list replaces the listener's)
//! rate_limit = [{ zone = "one", burst = 20, nodelay = true, status = 429 }]
//! conn_limit = { max = 10, keys = 100000 }   # limit_conn addr 10;
//! ```
//!
//! The validated types and their validation; the raw ones are at the end of `raw.rs`.

use std::collections::BTreeMap;

use toml::Spanned;

use super::raw::{RawConnLimit, RawListener, RawRateLimit, RawRateZone};
use super::{HashKey, Listener};
use crate::syntax::error::{ConfigError, ConfigErrors, Source};

/// `[limit.NAME]`'s `keys` when left out: what nginx's `10m` zone holds, about.
pub const DEFAULT_KEYS: usize = 100_000;
/// `rate_limit`'s `status` when left out (nginx's `limit_req_status` is 503 by default; 429 is
/// what HTTP says a client over a rate gets).
pub const DEFAULT_STATUS: u16 = 429;

/// The most connections per client address a `conn_limit` may allow: what the table's
/// counts hold (`edge::conn_limit`).
pub const MAX_CONNS_PER_CLIENT: u32 = (1 << 24) - 1;

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
    /// Index into [`super::Config::rate_zones`].
    pub zone: usize,
    /// Requests over the rate allowed at once (nginx's `burst`).
    pub burst: u32,
    /// The answer to a request over the limit.
    pub status: u16,
}

/// `conn_limit`: open connections per client address on one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimit {
    pub max: u32,
    pub keys: usize,
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

fn keys(src: &Source, key: &str, v: &Option<Spanned<i64>>) -> Result<usize> {
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
pub(super) fn zones(
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
fn rate_limits(
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

fn conn_limit(src: &Source, key: &str, raw: &RawConnLimit) -> Result<ConnLimit> {
    let top = MAX_CONNS_PER_CLIENT;
    let max = match u32::try_from(*raw.max.get_ref()) {
        Ok(n) if (1..=top).contains(&n) => n,
        _ => {
            return Err(src.at(
                raw.max.span(),
                &format!("{key}.conn_limit.max"),
                format!(
                    "{} is out of range, expected a number of connections from 1 to {top}",
                    raw.max.get_ref()
                ),
            ));
        }
    };
    Ok(ConnLimit {
        max,
        keys: keys(src, &format!("{key}.conn_limit.keys"), &raw.keys)?,
    })
}

/// The listeners' and their routes' `rate_limit` and `conn_limit`, set on the validated
/// `listeners` (in file order, as their routes are).
pub(super) fn attach(
    src: &Source,
    raw: &[RawListener],
    listeners: &mut [Listener],
    zones: &[RateZone],
) -> std::result::Result<(), ConfigErrors> {
    let mut errors = Vec::new();
    for (i, (r, l)) in raw.iter().zip(listeners.iter_mut()).enumerate() {
        let key = format!("listener[{i}]");
        if let Some(list) = &r.rate_limit {
            match rate_limits(src, &key, list, zones) {
                // A TCP listener counts connections, which have the client's address only.
                Ok(v) if l.mode == super::ListenerMode::Tcp => {
                    let by_other = v.iter().zip(list.get_ref()).find(|(limit, _)| {
                        zones[limit.zone].key != crate::config::HashKey::ClientIp
                    });
                    match by_other {
                        Some((limit, raw)) => errors.push(src.at(
                            raw.get_ref().zone.span(),
                            &format!("{key}.rate_limit"),
                            format!(
                                "zone {} is keyed by {}, expected a zone keyed by client_ip: a TCP listener counts connections, which have no header or cookie",
                                zones[limit.zone].name, zones[limit.zone].key
                            ),
                        )),
                        None => l.rate_limits = v,
                    }
                }
                Ok(v) => l.rate_limits = v,
                Err(e) => errors.push(e),
            }
        }
        if let Some(c) = &r.conn_limit {
            match conn_limit(src, &key, c.get_ref()) {
                Ok(c) => l.conn_limit = Some(c),
                Err(e) => errors.push(e),
            }
        }
        for (j, (rr, route)) in r.route.iter().zip(l.routes.iter_mut()).enumerate() {
            if let Some(list) = &rr.get_ref().rate_limit {
                match rate_limits(src, &format!("{key}.route[{j}]"), list, zones) {
                    Ok(v) => route.rate_limits = Some(v),
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    match ConfigErrors::new(errors) {
        Some(e) => Err(e),
        None => Ok(()),
    }
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
