//! A listener's routes compiled for matching: one lookup by host, then the few routes that can
//! match that host, in file order. Built once per configuration generation; matching a request
//! allocates nothing unless its path needs normalising.

use std::collections::HashMap;

use crate::config::{HostPattern, RouteRule};
use crate::http1::path::normalize;
use crate::http1::request::RequestHead;
pub use crate::http1::request::host_without_port;

/// The longest Host name matched by table lookup; a longer one (no DNS name is) matches only
/// routes for any host.
const MAX_HOST: usize = 255;

/// Routes by the hosts they can match. Each list holds, in file order, every route that can
/// match such a host (its own names, wildcards that cover it, and routes for any host), so a
/// request scans one short list.
#[derive(Debug, Default)]
pub struct Router {
    routes: Vec<RouteRule>,
    /// Exact host names (lower-case).
    exact: HashMap<Box<[u8]>, Vec<u32>>,
    /// Wildcard suffixes (`.example.com`), longest first: the first that matches is the most
    /// specific, and its list includes every shorter wildcard that also matches.
    wildcards: Vec<(Box<[u8]>, Vec<u32>)>,
    /// Hosts matched by no name or wildcard, and requests without Host.
    any: Vec<u32>,
}

impl Router {
    pub fn new(routes: Vec<RouteRule>) -> Router {
        let index = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        let hostless = |r: &RouteRule| r.hosts.is_empty();
        let mut exact: HashMap<Box<[u8]>, Vec<u32>> = HashMap::new();
        let mut suffixes: Vec<Box<[u8]>> = Vec::new();
        for r in &routes {
            for h in &r.hosts {
                match h {
                    HostPattern::Exact(name) => {
                        exact.entry(name.as_bytes().into()).or_default();
                    }
                    HostPattern::Suffix(s) => suffixes.push(s.as_bytes().into()),
                }
            }
        }
        for (name, list) in exact.iter_mut() {
            *list = (0..routes.len())
                .filter(|&i| {
                    hostless(&routes[i]) || routes[i].hosts.iter().any(|h| h.matches(name))
                })
                .map(index)
                .collect();
        }
        suffixes.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        suffixes.dedup();
        let wildcards = suffixes
            .into_iter()
            .map(|suffix| {
                // A host under this suffix matches every wildcard whose suffix ends this one.
                let list = (0..routes.len())
                    .filter(|&i| {
                        hostless(&routes[i])
                            || routes[i].hosts.iter().any(|h| match h {
                                HostPattern::Suffix(t) => suffix.ends_with(t.as_bytes()),
                                HostPattern::Exact(_) => false,
                            })
                    })
                    .map(index)
                    .collect();
                (suffix, list)
            })
            .collect();
        let any = (0..routes.len())
            .filter(|&i| hostless(&routes[i]))
            .map(index)
            .collect();
        Router {
            routes,
            exact,
            wildcards,
            any,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The first route that matches `head`, with the normalised path it matched.
    pub fn find<'h>(
        &self,
        head: &'h RequestHead,
    ) -> Option<(usize, &RouteRule, std::borrow::Cow<'h, [u8]>)> {
        let mut lower = [0u8; MAX_HOST];
        let host = head.host().map(host_name).and_then(|h| {
            let out = lower.get_mut(..h.len())?;
            for (o, b) in out.iter_mut().zip(h) {
                *o = b.to_ascii_lowercase();
            }
            Some(&*out)
        });
        let candidates = match host {
            Some(h) => self
                .exact
                .get(h)
                .or_else(|| {
                    self.wildcards
                        .iter()
                        .find(|(s, _)| h.len() > s.len() && h.ends_with(s))
                        .map(|(_, list)| list)
                })
                .unwrap_or(&self.any),
            None => &self.any,
        };
        if candidates.is_empty() {
            return None;
        }
        let path = normalize(head.path());
        let index = candidates.iter().map(|&i| i as usize).find(|&i| {
            let r = &self.routes[i];
            r.path.matches(&path)
                && (r.methods.is_empty() || r.methods.contains(&head.method))
                && r.headers
                    .iter()
                    .all(|(name, value)| head.header_values(name).any(|v| v == value.as_bytes()))
        })?;
        Some((index, &self.routes[index], path))
    }
}

/// The name a Host value matches routes by: without its port, and without the root dot of a
/// fully qualified name (`example.com.:80` → `example.com`), which names the same host (nginx
/// strips it before matching `server_name` too). One dot only: `example.com..` is no name.
fn host_name(host: &[u8]) -> &[u8] {
    let name = host_without_port(host);
    name.strip_suffix(b".").unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use bytes::BytesMut;

    fn router(routes: &str) -> Router {
        let text = format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\n{routes}\n[upstream.a]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n[upstream.b]\nbackends = [{{ address = \"127.0.0.1:9002\" }}]\n"
        );
        let config = Config::parse("t.toml", &text, &[0]).unwrap();
        Router::new(config.listeners[0].routes.clone())
    }

    /// Which route (by index) a request matches.
    fn which(r: &Router, request: &str) -> Option<usize> {
        let mut buf = BytesMut::from(request);
        let head = crate::http1::request::parse_request(&mut buf, &Default::default())
            .unwrap()
            .unwrap();
        r.find(&head).map(|(index, _, _)| index)
    }

    fn get(path: &str, host: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
    }

    const ROUTES: &str = r#"
[[listener.route]]
host = "admin.example.com"
respond = { status = 403 }
[[listener.route]]
host = ["www.example.com", "example.com"]
path_exact = "/old"
redirect = { status = 301, location = "/new" }
[[listener.route]]
host = "*.example.com"
path = "/api/"
methods = ["GET", "HEAD"]
upstream = "a"
[[listener.route]]
path = "/admin"
respond = { status = 404 }
[[listener.route]]
path = "/"
headers = { "X-Canary" = "1" }
upstream = "b"
"#;

    #[test]
    fn the_first_matching_route_decides() {
        let r = router(ROUTES);
        assert_eq!(which(&r, &get("/", "admin.example.com")), Some(0));
        assert_eq!(which(&r, &get("/", "ADMIN.example.com:8080")), Some(0));
        assert_eq!(which(&r, &get("/old", "example.com")), Some(1));
        assert_eq!(which(&r, &get("/old?x=1", "www.example.com")), Some(1));
        assert_eq!(which(&r, &get("/old/", "www.example.com")), None);
        assert_eq!(which(&r, &get("/api/users", "www.example.com")), Some(2));
        assert_eq!(which(&r, &get("/api/users", "a.b.example.com")), Some(2));
        assert_eq!(
            which(&r, &get("/api/users", "example.com")),
            None,
            "*. needs a label"
        );
        assert_eq!(
            which(
                &r,
                "POST /api/x HTTP/1.1\r\nHost: w.example.com\r\nContent-Length: 0\r\n\r\n"
            ),
            None
        );
        assert_eq!(which(&r, &get("/admin/x", "other.test")), Some(3));
        assert_eq!(
            which(&r, "GET /x HTTP/1.1\r\nHost: o\r\nX-Canary: 1\r\n\r\n"),
            Some(4)
        );
        assert_eq!(
            which(&r, "GET /x HTTP/1.1\r\nHost: o\r\nX-Canary: 2\r\n\r\n"),
            None
        );
        assert_eq!(which(&r, "GET /x HTTP/1.0\r\n\r\n"), None);
    }

    #[test]
    fn tricks_on_the_path_cannot_reach_past_a_route() {
        let r = router(ROUTES);
        for path in [
            "/public/../admin",
            "/public/%2e%2e/admin",
            "//admin",
            "/%61dmin",
            "/./admin",
        ] {
            assert_eq!(which(&r, &get(path, "other.test")), Some(3), "{path}");
        }
    }

    #[test]
    fn a_route_an_earlier_one_covers_is_refused() {
        let text = |routes: &str| {
            format!(
                "[[listener]]\naddress = \"127.0.0.1:0\"\n{routes}\n[upstream.a]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
            )
        };
        let e = Config::parse(
            "t.toml",
            &text("[[listener.route]]\npath = \"/api/\"\nupstream = \"a\"\n[[listener.route]]\npath = \"/api/v2/\"\nupstream = \"a\""),
            &[0],
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("t.toml:6:1: listener[0].route[1]: never matches: listener[0].route[0] (line 3) comes first"), "{e}");
        // The narrower one first is fine, and so is a wildcard after an exact name.
        Config::parse(
            "t.toml",
            &text("[[listener.route]]\npath = \"/api/v2/\"\nupstream = \"a\"\n[[listener.route]]\npath = \"/api/\"\nupstream = \"a\"\n[[listener.route]]\nhost = \"a.example.com\"\nupstream = \"a\"\n[[listener.route]]\nhost = \"*.example.com\"\nmethods = [\"GET\"]\nupstream = \"a\""),
            &[0],
        )
        .unwrap();
        let e = Config::parse(
            "t.toml",
            &text("[[listener.route]]\nhost = \"*.example.com\"\nupstream = \"a\"\n[[listener.route]]\nhost = \"a.example.com\"\nmethods = [\"GET\"]\nupstream = \"a\""),
            &[0],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("never matches"), "{e}");
    }

    #[test]
    fn a_route_pattern_must_be_written_normalised() {
        let e = Config::parse(
            "t.toml",
            "[[listener]]\naddress = \"127.0.0.1:0\"\n[[listener.route]]\npath = \"/a//b\"\nupstream = \"a\"\n[upstream.a]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n",
            &[0],
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "t.toml:4:8: listener[0].route[0].path: \"/a//b\" is not a normalised path (requests are matched normalised, so it could never match as written), expected \"/a/b\""
        );
    }

    const REGEX_ROUTES: &str = r#"
[[listener.route]]
path_exact = "/status.php"
respond = { status = 204 }
[[listener.route]]
path = "/static/"
upstream = "b"
[[listener.route]]
path_regex = "\\.php$"
upstream = "a"
[[listener.route]]
path_regex = "(?i)\\.(png|jpg)$"
upstream = "b"
[[listener.route]]
path = "/"
respond = { status = 404 }
"#;

    #[test]
    fn a_regex_route_matches_the_normalised_path_in_file_order() {
        let r = router(REGEX_ROUTES);
        assert_eq!(which(&r, &get("/status.php", "h")), Some(0));
        assert_eq!(which(&r, &get("/static/x.php", "h")), Some(1));
        assert_eq!(which(&r, &get("/index.php", "h")), Some(2));
        assert_eq!(which(&r, &get("/a/b/index.php?x=.png", "h")), Some(2));
        // Matched normalised, as nginx matches its normalised URI.
        assert_eq!(which(&r, &get("/x/../index%2ephp", "h")), Some(2));
        assert_eq!(which(&r, &get("//admin/./a.php", "h")), Some(2));
        // Unanchored at the start, anchored where the pattern says: `.php/extra` is no match.
        assert_eq!(which(&r, &get("/index.php/extra", "h")), Some(4));
        assert_eq!(which(&r, &get("/logo.PNG", "h")), Some(3));
        assert_eq!(which(&r, &get("/logo.png", "h")), Some(3));
        assert_eq!(which(&r, &get("/readme.txt", "h")), Some(4));
        assert_eq!(which(&r, &get("/index.php?q=1", "h")), Some(2));
    }

    #[test]
    fn path_regex_is_checked_at_load_and_takes_no_rewrite_prefix() {
        let parse = |routes: &str| {
            Config::parse(
                "t.toml",
                &format!(
                    "[[listener]]\naddress = \"127.0.0.1:0\"\n{routes}\n[upstream.a]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
                ),
                &[0],
            )
        };
        let e = parse("[[listener.route]]\npath_regex = \"(\\\\.php$\"\nupstream = \"a\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.toml:4:14: listener[0].route[0].path_regex: invalid regular expression (unclosed group)"),
            "{e}"
        );
        let e = parse(
            "[[listener.route]]\npath_regex = \"php$\"\nupstream = \"a\"\nrewrite_prefix = \"/x/\"",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("t.toml:6:18: listener[0].route[0].rewrite_prefix: replaces a matched path prefix, so it needs path, not path_exact or path_regex"),
            "{e}"
        );
        let e = parse("[[listener.route]]\npath = \"/\"\npath_regex = \"php$\"\nupstream = \"a\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.toml:5:14: listener[0].route[0].path_regex: set together with path"),
            "{e}"
        );
    }

    #[test]
    fn a_regex_route_is_covered_only_by_an_unconditional_root_route_before_it() {
        let parse = |routes: &str| {
            Config::parse(
                "t.toml",
                &format!(
                    "[[listener]]\naddress = \"127.0.0.1:0\"\n{routes}\n[upstream.a]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
                ),
                &[0],
            )
        };
        let regex = "[[listener.route]]\npath_regex = \"php$\"\nupstream = \"a\"\n";
        for first in [
            "[[listener.route]]\npath = \"/\"\nupstream = \"a\"\n",
            "[[listener.route]]\nupstream = \"a\"\n",
        ] {
            let e = parse(&format!("{first}{regex}")).unwrap_err().to_string();
            assert!(e.contains("never matches"), "{e}");
        }
        // A narrower prefix, a condition, or another regex first leaves it reachable; and a
        // regex first covers nothing after it.
        for first in [
            "[[listener.route]]\npath = \"/api/\"\nupstream = \"a\"\n",
            "[[listener.route]]\nmethods = [\"GET\"]\nupstream = \"a\"\n",
            "[[listener.route]]\nhost = \"a.test\"\nupstream = \"a\"\n",
            "[[listener.route]]\npath_regex = \".*\"\nupstream = \"a\"\n",
        ] {
            parse(&format!("{first}{regex}")).unwrap();
        }
        parse(&format!(
            "{regex}[[listener.route]]\npath_exact = \"/x.php\"\nupstream = \"a\"\n[[listener.route]]\npath = \"/\"\nupstream = \"a\"\n"
        ))
        .unwrap();
    }

    #[test]
    fn the_regex_variant_leaves_path_match_its_size() {
        #[allow(dead_code)]
        enum Plain {
            Prefix(String),
            Exact(String),
        }
        assert_eq!(
            std::mem::size_of::<crate::config::PathMatch>(),
            std::mem::size_of::<Plain>()
        );
    }

    #[test]
    fn a_redirect_keeps_the_host_and_drops_its_port() {
        assert_eq!(host_without_port(b"example.com:8080"), b"example.com");
        assert_eq!(host_without_port(b"example.com"), b"example.com");
        assert_eq!(host_without_port(b"[::1]:8443"), b"[::1]");
        assert_eq!(host_without_port(b"[::1]"), b"[::1]");
        assert_eq!(host_without_port(b"10.0.0.1:80"), b"10.0.0.1");
        assert_eq!(host_name(b"example.com.:8080"), b"example.com");
        assert_eq!(host_name(b"example.com."), b"example.com");
        assert_eq!(host_name(b"example.com.."), b"example.com.");
        assert_eq!(host_name(b"[::1]:8443"), b"[::1]");
    }
}
