//! `rewrite REGEX REPLACEMENT redirect|permanent` as a route redirect, for the forms a route can
//! express exactly: a regex that matches every path, or an anchored literal path (exact or
//! prefix); a replacement whose captures are the whole path. Anything else is refused with the
//! reason, so that the import notes it instead of converting it into something that behaves
//! differently.
//!
//! nginx appends the request's query to a redirect's location unless the replacement ends with
//! `?` (`?args`, or `&args` after a replacement that has a `?` of its own), and only when there
//! is a query: `{is_args}{query}` does the same (`?` only before a query that is not empty).
//! The `&args` form has no equivalent: refused.

/// What a `rewrite`'s regex matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// Every path (`^`, `^(.*)$`, `^/(.*)$`, `.*`, ...).
    All,
    /// `^/old$`: this path only.
    Exact(String),
    /// `^/old/`: every path under this prefix.
    Prefix(String),
}

/// A `rewrite` that a route can express: what it matches, its status and its location template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    pub matches: Match,
    pub status: u16,
    pub location: String,
}

/// `args` of a `rewrite` directive as a redirect, or why it can't be one.
pub fn convert(args: &[String]) -> Result<Redirect, String> {
    let (regex, replacement, flag) = match args {
        [r, p] => (r.as_str(), p.as_str(), None),
        [r, p, f] => (r.as_str(), p.as_str(), Some(f.as_str())),
        _ => return Err("expected a regex, a replacement and a flag".into()),
    };
    let absolute = ["http://", "https://", "$scheme://"]
        .iter()
        .any(|p| replacement.starts_with(p));
    let status = match flag {
        Some("permanent") => 301,
        Some("redirect") => 302,
        // Without a flag (or with last/break), an absolute replacement still redirects (302).
        None | Some("last") | Some("break") if absolute => 302,
        Some("last") | Some("break") | None => {
            return Err(
                "an internal rewrite (no redirect or permanent flag): pinlb routes don't rewrite paths this way"
                    .into(),
            );
        }
        Some(other) => return Err(format!("unknown flag {other}")),
    };
    let (matches, capture) = regex_match(regex).ok_or_else(|| {
        format!("the regex {regex} is not one a route can match (every path, ^/exact$ or ^/prefix)")
    })?;
    let (replacement, append_query) = match replacement.strip_suffix('?') {
        Some(r) => (r, false),
        None => (replacement, true),
    };
    // The one capture a route has: the whole path, as nginx's $uri.
    let replacement = match capture {
        Capture::None => replacement.to_string(),
        Capture::Path => replacement.replace("$1", "$uri"),
        Capture::AfterSlash => match replacement.find("$1") {
            Some(i) if replacement[..i].ends_with('/') => replacement.replacen("/$1", "$uri", 1),
            Some(_) => return Err("$1 is not after a '/', so it is not the path".into()),
            None => replacement.to_string(),
        },
    };
    if replacement.contains('$')
        && replacement.char_indices().any(|(i, c)| {
            c == '$' && replacement[i + 1..].starts_with(|d: char| d.is_ascii_digit())
        })
    {
        return Err("its replacement uses a capture a route has no equivalent for".into());
    }
    let mut location = super::template::template(&replacement)
        .ok_or("its replacement uses a variable pinlb has no equivalent for")?;
    if append_query {
        if location.ends_with("{uri}") {
            return Err(
                "nginx appends the query to a location that already holds $request_uri, so it would repeat; end the replacement with '?' as nginx's documentation advises"
                    .into(),
            );
        }
        if replacement.contains('?') {
            return Err(
                "nginx appends the request's query after the replacement's own with '&', which a route's redirect can't do conditionally; end the replacement with '?' to drop the request's query"
                    .into(),
            );
        }
        location = match location.strip_suffix("{path}") {
            Some(head) => format!("{head}{{uri}}"),
            None => format!("{location}{{is_args}}{{query}}"),
        };
    }
    Ok(Redirect {
        matches,
        status,
        location,
    })
}

enum Capture {
    /// No group.
    None,
    /// `$1` is the whole path.
    Path,
    /// `$1` is the path after its leading `/`.
    AfterSlash,
}

fn regex_match(regex: &str) -> Option<(Match, Capture)> {
    match regex {
        "^" | "^/" | "/" | ".*" | "^.*" | "^.*$" | "^/.*" | "^/.*$" => {
            return Some((Match::All, Capture::None));
        }
        "^(.*)$" | "^(.*)" | "(.*)" | "(.*)$" | "^(/.*)$" | "^(/.*)" => {
            return Some((Match::All, Capture::Path));
        }
        "^/(.*)$" | "^/(.*)" => return Some((Match::All, Capture::AfterSlash)),
        _ => {}
    }
    let body = regex.strip_prefix("^/")?;
    let (literal, exact) = match body.strip_suffix('$') {
        Some(l) => (l, true),
        None => (body, false),
    };
    // A literal path: no regex syntax but `.` (written `\.` or bare, which nginx's configs use
    // for a dot; a bare one would match any character, so it must be escaped to be exact).
    let mut path = String::from("/");
    let mut chars = literal.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('.' | '/' | '-' | '_' | '~')) => path.push(e),
                _ => return None,
            },
            c if c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '~') => path.push(c),
            _ => return None,
        }
    }
    Some((
        if exact {
            Match::Exact(path)
        } else {
            Match::Prefix(path)
        },
        Capture::None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(args: &[&str]) -> Result<Redirect, String> {
        convert(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_common_forms_convert_exactly() {
        assert_eq!(
            rw(&["^", "https://$host$request_uri?", "permanent"]),
            Ok(Redirect {
                matches: Match::All,
                status: 301,
                location: "https://{host}{uri}".into()
            })
        );
        assert_eq!(
            rw(&["^(.*)$", "https://new.test$1", "redirect"]).map(|r| r.location),
            Ok("https://new.test{uri}".into())
        );
        assert_eq!(
            rw(&["^/(.*)$", "/app/$1?", "permanent"]).map(|r| r.location),
            Ok("/app{path}".into())
        );
        assert_eq!(
            rw(&["^/old$", "/new?", "permanent"]).map(|r| r.matches),
            Ok(Match::Exact("/old".into()))
        );
        // Without the '?', nginx appends the query when there is one; so does {is_args}.
        assert_eq!(
            rw(&["^/old$", "/new", "permanent"]).map(|r| r.location),
            Ok("/new{is_args}{query}".into())
        );
        assert_eq!(
            rw(&["^/blog/", "https://blog.test/?", "redirect"]).map(|r| r.matches),
            Ok(Match::Prefix("/blog/".into()))
        );
        // No flag: an absolute replacement still redirects, with 302.
        assert_eq!(rw(&["^", "http://x.test/?"]).map(|r| r.status), Ok(302));
    }

    #[test]
    fn what_a_route_cannot_express_is_refused() {
        // The suffix capture: no route variable holds the path after a prefix.
        assert!(rw(&["^/old/(.*)$", "/new/$1", "permanent"]).is_err());
        // The query appended after the replacement's own, with '&'.
        assert!(rw(&["^/old$", "/new?a=1", "permanent"]).is_err());
        // The query appended twice.
        assert!(rw(&["^", "https://$host$request_uri", "permanent"]).is_err());
        // An internal rewrite.
        assert!(rw(&["^/a$", "/b", "last"]).is_err());
        assert!(rw(&["^/a.b$", "/b?", "permanent"]).is_err());
        assert!(rw(&["^", "/$server_port?", "permanent"]).is_err());
    }
}
