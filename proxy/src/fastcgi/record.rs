//! FastCGI records (the FastCGI 1.0 specification, §3): the 8-byte header, the request's
//! BEGIN_REQUEST, name-value pairs for PARAMS, STDIN framing, and the records an application
//! sends back, decoded one whole record at a time off a connection's read buffer.
//!
//! Pure: the caller owns the socket, its timers and its buffer, so the exchange runs on
//! pinlb's pooled backend connection like an HTTP/1.1 one.

use bytes::{Buf, Bytes, BytesMut};

/// The protocol version every record carries.
pub const VERSION: u8 = 1;
/// Record types (§8).
pub const BEGIN_REQUEST: u8 = 1;
pub const ABORT_REQUEST: u8 = 2;
pub const END_REQUEST: u8 = 3;
pub const PARAMS: u8 = 4;
pub const STDIN: u8 = 5;
pub const STDOUT: u8 = 6;
pub const STDERR: u8 = 7;
pub const GET_VALUES_RESULT: u8 = 10;
pub const UNKNOWN_TYPE: u8 = 11;
/// The header's length.
pub const HEADER: usize = 8;
/// The most content one record carries.
pub const MAX_CONTENT: usize = 0xffff;
/// The responder role: the application answers the request (the role php-fpm plays).
const RESPONDER: u16 = 1;
/// BEGIN_REQUEST's flag that keeps the connection open after the request.
const KEEP_CONN: u8 = 1;

/// A record's 8-byte header for `len` bytes of content of type `kind`, unpadded.
pub fn header(kind: u8, id: u16, len: usize) -> [u8; HEADER] {
    let [i1, i0] = id.to_be_bytes();
    let [l1, l0] = (len.min(MAX_CONTENT) as u16).to_be_bytes();
    [VERSION, kind, i1, i0, l1, l0, 0, 0]
}

/// Appends the BEGIN_REQUEST record that opens request `id` in the responder role; with
/// `keep_conn` the application leaves the connection open after its END_REQUEST.
pub fn begin_request(out: &mut Vec<u8>, id: u16, keep_conn: bool) {
    out.extend_from_slice(&header(BEGIN_REQUEST, id, 8));
    out.extend_from_slice(&RESPONDER.to_be_bytes());
    out.push(if keep_conn { KEEP_CONN } else { 0 });
    out.extend_from_slice(&[0; 5]);
}

/// Appends one name-value pair's encoding (§3.4): each length in one byte below 128, else in
/// four with the top bit set.
pub fn name_value(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    for len in [name.len(), value.len()] {
        if len < 0x80 {
            out.push(len as u8);
        } else {
            out.extend_from_slice(&((len as u32 & 0x7fff_ffff) | 0x8000_0000).to_be_bytes());
        }
    }
    out.extend_from_slice(name);
    out.extend_from_slice(value);
}

/// Appends `content` as records of type `kind`, split at [`MAX_CONTENT`], then the empty
/// record that ends the stream (PARAMS and STDIN are streams, §3.3).
pub fn stream(out: &mut Vec<u8>, kind: u8, id: u16, content: &[u8]) {
    for piece in content.chunks(MAX_CONTENT) {
        out.extend_from_slice(&header(kind, id, piece.len()));
        out.extend_from_slice(piece);
    }
    out.extend_from_slice(&header(kind, id, 0));
}

/// A record an application sent, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A piece of the response; empty ends the stream.
    Stdout(Bytes),
    /// A piece of the application's error output (PHP's warnings and notices).
    Stderr(Bytes),
    /// The request is over: the application's exit status and the protocol's (0 complete,
    /// 1 cannot multiplex, 2 overloaded, 3 unknown role).
    End {
        app_status: u32,
        protocol_status: u8,
    },
    /// A record of a type a responder's client does not act on (a GET_VALUES_RESULT, an
    /// UNKNOWN_TYPE answer): skipped.
    Other(u8),
}

/// Why the records an application sent cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("FastCGI record of version {0}, expected 1")]
    Version(u8),
    #[error("FastCGI record for request {got}, expected {want}")]
    Id { got: u16, want: u16 },
    #[error("FastCGI END_REQUEST of {0} bytes, expected 8")]
    EndLength(usize),
    #[error("FastCGI record of type {0}, which an application never sends")]
    Kind(u8),
}

/// Takes one whole record for request `id` off the front of `buf`; `Ok(None)` until the buffer
/// holds all of it (its content and its padding). Management records (request ID 0) are
/// skipped as [`Record::Other`].
pub fn decode(buf: &mut BytesMut, id: u16) -> Result<Option<Record>, RecordError> {
    let Some(h) = buf.get(..HEADER) else {
        return Ok(None);
    };
    let (version, kind) = (h[0], h[1]);
    if version != VERSION {
        return Err(RecordError::Version(version));
    }
    let got = u16::from_be_bytes([h[2], h[3]]);
    let len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let padding = usize::from(h[6]);
    if buf.len() < HEADER + len + padding {
        return Ok(None);
    }
    if got != id && got != 0 {
        return Err(RecordError::Id { got, want: id });
    }
    buf.advance(HEADER);
    let content = buf.split_to(len).freeze();
    buf.advance(padding);
    Ok(Some(match kind {
        _ if got == 0 => Record::Other(kind),
        STDOUT => Record::Stdout(content),
        STDERR => Record::Stderr(content),
        END_REQUEST => {
            let [a, b, c, d, p, ..] = content[..] else {
                return Err(RecordError::EndLength(content.len()));
            };
            Record::End {
                app_status: u32::from_be_bytes([a, b, c, d]),
                protocol_status: p,
            }
        }
        GET_VALUES_RESULT | UNKNOWN_TYPE => Record::Other(kind),
        other => return Err(RecordError::Kind(other)),
    }))
}

