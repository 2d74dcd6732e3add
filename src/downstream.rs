//! The client side of HTTP/1.1: reading requests off a client connection, and writing the
//! responses back.
//!
//! pinlb serves clients with this small codec rather than hyper's server, for the same reasons
//! `h1` talks to backends without hyper's client: a proxy needs less than a general server, and
//! the difference is what pinlb costs. hyper's server was about 7.7k of the 17.7k user-space
//! instructions per proxied request (benches/callgrind.sh), and it keeps two 8 KiB buffers per
//! connection for as long as the connection is open, idle or not. Here an idle keep-alive
//! connection holds no buffer at all (its read buffer is freed between requests), and a request
//! is parsed in place with `httparse`, the parser hyper uses.
//!
//! Per request: one read for the head (and whatever body came with it), the exchange with the
//! backend, and one write for the response head together with the part of the body the backend
//! sent with its own head. What hyper's server checked on its own is checked here: the request
//! line and header syntax, head size and header count (431), Content-Length and
//! Transfer-Encoding framing; and what a proxy must add: Host, the target's form and length
//! (414), the declared body size (413).

use std::cell::Cell;
use std::future::Future;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, StatusCode, Uri, Version};
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::accesslog::{Batch, Logged, Pending};
use crate::config::Limits;
use crate::h1::{ContentLength, Decoder, Framing, H1Error, Hop, Reply, RequestFraming};
use crate::idle::{self, Wait};
use crate::proxy::{self, Answer, ClientError, ProxyBody};
use crate::server::{Held, Route};

/// After a response that ends the connection with client bytes left unread, how long and how
/// much pinlb goes on reading (and discarding) before it closes, so that the close does not
/// turn into a reset that destroys the response before the client reads it (nginx's
/// `lingering_close`).
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

/// A request head pinlb refuses before anything else looks at it: malformed syntax, or too large
/// to read. Answered and the connection closed; not logged to the access log, as hyper's parser
/// errors were not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    pub status: StatusCode,
    pub cause: String,
}

impl Malformed {
    fn bad(cause: impl Into<String>) -> Self {
        Malformed {
            status: StatusCode::BAD_REQUEST,
            cause: cause.into(),
        }
    }

    fn too_large(cause: &str) -> Self {
        Malformed {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            cause: cause.into(),
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
    text: Vec<u8>,
    /// Where the target lies in `text`.
    target: (usize, usize),
    /// Where the lines lie in `text`.
    lines: (usize, usize),
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

    pub fn user_agent(&self) -> Option<&[u8]> {
        self.user_agent.map(|h| self.at(h))
    }

    pub fn referer(&self) -> Option<&[u8]> {
        self.referer.map(|h| self.at(h))
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
    /// Keep-Alive, Proxy-Connection, TE, Trailer, Upgrade (hop-by-hop), X-Forwarded-Proto
    /// (pinlb's to set): dropped.
    Dropped,
}

impl Special {
    fn of(name: &[u8]) -> Option<Special> {
        // The hop-by-hop headers are the same in both directions: `h1` knows them.
        match Hop::of(name) {
            Some(Hop::Connection) => return Some(Special::Connection),
            Some(Hop::TransferEncoding) => return Some(Special::TransferEncoding),
            Some(Hop::Other) => return Some(Special::Dropped),
            None => {}
        }
        let is = |s: &str| name.eq_ignore_ascii_case(s.as_bytes());
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

/// Parses a complete request head off the front of `buf`, leaving the rest (body, pipelined
/// requests) in it; `Ok(None)` when more bytes are needed.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<RequestHead>, Malformed> {
    let mut slots = [const { MaybeUninit::<httparse::Header>::uninit() }; Limits::MAX_HEADERS];
    let slots = &mut slots[..limits.max_headers.min(Limits::MAX_HEADERS)];
    let mut req = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_request_with_uninit_headers(&mut req, buf, slots)
    {
        Ok(httparse::Status::Complete(len)) if len <= limits.max_header_bytes => len,
        Ok(httparse::Status::Partial) if buf.len() <= limits.max_header_bytes => return Ok(None),
        Ok(_) => {
            return Err(Malformed::too_large(
                "request head over limits.max_header_bytes",
            ));
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Malformed::too_large(
                "more header lines than limits.max_headers",
            ));
        }
        Err(e) => return Err(Malformed::bad(format!("malformed request: {e}"))),
    };
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| Malformed::bad("malformed request: invalid method"))?;
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let target = req.path.unwrap_or_default().as_bytes();
    // ASCII only, as `http::Uri` has it; httparse has already refused spaces and control bytes.
    if !target.is_ascii() {
        return Err(Malformed::bad("malformed request: invalid target"));
    }

    // The Connection header may come after a header it names, so it is read first.
    let mut close = false;
    let mut keep_alive_token = false;
    let mut named: Vec<&[u8]> = Vec::new();
    for h in req.headers.iter() {
        if h.name.len() == 10 && h.name.eq_ignore_ascii_case("connection") {
            for t in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive_token = true;
                } else if !t.is_empty() && !t.eq_ignore_ascii_case(b"host") {
                    // A proxy always sends Host on, whatever Connection says.
                    named.push(t);
                }
            }
        }
    }

