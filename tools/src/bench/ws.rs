//! The WebSocket side of the wire, for `pinlb bench --ws`: the upgrade request and the check of
//! its `101`, the one client frame every message is, and a decoder that finds where the echo of
//! a message ends in the server's frames without keeping it.
//!
//! All of it is pure and works on byte slices, like `wire.rs`, so the closed loop does only I/O.
//! The frames are written by hand rather than with tungstenite (which `pinlb backend` uses):
//! every message is the same bytes, built and masked once, and an echo costs a scan of a frame
//! header or two, so the load generator spends its time on the server and not on itself.

use http::Uri;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::wire::{Fed, read_response_head};

/// The `Sec-WebSocket-Key` of every connection. RFC 6455 asks for a fresh nonce so that a
/// caching intermediary cannot answer a handshake it saw before; a load generator that talks to
/// the proxies it measures has no such intermediary, and a fixed key keeps the check of the
/// answer a comparison.
const KEY: &str = "cGlubGIgYmVuY2ggd3Mga2V5";
/// A frame header's longest form: 2 bytes, 8 of extended length, 4 of mask.
const MAX_FRAME_HEADER: usize = 14;

/// What a WebSocket run sends: the handshake once per connection, then the same masked frame
/// for every message.
#[derive(Debug)]
pub(crate) struct WsPlan {
    /// The upgrade request: `GET` with the URL's path and query, `Host`, `Upgrade`, the key.
    pub handshake: Vec<u8>,
    /// The `Sec-WebSocket-Accept` the `101` must carry.
    pub accept: Vec<u8>,
    /// Payload bytes of each message, and so of each echo.
    pub message_size: u64,
}

impl WsPlan {
    /// The handshake for `url`, and the client frame of a `size`-byte binary message.
    pub(crate) fn new(url: &Uri, size: usize) -> (WsPlan, Vec<u8>) {
        let target = url.path_and_query().map_or("/", |pq| pq.as_str());
        let target = if target.is_empty() { "/" } else { target };
        let host = url.authority().map_or("", |a| {
            let s = a.as_str();
            s.rsplit_once('@').map_or(s, |(_, host)| host)
        });
        let handshake = format!(
            "GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        let plan = WsPlan {
            handshake: handshake.into_bytes(),
            accept: derive_accept_key(KEY.as_bytes()).into_bytes(),
            message_size: size as u64,
        };
        (plan, client_frame(size, fastrand::u32(..).to_be_bytes()))
    }
}

/// A final binary frame of `size` bytes ("hello world\n" repeated), masked with `mask` as a
/// client's frames must be.
pub(crate) fn client_frame(size: usize, mask: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::with_capacity(size + MAX_FRAME_HEADER);
    f.push(0x80 | OP_BINARY);
    match size {
        0..=125 => f.push(0x80 | size as u8),
        126..=0xffff => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(size as u16).to_be_bytes());
        }
        _ => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(size as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    let payload = b"hello world\n".iter().cycle().take(size);
    f.extend(payload.zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    f
}

/// Why a handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not an HTTP response.
    Malformed,
    /// A status other than 101, or a 101 without the right `Sec-WebSocket-Accept`.
    NotUpgraded,
    /// Bytes after the `101`: the server spoke before it was sent anything.
    Unasked,
}

/// Checks the answer to the handshake at the start of `buf`: `Ok(None)` until its head is
/// complete, `Ok(Some(()))` for a `101` with the expected accept key and nothing after it.
pub(crate) fn check_upgrade(buf: &[u8], accept: &[u8]) -> Result<Option<()>, Refused> {
    read_response_head(buf, |resp, len| {
        let accepted = resp.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("sec-websocket-accept") && h.value.trim_ascii() == accept
        });
        if resp.code != Some(101) || !accepted {
            return Err(Refused::NotUpgraded);
        }
        if len < buf.len() {
            return Err(Refused::Unasked);
        }
        Ok(())
    })
    .map_err(|_| Refused::Malformed)?
    .transpose()
}

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;

/// Why an echo could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadEcho {
    /// The server sent a close frame.
    Closed,
    /// An unknown opcode, a continuation with no message begun, or a new message inside one.
    Protocol,
    /// The echo's length is not the message's.
    Length,
}

