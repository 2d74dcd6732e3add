//! `access`, `auth_basic` and `satisfy`, a listener's or a route's: who may send its requests
//! (nginx's `allow`/`deny`, `auth_basic`/`auth_basic_user_file` and `satisfy`).
//!
//! `access` is one ordered list, as nginx's `allow` and `deny` lines are one list: the first
//! rule that matches the client decides, and a client no rule matches is let in. A route's own
//! `access`, `auth_basic` or `satisfy` replaces the listener's (an empty `access = []` or
//! `auth_basic = "off"` lifts it), as an nginx `location` with its own inherits none.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde::Serializer;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use toml::Spanned;

use super::htpasswd::{self, HtpasswdUser};
use crate::syntax::error::{ConfigError, Source};

type Result<T> = std::result::Result<T, ConfigError>;

/// `auth_basic = { realm = "…", user_file = "…" }`, or `"off"`.
#[derive(Debug, Clone, PartialEq)]
pub enum RawAuthBasic {
    Off,
    On(RawAuthBasicTable),
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuthBasicTable {
    pub realm: Option<Spanned<String>>,
    pub user_file: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawAuthBasic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawAuthBasic;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"{ realm = "…", user_file = "…" } or "off""#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<RawAuthBasic, E> {
                match v {
                    "off" => Ok(RawAuthBasic::Off),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<RawAuthBasic, A::Error> {
                RawAuthBasicTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawAuthBasic::On)
            }
        }
        d.deserialize_any(V)
    }
}

/// Written as read: `"off"`, or the table.
impl Serialize for RawAuthBasic {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            RawAuthBasic::Off => s.serialize_str("off"),
            RawAuthBasic::On(table) => table.serialize(s),
        }
    }
}

/// The keys as the file writes them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub access: Option<Spanned<Vec<Spanned<String>>>>,
    pub auth_basic: Option<Spanned<RawAuthBasic>>,
    pub satisfy: Option<Spanned<String>>,
}

/// What applies to a listener's or a route's requests, its own keys over the listener's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Access {
    /// `access`: the ordered allow/deny rules; `None` for none (or an empty list).
    pub rules: Option<Vec<AccessRule>>,
    /// `auth_basic`, when on.
    pub auth: Option<Arc<BasicAuth>>,
    /// `satisfy`, when set.
    pub satisfy: Option<Satisfy>,
}

/// What `pinlb check` prints: `access: 3 rule(s), first deny 10.0.0.1/32; auth_basic "R":
/// 2 user(s) from /etc/pinlb/htpasswd; satisfy any`, each part only where it is set.
impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(r) = self.rules.as_ref().and_then(|r| r.first()) {
            parts.push(format!(
                "access: {} rule(s), first {} {}",
                self.rules.as_ref().map_or(0, Vec::len),
                if r.allow { "allow" } else { "deny" },
                r.net.map_or("all".to_string(), |n| n.to_string())
            ));
        }
        if let Some(b) = &self.auth {
            parts.push(format!(
                "auth_basic {:?}: {} user(s) from {}",
                b.realm,
                b.users.len(),
                b.user_file.display()
            ));
        }
        match self.satisfy {
            Some(Satisfy::Any) => parts.push("satisfy any".into()),
            Some(Satisfy::All) => parts.push("satisfy all".into()),
            None => {}
        }
        f.write_str(&parts.join("; "))
    }
}

/// One `access` rule: `"allow 10.0.0.0/8"`, `"deny 192.168.1.1"`, `"deny all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AccessRule {
    pub allow: bool,
    /// The addresses it matches; `None` for `all`.
    pub net: Option<IpNet>,
}

/// HTTP basic auth against an htpasswd file, read at load (and at every reload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BasicAuth {
    /// `realm`: what the browser shows in its prompt.
    pub realm: String,
    /// `user_file`, resolved (relative to the configuration file's directory).
    pub user_file: PathBuf,
    /// Its users, in file order.
    pub users: Vec<HtpasswdUser>,
}

/// `satisfy`: with both `access` and `auth_basic`, whether a request needs both to pass
/// (`all`, nginx's default) or either (`any`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Satisfy {
    #[default]
    All,
    Any,
}

/// The keys `raw` of the table at `key`, each over the listener's (`inherited`, for a route);
/// `None` when none applies.
pub(super) fn validate(
    src: &Source,
    key: &str,
    raw: &Raw,
    inherited: Option<&Arc<Access>>,
) -> Result<Option<Arc<Access>>> {
    let rules = match &raw.access {
        // An empty list lets everyone in: it only lifts the listener's.
        Some(list) => Some(
            (list.get_ref().iter().enumerate())
                .map(|(i, r)| {
                    access_rule(r.get_ref())
                        .map_err(|e| src.at(r.span(), &format!("{key}.access[{i}]"), e))
                })
                .collect::<Result<Vec<_>>>()?,
        )
        .filter(|r| !r.is_empty()),
        None => inherited.and_then(|i| i.rules.clone()),
    };
    let auth = match &raw.auth_basic {
        Some(a) => match a.get_ref() {
            RawAuthBasic::Off => None,
            RawAuthBasic::On(t) => Some(Arc::new(basic_auth(
                src,
                &format!("{key}.auth_basic"),
                a.span(),
                t,
            )?)),
        },
        None => inherited.and_then(|i| i.auth.clone()),
    };
    let satisfy = match &raw.satisfy {
        Some(s) => Some(match s.get_ref().as_str() {
            "all" => Satisfy::All,
            "any" => Satisfy::Any,
            other => {
                return Err(src.at(
                    s.span(),
                    &format!("{key}.satisfy"),
                    format!("unknown value {other:?}, expected \"all\" or \"any\""),
                ));
            }
        }),
        None => inherited.and_then(|i| i.satisfy),
    };
    let access = Access {
        rules,
        auth,
        satisfy,
    };
    let any = access.rules.is_some() || access.auth.is_some() || access.satisfy.is_some();
    Ok(any.then(|| Arc::new(access)))
}