    let mut text = Vec::with_capacity(len + 16);
    text.extend_from_slice(target);
    let target_at = (0, target.len());
    let (mut host, path) = split_target(target, &method)?;
    let absolute = host.is_some();
    let lines_start = text.len();
    let mut codings = 0usize;
    let mut chunked_only = true;
    let mut content_length = ContentLength::Absent;
    let mut hosts = 0usize;
    let mut host_ok = false;
    let mut expect_continue = false;
    let mut forwarded_for: Option<Vec<u8>> = None;
    let mut proxied_lines: Option<Vec<u8>> = None;
    let mut host_value = None;
    let mut user_agent = None;
    let mut referer = None;
    for h in req.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        let mut keep = None;
        match Special::of(name) {
            Some(Special::Connection | Special::Dropped) => continue,
            Some(Special::TransferEncoding) => {
                // Exactly one `chunked` over all lines: pinlb decodes and re-frames the body, so
                // it would lose any other coding, and `chunked, chunked` is how TE.TE smuggling
                // starts.
                for coding in value.split(|&b| b == b',') {
                    codings += 1;
                    chunked_only &= coding.trim_ascii().eq_ignore_ascii_case(b"chunked");
                }
                continue;
            }
            Some(Special::ContentLength) => {
                content_length = add_content_length(content_length, value);
                continue;
            }
            Some(Special::Expect) => {
                expect_continue |= value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
                continue;
            }
            Some(Special::ForwardedFor) => {
                let list = forwarded_for.get_or_insert_with(Vec::new);
                if !list.is_empty() {
                    list.extend_from_slice(b", ");
                }
                list.extend_from_slice(value);
                continue;
            }
            Some(Special::Host) => {
                hosts += 1;
                host_ok = is_valid_host(value);
                host_value = Some(value);
                continue;
            }
            Some(Special::Proxied) => {
                let lines = proxied_lines.get_or_insert_with(Vec::new);
                lines.extend_from_slice(name);
                lines.extend_from_slice(b": ");
                lines.extend_from_slice(value);
                lines.extend_from_slice(b"\r\n");
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
        if named.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            continue;
        }
        // httparse has checked the name's token characters and the value's bytes (HTAB,
        // visible ASCII, space, obs-text: what a header value may hold), so the line can be
        // copied as it is.
        text.extend_from_slice(name);
        text.extend_from_slice(b": ");
        let at = text.len();
        text.extend_from_slice(value);
        if let Some(k) = keep {
            *k = Some((at, text.len()));
        }
        text.extend_from_slice(b"\r\n");
    }
    let lines = (lines_start, text.len());
    // Host is not a line: pinlb writes it first, itself. An absolute-form target's authority
    // wins over it (RFC 9112 §3.2.2).
    if let (false, 1, Some(value)) = (absolute, hosts, host_value) {
        let at = text.len();
        text.extend_from_slice(value);
        host = Some(Span::Text(at, text.len()));
    }

    let mut refused = None;
    let mut refuse = |e: ClientError| {
        refused.get_or_insert(e);
    };
    if target.len() > limits.max_uri_bytes {
        refuse(ClientError::UriTooLong {
            len: target.len(),
            limit: limits.max_uri_bytes,
        });
    }
    if target == b"*" && method != Method::OPTIONS {
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

    let path = match path {
        Path::Within(a, b) => (a, b),
        Path::SlashThen(a, b) => {
            let at = text.len();
            text.push(b'/');
            text.extend_from_slice(&target[a..b]);
            (at, text.len())
        }
    };
    // The head is copied out; what follows it (body, next requests) stays.
    buf.advance(len);
    // Spans of the target are offsets into it, and it sits at the start of `text`.
    let resolve = |s: Span| match s {
        Span::Target(a, b) | Span::Text(a, b) => (a, b),
    };
    Ok(Some(RequestHead {
        method,
        version,
        target: target_at,
        lines,
        host: host.map(resolve),
        path,
        user_agent,
        referer,
        text,
        forwarded_for,
        proxied_lines,
        body,
        keep_alive: !close && (version == Version::HTTP_11 || keep_alive_token),
        ambiguous: te && content_length != ContentLength::Absent,
        expect_continue: expect_continue && version == Version::HTTP_11,
        refused,
    }))
}

/// A stretch of the request head's `text`: within the target (which starts it), or after it.
#[derive(Debug, Clone, Copy)]
enum Span {
    Target(usize, usize),
    Text(usize, usize),
}

/// The origin-form path a target goes upstream with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// This stretch of the target.
    Within(usize, usize),
    /// `/` and then this stretch of the target: an absolute-form target with a query and no
    /// path (`http://a?q` goes upstream as `/?q`, RFC 9112 §3.2.1).
    SlashThen(usize, usize),
}

