//! The client side of HTTP/1.1, only as far as a load generator needs it: a pre-built GET request,
//! the status and framing of a response head (parsed with `httparse`), and a body decoder that
//! finds where a body ends without keeping it.
//!
//! The head's framing rules (Connection tokens, Content-Length, the final transfer coding) are
//! the proxy's own, from `http1::common`. The body is not `http1::body`'s: that decoder hands each
//! piece of a body on as `Bytes`; here the body is thrown away as it arrives, so all a response costs is one parse
//! of its head and a scan of its chunk sizes. All of it is pure and works on byte slices, so the
//! connection loops in [`super::load`] do only I/O. [`BodyDecoder`] also finds the end of the
//! request bodies `pinlb backend` drops: chunked framing is the same both ways.

use http::Uri;

use pinlb::http1::common::{ConnectionTokens, ContentLength, Hop, final_coding_chunked};

/// Most header lines accepted in a response head (a WebSocket `101` included).
const MAX_HEADERS: usize = 64;

/// What each request looks like beyond its URL: `-m`, `-H`, `--body`, `--http1.0` and
/// `--disable-keepalive`. The default is wrk's: `GET`, HTTP/1.1, `Host` only, kept alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    pub method: http::Method,
    /// Sent in this order after `Host` (or instead of it, when one of them is `Host`).
    pub headers: Vec<(String, String)>,
    /// Sent with its `Content-Length`, unless a header given sets one.
    pub body: Option<Vec<u8>>,
    /// `HTTP/1.0` on the request line, as `ab` sends.
    pub http10: bool,
    /// Every request on a connection of its own, asking the server to close it (`ab` without
    /// `-k`).
    pub keep_alive: bool,
}

impl Default for RequestSpec {
    fn default() -> Self {
        RequestSpec {
            method: http::Method::GET,
            headers: Vec::new(),
            body: None,
            http10: false,
            keep_alive: true,
        }
    }
}

/// The request a target gets, written once and sent as is on every exchange: the method with
/// the URL's path and query, `Host` set to its authority (what wrk sends), the headers asked for,
/// and the body. An HTTP/1.0 request that is kept alive says `Connection: keep-alive` (as
/// `ab -k` does); an HTTP/1.1 one that is not says `Connection: close`.
pub fn request_bytes(url: &Uri, spec: &RequestSpec) -> Vec<u8> {
    let target = url.path_and_query().map_or("/", |pq| pq.as_str());
    let target = if target.is_empty() { "/" } else { target };
    let host = url.authority().map_or("", |a| {
        let s = a.as_str();
        s.rsplit_once('@').map_or(s, |(_, host)| host)
    });
    let version = if spec.http10 { "1.0" } else { "1.1" };
    let given = |name: &str| {
        spec.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    };
    let mut out = format!("{} {target} HTTP/{version}\r\n", spec.method);
    if !given("host") {
        out.push_str(&format!("Host: {host}\r\n"));
    }
    for (name, value) in &spec.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !given("connection") {
        match (spec.http10, spec.keep_alive) {
            (true, true) => out.push_str("Connection: keep-alive\r\n"),
            (false, false) => out.push_str("Connection: close\r\n"),
            _ => {}
        }
    }
    if let Some(body) = &spec.body {
        if !given("content-length") {
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if let Some(body) = &spec.body {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// A `-H` argument, `Name: value`, checked to be a header httparse and servers accept.
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("header {s:?}: expected \"Name: value\""))?;
    let (name, value) = (name.trim(), value.trim());
    http::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("header {s:?}: {name:?} is not a header name"))?;
    http::header::HeaderValue::from_str(value)
        .map_err(|_| format!("header {s:?}: the value holds a control character"))?;
    Ok((name.to_string(), value.to_string()))
}

/// Why a response could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// `httparse` rejected the head.
    Head,
    /// Content-Length that is not a number, or two that disagree.
    ContentLength,
    /// A chunk size line that is not hex, or a chunk not followed by CRLF.
    Chunk,
}

/// What the head of a response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Bytes of the head, up to and including the empty line.
    pub len: usize,
    pub status: u16,
    pub body: BodyDecoder,
    /// Whether the connection can carry another request after this response.
    pub keep_alive: bool,
    /// pinlb's own time on the request, in ns, when the response says it: the `pinlb` metric
    /// of its `Server-Timing` header ([`pinlb_time`]).
    pub pinlb_ns: Option<u64>,
}

