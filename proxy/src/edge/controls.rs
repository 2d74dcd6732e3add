//! A listener's or a route's edge controls, compiled once per generation and checked for each
//! of its requests before the proxy sees it.
//!
//! A route's own control replaces the listener's of the same kind, as an nginx `location`
//! with its own directive inherits none of that directive from its `server`. The controls run
//! before any route action (a redirect or a fixed answer too), so nothing a control refuses
//! is answered otherwise.

use std::net::IpAddr;

use crate::config::{Listener, RateZone, RouteRule};
use crate::edge::access::AccessControl;
use crate::edge::rate_limit::RateLimits;
use crate::edge::tables::Tables;
use crate::http1::common::Reply;
use crate::http1::request::RequestHead;
use crate::proxy::body::ProxyBody;
use crate::upstream::counters::ListenerStats;

/// The controls that apply to one route's requests (or to the listener's requests no route
/// matches).
pub(crate) struct Controls {
    /// `access`, `auth_basic`, `satisfy`.
    access: Option<AccessControl>,
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
        let access = AccessControl::new(&listener.access, route.map(|r| &r.access));
        let rate = RateLimits::new(listener, route, zones, tables);
        (access.is_some() || rate.is_some()).then_some(Controls { access, rate })
    }

    /// Checks one request from `client`: `None` lets it go on; `Some` is pinlb's answer in its
    /// place (counted in `stats` and logged where it is decided).
    pub fn check(
        &self,
        head: &RequestHead,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Option<Reply<ProxyBody>> {
        // The rate first, as nginx's `limit_req` runs in the phase before `allow`/`deny` and
        // `auth_basic`: every request is counted, so a flood of wrong passwords (each a bcrypt
        // on this worker's core) is limited like any other.
        if let Some(refused) = (self.rate.as_ref()).and_then(|r| r.check(head, client, stats)) {
            return Some(refused);
        }
        (self.access.as_ref()).and_then(|a| a.check(head, client, stats))
    }
}