/// Whether a byte may appear in a request target as it is: unreserved, sub-delims, `:`, `@`,
/// `/`, `?` and `%` (RFC 3986). Targets of only these skip `http::uri` validation.
fn is_plain_target_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b)
}

/// Splits a request target into the authority an absolute-form target names, if any, and the
/// origin-form path to send upstream. A fragment (never valid in a request, RFC 9112 §3.2) is cut
/// off, as `http::Uri` did for hyper. Refuses the authority form (`CONNECT host:port`: pinlb does
/// not tunnel), targets that are not URIs, and absolute-form targets other than `http://` with a
/// valid `host[:port]` (userinfo would reach the backend as its Host).
fn split_target(target: &[u8], method: &Method) -> Result<(Option<Span>, Path), Malformed> {
    let invalid = || Malformed::bad("malformed request: invalid target");
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
        return Err(Malformed::bad(format!(
            "{method} with an authority-form target is not supported"
        )));
    };
    let authority = authority.as_str().as_bytes();
    if !scheme.eq_ignore_ascii_case("http") || !is_valid_host(authority) {
        return Err(Malformed::bad(
            "malformed request: absolute-form target other than http://host[:port]",
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
        _ => Path::SlashThen(host_end, end),
    };
    Ok((Some(Span::Target(host_start, host_end)), path))
}

/// Takes in one Content-Length line of a request: digits only. Lines must agree; a list in one
/// line is refused, as hyper refused it (a response's list of equal values is accepted, in `h1`).
fn add_content_length(now: ContentLength, value: &[u8]) -> ContentLength {
    let v = value.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return ContentLength::Invalid("invalid Content-Length");
    }
    // At most 19 digits: no overflow.
    let n = v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    match now {
        ContentLength::Absent => ContentLength::Valid(n),
        ContentLength::Valid(l) if l == n => now,
        ContentLength::Valid(_) => ContentLength::Invalid("conflicting Content-Length values"),
        ContentLength::Invalid(_) => now,
    }
}

/// Whether a Host value is `host[:port]` (RFC 9110 §7.2, RFC 3986 §3.2.2): a registered name or
/// IPv4 address of unreserved, sub-delim and `%` characters, or an IPv6 literal in brackets,
/// then an optional decimal port.
fn is_valid_host(v: &[u8]) -> bool {
    let (host, port) = if let Some(rest) = v.strip_prefix(b"[") {
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
            [] => return true,
            [b':', port @ ..] => (&b""[..], port),
            _ => return false,
        }
    } else {
        match v.iter().rposition(|&b| b == b':') {
            Some(i) => (&v[..i], &v[i + 1..]),
            None => (v, &b""[..]),
        }
    };
    let reg_name = |b: &u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%".contains(b);
    let host_ok = v.starts_with(b"[") || (!host.is_empty() && host.iter().all(reg_name));
    host_ok && port.iter().all(u8::is_ascii_digit)
}

