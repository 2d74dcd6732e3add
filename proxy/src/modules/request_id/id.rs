//! One request's ID, passed to the backend, returned to the client and written to the access
//! log; and the W3C trace context's trace id beside it.
//!
//! The client's own ID is kept when valid ([`is_valid_id`]); an invalid one is dropped and
//! replaced, so nothing a client sends under that name reaches a backend or the log unchecked.
//! A made ID is nginx's `$request_id` form (see [`RequestIds`] for why).
//!
//! `traceparent` (W3C Trace Context) always passes through unchanged: pinlb records no spans,
//! so it does not make itself a parent. With `traceparent = true`, a request without a valid
//! one gets one started: version 00, the request ID as its trace id (a client's ID that is not
//! 32 hex digits gets a random trace id instead), a random parent id, and the sampled flag set,
//! since the access log records it. Its trace id goes into the log either way.

use super::RequestIds;
use crate::http1::request::RequestHead;

/// Longest ID kept from a client.
const MAX_ID: usize = 200;

/// One request's ID and trace id, and the lines pinlb writes for them. One allocation: the
/// lines hold the ID, which the log reads from there.
#[derive(Debug)]
pub struct RequestId {
    /// `NAME: ID\r\n` (the configured name, lower-case), then `traceparent: …\r\n` when one
    /// was started.
    lines: Vec<u8>,
    /// The header name's length, and where the ID line ends in `lines`.
    name_len: usize,
    id_end: usize,
    /// The ID was made, so its line goes upstream; a client's valid one is among the request's
    /// own lines already.
    made: bool,
    /// The W3C trace id, from the client's traceparent or the one started; 32 hex digits.
    trace_id: Option<[u8; 32]>,
}

impl RequestId {
    /// The ID of `head`, keeping the client's when valid; a client's invalid ID line, or a
    /// second one, is taken out of the head's lines (as is an invalid traceparent when one
    /// is started in its place).
    pub fn of(head: &mut RequestHead, config: &RequestIds) -> RequestId {
        let name = config.header.as_bytes();
        let mut kept: Option<(usize, usize)> = None;
        let mut invalid = false;
        let mut traceparent: Option<Option<[u8; 32]>> = None;
        let lines = head.lines();
        for (n, value) in head.line_values() {
            if n.len() == name.len() && n.eq_ignore_ascii_case(name) {
                match (&kept, is_valid_id(value)) {
                    (None, true) => {
                        let at = value.as_ptr() as usize - lines.as_ptr() as usize;
                        kept = Some((at, at + value.len()));
                    }
                    _ => invalid = true,
                }
            } else if n.len() == 11 && n.eq_ignore_ascii_case(b"traceparent") {
                traceparent.get_or_insert_with(|| trace_id(value));
            }
        }
        let mut out = Vec::with_capacity(name.len() + 4 + MAX_ID.min(64) + 70);
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        let made = match kept {
            // Two IDs, or a bad one: neither is trusted, and a new one replaces them.
            Some((from, to)) if !invalid => {
                out.extend_from_slice(&lines[from..to]);
                false
            }
            _ => {
                if invalid {
                    head.remove_lines(name);
                }
                out.extend_from_slice(&hex(fastrand::u128(..)));
                true
            }
        };
        out.extend_from_slice(b"\r\n");
        let id_end = out.len();
        let mut id = RequestId {
            lines: out,
            name_len: name.len(),
            id_end,
            made,
            trace_id: traceparent.flatten(),
        };
        if id.trace_id.is_none() && config.traceparent {
            if traceparent.is_some() {
                head.remove_lines(b"traceparent");
            }
            id.start_trace();
        }
        id
    }

    /// Starts a W3C trace: its trace id is the request ID when that is one (32 hex digits, not
    /// all zero), a random one otherwise.
    #[cold]
    fn start_trace(&mut self) {
        let trace = match <[u8; 32]>::try_from(self.id().as_bytes()) {
            Ok(id) if is_trace_id(&id) => id.map(|b| b.to_ascii_lowercase()),
            _ => hex(fastrand::u128(1..)),
        };
        let parent = hex(u128::from(fastrand::u64(1..)));
        self.lines.extend_from_slice(b"traceparent: 00-");
        self.lines.extend_from_slice(&trace);
        self.lines.push(b'-');
        self.lines.extend_from_slice(&parent[16..]);
        self.lines.extend_from_slice(b"-01\r\n");
        self.trace_id = Some(trace);
    }

