//! What both sides of HTTP/1.1 share: the hop-by-hop table, the Connection header's tokens,
//! Content-Length, body framing on the way out, the status and chunk-size lines, and the text of
//! the error pages pinlb writes itself, and header lines to and from HTTP/2 header maps. Each
//! rule lives here once, so that a framing fix is made once for requests and responses alike.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

pub use crate::http1::hop::Hop;

/// What the Connection headers of one message say: `close`, `keep-alive`, and the other headers
/// they name, which are hop-by-hop too and are not passed on.
#[derive(Debug, Default)]
pub struct ConnectionTokens<'a> {
    pub close: bool,
    pub keep_alive: bool,
    named: Vec<&'a [u8]>,
}

impl<'a> ConnectionTokens<'a> {
    /// Reads every Connection header first: one may come after a header it names.
    #[inline(always)]
    pub fn scan(headers: &[httparse::Header<'a>]) -> Self {
        let mut tokens = ConnectionTokens::default();
        for h in headers {
            if super::name::is(h.name.as_bytes(), b"connection") {
                for t in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if super::name::is(t, b"close") {
                        tokens.close = true;
                    } else if super::name::is(t, b"keep-alive") {
                        tokens.keep_alive = true;
                    } else if !t.is_empty() {
                        tokens.named.push(t);
                    }
                }
            }
        }
        tokens
    }

    /// Whether a Connection header names this header (case-insensitive).
    #[inline]
    pub fn names(&self, name: &[u8]) -> bool {
        self.named.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// Whether the message lets its connection carry another: HTTP/1.1 unless `close`,
    /// HTTP/1.0 only with `keep-alive`.
    #[inline]
    pub fn keep_alive(&self, http11: bool) -> bool {
        !self.close && (http11 || self.keep_alive)
    }
}

/// The protocols of an Upgrade value that may go upstream, as one comma-separated list:
/// every one but `h2c`, which pinlb never forwards (it would turn the connection into HTTP/2
/// that neither pinlb nor the access log understands). Appended to `out`; nothing when none
/// is left.
pub(crate) fn upgrade_protocols(value: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    for p in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        let name = p.split(|&b| b == b'/').next().unwrap_or_default();
        if p.is_empty() || name.eq_ignore_ascii_case(b"h2c") {
            continue;
        }
        if out.len() > start {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(p);
    }
}

/// The Content-Length of a message head, all its headers taken together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentLength {
    Absent,
    Valid(u64),
    Invalid(&'static str),
}

/// The largest Content-Length taken: many servers read it as a signed 64-bit number, so pinlb
/// and the next hop could frame a larger one differently (nginx refuses it too).
const MAX_CONTENT_LENGTH: u64 = i64::MAX as u64;

impl ContentLength {
    /// Takes in one Content-Length header value. Several lines must agree. A list of equal
    /// numbers in one line (`3, 3`, which RFC 9110 §8.6 lets a recipient accept) is taken when
    /// `lists`: from backends, as hyper's client takes it; a request with one is refused, as
    /// hyper's server refused it.
    pub fn add(self, value: &[u8], lists: bool) -> ContentLength {
        if let ContentLength::Invalid(_) = self {
            return self;
        }
        let mut now = self;
        // Without `lists` the whole value is one part, and a comma in it makes it invalid.
        let parts = value.split(|&b| lists && b == b',');
        for part in parts {
            let part = part.trim_ascii();
            if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
                return ContentLength::Invalid(if lists {
                    "bad Content-Length"
                } else {
                    "invalid Content-Length"
                });
            }
            // At most 19 digits: no overflow.
            let n = part.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if n > MAX_CONTENT_LENGTH {
                return ContentLength::Invalid("Content-Length over 2^63-1");
            }
            now = match now {
                ContentLength::Absent => ContentLength::Valid(n),
                ContentLength::Valid(l) if l == n => now,
                ContentLength::Valid(_) => {
                    return ContentLength::Invalid("conflicting Content-Length values");
                }
                ContentLength::Invalid(_) => return now,
            };
        }
        now
    }
}

/// Takes in one Transfer-Encoding header value: whether the message's final coding is chunked
/// so far (`seen`, from earlier lines; a later line's codings come after an earlier one's). A
/// value with no coding in it changes nothing but marks Transfer-Encoding as present.
pub fn final_coding_chunked(seen: Option<bool>, value: &[u8]) -> Option<bool> {
    let last = value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .rfind(|t| !t.is_empty());
    match last {
        Some(t) => Some(t.eq_ignore_ascii_case(b"chunked")),
        None => seen.or(Some(false)),
    }
}

/// How a request's body is framed on its way to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// No body, and no framing header.
    None,
    /// `Content-Length` (0 included, when the client sent it).
    Length(u64),
    Chunked,
}

/// A response on its way to the client.
#[derive(Debug)]
pub struct Reply<B> {
    pub status: StatusCode,
    /// End-to-end header lines, `name: value\r\n` each. The client side adds the framing
    /// headers, from the body, and Date when there is none.
    pub headers: Vec<u8>,
    pub body: B,
}