impl Head {
    /// An interim response (100 Continue, 103 Early Hints): a final one follows.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

/// Parses a response head at the start of `buf`: `Ok(None)` until it is complete.
///
/// Framing follows RFC 9112 §6.3 for a response to GET: no body for 1xx, 204 and 304;
/// `Transfer-Encoding` ending in `chunked` is chunked, any other transfer coding runs to the end
/// of the connection; otherwise Content-Length; otherwise the body runs to the end of the
/// connection. HTTP/1.0 closes unless it says `keep-alive`; HTTP/1.1 keeps alive unless it says
/// `close`.
///
/// The response to a `HEAD` has no body whatever its head says: `head_request` says so.
pub fn parse_head(buf: &[u8], head_request: bool) -> Result<Option<Head>, Malformed> {
    read_response_head(buf, |resp, len| framing(resp, len, head_request))
        .map_err(|_| Malformed::Head)?
        .transpose()
}

/// Parses the response head at the start of `buf` with `httparse` and hands it to `read`, with
/// its length: `Ok(None)` until the head is complete, `Err` when it is not an HTTP response.
/// The heads of `bench`'s responses and of its WebSocket handshakes are read with this.
#[inline]
pub(crate) fn read_response_head<T>(
    buf: &[u8],
    read: impl FnOnce(&httparse::Response<'_, '_>, usize) -> T,
) -> Result<Option<T>, httparse::Error> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf)? {
        httparse::Status::Complete(len) => Ok(Some(read(&resp, len))),
        httparse::Status::Partial => Ok(None),
    }
}

/// The status and framing of a complete head `len` bytes long, as [`parse_head`] says.
fn framing(
    resp: &httparse::Response<'_, '_>,
    len: usize,
    head_request: bool,
) -> Result<Head, Malformed> {
    let status = resp.code.unwrap_or(0);
    let mut keep_alive = ConnectionTokens::scan(resp.headers).keep_alive(resp.version == Some(1));
    let mut length = ContentLength::Absent;
    let mut chunked = None;
    let mut pinlb_ns = None;
    for h in resp.headers.iter() {
        match Hop::of(h.name.as_bytes()) {
            Some(Hop::TransferEncoding) => chunked = final_coding_chunked(chunked, h.value),
            None if h.name.eq_ignore_ascii_case("content-length") => {
                length = length.add(h.value, true);
            }
            None if h.name.eq_ignore_ascii_case("server-timing") => {
                pinlb_ns = pinlb_ns.or(pinlb_time(h.value));
            }
            _ => {}
        }
    }
    let length = match length {
        ContentLength::Absent => None,
        ContentLength::Valid(n) => Some(n),
        ContentLength::Invalid(_) => return Err(Malformed::ContentLength),
    };
    let body = if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
        BodyDecoder::Length(0)
    } else {
        match (chunked, length) {
            (Some(true), _) => BodyDecoder::Chunked(Chunked::Size { size: 0, digits: 0 }),
            (Some(false), _) | (None, None) => BodyDecoder::UntilClose,
            (None, Some(n)) => BodyDecoder::Length(n),
        }
    };
    if body == BodyDecoder::UntilClose {
        keep_alive = false;
    }
    Ok(Head {
        len,
        status,
        body,
        keep_alive,
        pinlb_ns,
    })
}

/// pinlb's own time in a `Server-Timing` value, in ns: its `pinlb;dur=` metric, which pinlb
/// writes in milliseconds with microsecond resolution (`queue;dur=1.5, pinlb;dur=0.052,
/// upstream;dur=20.113`); `None` when there is none, or it is not a number.
pub fn pinlb_time(value: &[u8]) -> Option<u64> {
    let value = std::str::from_utf8(value).ok()?;
    value.split(',').find_map(|metric| {
        let mut params = metric.split(';').map(str::trim);
        if !params.next()?.eq_ignore_ascii_case("pinlb") {
            return None;
        }
        let ms: f64 = params.find_map(|p| p.strip_prefix("dur="))?.parse().ok()?;
        (ms.is_finite() && ms >= 0.0).then(|| (ms * 1e6).round() as u64)
    })
}

