//! The PROXY protocol's header (HAProxy's spec, v1 text and v2 binary): what a load balancer in
//! front writes first on a connection to name the client it relays, and what pinlb writes
//! first to a backend that asks for it.
//!
//! Pure: bytes in, a header or an error out, no socket. [`header_len`] frames (how many bytes
//! the header takes, known from its first bytes, so the reader takes exactly those and not one
//! byte of the request behind it); [`parse`] reads one whole header with the `ppp` crate;
//! [`v1`], [`v2`] and [`local`] build the headers pinlb sends. TLVs (v2's extensions) are
//! read past and ignored: nothing in pinlb acts on them.

use std::net::SocketAddr;

/// A v1 header's most bytes, CRLF included (the spec's bound, the TCP6 form with the longest
/// addresses and ports).
pub const V1_MAX: usize = 107;

/// A v2 header's most bytes, its 16 fixed ones included: room for the addresses and the TLVs
/// that cloud load balancers add (AWS's VPC endpoint ID, Azure's link ID, a TLS summary). The
/// length field could say 65,535; a header that long is refused rather than buffered.
pub const V2_MAX: usize = 16 + 2032;

/// v2's signature, its first 12 bytes.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// v1's first bytes.
const V1_PREFIX: &[u8; 6] = b"PROXY ";

/// Why bytes are not a PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Neither v1's `PROXY ` nor v2's signature.
    #[error("not a PROXY protocol header (neither \"PROXY \" nor the v2 signature)")]
    NotAHeader,
    /// Past the version's bound without its end.
    #[error("PROXY protocol v{version} header over {max} bytes")]
    TooLong { version: u8, max: usize },
    /// Framed, but what it says cannot be read.
    #[error("malformed PROXY protocol v{version} header: {why}")]
    Malformed { version: u8, why: String },
}

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A relayed client: its address, and the address it connected to.
    Proxied {
        source: SocketAddr,
        destination: SocketAddr,
    },
    /// v2 `LOCAL`, v1 `UNKNOWN` (or a v2 family pinlb has no address for, AF_UNIX or
    /// unspecified): the sender's own connection, a health check; the connection keeps its own
    /// peer address.
    Local,
}

/// How many bytes the header that `bytes` begins with takes: `Ok(None)` while too few have
/// come to tell, `Ok(Some(n))` once they do (`n` may be more than `bytes.len()`: the rest is
/// still to be read), an error as soon as they cannot begin a header or pass its bound.
///
/// v1 ends at its LF (which must follow a CR); v2 says its length in bytes 14 and 15.
pub fn header_len(bytes: &[u8]) -> Result<Option<usize>, Invalid> {
    let Some(&first) = bytes.first() else {
        return Ok(None);
    };
    if first == b'P' {
        let seen = bytes.len().min(V1_PREFIX.len());
        if bytes[..seen] != V1_PREFIX[..seen] {
            return Err(Invalid::NotAHeader);
        }
        let within = &bytes[..bytes.len().min(V1_MAX)];
        return match within.iter().position(|&b| b == b'\n') {
            Some(i) if i > 0 && within[i - 1] == b'\r' => Ok(Some(i + 1)),
            Some(_) => Err(Invalid::Malformed {
                version: 1,
                why: "a bare LF, expected CRLF".into(),
            }),
            None if bytes.len() >= V1_MAX => Err(Invalid::TooLong {
                version: 1,
                max: V1_MAX,
            }),
            None => Ok(None),
        };
    }
    let seen = bytes.len().min(V2_SIGNATURE.len());
    if bytes[..seen] != V2_SIGNATURE[..seen] {
        return Err(Invalid::NotAHeader);
    }
    if bytes.len() < 16 {
        return Ok(None);
    }
    if bytes[12] >> 4 != 2 {
        return Err(Invalid::Malformed {
            version: 2,
            why: format!("version {}, expected 2", bytes[12] >> 4),
        });
    }
    let len = 16 + usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    if len > V2_MAX {
        return Err(Invalid::TooLong {
            version: 2,
            max: V2_MAX,
        });
    }
    Ok(Some(len))
}

