//! Request heads from clients: parsed in place with `httparse` and checked for everything a
//! proxy must refuse, then written out as the lines that go upstream. Pure: bytes in, a head or
//! an error out, so it is unit-tested and fuzzed without a socket.
//!
//! What hyper's server checked on its own is checked here: the request line and header syntax,
//! head size and header count (431), Content-Length and Transfer-Encoding framing; and what a
//! proxy must add: Host, the target's form and length (414), the declared body size (413).

use std::mem::MaybeUninit;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::{Method, StatusCode, Uri, Version};

use super::body::BodyError;
use super::common::{ConnectionTokens, ContentLength, Hop, RequestFraming, upgrade_protocols};
use crate::sys::head_bufs::{self, Spare};

/// Why pinlb refused a client's request: its head (malformed, too large, or breaking a rule a
/// proxy must enforce) or its body. Each kind is answered with one status, in
/// [`ClientError::status`], and always blames the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Not HTTP/1.x syntax: answered before anything else looks at the request, and the
    /// connection closed.
    #[error("{0}")]
    Malformed(Box<str>),
    /// A head over `limits.max_header_bytes` or `limits.max_headers`.
    #[error("{0}")]
    HeadTooLarge(&'static str),
    /// HTTP/1.1 requires Host (RFC 9112 §3.2).
    #[error("HTTP/1.1 request without a Host header")]
    MissingHost,
    /// Two Host lines: which one a backend or cache believes is how host confusion starts.
    #[error("more than one Host header")]
    DuplicateHost,
    /// Empty, or not `host[:port]`.
    #[error("empty or invalid Host header")]
    InvalidHost,
    /// The target `*` with a method other than OPTIONS (RFC 9112 §3.2.4): no backend route
    /// matches it the same way.
    #[error("target \"*\" with a method other than OPTIONS")]
    AsteriskForm,
    /// A Content-Length that is not one plain number, or lines that disagree (RFC 9112 §6.3).
    #[error("{0}")]
    ContentLength(&'static str),
    /// Any Transfer-Encoding but exactly `chunked`: pinlb decodes and re-frames the body, so it
    /// would lose any other coding, and `chunked, chunked` is how TE.TE smuggling starts.
    #[error("Transfer-Encoding other than a single \"chunked\"")]
    TransferEncoding,
    /// The request target is longer than `limits.max_uri_bytes`.
    #[error("request target of {len} bytes, over limits.max_uri_bytes ({limit})")]
    UriTooLong { len: usize, limit: usize },
    /// The body is, or grew, larger than `limits.max_body`.
    #[error("request body over limits.max_body ({limit} bytes)")]
    BodyTooLarge { limit: u64 },
    /// None of the body arrived for `limits.body_timeout`.
    #[error("no request body data within {after:?} (limits.body_timeout)")]
    BodyTimeout { after: Duration },
    /// The body's chunked framing was malformed.
    #[error("malformed request body: {0}")]
    Body(BodyError),
    /// The body broke off: the client closed or its connection failed mid-body.
    #[error("request body broke off: {0}")]
    BodyBrokeOff(Box<str>),
}

impl ClientError {
    pub fn status(&self) -> StatusCode {
        match self {
            ClientError::Malformed(_)
            | ClientError::MissingHost
            | ClientError::DuplicateHost
            | ClientError::InvalidHost
            | ClientError::AsteriskForm
            | ClientError::ContentLength(_)
            | ClientError::TransferEncoding
            | ClientError::Body(_)
            | ClientError::BodyBrokeOff(_) => StatusCode::BAD_REQUEST,
            ClientError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ClientError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            ClientError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ClientError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
        }
    }
}

/// A parsed request head, ready to go upstream: its end-to-end header lines are already written
/// out as they will be sent, so that forwarding a header costs a copy, not a map insertion.
#[derive(Debug)]
pub struct RequestHead {
    pub method: Method,
    pub version: Version,
    /// The target, then the header lines, each `name: value\r\n` with the name as the client
    /// wrote it. Hop-by-hop headers, the framing headers, Expect, Host and the X-Forwarded
    /// headers are not among the lines: pinlb writes those itself.
    /// One of the thread's spare buffers, given back when the head is dropped
    /// (`sys::head_bufs`).
    text: Spare,
    /// Where the target lies in `text`.
    target: (usize, usize),
    /// Where the lines lie in `text`.
    lines: (usize, usize),
    /// On a request that asks to upgrade, where the lines end in `text` with
    /// `connection: upgrade` and `upgrade: <protocols>` after them; 0 otherwise. Only an
    /// HTTP/1.1 request with `upgrade` in Connection and an Upgrade naming something other than
    /// `h2c` asks (see `common::upgrade_protocols`). A `u32`, where the head has room for one:
    /// a larger head would cost every request a longer copy, upgrading or not.
    upgrade_end: u32,
    /// Where the Host value lies in `text`: the authority of an absolute-form target, or the
    /// Host header.
    host: Option<(usize, usize)>,
    /// Where the origin-form path lies in `text`.
    path: (usize, usize),
    user_agent: Option<(usize, usize)>,
    referer: Option<(usize, usize)>,
    /// The client's X-Forwarded-For lines, joined into one list.
    pub forwarded_for: Option<Vec<u8>>,
    /// The client's Forwarded and X-Real-IP lines, which say who the client is as
    /// X-Forwarded-For does: passed on only from a client in `forwarded.trusted`.
    pub proxied_lines: Option<Vec<u8>>,
    /// How the body is framed, as sent upstream.
    pub body: RequestFraming,
    /// What the client asked for: HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with
    /// `Connection: keep-alive`.
    pub keep_alive: bool,
    /// Content-Length came with Transfer-Encoding: the body is read as chunked, and the
    /// connection closes after the response, since the client and some other hop may disagree
    /// on where this request ends (HAProxy's rule).
    pub ambiguous: bool,
    /// `Expect: 100-continue`: pinlb answers it when the body is first read.
    pub expect_continue: bool,
    /// Why pinlb refuses the request, if it does; answered through the proxy's error path, so
    /// it is counted and logged like any request.
    pub refused: Option<ClientError>,
}

impl RequestHead {
    /// A copy without a body, to send elsewhere (a mirror's): the same method, target, Host and
    /// end-to-end lines, in a buffer of its own; no upgrade, no `Expect`.
    pub fn copy_without_body(&self) -> RequestHead {
        RequestHead {
            method: self.method.clone(),
            version: self.version,
            text: Spare::from(self.text.to_vec()),
            target: self.target,
            lines: self.lines,
            upgrade_end: 0,
            host: self.host,
            path: self.path,
            user_agent: self.user_agent,
            referer: self.referer,
            forwarded_for: self.forwarded_for.clone(),
            proxied_lines: self.proxied_lines.clone(),
            body: RequestFraming::None,
            keep_alive: true,
            ambiguous: false,
            expect_continue: false,
            refused: None,
        }
    }

    fn at(&self, (start, end): (usize, usize)) -> &[u8] {
        &self.text[start..end]
    }

    /// The target as the client sent it.
    pub fn target(&self) -> &[u8] {
        self.at(self.target)
    }

    /// The target as it goes upstream: origin-form.
    pub fn path(&self) -> &[u8] {
        self.at(self.path)
    }

    /// The end-to-end header lines, `name: value\r\n` each.
    pub fn lines(&self) -> &[u8] {
        self.at(self.lines)
    }

    pub fn host(&self) -> Option<&[u8]> {
        self.host.map(|h| self.at(h))
    }

    /// The trimmed values of every end-to-end header line named `name` (lower-case), in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.line_values()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Cookie `name`'s value (the first `Cookie` line that has it); `None` when absent or empty.
    pub fn cookie(&self, name: &str) -> Option<&[u8]> {
        self.header_values("cookie").find_map(|v| cookie(v, name))
    }

    /// Query argument `name`'s value as sent (not decoded, as nginx's `$arg_NAME`); `None`
    /// when absent or empty.
    pub fn arg(&self, name: &str) -> Option<&[u8]> {
        let path = self.path();
        let query = &path[path.iter().position(|&b| b == b'?')? + 1..];
        query.split(|&b| b == b'&').find_map(|pair| {
            let eq = pair.iter().position(|&b| b == b'=')?;
            let (n, v) = pair.split_at(eq);
            (n == name.as_bytes() && v.len() > 1).then(|| &v[1..])
        })
    }

    /// Every end-to-end line's name and trimmed value, in order.
    pub fn line_values(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines().split(|&b| b == b'\n').filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let (n, v) = line.split_at(colon);
            Some((n, v[1..].trim_ascii()))
        })
    }

    /// Takes every end-to-end line named `name` (case-insensitive) out of the request, so it
    /// does not go upstream; the head's other parts stay as they were.
    pub fn remove_lines(&mut self, name: &[u8]) {
        self.remove_lines_named(|n| n.eq_ignore_ascii_case(name));
    }

    /// Takes every end-to-end line whose name `named` says yes to out of the request.
    pub fn remove_lines_named(&mut self, named: impl Fn(&[u8]) -> bool) {
        let mut at = self.lines.0;
        while at < self.lines.1 {
            let end = self.text[at..self.lines.1]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(self.lines.1, |i| at + i + 1);
            let line = &self.text[at..end];
            let colon = line.iter().position(|&b| b == b':');
            if !colon.is_some_and(|c| named(&line[..c])) {
                at = end;
                continue;
            }
            let cut = end - at;
            self.text.drain(at..end);
            // Every part after the line moves back by its length; none straddles it.
            let shift = |x: &mut usize| {
                if *x >= end {
                    *x -= cut;
                }
            };
            let shift_span = |s: &mut (usize, usize)| {
                shift(&mut s.0);
                shift(&mut s.1);
            };
            shift(&mut self.lines.1);
            shift_span(&mut self.target);
            shift_span(&mut self.path);
            for s in [&mut self.host, &mut self.user_agent, &mut self.referer]
                .into_iter()
                .flatten()
            {
                shift_span(s);
            }
            if self.upgrade_end != 0 {
                let mut u = self.upgrade_end as usize;
                shift(&mut u);
                self.upgrade_end = u32::try_from(u).unwrap_or(0);
            }
        }
    }

    /// Adds `lines` (`name: value\r\n` each) after the end-to-end lines, so they go upstream
    /// with them; the head's other parts stay as they were.
    pub fn append_lines(&mut self, lines: &[u8]) {
        let at = self.lines.1;
        let n = lines.len();
        self.text.splice(at..at, lines.iter().copied());
        // Every part at or after the insertion moves on by its length; the lines grow.
        let shift = |x: &mut usize| {
            if *x >= at {
                *x += n;
            }
        };
        let shift_span = |s: &mut (usize, usize)| {
            if s.0 >= at {
                shift(&mut s.0);
                shift(&mut s.1);
            }
        };
        self.lines.1 += n;
        shift_span(&mut self.target);
        shift_span(&mut self.path);
        for s in [&mut self.host, &mut self.user_agent, &mut self.referer]
            .into_iter()
            .flatten()
        {
            shift_span(s);
        }
        if self.upgrade_end != 0 {
            let mut u = self.upgrade_end as usize;
            shift(&mut u);
            self.upgrade_end = u32::try_from(u).unwrap_or(0);
        }
    }

    pub fn user_agent(&self) -> Option<&[u8]> {
        self.user_agent.map(|h| self.at(h))
    }

    pub fn referer(&self) -> Option<&[u8]> {
        self.referer.map(|h| self.at(h))
    }

    /// The end-to-end lines followed by `connection: upgrade` and the Upgrade line, as they go
    /// upstream when upgrades are on; `None` for a request that does not ask to upgrade.
    pub fn upgrade_lines(&self) -> Option<&[u8]> {
        (self.upgrade_end != 0).then(|| self.at((self.lines.0, self.upgrade_end as usize)))
    }

    /// Whether a header line with this name goes upstream (case-insensitive).
    #[cfg(test)]
    fn has_line(&self, name: &str) -> bool {
        self.lines().split(|&b| b == b'\n').any(|l| {
            l.len() > name.len()
                && l[name.len()] == b':'
                && l[..name.len()].eq_ignore_ascii_case(name.as_bytes())
        })
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

/// A Host value without its port: `example.com:8080` → `example.com`, `[::1]:8080` → `[::1]`.
pub fn host_without_port(host: &[u8]) -> &[u8] {
    let end = match host.iter().rposition(|&b| b == b':') {
        // An IPv6 literal's colons are inside its brackets.
        Some(i) if !host[i..].contains(&b']') => i,
        _ => host.len(),
    };
    &host[..end]
}

/// The headers a request head is parsed around, recognised on raw bytes.
enum Special {
    Connection,
    TransferEncoding,
    ContentLength,
    Host,
    Expect,
    ForwardedFor,
    /// Forwarded, X-Real-IP.
    Proxied,
    UserAgent,
    Referer,
    /// Hop-by-hop, but sent on (by pinlb, after the other lines) when Connection names it.
    Upgrade,
    /// Keep-Alive, Proxy-Connection, TE, Trailer (hop-by-hop), X-Forwarded-Proto
    /// (pinlb's to set): dropped.
    Dropped,
}

impl Special {
    fn of(name: &[u8]) -> Option<Special> {
        // The hop-by-hop headers are the same in both directions: one table in `common`.
        match Hop::of(name) {
            Some(Hop::Connection) => return Some(Special::Connection),
            Some(Hop::TransferEncoding) => return Some(Special::TransferEncoding),
            Some(Hop::Upgrade) => return Some(Special::Upgrade),
            Some(Hop::Other) => return Some(Special::Dropped),
            None => {}
        }
        let is = |s: &str| super::name::is(name, s.as_bytes());
        // The length check first: almost every header is ruled out by it.
        match name.len() {
            4 if is("host") => Some(Special::Host),
            6 if is("expect") => Some(Special::Expect),
            7 if is("referer") => Some(Special::Referer),
            9 if is("forwarded") || is("x-real-ip") => Some(Special::Proxied),
            10 if is("user-agent") => Some(Special::UserAgent),
            14 if is("content-length") => Some(Special::ContentLength),
            15 if is("x-forwarded-for") => Some(Special::ForwardedFor),
            17 if is("x-forwarded-proto") => Some(Special::Dropped),
            _ => None,
        }
    }
}

/// What one request may hold: the codec's own bounds, given by whoever reads requests (a
/// listener's `[limits]`, through `config::Limits::request`). The defaults are the
/// configuration's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Request line plus headers, in bytes; over it → 431.
    pub max_header_bytes: usize,
    /// Header lines; over it → 431.
    pub max_headers: usize,
    /// The request target as sent; over it → 414.
    pub max_uri_bytes: usize,
    /// Request body bytes; over it → 413. 0 = unlimited.
    pub max_body: u64,
}