/// Reads what the socket has into the spare room of `buf`; `Ok(0)` is the end of the stream.
///
/// A short read has emptied the socket, so the socket's readiness is cleared then, as tokio's
/// own `poll_read` does: the next wait goes straight to the reactor instead of first making a
/// read that fails with EAGAIN.
fn poll_read_buf(
    stream: &TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(idle::READ_BUFFER);
    }
    loop {
        ready!(stream.poll_read_ready(cx))?;
        let spare = buf.spare_capacity_mut();
        let room = spare.len();
        let mut got = 0;
        let read = stream.try_io(Interest::READABLE, || {
            let n = SockRef::from(stream).recv(spare)?;
            got = n;
            if n > 0 && n < room {
                // Reported to tokio as "would block" so that it clears the readiness; `got`
                // carries the bytes out.
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match read {
            Ok(_) | Err(_) if got > 0 => {
                // SAFETY: `recv` initialised the first `got` bytes of the spare capacity.
                unsafe { buf.set_len(buf.len() + got) };
                return Poll::Ready(Ok(got));
            }
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

/// Writes all of `bufs`, waiting for room in the socket as needed.
async fn write_all(stream: &TcpStream, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    let mut left: usize = bufs.iter().map(|b| b.len()).sum();
    // Bounded: every pass writes something, or waits for room, or fails.
    while left > 0 {
        match stream.try_write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                left -= n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A request's body, read from the client connection as the proxy sends it on.
pub struct ClientBody<'a> {
    stream: &'a TcpStream,
    buf: &'a mut BytesMut,
    framing: RequestFraming,
    decoder: Decoder,
    /// `Expect: 100-continue` not yet answered.
    expect_continue: bool,
    /// Told when the body is complete, for the connection to see while the proxy holds it.
    watch: &'a Watch,
}

impl<'a> ClientBody<'a> {
    fn new(
        stream: &'a TcpStream,
        buf: &'a mut BytesMut,
        framing: RequestFraming,
        expect_continue: bool,
        watch: &'a Watch,
    ) -> Self {
        let decoder = Decoder::new(match framing {
            RequestFraming::None => Framing::Empty,
            RequestFraming::Length(n) => Framing::Length(n),
            RequestFraming::Chunked => Framing::Chunked,
        });
        let body = ClientBody {
            stream,
            buf,
            framing,
            decoder,
            expect_continue,
            watch,
        };
        body.check_done();
        body
    }

    /// Once the body is complete, whatever is left in the buffer belongs to a next request.
    fn check_done(&self) {
        if self.decoder.is_done() {
            self.watch.body_done.set(true);
            if !self.buf.is_empty() {
                self.watch.pipelined.set(true);
            }
        }
    }

    /// How the client framed the body, as it goes upstream.
    pub fn framing(&self) -> RequestFraming {
        self.framing
    }

    /// True once the whole body has been read (at once, for a request without one).
    pub fn is_done(&self) -> bool {
        self.decoder.is_done()
    }

    /// The next piece of the body; `None` once it is complete. Errors are the client's: a
    /// malformed chunk, or the connection ending mid-body.
    pub async fn next(&mut self) -> Result<Option<Bytes>, H1Error> {
        // Bounded: every pass decodes, or reads at least one byte, or ends.
        loop {
            let decoded = self
                .decoder
                .decode(self.buf)
                .map_err(|e| H1Error::ClientBody(e.to_string()))?;
            self.check_done();
            if decoded.is_some() || self.decoder.is_done() {
                return Ok(decoded);
            }
            if self.expect_continue {
                // The client waits for this before it sends the body; a client that sent it
                // anyway has it in the buffer, and the answer is skipped.
                self.expect_continue = false;
                write_all(
                    self.stream,
                    &mut [IoSlice::new(b"HTTP/1.1 100 Continue\r\n\r\n")],
                )
                .await
                .map_err(|e| H1Error::ClientBody(e.to_string()))?;
            }
            let n = std::future::poll_fn(|cx| poll_read_buf(self.stream, self.buf, cx))
                .await
                .map_err(|e| H1Error::ClientBody(e.to_string()))?;
            if n == 0 {
                return Err(H1Error::ClientBody(
                    "client closed the connection mid-body".into(),
                ));
            }
        }
    }
}

/// What the connection watches while the proxy holds the request body.
#[derive(Default)]
struct Watch {
    /// The whole request body has been read.
    body_done: Cell<bool>,
    /// Bytes of a next request have arrived: in the buffer, or waiting in the socket.
    pipelined: Cell<bool>,
}

/// Completes when the client closes its connection (or it breaks) while its request is with a
/// backend, so that the request is abandoned, as hyper and nginx do. Watches only once the
/// request body has been read, and not once a next request has begun to arrive: those bytes are
/// not read until the response is out, and a client that pipelines and then closes its side
/// still gets every answer.
fn poll_client_gone(stream: &TcpStream, watch: &Watch, cx: &mut Context<'_>) -> Poll<()> {
    if !watch.body_done.get() || watch.pipelined.get() {
        return Poll::Pending;
    }
    // Bounded: a pass that does not return has cleared the readiness, and the next poll of
    // readiness is Pending unless new bytes came.
    for _ in 0..4 {
        match stream.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Ready(Ok(())) => {}
        }
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        match stream.try_io(Interest::READABLE, || {
            SockRef::from(stream).peek(&mut probe)
        }) {
            Ok(0) => return Poll::Ready(()),
            Ok(_) => {
                watch.pipelined.set(true);
                return Poll::Pending;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Poll::Ready(()),
        }
    }
    Poll::Pending
}

/// A timer made on first need and reset for each later wait: waits that never block (most do
/// not) cost no timer, and those that do share one.
#[derive(Default)]
struct Deadline(Option<Pin<Box<tokio::time::Sleep>>>);

impl Deadline {
    /// `fut`'s output, or `None` if it was pending for `limit`.
    async fn within<T>(&mut self, limit: Duration, fut: impl Future<Output = T>) -> Option<T> {
        let mut fut = std::pin::pin!(fut);
        let mut armed = false;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(v));
            }
            if !armed {
                armed = true;
                let at = Instant::now() + limit;
                match self.0.as_mut() {
                    Some(t) => t.as_mut().reset(at),
                    None => self.0 = Some(Box::pin(tokio::time::sleep_until(at))),
                }
            }
            match self.0.as_mut().map(|t| t.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(None),
                _ => Poll::Pending,
            }
        })
        .await
    }
}

/// What happens to a connection after an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
    /// Close, reading and discarding what the client still sends for a while first.
    Linger,
    /// Reset: a response broke off, and the client must not take what it got for the whole.
    Abort,
}

/// How a response went out.
enum Written {
    /// Whole; with whether the connection may carry another request.
    Whole { keep_alive: bool },
    /// Cut short: the backend failed or stalled mid-body.
    Aborted,
}

/// One client connection, for as long as it is open.
struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    slot: idle::Client,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    /// The header timeout of the connection's first request runs from here.
    accepted: Instant,
    /// The rules the connection's client identity was worked out under, and that identity;
    /// recomputed only after a reload changed the rules (`forwarded.trusted` above all).
    client: std::cell::RefCell<(Rc<crate::server::ClientRules>, Rc<proxy::Client>)>,
}

