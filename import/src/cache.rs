//! nginx's `proxy_cache` family as pinlb's `cache` module: each `proxy_cache_path … keys_zone=NAME`
//! as a `[cache.NAME]` zone, and the `proxy_cache*` directives in force at a location (each
//! inherited on its own, from `http` to `server` to `location`, as nginx's are) as its route's
//! `cache` table, with `add_header NAME $upstream_cache_status` as the table's
//! `status_header`.
//!
//! pinlb keeps its cache in memory: a zone's `max_size` is nginx's `max_size` (noted, since
//! nginx's is disk), 64 MiB without one. `proxy_cache_key`'s `$proxy_host` becomes `{host}`
//! (noted). A `proxy_no_cache` condition or a `proxy_cache_key` that does not convert is
//! refused: pinlb would store, or serve to every client, what nginx keeps apart.

use std::collections::BTreeMap;

use pinlb::config::raw::{Dur, RawRoute, Size};
use pinlb::modules::cache::zone::RawZone;
use pinlb::modules::cache::{RawCache, Switch};
use toml::Spanned;

use super::parse::Directive;
use super::values::spanned;

/// The directives this module reads at `http`, `server` and `location` levels, which the
/// converter leaves to it.
pub(super) const NAMES: [&str; 14] = [
    "proxy_cache",
    "proxy_cache_key",
    "proxy_cache_valid",
    "proxy_cache_lock",
    "proxy_cache_lock_timeout",
    "proxy_cache_use_stale",
    "proxy_cache_background_update",
    "proxy_cache_bypass",
    "proxy_no_cache",
    "proxy_cache_min_uses",
    "proxy_cache_methods",
    "proxy_ignore_headers",
    "proxy_cache_revalidate",
    "proxy_cache_path",
];

/// Whether `d` is `add_header NAME $upstream_cache_status`: the cache's `status_header`.
pub(super) fn is_status_header(d: &Directive) -> bool {
    d.name == "add_header" && d.args.get(1).is_some_and(|v| v == "$upstream_cache_status")
}

/// `[cache.NAME]` for each `proxy_cache_path` of the `http` block.
pub(super) fn zones(
    http: &[Directive],
    notes: &mut Vec<String>,
    size: fn(&str) -> Option<u64>,
) -> BTreeMap<String, RawZone> {
    let mut out = BTreeMap::new();
    for d in http.iter().filter(|d| d.name == "proxy_cache_path") {
        let params: BTreeMap<&str, &str> = (d.args.iter().skip(1))
            .filter_map(|a| a.split_once('='))
            .collect();
        let Some(name) = params
            .get("keys_zone")
            .map(|z| z.split(':').next().unwrap_or(z))
        else {
            super::notes::not_converted(notes, d, "keys_zone=NAME:SIZE");
            continue;
        };
        let max_size = params.get("max_size").and_then(|s| size(s));
        match max_size {
            Some(_) => {
                notes.push(format!(
                    "{}: proxy_cache_path max_size={}: pinlb keeps the zone {name} in memory, so this much memory (nginx's is disk)",
                    d.at(),
                    params.get("max_size").copied().unwrap_or_default()
                ));
            }
            None => notes.push(format!(
                "{}: proxy_cache_path without max_size: pinlb keeps the zone {name} in memory, 64 MiB by default ([cache.{name}] max_size)",
                d.at()
            )),
        }
        for dropped in [
            "inactive",
            "levels",
            "use_temp_path",
            "manager_files",
            "loader_files",
        ] {
            if params.contains_key(dropped) {
                notes.push(format!(
                    "{}: proxy_cache_path {dropped}= not converted: pinlb's zone is memory, evicted by size (S3-FIFO), not by age",
                    d.at()
                ));
            }
        }
        let zone = RawZone {
            max_size: max_size.map(|bytes| spanned(Size(bytes))),
            max_object: None,
        };
        out.insert(name.to_string(), zone);
    }
    out
}

/// The directives in force at a level: of each name, the lines of the innermost level that has
/// any (one for most; `proxy_cache_valid`, `proxy_cache_bypass` and `proxy_no_cache` may have
/// several, which add up, as nginx's array directives); and the innermost level's
/// `add_header … $upstream_cache_status` (nginx's `add_header`s are inherited all or none: a
/// level with any of its own drops the outer ones).
#[derive(Debug, Clone, Default)]
pub(super) struct Inherit {
    set: BTreeMap<String, Vec<Directive>>,
    status_header: Option<String>,
}

