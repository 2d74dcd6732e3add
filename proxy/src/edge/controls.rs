//! A listener's or a route's edge controls, compiled once per generation and checked for each
//! of its requests before the proxy sees it: its `rate_limit` (`modules::rate_limit`; `access`
//! and `auth_basic` are a module, `modules::access`, asked right after these).
//!
//! A route's own control replaces the listener's of the same kind, as an nginx `location`
//! with its own directive inherits none of that directive from its `server`. The controls run
//! before any route action (a redirect or a fixed answer too), so nothing a control refuses
//! is answered otherwise.

use std::net::IpAddr;

use crate::config::{Listener, PathMatch, RateZone, RouteRule};
use crate::edge::tables::Tables;
use crate::http1::common::Reply;
use crate::http1::request::RequestHead;
use crate::modules::rate_limit::check::RateLimits;
use crate::proxy::body::{ProxyBody, refusal_reply};
use crate::upstream::counters::ListenerStats;

/// The controls that apply to one route's requests (or to the listener's requests no route
/// matches).
pub(crate) struct Controls {
    /// `rate_limit`: the zones its requests are counted in.
    rate: Option<RateLimits>,
}

impl Controls {
    /// The controls for `route`'s requests (the listener's own for `None`); `None` when none
    /// apply, so that such requests are not checked at all.
    pub fn new(
        listener: &Listener,
        route: Option<&RouteRule>,
        zones: &[RateZone],
        tables: &Tables,
    ) -> Option<Controls> {
        let rate = rate_limits(listener, route, zones, tables);
        rate.is_some().then_some(Controls { rate })
    }

    /// Checks one request from `client`: `None` lets it go on; `Some` is pinlb's answer in its
    /// place (counted in `stats` and logged where it is decided).
    pub fn check(
        &self,
        head: &RequestHead,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Option<Reply<ProxyBody>> {
        let answer = self.rate.as_ref()?.check(head, client)?;
        Some(refusal_reply(answer, &head.method, stats))
    }
}

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
