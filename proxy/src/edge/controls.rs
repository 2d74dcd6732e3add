//! A listener's or a route's edge controls, compiled once per generation and checked for each
//! of its requests before the proxy sees it: its `rate_limit` (`access` and `auth_basic` are
//! a module, `modules::access`, asked right after these).
//!
//! A route's own control replaces the listener's of the same kind, as an nginx `location`
//! with its own directive inherits none of that directive from its `server`. The controls run
//! before any route action (a redirect or a fixed answer too), so nothing a control refuses
//! is answered otherwise.

use std::net::IpAddr;

use crate::config::{Listener, RateZone, RouteRule};
use crate::edge::rate_limit::RateLimits;
use crate::edge::tables::Tables;
use crate::http1::common::Reply;
use crate::http1::request::RequestHead;
use crate::proxy::body::ProxyBody;
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
        let rate = RateLimits::new(listener, route, zones, tables);
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
        (self.rate.as_ref()).and_then(|r| r.check(head, client, stats))
    }
}
