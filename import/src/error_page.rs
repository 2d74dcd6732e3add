//! nginx's `error_page CODES /uri;` to a local file, and `proxy_intercept_errors`, as pinlb's
//! `error_page` tables and `intercept_errors`.
//!
//! The URI is looked up as nginx's internal redirect would find it among the server's
//! locations: an exact `location = /uri`, else the longest prefix location; the file is its
//! `alias` (the rest of the URI after the prefix appended) or its `root` (inherited from the
//! server or `http`) followed by the URI, as in nginx's usual shape:
//!
//! ```nginx
//! error_page 500 502 503 504 /50x.html;
//! location = /50x.html { root /usr/share/nginx/html; }
//! ```
//!
//! Such an exact location then is no route of its own: pinlb reads its file as the page, and
//! serves no files to requests for its path. What does not convert is a note with its reason:
//! `=code` and `=` (the answer's status changed, or the page's own), a named location, a URL (a
//! redirect), a URI that a location proxies or answers, a URI with variables, codes under 400.

use pinlb::config::raw::RawRoute;
use pinlb::modules::error_pages::{Raw, RawErrorPage, Statuses};
use toml::Spanned;

use super::parse::Directive;
use super::values::spanned;

/// What a block's `error_page`, `proxy_intercept_errors` and `root` make of what it inherits:
/// a level with `error_page`s of its own inherits none of the outer ones, as nginx's.
#[derive(Debug, Clone, Default)]
pub(super) struct Inherit {
    pages: Vec<Directive>,
    intercept: bool,
    root: Option<String>,
}

impl Inherit {
    /// The directives this module reads, which the converter leaves to it.
    pub const NAMES: [&'static str; 2] = ["error_page", "proxy_intercept_errors"];

    pub fn level(&self, block: &[Directive]) -> Inherit {
        let mut out = self.clone();
        let own: Vec<Directive> = (block.iter())
            .filter(|d| d.name == "error_page" && d.block.is_none())
            .cloned()
            .collect();
        if !own.is_empty() {
            out.pages = own;
        }
        for d in block.iter().filter(|d| d.block.is_none()) {
            match (d.name.as_str(), d.args.first()) {
                ("proxy_intercept_errors", Some(v)) => out.intercept = v == "on",
                ("root", Some(r)) => out.root = Some(r.clone()),
                _ => {}
            }
        }
        out
    }

    /// The `root` in force, if any.
    pub fn root(&self) -> Option<&str> {
        self.root.as_deref()
    }

    /// Whether `block` sets its own pages (so that its route differs from its server's).
    pub fn own(block: &[Directive]) -> bool {
        block.iter().any(|d| Self::NAMES.contains(&d.name.as_str()))
    }
}

/// A listener's or a route's pages as pinlb writes them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Pages {
    /// `{ status = [..], file = ".." }` tables.
    pub list: Vec<Spanned<RawErrorPage>>,
    pub intercept: bool,
}

impl Pages {
    /// The pages a route's keys carry (`error_page`, `intercept_errors`), if it has its own.
    pub fn of_route(keys: &Raw) -> Option<Pages> {
        if keys.error_page.is_none() && keys.intercept_errors.is_none() {
            return None;
        }
        Some(Pages {
            list: keys.error_page.clone().unwrap_or_default(),
            intercept: keys.intercept_errors.as_ref().is_some_and(|i| *i.get_ref()),
        })
    }

    /// Writes these as a table's keys (a listener's: only what is set).
    pub fn write(&self, keys: &mut Raw, explicit: bool) {
        if explicit || !self.list.is_empty() {
            keys.error_page = Some(self.list.clone());
        }
        if explicit || self.intercept {
            keys.intercept_errors = Some(spanned(self.intercept));
        }
    }

    /// `route` with `server`'s pages (or its own), written only where they differ from the
    /// listener's, which it would inherit.
    pub fn settle(route: &mut RawRoute, server: &Pages, listener: &Pages) {
        let keys = &mut route.modules.error_pages;
        let own = Pages::of_route(keys).unwrap_or_else(|| server.clone());
        *keys = Raw::default();
        if own != *listener {
            own.write(keys, true);
        }
    }
}

