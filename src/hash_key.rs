//! What a `hash` upstream hashes for one request: the client's address, the request target, a
//! header's value or a cookie's, read from the head without copying it.

use std::net::IpAddr;

use crate::balance::hash;
use crate::config::HashKey;
use crate::http1::request::RequestHead;

/// The hash of `spec`'s key in this request, or `None` when the request has no such key (no
/// such header or cookie, or an empty one); the pick falls back to round robin then.
pub fn request_key(spec: &HashKey, head: &RequestHead, client: IpAddr) -> Option<u64> {
    match spec {
        HashKey::ClientIp => Some(match client {
            IpAddr::V4(ip) => hash(&ip.octets()),
            IpAddr::V6(ip) => hash(&ip.octets()),
        }),
        HashKey::Uri => Some(hash(head.target())),
        HashKey::Header(name) => header(head.lines(), name).map(hash),
        HashKey::Cookie(name) => header_values(head.lines(), "cookie")
            .find_map(|v| cookie(v, name))
            .map(hash),
    }
}

/// The values of every `name:` line in `lines` (`name: value\r\n` each; `name` lower-case),
/// trimmed.
fn header_values<'a>(lines: &'a [u8], name: &'a str) -> impl Iterator<Item = &'a [u8]> {
    lines.split(|&b| b == b'\n').filter_map(move |line| {
        let colon = line.iter().position(|&b| b == b':')?;
        let (n, v) = line.split_at(colon);
        n.eq_ignore_ascii_case(name.as_bytes())
            .then(|| v[1..].trim_ascii())
    })
}

/// The first non-empty value of header `name`.
fn header<'a>(lines: &'a [u8], name: &'a str) -> Option<&'a [u8]> {
    header_values(lines, name).find(|v| !v.is_empty())
}

/// Cookie `name`'s value in one `Cookie` header (`a=1; b=2`); `None` when absent or empty.
fn cookie<'a>(value: &'a [u8], name: &str) -> Option<&'a [u8]> {
    value.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (n, v) = pair.split_at(eq);
        (n == name.as_bytes() && v.len() > 1).then(|| &v[1..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &[u8] =
        b"Host: a\r\nX-User: alice \r\ncookie: theme=dark; session=s1\r\nCookie: other=2\r\n";

    #[test]
    fn a_header_is_found_case_insensitively_and_trimmed() {
        assert_eq!(header(LINES, "x-user"), Some(&b"alice"[..]));
        assert_eq!(header(LINES, "x-missing"), None);
        assert_eq!(header(b"X-User:\r\n", "x-user"), None);
    }

    #[test]
    fn a_cookie_is_found_in_any_cookie_header() {
        let find = |name| header_values(LINES, "cookie").find_map(|v| cookie(v, name));
        assert_eq!(find("session"), Some(&b"s1"[..]));
        assert_eq!(find("other"), Some(&b"2"[..]));
        assert_eq!(find("sess"), None);
        assert_eq!(cookie(b"a=", "a"), None);
    }
}