impl RequestLimits {
    /// Most `max_headers`: the parser keeps room for that many on the stack per request.
    pub const MAX_HEADERS: usize = 1000;
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_uri_bytes: 8 * 1024,
            max_body: 0,
        }
    }
}

/// Parses a complete request head off the front of `buf`, leaving the rest (body, pipelined
/// requests) in it; `Ok(None)` when more bytes are needed.
///
/// Inlined: HTTP/1.1's one call of it per request is its hot path (HTTP/2 calls it too, and
/// as a call it cost HTTP/1.1 about 50 instructions more per request).
#[inline(always)]
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &RequestLimits,
) -> Result<Option<RequestHead>, ClientError> {
    let mut slots =
        [const { MaybeUninit::<httparse::Header>::uninit() }; RequestLimits::MAX_HEADERS];
    let slots = &mut slots[..limits.max_headers.min(RequestLimits::MAX_HEADERS)];
    let mut req = httparse::Request::new(&mut []);
    let Some(len) = parse_head(&mut req, buf, slots, limits)? else {
        return Ok(None);
    };
    let (method, version, target) = request_line(&req)?;

    // Host is never among the named: a proxy always sends it on, and it is read before the
    // named headers are left out.
    let connection = ConnectionTokens::scan(req.headers);

    let mut text = head_bufs::take(len + 16);
    text.extend_from_slice(target);
    let target_at = (0, target.len());
    let (mut host, path) = split_target(target, &method)?;
    let lines_start = text.len();
    let (mut codings, mut chunked_only) = (0usize, true);
    let (mut content_length, mut expect_continue) = (ContentLength::Absent, false);
    let (mut hosts, mut host_ok, mut host_value) = (0usize, false, None);
    let (mut user_agent, mut referer) = (None, None);
    let mut forwarded_for: Option<Vec<u8>> = None;
    let mut proxied_lines: Option<Vec<u8>> = None;
    let mut upgrade_value: Option<Vec<u8>> = None;
    for h in req.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        let mut keep = None;
        match Special::of(name) {
            Some(Special::Connection | Special::Dropped) => continue,
            Some(Special::TransferEncoding) => {
                let (n, chunked) = te_codings(value);
                (codings, chunked_only) = (codings + n, chunked_only && chunked);
                continue;
            }
            Some(Special::ContentLength) => {
                content_length = content_length.add(value, false);
                continue;
            }
            Some(Special::Expect) => {
                expect_continue |= value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
                continue;
            }
            Some(Special::ForwardedFor) => {
                join_list(&mut forwarded_for, value);
                continue;
            }
            Some(Special::Host) => {
                hosts += 1;
                host_ok = is_valid_host(value);
                host_value = Some(value);
                continue;
            }
            Some(Special::Proxied) => {
                copy_line(proxied_lines.get_or_insert_with(Vec::new), name, value);
                continue;
            }
            Some(Special::Upgrade) => {
                join_list(&mut upgrade_value, value);
                continue;
            }
            Some(Special::UserAgent) => keep = Some(&mut user_agent),
            Some(Special::Referer) => keep = Some(&mut referer),
            // Dropped, as nginx does by default (`underscores_in_headers off`): CGI-style
            // backends read `X_Forwarded_For` and `X-Forwarded-For` as one variable, so a client
            // could spoof its address under the underscored name.
            None if name.contains(&b'_') => continue,
            None => {}
        }
        if connection.names(name) {
            continue;
        }
        let span = copy_line(&mut text, name, value);
        if let Some(k) = keep {
            *k = Some(span);
        }
    }
    let lines = (lines_start, text.len());
    let upgrade_end = upgrade_lines(upgrade_value, version, &connection, &mut text);
    // Host is not a line: pinlb writes it first, itself. An absolute-form target's authority
    // wins over it (RFC 9112 §3.2.2).
    if let (false, 1, Some(value)) = (host.is_some(), hosts, host_value) {
        let at = text.len();
        text.extend_from_slice(value);
        host = Some(Span::Text(at, text.len()));
    }

    let framing = (codings, chunked_only, content_length);
    let (body, refused) = refusal(target, &method, version, framing, (hosts, host_ok), limits);

    let path = path_in(path, target, &mut text);
    let keep_alive = connection.keep_alive(version == Version::HTTP_11);
    // The head is copied out; what follows it (body, next requests) stays.
    buf.advance(len);
    Ok(Some(RequestHead {
        method,
        version,
        target: target_at,
        lines,
        host: host.map(Span::range),
        path,
        user_agent,
        referer,
        upgrade_end,
        text,
        forwarded_for,
        proxied_lines,
        body,
        keep_alive,
        ambiguous: body == RequestFraming::Chunked && content_length != ContentLength::Absent,
        expect_continue: expect_continue && version == Version::HTTP_11,
        refused,
    }))
}

