//! `[[listener.route]]`: each route's match and action checked, and routes that an earlier one
//! makes unreachable refused.

use std::ops::Range;

use toml::Spanned;

use super::raw::positive;
use super::raw::{OneOrMany, RawRoute};
use super::{ConfigError, HostPattern, PathMatch, RouteAction, RouteRule, RouteTimeouts, Template};
use crate::syntax::error::Source;

type Result<T> = std::result::Result<T, ConfigError>;

/// A listener's routes, in order.
pub(super) fn routes(
    src: &Source,
    key: &str,
    raw: &[Spanned<RawRoute>],
    upstream_index: impl Fn(&str, &Spanned<String>) -> Result<usize>,
) -> Result<Vec<RouteRule>> {
    let mut rules: Vec<RouteRule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let rkey = format!("{key}.route[{i}]");
        let rule = route(src, &rkey, r.get_ref(), r.span(), &upstream_index)?;
        if let Some(j) = rules.iter().position(|earlier| covers(earlier, &rule)) {
            let (line, _) = line_of(src, raw[j].span());
            return Err(src.at(
                r.span(),
                &rkey,
                format!(
                    "never matches: {key}.route[{j}] (line {line}) comes first and matches every request this one would; put the narrower route first"
                ),
            ));
        }
        rules.push(rule);
    }
    Ok(rules)
}

fn line_of(src: &Source, span: Range<usize>) -> (usize, usize) {
    let before = &src.text[..span.start.min(src.text.len())];
    (before.matches('\n').count() + 1, 0)
}

