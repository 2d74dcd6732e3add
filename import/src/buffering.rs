//! nginx's buffering directives as an upstream's `[buffering]` table. nginx buffers both bodies
//! unless told not to (`proxy_request_buffering on`, `proxy_buffering on` are its defaults), and
//! pinlb only with the table, so every upstream a location proxies to gets one, with
//! `request`/`response = false` where the location (or the server, or `http`) turns one off,
//! and no table where both are off. A FastCGI location reads the `fastcgi_` directives of the
//! same names instead (`fastcgi_buffering`, `fastcgi_request_buffering`, ...), as nginx does.
//!
//! pinlb buffers per upstream, nginx per location: locations that proxy to the same upstream
//! with different settings get the first one's, and a note at the other.
//! `proxy_max_temp_file_size` becomes `max_temp`; `proxy_temp_path` and
//! `client_body_temp_path` (pinlb has one directory for both) become `temp_dir`. nginx's buffer
//! sizes (`proxy_buffers`, `client_body_buffer_size`) are not read: pinlb has one `memory` bound.

use pinlb::config::raw::{RawUpstream, Size};
use pinlb::modules::buffering::Raw;

use super::parse::Directive;
use super::values::spanned;

/// The directives read here; each inherits from the nearest level that sets it. The
/// `fastcgi_` ones are a FastCGI location's, as the `proxy_` ones are a proxying one's.
pub(super) const NAMES: [&str; 9] = [
    "proxy_buffering",
    "proxy_request_buffering",
    "proxy_max_temp_file_size",
    "proxy_temp_path",
    "client_body_temp_path",
    "fastcgi_buffering",
    "fastcgi_request_buffering",
    "fastcgi_max_temp_file_size",
    "fastcgi_temp_path",
];

/// The buffering directives in force at a level: the nearest of each name.
#[derive(Debug, Clone, Default)]
pub(super) struct Inherited {
    set: Vec<Directive>,
}

impl Inherited {
    /// What a block's own directives make of what it inherits.
    pub(super) fn level(&self, block: &[Directive]) -> Inherited {
        let mut out = self.clone();
        for d in block.iter().filter(|d| d.block.is_none()) {
            if NAMES.contains(&d.name.as_str()) {
                out.set.retain(|s| s.name != d.name);
                out.set.push(d.clone());
            }
        }
        out
    }

    fn get(&self, name: &str) -> Option<&Directive> {
        self.set.iter().find(|d| d.name == name)
    }

    /// The `[buffering]` table these make for a `kind` (`proxy` or `fastcgi`) location, or
    /// `None` when both directions are off.
    fn table(
        &self,
        kind: &str,
        conf_dir: &std::path::Path,
        size: fn(&str) -> Option<u64>,
        notes: &mut Vec<String>,
    ) -> Option<Raw> {
        let on = |name: &str| {
            self.get(&format!("{kind}_{name}"))
                .is_none_or(|d| d.args.first().map(String::as_str) != Some("off"))
        };
        let (request, response) = (on("request_buffering"), on("buffering"));
        if !request && !response {
            return None;
        }
        let mut t = Raw {
            request: Some(spanned(request)),
            response: Some(spanned(response)),
            ..Raw::default()
        };
        if let Some(d) = self.get(&format!("{kind}_max_temp_file_size")) {
            match d.args.first().and_then(|s| size(s)) {
                Some(v) => t.max_temp = Some(spanned(Size(v.min(i64::MAX as u64)))),
                None => notes.push(format!("{}: {} not converted: not a size", d.at(), d.name)),
            }
        }
        let dir = self
            .get(&format!("{kind}_temp_path"))
            .or_else(|| self.get("client_body_temp_path"));
        if let Some(path) = dir.and_then(|d| d.args.first()) {
            let path = conf_dir.join(path);
            t.temp_dir = Some(spanned(path.display().to_string()));
        }
        Some(t)
    }
}

/// The upstreams whose `[buffering]` is decided, by the first location that proxies to each.
pub(super) type Decided = std::collections::BTreeSet<String>;

/// Writes the `[buffering]` table of upstream `name` for a location that proxies to it, from
/// what is in force there (`at` is its `proxy_pass`); where an earlier location decided it
/// differently, that stays, with a note. `kind` is `proxy` or `fastcgi`: which directives apply.
pub(super) fn apply(
    kind: &str,
    inherited: &Inherited,
    (name, upstream): (&str, &mut RawUpstream),
    decided: &mut Decided,
    at: &Directive,
    (conf_dir, size): (&std::path::Path, fn(&str) -> Option<u64>),
    notes: &mut Vec<String>,
) {
    let table = inherited.table(kind, conf_dir, size, notes);
    if decided.insert(name.to_string()) {
        if let Some(t) = table {
            upstream.buffering = Some(spanned(t));
        }
        return;
    }
    if upstream.buffering.as_ref().map(|b| b.get_ref()) != table.as_ref() {
        notes.push(format!(
            "{}: {}: this location buffers differently from an earlier one to the same upstream; pinlb buffers per upstream and keeps the earlier one's",
            at.at(),
            at.name
        ));
    }
}
