//! What a `hash` upstream hashes for one request: the client's address, the request target, a
//! header's value or a cookie's, read from the head without copying it.

use std::net::IpAddr;

use crate::http1::request::RequestHead;
use crate::syntax::request_key::{HashKey, with_client, with_key};
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
