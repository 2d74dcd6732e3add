//! RFC 9111's rules for a shared cache, through `http-cache-semantics`: whether a response may
//! be stored, how long it stays fresh, and the request headers its variants are kept by. Asked
//! once per response that could be stored, never on a hit.

use std::time::{Duration, SystemTime};

use http::header::{CACHE_CONTROL, EXPIRES, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use http_cache_semantics::{CacheOptions, CachePolicy};

use super::Config;
use crate::http1::common::header_map;
use crate::http1::request::RequestHead;

/// A response that may be stored.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// How long it stays fresh from now.
    pub fresh_for: Duration,
    /// How old it is now (its `Age`, and its time on the way since its `Date`).
    pub age: Duration,
    /// The request headers it varies by (`Vary`), lower case; empty for none.
    pub vary: Vec<String>,
    /// How long past its freshness it may be served while it is revalidated, and when the
    /// backend fails (RFC 5861's `stale-while-revalidate` and `stale-if-error`).
    pub while_revalidating: Duration,
    pub if_error: Duration,
    /// It must not be served stale at all (RFC 9111 section 4.2.4: `must-revalidate`,
    /// `proxy-revalidate` or `s-maxage`), whatever `use_stale` says.
    pub stale_forbidden: bool,
}

/// Whether the response with `status` and header lines `lines` to `head` may be stored under
/// `config`, and for how long. `None`: it may not, or it would not be fresh at all.
pub(crate) fn verdict(
    config: &Config,
    head: &RequestHead,
    status: StatusCode,
    lines: &[u8],
) -> Option<Verdict> {
    let mut res = header_map(lines);
    if res.contains_key(http::header::SET_COOKIE) && !config.ignore.set_cookie {
        // nginx's rule: one client's cookie is never another's.
        return None;
    }
    res.remove(http::header::SET_COOKIE);
    let mut vary = Vec::new();
    if !config.ignore.vary {
        for v in res.get_all(http::header::VARY) {
            for name in v.to_str().ok()?.split(',').map(str::trim) {
                if name == "*" {
                    return None;
                }
                if !name.is_empty() {
                    vary.push(name.to_ascii_lowercase());
                }
            }
        }
    }
    res.remove(http::header::VARY);
    if config.ignore.cache_control {
        res.remove(CACHE_CONTROL);
        res.remove(http::header::PRAGMA);
    }
    if config.ignore.expires {
        res.remove(EXPIRES);
    }
    // `valid` stands for the freshness a response does not give (nginx's `proxy_cache_valid`).
    if !explicit(&res) {
        if let Some(d) = config.valid_for(status.as_u16()) {
            let mut cc = res
                .get(CACHE_CONTROL)
                .and_then(|v| v.to_str().ok())
                .map(|v| format!("{v}, "))
                .unwrap_or_default();
            cc.push_str(&format!("max-age={}", d.as_secs()));
            res.insert(CACHE_CONTROL, HeaderValue::from_str(&cc).ok()?);
        }
    }
    let (while_revalidating, if_error) = (
        directive(&res, "stale-while-revalidate"),
        directive(&res, "stale-if-error"),
    );
    let stale_forbidden = ["must-revalidate", "proxy-revalidate", "s-maxage"]
        .iter()
        .any(|d| has_directive(&res, d));
    let req = request_parts(head)?;
    let now = SystemTime::now();
    let response = response_parts(status, res)?;
    let policy = CachePolicy::new_options(&req, &response, now, CacheOptions::default());
    if !policy.is_storable() {
        return None;
    }
    let fresh_for = policy.time_to_live(now);
    if fresh_for.is_zero() {
        return None;
    }
    Some(Verdict {
        fresh_for,
        age: policy.age(now),
        vary,
        while_revalidating,
        if_error,
        stale_forbidden,
    })
}

/// Whether the response's `Cache-Control` has directive `name` (with a value or without).
fn has_directive(res: &HeaderMap, name: &str) -> bool {
    (res.get_all(CACHE_CONTROL).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| {
            let d = d.trim();
            let n = d.split('=').next().unwrap_or(d).trim();
            n.eq_ignore_ascii_case(name)
        })
}

/// The seconds of the `Cache-Control` directive `name=N`, 0 without it.
fn directive(res: &HeaderMap, name: &str) -> Duration {
    let secs = (res.get_all(CACHE_CONTROL).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|d| {
            let (k, v) = d.trim().split_once('=')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().parse::<u64>().ok())?
        });
    Duration::from_secs(secs.unwrap_or(0))
}

/// Whether a response says how long it is fresh: the heuristic from `Last-Modified` applies
/// only to one that does not, and so does `valid`.
fn explicit(res: &HeaderMap) -> bool {
    let cc = res
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| {
            let d = d.trim().to_ascii_lowercase();
            d.starts_with("max-age") || d.starts_with("s-maxage")
        });
    cc || res.contains_key(EXPIRES)
}

/// The request as the rules read it: its method, target and header lines (`Authorization`
/// among them). `None` for a target that is not a URI.
fn request_parts(head: &RequestHead) -> Option<http::request::Parts> {
    let mut b = http::Request::builder()
        .method(head.method.clone())
        .uri(head.path());
    if let Some(h) = b.headers_mut() {
        *h = header_map(head.lines());
    }
    let (parts, ()) = b.body(()).ok()?.into_parts();
    Some(parts)
}

