//! RFC 9111's rules for a shared cache, through `http-cache-semantics`: whether a response may
//! be stored, how long it stays fresh, and the request headers its variants are kept by. Asked
//! once per response that could be stored, never on a hit.

use std::time::{Duration, SystemTime};

use http::header::{CACHE_CONTROL, EXPIRES, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use http_cache_semantics::{CacheOptions, CachePolicy};

use super::Config;
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

/// `name: value\r\n` lines as a header map; lines that are not a valid field are left out.
pub(crate) fn header_map(lines: &[u8]) -> HeaderMap {
    let mut out = HeaderMap::new();
    for line in lines.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = line[colon + 1..].trim_ascii();
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            out.append(n, v);
        }
    }
    out
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
