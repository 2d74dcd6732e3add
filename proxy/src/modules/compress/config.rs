//! `compress`: a listener's or a route's response compression, as nginx's `gzip on`,
//! `gzip_types`, `gzip_min_length` and `gzip_comp_level`, with brotli and zstd beside gzip:
//!
//! ```toml
//! [[listener]]
//! compress = true                    # every default below
//!
//! [listener.compress]                # or each key of its own
//! algorithms = ["zstd", "br", "gzip"] # offered, in the order preferred at equal q
//! types = ["text/html", "application/json", "text/*"]   # "*": every type
//! min_length = 20                    # a Content-Length under it is sent as it is
//! gzip_level = 1                     # 1–9, nginx's gzip_comp_level
//! br_level = 4                       # 0–11
//! zstd_level = 3                     # 1–19
//!
//! [[listener.route]]
//! compress = false                   # off for this route; a table of its own replaces the
//!                                    # keys it sets and takes the others from the listener
//! ```
//!
//! The validated type, its defaults, the raw types and their validation.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};

/// A content coding pinlb can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    Brotli,
    Zstd,
}

impl Coding {
    /// The token in `Accept-Encoding` and `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }

    fn parse(s: &str) -> Option<Coding> {
        [Coding::Gzip, Coding::Brotli, Coding::Zstd]
            .into_iter()
            .find(|c| c.token() == s)
    }
}

/// A listener's or a route's `compress`, every key resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compress {
    /// The codings offered, in the order preferred when the client's q-values tie: by default
    /// zstd (the least CPU for a size at or under gzip's), then br (smaller than gzip at about
    /// its CPU), then gzip (what every client takes).
    pub algorithms: Vec<Coding>,
    /// The media types compressed (lower-case, without parameters): `type/subtype`,
    /// `type/*`, or `*` for every type. A response without Content-Type matches only `*`.
    pub types: Vec<String>,
    /// `min_length`: a response whose Content-Length is under it is sent as it is (nginx's
    /// `gzip_min_length`, 20 by default); one without Content-Length is compressed.
    pub min_length: u64,
    /// `gzip_level`: nginx's `gzip_comp_level`, 1 by default.
    pub gzip_level: u32,
    /// `br_level`: brotli's quality, 4 by default (on-the-fly: smaller than gzip's level 1 at
    /// about its CPU; ngx_brotli's 6 costs twice that).
    pub br_level: u32,
    /// `zstd_level`: 3 by default, zstd's own default.
    pub zstd_level: i32,
}

/// The text types most sites serve, compressed by default. nginx's default is `text/html`
/// alone, and every nginx setup that turns gzip on lists these by hand.
pub const DEFAULT_TYPES: [&str; 12] = [
    "text/html",
    "text/css",
    "text/plain",
    "text/xml",
    "text/javascript",
    "application/javascript",
    "application/json",
    "application/xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/manifest+json",
    "image/svg+xml",
];

impl Default for Compress {
    fn default() -> Self {
        Compress {
            algorithms: vec![Coding::Zstd, Coding::Brotli, Coding::Gzip],
            types: DEFAULT_TYPES.iter().map(|t| t.to_string()).collect(),
            min_length: 20,
            gzip_level: 1,
            br_level: 4,
            zstd_level: 3,
        }
    }
}

impl Compress {
    /// Whether a response of `content_type` (a Content-Type value, parameters and all) is
    /// compressed.
    pub fn takes_type(&self, content_type: Option<&[u8]>) -> bool {
        let media = content_type.map(|v| {
            let end = v.iter().position(|&b| b == b';').unwrap_or(v.len());
            v[..end].trim_ascii()
        });
        self.types.iter().any(|t| {
            let t = t.as_bytes();
            match (t, media) {
                (b"*", _) => true,
                (_, None) => false,
                (_, Some(m)) => match t.strip_suffix(b"/*") {
                    Some(main) => {
                        m.len() > main.len()
                            && m[..main.len()].eq_ignore_ascii_case(main)
                            && m[main.len()] == b'/'
                    }
                    None => m.eq_ignore_ascii_case(t),
                },
            }
        })
    }
}

/// `compress = true`, `false`, or a table.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RawCompress {
    Switch(bool),
    /// Boxed: the table is large beside a bool, and read once per load.
    Table(Box<RawCompressTable>),
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompressTable {
    pub algorithms: Option<Spanned<Vec<Spanned<String>>>>,
    pub types: Option<Spanned<Vec<Spanned<String>>>>,
    pub min_length: Option<Spanned<i64>>,
    pub gzip_level: Option<Spanned<i64>>,
    pub br_level: Option<Spanned<i64>>,
    pub zstd_level: Option<Spanned<i64>>,
}

impl<'de> Deserialize<'de> for RawCompress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawCompress;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"true, false or { algorithms = ["gzip"], types = […], … }"#)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<RawCompress, E> {
                Ok(RawCompress::Switch(v))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<RawCompress, A::Error> {
                RawCompressTable::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|t| RawCompress::Table(Box::new(t)))
            }
        }
        d.deserialize_any(V)
    }
}

type Result<T> = std::result::Result<T, ConfigError>;

