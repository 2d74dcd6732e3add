//! Message bodies on the wire: how a body is delimited, and a decoder that takes it off a
//! connection's buffer by that framing. Backend response bodies and client request bodies both
//! go through it; its errors say what was wrong with the bytes, and the side that read them says
//! whose bytes they were.

use bytes::{Buf, Bytes, BytesMut};

/// Most bytes of trailer fields after a chunked body (hyper's limit on chunk extensions).
const MAX_TRAILERS: usize = 16 * 1024;

/// A chunk's CRLF, the last chunk and the empty trailer section: how most chunked bodies end.
const LAST_CHUNK: &[u8] = b"\r\n0\r\n\r\n";

/// What was wrong with a body's framing. Whose fault it was is the reader's to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("bad chunk size")]
    ChunkSize,
    #[error("chunk data not followed by CRLF")]
    ChunkDataEnd,
    #[error("bare LF in chunked body")]
    BareLf,
    #[error("chunk line too long")]
    LineTooLong,
    #[error("trailer section too large")]
    TrailersTooLarge,
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: HEAD, 1xx, 204, 304, or Content-Length: 0.
    Empty,
    Length(u64),
    Chunked,
    /// Until the backend closes the connection.
    Close,
}

/// Chunked decoding state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line.
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// Reading trailer lines after the last chunk; this many bytes of them so far.
    Trailers(usize),
}

/// Reads a message body off a connection's buffer by its framing: as much as the buffer holds,
/// never past the body's end. Backend response bodies and client request bodies both use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder {
    state: BodyState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    Length(u64),
    Chunked(Chunk),
    Close,
    Done,
}

impl Decoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => BodyState::Done,
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::Chunked(Chunk::Size),
            Framing::Close => BodyState::Close,
        };
        Decoder { state }
    }

    pub fn is_done(&self) -> bool {
        self.state == BodyState::Done
    }

    /// The bytes still to come, when the framing says.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            BodyState::Done => Some(0),
            BodyState::Length(n) => Some(n),
            _ => None,
        }
    }

    /// The connection reached its end: true if that completes the body (it was delimited by
    /// the close), false if the body was cut short.
    pub fn at_eof(&mut self) -> bool {
        match self.state {
            BodyState::Close | BodyState::Done => {
                self.state = BodyState::Done;
                true
            }
            _ => false,
        }
    }

    /// Decodes as much as `buf` holds; `None` means more bytes are needed, or the body is done.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, BodyError> {
        loop {
            match self.state {
                BodyState::Done => return Ok(None),
                BodyState::Close => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(buf.split().freeze()));
                }
                BodyState::Length(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (buf.len() as u64).min(left) as usize;
                    let left = left - n as u64;
                    self.state = if left == 0 {
                        BodyState::Done
                    } else {
                        BodyState::Length(left)
                    };
                    return Ok(Some(buf.split_to(n).freeze()));
                }
                BodyState::Chunked(Chunk::Data(left)) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (buf.len() as u64).min(left) as usize;
                    let left = left - n as u64;
                    self.state = BodyState::Chunked(if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    });
                    let data = buf.split_to(n).freeze();
                    // The last chunk without trailers, already read behind this one: the body
                    // is over with this piece (its connection goes back to the pool, and a
                    // chunked answer sends its own last chunk with it, in one write).
                    if left == 0 && buf.starts_with(LAST_CHUNK) {
                        buf.advance(LAST_CHUNK.len());
                        self.state = BodyState::Done;
                    }
                    return Ok(Some(data));
                }
                BodyState::Chunked(Chunk::DataEnd) => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(BodyError::ChunkDataEnd);
                    }
                    buf.advance(2);
                    self.state = BodyState::Chunked(Chunk::Size);
                }
                BodyState::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    let size = parse_chunk_size(&line)?;
                    self.state = BodyState::Chunked(if size == 0 {
                        Chunk::Trailers(0)
                    } else {
                        Chunk::Data(size)
                    });
                }
                BodyState::Chunked(Chunk::Trailers(seen)) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    // Trailer fields are not forwarded; the empty line ends the body.
                    if line.is_empty() {
                        self.state = BodyState::Done;
                    } else if seen + line.len() > MAX_TRAILERS {
                        return Err(BodyError::TrailersTooLarge);
                    } else {
                        self.state = BodyState::Chunked(Chunk::Trailers(seen + line.len() + 2));
                    }
                }
            }
        }
    }
}

