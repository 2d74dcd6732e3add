//! Locations that serve files (`root`, `alias`, `try_files`, or nothing at all: nginx's
//! default content is the file at the path), which pinlb can't: each becomes a route that
//! answers 404, and its note says where its requests would go without that route.
//!
//! **Why 404 by default.** Without a route of its own, a request for `/static/app.css` would
//! take the next route that matches, usually `location /`'s: it would reach the application
//! under that route's rate limit, access rules and compression, none of which nginx applied to
//! it, and a backend that has no such file answers its own 404 (or, worse, something else).
//! An nginx user reads the configuration as "the backend never sees /static/": the 404 route
//! keeps that true, fails visibly (the first missing stylesheet says so), and keeps the
//! location's own access rules and rate limits, which nginx checks before looking for a file.
//! Where the backend does serve those paths (Express's `static`), deleting the route sends
//! them to the route the note names.
//!
//! A location whose content does not convert (a `grpc_pass`, a `proxy_pass` with variables)
//! is no route at all: its note says which route takes its requests instead.

use pinlb::config::raw::{OneOrMany, RawRespond, RawRoute};
use pinlb::modules::compress::RawCompress;
use toml::Spanned;

use super::parse::Directive;
use super::values::text;

/// nginx's content handlers (the modules that answer a request instead of its file) and
/// `return`: a location with none of them serves files.
const CONTENT: [&str; 11] = [
    "proxy_pass",
    "fastcgi_pass",
    "grpc_pass",
    "uwsgi_pass",
    "scgi_pass",
    "memcached_pass",
    "return",
    "empty_gif",
    "stub_status",
    "js_content",
    "perl",
];

/// Whether a location's `block` serves files: no content handler, and no `return`.
pub(super) fn serves_files(block: &[Directive]) -> bool {
    !block.iter().any(answers)
}

/// Whether `d` answers a location's requests instead of its files ([`CONTENT`]).
pub(super) fn answers(d: &Directive) -> bool {
    CONTENT.contains(&d.name.as_str())
}

/// A location left out, for the note that says where its requests go, written once its
/// listener's routes are known.
#[derive(Debug, Clone)]
pub(super) struct Left {
    /// `location ARGS`.
    pub location: Directive,
    /// Why it is left out: `it serves files (root /var/www)`.
    pub why: String,
    /// For a location that serves files, its route's index in its server's routes: the route
    /// that answers 404.
    pub route: Option<usize>,
}

impl Left {
    /// `location`, left out for `why`; its route, if any, is placed later.
    pub fn new(location: &Directive, why: String) -> Left {
        Left {
            location: location.clone(),
            why,
            route: None,
        }
    }

    /// A request path the location takes, to find the route that would take it instead;
    /// `None` for a regex location.
    fn sample(&self) -> Option<&str> {
        match self.location.args.as_slice() {
            [m, path] if m == "=" || m == "^~" => Some(path),
            [path] => Some(path),
            _ => None,
        }
    }

    /// Where its requests go among `routes` (in order; `own`, the index of its own route
    /// there, left out): the first that matches its path, else `otherwise`.
    pub fn destination(&self, routes: &[RawRoute], own: Option<usize>, otherwise: &str) -> String {
        let Some(sample) = self.sample() else {
            return "whichever other route matches each of them (a regex has no one path to try)"
                .into();
        };
        let taken = (routes.iter().enumerate())
            .filter(|(i, _)| Some(*i) != own)
            .find(|(_, r)| matches(r, sample));
        match taken {
            Some((_, r)) => describe(r),
            None => otherwise.to_string(),
        }
    }

    /// The location as the note names it: `location /static/`.
    pub fn name(&self) -> String {
        format!("location {}", self.location.args.join(" "))
    }
}

/// Whether route `r` takes a request for `path` (a location's own path, as a sample of its
/// requests).
fn matches(r: &RawRoute, path: &str) -> bool {
    if let Some(p) = text(&r.path) {
        return path.starts_with(p);
    }
    if let Some(p) = text(&r.path_exact) {
        return path == p;
    }
    if let Some(re) = text(&r.path_regex) {
        return regex::Regex::new(re).is_ok_and(|re| re.is_match(path));
    }
    true
}