/// A connection parked while idle (see `idle`): what it needs to start again.
pub struct Parked {
    pub socket: std::net::TcpStream,
    peer: SocketAddr,
    slot: idle::Client,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    held: Held,
    /// No request has come on it yet: its first head is still timed from `accepted`.
    first: bool,
    accepted: Instant,
}

impl Parked {
    pub fn slot_index(&self) -> usize {
        self.slot.index()
    }
}

/// Starts parked connections again as their clients send something, until the worker ends.
pub(crate) async fn unparker(clients: Rc<idle::Clients>) {
    loop {
        for parked in clients.unparked().await {
            let Parked {
                socket,
                peer,
                slot,
                route,
                batch,
                held,
                first,
                accepted,
            } = *parked;
            match TcpStream::from_std(socket) {
                Ok(stream) => {
                    let start = Start { first, accepted };
                    tokio::task::spawn_local(serve(stream, peer, slot, route, batch, held, start));
                }
                // Dropped: closed.
                Err(e) => debug!(client = %peer, "cannot take a parked connection back: {e}"),
            }
        }
    }
}

/// Where a connection's service starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// No request has come on it yet.
    pub first: bool,
    /// When it was accepted: the header timeout of its first request runs from here.
    pub accepted: Instant,
}

impl Start {
    /// A connection just accepted.
    pub fn accepted() -> Start {
        Start {
            first: true,
            accepted: Instant::now(),
        }
    }
}

/// Serves one client connection until it closes or is parked. `held` is kept until then: the
/// connection's `limits.max_connections` permit and its counters.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    slot: idle::Client,
    route: Rc<Route>,
    batch: Option<Rc<Batch>>,
    held: Held,
    start: Start,
) {
    let rules = route.rules.borrow().clone();
    let client = Rc::new(proxy::Client::new(peer, &rules.trusted));
    let conn = Connection {
        stream,
        peer,
        slot,
        route,
        batch,
        accepted: start.accepted,
        client: std::cell::RefCell::new((rules, client)),
    };
    let mut buf = BytesMut::new();
    let mut first = start.first;
    // Bounded by the client: every pass serves one request, or ends.
    let next = loop {
        if buf.is_empty() {
            // Idle until the first bytes of a request are in the buffer (or the client closed):
            // a readiness without bytes behind it keeps the connection idle, with no buffer.
            let wait = std::future::poll_fn(|cx| {
                conn.slot.poll_wait(first, cx, |cx| {
                    if buf.capacity() == 0 {
                        buf = conn.slot.clients().take_buffer();
                    }
                    let read = poll_read_buf(&conn.stream, &mut buf, cx);
                    if read.is_pending() && buf.is_empty() {
                        conn.slot.clients().give_buffer(std::mem::take(&mut buf));
                    }
                    read.map(|r| r.map(drop))
                })
            })
            .await;
            match wait {
                Wait::Readable => {}
                Wait::Close => {
                    debug!(client = %conn.peer, "closing client connection: idle, or making room, or stopping");
                    break Next::Close;
                }
                Wait::Park => {
                    park(conn, held, first);
                    return;
                }
            }
        }
        // Boxed: the exchange's state (about 5 KB, most of it the proxy's) exists only while a
        // request does, so that a connection waiting for its next request keeps a small task.
        // Unboxed saved about 500 instructions per request (an allocation and a copy of the
        // state), but the memory of 10,000 connections that had just gone idle (before they
        // park) stayed with the allocator, and benches/idle.sh measured 571 bytes per parked
        // connection instead of 391.
        let next = Box::pin(conn.exchange(&mut buf, first)).await;
        if next != Next::KeepAlive {
            break next;
        }
        first = false;
        if buf.is_empty() {
            // Nothing pipelined: the buffer goes until the next request comes.
            conn.slot.clients().give_buffer(std::mem::take(&mut buf));
        }
    };
    // Boxed: rarely needed (a lingering close holds a buffer and a timer), and kept out of the
    // task's own state, which every open connection pays for.
    Box::pin(conn.close(next)).await;
    drop(held);
}

