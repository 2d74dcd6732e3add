//! nginx's gzip module (`gzip`, `gzip_types`, `gzip_min_length`, `gzip_comp_level`, and the
//! others) as a route's `compress`.
//!
//! Each directive is inherited on its own, from `http` to `server` to `location`, as nginx's
//! are; a proxying location where the result is `gzip on` gets `compress = { algorithms =
//! ["gzip"], … }` (gzip alone: what nginx sends), its types with `text/html`, which nginx's
//! `gzip_types` always includes. What pinlb does differently is a note: it compresses
//! requests that came through a proxy (`Via`) as `gzip_proxied any` does, adds `Vary` as
//! `gzip_vary on` does, and leaves HTTP/1.0 clients alone as `gzip_http_version 1.1` does;
//! `gzip_buffers`, `gzip_disable`, `gzip_window`, `gzip_hash` have no pinlb key.

use pinlb::config::raw::RawRoute;
use pinlb::modules::compress::{RawCompress, RawCompressTable};

use super::parse::Directive;
use super::values::spanned;

/// The directives this module reads, which the converter leaves to it.
pub(super) const NAMES: [&str; 11] = [
    "gzip",
    "gzip_types",
    "gzip_min_length",
    "gzip_comp_level",
    "gzip_vary",
    "gzip_proxied",
    "gzip_http_version",
    "gzip_buffers",
    "gzip_disable",
    "gzip_window",
    "gzip_hash",
];

/// The gzip directives in force at a level: each the innermost one that sets it.
#[derive(Debug, Clone, Default)]
pub(super) struct Inherit {
    on: Option<Directive>,
    types: Option<Directive>,
    min_length: Option<Directive>,
    level: Option<Directive>,
}

impl Inherit {
    pub fn level(&self, block: &[Directive]) -> Inherit {
        let mut out = self.clone();
        for d in block.iter().filter(|d| d.block.is_none()) {
            let slot = match d.name.as_str() {
                "gzip" => &mut out.on,
                "gzip_types" => &mut out.types,
                "gzip_min_length" => &mut out.min_length,
                "gzip_comp_level" => &mut out.level,
                _ => continue,
            };
            *slot = Some(d.clone());
        }
        out
    }
}

/// What `d` (one of [`NAMES`]) leaves out, as a note; nothing for what converts whole.
pub(super) fn note(d: &Directive, notes: &mut Vec<String>) {
    let arg = d.args.first().map(String::as_str).unwrap_or_default();
    let why = match d.name.as_str() {
        "gzip_proxied" if arg == "any" => return,
        "gzip_proxied" => {
            "pinlb compresses every request's response, those with a Via header too (nginx's gzip_proxied any)"
        }
        "gzip_vary" if arg == "on" => return,
        "gzip_vary" => {
            "pinlb always adds Vary: Accept-Encoding to the responses it may compress (nginx's gzip_vary on)"
        }
        "gzip_http_version" if arg == "1.1" => return,
        "gzip_http_version" => {
            "pinlb compresses for HTTP/1.1 and HTTP/2 clients only (nginx's gzip_http_version 1.1)"
        }
        "gzip_buffers" => {
            "pinlb's output per stream is bounded by its own 16 KiB (docs/behaviour.md)"
        }
        "gzip_disable" => "pinlb compresses for every User-Agent that accepts gzip",
        "gzip_window" | "gzip_hash" => {
            "pinlb uses zlib's full window and memLevel 8 (nginx's defaults)"
        }
        _ => return,
    };
    notes.push(format!("{}: {} not converted: {why}", d.at(), d.name));
}

/// `route`'s `compress` from the gzip directives in force at its location; nothing when gzip
/// is off there. A value nginx would refuse is a note, and its key keeps pinlb's default.
/// `size` reads an nginx size (`1k`), as the converter does.
pub(super) fn route(
    inherit: &Inherit,
    route: &mut RawRoute,
    notes: &mut Vec<String>,
    size: fn(&str) -> Option<u64>,
) {
    if inherit
        .on
        .as_ref()
        .and_then(|d| d.args.first())
        .map(String::as_str)
        != Some("on")
    {
        return;
    }
    let mut bad = |d: &Directive, expected: &str| super::notes::not_converted(notes, d, expected);
    let mut types = vec!["text/html".to_string()];
    if let Some(d) = &inherit.types {
        for t in &d.args {
            let t = t.to_ascii_lowercase();
            if t == "*" {
                types = vec!["*".into()];
                break;
            }
            if !types.contains(&t) {
                types.push(t);
            }
        }
    }
    // nginx's default, 20, is pinlb's too; written out so the file says what it does.
    let mut min_length = 20;
    if let Some(d) = &inherit.min_length {
        match d.args.first().and_then(|n| size(n)) {
            Some(n) => min_length = i64::try_from(n).unwrap_or(i64::MAX),
            None => bad(d, "a length in bytes (such as 256 or 1k)"),
        }
    }
    let mut level = 1;
    if let Some(d) = &inherit.level {
        match d.args.first().and_then(|n| n.parse::<i64>().ok()) {
            Some(n) if (1..=9).contains(&n) => level = n,
            _ => bad(d, "a level from 1 to 9"),
        }
    }
    let list = |v: Vec<String>| Some(spanned(v.into_iter().map(spanned).collect()));
    let compress = RawCompressTable {
        algorithms: list(vec!["gzip".into()]),
        types: list(types),
        min_length: Some(spanned(min_length)),
        gzip_level: Some(spanned(level)),
        ..RawCompressTable::default()
    };
    let compress = RawCompress::Table(Box::new(compress));
    route.modules.compress.compress = Some(spanned(compress));
}
