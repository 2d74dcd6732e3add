//! nginx's `mirror URI` as a route's `mirror = { upstream = … }` (pinlb's `mirror` module).
//! nginx mirrors to a URI, which a location of the server (usually `location = /mirror {
//! internal; proxy_pass http://canary$request_uri; }`) sends on: such a location is read here as
//! the mirror's upstream and is not a route of its own. `mirror off` is nothing;
//! `mirror_request_body off` is the mirror's `body = false` (on, nginx's default, is pinlb's).

use std::collections::BTreeMap;

use pinlb::config::raw::RawRoute;
use pinlb::modules::mirror::RawMirror;

use super::parse::Directive;
use super::values::spanned;

/// The directives this module reads.
pub(super) const NAMES: [&str; 2] = ["mirror", "mirror_request_body"];

/// A server's mirror targets: each internal location's URI and the upstream (or address) its
/// `proxy_pass` names, with the location's line.
#[derive(Debug, Default)]
pub(super) struct Targets(BTreeMap<String, (String, usize)>);

impl Targets {
    /// The internal locations of `locations` that some location's `mirror` names.
    pub fn of(locations: &[&Directive]) -> Targets {
        let named: Vec<&str> = (locations.iter())
            .flat_map(|l| l.block.as_deref().unwrap_or_default())
            .filter(|d| d.name == "mirror")
            .filter_map(|d| d.args.first().map(String::as_str))
            .filter(|uri| *uri != "off")
            .collect();
        let mut out = BTreeMap::new();
        for l in locations {
            let Some(uri) = l.args.last() else { continue };
            let block = l.block.as_deref().unwrap_or_default();
            let internal = block.iter().any(|d| d.name == "internal");
            if !internal || !named.contains(&uri.as_str()) {
                continue;
            }
            let target = block
                .iter()
                .find(|d| d.name == "proxy_pass")
                .and_then(|d| d.args.first())
                .and_then(|u| upstream_of(u));
            if let Some(upstream) = target {
                out.insert(uri.clone(), (upstream, l.line));
            }
        }
        Targets(out)
    }

    /// Whether `l` is a mirror target, converted as its mirror's upstream, not as a route.
    pub fn is_target(&self, l: &Directive) -> bool {
        l.args
            .last()
            .and_then(|uri| self.0.get(uri))
            .is_some_and(|(_, line)| *line == l.line)
    }

    /// The upstreams the targets name, for the converter to make where they are plain
    /// addresses.
    pub fn upstreams(&self) -> impl Iterator<Item = &str> {
        self.0.values().map(|(u, _)| u.as_str())
    }

    /// A location's `mirror` (and `mirror_request_body`) into `route`; `Err` with why when
    /// its URI is no internal location that proxies somewhere.
    pub fn route<'b>(
        &self,
        block: &'b [Directive],
        route: &mut RawRoute,
    ) -> Result<(), (&'b Directive, String)> {
        let Some(d) = block.iter().find(|d| d.name == "mirror") else {
            return Ok(());
        };
        let Some(uri) = d.args.first().filter(|u| *u != "off") else {
            return Ok(());
        };
        let Some((upstream, _)) = self.0.get(uri) else {
            return Err((
                d,
                format!(
                    "{uri} is not an internal location of the server whose proxy_pass names an upstream or address"
                ),
            ));
        };
        let body = block.iter().find(|d| d.name == "mirror_request_body");
        let off = body.is_some_and(|b| b.args.first().is_some_and(|a| a == "off"));
        let mirror = RawMirror {
            upstream: Some(spanned(upstream.clone())),
            body: off.then_some(false),
            ..RawMirror::default()
        };
        route.modules.mirror.mirror = Some(spanned(mirror));
        Ok(())
    }
}

/// The upstream (or `host:port`) of a mirror location's `proxy_pass http://NAME$request_uri`.
fn upstream_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let end = rest.find(['/', '$']).unwrap_or(rest.len());
    let name = &rest[..end];
    (!name.is_empty() && !name.starts_with("unix:")).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_locations_proxy_pass_names_its_upstream() {
        assert_eq!(
            upstream_of("http://canary$request_uri").as_deref(),
            Some("canary")
        );
        assert_eq!(
            upstream_of("http://127.0.0.1:9000/m").as_deref(),
            Some("127.0.0.1:9000")
        );
        assert_eq!(upstream_of("http://unix:/run/a.sock"), None);
        assert_eq!(upstream_of("https://canary"), None);
    }
}