/// A route as a note names it: `route / → upstream node (rate_limit zone api, compress gzip)`,
/// or its redirect or fixed answer.
pub(super) fn describe(r: &RawRoute) -> String {
    let path = match (text(&r.path), text(&r.path_exact), text(&r.path_regex)) {
        (Some(p), ..) => p.to_string(),
        (_, Some(p), _) => format!("= {p}"),
        (.., Some(re)) => format!("~ {re}"),
        _ => "/".to_string(),
    };
    let hosts = match r.host.as_ref().map(|h| h.get_ref()) {
        Some(OneOrMany::One(h)) => vec![h.clone()],
        Some(OneOrMany::Many(hosts)) => hosts.clone(),
        None => Vec::new(),
    };
    let host = match hosts.is_empty() {
        true => String::new(),
        false => format!(" of {}", hosts.join(" ")),
    };
    let action = match (text(&r.upstream), &r.redirect, &r.respond) {
        (Some(u), ..) => format!("upstream {u}"),
        (_, Some(rd), _) => format!("redirect {}", rd.get_ref().location.get_ref()),
        (.., Some(rs)) => format!("respond {}", rs.get_ref().status.get_ref()),
        _ => "nothing".to_string(),
    };
    let mut under = Vec::new();
    if let Some(limits) = &r.rate_limit {
        let zones: Vec<&str> = (limits.get_ref().iter())
            .map(|z| z.get_ref().zone.get_ref().as_str())
            .collect();
        if !zones.is_empty() {
            under.push(format!("rate_limit zone {}", zones.join(", ")));
        }
    }
    let access = &r.modules.access;
    if access.access.is_some() {
        under.push("its access rules".into());
    }
    if access.auth_basic.is_some() {
        under.push("auth_basic".into());
    }
    if let Some(c) = &r.modules.compress.compress {
        let algorithms: Vec<&str> = match c.get_ref() {
            RawCompress::Table(t) => (t.algorithms.iter())
                .flat_map(|a| a.get_ref())
                .map(|a| a.get_ref().as_str())
                .collect(),
            RawCompress::Switch(_) => Vec::new(),
        };
        under.push(format!("compress {}", algorithms.join(", ")));
    }
    let under = match under.is_empty() {
        true => String::new(),
        false => format!(" ({})", under.join(", ")),
    };
    format!("route {path}{host} → {action}{under}")
}

/// The 404 a route for a location that serves files answers with (nginx's answer to a path
/// with no file, so the server's `error_page 404` applies as it would in nginx).
pub(super) fn respond() -> Spanned<RawRespond> {
    super::values::respond(404, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::spanned;
    use pinlb::modules::compress::RawCompressTable;

    fn route(text: &str) -> RawRoute {
        toml::from_str(text).unwrap()
    }

    fn left(args: &[&str], route: Option<usize>) -> Left {
        Left {
            location: Directive {
                name: "location".into(),
                args: args.iter().map(|a| a.to_string()).collect(),
                block: Some(Vec::new()),
                file: "nginx.conf".into(),
                line: 9,
            },
            why: String::new(),
            route,
        }
    }

    #[test]
    fn a_file_location_s_requests_go_to_the_first_other_route_that_takes_its_path() {
        let mut whole = route(
            "path = \"/\"\nupstream = \"node\"\nrate_limit = [{ zone = \"api\", burst = 20 }]",
        );
        let gzip = RawCompressTable {
            algorithms: Some(spanned(vec![spanned("gzip".into())])),
            ..RawCompressTable::default()
        };
        whole.modules.compress.compress = Some(spanned(RawCompress::Table(Box::new(gzip))));
        let routes = [
            route("path = \"/static/\"\nrespond = { status = 404 }"),
            route("path_exact = \"/static\"\nupstream = \"x\""),
            route("path_regex = '\\.php$'\nupstream = \"php\""),
            whole,
        ];
        let l = left(&["/static/"], Some(0));
        assert_eq!(
            l.destination(&routes, Some(0), "no route"),
            "route / → upstream node (rate_limit zone api, compress gzip)"
        );
        assert_eq!(
            left(&["=", "/x.php"], None).destination(&routes, None, "no route"),
            "route ~ \\.php$ → upstream php"
        );
        assert_eq!(
            l.destination(&routes[..3], Some(0), "no route (404)"),
            "no route (404)"
        );
        // Another server's routes: its own index means nothing there.
        assert_eq!(
            l.destination(&routes[3..], None, "no route"),
            "route / → upstream node (rate_limit zone api, compress gzip)"
        );
        assert!(
            left(&["~", "\\.css$"], None)
                .destination(&routes, None, "")
                .starts_with("whichever other route")
        );
    }

    #[test]
    fn a_location_serves_files_unless_something_answers_in_it() {
        let d = |name: &str| Directive {
            name: name.into(),
            args: Vec::new(),
            block: None,
            file: "nginx.conf".into(),
            line: 1,
        };
        assert!(serves_files(&[d("root"), d("expires")]));
        assert!(serves_files(&[]));
        assert!(!serves_files(&[d("root"), d("proxy_pass")]));
        assert!(!serves_files(&[d("return")]));
    }
}