/// Writes the Upgrade lines after the end-to-end ones, and returns where they end (0 for
/// none). Upgrade is HTTP/1.1's (an HTTP/1.0 one is ignored, RFC 9110 §7.8), and asks for a
/// switch only when Connection names it too.
#[inline(always)]
fn upgrade_lines(
    upgrade_value: Option<Vec<u8>>,
    version: Version,
    connection: &ConnectionTokens,
    text: &mut Vec<u8>,
) -> u32 {
    let lines_end = text.len();
    let mut upgrade_end = 0;
    if let Some(value) = upgrade_value {
        if version == Version::HTTP_11 && connection.names(b"upgrade") {
            text.extend_from_slice(b"connection: upgrade\r\nupgrade: ");
            let at = text.len();
            upgrade_protocols(&value, text);
            if text.len() > at {
                text.extend_from_slice(b"\r\n");
                upgrade_end = u32::try_from(text.len()).unwrap_or(0);
            }
            if upgrade_end == 0 {
                text.truncate(lines_end);
            }
        }
    }
    upgrade_end
}

/// Where the path that goes upstream is: in the target as received, or written after the
/// lines (`*`, or a `/` before an absolute-form target's path).
#[inline(always)]
fn path_in(path: Path, target: &[u8], text: &mut Vec<u8>) -> (usize, usize) {
    match path {
        Path::Within(a, b) => (a, b),
        Path::Asterisk => {
            let at = text.len();
            text.push(b'*');
            (at, text.len())
        }
        Path::SlashThen(a, b) => {
            let at = text.len();
            text.push(b'/');
            text.extend_from_slice(&target[a..b]);
            (at, text.len())
        }
    }
}