/// The pages of a server (or a location inside it, `inherit` being that level's): each
/// `error_page` to a local file, and the exact locations that only serve those files (by
/// line), which then are no routes. The rest is noted in `notes`.
pub(super) fn convert(
    inherit: &Inherit,
    server: &[Directive],
    notes: &mut Vec<String>,
) -> (Pages, Vec<usize>) {
    let mut list = Vec::new();
    let mut seen: Vec<u16> = Vec::new();
    let mut used = Vec::new();
    for d in &inherit.pages {
        let mut note = |why: String| {
            notes.push(format!(
                "{}: error_page {} not converted: {why}",
                d.at(),
                d.args.join(" ")
            ))
        };
        let Some((uri, codes)) = d.args.split_last() else {
            note("expected codes and a URI".into());
            continue;
        };
        if codes.iter().any(|c| c.starts_with('=')) {
            note("the `=code` form changes the answer's status (or takes the page's own); pinlb answers with the error's status".into());
            continue;
        }
        let file = match target(uri, server, inherit) {
            Ok((file, location)) => {
                used.extend(location);
                file
            }
            Err(why) => {
                note(why);
                continue;
            }
        };
        let mut statuses = Vec::new();
        for c in codes {
            match c.parse::<u16>() {
                Ok(s) if (400..=599).contains(&s) && !seen.contains(&s) => {
                    seen.push(s);
                    statuses.push(i64::from(s));
                }
                Ok(s) if seen.contains(&s) => notes.push(format!(
                    "{}: error_page {s} not converted: an earlier error_page has it, and nginx uses that one",
                    d.at()
                )),
                _ => notes.push(format!(
                    "{}: error_page {c} not converted: pinlb's pages are for its own 4xx and 5xx",
                    d.at()
                )),
            }
        }
        if statuses.is_empty() {
            continue;
        }
        if !std::path::Path::new(&file).is_file() {
            notes.push(format!(
                "{}: error_page {uri}: pinlb reads {file} when it loads the configuration, and it is not there now",
                d.at()
            ));
        }
        // nginx's stock nginx.conf: `default_type application/octet-stream`.
        let content_type = (pinlb::config::content_type_for(&file).is_none())
            .then(|| spanned("application/octet-stream".into()));
        list.push(spanned(RawErrorPage {
            status: spanned(Statuses::Many(statuses)),
            file: spanned(file),
            content_type,
        }));
    }
    let pages = Pages {
        list,
        intercept: inherit.intercept,
    };
    (pages, used)
}