/// Finds the end of one echoed message in the server's frames: data frames until a final one
/// (a fragmented echo is followed through its continuations), pings and pongs skipped on the
/// way. Keeps only the frame header being read, never the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Echo {
    /// The header of the frame being read, `have` bytes of it so far.
    header: [u8; MAX_FRAME_HEADER],
    have: u8,
    /// Payload bytes left in the current frame; `None` while its header is read.
    left: Option<u64>,
    /// Whether the current frame's payload counts and, once it ends, ends the message.
    data: bool,
    fin: bool,
    /// Whether a data frame has begun the message.
    begun: bool,
    /// Payload bytes of the message still to come.
    expect: u64,
}

impl Echo {
    pub(crate) fn new(message_size: u64) -> Echo {
        Echo {
            header: [0; MAX_FRAME_HEADER],
            have: 0,
            left: None,
            data: false,
            fin: false,
            begun: false,
            expect: message_size,
        }
    }

    /// Consumes frame bytes from the start of `buf`; bytes past the end of the echo are left
    /// unused.
    pub(crate) fn feed(&mut self, buf: &[u8]) -> Result<Fed, BadEcho> {
        let mut i = 0;
        loop {
            match self.left {
                Some(left) => {
                    let take =
                        usize::try_from(left).map_or(buf.len() - i, |l| l.min(buf.len() - i));
                    i += take;
                    let left = left - take as u64;
                    self.left = Some(left);
                    if left > 0 {
                        return Ok(Fed {
                            used: i,
                            done: false,
                        });
                    }
                    self.left = None;
                    self.have = 0;
                    if self.data && self.fin {
                        return if self.expect == 0 {
                            Ok(Fed {
                                used: i,
                                done: true,
                            })
                        } else {
                            Err(BadEcho::Length)
                        };
                    }
                }
                None => {
                    if i == buf.len() {
                        return Ok(Fed {
                            used: i,
                            done: false,
                        });
                    }
                    // The first two bytes tell how long the header is; read up to its end.
                    let have = usize::from(self.have);
                    let need = if have < 2 {
                        2
                    } else {
                        header_len(self.header[1])
                    };
                    let take = (need - have).min(buf.len() - i);
                    self.header[have..have + take].copy_from_slice(&buf[i..i + take]);
                    let have = have + take;
                    self.have = have as u8;
                    i += take;
                    if have >= 2 && have == header_len(self.header[1]) {
                        self.start_frame()?;
                    }
                }
            }
        }
    }

    /// The header is complete: decides what the frame's payload is.
    fn start_frame(&mut self) -> Result<(), BadEcho> {
        let h = &self.header;
        let (fin, opcode) = (h[0] & 0x80 != 0, h[0] & 0x0f);
        let len = match h[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([h[2], h[3]])),
            127 => u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
            n => u64::from(n),
        };
        self.data = match opcode {
            OP_TEXT | OP_BINARY if !self.begun => true,
            OP_CONTINUATION if self.begun => true,
            OP_CLOSE => return Err(BadEcho::Closed),
            // Ping and pong: nothing of the message.
            0x9 | 0xa => false,
            _ => return Err(BadEcho::Protocol),
        };
        if self.data {
            self.begun = true;
            self.expect = self.expect.checked_sub(len).ok_or(BadEcho::Length)?;
        }
        self.fin = fin;
        self.left = Some(len);
        Ok(())
    }
}