/// The Transfer-Encoding codings in one line's `value`, and whether each is `chunked`. Exactly
/// one `chunked` over all lines is accepted: pinlb decodes and re-frames the body, so it would
/// lose any other coding, and `chunked, chunked` is how TE.TE smuggling starts.
#[inline(always)]
fn te_codings(value: &[u8]) -> (usize, bool) {
    let mut n = 0;
    let mut chunked = true;
    for coding in value.split(|&b| b == b',') {
        n += 1;
        chunked &= coding.trim_ascii().eq_ignore_ascii_case(b"chunked");
    }
    (n, chunked)
}

/// Writes `name: value` and its CRLF to `text`; where the value is. httparse has checked the
/// name's token characters and the value's bytes (HTAB, visible ASCII, space, obs-text: what a
/// header value may hold), so the line can be copied as it is.
#[inline(always)]
fn copy_line(text: &mut Vec<u8>, name: &[u8], value: &[u8]) -> (usize, usize) {
    text.extend_from_slice(name);
    text.extend_from_slice(b": ");
    let at = text.len();
    text.extend_from_slice(value);
    let span = (at, text.len());
    text.extend_from_slice(b"\r\n");
    span
}

/// Adds `value` to a comma-separated list: several lines of one header are one list (RFC 9110
/// §5.3).
fn join_list(list: &mut Option<Vec<u8>>, value: &[u8]) {
    let list = list.get_or_insert_with(Vec::new);
    if !list.is_empty() {
        list.extend_from_slice(b", ");
    }
    list.extend_from_slice(value);
}

/// httparse's pass over the head: its length when it is whole and within the limits,
/// `None` while more bytes are needed.
#[inline(always)]
fn parse_head<'b, 'h>(
    req: &mut httparse::Request<'h, 'b>,
    buf: &'b [u8],
    slots: &'h mut [MaybeUninit<httparse::Header<'b>>],
    limits: &RequestLimits,
) -> Result<Option<usize>, ClientError> {
    match httparse::ParserConfig::default().parse_request_with_uninit_headers(req, buf, slots) {
        Ok(httparse::Status::Complete(len)) if len <= limits.max_header_bytes => Ok(Some(len)),
        Ok(httparse::Status::Partial) if buf.len() <= limits.max_header_bytes => Ok(None),
        Ok(_) => Err(ClientError::HeadTooLarge(
            "request head over limits.max_header_bytes",
        )),
        Err(httparse::Error::TooManyHeaders) => Err(ClientError::HeadTooLarge(
            "more header lines than limits.max_headers",
        )),
        Err(e) => Err(ClientError::Malformed(
            format!("malformed request: {e}").into(),
        )),
    }
}

/// The request line's method, version and target; the target ASCII only, as `http::Uri` has
/// it (httparse has already refused spaces and control bytes).
#[inline(always)]
fn request_line<'b>(
    req: &httparse::Request<'_, 'b>,
) -> Result<(Method, Version, &'b [u8]), ClientError> {
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| ClientError::Malformed("malformed request: invalid method".into()))?;
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let target = req.path.unwrap_or_default().as_bytes();
    if !target.is_ascii() {
        return Err(ClientError::Malformed(
            "malformed request: invalid target".into(),
        ));
    }
    Ok((method, version, target))
}