/// The file nginx serves for `uri` in `server`, and the line of the exact location that
/// serves it (then no route of its own); `Err` says why there is none to read.
fn target(
    uri: &str,
    server: &[Directive],
    inherit: &Inherit,
) -> Result<(String, Option<usize>), String> {
    if uri.starts_with('@') {
        return Err("a named location is a request handled again, not a file".into());
    }
    if uri.contains("://") {
        return Err(
            "a URL makes nginx redirect the client there (302); pinlb's pages are files".into(),
        );
    }
    if !uri.starts_with('/') || uri.contains('$') {
        return Err("only a URI without variables converts, to the file it names".into());
    }
    let path = uri.split('?').next().unwrap_or(uri);
    let locations = server.iter().filter(|d| d.name == "location");
    let mut best: Option<(&Directive, usize, bool)> = None;
    for l in locations {
        match l.args.as_slice() {
            [m, p] if m == "=" && p == path => {
                best = Some((l, p.len(), true));
                break;
            }
            [m, p] if m == "^~" && path.starts_with(p.as_str()) => {}
            [p] if p.starts_with('/') && path.starts_with(p.as_str()) => {}
            _ => continue,
        }
        let p = l.args.last().map_or(0, String::len);
        if best.is_none_or(|(_, len, _)| p > len) {
            best = Some((l, p, false));
        }
    }
    let (block, prefix, exact) = match best {
        Some((l, len, exact)) => (
            l.block.as_deref().unwrap_or_default(),
            len,
            exact.then_some(l.line),
        ),
        None => (&[][..], 0, None),
    };
    if let Some(d) = block
        .iter()
        .find(|d| ["proxy_pass", "return", "rewrite"].contains(&d.name.as_str()))
    {
        return Err(format!(
            "{uri} is answered by {} (line {}), not a local file",
            d.name, d.line
        ));
    }
    let own = |name: &str| {
        (block.iter())
            .find(|d| d.name == name)
            .and_then(|d| d.args.first())
    };
    let file = match (own("alias"), own("root").or(inherit.root.as_ref())) {
        (Some(alias), _) if exact.is_some() => alias.clone(),
        (Some(alias), _) => format!("{alias}{}", &path[prefix.min(path.len())..]),
        (None, Some(root)) => format!("{}{path}", root.trim_end_matches('/')),
        (None, None) => {
            return Err(format!(
                "no root for {uri}: nginx reads it from its compiled-in html directory; write the page's file by hand"
            ));
        }
    };
    if file.contains('$') {
        return Err(format!("the file {file} has variables"));
    }
    Ok((file, exact))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(name: &str, args: &[&str], block: Option<Vec<Directive>>, line: usize) -> Directive {
        Directive {
            name: name.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block,
            file: "nginx.conf".into(),
            line,
        }
    }

    #[test]
    fn the_file_is_the_locations_root_or_alias_and_the_uri() {
        let server = vec![
            d("error_page", &["502", "503", "/50x.html"], None, 1),
            d(
                "location",
                &["=", "/50x.html"],
                Some(vec![d("root", &["/srv/html/"], None, 3)]),
                2,
            ),
            d(
                "location",
                &["/errors/"],
                Some(vec![d("alias", &["/srv/err/"], None, 5)]),
                4,
            ),
            d(
                "location",
                &["/api/"],
                Some(vec![d("proxy_pass", &["http://x"], None, 7)]),
                6,
            ),
        ];
        let inherit = Inherit::default().level(&server);
        assert_eq!(
            target("/50x.html", &server, &inherit),
            Ok(("/srv/html/50x.html".into(), Some(2)))
        );
        assert_eq!(
            target("/errors/404.html", &server, &inherit),
            Ok(("/srv/err/404.html".into(), None))
        );
        assert!(
            target("/api/e.html", &server, &inherit)
                .unwrap_err()
                .contains("proxy_pass (line 7)")
        );
        assert!(
            target("/other.html", &server, &inherit)
                .unwrap_err()
                .contains("no root")
        );
        assert!(target("@fallback", &server, &inherit).is_err());
        assert!(target("https://example.com/e", &server, &inherit).is_err());
        let rooted = Inherit::default().level(&[d("root", &["/var/www"], None, 1)]);
        assert_eq!(
            target("/other.html", &server, &rooted),
            Ok(("/var/www/other.html".into(), None))
        );
    }

    #[test]
    fn codes_convert_and_the_rest_is_noted() {
        let server = vec![
            d("root", &["/w"], None, 1),
            d("error_page", &["404", "/404.html"], None, 2),
            d("error_page", &["301", "404", "500", "/5xx.page"], None, 3),
            d("error_page", &["404", "=200", "/empty.gif"], None, 4),
            d("proxy_intercept_errors", &["on"], None, 5),
        ];
        let mut notes = Vec::new();
        let (pages, used) = convert(&Inherit::default().level(&server), &server, &mut notes);
        assert!(pages.intercept);
        assert!(used.is_empty());
        assert_eq!(pages.list.len(), 2);
        let (first, second) = (pages.list[0].get_ref(), pages.list[1].get_ref());
        assert_eq!(first.file.get_ref(), "/w/404.html");
        assert_eq!(*second.status.get_ref(), Statuses::Many(vec![500]));
        assert_eq!(
            second.content_type.as_ref().map(|c| c.get_ref().as_str()),
            Some("application/octet-stream")
        );
        let notes = notes.join("\n");
        assert!(
            notes.contains("nginx.conf:3: error_page 301 not converted"),
            "{notes}"
        );
        assert!(
            notes.contains("nginx.conf:3: error_page 404 not converted: an earlier"),
            "{notes}"
        );
        assert!(
            notes.contains(
                "nginx.conf:4: error_page 404 =200 /empty.gif not converted: the `=code` form"
            ),
            "{notes}"
        );
    }
}