/// What an END_REQUEST's protocol status means, for the log line of a request that ended
/// without a response.
pub fn protocol_status(status: u8) -> &'static str {
    match status {
        0 => "request complete",
        1 => "cannot multiplex connections",
        2 => "overloaded",
        3 => "unknown role",
        _ => "unknown protocol status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, id: u16, content: &[u8], padding: u8) -> Vec<u8> {
        let mut r = header(kind, id, content.len()).to_vec();
        r[6] = padding;
        r.extend_from_slice(content);
        r.extend(std::iter::repeat_n(0, padding.into()));
        r
    }

    #[test]
    fn begin_request_asks_for_the_responder_role_and_keep_conn() {
        let mut out = Vec::new();
        begin_request(&mut out, 1, true);
        assert_eq!(out, [1, 1, 0, 1, 0, 8, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]);
        out.clear();
        begin_request(&mut out, 258, false);
        assert_eq!(&out[2..4], &[1, 2]);
        assert_eq!(out[10], 0);
    }

    #[test]
    fn name_value_lengths_take_one_byte_below_128_and_four_from_it() {
        let mut out = Vec::new();
        name_value(&mut out, b"A", b"bc");
        assert_eq!(out, b"\x01\x02Abc");
        out.clear();
        let long = vec![b'x'; 300];
        name_value(&mut out, b"N", &long);
        assert_eq!(&out[..5], &[1, 0x80, 0, 1, 44]);
        assert_eq!(out.len(), 5 + 1 + 300);
        out.clear();
        name_value(&mut out, &[b'n'; 127], b"");
        assert_eq!(&out[..2], &[127, 0]);
    }

    #[test]
    fn a_stream_is_split_at_the_record_size_and_ended_by_an_empty_record() {
        let mut out = Vec::new();
        let content = vec![7u8; MAX_CONTENT + 10];
        stream(&mut out, STDIN, 1, &content);
        assert_eq!(out.len(), 3 * HEADER + content.len());
        assert_eq!(&out[4..6], &[0xff, 0xff]);
        let second = HEADER + MAX_CONTENT;
        assert_eq!(&out[second + 4..second + 6], &[0, 10]);
        assert_eq!(&out[out.len() - HEADER..], &header(STDIN, 1, 0));
        out.clear();
        stream(&mut out, PARAMS, 1, b"");
        assert_eq!(out, header(PARAMS, 1, 0));
    }

    #[test]
    fn records_are_taken_whole_with_their_padding() {
        let mut bytes = record(STDOUT, 1, b"Status: 200\r\n\r\nhi", 6);
        bytes.extend(record(STDERR, 1, b"PHP Warning", 0));
        bytes.extend(record(END_REQUEST, 1, &[0, 0, 0, 255, 0, 0, 0, 0], 0));
        for cut in 0..bytes.len() {
            let mut buf = BytesMut::from(&bytes[..cut]);
            // A record arrives whole or not at all, wherever the reads split it.
            while let Some(r) = decode(&mut buf, 1).unwrap() {
                assert!(!matches!(r, Record::End { .. }), "{cut}");
            }
        }
        let mut buf = BytesMut::from(&bytes[..]);
        let want = [
            Record::Stdout(Bytes::from_static(b"Status: 200\r\n\r\nhi")),
            Record::Stderr(Bytes::from_static(b"PHP Warning")),
            Record::End {
                app_status: 255,
                protocol_status: 0,
            },
        ];
        for w in want {
            assert_eq!(decode(&mut buf, 1).unwrap(), Some(w));
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn a_bad_record_is_refused() {
        let mut buf = BytesMut::from(&record(STDOUT, 1, b"x", 0)[..]);
        buf[0] = 2;
        assert_eq!(decode(&mut buf, 1), Err(RecordError::Version(2)));
        let mut buf = BytesMut::from(&record(STDOUT, 2, b"x", 0)[..]);
        assert_eq!(
            decode(&mut buf, 1),
            Err(RecordError::Id { got: 2, want: 1 })
        );
        let mut buf = BytesMut::from(&record(END_REQUEST, 1, b"abc", 0)[..]);
        assert_eq!(decode(&mut buf, 1), Err(RecordError::EndLength(3)));
        let mut buf = BytesMut::from(&record(STDIN, 1, b"", 0)[..]);
        assert_eq!(decode(&mut buf, 1), Err(RecordError::Kind(STDIN)));
        let mut buf = BytesMut::from(&record(GET_VALUES_RESULT, 0, b"", 0)[..]);
        assert_eq!(
            decode(&mut buf, 1),
            Ok(Some(Record::Other(GET_VALUES_RESULT)))
        );
    }
}