/// The `compress` of the table at `key` (a listener or a route) from its key `raw`, over
/// `inherited` (the listener's, for a route): none keeps what is inherited; `false` is off;
/// `true` is the inherited one, or the defaults; a table of its own takes the keys it leaves
/// out from the inherited one (nginx's inheritance of each `gzip_*` directive), or from the
/// defaults.
pub(super) fn validate(
    src: &Source,
    key: &str,
    raw: Option<&Spanned<RawCompress>>,
    inherited: Option<&Arc<Compress>>,
) -> Result<Option<Arc<Compress>>> {
    let Some(raw) = raw else {
        return Ok(inherited.cloned());
    };
    let key = format!("{key}.compress");
    let base = || inherited.map_or_else(Compress::default, |c| (**c).clone());
    Ok(match raw.get_ref() {
        RawCompress::Switch(false) => None,
        RawCompress::Switch(true) => Some(inherited.cloned().unwrap_or_default()),
        RawCompress::Table(t) => Some(Arc::new(table(src, &key, t, &base())?)),
    })
}

fn table(src: &Source, key: &str, t: &RawCompressTable, base: &Compress) -> Result<Compress> {
    let mut c = base.clone();
    if let Some(list) = &t.algorithms {
        let mut algorithms = Vec::with_capacity(3);
        for a in list.get_ref() {
            let Some(coding) = Coding::parse(a.get_ref()) else {
                return Err(src.at(
                    a.span(),
                    &format!("{key}.algorithms"),
                    format!(
                        "unknown algorithm \"{}\", expected \"gzip\", \"br\" or \"zstd\"",
                        a.get_ref()
                    ),
                ));
            };
            if algorithms.contains(&coding) {
                return Err(src.at(
                    a.span(),
                    &format!("{key}.algorithms"),
                    format!("\"{}\" is listed twice, expected each once", a.get_ref()),
                ));
            }
            algorithms.push(coding);
        }
        if algorithms.is_empty() {
            return Err(src.at(
                list.span(),
                &format!("{key}.algorithms"),
                "empty, expected at least one of \"gzip\", \"br\", \"zstd\" (or compress = false)",
            ));
        }
        c.algorithms = algorithms;
    }
    if let Some(list) = &t.types {
        let mut types = Vec::with_capacity(list.get_ref().len());
        for t in list.get_ref() {
            let v = t.get_ref().trim().to_ascii_lowercase();
            let valid = v == "*"
                || v.split_once('/').is_some_and(|(a, b)| {
                    let token = |s: &str| {
                        !s.is_empty()
                            && s.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b))
                    };
                    token(a) && (b == "*" || token(b))
                });
            if !valid {
                return Err(src.at(
                    t.span(),
                    &format!("{key}.types"),
                    format!(
                        "\"{}\" is not a media type, expected \"type/subtype\" (no parameters), \"type/*\" or \"*\"",
                        t.get_ref()
                    ),
                ));
            }
            types.push(v);
        }
        if types.is_empty() {
            return Err(src.at(
                list.span(),
                &format!("{key}.types"),
                "empty, expected at least one media type (or compress = false)",
            ));
        }
        c.types = types;
    }
    if let Some(v) = &t.min_length {
        c.min_length = u64::try_from(*v.get_ref()).map_err(|_| {
            src.at(
                v.span(),
                &format!("{key}.min_length"),
                format!(
                    "{} is negative, expected a length in bytes (0 or more)",
                    v.get_ref()
                ),
            )
        })?;
    }
    let level = |v: &Option<Spanned<i64>>, name: &str, range: std::ops::RangeInclusive<i64>| match v
    {
        None => Ok(None),
        Some(v) if range.contains(v.get_ref()) => Ok(Some(*v.get_ref())),
        Some(v) => Err(src.at(
            v.span(),
            &format!("{key}.{name}"),
            format!(
                "{} is out of range, expected a level from {} to {}",
                v.get_ref(),
                range.start(),
                range.end()
            ),
        )),
    };
    if let Some(l) = level(&t.gzip_level, "gzip_level", 1..=9)? {
        c.gzip_level = l as u32;
    }
    if let Some(l) = level(&t.br_level, "br_level", 0..=11)? {
        c.br_level = l as u32;
    }
    if let Some(l) = level(&t.zstd_level, "zstd_level", 1..=19)? {
        c.zstd_level = l as i32;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(types: &[&str]) -> Compress {
        Compress {
            types: types.iter().map(|t| t.to_string()).collect(),
            ..Compress::default()
        }
    }

    #[test]
    fn types_match_by_media_type_without_parameters_and_case() {
        let c = with(&["text/html", "application/json"]);
        assert!(c.takes_type(Some(b"text/html; charset=utf-8")));
        assert!(c.takes_type(Some(b"Application/JSON")));
        assert!(!c.takes_type(Some(b"text/htmlx")));
        assert!(!c.takes_type(Some(b"image/png")));
        assert!(!c.takes_type(None));
    }

    #[test]
    fn a_wildcard_subtype_matches_its_main_type_and_a_star_matches_everything() {
        let c = with(&["text/*"]);
        assert!(c.takes_type(Some(b"text/css")));
        assert!(!c.takes_type(Some(b"textual/css")));
        assert!(!c.takes_type(Some(b"text")));
        let all = with(&["*"]);
        assert!(all.takes_type(Some(b"image/png")));
        assert!(all.takes_type(None));
    }
}