impl Inherit {
    pub fn level(&self, block: &[Directive]) -> Inherit {
        let mut out = self.clone();
        if block.iter().any(|d| d.name == "add_header") {
            out.status_header = None;
        }
        let plain = || block.iter().filter(|d| d.block.is_none());
        for name in NAMES.iter().filter(|n| **n != "proxy_cache_path") {
            let lines: Vec<Directive> = plain().filter(|d| d.name == *name).cloned().collect();
            if !lines.is_empty() {
                out.set.insert(name.to_string(), lines);
            }
        }
        if let Some(d) = plain().rfind(|d| is_status_header(d)) {
            out.status_header = d.args.first().cloned();
        }
        out
    }

    /// The innermost line of `name` in force.
    fn get(&self, name: &str) -> Option<&Directive> {
        self.set.get(name)?.last()
    }

    /// Every line of `name` in force.
    fn all(&self, name: &str) -> &[Directive] {
        self.set.get(name).map_or(&[], Vec::as_slice)
    }
}

/// Writes into `route` the `cache` table in force; nothing where `proxy_cache` is off.
pub(super) fn route(
    inherit: &Inherit,
    route: &mut RawRoute,
    (notes, refused): (&mut Vec<String>, &mut Vec<String>),
) {
    let Some(on) = inherit.get("proxy_cache") else {
        return;
    };
    let zone = on.args.first().map(String::as_str).unwrap_or("off");
    if zone == "off" {
        return;
    }
    if zone.contains('$') {
        return super::notes::not_converted(notes, on, "a zone's name (not a variable)");
    }
    let mut t = RawCache {
        zone: Some(spanned(zone.to_string())),
        ..RawCache::default()
    };
    let get = |name: &str| inherit.get(name);
    if let Some(d) = get("proxy_cache_key") {
        let text = d.args.join(" ").replace("$proxy_host", "$host");
        match super::template::template(&text) {
            Some(key) => {
                if d.args.iter().any(|a| a.contains("$proxy_host")) {
                    notes.push(format!(
                        "{}: proxy_cache_key's $proxy_host became {{host}}: the request's Host, not the upstream's name",
                        d.at()
                    ));
                }
                t.key = Some(spanned(key));
            }
            // The default key would share among clients what nginx keeps apart (a key of
            // `$cookie_session`, say): refused, and the route left without a cache.
            None => {
                refused.push(format!(
                    "{}: proxy_cache_key {} not converted: only $scheme, $host, $request_uri, $uri, $args and $remote_addr convert; pinlb's key without the rest would serve one client's responses to another",
                    d.at(),
                    d.args.join(" ")
                ));
                return;
            }
        }
    }
    let valid = valid(inherit, notes);
    if !valid.is_empty() {
        t.valid = Some(valid);
    }
    if let Some(d) = get("proxy_cache_lock") {
        // Off is nginx's default; pinlb's is on, which changes only how many misses reach
        // the backend at once.
        t.lock = Some(spanned(d.args.first().is_some_and(|a| a == "on")));
    }
    if let Some(d) = get("proxy_cache_lock_timeout") {
        match d.args.first().and_then(|v| super::values::dur(v)) {
            Some(v) => t.lock_timeout = Some(spanned(v)),
            None => super::notes::not_converted(notes, d, "a duration"),
        }
    }
    let mut updating = false;
    if let Some(d) = get("proxy_cache_use_stale") {
        let mut list = Vec::new();
        for a in &d.args {
            match a.as_str() {
                "off" => list.clear(),
                "error" | "timeout" | "updating" | "http_500" | "http_502" | "http_503"
                | "http_504" | "http_403" | "http_404" | "http_429" => {
                    updating |= a == "updating";
                    list.push(spanned(a.clone()));
                }
                other => notes.push(format!(
                    "{}: proxy_cache_use_stale {other} not converted: pinlb has no such case",
                    d.at()
                )),
            }
        }
        if !list.is_empty() {
            t.use_stale = Some(spanned(list));
        }
    }
    if let Some(d) = get("proxy_cache_background_update") {
        match (d.args.first().is_some_and(|a| a == "on"), updating) {
            (true, true) => t.background_update = Some(spanned(true)),
            (true, false) => notes.push(format!(
                "{}: proxy_cache_background_update on not converted: without proxy_cache_use_stale updating it serves nothing stale",
                d.at()
            )),
            (false, _) => {}
        }
    }
    if let Some(d) = get("proxy_cache_revalidate") {
        t.revalidate = Some(spanned(d.args.first().is_some_and(|a| a == "on")));
    }
    for (directive, key) in [
        ("proxy_cache_bypass", "bypass"),
        ("proxy_no_cache", "no_cache"),
    ] {
        let mut list = Vec::new();
        for (d, a) in inherit
            .all(directive)
            .iter()
            .flat_map(|d| d.args.iter().map(move |a| (d, a)))
        {
            match condition(a) {
                Some(c) => list.push(spanned(c)),
                None if key == "no_cache" => refused.push(format!(
                    "{}: proxy_no_cache {a} not converted: only $http_NAME, $cookie_NAME and $arg_NAME convert; without it pinlb would store responses nginx keeps from other clients",
                    d.at()
                )),
                None => notes.push(format!(
                    "{}: proxy_cache_bypass {a} not converted: only $http_NAME, $cookie_NAME and $arg_NAME convert",
                    d.at()
                )),
            }
        }
        if !list.is_empty() {
            let field = match key {
                "bypass" => &mut t.bypass,
                _ => &mut t.no_cache,
            };
            *field = Some(spanned(list));
        }
    }
    if let Some(d) = get("proxy_cache_min_uses") {
        match d
            .args
            .first()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|n| *n >= 1)
        {
            Some(n) => t.min_uses = Some(spanned(n)),
            None => super::notes::not_converted(notes, d, "a number, 1 or more"),
        }
    }
    if let Some(d) = get("proxy_cache_methods") {
        if d.args.iter().any(|m| m.eq_ignore_ascii_case("POST")) {
            notes.push(format!(
                "{}: proxy_cache_methods POST not converted: pinlb caches GET and HEAD only (a key of the URL can't tell POSTs apart)",
                d.at()
            ));
        }
    }
    if let Some(d) = get("proxy_ignore_headers") {
        let mut list = Vec::new();
        for h in &d.args {
            match h.to_ascii_lowercase().as_str() {
                "cache-control" | "expires" | "set-cookie" | "vary" => {
                    list.push(spanned(h.clone()))
                }
                // pinlb reads neither header.
                "x-accel-expires" | "x-accel-redirect" | "x-accel-limit-rate"
                | "x-accel-buffering" | "x-accel-charset" => {}
                _ => notes.push(format!(
                    "{}: proxy_ignore_headers {h} not converted",
                    d.at()
                )),
            }
        }
        if !list.is_empty() {
            t.ignore_headers = Some(spanned(list));
        }
    }
    if let Some(h) = &inherit.status_header {
        t.status_header = Some(spanned(h.clone()));
    }
    route.modules.cache.cache = Some(spanned(Switch::On(Box::new(t))));
}