fn route(
    src: &Source,
    rkey: &str,
    r: &RawRoute,
    span: Range<usize>,
    upstream_index: &impl Fn(&str, &Spanned<String>) -> Result<usize>,
) -> Result<RouteRule> {
    let path = match (&r.path, &r.path_exact, &r.path_regex) {
        (Some(_), Some(e), _) => {
            return Err(src.at(
                e.span(),
                &format!("{rkey}.path_exact"),
                "set together with path, expected one of them: path matches a prefix, path_exact one path",
            ));
        }
        (Some(_), _, Some(x)) | (_, Some(_), Some(x)) => {
            return Err(src.at(
                x.span(),
                &format!("{rkey}.path_regex"),
                "set together with path or path_exact, expected one of them: path matches a prefix, path_exact one path, path_regex a regular expression",
            ));
        }
        (Some(p), None, None) => PathMatch::Prefix(path_pattern(src, &format!("{rkey}.path"), p)?),
        (None, Some(e), None) => {
            PathMatch::Exact(path_pattern(src, &format!("{rkey}.path_exact"), e)?)
        }
        (None, None, Some(x)) => path_regex(src, &format!("{rkey}.path_regex"), x)?,
        (None, None, None) => PathMatch::Prefix("/".into()),
    };
    let hosts = match &r.host {
        None => Vec::new(),
        Some(h) => host_patterns(src, &format!("{rkey}.host"), h)?,
    };
    let methods = match &r.methods {
        None => Vec::new(),
        Some(list) => list
            .get_ref()
            .iter()
            .map(|m| {
                let name = m.get_ref();
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_uppercase()) {
                    return Err(src.at(
                        m.span(),
                        &format!("{rkey}.methods"),
                        format!(
                            "\"{name}\" is not a method, expected upper-case names such as \"GET\""
                        ),
                    ));
                }
                http::Method::from_bytes(name.as_bytes()).map_err(|_| {
                    src.at(
                        m.span(),
                        &format!("{rkey}.methods"),
                        format!("\"{name}\" is not a method"),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let headers = match &r.headers {
        None => Vec::new(),
        Some(map) => map
            .get_ref()
            .iter()
            .map(|(name, value)| {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(src.at(
                        map.span(),
                        &format!("{rkey}.headers"),
                        format!("\"{name}\" is not a header name"),
                    ));
                }
                Ok((name.to_ascii_lowercase(), value.get_ref().clone()))
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let action = action(src, rkey, r, span.clone(), &path, upstream_index)?;
    if let (false, Some(at)) = (
        matches!(action, RouteAction::Proxy { .. }),
        r.modules.request_headers.span(),
    ) {
        return Err(src.at(
            at,
            &format!("{rkey}.request_headers"),
            "only applies to a route with an upstream: no request goes anywhere from this one",
        ));
    }
    let timeouts = match &r.timeouts {
        None => RouteTimeouts::default(),
        Some(t) if !matches!(action, RouteAction::Proxy { .. }) => {
            let first = [&t.connect, &t.response, &t.send]
                .into_iter()
                .flatten()
                .next();
            return Err(src.at(
                first.map_or(span, |v| v.span()),
                &format!("{rkey}.timeouts"),
                "only applies to a route with an upstream",
            ));
        }
        Some(t) => {
            let tkey = |f: &str| format!("{rkey}.timeouts.{f}");
            RouteTimeouts {
                connect: positive(src, &t.connect, &tkey("connect"))?,
                response: positive(src, &t.response, &tkey("response"))?,
                send: positive(src, &t.send, &tkey("send"))?,
            }
        }
    };
    Ok(RouteRule {
        hosts,
        path,
        methods,
        headers,
        action,
        timeouts,
        rate_limits: None,
        // Resolved against the listener's by `validate::listener`.
        modules: Default::default(),
    })
}

fn action(
    src: &Source,
    rkey: &str,
    r: &RawRoute,
    span: Range<usize>,
    path: &PathMatch,
    upstream_index: &impl Fn(&str, &Spanned<String>) -> Result<usize>,
) -> Result<RouteAction> {
    let given = [
        r.upstream.is_some(),
        r.redirect.is_some(),
        r.respond.is_some(),
    ];
    if given.iter().filter(|&&g| g).count() != 1 {
        return Err(src.at(
            span,
            rkey,
            "expected exactly one of upstream, redirect or respond: what the route does",
        ));
    }
    if let (Some(p), None) = (&r.rewrite_prefix, &r.upstream) {
        return Err(src.at(
            p.span(),
            &format!("{rkey}.rewrite_prefix"),
            "only applies to a route with an upstream",
        ));
    }
    if let Some(u) = &r.upstream {
        let rewrite_prefix = match &r.rewrite_prefix {
            None => None,
            Some(p) if !matches!(path, PathMatch::Prefix(_)) => {
                return Err(src.at(
                    p.span(),
                    &format!("{rkey}.rewrite_prefix"),
                    "replaces a matched path prefix, so it needs path, not path_exact or path_regex (which match no prefix to replace)",
                ));
            }
            Some(p) if !p.get_ref().starts_with('/') => {
                return Err(src.at(
                    p.span(),
                    &format!("{rkey}.rewrite_prefix"),
                    format!(
                        "\"{}\" does not start with '/', expected a path such as \"/v2/\"",
                        p.get_ref()
                    ),
                ));
            }
            Some(p) => Some(p.get_ref().clone()),
        };
        return Ok(RouteAction::Proxy {
            upstream: upstream_index(rkey, u)?,
            rewrite_prefix,
        });
    }
    if let Some(redirect) = &r.redirect {
        let rd = redirect.get_ref();
        let status = rd.status.as_ref().map_or(302, |s| *s.get_ref());
        if ![301, 302, 303, 307, 308].contains(&status) {
            return Err(src.at(
                rd.status.as_ref().map_or(redirect.span(), |s| s.span()),
                &format!("{rkey}.redirect.status"),
                format!("{status} is not a redirect, expected 301, 302, 303, 307 or 308"),
            ));
        }
        if rd.location.get_ref().contains(['\r', '\n']) {
            return Err(src.at(
                rd.location.span(),
                &format!("{rkey}.redirect.location"),
                "a location can't hold a line break",
            ));
        }
        let location = Template::parse(rd.location.get_ref())
            .map_err(|e| src.at(rd.location.span(), &format!("{rkey}.redirect.location"), e))?;
        return Ok(RouteAction::Redirect { status, location });
    }
    let respond = r.respond.as_ref().expect("one action is given");
    let rs = respond.get_ref();
    let status = *rs.status.get_ref();
    if !(200..=599).contains(&status) {
        return Err(src.at(
            rs.status.span(),
            &format!("{rkey}.respond.status"),
            format!("{status} is out of range, expected 200-599"),
        ));
    }
    Ok(RouteAction::Respond {
        status,
        body: rs.body.clone().unwrap_or_default(),
    })
}

/// A `path` or `path_exact`: it must start with `/` and be written normalised, since that is
/// what it is compared with.
fn path_pattern(src: &Source, key: &str, p: &Spanned<String>) -> Result<String> {
    let text = p.get_ref();
    if !text.starts_with('/') {
        return Err(src.at(
            p.span(),
            key,
            format!("\"{text}\" does not start with '/', expected a path such as \"/api/\""),
        ));
    }
    let normal = crate::http1::path::normalize(text.as_bytes());
    if normal.as_ref() != text.as_bytes() || text.contains('?') {
        return Err(src.at(
            p.span(),
            key,
            format!(
                "\"{text}\" is not a normalised path (requests are matched normalised, so it could never match as written), expected \"{}\"",
                String::from_utf8_lossy(&normal)
            ),
        ));
    }
    Ok(text.clone())
}

/// A `path_regex`, compiled once here: the normalised path is matched against it (unanchored,
/// as nginx's `location ~`; `(?i)` in front for nginx's `~*`).
fn path_regex(src: &Source, key: &str, x: &Spanned<String>) -> Result<PathMatch> {
    let expected =
        "one such as \"\\\\.php$\" (the normalised path, unanchored; (?i) in front ignores case)";
    let re = super::pattern::compile(src, key, x, expected)?;
    Ok(PathMatch::Regex(Box::new(re)))
}

/// A `host` (or `server_name`) value at `key`: one name or a list, each a name or `*.` and a
/// name.
pub(super) fn host_patterns(
    src: &Source,
    key: &str,
    h: &Spanned<OneOrMany>,
) -> Result<Vec<HostPattern>> {
    let names: Vec<&str> = match h.get_ref() {
        OneOrMany::One(n) => vec![n.as_str()],
        OneOrMany::Many(v) => v.iter().map(String::as_str).collect(),
    };
    names
        .into_iter()
        .map(|n| host_pattern(n).map_err(|e| src.at(h.span(), key, e)))
        .collect()
}

/// One `host` entry: a name, or `*.` and a name.
fn host_pattern(name: &str) -> std::result::Result<HostPattern, String> {
    // A fully qualified name's root dot names the same host: requests are matched without it.
    let lower = name.to_ascii_lowercase();
    let lower = lower.strip_suffix('.').unwrap_or(&lower);
    let (pattern, rest) = match lower.strip_prefix("*.") {
        Some(rest) => (HostPattern::Suffix(format!(".{rest}")), rest.to_string()),
        None => (HostPattern::Exact(lower.to_string()), lower.to_string()),
    };
    let valid = !rest.is_empty()
        && rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
    if !valid {
        return Err(format!(
            "\"{name}\" is not a host name, expected a name such as \"example.com\" or \"*.example.com\" (no port, no other '*')"
        ));
    }
    Ok(pattern)
}

/// Whether `a`, coming first, matches every request `b` would, so `b` never decides.
fn covers(a: &RouteRule, b: &RouteRule) -> bool {
    let hosts = a.hosts.is_empty()
        || (!b.hosts.is_empty()
            && b.hosts.iter().all(|hb| {
                a.hosts.iter().any(|ha| match (ha, hb) {
                    (HostPattern::Exact(x), HostPattern::Exact(y)) => x == y,
                    (HostPattern::Suffix(s), HostPattern::Exact(y)) => {
                        ha.matches(y.as_bytes()) && !s.is_empty()
                    }
                    (HostPattern::Suffix(s), HostPattern::Suffix(t)) => t.ends_with(s.as_str()),
                    (HostPattern::Exact(_), HostPattern::Suffix(_)) => false,
                })
            }));
    // A regex covers nothing (which paths it matches is not compared), and only `/`, which
    // matches every path, covers one.
    let path = match (&a.path, &b.path) {
        (PathMatch::Prefix(p), PathMatch::Regex(_)) => p == "/",
        (PathMatch::Prefix(p), PathMatch::Prefix(q) | PathMatch::Exact(q)) => {
            q.starts_with(p.as_str())
        }
        (PathMatch::Exact(p), PathMatch::Exact(q)) => p == q,
        (PathMatch::Exact(_), PathMatch::Prefix(_) | PathMatch::Regex(_)) => false,
        (PathMatch::Regex(_), _) => false,
    };
    let methods = a.methods.is_empty()
        || (!b.methods.is_empty() && b.methods.iter().all(|m| a.methods.contains(m)));
    let headers = a.headers.iter().all(|h| b.headers.contains(h));
    hosts && path && methods && headers
}