/// One rule as written: `allow` or `deny`, then an address, a CIDR range or `all`.
pub(crate) fn access_rule(rule: &str) -> std::result::Result<AccessRule, String> {
    const FORM: &str = "expected \"allow ADDRESS\", \"deny ADDRESS\" (an IPv4 or IPv6 address or CIDR range) or \"allow all\"/\"deny all\"";
    let mut words = rule.split_whitespace();
    let allow = match words.next() {
        Some("allow") => true,
        Some("deny") => false,
        _ => return Err(format!("{rule:?}: {FORM}")),
    };
    let (Some(what), None) = (words.next(), words.next()) else {
        return Err(format!("{rule:?}: {FORM}"));
    };
    if what == "all" {
        return Ok(AccessRule { allow, net: None });
    }
    let net = match what.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match what.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => {
                return Err(format!(
                    "{what:?} is not an address or a CIDR range: {FORM}"
                ));
            }
        },
    };
    if net.trunc() != net {
        return Err(format!(
            "{what} has bits set past its prefix length, expected {}",
            net.trunc()
        ));
    }
    Ok(AccessRule {
        allow,
        net: Some(net),
    })
}

/// `auth_basic = { realm, user_file }`, its file read now.
fn basic_auth(
    src: &Source,
    akey: &str,
    span: std::ops::Range<usize>,
    t: &RawAuthBasicTable,
) -> Result<BasicAuth> {
    let Some(realm) = &t.realm else {
        return Err(src.at(
            span,
            &format!("{akey}.realm"),
            "missing, expected the realm the browser shows in its prompt (nginx's auth_basic \"…\")",
        ));
    };
    if (realm.get_ref().chars()).any(|c| c == '"' || c == '\\' || c.is_control()) {
        return Err(src.at(
            realm.span(),
            &format!("{akey}.realm"),
            "expected text without '\"', '\\' or control characters (it goes into WWW-Authenticate's quoted string)",
        ));
    }
    let Some(file) = &t.user_file else {
        return Err(src.at(
            span,
            &format!("{akey}.user_file"),
            "missing, expected an htpasswd file",
        ));
    };
    let fkey = format!("{akey}.user_file");
    let path = relative_to_config(src.file, file.get_ref());
    let text = std::fs::read(&path).map_err(|e| {
        src.at(
            file.span(),
            &fkey,
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let users = htpasswd::parse(&text).map_err(|(line, e)| {
        let at = if line == 0 {
            path.display().to_string()
        } else {
            format!("{}:{line}", path.display())
        };
        src.at(file.span(), &fkey, format!("{at}: {e}"))
    })?;
    Ok(BasicAuth {
        realm: realm.get_ref().clone(),
        user_file: path,
        users,
    })
}

/// `name`, relative to the directory of the configuration file `config`.
fn relative_to_config(config: &str, name: &str) -> PathBuf {
    let name = Path::new(name);
    match Path::new(config).parent() {
        Some(dir) if name.is_relative() => dir.join(name),
        _ => name.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_as_nginx_writes_them() {
        let r = access_rule("deny 192.168.1.1").unwrap();
        assert_eq!(
            (r.allow, r.net),
            (false, Some("192.168.1.1/32".parse().unwrap()))
        );
        let r = access_rule("allow  10.1.0.0/16").unwrap();
        assert_eq!(
            (r.allow, r.net),
            (true, Some("10.1.0.0/16".parse().unwrap()))
        );
        let r = access_rule("allow 2001:db8::/32").unwrap();
        assert_eq!(r.net, Some("2001:db8::/32".parse().unwrap()));
        assert_eq!(access_rule("deny all").unwrap().net, None);
    }

    #[test]
    fn bad_rules_say_what_was_expected() {
        for (rule, wanted) in [
            ("permit 1.2.3.4", "expected \"allow ADDRESS\""),
            ("allow", "expected"),
            ("allow 1.2.3.4 5.6.7.8", "expected"),
            ("deny 300.1.1.1", "not an address"),
            ("allow unix:", "not an address"),
            ("allow 10.1.1.0/16", "expected 10.1.0.0/16"),
            ("deny 1.2.3.4/33", "not an address"),
        ] {
            let e = access_rule(rule).unwrap_err();
            assert!(e.contains(wanted), "{rule}: {e}");
        }
    }

    #[test]
    fn a_relative_user_file_is_read_beside_the_config() {
        assert_eq!(
            relative_to_config("/etc/pinlb/pinlb.toml", "htpasswd"),
            Path::new("/etc/pinlb/htpasswd")
        );
        assert_eq!(
            relative_to_config("/etc/pinlb/pinlb.toml", "/srv/htpasswd"),
            Path::new("/srv/htpasswd")
        );
        assert_eq!(relative_to_config("pinlb.toml", "h"), Path::new("h"));
    }
}
