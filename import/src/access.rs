//! nginx's `allow`/`deny`, `auth_basic`/`auth_basic_user_file` and `satisfy` as a route's
//! `access`, `auth_basic` and `satisfy`.
//!
//! Every imported route carries the settings nginx merges into its location: the `allow` and
//! `deny` lines of the nearest level (`http`, `server`, `location`) that has any, in order (a
//! level with any of its own inherits none), and `auth_basic`, `auth_basic_user_file` and
//! `satisfy` each from the nearest level that sets it. A relative `auth_basic_user_file` is
//! resolved as nginx does, against its configuration prefix: the directory of the main file
//! given to `pinlb import`; the import writes the absolute path.

use std::path::Path;

use pinlb::config::raw::RawRoute;
use pinlb::modules::access::{RawAuthBasic, RawAuthBasicTable};

use super::parse::Directive;
use super::values::spanned;

/// What nginx merges into a location of these directives.
#[derive(Debug, Clone, Default)]
pub(super) struct Access {
    rules: Option<Vec<Directive>>,
    auth_basic: Option<Directive>,
    user_file: Option<Directive>,
    satisfy: Option<Directive>,
}

/// What one route's conversion says besides its keys.
pub(super) enum Said {
    Note(String),
    /// Left out, and pinlb would let in whom nginx refuses.
    Refused(String),
}

impl Access {
    /// What a block's own directives make of what it inherits.
    pub fn level(&self, block: &[Directive]) -> Access {
        let mut out = self.clone();
        let own = |name: &str| block.iter().rfind(|d| d.name == name && d.block.is_none());
        let rules: Vec<Directive> = (block.iter())
            .filter(|d| (d.name == "allow" || d.name == "deny") && d.block.is_none())
            .cloned()
            .collect();
        if !rules.is_empty() {
            out.rules = Some(rules);
        }
        if let Some(d) = own("auth_basic") {
            out.auth_basic = Some(d.clone());
        }
        if let Some(d) = own("auth_basic_user_file") {
            out.user_file = Some(d.clone());
        }
        if let Some(d) = own("satisfy") {
            out.satisfy = Some(d.clone());
        }
        out
    }

    /// Writes the route's `access`, `auth_basic` and `satisfy`; `conf_dir` is nginx's
    /// configuration prefix, for a relative user file.
    pub fn apply(&self, route: &mut RawRoute, conf_dir: &Path) -> Vec<Said> {
        let mut said = Vec::new();
        let refuse = |d: &Directive, why: &str| {
            Said::Refused(format!(
                "{}: {} {} not converted: {why}; without it pinlb answers requests nginx refuses",
                d.at(),
                d.name,
                d.args.join(" ")
            ))
        };
        let mut restricts = false;
        if let Some(rules) = &self.rules {
            let mut list = Vec::new();
            for d in rules {
                match rule(d) {
                    Ok((r, note)) => {
                        list.push(spanned(r));
                        if let Some(n) = note {
                            said.push(Said::Note(format!("{}: {n}", d.at())));
                        }
                    }
                    Err(why) => said.push(refuse(d, &why)),
                }
            }
            restricts = !list.is_empty();
            route.modules.access.access = Some(spanned(list));
        }
        let realm = self.auth_basic.as_ref().and_then(|d| d.args.first());
        match (&self.auth_basic, realm, &self.user_file) {
            (None, ..) => {}
            (Some(_), Some(off), _) if off == "off" => {}
            (Some(d), Some(realm), Some(f)) => match (f.args.first(), realm.contains('$')) {
                (_, true) => said.push(refuse(d, "a realm with variables")),
                (Some(file), false) if !file.contains('$') => {
                    let path = conf_dir.join(file);
                    let on = RawAuthBasicTable {
                        realm: Some(spanned(realm.clone())),
                        user_file: Some(spanned(path.display().to_string())),
                    };
                    route.modules.access.auth_basic = Some(spanned(RawAuthBasic::On(on)));
                    restricts = true;
                }
                _ => said.push(refuse(f, "only a file name without variables converts")),
            },
            (Some(d), Some(_), None) => said.push(Said::Note(format!(
                "{}: auth_basic without auth_basic_user_file: nginx asks for no credentials then, nor does pinlb",
                d.at()
            ))),
            (Some(d), None, _) => said.push(refuse(d, "expected a realm or off")),
        }
        if let Some(d) = &self.satisfy {
            match d.args.first().map(String::as_str) {
                Some(v @ ("all" | "any")) => {
                    route.modules.access.satisfy = Some(spanned(v.into()));
                }
                _ => said.push(refuse(d, "expected all or any")),
            }
        }
        let answers = route.redirect.is_some() || route.respond.is_some();
        if restricts && answers {
            let at = (self.rules.iter().flatten().chain(&self.auth_basic))
                .next()
                .map(Directive::at)
                .unwrap_or_default();
            said.push(Said::Note(format!(
                "{at}: nginx answers a return or rewrite before its access phase, to every client; pinlb checks access and auth_basic before any answer, so the clients they refuse get 403 or 401 instead"
            )));
        }
        said
    }
}