/// Reads one whole header: `bytes` is exactly what [`header_len`] framed.
pub fn parse(bytes: &[u8]) -> Result<Header, Invalid> {
    if bytes.first() == Some(&b'P') {
        let header = ppp::v1::Header::try_from(bytes).map_err(|e| Invalid::Malformed {
            version: 1,
            why: e.to_string(),
        })?;
        return Ok(match header.addresses {
            ppp::v1::Addresses::Tcp4(a) => Header::Proxied {
                source: (a.source_address, a.source_port).into(),
                destination: (a.destination_address, a.destination_port).into(),
            },
            ppp::v1::Addresses::Tcp6(a) => Header::Proxied {
                source: (a.source_address, a.source_port).into(),
                destination: (a.destination_address, a.destination_port).into(),
            },
            ppp::v1::Addresses::Unknown => Header::Local,
        });
    }
    let header = ppp::v2::Header::try_from(bytes).map_err(|e| Invalid::Malformed {
        version: 2,
        why: e.to_string(),
    })?;
    if header.command == ppp::v2::Command::Local {
        return Ok(Header::Local);
    }
    Ok(match header.addresses {
        ppp::v2::Addresses::IPv4(a) => Header::Proxied {
            source: (a.source_address, a.source_port).into(),
            destination: (a.destination_address, a.destination_port).into(),
        },
        ppp::v2::Addresses::IPv6(a) => Header::Proxied {
            source: (a.source_address, a.source_port).into(),
            destination: (a.destination_address, a.destination_port).into(),
        },
        ppp::v2::Addresses::Unix(_) | ppp::v2::Addresses::Unspecified => Header::Local,
    })
}

/// The pair in one family, as both versions need: an IPv4 address beside an IPv6 one is
/// written IPv4-mapped (`::ffff:a.b.c.d`).
fn one_family(source: SocketAddr, destination: SocketAddr) -> (SocketAddr, SocketAddr) {
    let v6 = |a: SocketAddr| match a {
        SocketAddr::V4(v4) => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
        v6 => v6,
    };
    if source.is_ipv4() == destination.is_ipv4() {
        (source, destination)
    } else {
        (v6(source), v6(destination))
    }
}

/// A v1 header naming `source` (the client) and `destination` (the address it connected to).
pub fn v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let addresses = ppp::v1::Addresses::from(one_family(source, destination));
    addresses.to_string().into_bytes()
}

/// A v2 `PROXY` header over TCP naming `source` and `destination`, no TLVs.
pub fn v2(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    use ppp::v2::{Builder, Command, Protocol, Version};
    let built = Builder::with_addresses(
        Version::Two | Command::Proxy,
        Protocol::Stream,
        one_family(source, destination),
    )
    .build();
    // Building into a Vec cannot fail; were it to, a LOCAL header keeps the connection usable.
    built.unwrap_or_else(|_| local(2))
}