/// Takes one CRLF-terminated line (without the CRLF) off the buffer. A bare LF is an error.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, BodyError> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(i) => {
            if i == 0 || buf[i - 1] != b'\r' {
                return Err(BodyError::BareLf);
            }
            let mut line = buf.split_to(i + 1);
            line.truncate(i - 1);
            Ok(Some(line))
        }
        None if buf.len() > 4096 => Err(BodyError::LineTooLong),
        None => Ok(None),
    }
}

/// Parses `1a;ext=1` into 26 (RFC 9112 §7.1): at most 16 hex digits, so the size fits in a
/// u64, then optional whitespace and extensions, which may hold no control character (a bare CR
/// above all). As strict as hyper's decoder, so that pinlb and a proxy in front of it cannot read
/// one body two ways.
fn parse_chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let bad = BodyError::ChunkSize;
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, rest) = line.split_at(end);
    if digits.is_empty() || digits.len() > 16 {
        return Err(bad);
    }
    let rest = rest.trim_ascii_start();
    let rest_ok = rest.is_empty()
        || (rest[0] == b';'
            && rest
                .iter()
                .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80));
    // `trim_ascii_start` also takes CR, LF and form feed: only SP and HTAB may follow the size.
    let ws_ok = line[end..line.len() - rest.len()]
        .iter()
        .all(|&b| b == b' ' || b == b'\t');
    if !rest_ok || !ws_ok {
        return Err(bad);
    }
    let mut size = 0u64;
    for &d in digits {
        // Hex digits only, checked above.
        let v = (d as char).to_digit(16).unwrap_or(0);
        size = (size << 4) | u64::from(v);
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, wire: &[u8]) -> Result<(Vec<u8>, bool), BodyError> {
        let mut buf = BytesMut::from(wire);
        let mut decoder = Decoder::new(framing);
        let mut out = Vec::new();
        while let Some(d) = decoder.decode(&mut buf)? {
            out.extend_from_slice(&d);
        }
        Ok((out, decoder.is_done()))
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let (data, done) = decode_all(
            Framing::Chunked,
            b"5;name=v\r\nhello\r\n1\r\n!\r\n0\r\nX-Trailer: 1\r\n\r\n",
        )
        .unwrap();
        assert_eq!(data, b"hello!");
        assert!(done);
    }

    #[test]
    fn a_last_chunk_read_behind_the_data_ends_the_body_with_it() {
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n0\r\n\r\nGET"[..]);
        let mut decoder = Decoder::new(Framing::Chunked);
        assert_eq!(
            decoder.decode(&mut buf).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert!(decoder.is_done());
        assert_eq!(&buf[..], b"GET", "the next message is left as it came");
        // Not yet all read: the body ends when the rest comes.
        let mut buf = BytesMut::from(&b"5\r\nhello\r\n0\r"[..]);
        let mut decoder = Decoder::new(Framing::Chunked);
        assert_eq!(
            decoder.decode(&mut buf).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert!(!decoder.is_done());
        assert_eq!(decoder.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"\n\r\n");
        assert_eq!(decoder.decode(&mut buf).unwrap(), None);
        assert!(decoder.is_done());
    }

    #[test]
    fn chunk_sizes_may_have_whitespace_before_extensions() {
        let (data, done) = decode_all(Framing::Chunked, b"5 ;a=1\r\nhello\r\n0\t\r\n\r\n").unwrap();
        assert_eq!(data, b"hello");
        assert!(done);
    }

    #[test]
    fn an_endless_trailer_section_is_refused() {
        let mut wire = b"0\r\n".to_vec();
        for _ in 0..2000 {
            wire.extend_from_slice(b"X-T: 123456789\r\n");
        }
        assert!(decode_all(Framing::Chunked, &wire).is_err());
    }

    #[test]
    fn chunked_decoding_waits_for_more_bytes() {
        let (data, done) = decode_all(Framing::Chunked, b"a\r\n01234").unwrap();
        assert_eq!(data, b"01234");
        assert!(!done);
    }

    #[test]
    fn bad_chunks_are_invalid() {
        for wire in [
            &b"zz\r\nxx\r\n0\r\n\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"11111111111111111\r\n",
            b"-5\r\n",
            b"\r\n",
            b"5\r\r\nhello\r\n0\r\n\r\n",
            b"5\x0c\r\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
        ] {
            assert!(
                decode_all(Framing::Chunked, wire).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn length_bodies_stop_at_the_length() {
        let (data, done) = decode_all(Framing::Length(3), b"abc").unwrap();
        assert_eq!(data, b"abc");
        assert!(done);
    }
}