/// Parks an idle connection: its socket leaves the reactor for the worker's parking set.
fn park(conn: Connection, held: Held, first: bool) {
    let Connection {
        stream,
        peer,
        slot,
        route,
        batch,
        accepted,
        ..
    } = conn;
    let clients = slot.clients_rc();
    match stream.into_std() {
        Ok(socket) => {
            let parked = Box::new(Parked {
                socket,
                peer,
                slot,
                route,
                batch,
                held,
                first,
                accepted,
            });
            if let Err(parked) = clients.park(parked) {
                debug!(client = %peer, "closing idle client connection: it could not be parked");
                drop(parked);
            }
        }
        Err(e) => debug!(client = %peer, "closing idle client connection: {e}"),
    }
}

impl Connection {
    /// Reads one request, has the proxy answer it, and writes the response.
    async fn exchange(&self, buf: &mut BytesMut, first: bool) -> Next {
        let limits = self.route.rules.borrow().limits;
        let mut head = match self.read_head(buf, first, &limits).await {
            Ok(head) => head,
            Err(next) => return next,
        };
        let refused = head.refused.take();
        if let Some(s) = &self.route.stats {
            s.requests.fetch_add(1, Ordering::Relaxed);
        }
        let pending = self
            .batch
            .as_ref()
            .map(|batch| Pending::start(&head, self.peer, batch));
        let upstream = self.route.upstream.borrow().clone();
        let timeouts = upstream.shared.config.timeouts;
        let (limits, client) = {
            let now = self.route.rules.borrow();
            let mut cached = self.client.borrow_mut();
            if !Rc::ptr_eq(&cached.0, &now) {
                *cached = (
                    now.clone(),
                    Rc::new(proxy::Client::new(self.peer, &now.trusted)),
                );
            }
            (now.limits, cached.1.clone())
        };
        let watch = Watch::default();
        let mut client_body =
            ClientBody::new(&self.stream, buf, head.body, head.expect_continue, &watch);
        let answered = {
            let forwarded = proxy::handle(
                upstream,
                client,
                limits,
                &head,
                &mut client_body,
                refused,
                pending.is_some(),
            );
            let gone = std::future::poll_fn(|cx| poll_client_gone(&self.stream, &watch, cx));
            tokio::select! {
                biased;
                answer = forwarded => Some(answer),
                () = gone => None,
            }
        };
        let Some(answer) = answered else {
            // Dropping the proxy's future abandons the request; the access log records 499.
            debug!(client = %self.peer, "client closed the connection while its request was with a backend");
            return Next::Close;
        };
        let body_read = client_body.is_done();
        let Answer {
            response,
            upstreamed,
            close,
        } = answer;
        let logged = Logged::new(pending.and_then(|p| p.responded(response.status, upstreamed)));
        let keep_alive = head.keep_alive
            && !head.ambiguous
            && !close
            && body_read
            && !self.slot.clients().is_draining();
        let written = self
            .write_response(
                response,
                &head.method,
                head.version,
                keep_alive,
                logged,
                timeouts,
            )
            .await;
        match written {
            Ok(Written::Whole { keep_alive: true }) => Next::KeepAlive,
            Ok(Written::Whole { .. }) if body_read && buf.is_empty() && !watch.pipelined.get() => {
                Next::Close
            }
            // Bytes the client sent are left unread.
            Ok(Written::Whole { .. }) => Next::Linger,
            Ok(Written::Aborted) | Err(_) => Next::Abort,
        }
    }

