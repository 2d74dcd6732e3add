//! What `request_headers` and `response_headers` share: their rules, as the file writes them
//! and validated, what `pinlb check` says of them, and the rules applied to header lines.
//!
//! `remove` drops every line of a name, `set` replaces every line of its name with one
//! (nginx's `proxy_set_header`), `add` appends one (nginx's `add_header`). Values are
//! [`Template`]s. Names are lower-case; the headers pinlb writes itself (Host, the framing and
//! hop-by-hop ones, X-Forwarded-For/-Proto) are refused at load.
//!
//! On a listener or a route; a route's own rules replace the listener's whole, as an nginx
//! `location` with a `proxy_set_header` (or an `add_header`) of its own inherits none of its
//! `server`'s; an empty table (`request_headers = {}`) lifts them.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};
use crate::syntax::template::{Request, Template};

/// `{ set = { NAME = "value" }, add = { ... }, remove = ["NAME"] }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, Spanned<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, Spanned<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<Spanned<String>>,
}

/// One key's rules, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HeaderRules {
    pub remove: Vec<String>,
    pub set: Vec<(String, Template)>,
    pub add: Vec<(String, Template)>,
}

impl HeaderRules {
    fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }

    /// Whether a line named `name` is dropped: removed, or replaced by `set`.
    fn drops(&self, name: &[u8]) -> bool {
        let is = |n: &String| name.eq_ignore_ascii_case(n.as_bytes());
        self.remove.iter().any(is) || self.set.iter().any(|(n, _)| is(n))
    }

    /// `lines` with the rules applied for `request`: lines of a removed or set name dropped,
    /// then the `set` and `add` lines, rendered.
    pub fn apply(&self, lines: &[u8], request: &Request<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(lines.len() + 64);
        for line in lines.split_inclusive(|&b| b == b'\n') {
            let name = &line[..line.iter().position(|&b| b == b':').unwrap_or(0)];
            if !self.drops(name) {
                out.extend_from_slice(line);
            }
        }
        for (name, value) in self.set.iter().chain(&self.add) {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            value.render(request, &mut out);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// `set x-real-ip: {client_ip}; remove x-debug`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (verb, list) in [("set", &self.set), ("add", &self.add)] {
            for (name, value) in list {
                parts.push(format!("{verb} {name}: {value}"));
            }
        }
        if !self.remove.is_empty() {
            parts.push(format!("remove {}", self.remove.join(", ")));
        }
        parts.join("; ")
    }
}

/// The rules of the key `key` of the table at `at` (`raw`), over the listener's `inherited`:
/// its own replace them whole; `None` when none apply.
pub(crate) fn resolve(
    src: &Source,
    key: &str,
    raw: Option<&Spanned<Raw>>,
    inherited: Option<&Arc<HeaderRules>>,
) -> Result<Option<Arc<HeaderRules>>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(inherited.cloned());
    };
    let rules = validate(src, key, raw)?;
    Ok((!rules.is_empty()).then(|| Arc::new(rules)))
}

/// The rules `raw` of the key `key`, their names and values checked.
fn validate(src: &Source, key: &str, raw: &Spanned<Raw>) -> Result<HeaderRules, ConfigError> {
    let name_ok = |name: &str, at: Range<usize>, what: &str| -> Result<String, ConfigError> {
        let lower = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            return Err(src.at(
                at,
                &format!("{key}.{what}"),
                format!("\"{name}\" is not a header name"),
            ));
        }
        let managed = crate::http1::hop::Hop::of(lower.as_bytes()).is_some()
            || [
                "host",
                "content-length",
                "x-forwarded-for",
                "x-forwarded-proto",
            ]
            .contains(&lower.as_str());
        if managed {
            return Err(src.at(
                at,
                &format!("{key}.{what}"),
                format!("\"{name}\" is written by pinlb itself (Host as the client sent it, the framing and hop-by-hop headers, X-Forwarded-For and -Proto) and can't be changed here"),
            ));
        }
        Ok(lower)
    };
    let r = raw.get_ref();
    let templates = |map: &std::collections::BTreeMap<String, Spanned<String>>, what: &str| {
        map.iter()
            .map(|(name, value)| {
                let name = name_ok(name, value.span(), what)?;
                let at = |e: String| src.at(value.span(), &format!("{key}.{what}.{name}"), e);
                if value.get_ref().contains(['\r', '\n']) {
                    return Err(at("a header value can't hold a line break".into()));
                }
                let t = Template::parse(value.get_ref()).map_err(at)?;
                Ok((name, t))
            })
            .collect::<Result<Vec<_>, ConfigError>>()
    };
    Ok(HeaderRules {
        set: templates(&r.set, "set")?,
        add: templates(&r.add, "add")?,
        remove: r
            .remove
            .iter()
            .map(|n| name_ok(n.get_ref(), n.span(), "remove"))
            .collect::<Result<Vec<_>, ConfigError>>()?,
    })
}