    /// The ID.
    pub fn id(&self) -> &str {
        let id = &self.lines[self.name_len + 2..self.id_end - 2];
        // Made of hex digits, or checked by `is_valid_id`: ASCII.
        std::str::from_utf8(id).unwrap_or_default()
    }

    /// The trace id, when the request has a trace.
    pub fn trace_id(&self) -> Option<&str> {
        self.trace_id
            .as_ref()
            .and_then(|t| std::str::from_utf8(t).ok())
    }

    /// The lines pinlb adds upstream: the ID's when it made it, and a started traceparent.
    pub fn upstream_lines(&self) -> &[u8] {
        if self.made {
            &self.lines
        } else {
            &self.lines[self.id_end..]
        }
    }

    /// Adds the ID to a response's header lines, unless the backend's response has it already
    /// (a backend that echoes the ID it got sends the same one).
    pub fn respond(&self, headers: &mut Vec<u8>) {
        if !has_header(headers, &self.lines[..self.name_len]) {
            headers.extend_from_slice(&self.lines[..self.id_end]);
        }
    }
}

/// Whether `lines` (`name: value\r\n` each) has a line named `name` (lower-case). Looks only
/// where the name's first letter is, in either case, as memchr finds it: most responses have
/// none of them at the start of a line.
fn has_header(lines: &[u8], name: &[u8]) -> bool {
    let Some(&first) = name.first() else {
        return false;
    };
    memchr::memchr2_iter(first, first.to_ascii_uppercase(), lines).any(|at| {
        (at == 0 || lines[at - 1] == b'\n')
            && lines.get(at + name.len()) == Some(&b':')
            && lines[at..at + name.len()].eq_ignore_ascii_case(name)
    })
}

/// 1 to [`MAX_ID`] bytes of letters, digits and `-_.:/+=@`: UUIDs, ULIDs, hex and base64 IDs,
/// and nothing that could break a header or a log line.
pub fn is_valid_id(v: &[u8]) -> bool {
    (1..=MAX_ID).contains(&v.len())
        && v.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.:/+=@".contains(&b))
}

/// The trace id of a valid W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`; a later version
/// may add fields after those, which are ignored); `None` for an invalid one, as the
/// specification's all-zero ids and version `ff` are.
fn trace_id(v: &[u8]) -> Option<[u8; 32]> {
    let v = v.trim_ascii();
    let lower_hex = |s: &[u8]| s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let (version, rest) = (v.get(..2)?, v.get(2..)?);
    if !lower_hex(version) || version == b"ff" || rest.first() != Some(&b'-') {
        return None;
    }
    let trace = v.get(3..35)?;
    let parent = v.get(36..52)?;
    let flags = v.get(53..55)?;
    let well_formed = v.get(35) == Some(&b'-')
        && v.get(52) == Some(&b'-')
        && lower_hex(trace)
        && lower_hex(parent)
        && lower_hex(flags)
        && trace.iter().any(|&b| b != b'0')
        && parent.iter().any(|&b| b != b'0');
    // Version 00 has exactly these fields; a later one may carry more after a '-'.
    let ends = match version {
        b"00" => v.len() == 55,
        _ => v.len() == 55 || v.get(55) == Some(&b'-'),
    };
    if well_formed && ends {
        trace.try_into().ok()
    } else {
        None
    }
}

/// 32 hex digits, not all zero.
fn is_trace_id(v: &[u8]) -> bool {
    v.iter().all(u8::is_ascii_hexdigit) && v.iter().any(|&b| b != b'0')
}