fn response_parts(status: StatusCode, headers: HeaderMap) -> Option<http::response::Parts> {
    let mut b = http::Response::builder().status(status);
    if let Some(h) = b.headers_mut() {
        *h = headers;
    }
    Some(b.body(()).ok()?.into_parts().0)
}

/// Whether a request with `method` that succeeded with `status` removes what its key holds
/// (RFC 9111 section 4.4: an unsafe method's non-error answer).
pub(crate) fn invalidates(method: &Method, status: StatusCode) -> bool {
    let unsafe_method = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    unsafe_method && (status.is_success() || status.is_redirection())
}

#[cfg(test)]
mod tests {
    //! RFC 9111's MUSTs for a shared cache, as `verdict` applies them (section numbers are
    //! RFC 9111's).
    use std::sync::Arc;

    use bytes::BytesMut;

    use super::*;
    use crate::http1::request::{RequestLimits, parse_request};
    use crate::modules::{Module, Place};
    use crate::syntax::error::Source;

    fn config(keys: &str) -> Arc<Config> {
        let text = format!("cache = {{ zone = \"z\"{keys} }}");
        let raw = toml::from_str(&text).unwrap();
        let src = Source { file: "t.toml", text: &text };
        let at = Place { src: &src, key: "listener[0]", upstreams: &[], caches: &["z"], tls: None };
        super::super::Cache::validate(&at, &raw, None).unwrap().unwrap()
    }

    fn head(request: &str) -> RequestHead {
        let mut buf = BytesMut::from(request);
        parse_request(&mut buf, &RequestLimits::default()).unwrap().unwrap()
    }

    const GET: &str = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";

    fn fresh_for(c: &Config, request: &str, status: u16, lines: &str) -> Option<u64> {
        let status = StatusCode::from_u16(status).unwrap();
        verdict(c, &head(request), status, lines.as_bytes()).map(|v| v.fresh_for.as_secs())
    }

    #[test]
    fn what_must_not_be_stored_is_not() {
        let c = config("");
        // 3: no-store, in the response or the request; private, in a shared cache.
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: no-store, max-age=60\r\n"), None);
        let no_store = "GET /a HTTP/1.1\r\nHost: x\r\nCache-Control: no-store\r\n\r\n";
        assert_eq!(fresh_for(&c, no_store, 200, "cache-control: max-age=60\r\n"), None);
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: private, max-age=60\r\n"), None);
        // 3.5: a request with Authorization, unless the response allows a shared cache.
        let auth = "GET /a HTTP/1.1\r\nHost: x\r\nAuthorization: Basic YTpi\r\n\r\n";
        assert_eq!(fresh_for(&c, auth, 200, "cache-control: max-age=60\r\n"), None);
        assert_eq!(fresh_for(&c, auth, 200, "cache-control: s-maxage=60\r\n"), Some(60));
        // 3: a status the cache does not understand (206 without range support).
        assert_eq!(fresh_for(&c, GET, 206, "cache-control: max-age=60\r\n"), None);
        // Vary: * never matches a later request (4.1).
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: max-age=60\r\nvary: *\r\n"), None);
        // no-cache: stored only to be revalidated, which a zero lifetime here leaves out.
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: no-cache, max-age=60\r\n"), None);
    }

    #[test]
    fn freshness_comes_from_s_maxage_then_max_age_then_expires_less_the_age() {
        let c = config("");
        // 4.2.1: s-maxage over max-age in a shared cache; max-age over Expires.
        let both = "cache-control: max-age=10, s-maxage=30\r\nexpires: Thu, 01 Jan 2037 00:00:00 GMT\r\n";
        assert_eq!(fresh_for(&c, GET, 200, both), Some(30));
        let age = "cache-control: max-age=60\r\nage: 20\r\n";
        let left = fresh_for(&c, GET, 200, age).unwrap();
        assert!((39..=40).contains(&left), "{left}");
        // Expires against Date.
        let expires = "date: Mon, 02 Nov 2026 10:00:00 GMT\r\nexpires: Mon, 02 Nov 2026 10:00:00 GMT\r\n";
        assert_eq!(fresh_for(&c, GET, 200, expires), None, "expired at once");
        // 4.2.2: the heuristic, a tenth of the time since Last-Modified, only without any.
        let now = SystemTime::now();
        let date = httpdate::fmt_http_date(now);
        let modified = httpdate::fmt_http_date(now - Duration::from_secs(1000));
        let heuristic = format!("date: {date}\r\nlast-modified: {modified}\r\n");
        let h = fresh_for(&c, GET, 200, &heuristic).unwrap();
        assert!((99..=100).contains(&h), "{h}");
    }

    #[test]
    fn valid_stands_in_only_for_a_response_without_freshness_and_ignore_headers_drops_them() {
        let c = config(", valid = { \"200\" = \"5m\" }");
        assert_eq!(fresh_for(&c, GET, 200, ""), Some(300));
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: max-age=7\r\n"), Some(7));
        assert_eq!(fresh_for(&c, GET, 404, ""), None, "no lifetime for a status valid does not name");
        let c = config(", valid = { any = \"1m\" }, ignore_headers = [\"Cache-Control\"]");
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: no-store\r\n"), Some(60));
        let c = config("");
        assert_eq!(fresh_for(&c, GET, 200, "cache-control: max-age=60\r\nset-cookie: a=1\r\n"), None);
        assert!(invalidates(&Method::POST, StatusCode::CREATED));
        assert!(!invalidates(&Method::POST, StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!invalidates(&Method::GET, StatusCode::OK));
    }
}