/// `HTTP/1.1 200 OK\r\n`
///
/// This, `content_length_line` and `ConnectionTokens::scan` run on every request and are
/// inlined by force: as calls, with their small copies made through `memcpy`, they cost about
/// 250 instructions more per request (benches/callgrind.sh).
#[inline(always)]
pub(crate) fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Puts `HTTP/1.1 200 OK\r\n` in front of the header lines in `head`: a response's head is
/// built in the allocation the backend's lines came in, rather than copied into a new one
/// (one allocation and one copy fewer per response, about 100 instructions). The parser sizes
/// that allocation for the whole head it read, so the status line and the lines the client
/// side adds usually fit without growing it.
#[inline(always)]
pub(crate) fn prepend_status_line(head: &mut Vec<u8>, status: StatusCode) {
    let code = status.as_str().as_bytes();
    let reason = status.canonical_reason().unwrap_or("").as_bytes();
    let n = b"HTTP/1.1 ".len() + code.len() + 1 + reason.len() + 2;
    let lines = head.len();
    head.resize(lines + n, 0);
    head.copy_within(..lines, n);
    let (line, _) = head.split_at_mut(n);
    let (version, rest) = line.split_at_mut(9);
    version.copy_from_slice(b"HTTP/1.1 ");
    let (c, rest) = rest.split_at_mut(code.len());
    c.copy_from_slice(code);
    let (space, rest) = rest.split_at_mut(1);
    space[0] = b' ';
    let (r, crlf) = rest.split_at_mut(reason.len());
    r.copy_from_slice(reason);
    crlf.copy_from_slice(b"\r\n");
}

/// `content-length: 12\r\n`
#[inline(always)]
pub(crate) fn content_length_line(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A chunk's size line, `1a\r\n`, written into `out`.
pub(crate) fn chunk_size_line(out: &mut [u8; 18], len: usize) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut n = len;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = HEX[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    let d = &digits[i..];
    out[..d.len()].copy_from_slice(d);
    out[d.len()..d.len() + 2].copy_from_slice(b"\r\n");
    &out[..d.len() + 2]
}

/// The header line of every page pinlb writes itself.
pub(crate) const ERROR_PAGE_TYPE: &[u8] = b"content-type: text/plain; charset=utf-8\r\n";

/// The body of a page pinlb writes itself: `502 Bad Gateway: <cause>`.
pub(crate) fn error_page(status: StatusCode, cause: &dyn std::fmt::Display) -> String {
    format!(
        "{} {}: {cause}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )
}

/// Header lines (`name: value\r\n` each, as pinlb keeps heads) as an HTTP/2 header map,
/// without the connection-specific fields HTTP/2 forbids (RFC 9113 §8.2.2). A line that is not
/// a valid field is left out.
pub(crate) fn header_map(lines: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(lines.len() / 32);
    for line in lines.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if Hop::of(name).is_some() {
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            map.append(name, value);
        }
    }
    map
}

/// An HTTP/2 message's fields as header lines, `name: value\r\n` each, leaving out
/// `skip` (the framing fields pinlb writes itself).
pub(crate) fn header_lines(map: &HeaderMap, skip: impl Fn(&HeaderName) -> bool, out: &mut Vec<u8>) {
    for (name, value) in map {
        if skip(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_goes_in_front_of_the_lines_as_status_line_writes_it() {
        let lines: [&[u8]; 3] = [b"", b"server: x\r\n", &[b'a'; 300]];
        for code in 100..=999 {
            let status = StatusCode::from_u16(code).unwrap();
            for l in lines {
                let mut want = Vec::new();
                status_line(&mut want, status);
                want.extend_from_slice(l);
                // Without room to spare, and with it: the allocation grows when it must.
                for room in [0, 128] {
                    let mut head = Vec::with_capacity(l.len() + room);
                    head.extend_from_slice(l);
                    prepend_status_line(&mut head, status);
                    assert_eq!(head, want, "{code}");
                }
            }
        }
    }

    #[test]
    fn content_length_stops_at_the_largest_signed_64_bit_number() {
        let cl = |v: &str| ContentLength::Absent.add(v.as_bytes(), false);
        assert_eq!(
            cl("9223372036854775807"),
            ContentLength::Valid(i64::MAX as u64)
        );
        assert!(matches!(
            cl("9223372036854775808"),
            ContentLength::Invalid(_)
        ));
        assert!(matches!(
            ContentLength::Absent.add(b"9223372036854775808, 9223372036854775808", true),
            ContentLength::Invalid(_)
        ));
    }

    #[test]
    fn h2c_is_never_among_the_upgrade_protocols_sent_on() {
        let protocols = |v: &str| {
            let mut out = Vec::new();
            upgrade_protocols(v.as_bytes(), &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(protocols("websocket"), "websocket");
        assert_eq!(protocols("h2c"), "");
        assert_eq!(protocols("H2C, websocket"), "websocket");
        assert_eq!(protocols(" foo/2 ,, h2c/1, bar "), "foo/2, bar");
    }

    #[test]
    fn chunk_size_lines_are_lowercase_hex() {
        let mut out = [0u8; 18];
        assert_eq!(chunk_size_line(&mut out, 0), b"0\r\n");
        assert_eq!(chunk_size_line(&mut out, 26), b"1a\r\n");
        assert_eq!(
            chunk_size_line(&mut out, usize::MAX),
            b"ffffffffffffffff\r\n"
        );
    }

    #[test]
    fn response_lines_lose_connection_specific_fields() {
        let map = header_map(
            b"Content-Type: text/plain\r\nConnection: x\r\nKeep-Alive: 5\r\nSet-Cookie: a\r\nset-cookie: b\r\nbad line\r\n",
        );
        assert_eq!(map.len(), 3);
        assert_eq!(map.get_all("set-cookie").iter().count(), 2);
        assert!(map.get("connection").is_none());
        assert_eq!(map["content-type"], "text/plain");
    }
}