/// `proxy_cache_valid`'s lines in force, as `valid`'s table: `proxy_cache_valid 10m` is 200,
/// 301 and 302; `any` is every other status.
fn valid(inherit: &Inherit, notes: &mut Vec<String>) -> BTreeMap<Spanned<String>, Spanned<Dur>> {
    let mut out = BTreeMap::new();
    for d in inherit.all("proxy_cache_valid") {
        let Some((time, codes)) = d.args.split_last() else {
            continue;
        };
        let Some(time) = super::values::dur(time) else {
            super::notes::not_converted(notes, d, "statuses and a duration");
            continue;
        };
        let codes = match codes {
            [] => "200 301 302".to_string(),
            list => list.join(" "),
        };
        out.insert(spanned(codes), spanned(time));
    }
    out
}

/// `$http_x_refresh` → `header:x-refresh`, `$cookie_NAME`, `$arg_NAME`; `None` for another.
fn condition(var: &str) -> Option<String> {
    let name = var.strip_prefix('$')?;
    let (kind, rest) = if let Some(h) = name.strip_prefix("http_") {
        ("header", h.replace('_', "-"))
    } else if let Some(c) = name.strip_prefix("cookie_") {
        ("cookie", c.to_string())
    } else {
        ("arg", name.strip_prefix("arg_")?.to_string())
    };
    let plain = !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain.then(|| format!("{kind}:{rest}"))
}