/// One `allow`/`deny` line as a pinlb rule, with a note where its meaning is nginx's but its
/// text is not.
fn rule(d: &Directive) -> Result<(String, Option<String>), String> {
    let [what] = d.args.as_slice() else {
        return Err("expected one address, CIDR range or all".into());
    };
    if what == "all" {
        return Ok((format!("{} all", d.name), None));
    }
    if what.starts_with("unix:") {
        return Err("pinlb listens on TCP only: it has no unix-socket clients to match".into());
    }
    let net = match what.parse::<ipnet::IpNet>() {
        Ok(n) => n,
        Err(_) => match what.parse::<std::net::IpAddr>() {
            Ok(ip) => ipnet::IpNet::from(ip),
            Err(_) => return Err("not an address or a CIDR range".into()),
        },
    };
    let trunc = net.trunc();
    let note = (trunc != net).then(|| {
        format!(
            "{} {what} became {} {trunc}: nginx ignores the low bits of the address too",
            d.name, d.name
        )
    });
    let text = if what.contains('/') {
        trunc.to_string()
    } else {
        what.clone()
    };
    Ok((format!("{} {text}", d.name), note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use toml::Value;

    fn d(name: &str, args: &[&str], line: usize) -> Directive {
        Directive {
            name: name.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block: None,
            file: PathBuf::from("n.conf"),
            line,
        }
    }

    fn refused(said: &[Said]) -> Vec<&str> {
        said.iter()
            .filter_map(|s| match s {
                Said::Refused(r) => Some(r.as_str()),
                Said::Note(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_level_with_rules_of_its_own_inherits_none_and_auth_is_merged_by_directive() {
        let http = Access::default().level(&[
            d("deny", &["10.0.0.1"], 1),
            d("allow", &["10.0.0.0/8"], 2),
            d("auth_basic", &["Staff"], 3),
            d("auth_basic_user_file", &["htpasswd"], 4),
        ]);
        let loc = http.level(&[
            d("allow", &["192.168.0.0/16"], 5),
            d("satisfy", &["any"], 6),
        ]);
        let mut route = RawRoute::default();
        let said = loc.apply(&mut route, Path::new("/etc/nginx"));
        let route = toml::Table::try_from(&route).unwrap();
        assert!(refused(&said).is_empty());
        assert_eq!(
            route["access"],
            Value::Array(vec!["allow 192.168.0.0/16".into()])
        );
        assert_eq!(route["auth_basic"]["realm"], "Staff".into());
        assert_eq!(
            route["auth_basic"]["user_file"],
            "/etc/nginx/htpasswd".into()
        );
        assert_eq!(route["satisfy"], "any".into());
        let off = http.level(&[d("auth_basic", &["off"], 7)]);
        let mut route = RawRoute::default();
        off.apply(&mut route, Path::new("/etc/nginx"));
        let route = toml::Table::try_from(&route).unwrap();
        assert!(!route.contains_key("auth_basic"));
        assert_eq!(route["access"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn what_does_not_convert_is_refused_with_its_reason() {
        let level = Access::default().level(&[
            d("allow", &["unix:"], 1),
            d("deny", &["nonsense"], 2),
            d("deny", &["all"], 3),
            d("auth_basic", &["$realm"], 4),
            d("auth_basic_user_file", &["/x"], 5),
            d("satisfy", &["maybe"], 6),
        ]);
        let mut route = RawRoute::default();
        let said = level.apply(&mut route, Path::new("/"));
        let route = toml::Table::try_from(&route).unwrap();
        let r = refused(&said);
        assert_eq!(r.len(), 4, "{r:?}");
        assert!(r[0].starts_with("n.conf:1: allow unix: not converted: pinlb listens on TCP only"));
        assert!(r[1].contains("not an address"));
        assert!(r[2].contains("realm with variables"));
        assert!(r[3].contains("expected all or any"));
        assert_eq!(route["access"], Value::Array(vec!["deny all".into()]));
    }

    #[test]
    fn low_bits_are_dropped_as_nginx_does_with_a_note() {
        let (r, note) = rule(&d("allow", &["10.1.1.0/16"], 1)).unwrap();
        assert_eq!(r, "allow 10.1.0.0/16");
        assert!(note.unwrap().contains("ignores the low bits"));
        assert_eq!(rule(&d("deny", &["::1"], 1)).unwrap().0, "deny ::1");
    }

    #[test]
    fn a_return_behind_access_rules_is_noted() {
        let level = Access::default().level(&[d("deny", &["all"], 9)]);
        let mut route = RawRoute {
            respond: Some(crate::values::respond(200, None)),
            ..RawRoute::default()
        };
        let said = level.apply(&mut route, Path::new("/"));
        assert!(said.iter().any(
            |s| matches!(s, Said::Note(n) if n.starts_with("n.conf:9: nginx answers a return"))
        ));
    }
}