/// The header of a connection of pinlb's own (a health check): v1 `UNKNOWN`, v2 `LOCAL`.
pub fn local(version: u8) -> Vec<u8> {
    if version == 1 {
        return b"PROXY UNKNOWN\r\n".to_vec();
    }
    let mut header = V2_SIGNATURE.to_vec();
    // Version 2, LOCAL; family and protocol unspecified; no address bytes.
    header.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Frames then parses, as the reader does.
    fn read(bytes: &[u8]) -> Result<(Header, usize), Invalid> {
        let n = header_len(bytes)?.expect("framed");
        Ok((parse(&bytes[..n])?, n))
    }

    #[test]
    fn v1_tcp4_and_tcp6_name_the_source_and_leave_the_request_behind_them() {
        let bytes = b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 80\r\nGET / HTTP/1.1\r\n";
        let (h, n) = read(bytes).unwrap();
        assert_eq!(&bytes[n..], b"GET / HTTP/1.1\r\n");
        assert_eq!(
            h,
            Header::Proxied {
                source: addr("203.0.113.7:40000"),
                destination: addr("192.0.2.1:80")
            }
        );
        let (h, _) = read(b"PROXY TCP6 2001:db8::7 2001:db8::1 1 443\r\n").unwrap();
        assert_eq!(
            h,
            Header::Proxied {
                source: addr("[2001:db8::7]:1"),
                destination: addr("[2001:db8::1]:443")
            }
        );
    }

    #[test]
    fn v1_unknown_and_v2_local_keep_the_connections_own_address() {
        assert_eq!(read(b"PROXY UNKNOWN\r\n").unwrap(), (Header::Local, 15));
        assert_eq!(read(&local(2)).unwrap(), (Header::Local, 16));
        assert_eq!(read(&local(1)).unwrap().0, Header::Local);
    }

    #[test]
    fn built_headers_read_back_in_both_versions_and_both_families() {
        let pairs = [
            (addr("203.0.113.7:5000"), addr("10.0.0.1:80")),
            (addr("[2001:db8::7]:5000"), addr("[2001:db8::1]:443")),
        ];
        for (source, destination) in pairs {
            for bytes in [v1(source, destination), v2(source, destination)] {
                let (h, n) = read(&bytes).unwrap();
                assert_eq!(n, bytes.len());
                assert_eq!(
                    h,
                    Header::Proxied {
                        source,
                        destination
                    }
                );
            }
        }
    }

    #[test]
    fn mixed_families_are_written_ipv4_mapped() {
        let bytes = v1(addr("[2001:db8::7]:1"), addr("10.0.0.1:80"));
        assert_eq!(
            bytes,
            b"PROXY TCP6 2001:db8::7 ::ffff:10.0.0.1 1 80\r\n".to_vec()
        );
    }

    #[test]
    fn too_few_bytes_wait_for_more_and_never_read_past_the_header() {
        let full = v2(addr("203.0.113.7:5000"), addr("10.0.0.1:80"));
        for cut in 0..16 {
            assert_eq!(header_len(&full[..cut]), Ok(None), "{cut}");
        }
        assert_eq!(header_len(&full[..16]), Ok(Some(full.len())));
        let text = b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 80\r\n";
        for cut in 0..text.len() {
            assert_eq!(header_len(&text[..cut]), Ok(None), "{cut}");
        }
    }

    #[test]
    fn a_prefix_frames_as_more_or_as_the_whole_does() {
        // What the reader relies on: it peeks a prefix, and must stop neither sooner nor later
        // than the whole would say.
        let mut v2_tlv = v2(addr("203.0.113.7:1"), addr("10.0.0.1:80"));
        v2_tlv[15] += 4;
        v2_tlv.extend_from_slice(&[0x04, 0x00, 0x01, 0x2a]);
        let inputs: Vec<Vec<u8>> = vec![
            b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 80\r\nGET / HTTP/1.1\r\n".to_vec(),
            b"PROXY UNKNOWN\r\n".to_vec(),
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n".to_vec(),
            [b"PROXY ".as_slice(), &[b'x'; 200]].concat(),
            v2_tlv.clone(),
            [v2_tlv.as_slice(), b"GET / HTTP/1.1\r\n"].concat(),
            local(2),
            b"GET / HTTP/1.1\r\n".to_vec(),
            b"\r\n\r\n\0\r\nQUIT\n\x11\x11\x00\x00".to_vec(),
        ];
        for input in &inputs {
            let whole = header_len(input);
            for cut in 0..input.len() {
                match (header_len(&input[..cut]), &whole) {
                    (Ok(None), _) | (Err(_), Err(_)) => {}
                    (Ok(Some(n)), Ok(Some(m))) => assert_eq!(n, *m),
                    (a, b) => panic!("{input:?} cut at {cut}: {a:?}, the whole {b:?}"),
                }
            }
        }
        // The TLV is read past: the addresses are what count.
        let (h, n) = read(&v2_tlv).unwrap();
        assert_eq!(n, v2_tlv.len());
        assert_eq!(
            h,
            Header::Proxied {
                source: addr("203.0.113.7:1"),
                destination: addr("10.0.0.1:80")
            }
        );
    }

    #[test]
    fn bad_headers_are_refused_with_their_cause() {
        assert_eq!(header_len(b"GET / HTTP/1.1\r\n"), Err(Invalid::NotAHeader));
        assert_eq!(header_len(b"PROXZ"), Err(Invalid::NotAHeader));
        assert_eq!(header_len(b"\r\n\r\n\0\r\nQUIX"), Err(Invalid::NotAHeader));
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
        assert_eq!(
            header_len(&long),
            Err(Invalid::TooLong {
                version: 1,
                max: V1_MAX
            })
        );
        assert!(matches!(
            header_len(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"),
            Err(Invalid::Malformed { version: 1, .. })
        ));
        assert!(matches!(
            read(b"PROXY TCP4 1.2.3.999 5.6.7.8 1 2\r\n"),
            Err(Invalid::Malformed { version: 1, .. })
        ));
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(
            header_len(&huge),
            Err(Invalid::TooLong {
                version: 2,
                max: V2_MAX
            })
        );
        let mut v3 = V2_SIGNATURE.to_vec();
        v3.extend_from_slice(&[0x31, 0x11, 0x00, 0x0c]);
        assert!(matches!(
            header_len(&v3),
            Err(Invalid::Malformed { version: 2, .. })
        ));
        // Says IPv4 (12 address bytes) but carries 4.
        let mut short = V2_SIGNATURE.to_vec();
        short.extend_from_slice(&[0x21, 0x11, 0x00, 0x04, 1, 2, 3, 4]);
        assert!(matches!(
            read(&short),
            Err(Invalid::Malformed { version: 2, .. })
        ));
    }
}
