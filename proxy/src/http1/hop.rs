//! The hop-by-hop headers (RFC 9110 §7.6.1): the one table both sides of the HTTP/1.1 codec
//! use, and which route header rules may not touch. Its own module so that config validation can
//! read it without importing the codec.

/// The hop-by-hop headers (RFC 9110 §7.6.1), recognised on raw bytes; both directions use it.
pub enum Hop {
    Connection,
    TransferEncoding,
    /// Forwarded only on a request that asks to upgrade (and in a 101's answer); dropped
    /// otherwise.
    Upgrade,
    /// Keep-Alive, Proxy-Connection, TE, Trailer: dropped.
    Other,
}

impl Hop {
    pub fn of(name: &[u8]) -> Option<Hop> {
        let is = |s: &str| super::name::is(name, s.as_bytes());
        // The length check first: almost every header is ruled out by it.
        match name.len() {
            10 if is("connection") => Some(Hop::Connection),
            17 if is("transfer-encoding") => Some(Hop::TransferEncoding),
            10 if is("keep-alive") => Some(Hop::Other),
            16 if is("proxy-connection") => Some(Hop::Other),
            2 if is("te") => Some(Hop::Other),
            7 if is("upgrade") => Some(Hop::Upgrade),
            7 if is("trailer") => Some(Hop::Other),
            _ => None,
        }
    }
}