    /// Reads until `buf` holds a whole request head. A head that can't be served (malformed,
    /// too large, too late) is answered here; `Err` says how the connection ends then, or after
    /// the client closed.
    async fn read_head(
        &self,
        buf: &mut BytesMut,
        first: bool,
        limits: &Limits,
    ) -> Result<RequestHead, Next> {
        let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
        // Bounded: each pass reads at least one byte (the head is at most
        // `limits.max_header_bytes`), or ends.
        loop {
            if !buf.is_empty() {
                match parse_request(buf, limits) {
                    Ok(Some(head)) => return Ok(head),
                    Ok(None) => {}
                    Err(m) => {
                        warn!(client = %self.peer, "answered {}: {}", m.status.as_u16(), m.cause);
                        self.write_local(m.status, &m.cause).await;
                        return Err(Next::Linger);
                    }
                }
                if timer.is_none() {
                    // Part of a head is here: it must be complete within the header timeout of
                    // its first byte (of the accept, for the first request). The clock is read
                    // only now, when a head needs more than one read.
                    let since = if first { self.accepted } else { Instant::now() };
                    timer = Some(Box::pin(tokio::time::sleep_until(
                        since + limits.header_timeout,
                    )));
                }
            }
            let read = std::future::poll_fn(|cx| {
                if let Some(t) = timer.as_mut() {
                    if t.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                }
                poll_read_buf(&self.stream, buf, cx).map(Some)
            })
            .await;
            match read {
                Some(Ok(0)) => {
                    if !buf.is_empty() {
                        debug!(client = %self.peer, "client closed the connection inside a request head");
                    }
                    return Err(Next::Close);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    debug!(client = %self.peer, "client connection failed: {e}");
                    return Err(Next::Close);
                }
                None => {
                    warn!(client = %self.peer, "answered 408: no complete request head within {:?} (limits.header_timeout)", limits.header_timeout);
                    self.write_local(
                        StatusCode::REQUEST_TIMEOUT,
                        "no complete request head within limits.header_timeout",
                    )
                    .await;
                    // What arrived of the head is dropped, and what still comes is read and
                    // dropped for a while, so that the client sees the 408 and not a reset.
                    buf.clear();
                    return Err(Next::Linger);
                }
            }
        }
    }

