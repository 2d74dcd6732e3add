//! `[request_id]`: one ID per request, passed to the backend, returned to the client and
//! written to the access log; and the W3C trace context's trace id beside it.
//!
//! The client's own ID is kept when valid ([`is_valid_id`]); an invalid one is dropped and
//! replaced, so nothing a client sends under that name reaches a backend or the log unchecked.
//! A made ID is nginx's `$request_id` form (see `config::RequestIds` for why).
//!
//! `traceparent` (W3C Trace Context) always passes through unchanged: pinlb records no spans,
//! so it does not make itself a parent. With `traceparent = true`, a request without a valid
//! one gets one started: version 00, the request ID as its trace id (a client's ID that is not
//! 32 hex digits gets a random trace id instead), a random parent id, and the sampled flag set,
//! since the access log records it. Its trace id goes into the log either way.

use crate::config::RequestIds;
use crate::http1::request::RequestHead;

/// Longest ID kept from a client.
const MAX_ID: usize = 200;

/// One request's ID and trace id, and the lines pinlb adds for them on the way upstream.
#[derive(Debug)]
pub struct RequestId {
    /// The client's valid ID, or a made one.
    pub id: Box<str>,
    /// The W3C trace id, from the client's traceparent or the one started; 32 hex digits.
    pub trace_id: Option<Box<str>>,
    /// `x-request-id: …\r\n` when the ID was made (a client's valid one is already among the
    /// request's lines), and `traceparent: …\r\n` when one was started.
    pub upstream_lines: Vec<u8>,
    /// The header's name, for the response's line.
    header: Box<str>,
}

impl RequestId {
    /// The ID of `head`, keeping the client's when valid; a client's invalid ID line, or a
    /// second one, is taken out of the head's lines (as is an invalid traceparent when one
    /// is started in its place).
    pub fn of(head: &mut RequestHead, config: &RequestIds) -> RequestId {
        let mut kept: Option<Box<str>> = None;
        let mut invalid = false;
        let mut traceparent: Option<Option<Box<str>>> = None;
        for (name, value) in head.line_values() {
            if name.eq_ignore_ascii_case(config.header.as_bytes()) {
                match (&kept, is_valid_id(value)) {
                    (None, true) => {
                        kept = std::str::from_utf8(value).ok().map(Into::into);
                    }
                    _ => invalid = true,
                }
            } else if name.eq_ignore_ascii_case(b"traceparent") && traceparent.is_none() {
                traceparent = Some(trace_id(value).map(Into::into));
            }
        }
        // Two IDs, or a bad one: neither is trusted, and a new one replaces them.
        if invalid {
            kept = None;
            head.remove_lines(config.header.as_bytes());
        }
        let mut upstream_lines = Vec::new();
        let id: Box<str> = match kept {
            Some(id) => id,
            None => {
                let id: Box<str> = hex(fastrand::u128(..)).into();
                line_into(&mut upstream_lines, config.header.as_bytes(), id.as_bytes());
                id
            }
        };
        let mut trace = traceparent.clone().flatten();
        if trace.is_none() && config.traceparent {
            if traceparent.is_some() {
                head.remove_lines(b"traceparent");
            }
            let trace_id: Box<str> = if id.len() == 32 && is_trace_id(id.as_bytes()) {
                id.to_ascii_lowercase().into()
            } else {
                hex(fastrand::u128(1..)).into()
            };
            let parent = &hex(u128::from(fastrand::u64(1..)))[16..];
            let value = format!("00-{trace_id}-{parent}-01");
            line_into(&mut upstream_lines, b"traceparent", value.as_bytes());
            trace = Some(trace_id);
        }
        RequestId {
            id,
            trace_id: trace,
            upstream_lines,
            header: config.header.as_str().into(),
        }
    }

    /// Adds the ID to a response's header lines, unless the backend's response has it already
    /// (a backend that echoes the ID it got sends the same one).
    pub fn respond(&self, headers: &mut Vec<u8>) {
        let has = headers.split(|&b| b == b'\n').any(|line| {
            line.split(|&b| b == b':')
                .next()
                .is_some_and(|n| n.eq_ignore_ascii_case(self.header.as_bytes()))
        });
        if !has {
            line_into(headers, self.header.as_bytes(), self.id.as_bytes());
        }
    }
}

fn line_into(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
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
fn trace_id(v: &[u8]) -> Option<&str> {
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
        std::str::from_utf8(trace).ok()
    } else {
        None
    }
}

/// 32 hex digits, not all zero.
fn is_trace_id(v: &[u8]) -> bool {
    v.iter().all(u8::is_ascii_hexdigit) && v.iter().any(|&b| b != b'0')
}

/// `n` as 32 lower-case hex digits.
fn hex(n: u128) -> String {
    format!("{n:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(lines: &str) -> RequestHead {
        let mut buf = bytes::BytesMut::from(format!("GET / HTTP/1.1\r\nHost: a\r\n{lines}\r\n").as_str());
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
        assert_eq!(&*r.id, "abc-123");
        assert!(r.upstream_lines.is_empty());
        assert_eq!(h.lines(), b"X-Request-ID: abc-123\r\n");
    }

    #[test]
    fn a_missing_or_invalid_id_is_made_as_32_hex_digits_and_the_clients_dropped() {
        let mut h = head("x-request-id: a b\"c\r\nAccept: */*\r\n");
        let r = RequestId::of(&mut h, &ids(false));
        assert_eq!(r.id.len(), 32);
        assert!(r.id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(h.lines(), b"Accept: */*\r\n");
        assert_eq!(r.upstream_lines, format!("x-request-id: {}\r\n", r.id).as_bytes());
        let mut two = head("X-Request-ID: a\r\nX-Request-ID: b\r\n");
        let r = RequestId::of(&mut two, &ids(false));
        assert_eq!(r.id.len(), 32);
        assert_eq!(two.lines(), b"");
        let other = RequestId::of(&mut head(""), &ids(false));
        assert_ne!(other.id, r.id);
    }

    #[test]
    fn a_valid_traceparent_passes_unchanged_and_names_the_trace() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = head(&format!("traceparent: {tp}\r\n"));
        let r = RequestId::of(&mut h, &ids(true));
        assert_eq!(r.trace_id.as_deref(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert!(!String::from_utf8_lossy(&r.upstream_lines).contains("traceparent"));
        assert_eq!(h.lines(), format!("traceparent: {tp}\r\n").as_bytes());
    }

    #[test]
    fn a_trace_is_started_only_when_asked_with_the_request_id_as_its_trace_id() {
        let r = RequestId::of(&mut head(""), &ids(false));
        assert_eq!(r.trace_id, None);
        let r = RequestId::of(&mut head(""), &ids(true));
        let lines = String::from_utf8(r.upstream_lines.clone()).unwrap();
        let tp = lines.lines().find_map(|l| l.strip_prefix("traceparent: ")).unwrap();
        assert_eq!(trace_id(tp.as_bytes()), Some(&*r.id));
        assert_eq!(r.trace_id.as_deref(), Some(&*r.id));
        assert!(tp.ends_with("-01"));
        // An invalid one is replaced.
        let mut h = head("traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01\r\n");
        let r = RequestId::of(&mut h, &ids(true));
        assert_eq!(h.lines(), b"");
        assert!(r.trace_id.is_some());
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
    }
}
