//! A listener's or a route's `rate_limit` zones (`modules::rate_limit`), compiled once per
//! generation with the process's tables, and checked for each of its requests by the route's
//! decision before the proxy sees it (`access` and `auth_basic`, `modules::access`, right after
//! them).
//!
//! A route's own list replaces the listener's, as an nginx `location` with its own `limit_req`
//! inherits none from its `server`. The check runs before any route action (a redirect or a
//! fixed answer too), so nothing it refuses is answered otherwise.

use crate::config::{Listener, PathMatch, RateZone, RouteRule};
use crate::edge::tables::Tables;
use crate::modules::rate_limit::check::RateLimits;

/// `route`'s own `rate_limit`, or its listener's (`None`: the listener's requests no route
/// matches, or a TCP listener's connections), with the process's tables for its zones; `None`
/// when neither names a zone.
pub(crate) fn rate_limits(
    listener: &Listener,
    route: Option<&RouteRule>,
    zones: &[RateZone],
    tables: &Tables,
) -> Option<RateLimits> {
    let list = match route.and_then(|r| r.rate_limits.as_deref()) {
        Some(own) => own,
        None => &listener.rate_limits,
    };
    if list.is_empty() {
        return None;
    }
    // `pinlb_rate_limited_total`'s route: its index and path, as routes have no names.
    let label = match route {
        None => "default".to_string(),
        Some(r) => {
            let index = (listener.routes.iter())
                .position(|x| std::ptr::eq(x, r))
                .unwrap_or(0);
            match &r.path {
                PathMatch::Prefix(p) => format!("{index}:{p}"),
                PathMatch::Exact(p) => format!("{index}:={p}"),
                PathMatch::Regex(x) => format!("{index}:~{}", x.0.as_str()),
            }
        }
    };
    let limited = |zone: &RateZone| tables.limited(listener.address, &label, &zone.name);
    RateLimits::new(list, zones, |zone| tables.rate(zone), limited)
}
