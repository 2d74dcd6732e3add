//! A route's `rate_limit`: each request is counted in every zone the route (or its listener)
//! names, and answered by pinlb in place of the backend when one of them says it is over.
//!
//! The answer is the entry's `status` (429 by default; nginx's `limit_req_status` is 503)
//! with `Retry-After`: the whole seconds, rounded up, until the key's next request passes. It
//! is counted as `Refusal::RateLimit` on the listener and in
//! `pinlb_rate_limited_total{listener, route, zone}`, and logged once per client per second.
//!
//! Zones are checked in the order listed, and a request is counted in each zone it passes
//! before one refuses it, as nginx's several `limit_req` do. A request without the zone's key
//! (no such header or cookie, or an empty one) is not counted in that zone, as nginx skips an
//! empty key.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::StatusCode;

use super::table::{RateTable, Verdict, retry_after_secs};
use super::{RateLimit, RateZone};
use crate::http1::request::RequestHead;
use crate::modules::{Answer, Refusal};
use crate::syntax::request_key::{HashKey, with_client, with_key};
use crate::sys::summed::summed_warn;

/// One zone a request must pass.
struct ZoneCheck {
    table: Arc<RateTable>,
    key: HashKey,
    burst: u32,
    status: StatusCode,
    zone: String,
    rate: String,
    /// `pinlb_rate_limited_total` for this zone on this route.
    limited: Arc<AtomicU64>,
}

/// The zones of one route's (or the listener's default) requests.
pub(crate) struct RateLimits {
    zones: Vec<ZoneCheck>,
}

impl RateLimits {
    /// The zones of `list` (a route's own `rate_limit`, or its listener's), with each zone's
    /// table and its counter of refusals on this route (`label`: `pinlb_rate_limited_total`'s
    /// route) from the process (`edge::tables`); `None` for an empty list.
    pub(crate) fn new(
        list: &[RateLimit],
        zones: &[RateZone],
        table: impl Fn(&RateZone) -> Arc<RateTable>,
        limited: impl Fn(&RateZone) -> Arc<AtomicU64>,
    ) -> Option<RateLimits> {
        if list.is_empty() {
            return None;
        }
        let zones = (list.iter())
            .filter_map(|l| {
                let zone = zones.get(l.zone)?;
                Some(ZoneCheck {
                    table: table(zone),
                    key: zone.key.clone(),
                    burst: l.burst,
                    status: StatusCode::from_u16(l.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
                    zone: zone.name.clone(),
                    rate: zone.rate.clone(),
                    limited: limited(zone),
                })
            })
            .collect();
        Some(RateLimits { zones })
    }

    /// Counts `head` in each zone; `Some` is the answer of the first zone that refuses it
    /// (its `refused` cause for the listener's counters).
    #[inline(never)]
    pub(crate) fn check(&self, head: &RequestHead, client: IpAddr) -> Option<Answer> {
        // An IPv4 client is one key however it came (`::ffff:a.b.c.d` on an IPv6 socket).
        let client = client.to_canonical();
        for z in &self.zones {
            let check = |key: &[u8]| z.table.check(key, z.burst, z.table.now());
            // A request without the zone's key (no such header or cookie) is not counted.
            let Some(verdict) = with_key(&z.key, head, client, check) else {
                continue;
            };
            let retry = match verdict {
                Verdict::Pass => continue,
                Verdict::Refused { retry_after_ns } => {
                    summed_warn!(client = %client; "rate limit: {client} over zone {} ({}), answered {}", z.zone, z.rate, z.status.as_u16());
                    retry_after_secs(retry_after_ns)
                }
                Verdict::Full => {
                    summed_warn!(client = %client; "rate limit: zone {} has no room for {client}'s key (every slot it may use holds a key still limited; raise its keys), answered {}", z.zone, z.status.as_u16());
                    1
                }
            };
            return Some(refused(z, retry));
        }
        None
    }
}

impl RateLimits {
    /// A TCP listener's new connection from `client`, counted in each zone (all keyed by the
    /// client's address: `config::edge_limits`); `Some` is the status of the first that
    /// refuses it, for the log, the connection then to be closed (HAProxy's `tcp-request
    /// connection reject if { src_conn_rate gt N }`); the caller counts the refusal.
    #[cold]
    pub(crate) fn admit_connection(&self, client: IpAddr) -> Option<u16> {
        let client = client.to_canonical();
        for z in &self.zones {
            match with_client(client, |key| z.table.check(key, z.burst, z.table.now())) {
                Verdict::Pass => continue,
                Verdict::Refused { .. } => {
                    summed_warn!(client = %client; "rate limit: {client} over zone {} ({}), closed a new connection", z.zone, z.rate);
                }
                Verdict::Full => {
                    summed_warn!(client = %client; "rate limit: zone {} has no room for {client}'s key (raise its keys), closed a new connection", z.zone);
                }
            }
            z.limited.fetch_add(1, Ordering::Relaxed);
            return Some(z.status.as_u16());
        }
        None
    }
}

/// The answer to a request over `z`'s rate: its status with Retry-After, as pinlb's own
/// answers go (the route's error page for it, if any, replaces the text).
#[cold]
fn refused(z: &ZoneCheck, retry_after: u64) -> Answer {
    z.limited.fetch_add(1, Ordering::Relaxed);
    let page = format!(
        "{} {}: over the request rate of zone {} ({}); retry in {retry_after} s\n",
        z.status.as_u16(),
        z.status.canonical_reason().unwrap_or(""),
        z.zone,
        z.rate
    );
    Answer {
        status: z.status,
        lines: format!("retry-after: {retry_after}\r\n").into_bytes(),
        body: Bytes::from(page),
        close: false,
        refused: Some(Refusal::RateLimit),
    }
}
