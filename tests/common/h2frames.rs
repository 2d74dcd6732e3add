//! HTTP/2 frames by hand (RFC 9113 §4, §6), for what no well-behaved client sends: rapid
//! resets, CONTINUATION and SETTINGS floods, HPACK header bombs, a client that never reads.
//!
//! [`H2Conn`] writes frames and reads them back one by one; [`Hpack`] makes small header blocks
//! from the static table and literal fields (RFC 7541), enough for a request.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::WAIT;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

/// Error codes (§7).
pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame as read.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A GOAWAY's last stream id and error code.
    pub fn goaway(&self) -> Option<(u32, u32)> {
        (self.kind == GOAWAY && self.payload.len() >= 8).then(|| {
            (
                be32(&self.payload[..4]) & 0x7fff_ffff,
                be32(&self.payload[4..8]),
            )
        })
    }

    /// A RST_STREAM's error code.
    pub fn rst(&self) -> Option<u32> {
        (self.kind == RST_STREAM && self.payload.len() == 4).then(|| be32(&self.payload))
    }

    /// A SETTINGS frame's `(identifier, value)` pairs.
    pub fn settings(&self) -> Vec<(u16, u32)> {
        self.payload
            .chunks_exact(6)
            .map(|c| (u16::from_be_bytes([c[0], c[1]]), be32(&c[2..])))
            .collect()
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A frame's bytes: the 9-byte header, then `payload`.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

pub fn settings_frame(pairs: &[(u16, u32)]) -> Vec<u8> {
    let payload: Vec<u8> = pairs
        .iter()
        .flat_map(|(id, v)| id.to_be_bytes().into_iter().chain(v.to_be_bytes()))
        .collect();
    frame(SETTINGS, 0, 0, &payload)
}

pub fn rst_frame(stream: u32, code: u32) -> Vec<u8> {
    frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

pub fn window_update_frame(stream: u32, increment: u32) -> Vec<u8> {
    frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

/// HPACK header blocks (RFC 7541) made by hand: static-table references and literal fields,
/// lengths as 7-bit-prefix integers, no Huffman coding.
#[derive(Default, Clone)]
pub struct Hpack(pub Vec<u8>);

impl Hpack {
    /// An indexed field (§6.1): static entries 1..=61, then the dynamic table from 62.
    pub fn indexed(mut self, index: usize) -> Hpack {
        int(&mut self.0, 0x80, 7, index);
        self
    }

    /// A literal field without indexing whose name is static entry `name` (§6.2.2).
    pub fn named(mut self, name: usize, value: &[u8]) -> Hpack {
        int(&mut self.0, 0x00, 4, name);
        string(&mut self.0, value);
        self
    }

    /// A literal field with a new name, not indexed (§6.2.2).
    pub fn literal(mut self, name: &[u8], value: &[u8]) -> Hpack {
        self.0.push(0x00);
        string(&mut self.0, name);
        string(&mut self.0, value);
        self
    }

    /// A literal field with a new name, added to the dynamic table (§6.2.1).
    pub fn literal_indexed(mut self, name: &[u8], value: &[u8]) -> Hpack {
        self.0.push(0x40);
        string(&mut self.0, name);
        string(&mut self.0, value);
        self
    }

    /// `:method`, `:scheme http`, `:path` and `:authority` of a request.
    pub fn request(method: &str, path: &str, authority: &str) -> Hpack {
        let h = match method {
            "GET" => Hpack::default().indexed(2),
            "POST" => Hpack::default().indexed(3),
            other => Hpack::default().named(2, other.as_bytes()),
        };
        let h = h.indexed(6);
        let h = if path == "/" {
            h.indexed(4)
        } else {
            h.named(4, path.as_bytes())
        };
        h.named(1, authority.as_bytes())
    }
}

/// An HPACK integer with an `n`-bit prefix, the prefix's other bits `first` (§5.1).
fn int(out: &mut Vec<u8>, first: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK string literal, not Huffman coded (§5.2).
fn string(out: &mut Vec<u8>, s: &[u8]) {
    int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// A client connection that speaks HTTP/2 frame by frame.
pub struct H2Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// The server's first SETTINGS.
    pub server_settings: Vec<(u16, u32)>,
}

impl H2Conn {
    /// Connects, sends the preface and `settings`, and reads the server's SETTINGS (which it
    /// ACKs). Frames that came with it stay to be read.
    pub async fn open(addr: SocketAddr, settings: &[(u16, u32)]) -> H2Conn {
        let stream = TcpStream::connect(addr).await.expect("connect");
        H2Conn::handshake(stream, settings).await
    }

    /// Like [`H2Conn::open`], on a connection already made.
    pub async fn handshake(stream: TcpStream, settings: &[(u16, u32)]) -> H2Conn {
        stream.set_nodelay(true).unwrap();
        let mut c = H2Conn {
            stream,
            buf: Vec::new(),
            server_settings: Vec::new(),
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(settings_frame(settings));
        c.send(&hello).await;
        let first = c.next().await.expect("the server's SETTINGS");
        assert_eq!((first.kind, first.flags), (SETTINGS, 0), "{first:?}");
        c.server_settings = first.settings();
        c.send(&frame(SETTINGS, ACK, 0, &[])).await;
        c
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(WAIT, self.stream.write_all(bytes))
            .await
            .expect("the server takes what is sent in time")
            .expect("write");
    }

    /// Like [`H2Conn::send`], for writes the server may refuse by closing: `false` if it did.
    pub async fn try_send(&mut self, bytes: &[u8]) -> bool {
        matches!(
            tokio::time::timeout(WAIT, self.stream.write_all(bytes)).await,
            Ok(Ok(()))
        )
    }

    /// HEADERS with END_HEADERS (and END_STREAM with `end`).
    pub async fn headers(&mut self, stream: u32, block: &Hpack, end: bool) {
        let flags = END_HEADERS | if end { END_STREAM } else { 0 };
        self.send(&frame(HEADERS, flags, stream, &block.0)).await;
    }

    /// The next frame; `None` once the server closed the connection (or reset it). Waits at
    /// most [`WAIT`]. A PING is answered as it is read.
    pub async fn next(&mut self) -> Option<Frame> {
        self.next_within(WAIT)
            .await
            .unwrap_or_else(|| panic!("no frame within {WAIT:?}"))
    }

    /// Like [`H2Conn::next`], waiting at most `limit`: `None` if nothing came by then,
    /// `Some(None)` at the end of the connection.
    pub async fn next_within(&mut self, limit: Duration) -> Option<Option<Frame>> {
        let deadline = tokio::time::Instant::now() + limit;
        // Bounded by the deadline: every pass reads more, or ends.
        loop {
            if self.buf.len() >= 9 {
                let len = (self.buf[0] as usize) << 16
                    | (self.buf[1] as usize) << 8
                    | self.buf[2] as usize;
                if self.buf.len() >= 9 + len {
                    let f = Frame {
                        kind: self.buf[3],
                        flags: self.buf[4],
                        stream: be32(&self.buf[5..9]) & 0x7fff_ffff,
                        payload: self.buf[9..9 + len].to_vec(),
                    };
                    self.buf.drain(..9 + len);
                    // As every client does: a PING is answered (a graceful close waits on it).
                    if f.kind == PING && f.flags & ACK == 0 {
                        let pong = frame(PING, ACK, 0, &f.payload);
                        if self.stream.write_all(&pong).await.is_err() {
                            return Some(None);
                        }
                    }
                    return Some(Some(f));
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => return Some(None),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads frames until `want` picks one, answering nothing; at most `max` frames. Panics
    /// if the connection ends first. Returns the frame and every frame read before it.
    pub async fn until(
        &mut self,
        max: usize,
        mut want: impl FnMut(&Frame) -> bool,
    ) -> (Frame, Vec<Frame>) {
        let mut before = Vec::new();
        for _ in 0..max {
            match self.next().await {
                Some(f) if want(&f) => return (f, before),
                Some(f) => before.push(f),
                None => panic!("the connection ended first; read {before:?}"),
            }
        }
        panic!(
            "{max} frames and not the one wanted; the last: {:?}",
            before.last()
        );
    }

    /// Sends `GET path` (Host `a.test`) on `stream` with END_STREAM, and reads until that
    /// stream's response ends: the last frame, and those before it.
    pub async fn get(&mut self, stream: u32, path: &str) -> (Frame, Vec<Frame>) {
        self.headers(stream, &Hpack::request("GET", path, "a.test"), true)
            .await;
        self.until(20, |f| f.stream == stream && f.flags & END_STREAM != 0)
            .await
    }

    /// Reads until the server closes the connection, answering nothing (not even a PING), for
    /// at most `limit`: the whole frames read since [`H2Conn::open`], and whether it closed (an
    /// end of file or a reset) within `limit`.
    pub async fn read_to_close(&mut self, limit: Duration) -> (Vec<Frame>, bool) {
        let deadline = tokio::time::Instant::now() + limit;
        let mut chunk = [0u8; 16 * 1024];
        // Bounded by the deadline: every pass reads more, or ends.
        let closed = loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Err(_) => break false,
                Ok(Ok(0)) | Ok(Err(_)) => break true,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        };
        let mut frames = Vec::new();
        let mut bytes = &self.buf[..];
        // Bounded by the buffer: every pass takes a whole frame off it, or ends.
        while bytes.len() >= 9 {
            let len = (bytes[0] as usize) << 16 | (bytes[1] as usize) << 8 | bytes[2] as usize;
            if bytes.len() < 9 + len {
                break;
            }
            frames.push(Frame {
                kind: bytes[3],
                flags: bytes[4],
                stream: be32(&bytes[5..9]) & 0x7fff_ffff,
                payload: bytes[9..9 + len].to_vec(),
            });
            bytes = &bytes[9 + len..];
        }
        (frames, closed)
    }

    /// Reads until the connection ends (at most `max` frames), and returns the GOAWAY it sent,
    /// if any, with every frame read.
    pub async fn until_closed(&mut self, max: usize) -> (Option<(u32, u32)>, Vec<Frame>) {
        let mut seen = Vec::new();
        for _ in 0..max {
            match self.next().await {
                Some(f) => seen.push(f),
                None => {
                    let goaway = seen.iter().rev().find_map(Frame::goaway);
                    return (goaway, seen);
                }
            }
        }
        panic!("the connection did not end within {max} frames");
    }
}