/// The body's framing, and the first rule the head breaks, if it breaks one: a refused
/// request is still parsed whole, so that it can be answered and its connection kept in step.
#[inline(always)]
fn refusal(
    target: &[u8],
    method: &Method,
    version: Version,
    framing: (usize, bool, ContentLength),
    host: (usize, bool),
    limits: &RequestLimits,
) -> (RequestFraming, Option<ClientError>) {
    let mut refused = None;
    let (codings, chunked_only, content_length) = framing;
    let (hosts, host_ok) = host;
    let mut refuse = |e: ClientError| {
        refused.get_or_insert(e);
    };
    if target.len() > limits.max_uri_bytes {
        refuse(ClientError::UriTooLong {
            len: target.len(),
            limit: limits.max_uri_bytes,
        });
    }
    if target == b"*" && *method != Method::OPTIONS {
        refuse(ClientError::AsteriskForm);
    }
    let te = codings > 0;
    if te && (codings > 1 || !chunked_only || version == Version::HTTP_10) {
        refuse(ClientError::TransferEncoding);
    }
    match hosts {
        0 if version == Version::HTTP_11 => refuse(ClientError::MissingHost),
        0 => {}
        1 if !host_ok => refuse(ClientError::InvalidHost),
        1 => {}
        _ => refuse(ClientError::DuplicateHost),
    }
    let body = if te {
        RequestFraming::Chunked
    } else {
        match content_length {
            ContentLength::Absent => RequestFraming::None,
            ContentLength::Valid(n) => RequestFraming::Length(n),
            ContentLength::Invalid(why) => {
                refuse(ClientError::ContentLength(why));
                RequestFraming::None
            }
        }
    };
    if let RequestFraming::Length(n) = body {
        if limits.max_body > 0 && n > limits.max_body {
            refuse(ClientError::BodyTooLarge {
                limit: limits.max_body,
            });
        }
    }

    (body, refused)
}

/// Tells when a request head that is still arriving is worth parsing again. Parsing the whole
/// buffer on every read costs time quadratic in the head's size when it comes a few bytes at a
/// time (a slowloris client's way: a 30 KB head a byte per packet took 0.5-0.7 s of CPU). So the
/// first read is parsed at once (most heads are whole in it, and garbage is refused at once),
/// and after that the head is parsed again only once its end, an empty line, has arrived: each
/// byte is searched once.
#[derive(Debug, Default)]
pub(crate) struct HeadEnd {
    /// The first read was parsed.
    tried: bool,
    /// Bytes of the buffer already searched for the end of the head.
    searched: usize,
}

impl HeadEnd {
    /// For a buffer whose first `len` bytes were already parsed, and found to be part of a head.
    pub(crate) fn searched(len: usize) -> HeadEnd {
        HeadEnd {
            tried: true,
            searched: len,
        }
    }

    /// Whether `buf` should be parsed now.
    pub(crate) fn arrived(&mut self, buf: &[u8]) -> bool {
        if !self.tried {
            self.tried = true;
            self.searched = buf.len();
            return true;
        }
        // An empty line is LF, optional CR, LF (httparse takes bare LFs too); the LF that starts
        // one may be among the last two bytes searched.
        let from = self.searched.saturating_sub(2).min(buf.len());
        self.searched = buf.len();
        let mut rest = &buf[from..];
        // Bounded: each pass moves past one LF.
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            match &rest[i + 1..] {
                [b'\n', ..] | [b'\r', b'\n', ..] => return true,
                after => rest = after,
            }
        }
        false
    }
}

/// A stretch of the request head's `text`: within the target (which starts it), or after it.
#[derive(Debug, Clone, Copy)]
enum Span {
    Target(usize, usize),
    Text(usize, usize),
}

impl Span {
    /// Where it is in the head's text: spans of the target are offsets into it, and it sits at
    /// the start of the text.
    #[inline(always)]
    fn range(self) -> (usize, usize) {
        match self {
            Span::Target(a, b) | Span::Text(a, b) => (a, b),
        }
    }
}

/// The origin-form path a target goes upstream with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// This stretch of the target.
    Within(usize, usize),
    /// `/` and then this stretch of the target: an absolute-form target with a query and no
    /// path (`http://a?q` goes upstream as `/?q`, RFC 9112 §3.2.1).
    SlashThen(usize, usize),
    /// `*`: an absolute-form OPTIONS target with an empty path (`OPTIONS http://a`).
    Asterisk,
}

/// Whether a byte may appear in a request target as it is: unreserved, sub-delims, `:`, `@`,
/// `/`, `?` and `%` (RFC 3986). Targets of only these skip `http::uri` validation.
/// A `match`, not a search of a list: `contains` on a byte string is a `memchr` call whose
/// cost moved by 80 instructions per request with where the linker put the string.
fn is_plain_target_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
                | b'?'
                | b'%'
        )
}

