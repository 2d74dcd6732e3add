//! What a request is known by, for a `hash` upstream (`hash = "..."`) and a rate zone
//! (`[limit.NAME] key = "..."`): the client's address, the request target, a header's value or
//! a cookie's, as the file names it and as read from a request's head without copying it.

use std::net::IpAddr;

use crate::http1::request::RequestHead;

/// A request's key, as a `hash` upstream or a rate zone names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKey {
    /// The client's address (the TCP peer, as nginx's `$remote_addr`).
    ClientIp,
    /// The request target as received, query included (nginx's `$request_uri`).
    Uri,
    /// A request header's value (`header:X-User`); the name is kept lower-case.
    Header(String),
    /// A cookie's value (`cookie:session`).
    Cookie(String),
}

impl HashKey {
    const EXPECTED: &'static str =
        "expected \"client_ip\", \"uri\", \"header:NAME\" or \"cookie:NAME\"";

    /// Reads `hash`'s value; the error says what was expected.
    pub fn parse(s: &str) -> Result<HashKey, String> {
        let named = |rest: &str, what: &str| {
            if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                return Err(format!("\"{s}\" names no {what}, {}", HashKey::EXPECTED));
            }
            Ok(rest.to_ascii_lowercase())
        };
        match s.split_once(':') {
            None if s == "client_ip" => Ok(HashKey::ClientIp),
            None if s == "uri" => Ok(HashKey::Uri),
            Some(("header", name)) => named(name, "header").map(HashKey::Header),
            Some(("cookie", name)) => named(name, "cookie").map(HashKey::Cookie),
            _ => Err(format!("unknown value \"{s}\", {}", HashKey::EXPECTED)),
        }
    }
}

impl std::fmt::Display for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HashKey::ClientIp => f.write_str("client_ip"),
            HashKey::Uri => f.write_str("uri"),
            HashKey::Header(name) => write!(f, "header:{name}"),
            HashKey::Cookie(name) => write!(f, "cookie:{name}"),
        }
    }
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
