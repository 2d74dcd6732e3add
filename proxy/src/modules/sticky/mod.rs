//! `[upstream.NAME] sticky`: sticky sessions by a cookie pinlb inserts (HAProxy's `cookie NAME
//! insert indirect nocache`, nginx Plus's `sticky cookie`). Its keys are an upstream's, so it
//! sits outside the listener modules' registry: this folder owns its keys (read where the
//! upstream's other keys are), their validation, and the table of each backend's value; the
//! request path prefers the backend a request's cookie names (`upstream::pick::prefer`) and
//! adds the `Set-Cookie` line (`proxy::forward`).
//!
//! - [`table`]: each backend's opaque value, the cookie read from a request and taken out of
//!   what the backend sees, and the `Set-Cookie` line.

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};
use crate::syntax::values::Dur;

pub(crate) mod table;

type Result<T> = std::result::Result<T, ConfigError>;

/// `sticky = { cookie = "NAME", … }` as the file writes it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub cookie: Spanned<String>,
    pub path: Option<Spanned<String>>,
    pub domain: Option<Spanned<String>>,
    pub max_age: Option<Spanned<Dur>>,
    pub secure: Option<bool>,
    pub httponly: Option<bool>,
    pub samesite: Option<Spanned<String>>,
    pub seed: Option<String>,
}

/// An upstream's sticky cookie: the first response to a client carries `Set-Cookie: NAME=VALUE`
/// naming the backend that answered by an opaque value; later requests with it go to that
/// backend while it can take them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sticky {
    /// The cookie's name, an RFC 6265 token.
    pub cookie: String,
    /// `Path`; `"/"` unless set, so the cookie covers the whole site, as HAProxy's does.
    pub path: String,
    /// `Domain`; none unless set: the cookie goes back only to the host that set it.
    pub domain: Option<String>,
    /// `Max-Age` in seconds; none unless set: a session cookie, gone when the browser closes
    /// (HAProxy's and nginx Plus's default).
    pub max_age: Option<u64>,
    /// `Secure`; off unless set.
    pub secure: bool,
    /// `HttpOnly`; on unless `httponly = false`: scripts have no reason to read it.
    pub httponly: bool,
    /// `SameSite`; none unless set (the browser's default, `Lax`).
    pub samesite: Option<SameSite>,
    /// Keys the values' hash, so they can't be computed from a backend's address by anyone
    /// without the configuration. Empty unless set.
    pub seed: String,
}

/// A cookie's `SameSite` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameSite {
    Strict,
    Lax,
    None,
}

impl SameSite {
    pub fn as_str(self) -> &'static str {
        match self {
            SameSite::Strict => "Strict",
            SameSite::Lax => "Lax",
            SameSite::None => "None",
        }
    }
}

impl Sticky {
    /// The default `path`.
    pub const PATH: &'static str = "/";

    /// The cookie's attributes as `Set-Cookie` writes them after its value (`; Path=/;
    /// HttpOnly`), made once per configuration generation.
    pub fn attributes(&self) -> String {
        let mut a = format!("; Path={}", self.path);
        if let Some(domain) = &self.domain {
            a.push_str("; Domain=");
            a.push_str(domain);
        }
        if let Some(age) = self.max_age {
            a.push_str(&format!("; Max-Age={age}"));
        }
        if self.secure {
            a.push_str("; Secure");
        }
        if self.httponly {
            a.push_str("; HttpOnly");
        }
        if let Some(s) = self.samesite {
            a.push_str("; SameSite=");
            a.push_str(s.as_str());
        }
        a
    }
}

/// Whether `name` is an RFC 6265 cookie name: an RFC 7230 token (visible ASCII but separators).
pub fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}

/// Whether `v` may be a cookie attribute's value: no control characters and no `;`
/// (RFC 6265's `av-octet`).
fn is_attribute_value(v: &str) -> bool {
    v.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b';')
}

