//! A client's TLS ClientHello read without answering it (nginx's `ssl_preread`, HAProxy's
//! `req.ssl_sni`): the server name and the ALPN protocols it offers, so that a TCP listener can
//! pick where to relay the untouched bytes. rustls's `Acceptor` does the parsing (records, a
//! hello split over several of them, its extensions); pinlb only feeds it and reads the result.

use rustls::server::Acceptor;

/// The most bytes read before a hello is given up on: a ClientHello with post-quantum key
/// shares is under 2 KiB; one record holds at most 16 KiB.
pub const MAX: usize = 16 * 1024 + 5;

/// What a hello offers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hello {
    /// The SNI name, lower-case, when the client sent a DNS name.
    pub server_name: Option<String>,
    /// The ALPN protocols offered, in the client's order.
    pub alpn: Vec<Vec<u8>>,
}

/// Where reading a hello stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Preread {
    /// More bytes are needed.
    More,
    /// The whole hello is here.
    Hello(Hello),
    /// The bytes are no TLS ClientHello (another protocol, or a malformed hello), or it is
    /// longer than [`MAX`]: the connection goes where one without a name goes.
    NotTls,
}

/// A hello being read: the connection's first bytes, fed as they come.
pub struct Reader {
    acceptor: Option<Acceptor>,
    seen: usize,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            acceptor: Some(Acceptor::default()),
            seen: 0,
        }
    }
}

impl Reader {
    /// Takes the next bytes of the connection; every byte is given once, in order.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Preread {
        let Some(acceptor) = self.acceptor.as_mut() else {
            return Preread::NotTls;
        };
        // A TLS connection begins with a handshake record (22); anything else is not one, and
        // is known at its first byte, without waiting for more.
        if self.seen == 0 && bytes.first().is_some_and(|b| *b != 22) {
            self.acceptor = None;
            return Preread::NotTls;
        }
        self.seen += bytes.len();
        if self.seen > MAX {
            self.acceptor = None;
            return Preread::NotTls;
        }
        // Bounded: each pass takes at least one byte of `bytes`, or stops.
        while !bytes.is_empty() {
            match acceptor.read_tls(&mut bytes) {
                Ok(n) if n > 0 => {}
                _ => {
                    self.acceptor = None;
                    return Preread::NotTls;
                }
            }
        }
        match acceptor.accept() {
            Ok(None) => Preread::More,
            Ok(Some(accepted)) => {
                self.acceptor = None;
                let hello = accepted.client_hello();
                Preread::Hello(Hello {
                    server_name: hello.server_name().map(str::to_ascii_lowercase),
                    alpn: hello
                        .alpn()
                        .map(|a| a.map(<[u8]>::to_vec).collect())
                        .unwrap_or_default(),
                })
            }
            Err(_) => {
                self.acceptor = None;
                Preread::NotTls
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The first bytes a rustls client sends for `name`, offering `alpn`.
    fn hello(name: &str, alpn: &[&[u8]]) -> Vec<u8> {
        let provider = crate::tls::server::provider();
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).expect("a name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
        let mut out = Vec::new();
        conn.write_tls(&mut out).expect("hello");
        out
    }

    #[test]
    fn a_hello_gives_its_name_and_alpn_whole_or_byte_by_byte() {
        let bytes = hello("A.Test", &[b"h2", b"http/1.1"]);
        let want = Preread::Hello(Hello {
            server_name: Some("a.test".into()),
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        });
        assert_eq!(Reader::default().feed(&bytes), want);
        let mut r = Reader::default();
        let (last, rest) = bytes.split_last().unwrap();
        for b in rest {
            assert_eq!(r.feed(std::slice::from_ref(b)), Preread::More);
        }
        assert_eq!(r.feed(std::slice::from_ref(last)), want);
    }

    #[test]
    fn an_ip_literal_has_no_name() {
        let bytes = hello("127.0.0.1", &[]);
        assert_eq!(
            Reader::default().feed(&bytes),
            Preread::Hello(Hello::default())
        );
    }

    #[test]
    fn other_protocols_and_garbage_are_not_tls() {
        assert_eq!(Reader::default().feed(b"PING\r\n"), Preread::NotTls);
        assert_eq!(
            Reader::default().feed(b"GET / HTTP/1.1\r\n"),
            Preread::NotTls
        );
        // A handshake record whose body is no hello.
        let mut bad = vec![22, 3, 1, 0, 8];
        bad.extend_from_slice(&[0xff; 8]);
        assert_eq!(Reader::default().feed(&bad), Preread::NotTls);
    }

    #[test]
    fn a_hello_longer_than_the_bound_is_given_up() {
        let mut r = Reader::default();
        // A record header announcing 16 KiB, then its body in pieces.
        assert_eq!(r.feed(&[22, 3, 1, 0x40, 0]), Preread::More);
        let chunk = [1u8; 4096];
        let mut last = Preread::More;
        for _ in 0..5 {
            last = r.feed(&chunk);
            if last != Preread::More {
                break;
            }
        }
        assert_eq!(last, Preread::NotTls);
    }
}
