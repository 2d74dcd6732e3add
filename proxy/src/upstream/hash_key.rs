//! What a `hash` upstream hashes for one request: the client's address, the request target, a
//! header's value or a cookie's, read from the head without copying it.

use std::net::IpAddr;

use crate::config::HashKey;
use crate::http1::request::RequestHead;
use crate::upstream::balance::hash;

/// The hash of `spec`'s key in this request, or `None` when the request has no such key (no
/// such header or cookie, or an empty one); the pick falls back to round robin then.
pub fn request_key(spec: &HashKey, head: &RequestHead, client: IpAddr) -> Option<u64> {
    with_key(spec, head, client, hash)
}

/// What a `hash = "client_ip"` upstream hashes for a TCP listener's connection from `client`:
/// the same as for an HTTP request from it.
pub fn client_key(client: IpAddr) -> u64 {
    with_client(client, hash)
}

/// `f` of the client's address as a key: its octets, uncopied.
pub(crate) fn with_client<R>(client: IpAddr, f: impl FnOnce(&[u8]) -> R) -> R {
    match client {
        IpAddr::V4(ip) => f(&ip.octets()),
        IpAddr::V6(ip) => f(&ip.octets()),
    }
}

/// `f` of `spec`'s key in this request (the address's octets, the target, a header's or a
/// cookie's value, uncopied), or `None` when the request has no such key: what a `hash`
/// upstream hashes and a rate zone counts.
pub(crate) fn with_key<R>(
    spec: &HashKey,
    head: &RequestHead,
    client: IpAddr,
    f: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    match spec {
        HashKey::ClientIp => Some(with_client(client, f)),
        HashKey::Uri => Some(f(head.target())),
        HashKey::Header(name) => head.header_values(name).find(|v| !v.is_empty()).map(f),
        HashKey::Cookie(name) => head
            .header_values("cookie")
            .find_map(|v| cookie(v, name))
            .map(f),
    }
}

/// Cookie `name`'s value in one `Cookie` header (`a=1; b=2`); `None` when absent or empty.
pub(crate) fn cookie<'a>(value: &'a [u8], name: &str) -> Option<&'a [u8]> {
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

    #[test]
    fn a_cookie_is_found_among_its_pairs() {
        assert_eq!(
            cookie(b"theme=dark; session=s1", "session"),
            Some(&b"s1"[..])
        );
        assert_eq!(
            cookie(b"theme=dark;session=s1", "theme"),
            Some(&b"dark"[..])
        );
        assert_eq!(cookie(b"sessionx=1", "session"), None);
        assert_eq!(cookie(b"a=", "a"), None);
    }
}
