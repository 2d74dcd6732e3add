//! What a key holds: a stored response, with its freshness and validators, or the names of the
//! request headers its responses vary by.

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::StatusCode;

use crate::http1::request::RequestHead;

/// What a key holds.
pub(crate) enum Entry {
    /// A response.
    Response(Stored),
    /// The key's responses vary by these request headers (lower case): each is stored under
    /// the key with the request's values of them ([`variant_key`]).
    Vary(Box<[String]>),
}

impl Entry {
    /// What it takes of the zone's `max_size`: its bytes and a fixed share for the entry, its
    /// key and the store's slot.
    pub(crate) fn weight(&self, key: &[u8]) -> u64 {
        const OVERHEAD: u64 = 256;
        let own = match self {
            Entry::Response(s) => (s.lines.len() + s.body.len()) as u64,
            Entry::Vary(names) => names.iter().map(|n| n.len() as u64).sum(),
        };
        OVERHEAD + key.len() as u64 + own
    }
}

/// A response as stored: its head as the backend sent it, less `Set-Cookie` and `Age`, and
/// its whole body.
pub(crate) struct Stored {
    pub status: StatusCode,
    /// `name: value\r\n` each.
    pub lines: Vec<u8>,
    pub body: Bytes,
    /// When it was stored, and how old it was then.
    pub(super) stored_at: Instant,
    pub(super) age: Duration,
    /// How long it stays fresh from `stored_at`.
    pub(super) fresh_for: Duration,
    pub(super) etag: Option<Vec<u8>>,
    pub(super) last_modified: Option<SystemTime>,
    /// How long past `fresh_for` it may be served while revalidated, and when the backend
    /// fails (`stale-while-revalidate`, `stale-if-error`).
    pub(super) while_revalidating: Duration,
    pub(super) if_error: Duration,
    /// `must-revalidate`, `proxy-revalidate` or `s-maxage`: never served stale.
    pub(super) stale_forbidden: bool,
}

impl Stored {
    /// Whether it may still be served without asking the backend.
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.stored_at) < self.fresh_for
    }

    /// How long it has been stale at `now` (zero while fresh).
    fn stale_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.stored_at)
            .saturating_sub(self.fresh_for)
    }

    /// Whether it may be served stale at all, as `use_stale` asks (RFC 9111 section 4.2.4:
    /// not with `must-revalidate`, `proxy-revalidate` or `s-maxage`).
    pub(crate) fn may_be_served_stale(&self) -> bool {
        !self.stale_forbidden
    }

    /// Whether its own `stale-while-revalidate` lets it be served while it is updated.
    pub(crate) fn may_serve_while_revalidating(&self, now: Instant) -> bool {
        self.may_be_served_stale() && self.stale_for(now) < self.while_revalidating
    }

    /// Whether its own `stale-if-error` lets it be served when the backend fails.
    pub(crate) fn may_serve_on_error(&self, now: Instant) -> bool {
        self.may_be_served_stale() && self.stale_for(now) < self.if_error
    }

    /// Whether it has a validator, for a conditional request.
    pub(crate) fn validator_lines(&self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(etag) = &self.etag {
            out.extend_from_slice(b"if-none-match: ");
            out.extend_from_slice(etag);
            out.extend_from_slice(b"\r\n");
        }
        if let Some(modified) = self.last_modified {
            out.extend_from_slice(b"if-modified-since: ");
            out.extend_from_slice(httpdate::fmt_http_date(modified).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        (!out.is_empty()).then_some(out)
    }

    /// Its header lines updated by a `304`'s `lines` (RFC 9111 section 4.3.4): each field the
    /// 304 has replaces the stored one of that name; the framing fields are not taken.
    pub(crate) fn refreshed_lines(&self, lines: &[u8]) -> Vec<u8> {
        let name = |line: &[u8]| -> Vec<u8> {
            let n = line.split(|&b| b == b':').next().unwrap_or_default();
            n.trim_ascii().to_ascii_lowercase()
        };
        let framing = |n: &[u8]| {
            matches!(n, b"content-length" | b"transfer-encoding" | b"set-cookie" | b"age")
        };
        let new: Vec<&[u8]> = (lines.split_inclusive(|&b| b == b'\n'))
            .filter(|l| l.contains(&b':') && !framing(&name(l)))
            .collect();
        let names: Vec<Vec<u8>> = new.iter().map(|l| name(l)).collect();
        let mut out = Vec::with_capacity(self.lines.len() + lines.len());
        for line in self.lines.split_inclusive(|&b| b == b'\n') {
            if !names.contains(&name(line)) {
                out.extend_from_slice(line);
            }
        }
        for line in new {
            out.extend_from_slice(line);
        }
        out
    }

    /// Its `Age` now, in seconds.
    pub(crate) fn age(&self, now: Instant) -> u64 {
        (self.age.saturating_add(now.saturating_duration_since(self.stored_at))).as_secs()
    }

    /// Whether `head`'s own condition holds for it, so that the answer is `304 Not Modified`
    /// (RFC 9110 section 13.2.2): `If-None-Match` by weak comparison when the request has it,
    /// else `If-Modified-Since` against `Last-Modified`.
    pub(crate) fn not_modified(&self, head: &RequestHead) -> bool {
        // RFC 9110 section 13.2.1: only a 2xx answers a condition.
        if !self.status.is_success() {
            return false;
        }
        let mut none_match = head.header_values("if-none-match").peekable();
        if none_match.peek().is_some() {
            let Some(etag) = &self.etag else {
                return false;
            };
            let ours = weak(etag);
            return none_match
                .flat_map(|v| v.split(|&b| b == b','))
                .map(<[u8]>::trim_ascii)
                .any(|tag| tag == b"*" || weak(tag) == ours);
        }
        let since = head
            .header_values("if-modified-since")
            .next()
            .and_then(|v| httpdate::parse_http_date(std::str::from_utf8(v).ok()?).ok());
        match (since, self.last_modified) {
            (Some(since), Some(modified)) => modified <= since,
            _ => false,
        }
    }
}

/// An entity tag without its weak prefix, for weak comparison.
fn weak(tag: &[u8]) -> &[u8] {
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

/// The key of one variant of `key`'s responses: the key, then each header's values in the
/// request, in the order `Vary` names them.
pub(crate) fn variant_key(key: &[u8], names: &[String], head: &RequestHead) -> Vec<u8> {
    let mut out = key.to_vec();
    for name in names {
        out.push(0);
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        for (i, v) in head.header_values(name).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(v);
        }
    }
    out
}
