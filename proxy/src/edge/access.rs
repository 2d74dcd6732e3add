//! `access`, `auth_basic` and `satisfy` for one listener's or route's requests: the ordered
//! allow/deny rules matched on the client's address, basic auth, and how the two combine.
//!
//! As nginx: the first rule that matches decides and a client no rule matches is let in;
//! with `satisfy = "all"` (the default) a request needs both to pass, and a denied address
//! is answered `403` before any password is asked for; with `"any"` either passing lets it
//! in, and with neither the `401` is answered, so that the client may still log in.

use std::net::IpAddr;

use bytes::Bytes;
use http::StatusCode;

use crate::config::{Access, AccessRule, AuthBasic, Satisfy};
use crate::edge::basic_auth::{BasicAuthCheck, Refused};
use crate::http1::common::{ERROR_PAGE_TYPE, Reply};
use crate::http1::request::RequestHead;
use crate::proxy::body::{ProxyBody, local_reply};
use crate::sys::summed::summed_warn;
use crate::upstream::counters::{ListenerStats, Refusal};

/// Whether `rules` let `client` in: the first rule that matches it decides; none matching
/// lets it in. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, a v4 client of a dual-stack
/// socket) matches as the IPv4 address it is.
pub fn allows(rules: &[AccessRule], client: IpAddr) -> bool {
    let client = client.to_canonical();
    rules
        .iter()
        .find(|r| r.net.is_none_or(|n| n.contains(&client)))
        .is_none_or(|r| r.allow)
}

/// One listener's or route's `access`, `auth_basic` and `satisfy`, in one worker.
pub(crate) struct AccessControl {
    rules: Option<Vec<AccessRule>>,
    auth: Option<BasicAuthCheck>,
    satisfy: Satisfy,
}

impl AccessControl {
    /// The control for a route with `own` settings under its listener's `listener` ones
    /// (`own` is `None` for the listener's own requests): each of the route's replaces the
    /// listener's. `None` when neither rules nor auth apply.
    pub fn new(listener: &Access, own: Option<&Access>) -> Option<AccessControl> {
        let pick = |f: fn(&Access) -> bool| own.filter(|o| f(o)).unwrap_or(listener);
        let rules = pick(|a| a.rules.is_some()).rules.clone();
        let auth = match &pick(|a| a.auth_basic.is_some()).auth_basic {
            Some(AuthBasic::On(b)) => Some(BasicAuthCheck::new(b.clone())),
            Some(AuthBasic::Off) | None => None,
        };
        let satisfy = pick(|a| a.satisfy.is_some()).satisfy.unwrap_or_default();
        // An empty list lets everyone in: it only lifts the listener's.
        let rules = rules.filter(|r| !r.is_empty());
        (rules.is_some() || auth.is_some()).then_some(AccessControl {
            rules,
            auth,
            satisfy,
        })
    }

    /// `None` lets the request in; `Some` is the 403 or 401 in its place, counted and logged.
    #[inline(never)]
    pub fn check(
        &self,
        head: &RequestHead,
        client: IpAddr,
        stats: Option<&ListenerStats>,
    ) -> Option<Reply<ProxyBody>> {
        let allowed = self.rules.as_deref().is_none_or(|r| allows(r, client));
        let Some(auth) = &self.auth else {
            return (!allowed).then(|| denied(head, client, stats));
        };
        match (self.satisfy, allowed) {
            // A denied client is not asked for a password it could not use.
            (Satisfy::All, false) => return Some(denied(head, client, stats)),
            (Satisfy::Any, true) if self.rules.is_some() => return None,
            _ => {}
        }
        let refused = auth.check(head).err()?;
        if let Some(s) = stats {
            s.refuse(Refusal::Unauthorized);
        }
        summed_warn!(client = %client; "answered 401 to {client}: basic auth: {refused}");
        let body = match refused {
            Refused::Missing => &b"401 Unauthorized: credentials required\n"[..],
            _ => b"401 Unauthorized: wrong credentials\n",
        };
        Some(local_reply(
            StatusCode::UNAUTHORIZED,
            ERROR_PAGE_TYPE,
            Bytes::from_static(body),
            &auth.challenge,
            &head.method,
        ))
    }
}

#[cold]
fn denied(head: &RequestHead, client: IpAddr, stats: Option<&ListenerStats>) -> Reply<ProxyBody> {
    if let Some(s) = stats {
        s.refuse(Refusal::Denied);
    }
    summed_warn!(client = %client; "answered 403 to {client}: denied by access rules");
    local_reply(
        StatusCode::FORBIDDEN,
        ERROR_PAGE_TYPE,
        Bytes::from_static(b"403 Forbidden: this address is not allowed\n"),
        b"",
        &head.method,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::access_rule;

    fn rules(list: &[&str]) -> Vec<AccessRule> {
        list.iter().map(|r| access_rule(r).unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_first_matching_rule_decides_as_in_nginx() {
        let r = rules(&[
            "deny 192.168.1.1",
            "allow 192.168.1.0/24",
            "allow 10.1.0.0/16",
            "allow 2001:db8::/32",
            "deny all",
        ]);
        assert!(!allows(&r, ip("192.168.1.1")));
        assert!(allows(&r, ip("192.168.1.2")));
        assert!(allows(&r, ip("10.1.200.3")));
        assert!(!allows(&r, ip("10.2.0.1")));
        assert!(allows(&r, ip("2001:db8::7")));
        assert!(!allows(&r, ip("::1")));
    }

    #[test]
    fn no_rule_matching_lets_the_client_in() {
        let r = rules(&["deny 10.0.0.0/8"]);
        assert!(allows(&r, ip("127.0.0.1")));
        assert!(!allows(&r, ip("10.9.9.9")));
        assert!(allows(&[], ip("10.9.9.9")));
    }

    #[test]
    fn an_ipv4_mapped_client_matches_ipv4_rules() {
        let r = rules(&["allow 127.0.0.1", "deny all"]);
        assert!(allows(&r, ip("::ffff:127.0.0.1")));
        assert!(!allows(&r, ip("::ffff:127.0.0.2")));
    }

    #[test]
    fn a_routes_own_settings_replace_the_listeners_each_by_kind() {
        let listener = Access {
            rules: Some(rules(&["deny all"])),
            ..Access::default()
        };
        let c = AccessControl::new(&listener, None).unwrap();
        assert!(c.rules.is_some() && c.auth.is_none());
        let c = AccessControl::new(&listener, Some(&Access::default())).unwrap();
        assert!(c.rules.is_some(), "a route without its own inherits");
        let lifted = Access {
            rules: Some(Vec::new()),
            ..Access::default()
        };
        assert!(AccessControl::new(&listener, Some(&lifted)).is_none());
        let off = Access {
            auth_basic: Some(AuthBasic::Off),
            satisfy: Some(Satisfy::Any),
            ..Access::default()
        };
        let c = AccessControl::new(&listener, Some(&off)).unwrap();
        assert_eq!(c.satisfy, Satisfy::Any);
        assert!(AccessControl::new(&Access::default(), None).is_none());
    }
}