    /// Writes a response pinlb makes itself before any request reached the proxy, and which
    /// ends the connection. Best effort, for at most `LINGER_TIME`: the connection closes next
    /// anyway.
    async fn write_local(&self, status: StatusCode, cause: &str) {
        let text = format!(
            "{} {}: {cause}\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        );
        let mut head = Vec::with_capacity(256);
        status_line(&mut head, status);
        head.extend_from_slice(b"content-type: text/plain; charset=utf-8\r\n");
        self.slot.clients().write_date(&mut head);
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(itoa::Buffer::new().format(text.len()).as_bytes());
        head.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
        let mut out = [IoSlice::new(&head), IoSlice::new(text.as_bytes())];
        let _ = tokio::time::timeout(LINGER_TIME, write_all(&self.stream, &mut out)).await;
    }

    /// Writes a response and streams its body.
    ///
    /// Each wait is bounded: for the next piece of the body by `timeouts.response` (nginx's
    /// `proxy_read_timeout`), for room in the client's socket by `timeouts.client_idle` (its
    /// `send_timeout`). Either running out cuts the response short.
    async fn write_response(
        &self,
        response: Reply<ProxyBody>,
        method: &Method,
        version: Version,
        keep_alive: bool,
        mut logged: Logged,
        timeouts: crate::config::Timeouts,
    ) -> io::Result<Written> {
        let Reply {
            status,
            headers,
            mut body,
        } = response;
        let bodiless = method == Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED;
        let length = body.remaining();
        let chunked = !bodiless && length.is_none() && version == Version::HTTP_11;
        // An HTTP/1.0 client gets a body of unknown length delimited by the close.
        let keep_alive = keep_alive && (bodiless || length.is_some() || chunked);

        let mut head = Vec::with_capacity(headers.len() + 128);
        status_line(&mut head, status);
        head.extend_from_slice(&headers);
        if !body.has_date() {
            self.slot.clients().write_date(&mut head);
        }
        if !bodiless {
            match length {
                Some(n) => {
                    head.extend_from_slice(b"content-length: ");
                    head.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                    head.extend_from_slice(b"\r\n");
                }
                None if chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
                None => {}
            }
        }
        if !keep_alive {
            head.extend_from_slice(b"connection: close\r\n");
        } else if version == Version::HTTP_10 {
            head.extend_from_slice(b"connection: keep-alive\r\n");
        }
        head.extend_from_slice(b"\r\n");

        let mut reading = Deadline::default();
        let mut sending = Deadline::default();
        let stalled = || io::Error::new(io::ErrorKind::TimedOut, "client took no data");
        // The head goes out with the first piece of the body when that is already here (the
        // backend usually sends its head and a small body in one packet): one write, not two.
        let mut head = Some(head);
        // Bounded by the body and the timeouts: every pass writes a piece of it, or ends.
        loop {
            let piece = if bodiless {
                None
            } else if head.is_some() {
                match std::future::poll_fn(|cx| Poll::Ready(body.poll_data(cx))).await {
                    Poll::Ready(piece) => piece,
                    Poll::Pending => {
                        if let Some(h) = head.take() {
                            sending
                                .within(
                                    timeouts.client_idle,
                                    write_all(&self.stream, &mut [IoSlice::new(&h)]),
                                )
                                .await
                                .ok_or_else(stalled)??;
                        }
                        continue;
                    }
                }
            } else {
                let next = std::future::poll_fn(|cx| body.poll_data(cx));
                match reading.within(timeouts.response, next).await {
                    Some(piece) => piece,
                    None => {
                        warn!(client = %self.peer, "response aborted: the backend sent no more of the body within {:?} (timeouts.response)", timeouts.response);
                        return Ok(Written::Aborted);
                    }
                }
            };
            let h = head.take().unwrap_or_default();
            let write = match piece {
                Some(Ok(data)) => {
                    logged.sent(data.len());
                    if chunked {
                        let mut size = [0u8; 18];
                        let size = chunk_size_line(&mut size, data.len());
                        let mut out = [
                            IoSlice::new(&h),
                            IoSlice::new(size),
                            IoSlice::new(&data),
                            IoSlice::new(b"\r\n"),
                        ];
                        sending
                            .within(timeouts.client_idle, write_all(&self.stream, &mut out))
                            .await
                    } else {
                        let mut out = [IoSlice::new(&h), IoSlice::new(&data)];
                        sending
                            .within(timeouts.client_idle, write_all(&self.stream, &mut out))
                            .await
                    }
                }
                None => {
                    let end: &[u8] = if chunked { b"0\r\n\r\n" } else { b"" };
                    let mut out = [IoSlice::new(&h), IoSlice::new(end)];
                    sending
                        .within(timeouts.client_idle, write_all(&self.stream, &mut out))
                        .await
                        .ok_or_else(stalled)??;
                    return Ok(Written::Whole { keep_alive });
                }
                Some(Err(e)) => {
                    if !h.is_empty() {
                        let mut out = [IoSlice::new(&h)];
                        sending
                            .within(timeouts.client_idle, write_all(&self.stream, &mut out))
                            .await
                            .ok_or_else(stalled)??;
                    }
                    warn!(client = %self.peer, "response aborted: {e}");
                    return Ok(Written::Aborted);
                }
            };
            if write.is_none() {
                warn!(client = %self.peer, "response aborted: the client took no data for {:?} (timeouts.client_idle)", timeouts.client_idle);
            }
            write.ok_or_else(stalled)??;
        }
    }

    /// Ends the connection. After a response the write side closes first, so the client sees
    /// the end of the stream; with `Next::Linger`, what the client still sends is then read
    /// and dropped for a while, so that closing with unread bytes does not reset the connection
    /// before the client has read its answer (nginx's `lingering_close`). `Next::Abort` resets
    /// it instead: a response cut short must not look complete, even one delimited by the close.
    async fn close(&self, next: Next) {
        let sock = SockRef::from(&self.stream);
        if next == Next::Abort {
            let _ = sock.set_linger(Some(Duration::ZERO));
            return;
        }
        let _ = sock.shutdown(std::net::Shutdown::Write);
        if next != Next::Linger {
            return;
        }
        let mut scratch = BytesMut::with_capacity(16 * 1024);
        let mut read = 0;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            // Bounded by `LINGER_BYTES` and the timeout.
            while read < LINGER_BYTES {
                scratch.clear();
                match std::future::poll_fn(|cx| poll_read_buf(&self.stream, &mut scratch, cx)).await
                {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        })
        .await;
    }
}

/// `HTTP/1.1 200 OK\r\n`
fn status_line(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A chunk's size line, `1a\r\n`, written into `out`.
fn chunk_size_line(out: &mut [u8; 18], len: usize) -> &[u8] {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<RequestHead>, Malformed> {
        parse_with(text, &Limits::default())
    }

    fn parse_with(text: &str, limits: &Limits) -> Result<Option<RequestHead>, Malformed> {
        parse_request(&mut BytesMut::from(text), limits)
    }

    fn head(text: &str) -> RequestHead {
        parse(text).unwrap().expect("a complete head")
    }

    fn refused(text: &str) -> Option<ClientError> {
        head(text).refused
    }

    #[test]
    fn a_head_is_parsed_and_leaves_the_body_and_the_next_request_in_the_buffer() {
        let mut buf = BytesMut::from(
            "POST /a?b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\nhiGET",
        );
        let h = parse_request(&mut buf, &Limits::default())
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
    fn a_partial_head_asks_for_more_until_it_is_over_the_limit() {
        assert!(parse("GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
        let limits = Limits {
            max_header_bytes: 1024,
            ..Limits::default()
        };
        let long = format!("GET / HTTP/1.1\r\nX-A: {}", "a".repeat(1100));
        assert_eq!(parse_with(&long, &limits).unwrap_err().status, 431);
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X-A: 1\r\n".repeat(Limits::default().max_headers + 1)
        );
        assert_eq!(parse(&many).unwrap_err().status, 431);
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
        let limits = Limits {
            max_uri_bytes: 16,
            max_body: 10,
            ..Limits::default()
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
            assert_eq!(parse(bad).unwrap_err().status, 400, "{bad:?}");
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
            assert_eq!(parse(bad).unwrap_err().status, 400, "{bad:?}");
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
            assert_eq!(parse(&t).unwrap_err().status, 400, "{bad:?}");
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
}
