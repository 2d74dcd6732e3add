//! `access`, `auth_basic` and `satisfy`: who may send a listener's or a route's requests: the
//! ordered allow/deny rules matched on the client's address, basic auth, and how the two
//! combine (nginx's `allow`/`deny`, `auth_basic`, `satisfy`).
//!
//! As nginx: the first rule that matches decides and a client no rule matches is let in;
//! with `satisfy = "all"` (the default) a request needs both to pass, and a denied address
//! is answered `403` before any password is asked for; with `"any"` either passing lets it
//! in, and with neither the `401` is answered, so that the client may still log in.
//!
//! On a listener or a route; each of a route's keys replaces the listener's (`access = []` and
//! `auth_basic = "off"` lift them). Checked once the request's route is known, after its
//! `rate_limit` (nginx's `limit_req` runs in the phase before `allow`/`deny` and `auth_basic`:
//! every request is counted, so a flood of wrong passwords, each a bcrypt on this worker's
//! core, is limited like any other), and before the route's own answer, so nothing this
//! refuses is answered otherwise.
//!
//! - [`htpasswd`]: an htpasswd file's users and their password hashes.
//! - [`config`]: the keys, their validation, and the htpasswd file read.
//! - [`basic_auth`]: the `Authorization` header read, its password verified, and the
//!   credentials each worker verified recently.

mod htpasswd;
mod config;
mod basic_auth;

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use super::{Answer, Module, Place, NoFilter, Refusal};
use crate::http1::request::RequestHead;
use crate::syntax::error::ConfigError;
use crate::sys::summed::summed_warn;
use basic_auth::{Refused, Verified};
pub use config::{Raw, RawAuthBasic, RawAuthBasicTable};
use config::{AccessRule, Satisfy};

pub(crate) use config::Access;

/// The module.
pub(crate) enum AccessControl {}

impl Module for AccessControl {
    const KEYS: &'static [&'static str] = &["access", "auth_basic", "satisfy"];
    type Raw = Raw;
    type Config = Access;
    type Local = Verified;
    type Filter = NoFilter;
    const ADMIT: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<Access>>,
    ) -> Result<Option<Arc<Access>>, ConfigError> {
        config::validate(at.src, at.key, raw, inherited)
    }

    #[inline(never)]
    fn admit(
        c: &Arc<Access>,
        verified: &Verified,
        head: &RequestHead,
        client: IpAddr,
    ) -> Option<Answer> {
        let allowed = c.rules.as_deref().is_none_or(|r| allows(r, client));
        let Some(auth) = &c.auth else {
            return (!allowed).then(|| denied(client));
        };
        match (c.satisfy.unwrap_or_default(), allowed) {
            // A denied client is not asked for a password it could not use.
            (Satisfy::All, false) => return Some(denied(client)),
            (Satisfy::Any, true) if c.rules.is_some() => return None,
            _ => {}
        }
        let refused = verified.check(auth, head).err()?;
        summed_warn!(client = %client; "answered 401 to {client}: basic auth: {refused}");
        let body = match refused {
            Refused::Missing => &b"401 Unauthorized: credentials required\n"[..],
            _ => b"401 Unauthorized: wrong credentials\n",
        };
        let challenge = format!(
            "www-authenticate: Basic realm=\"{}\", charset=\"UTF-8\"\r\n",
            auth.realm
        );
        Some(Answer {
            status: StatusCode::UNAUTHORIZED,
            lines: challenge.into_bytes(),
            body: Bytes::from_static(body),
            close: false,
            refused: Some(Refusal::Unauthorized),
        })
    }

    /// `access: 2 rule(s), first deny 10.0.0.1/32; auth_basic "R": 1 user(s) from …`.
    fn describe(c: &Access) -> String {
        c.to_string()
    }
}

/// Whether `rules` let `client` in: the first rule that matches it decides; none matching
/// lets it in. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, a v4 client of a dual-stack
/// socket) matches as the IPv4 address it is.
pub(crate) fn allows(rules: &[AccessRule], client: IpAddr) -> bool {
    let client = client.to_canonical();
    rules
        .iter()
        .find(|r| r.net.is_none_or(|n| n.contains(&client)))
        .is_none_or(|r| r.allow)
}

#[cold]
fn denied(client: IpAddr) -> Answer {
    summed_warn!(client = %client; "answered 403 to {client}: denied by access rules");
    Answer {
        status: StatusCode::FORBIDDEN,
        lines: Vec::new(),
        body: Bytes::from_static(b"403 Forbidden: this address is not allowed\n"),
        close: false,
        refused: Some(Refusal::Denied),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::access_rule;

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

    fn validate(text: &str, inherited: Option<&Arc<Access>>) -> Option<Arc<Access>> {
        let raw: Raw = toml::from_str(text).unwrap();
        let src = crate::syntax::error::Source {
            file: "pinlb.toml",
            text,
        };
        let at = Place {
            src: &src,
            key: "listener[0]",
            upstreams: &[],
            caches: &[],
            tls: None,
        };
        AccessControl::validate(&at, &raw, inherited).unwrap()
    }

    #[test]
    fn a_routes_own_settings_replace_the_listeners_each_by_kind() {
        let listener = validate("access = [\"deny all\"]", None).unwrap();
        assert!(listener.rules.is_some() && listener.auth.is_none());
        let route = validate("", Some(&listener));
        assert_eq!(route, Some(listener.clone()), "a route without its own inherits");
        assert_eq!(validate("access = []", Some(&listener)), None, "lifted");
        let any = validate("satisfy = \"any\"", Some(&listener)).unwrap();
        assert_eq!(any.satisfy, Some(Satisfy::Any));
        assert_eq!(any.rules, listener.rules);
        assert_eq!(validate("auth_basic = \"off\"", None), None);
        assert_eq!(validate("", None), None);
    }

    #[test]
    fn a_bad_satisfy_is_refused_at_its_place() {
        let raw: Raw = toml::from_str("satisfy = \"either\"").unwrap();
        let src = crate::syntax::error::Source {
            file: "pinlb.toml",
            text: "satisfy = \"either\"",
        };
        let at = Place {
            src: &src,
            key: "listener[0]",
            upstreams: &[],
            caches: &[],
            tls: None,
        };
        let e = AccessControl::validate(&at, &raw, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pinlb.toml:1:11: listener[0].satisfy: unknown value \"either\", expected \"all\" or \"any\""
        );
    }
}
