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
        HashKey::Cookie(name) => head.cookie(name).map(f),
    }
}