/// An upstream's `sticky`, or `None` without it.
pub(crate) fn validate(
    src: &Source,
    key: &str,
    raw: Option<&Spanned<Raw>>,
) -> Result<Option<Sticky>> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let raw: &Raw = raw.get_ref();
    let key = format!("{key}.sticky");
    let name = raw.cookie.get_ref();
    if !is_cookie_name(name) {
        return Err(src.at(
            raw.cookie.span(),
            &format!("{key}.cookie"),
            format!(
                "invalid cookie name \"{name}\", expected a token (letters, digits and !#$%&'*+-.^_`|~, no spaces, no separators such as = ; , /)"
            ),
        ));
    }
    let attribute = |v: &Option<toml::Spanned<String>>, what: &str| -> Result<Option<String>> {
        match v {
            None => Ok(None),
            Some(v) if v.get_ref().is_empty() || !is_attribute_value(v.get_ref()) => {
                Err(src.at(
                    v.span(),
                    &format!("{key}.{what}"),
                    format!(
                        "invalid value \"{}\", expected a non-empty cookie attribute without ';' or control characters",
                        v.get_ref().escape_default()
                    ),
                ))
            }
            Some(v) => Ok(Some(v.get_ref().clone())),
        }
    };
    let path = attribute(&raw.path, "path")?.unwrap_or_else(|| Sticky::PATH.to_string());
    if !path.starts_with('/') {
        let span = raw.path.as_ref().map_or(0..0, |p| p.span());
        return Err(src.at(
            span,
            &format!("{key}.path"),
            format!("invalid path \"{path}\", expected a path beginning with '/'"),
        ));
    }
    let domain = attribute(&raw.domain, "domain")?;
    if let (Some(d), Some(raw_d)) = (&domain, &raw.domain) {
        if d.contains(' ') {
            return Err(src.at(
                raw_d.span(),
                &format!("{key}.domain"),
                format!("invalid domain \"{d}\", expected a host name such as \"example.com\""),
            ));
        }
    }
    let max_age = match &raw.max_age {
        None => None,
        Some(d) if d.get_ref().0.as_secs() == 0 => {
            return Err(src.at(
                d.span(),
                &format!("{key}.max_age"),
                "under one second, expected at least \"1s\" (Max-Age counts whole seconds; leave max_age out for a session cookie)",
            ));
        }
        Some(d) => Some(d.get_ref().0.as_secs()),
    };
    let secure = raw.secure.unwrap_or(false);
    let samesite = match &raw.samesite {
        None => None,
        Some(s) => Some(match s.get_ref().to_ascii_lowercase().as_str() {
            "strict" => SameSite::Strict,
            "lax" => SameSite::Lax,
            "none" if secure => SameSite::None,
            "none" => {
                return Err(src.at(
                    s.span(),
                    &format!("{key}.samesite"),
                    "\"none\" needs secure = true (browsers drop a SameSite=None cookie without Secure)",
                ));
            }
            other => {
                return Err(src.at(
                    s.span(),
                    &format!("{key}.samesite"),
                    format!("invalid value \"{other}\", expected \"strict\", \"lax\" or \"none\""),
                ));
            }
        }),
    };
    Ok(Some(Sticky {
        cookie: name.clone(),
        path,
        domain,
        max_age,
        secure,
        httponly: raw.httponly.unwrap_or(true),
        samesite,
        seed: raw.seed.clone().unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_names_are_tokens() {
        for good in ["SRV", "pinlb_srv", "a-b.c", "X!#$%&'*+^`|~"] {
            assert!(is_cookie_name(good), "{good}");
        }
        for bad in ["", "a b", "a=b", "a;b", "a,b", "a/b", "é", "a\tb", "\"q\""] {
            assert!(!is_cookie_name(bad), "{bad}");
        }
    }

    #[test]
    fn attribute_values_refuse_semicolons_and_controls() {
        assert!(is_attribute_value("/app"));
        assert!(!is_attribute_value("/a;b"));
        assert!(!is_attribute_value("/a\nb"));
    }
}