/// Finds the end of a response body in the bytes that arrive after its head, keeping none of
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyDecoder {
    /// This many bytes left.
    Length(u64),
    Chunked(Chunked),
    /// Until the server closes the connection.
    UntilClose,
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunked {
    /// Reading a chunk size: its value so far and how many hex digits.
    Size {
        size: u64,
        digits: u8,
    },
    /// Skipping a chunk extension (`;name=value`) or whitespace up to the end of the size line.
    SizeLine {
        size: u64,
    },
    /// Chunk data left to skip.
    Data(u64),
    /// The CR after chunk data.
    DataCr,
    /// The LF after chunk data.
    DataLf,
    /// At the start of a trailer line (after the last chunk): an empty line ends the body.
    TrailerStart,
    /// The LF of the empty line that ends the body.
    EndLf,
    /// Inside a trailer field line.
    Trailer,
    Done,
}

/// What [`BodyDecoder::feed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Bytes of the input that belong to the body.
    pub used: usize,
    /// Whether the body ended within them.
    pub done: bool,
}

impl BodyDecoder {
    /// Consumes body bytes from the start of `data`. Bytes past the end of the body are left
    /// unused. A close-delimited body is never done here: the caller ends it at end of stream.
    pub fn feed(&mut self, data: &[u8]) -> Result<Fed, Malformed> {
        match self {
            BodyDecoder::Length(left) => {
                let used = usize::try_from(*left).map_or(data.len(), |l| l.min(data.len()));
                *left -= used as u64;
                Ok(Fed {
                    used,
                    done: *left == 0,
                })
            }
            BodyDecoder::UntilClose => Ok(Fed {
                used: data.len(),
                done: false,
            }),
            BodyDecoder::Chunked(state) => feed_chunked(state, data),
        }
    }
}

/// The chunked decoder (RFC 9112 §7.1), byte by byte except for chunk data, which it skips
/// whole. A bare LF is accepted where CRLF belongs, as most clients do.
fn feed_chunked(state: &mut Chunked, data: &[u8]) -> Result<Fed, Malformed> {
    if *state == Chunked::Done {
        return Ok(Fed {
            used: 0,
            done: true,
        });
    }
    let mut i = 0;
    while i < data.len() {
        if let Chunked::Data(left) = state {
            let take = usize::try_from(*left).map_or(data.len() - i, |l| l.min(data.len() - i));
            *left -= take as u64;
            i += take;
            if *left == 0 {
                *state = Chunked::DataCr;
            }
            continue;
        }
        let b = data[i];
        i += 1;
        *state = match *state {
            Chunked::Size { size, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    // 16 hex digits fill a u64.
                    if digits >= 16 {
                        return Err(Malformed::Chunk);
                    }
                    let d = u64::from((b as char).to_digit(16).unwrap_or(0));
                    Chunked::Size {
                        size: size << 4 | d,
                        digits: digits + 1,
                    }
                }
                _ if digits == 0 => return Err(Malformed::Chunk),
                b'\n' => end_of_size_line(size),
                b';' | b' ' | b'\t' | b'\r' => Chunked::SizeLine { size },
                _ => return Err(Malformed::Chunk),
            },
            Chunked::SizeLine { size } => match b {
                b'\n' => end_of_size_line(size),
                _ => Chunked::SizeLine { size },
            },
            Chunked::DataCr => match b {
                b'\r' => Chunked::DataLf,
                b'\n' => Chunked::Size { size: 0, digits: 0 },
                _ => return Err(Malformed::Chunk),
            },
            Chunked::DataLf => match b {
                b'\n' => Chunked::Size { size: 0, digits: 0 },
                _ => return Err(Malformed::Chunk),
            },
            Chunked::TrailerStart => match b {
                b'\r' => Chunked::EndLf,
                b'\n' => Chunked::Done,
                _ => Chunked::Trailer,
            },
            Chunked::EndLf => match b {
                b'\n' => Chunked::Done,
                _ => return Err(Malformed::Chunk),
            },
            Chunked::Trailer => match b {
                b'\n' => Chunked::TrailerStart,
                _ => Chunked::Trailer,
            },
            // `Data` is handled above; `Done` returns below before another byte is read.
            s @ (Chunked::Data(_) | Chunked::Done) => s,
        };
        if *state == Chunked::Done {
            return Ok(Fed {
                used: i,
                done: true,
            });
        }
    }
    Ok(Fed {
        used: i,
        done: *state == Chunked::Done,
    })
}

