//! The CGI response an application writes on FCGI_STDOUT (RFC 3875 §6), read into an HTTP
//! response head: its status from `Status:` (200 without one, 302 for a `Location:` without
//! one, as nginx's fastcgi module does), its header lines as the client side sends them on, and
//! its Content-Length, which frames the body when the application gave one.
//!
//! RFC 3875's local redirect (§6.2.2: a `Location:` path with no `Status:`, which a CGI server
//! would serve internally) is not followed, as nginx does not: the client gets the 302 and
//! follows it itself. php-fpm sends `Status: 302` with PHP's `header("Location: …")` anyway.

use http::StatusCode;

use crate::http1::hop::Hop;

/// Largest CGI head accepted, as for an HTTP/1.1 backend's.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header lines in a CGI head.
const MAX_HEADERS: usize = 128;

/// A CGI response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgiHead {
    pub status: StatusCode,
    /// The end-to-end lines, `name: value\r\n` each, without `Status`, the hop-by-hop headers
    /// and Content-Length (the client side writes the framing).
    pub headers: Vec<u8>,
    /// The application's Content-Length, when it gave one.
    pub content_length: Option<u64>,
    pub has_date: bool,
}

/// Why a CGI head cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgiError {
    #[error("CGI response head larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("invalid CGI response head")]
    Invalid,
    #[error("invalid CGI Status header, expected a three-digit code")]
    Status,
    #[error("invalid or repeated CGI Content-Length")]
    ContentLength,
}

/// Parses the CGI head at the start of `out` (what the application wrote so far); `Ok(None)`
/// until its blank line has come. Returns the head and its length in bytes: the body follows.
pub fn parse(out: &[u8]) -> Result<Option<(CgiHead, usize)>, CgiError> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (len, lines) = match httparse::parse_headers(out, &mut storage) {
        Ok(httparse::Status::Complete((len, lines))) => (len, lines),
        Ok(httparse::Status::Partial) if out.len() > MAX_HEAD => return Err(CgiError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(CgiError::TooLarge),
        Err(_) => return Err(CgiError::Invalid),
    };
    if len > MAX_HEAD {
        return Err(CgiError::TooLarge);
    }
    let mut head = CgiHead {
        status: StatusCode::OK,
        headers: Vec::with_capacity(len),
        content_length: None,
        has_date: false,
    };
    let mut status = None;
    let mut location = false;
    for line in lines.iter() {
        let (name, value) = (line.name.as_bytes(), line.value.trim_ascii());
        if name.eq_ignore_ascii_case(b"status") {
            status = Some(status_code(value)?);
            continue;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            match (n, head.content_length) {
                (Some(n), None) => head.content_length = Some(n),
                (Some(n), Some(was)) if n == was => {}
                _ => return Err(CgiError::ContentLength),
            }
            continue;
        }
        if Hop::of(name).is_some() {
            continue;
        }
        location |= name.eq_ignore_ascii_case(b"location");
        head.has_date |= name.eq_ignore_ascii_case(b"date");
        head.headers.extend_from_slice(name);
        head.headers.extend_from_slice(b": ");
        head.headers.extend_from_slice(value);
        head.headers.extend_from_slice(b"\r\n");
    }
    head.status = match status {
        Some(s) => s,
        None if location => StatusCode::FOUND,
        None => StatusCode::OK,
    };
    Ok(Some((head, len)))
}

/// `Status: 404 Not Found`'s code; the reason phrase is the client side's to write.
fn status_code(value: &[u8]) -> Result<StatusCode, CgiError> {
    let code = value.get(..3).ok_or(CgiError::Status)?;
    if value.get(3).is_some_and(|&b| b != b' ') {
        return Err(CgiError::Status);
    }
    let status = StatusCode::from_bytes(code).map_err(|_| CgiError::Status)?;
    // An interim response is no answer to a CGI request.
    if status.is_informational() {
        return Err(CgiError::Status);
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<(CgiHead, usize)>, CgiError> {
        parse(text.as_bytes())
    }

    #[test]
    fn a_head_without_status_is_200_and_its_lines_pass_on() {
        let (h, len) = head("Content-type: text/html\r\nX-Powered-By: PHP\r\n\r\nbody")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(
            h.headers,
            b"Content-type: text/html\r\nX-Powered-By: PHP\r\n"
        );
        assert_eq!(len, 46);
        assert_eq!(h.content_length, None);
    }

    #[test]
    fn status_sets_the_code_and_is_not_passed_on() {
        let (h, _) = head("Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::NOT_FOUND);
        assert_eq!(h.headers, b"Content-Type: text/plain\r\n");
        let (h, _) = head("Status: 503\n\n").unwrap().unwrap();
        assert_eq!(h.status, StatusCode::SERVICE_UNAVAILABLE);
        for bad in [
            "Status: 20\r\n\r\n",
            "Status: abc\r\n\r\n",
            "Status: 2000\r\n\r\n",
        ] {
            assert_eq!(head(bad), Err(CgiError::Status), "{bad}");
        }
        assert_eq!(head("Status: 100 Continue\r\n\r\n"), Err(CgiError::Status));
    }

    #[test]
    fn a_location_without_status_is_a_302_as_nginx_answers() {
        let (h, _) = head("Location: /login\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.status, StatusCode::FOUND);
        assert_eq!(h.headers, b"Location: /login\r\n");
        let (h, _) = head("Status: 301 Moved\r\nLocation: https://x/\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.status, StatusCode::MOVED_PERMANENTLY);
    }

    #[test]
    fn content_length_frames_the_body_and_hop_by_hop_lines_are_dropped() {
        let (h, _) = head(
            "Content-Length: 5\r\nConnection: close\r\nTransfer-Encoding: chunked\r\nDate: x\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.content_length, Some(5));
        assert_eq!(h.headers, b"Date: x\r\n");
        assert!(h.has_date);
        assert_eq!(
            head("Content-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Err(CgiError::ContentLength)
        );
        assert_eq!(
            head("Content-Length: -1\r\n\r\n"),
            Err(CgiError::ContentLength)
        );
    }

    #[test]
    fn a_head_is_read_once_whole_and_bounded() {
        assert_eq!(head("Content-Type: text/html\r\n"), Ok(None));
        assert_eq!(head(""), Ok(None));
        assert_eq!(head("no colon here\r\n\r\n"), Err(CgiError::Invalid));
        let long = format!("X: {}\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(head(&long), Err(CgiError::TooLarge));
        let many: String = (0..200).map(|i| format!("X-{i}: 1\r\n")).collect();
        assert_eq!(head(&format!("{many}\r\n")), Err(CgiError::TooLarge));
    }
}