/// The length of a frame header whose second byte is `b1`: 2, plus 2 or 8 bytes of extended
/// length, plus 4 of mask.
fn header_len(b1: u8) -> usize {
    let ext = match b1 & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    2 + ext + mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_frame_is_masked_and_sized_in_its_shortest_form() {
        let f = client_frame(5, [1, 2, 3, 4]);
        assert_eq!(&f[..6], &[0x82, 0x85, 1, 2, 3, 4]);
        let unmasked: Vec<u8> = f[6..]
            .iter()
            .zip([1u8, 2, 3, 4].iter().cycle())
            .map(|(b, m)| b ^ m)
            .collect();
        assert_eq!(unmasked, b"hello");
        assert_eq!(&client_frame(300, [0; 4])[..4], &[0x82, 0xfe, 0x01, 0x2c]);
        assert_eq!(client_frame(300, [0; 4]).len(), 2 + 2 + 4 + 300);
        assert_eq!(client_frame(70_000, [0; 4]).len(), 2 + 8 + 4 + 70_000);
    }

    #[test]
    fn the_handshake_asks_for_the_urls_path_and_expects_its_accept_key() {
        let url: Uri = "http://127.0.0.1:8080/chat?x=1".parse().unwrap();
        let (plan, _) = WsPlan::new(&url, 64);
        let text = String::from_utf8(plan.handshake).unwrap();
        assert!(text.starts_with("GET /chat?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"));
        assert!(text.contains("Upgrade: websocket\r\nConnection: Upgrade\r\n"));
        assert_eq!(plan.message_size, 64);
        // RFC 6455's own example key and answer.
        assert_eq!(
            derive_accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn only_a_101_with_the_right_accept_and_nothing_after_it_is_an_upgrade() {
        let accept = b"abc=";
        let ok = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: abc=\r\n\r\n";
        assert_eq!(check_upgrade(ok, accept), Ok(Some(())));
        assert_eq!(check_upgrade(&ok[..20], accept), Ok(None));
        assert_eq!(
            check_upgrade(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", accept),
            Err(Refused::NotUpgraded)
        );
        assert_eq!(
            check_upgrade(ok, b"xyz="),
            Err(Refused::NotUpgraded),
            "another key's answer"
        );
        let mut more = ok.to_vec();
        more.extend_from_slice(b"\x81\x00");
        assert_eq!(check_upgrade(&more, accept), Err(Refused::Unasked));
        assert_eq!(
            check_upgrade(b"nonsense\r\n\r\n", accept),
            Err(Refused::Malformed)
        );
    }

    #[test]
    fn an_echo_in_one_frame_ends_with_its_payload_whatever_the_pieces() {
        let frame = [&[0x82u8, 5][..], b"hello", b"next"].concat();
        for split in 0..7 {
            let mut e = Echo::new(5);
            let a = e.feed(&frame[..split]).unwrap();
            assert_eq!((a.used, a.done), (split, false), "split {split}");
            let b = e.feed(&frame[split..]).unwrap();
            assert_eq!((split + b.used, b.done), (7, true), "split {split}");
        }
    }

    #[test]
    fn extended_lengths_fragments_and_pings_are_followed() {
        // 300 bytes: a 16-bit length, fed a byte at a time.
        let mut frame = vec![0x82u8, 126, 0x01, 0x2c];
        frame.extend(std::iter::repeat_n(b'x', 300));
        let mut e = Echo::new(300);
        let mut done_at = None;
        for (i, b) in frame.iter().enumerate() {
            let fed = e.feed(std::slice::from_ref(b)).unwrap();
            assert_eq!(fed.used, 1);
            if fed.done {
                done_at = Some(i);
            }
        }
        assert_eq!(done_at, Some(frame.len() - 1));
        // A 64-bit length.
        let mut e = Echo::new(70_000);
        let mut frame = vec![0x82u8, 127];
        frame.extend_from_slice(&70_000u64.to_be_bytes());
        frame.extend(std::iter::repeat_n(0, 70_000));
        assert_eq!(
            e.feed(&frame).unwrap(),
            Fed {
                used: frame.len(),
                done: true
            }
        );
        // Text "hel" not final, a ping in between, then "lo" final.
        let mut e = Echo::new(5);
        let frames = [
            &[0x01u8, 3][..],
            b"hel",
            &[0x89, 2],
            b"hi",
            &[0x80, 2],
            b"lo",
        ]
        .concat();
        assert_eq!(
            e.feed(&frames).unwrap(),
            Fed {
                used: frames.len(),
                done: true
            }
        );
    }

    #[test]
    fn a_close_a_wrong_length_or_a_stray_continuation_is_a_bad_echo() {
        assert_eq!(Echo::new(5).feed(&[0x88, 0]), Err(BadEcho::Closed));
        assert_eq!(
            Echo::new(5).feed(&[0x82, 4, 1, 2, 3, 4]),
            Err(BadEcho::Length)
        );
        assert_eq!(Echo::new(5).feed(&[0x82, 6]), Err(BadEcho::Length));
        assert_eq!(Echo::new(5).feed(&[0x80, 5]), Err(BadEcho::Protocol));
        assert_eq!(Echo::new(5).feed(&[0x83, 5]), Err(BadEcho::Protocol));
        assert_eq!(
            Echo::new(5).feed(&[0x01, 2, 1, 2, 0x82, 3]),
            Err(BadEcho::Protocol)
        );
    }

    #[test]
    fn an_empty_message_is_echoed_by_an_empty_frame() {
        let mut e = Echo::new(0);
        assert_eq!(
            e.feed(&[0x82, 0, 9]).unwrap(),
            Fed {
                used: 2,
                done: true
            }
        );
    }
}