fn end_of_size_line(size: u64) -> Chunked {
    if size == 0 {
        Chunked::TrailerStart
    } else {
        Chunked::Data(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Head {
        parse_head(s.as_bytes(), false).unwrap().unwrap()
    }

    /// Feeds `data` split at every possible point into two pieces and checks each split gives
    /// the same result as feeding it whole.
    fn feed_split_everywhere(start: BodyDecoder, data: &[u8]) -> Result<Fed, Malformed> {
        let mut w = start;
        let whole = w.feed(data);
        for cut in 0..=data.len() {
            let mut d = start;
            let a = d.feed(&data[..cut]);
            let split = a.and_then(|a| {
                if a.done {
                    return Ok(a);
                }
                let b = d.feed(&data[cut..])?;
                Ok(Fed {
                    used: a.used + b.used,
                    done: b.done,
                })
            });
            assert_eq!(split, whole, "cut at {cut}");
        }
        whole
    }

    fn chunked() -> BodyDecoder {
        BodyDecoder::Chunked(Chunked::Size { size: 0, digits: 0 })
    }

    #[test]
    fn the_request_asks_for_the_path_and_names_the_host() {
        let u: Uri = "http://127.0.0.1:8881/a/b?x=1".parse().unwrap();
        assert_eq!(
            request_bytes(&u, &RequestSpec::default()),
            b"GET /a/b?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8881\r\n\r\n"
        );
        let u: Uri = "http://example.com".parse().unwrap();
        assert_eq!(
            request_bytes(&u, &RequestSpec::default()),
            b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"
        );
        let u: Uri = "http://user@example.com:81/".parse().unwrap();
        assert_eq!(
            request_bytes(&u, &RequestSpec::default()),
            b"GET / HTTP/1.1\r\nHost: example.com:81\r\n\r\n"
        );
    }

    #[test]
    fn method_headers_body_and_version_are_as_asked() {
        let u: Uri = "http://127.0.0.1:8881/post".parse().unwrap();
        let spec = RequestSpec {
            method: http::Method::POST,
            headers: vec![("X-A".into(), "1".into()), ("host".into(), "h".into())],
            body: Some(b"hello".to_vec()),
            http10: false,
            keep_alive: false,
        };
        assert_eq!(
            request_bytes(&u, &spec),
            b"POST /post HTTP/1.1\r\nX-A: 1\r\nhost: h\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello"
        );
        let spec = RequestSpec {
            http10: true,
            ..RequestSpec::default()
        };
        assert_eq!(
            request_bytes(&u, &spec),
            b"GET /post HTTP/1.0\r\nHost: 127.0.0.1:8881\r\nConnection: keep-alive\r\n\r\n"
        );
    }

    #[test]
    fn header_arguments_are_name_colon_value() {
        assert_eq!(
            parse_header("Accept:  text/plain "),
            Ok(("Accept".into(), "text/plain".into()))
        );
        assert!(parse_header("no colon").is_err());
        assert!(parse_header("bad name: x").is_err());
    }

    #[test]
    fn the_answer_to_a_head_request_has_no_body() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", true)
            .unwrap()
            .unwrap();
        assert_eq!(h.body, BodyDecoder::Length(0));
        assert!(h.keep_alive);
    }

    #[test]
    fn an_incomplete_head_asks_for_more() {
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Le", false),
            Ok(None)
        );
        assert_eq!(parse_head(b"", false), Ok(None));
    }

    #[test]
    fn pinlb_s_own_time_is_read_from_server_timing() {
        assert_eq!(
            pinlb_time(b"pinlb;dur=0.052, upstream;dur=20.113"),
            Some(52_000)
        );
        assert_eq!(
            pinlb_time(b"queue;dur=1500.007, PINLB ; dur=1.5, upstream;dur=2"),
            Some(1_500_000)
        );
        assert_eq!(pinlb_time(b"upstream;dur=20.113"), None);
        assert_eq!(pinlb_time(b"pinlb;desc=x"), None);
        assert_eq!(pinlb_time(b"pinlb;dur=-1"), None);
        assert_eq!(pinlb_time(b"pinlbx;dur=1"), None);
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nServer-Timing: pinlb;dur=0.020, upstream;dur=0.100\r\n\r\n",
        );
        assert_eq!(h.pinlb_ns, Some(20_000));
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").pinlb_ns,
            None
        );
    }

    #[test]
    fn content_length_frames_the_body_and_keep_alive_is_the_default() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n");
        assert_eq!(h.len, 39);
        assert_eq!(h.status, 200);
        assert_eq!(h.body, BodyDecoder::Length(12));
        assert!(h.keep_alive);
    }

    #[test]
    fn connection_close_and_http_1_0_end_keep_alive() {
        assert!(
            !head("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").keep_alive
        );
        assert!(!head("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n").keep_alive);
        assert!(
            head("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n")
                .keep_alive
        );
    }

    #[test]
    fn chunked_wins_over_content_length_and_other_codings_run_to_close() {
        let h = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        );
        assert_eq!(h.body, chunked());
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
        assert_eq!(h.body, BodyDecoder::UntilClose);
        assert!(!h.keep_alive);
    }

    #[test]
    fn no_framing_runs_to_close() {
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.body, BodyDecoder::UntilClose);
        assert!(!h.keep_alive);
    }

    #[test]
    fn statuses_without_a_body_have_none_whatever_the_headers_say() {
        for s in ["204 No Content", "304 Not Modified", "100 Continue"] {
            let h = head(&format!("HTTP/1.1 {s}\r\nContent-Length: 10\r\n\r\n"));
            assert_eq!(h.body, BodyDecoder::Length(0), "{s}");
            assert!(h.keep_alive, "{s}");
        }
        assert!(head("HTTP/1.1 100 Continue\r\n\r\n").is_interim());
        assert!(head("HTTP/1.1 103 Early Hints\r\n\r\n").is_interim());
        assert!(!head("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").is_interim());
    }

    #[test]
    fn bad_heads_and_lengths_are_malformed() {
        assert_eq!(parse_head(b"garbage\r\n\r\n", false), Err(Malformed::Head));
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false),
            Err(Malformed::ContentLength)
        );
        assert_eq!(
            parse_head(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                false
            ),
            Err(Malformed::ContentLength)
        );
        // The same length twice is fine.
        assert_eq!(
            head("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n").body,
            BodyDecoder::Length(2)
        );
    }

    #[test]
    fn a_length_body_ends_after_its_bytes_and_leaves_the_rest() {
        let fed = feed_split_everywhere(BodyDecoder::Length(5), b"helloEXTRA").unwrap();
        assert_eq!(
            fed,
            Fed {
                used: 5,
                done: true
            }
        );
        let mut d = BodyDecoder::Length(5);
        assert_eq!(
            d.feed(b"hel"),
            Ok(Fed {
                used: 3,
                done: false
            })
        );
        assert_eq!(d, BodyDecoder::Length(2));
    }

    #[test]
    fn a_chunked_body_ends_after_its_last_chunk_wherever_reads_split_it() {
        let body = b"5\r\nhello\r\n1A;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\nNEXT";
        let fed = feed_split_everywhere(chunked(), body).unwrap();
        assert_eq!(
            fed,
            Fed {
                used: body.len() - 4,
                done: true
            }
        );
    }

    #[test]
    fn chunked_trailers_are_skipped() {
        let body = b"3\r\nabc\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n";
        let fed = feed_split_everywhere(chunked(), body).unwrap();
        assert_eq!(
            fed,
            Fed {
                used: body.len(),
                done: true
            }
        );
    }

    #[test]
    fn bare_lf_line_ends_are_accepted() {
        let body = b"3\nabc\n0\n\n";
        assert_eq!(
            feed_split_everywhere(chunked(), body),
            Ok(Fed {
                used: body.len(),
                done: true
            })
        );
    }

    #[test]
    fn bad_chunk_framing_is_malformed() {
        assert_eq!(chunked().feed(b"zz\r\n"), Err(Malformed::Chunk));
        assert_eq!(chunked().feed(b"\r\n"), Err(Malformed::Chunk));
        assert_eq!(chunked().feed(b"3\r\nabcX"), Err(Malformed::Chunk));
        assert_eq!(
            chunked().feed(b"11111111111111111\r\n"),
            Err(Malformed::Chunk)
        );
    }

    #[test]
    fn a_close_delimited_body_takes_everything_and_never_ends_by_itself() {
        let mut d = BodyDecoder::UntilClose;
        assert_eq!(
            d.feed(b"abc"),
            Ok(Fed {
                used: 3,
                done: false
            })
        );
        assert_eq!(
            d.feed(b""),
            Ok(Fed {
                used: 0,
                done: false
            })
        );
    }
}