/// Splits a request target into the authority an absolute-form target names, if any, and the
/// origin-form path to send upstream. A fragment (never valid in a request, RFC 9112 §3.2) is cut
/// off, as `http::Uri` did for hyper. Refuses the authority form (`CONNECT host:port`: pinlb does
/// not tunnel), targets that are not URIs, and absolute-form targets other than `http://` with a
/// valid `host[:port]` (userinfo would reach the backend as its Host).
fn split_target(target: &[u8], method: &Method) -> Result<(Option<Span>, Path), ClientError> {
    let invalid = || ClientError::Malformed("malformed request: invalid target".into());
    let end = target
        .iter()
        .position(|&b| b == b'#')
        .unwrap_or(target.len());
    let target = &target[..end];
    if target == b"*" {
        return Ok((None, Path::Within(0, 1)));
    }
    if target.first() == Some(&b'/') {
        if !target.iter().all(|&b| is_plain_target_byte(b))
            && http::uri::PathAndQuery::try_from(target).is_err()
        {
            return Err(invalid());
        }
        return Ok((None, Path::Within(0, end)));
    }
    let uri = Uri::try_from(target).map_err(|_| invalid())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(ClientError::Malformed(
            format!("{method} with an authority-form target is not supported").into(),
        ));
    };
    let authority = authority.as_str().as_bytes();
    if !scheme.eq_ignore_ascii_case("http") || !is_valid_host(authority) {
        return Err(ClientError::Malformed(
            "malformed request: absolute-form target other than http://host[:port]".into(),
        ));
    }
    // `scheme://authority` then the path: the offsets in the target are those of the parts.
    let host_start = scheme.len() + 3;
    let host_end = host_start + authority.len();
    if target.get(host_start..host_end) != Some(authority) {
        return Err(invalid());
    }
    let path = match target.get(host_end) {
        Some(b'/') => Path::Within(host_end, end),
        // OPTIONS for the server as a whole (RFC 9112 §3.2.4).
        None if method == Method::OPTIONS => Path::Asterisk,
        _ => Path::SlashThen(host_end, end),
    };
    Ok((Some(Span::Target(host_start, host_end)), path))
}

/// Whether a Host value is `host[:port]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a registered name or
/// IPv4 address of unreserved, sub-delim and `%` characters, or an IPv6 literal in brackets,
/// then an optional decimal port.
/// The bytes a reg-name may hold (RFC 3986 §3.2.2: unreserved, sub-delims, and the `%` of a
/// pct-encoded byte), as a table: one load per byte of the Host header every request has, where
/// a search of the 16 punctuation bytes for each `.` cost about 200 instructions per request.
const REG_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let punctuation = b"-._~!$&'()*+,;=%";
    let mut i = 0;
    while i < punctuation.len() {
        table[punctuation[i] as usize] = true;
        i += 1;
    }
    table
};