/// `n` as 32 lower-case hex digits.
fn hex(n: u128) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (pair, b) in out.chunks_exact_mut(2).zip(n.to_be_bytes()) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(lines: &str) -> RequestHead {
        let mut buf =
            bytes::BytesMut::from(format!("GET / HTTP/1.1\r\nHost: a\r\n{lines}\r\n").as_str());
        crate::http1::request::parse_request(&mut buf, &Default::default())
            .unwrap()
            .unwrap()
    }

    fn ids(traceparent: bool) -> RequestIds {
        RequestIds {
            traceparent,
            ..RequestIds::default()
        }
    }

    #[test]
    fn a_clients_valid_id_is_kept_and_not_sent_twice() {
        let mut h = head("X-Request-ID: abc-123\r\n");
        let r = RequestId::of(&mut h, &ids(false));
        assert_eq!(r.id(), "abc-123");
        assert!(r.upstream_lines().is_empty());
        assert_eq!(h.lines(), b"X-Request-ID: abc-123\r\n");
    }

    #[test]
    fn a_missing_or_invalid_id_is_made_as_32_hex_digits_and_the_clients_dropped() {
        let mut h = head("x-request-id: a b\"c\r\nAccept: */*\r\n");
        let r = RequestId::of(&mut h, &ids(false));
        assert_eq!(r.id().len(), 32);
        assert!(r.id().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(h.lines(), b"Accept: */*\r\n");
        assert_eq!(
            r.upstream_lines(),
            format!("x-request-id: {}\r\n", r.id()).as_bytes()
        );
        let mut two = head("X-Request-ID: a\r\nX-Request-ID: b\r\n");
        let r = RequestId::of(&mut two, &ids(false));
        assert_eq!(r.id().len(), 32);
        assert_eq!(two.lines(), b"");
        let other = RequestId::of(&mut head(""), &ids(false));
        assert_ne!(other.id(), r.id());
    }

    #[test]
    fn a_valid_traceparent_passes_unchanged_and_names_the_trace() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = head(&format!("traceparent: {tp}\r\n"));
        let r = RequestId::of(&mut h, &ids(true));
        assert_eq!(r.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert!(!String::from_utf8_lossy(r.upstream_lines()).contains("traceparent"));
        assert_eq!(h.lines(), format!("traceparent: {tp}\r\n").as_bytes());
    }

    #[test]
    fn a_trace_is_started_only_when_asked_with_the_request_id_as_its_trace_id() {
        let r = RequestId::of(&mut head(""), &ids(false));
        assert_eq!(r.trace_id(), None);
        let r = RequestId::of(&mut head(""), &ids(true));
        let lines = String::from_utf8(r.upstream_lines().to_vec()).unwrap();
        let tp = lines
            .lines()
            .find_map(|l| l.strip_prefix("traceparent: "))
            .unwrap();
        assert_eq!(
            trace_id(tp.as_bytes()).as_ref().map(|t| &t[..]),
            Some(r.id().as_bytes())
        );
        assert_eq!(r.trace_id(), Some(r.id()));
        assert!(tp.ends_with("-01"));
        // An invalid one is replaced.
        let mut h =
            head("traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01\r\n");
        let r = RequestId::of(&mut h, &ids(true));
        assert_eq!(h.lines(), b"");
        assert!(r.trace_id().is_some());
    }

    #[test]
    fn traceparents_are_checked_as_the_w3c_says() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(trace_id(ok.as_bytes()).is_some());
        for bad in [
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(trace_id(bad.as_bytes()), None, "{bad}");
        }
        assert!(
            trace_id(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later").is_some()
        );
    }

    #[test]
    fn the_response_gets_the_id_unless_the_backend_sent_it() {
        let r = RequestId::of(&mut head("X-Request-ID: abc\r\n"), &ids(false));
        let mut h = b"content-type: text/plain\r\n".to_vec();
        r.respond(&mut h);
        assert_eq!(h, b"content-type: text/plain\r\nx-request-id: abc\r\n");
        let mut echoed = b"X-Request-Id: abc\r\n".to_vec();
        r.respond(&mut echoed);
        assert_eq!(echoed, b"X-Request-Id: abc\r\n");
        let mut later = b"a: b\r\nx-request-idx: 1\r\nx-request-id: 2\r\n".to_vec();
        r.respond(&mut later);
        assert_eq!(later, b"a: b\r\nx-request-idx: 1\r\nx-request-id: 2\r\n");
        assert!(!has_header(b"a: x-request-id\r\n", b"x-request-id"));
    }

    #[test]
    fn hex_digits_are_the_number_in_order() {
        assert_eq!(
            &hex(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210),
            b"0123456789abcdeffedcba9876543210"
        );
    }
}
