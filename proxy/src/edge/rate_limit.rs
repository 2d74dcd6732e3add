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

use crate::config::{HashKey, Listener, RateLimit, RouteRule};
use crate::edge::rate::{RateTable, Verdict, retry_after_secs};
use crate::edge::tables::Tables;
use crate::http1::common::{ERROR_PAGE_TYPE, Reply};
use crate::http1::request::RequestHead;
use crate::proxy::body::{ProxyBody, local_reply};
use crate::syntax::request_key::{with_client, with_key};
use crate::sys::summed::summed_warn;
use crate::upstream::counters::{ListenerStats, Refusal};

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
    /// The route's own `rate_limit`, or the listener's; `None` when neither names a zone.
    pub(crate) fn new(
        listener: &Listener,
        route: Option<&RouteRule>,
        zones: &[crate::config::RateZone],
        tables: &Tables,
    ) -> Option<RateLimits> {
        let list: &[RateLimit] = match route.and_then(|r| r.rate_limits.as_deref()) {
            Some(own) => own,
            None => &listener.rate_limits,
        };
        if list.is_empty() {
            return None;
        }
        let label = match route {
            None => "default".to_string(),
            Some(r) => {
                let index = (listener.routes.iter())
                    .position(|x| std::ptr::eq(x, r))
                    .unwrap_or(0);
                match &r.path {
                    crate::config::PathMatch::Prefix(p) => format!("{index}:{p}"),
                    crate::config::PathMatch::Exact(p) => format!("{index}:={p}"),
                    crate::config::PathMatch::Regex(x) => format!("{index}:~{}", x.0.as_str()),
                }
            }
        };
        let zones = (list.iter())
            .filter_map(|l| {
                let zone = zones.get(l.zone)?;
                Some(ZoneCheck {
                    table: tables.rate(zone),
                    key: zone.key.clone(),
                    burst: l.burst,
                    status: StatusCode::from_u16(l.status).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
                    zone: zone.name.clone(),
                    rate: zone.rate.clone(),
                    limited: tables.limited(listener.address, &label, &zone.name),
                })
            })
            .collect();
        Some(RateLimits { zones })
    }

    /// Counts `head` in each zone; `Some` is the answer of the first zone that refuses it.
    #[inline(never)]
    pub(crate) fn check(
        &self,
        head: &RequestHead,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Option<Reply<ProxyBody>> {
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
            return Some(refused(z, retry, head, stats));
        }
        None
    }
}

impl RateLimits {
    /// A TCP listener's new connection from `client`, counted in each zone (all keyed by the
    /// client's address: `config::edge_limits`); `Some` is the status of the first that
    /// refuses it, for the log, the connection then to be closed (HAProxy's `tcp-request
    /// connection reject if { src_conn_rate gt N }`).
    #[cold]
    pub(crate) fn admit_connection(
        &self,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Option<u16> {
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
            if let Some(s) = stats {
                s.refuse(Refusal::RateLimit);
            }
            return Some(z.status.as_u16());
        }
        None
    }
}

#[cold]
fn refused(
    z: &ZoneCheck,
    retry_after: u64,
    head: &RequestHead,
    stats: Option<&ListenerStats>,
) -> Reply<ProxyBody> {
    z.limited.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = stats {
        s.refuse(Refusal::RateLimit);
    }
    let page = format!(
        "{} {}: over the request rate of zone {} ({}); retry in {retry_after} s\n",
        z.status.as_u16(),
        z.status.canonical_reason().unwrap_or(""),
        z.zone,
        z.rate
    );
    let line = format!("retry-after: {retry_after}\r\n");
    local_reply(
        z.status,
        ERROR_PAGE_TYPE,
        Bytes::from(page),
        line.as_bytes(),
        &head.method,
    )
}