fn is_valid_host(v: &[u8]) -> bool {
    let Some(rest) = v.strip_prefix(b"[") else {
        // A reg-name (or an IPv4 address), then an optional `:port`, in one pass: the first
        // byte that can't be in a name must be the colon, after a name, and only digits follow.
        let Some(colon) = v.iter().position(|&b| !REG_NAME[usize::from(b)]) else {
            return !v.is_empty();
        };
        return colon > 0 && v[colon] == b':' && v[colon + 1..].iter().all(u8::is_ascii_digit);
    };
    let Some(end) = rest.iter().position(|&b| b == b']') else {
        return false;
    };
    let literal = &rest[..end];
    if literal.is_empty()
        || !literal
            .iter()
            .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
    {
        return false;
    }
    match &rest[end + 1..] {
        [] => true,
        [b':', port @ ..] => port.iter().all(u8::is_ascii_digit),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<RequestHead>, ClientError> {
        parse_with(text, &RequestLimits::default())
    }

    fn parse_with(text: &str, limits: &RequestLimits) -> Result<Option<RequestHead>, ClientError> {
        parse_request(&mut BytesMut::from(text), limits)
    }

    fn head(text: &str) -> RequestHead {
        parse(text).unwrap().expect("a complete head")
    }

    #[test]
    fn a_cookie_is_found_among_its_pairs_and_an_argument_in_the_query() {
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
        let h = head("GET /p?a=1&nocache=yes&b= HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(h.arg("nocache"), Some(&b"yes"[..]));
        assert_eq!((h.arg("b"), h.arg("c"), h.arg("p")), (None, None, None));
    }

    fn refused(text: &str) -> Option<ClientError> {
        head(text).refused
    }

    #[test]
    fn remove_lines_named_takes_the_lines_its_test_names_and_keeps_the_rest() {
        let text = "GET / HTTP/1.1\r\nHost: a\r\nX_Client_Verify: SUCCESS\r\nX-Client-Verify: x\r\nAccept: */*\r\n\r\n";
        let mut head = parse(text).unwrap().unwrap();
        head.remove_lines_named(|n| {
            n.eq_ignore_ascii_case(b"x_client_verify") || n.eq_ignore_ascii_case(b"x-client-verify")
        });
        let lines = String::from_utf8_lossy(head.lines()).to_ascii_lowercase();
        assert!(!lines.contains("client"), "{lines}");
        assert!(lines.contains("accept: */*\r\n"), "{lines}");
        assert_eq!(head.host(), Some(&b"a"[..]));
    }

    #[test]
    fn a_head_is_parsed_and_leaves_the_body_and_the_next_request_in_the_buffer() {
        let mut buf = BytesMut::from(
            "POST /a?b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\nhiGET",
        );
        let h = parse_request(&mut buf, &RequestLimits::default())
            .unwrap()
            .unwrap();
        assert_eq!(h.method, Method::POST);
        assert_eq!(h.target(), b"/a?b");
        assert_eq!(h.path(), b"/a?b");
        assert_eq!(h.host(), Some(&b"x"[..]));
        assert_eq!(h.body, RequestFraming::Length(2));
        assert!(h.keep_alive);
        assert_eq!(h.refused, None);
        assert_eq!(h.lines(), b"X-A: 1\r\nx-a: 2\r\n");
        assert!(!h.has_line("content-length"));
        assert!(h.has_line("x-a"));
        assert_eq!(&buf[..], b"hiGET");
    }

    #[test]
    fn header_values_are_found_by_name_in_every_line() {
        let h = head("GET / HTTP/1.1\r\nHost: x\r\nX-A: 1 \r\nx-a:2\r\nX-B: 3\r\n\r\n");
        assert_eq!(
            h.header_values("x-a").collect::<Vec<_>>(),
            [&b"1"[..], b"2"]
        );
        assert_eq!(h.header_values("x-c").count(), 0);
    }

    #[test]
    fn the_end_of_a_head_is_found_once_whatever_the_reads() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\n";
        // A byte at a time: only the last byte makes it worth parsing.
        let mut end = HeadEnd::default();
        let ready: Vec<usize> = (1..=head.len())
            .filter(|&n| end.arrived(&head[..n]))
            .collect();
        assert_eq!(ready, vec![1, head.len()]);
        // Bare LFs, and an end split over reads.
        for wire in [&b"GET / HTTP/1.1\nHost: x\n\n"[..], head] {
            for split in 1..wire.len() {
                let mut end = HeadEnd::default();
                end.arrived(&wire[..1]);
                let early = end.arrived(&wire[..split]);
                let late = end.arrived(wire);
                assert!(late || early, "{split}");
            }
        }
    }

    #[test]
    fn a_partial_head_asks_for_more_until_it_is_over_the_limit() {
        assert!(parse("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
        let limits = RequestLimits {
            max_header_bytes: 1024,
            ..RequestLimits::default()
        };
        let long = format!("GET / HTTP/1.1\r\nX-A: {}", "a".repeat(1100));
        assert_eq!(parse_with(&long, &limits).unwrap_err().status(), 431);
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X-A: 1\r\n".repeat(RequestLimits::default().max_headers + 1)
        );
        assert_eq!(parse(&many).unwrap_err().status(), 431);
    }

    #[test]
    fn hop_by_hop_headers_expect_framing_and_forwarding_headers_are_not_among_the_lines() {
        let h = head(
            "POST / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Hop, Host\r\nKeep-Alive: 5\r\n\
             Proxy-Connection: x\r\nTE: trailers\r\nTrailer: x-sum\r\nUpgrade: h2c\r\n\
             Transfer-Encoding: chunked\r\nExpect: 100-continue\r\nX-Hop: 1\r\nX-Kept: 2\r\n\
             X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-Proto: https\r\nx-forwarded-for: 2.2.2.2\r\n\r\n",
        );
        assert_eq!(h.lines(), b"X-Kept: 2\r\n");
        assert_eq!(h.host(), Some(&b"x"[..]));
        assert_eq!(h.forwarded_for.as_deref(), Some(&b"1.1.1.1, 2.2.2.2"[..]));
        assert_eq!(h.body, RequestFraming::Chunked);
        assert!(h.expect_continue);
        assert!(h.keep_alive);
    }

    #[test]
    fn appended_lines_go_after_the_others_and_before_an_upgrades_and_every_part_stays_whole() {
        let mut h = head(
            "GET /ws?q HTTP/1.1\r\nHost: x\r\nUser-Agent: ua\r\nConnection: Upgrade\r\n\
             Upgrade: websocket\r\nX-Client-Subject: CN=forged\r\nReferer: r\r\n\r\n",
        );
        h.remove_lines(b"x-client-subject");
        h.append_lines(b"x-client-subject: CN=alice\r\nx-client-verify: SUCCESS\r\n");
        assert_eq!(
            h.lines(),
            b"User-Agent: ua\r\nReferer: r\r\nx-client-subject: CN=alice\r\nx-client-verify: SUCCESS\r\n"
        );
        assert_eq!(
            h.upgrade_lines().unwrap(),
            [h.lines(), b"connection: upgrade\r\nupgrade: websocket\r\n"].concat()
        );
        assert_eq!(h.target(), b"/ws?q");
        assert_eq!(h.path(), b"/ws?q");
        assert_eq!(h.host(), Some(&b"x"[..]));
        assert_eq!(h.user_agent(), Some(&b"ua"[..]));
        assert_eq!(h.referer(), Some(&b"r"[..]));
        assert_eq!(
            h.header_values("x-client-subject").collect::<Vec<_>>(),
            [b"CN=alice"]
        );
    }

    #[test]
    fn an_upgrade_is_asked_for_only_with_connection_upgrade_on_http_1_1_and_never_h2c() {
        let up = |t: &str| {
            let h = head(t);
            h.upgrade_lines().map(|u| {
                let u = String::from_utf8(u.to_vec()).unwrap();
                let lines = String::from_utf8(h.lines().to_vec()).unwrap();
                let rest = u.strip_prefix(&lines).expect("the lines come first");
                let rest = rest
                    .strip_prefix("connection: upgrade\r\nupgrade: ")
                    .unwrap();
                rest.strip_suffix("\r\n").unwrap().to_string()
            })
        };
        let asks = "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\n\
                    Upgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n";
        assert_eq!(up(asks).as_deref(), Some("websocket"));
        // Upgrade is never among the lines: pinlb writes it itself, after them.
        assert_eq!(head(asks).lines(), b"Sec-WebSocket-Key: k\r\n");
        assert_eq!(
            up("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"),
            None
        );
        assert_eq!(
            up("GET / HTTP/1.0\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"),
            None
        );
        assert_eq!(
            up("GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"),
            None
        );
        assert_eq!(
            up(
                "POST / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: h2c, foo/1\r\n\
                Upgrade: bar\r\nContent-Length: 0\r\n\r\n"
            )
            .as_deref(),
            Some("foo/1, bar")
        );
    }

    #[test]
    fn keep_alive_follows_version_and_connection() {
        let ka = |t: &str| head(t).keep_alive;
        assert!(ka("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
        assert!(ka("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    }

    #[test]
    fn a_host_name_may_hold_exactly_the_bytes_of_an_rfc_3986_reg_name() {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(&b);
        for b in 0..=255u8 {
            let host = [b'a', b, b'z'];
            assert_eq!(
                is_valid_host(&host),
                allowed(b) && b != b':',
                "byte {b:#04x}"
            );
            assert_eq!(REG_NAME[usize::from(b)], allowed(b), "byte {b:#04x}");
        }
    }

    #[test]
    fn host_must_be_one_valid_authority() {
        for good in ["a.example:80", "a", "127.0.0.1:8080", "[::1]:80", "[::1]"] {
            let t = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
            assert_eq!(refused(&t), None, "{good:?}");
        }
        assert_eq!(refused("GET / HTTP/1.0\r\n\r\n"), None);
        assert_eq!(
            refused("GET / HTTP/1.1\r\n\r\n"),
            Some(ClientError::MissingHost)
        );
        assert_eq!(
            refused("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"),
            Some(ClientError::DuplicateHost)
        );
        for bad in ["", "a b", "u@a", "a:port", "a/b", ":80", "[::1", "[]:80"] {
            let t = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(refused(&t), Some(ClientError::InvalidHost), "{bad:?}");
        }
    }

    #[test]
    fn transfer_encoding_must_be_exactly_one_chunked() {
        let te = |v: &[&str]| {
            let lines: String = v
                .iter()
                .map(|v| format!("Transfer-Encoding: {v}\r\n"))
                .collect();
            refused(&format!("POST / HTTP/1.1\r\nHost: a\r\n{lines}\r\n"))
        };
        assert_eq!(te(&["chunked"]), None);
        assert_eq!(te(&["Chunked "]), None);
        for bad in [
            &["chunked, chunked"][..],
            &["gzip, chunked"],
            &["chunked", "chunked"],
            &["xchunked"],
            &[""],
        ] {
            assert_eq!(te(bad), Some(ClientError::TransferEncoding), "{bad:?}");
        }
        assert_eq!(
            refused("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Some(ClientError::TransferEncoding)
        );
    }

    #[test]
    fn content_length_with_transfer_encoding_is_read_as_chunked_and_closes() {
        let h = head(
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        assert_eq!(h.body, RequestFraming::Chunked);
        assert!(h.ambiguous);
        assert_eq!(h.refused, None);
    }

    #[test]
    fn content_length_must_be_one_plain_number() {
        let cl = |v: &[&str]| {
            let lines: String = v
                .iter()
                .map(|v| format!("Content-Length: {v}\r\n"))
                .collect();
            head(&format!("POST / HTTP/1.1\r\nHost: a\r\n{lines}\r\n"))
        };
        assert_eq!(cl(&["5"]).body, RequestFraming::Length(5));
        assert_eq!(cl(&["5", "5"]).body, RequestFraming::Length(5));
        assert_eq!(cl(&["0"]).body, RequestFraming::Length(0));
        for bad in [
            &["5", "6"][..],
            &["5, 5"],
            &["-5"],
            &["+5"],
            &["0x5"],
            &["99999999999999999999"],
            &[""],
        ] {
            assert!(
                matches!(cl(bad).refused, Some(ClientError::ContentLength(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn target_and_declared_body_are_held_to_the_limits() {
        let limits = RequestLimits {
            max_uri_bytes: 16,
            max_body: 10,
            ..RequestLimits::default()
        };
        let at = |t: &str| parse_with(t, &limits).unwrap().unwrap().refused;
        assert_eq!(at("GET /0123456789abcde HTTP/1.1\r\nHost: a\r\n\r\n"), None);
        assert_eq!(
            at("GET /0123456789abcdef HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(ClientError::UriTooLong { len: 17, limit: 16 })
        );
        assert_eq!(
            at("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"),
            None
        );
        assert_eq!(
            at("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n"),
            Some(ClientError::BodyTooLarge { limit: 10 })
        );
        assert_eq!(
            refused("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"),
            None,
            "asterisk-form is for OPTIONS"
        );
        assert_eq!(
            refused("GET * HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(ClientError::AsteriskForm)
        );
    }

    #[test]
    fn malformed_heads_are_refused_with_400() {
        for bad in [
            "GET / HTTP/1.1\rHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\0b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.2\r\nHost: a\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET /\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x7fb\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x01b\r\n\r\n",
        ] {
            assert_eq!(parse(bad).unwrap_err().status(), 400, "{bad:?}");
        }
    }

    #[test]
    fn absolute_form_goes_upstream_as_origin_form_with_its_authority_as_host() {
        let h = head("GET http://a.example:81/x?y HTTP/1.1\nHost: other\n\n");
        assert_eq!(h.path(), b"/x?y");
        assert_eq!(h.host(), Some(&b"a.example:81"[..]));
        assert_eq!(h.target(), b"http://a.example:81/x?y");
        let h = head("GET http://a HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(h.path(), b"/");
        let h = head("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(h.path(), b"*");
    }

    #[test]
    fn an_http_1_0_request_may_come_without_host_and_keeps_user_agent_for_the_log() {
        let h = head("GET / HTTP/1.0\r\nUser-Agent: x/1\r\nReferer: /r\r\n\r\n");
        assert_eq!(h.host(), None);
        assert_eq!(h.user_agent(), Some(&b"x/1"[..]));
        assert_eq!(h.referer(), Some(&b"/r"[..]));
        assert_eq!(h.lines(), b"User-Agent: x/1\r\nReferer: /r\r\n");
    }

    #[test]
    fn absolute_form_must_be_http_with_a_valid_authority() {
        for bad in [
            "GET http://u:p@evil.example/x HTTP/1.1\r\nHost: good\r\n\r\n",
            "GET http://a:99x/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET https://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET foo://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(parse(bad).unwrap_err().status(), 400, "{bad:?}");
        }
        let h = head("GET http://a?q=1 HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(h.path(), b"/?q=1");
    }

    #[test]
    fn a_fragment_is_cut_off_and_targets_must_be_uris() {
        assert_eq!(
            head("GET /a?b#frag HTTP/1.1\r\nHost: a\r\n\r\n").path(),
            b"/a?b"
        );
        assert_eq!(
            head("GET http://a/x#f HTTP/1.1\r\nHost: a\r\n\r\n").path(),
            b"/x"
        );
        // Not plain, but what http::uri takes (and hyper forwarded).
        assert_eq!(
            head("GET /a%20b|c HTTP/1.1\r\nHost: a\r\n\r\n").path(),
            b"/a%20b|c"
        );
        for bad in ["/a<b", "/a>b"] {
            let t = format!("GET {bad} HTTP/1.1\r\nHost: a\r\n\r\n");
            assert_eq!(parse(&t).unwrap_err().status(), 400, "{bad:?}");
        }
    }

    #[test]
    fn forwarded_and_x_real_ip_are_kept_apart_and_underscored_names_dropped() {
        let h = head(
            "GET / HTTP/1.1\r\nHost: a\r\nX-Real-IP: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n\
             X_Forwarded_For: 6.6.6.6\r\nX-Kept: 1\r\n\r\n",
        );
        assert_eq!(h.lines(), b"X-Kept: 1\r\n");
        assert_eq!(
            h.proxied_lines.as_deref(),
            Some(&b"X-Real-IP: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n"[..])
        );
    }
}
