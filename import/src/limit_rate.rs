//! nginx's `limit_rate` and `limit_rate_after` as a route's keys of the same names (pinlb's
//! `limit_rate` module). Each is inherited on its own, from `http` to `server` to `location`,
//! as nginx's are, and a location gets what is in force there: a rate in bytes a second (nginx's
//! `k` and `m` are 1024s, as in any nginx size), and what is sent before it applies.
//! `limit_rate 0` is written too, where it turns off an outer level's.

use pinlb::config::raw::{RawRoute, Size};

use super::parse::Directive;
use super::values::spanned;

/// The directives this module reads, which the converter leaves to it.
pub(super) const NAMES: [&str; 2] = ["limit_rate", "limit_rate_after"];

/// The directives in force at a level: each the innermost one that sets it.
#[derive(Debug, Clone, Default)]
pub(super) struct Inherit {
    rate: Option<Directive>,
    after: Option<Directive>,
}

impl Inherit {
    pub fn level(&self, block: &[Directive]) -> Inherit {
        let mut out = self.clone();
        for d in block.iter().filter(|d| d.block.is_none()) {
            match d.name.as_str() {
                "limit_rate" => out.rate = Some(d.clone()),
                "limit_rate_after" => out.after = Some(d.clone()),
                _ => {}
            }
        }
        out
    }
}

/// Writes into `route` the `limit_rate` and `limit_rate_after` in force; nothing where no
/// rate is. A size nginx would refuse is a note, and the key is left out. `size` reads an
/// nginx size (`100k`), as the converter does.
pub(super) fn route(
    inherit: &Inherit,
    route: &mut RawRoute,
    notes: &mut Vec<String>,
    size: fn(&str) -> Option<u64>,
) {
    let Some(rate) = &inherit.rate else {
        return;
    };
    let mut bytes = |d: &Directive| match d.args.first().and_then(|v| size(v)) {
        Some(n) => Some(n),
        None => {
            super::notes::not_converted(notes, d, "a size (such as 100k)");
            None
        }
    };
    let Some(n) = bytes(rate) else { return };
    let keys = &mut route.modules.limit_rate;
    keys.limit_rate = Some(spanned(Size(n)));
    if let Some(after) = inherit
        .after
        .as_ref()
        .and_then(&mut bytes)
        .filter(|_| n > 0)
    {
        keys.limit_rate_after = Some(spanned(Size(after)));
    }
}
