//! TLS to backends: an upstream's `[upstream.NAME.tls]` as a rustls client configuration, made
//! when the file is validated (so a CA file that cannot be read fails the start or the reload,
//! naming the file), and the handshake on a new backend connection.
//!
//! Verification is on unless the file says `insecure_skip_verify = true`: against `ca_file`, or
//! the system's CA store when there is none. The name checked is `sni` when set (and then sent
//! as SNI), else the backend's own IP address, which the certificate must then name (an IP
//! address is never sent as SNI, RFC 6066 §3): nginx sends no SNI to a backend unless told to
//! (`proxy_ssl_server_name on`), and checking the address keeps verification meaningful without
//! one.
//!
//! Each backend gets its own session cache (rustls's client cache, keyed by server name): with
//! `sni` set, every backend of the upstream has the same name, and one shared cache would offer
//! backend B the tickets of backend A, which B cannot resume.
//!
//! [`Stream`] is a connection to a server, plain TCP, TLS on it, or a Unix socket: backend connections
//! (`http1::client::BackendStream`) and `pinlb bench`'s load connections are the one type.

use std::fmt;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, Resumption};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

use crate::tls::server::{CertError, CertFiles, certified_key, provider};

/// Sessions kept per backend for resumption: enough for every connection of a pool that
/// reconnects at once to resume (rustls keeps at most 8 TLS 1.3 tickets per server name).
const SESSIONS: usize = 256;

/// The protocol spoken inside TLS, offered by ALPN: `http/1.1` alone for an HTTP/1.1
/// upstream (a backend that also speaks h2 must not choose it), `h2` alone for an HTTP/2 one.
const ALPN_H1: &[u8] = b"http/1.1";

/// Where the CA certificates that verify a backend come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// `ca_file`, a PEM bundle.
    File(PathBuf),
    /// The system's store (rustls-native-certs: `SSL_CERT_FILE`/`SSL_CERT_DIR`, else
    /// /etc/ssl/certs).
    System,
    /// `insecure_skip_verify = true`: any certificate, as long as the handshake is signed by it.
    Nothing,
}

/// An upstream's TLS settings, read and checked.
pub struct BackendTls {
    /// `sni`: sent as SNI and checked against the certificate; `None`: no SNI, and the
    /// certificate must name the backend's IP address.
    pub sni: Option<ServerName<'static>>,
    pub trust: Trust,
    /// `cert` and `key`: the client certificate pinlb shows a backend that asks for one.
    pub client_cert: Option<CertFiles>,
    /// The CA certificates trusted, in DER, and the client chain: what makes two settings the
    /// same for a reload (a CA file rewritten in place is a change).
    roots: Vec<CertificateDer<'static>>,
    client_chain: Vec<CertificateDer<'static>>,
    /// Every backend's configuration is a copy of this one with a session cache of its own.
    config: ClientConfig,
}

/// Why an upstream's TLS settings cannot be used. Each names the file at fault, when one is.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read {}: {source}", .file.display())]
    Read { file: PathBuf, source: io::Error },
    #[error("{}: {what}", .file.display())]
    Invalid { file: PathBuf, what: String },
    #[error(
        "no CA certificate could be read from the system store ({what}), expected ca_file (a PEM bundle) or the ca-certificates package"
    )]
    NoSystemRoots { what: String },
    /// The client certificate or its key.
    #[error("{0}")]
    ClientCert(CertError),
    #[error("cannot build the TLS configuration: {0}")]
    Config(rustls::Error),
}

impl BackendTls {
    /// Reads the CA certificates `trust` names (and the client certificate, if any) and builds
    /// the configuration; `h2` offers HTTP/2 by ALPN instead of HTTP/1.1.
    pub fn load(
        sni: Option<ServerName<'static>>,
        trust: Trust,
        client_cert: Option<CertFiles>,
        h2: bool,
    ) -> Result<BackendTls, TrustError> {
        let provider = provider();
        let roots = match &trust {
            Trust::File(file) => read_roots(file)?,
            Trust::System => system_roots()?,
            Trust::Nothing => Vec::new(),
        };
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(TrustError::Config)?;
        let builder = match &trust {
            Trust::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider.clone()))),
            Trust::File(file) => {
                let mut store = RootCertStore::empty();
                for (i, der) in roots.iter().enumerate() {
                    store.add(der.clone()).map_err(|e| TrustError::Invalid {
                        file: file.clone(),
                        what: format!("certificate {} is not a usable CA certificate: {e}", i + 1),
                    })?;
                }
                builder.with_root_certificates(store)
            }
            Trust::System => {
                let mut store = RootCertStore::empty();
                // A system store holds the odd certificate webpki cannot parse; the rest serve.
                store.add_parsable_certificates(roots.iter().cloned());
                builder.with_root_certificates(store)
            }
        };
        let (mut config, client_chain) = match &client_cert {
            None => (builder.with_no_client_auth(), Vec::new()),
            Some(files) => {
                let key = certified_key(files, &provider).map_err(TrustError::ClientCert)?;
                let chain = key.cert.clone();
                (
                    builder.with_client_cert_resolver(Arc::new(ClientCert(key))),
                    chain,
                )
            }
        };
        config.alpn_protocols = vec![if h2 { crate::tls::server::H2 } else { ALPN_H1 }.to_vec()];
        Ok(BackendTls {
            sni,
            trust,
            client_cert,
            roots,
            client_chain,
            config,
        })
    }

    /// What a connection to the backend at `addr` needs: the configuration, with a session
    /// cache for this backend alone, and the name to verify.
    /// `addr` is the backend's TCP address, `None` for a Unix socket: the config refuses TLS
    /// on a socket, and a name it could check would be `localhost`, which is what it gets.
    pub fn connector(&self, addr: Option<SocketAddr>) -> Connector {
        let mut config = self.config.clone();
        config.resumption = Resumption::in_memory_sessions(SESSIONS);
        let name = match (&self.sni, addr) {
            (Some(sni), _) => sni.clone(),
            (None, Some(addr)) => ServerName::IpAddress(addr.ip().into()),
            (None, None) => ServerName::try_from("localhost".to_string())
                .unwrap_or(ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())),
        };
        Connector {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            name,
        }
    }

    /// What `check` shows of the settings, in one line.
    pub fn summary(&self) -> String {
        let trust = match &self.trust {
            Trust::File(f) => format!(
                "verified against {} ({} CA certificates)",
                f.display(),
                self.roots.len()
            ),
            Trust::System => format!(
                "verified against the system's CA store ({} certificates)",
                self.roots.len()
            ),
            Trust::Nothing => "NOT verified (insecure_skip_verify)".into(),
        };
        let name = match &self.sni {
            Some(name) => format!("sni {}", name.to_str()),
            None => "no SNI, the certificate must name each backend's address".into(),
        };
        let client = match &self.client_cert {
            Some(files) => format!(", client certificate {}", files.cert.display()),
            None => String::new(),
        };
        format!("{trust}, {name}{client}")
    }
}

impl PartialEq for BackendTls {
    fn eq(&self, other: &Self) -> bool {
        self.sni == other.sni
            && self.trust == other.trust
            && self.client_cert == other.client_cert
            && self.roots == other.roots
            && self.client_chain == other.client_chain
    }
}

impl Eq for BackendTls {}

impl fmt::Debug for BackendTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendTls")
            .field("sni", &self.sni)
            .field("trust", &self.trust)
            .field("client_cert", &self.client_cert)
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

/// One backend's side of TLS: its configuration and session cache, and the name it must have.
pub struct Connector {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// The TLS handshake on a new connection; the caller bounds it in time. The error says why,
    /// as the logs and error pages show it.
    pub async fn handshake(&self, tcp: TcpStream) -> Result<TlsStream<TcpStream>, String> {
        self.connector
            .connect(self.name.clone(), tcp)
            .await
            .map_err(|e| describe(&e))
    }
}

/// A connection to a server: plain TCP, TLS on it, or a Unix socket.
///
/// `CLOSE_IS_EOF`: whether a TLS server that closes without a close_notify alert ends the
/// stream as a TCP close would (`true`: backends, as nginx takes it, OpenSSL's
/// SSL_OP_IGNORE_UNEXPECTED_EOF; a body framed by length or chunks that it cuts short is still
/// an error, found by the framing), or fails the read with `UnexpectedEof` (`false`: `pinlb
/// bench`, which counts such a connection as broken). The rest is the same for both.
pub enum Stream<const CLOSE_IS_EOF: bool> {
    Plain(TcpStream),
    /// Boxed: a plain connection need not carry the room for rustls's state.
    Tls(Box<TlsStream<TcpStream>>),
    /// A Unix-domain stream socket (a `unix:/path` backend). Boxed, as TLS is: unboxed it is as
    /// large as the TCP arm, and the enum would need a tag of its own, growing every body and
    /// connection that holds one (`ProxyBody`). Its arms are out of line like TLS's, so that
    /// the plain arm's callers compile as they did without it.
    Unix(Box<UnixStream>),
}

impl<const CLOSE_IS_EOF: bool> fmt::Debug for Stream<CLOSE_IS_EOF> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stream::Plain(s) => f.debug_tuple("Plain").field(s).finish(),
            Stream::Tls(t) => f.debug_tuple("Tls").field(t.get_ref().0).finish(),
            Stream::Unix(u) => f.debug_tuple("Unix").field(u).finish(),
        }
    }
}

impl<const CLOSE_IS_EOF: bool> Stream<CLOSE_IS_EOF> {
    /// Whether a TLS connection's handshake resumed a session.
    pub fn is_resumed(&self) -> bool {
        match self {
            Stream::Plain(_) | Stream::Unix(_) => false,
            Stream::Tls(t) => {
                t.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
            }
        }
    }
}

/// The socket itself (for `SockRef`: a tunnel cut after its idle timeout is shut down both ways).
impl<const CLOSE_IS_EOF: bool> AsFd for Stream<CLOSE_IS_EOF> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Plain(s) => s.as_fd(),
            Stream::Tls(t) => t.get_ref().0.as_fd(),
            Stream::Unix(u) => u.as_fd(),
        }
    }
}

impl<const CLOSE_IS_EOF: bool> AsyncRead for Stream<CLOSE_IS_EOF> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(t) => poll_read_tls::<CLOSE_IS_EOF>(t, cx, buf),
            Stream::Unix(u) => poll_read_unix(u, cx, buf),
        }
    }
}

/// Kept out of line, here and in the other TLS arms: inlined, rustls's code would change what
/// gets inlined into the plain path's callers.
#[inline(never)]
fn poll_read_tls<const CLOSE_IS_EOF: bool>(
    t: &mut TlsStream<TcpStream>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    match ready!(Pin::new(t).poll_read(cx, buf)) {
        Err(e) if CLOSE_IS_EOF && e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
        done => Poll::Ready(done),
    }
}

/// Flushes what TLS encrypted and the socket has not taken yet.
#[inline(never)]
pub fn poll_flush_tls(t: &mut TlsStream<TcpStream>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    Pin::new(t).poll_flush(cx)
}

#[inline(never)]
fn poll_write_tls(
    t: &mut TlsStream<TcpStream>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    match bufs {
        [one] => Pin::new(t).poll_write(cx, one),
        _ => Pin::new(t).poll_write_vectored(cx, bufs),
    }
}

/// A Unix socket's read, out of line as TLS's is.
#[inline(never)]
fn poll_read_unix(
    u: &mut UnixStream,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    Pin::new(u).poll_read(cx, buf)
}

#[inline(never)]
fn poll_write_unix(
    u: &mut UnixStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    match bufs {
        [one] => Pin::new(u).poll_write(cx, one),
        _ => Pin::new(u).poll_write_vectored(cx, bufs),
    }
}

impl<const CLOSE_IS_EOF: bool> AsyncWrite for Stream<CLOSE_IS_EOF> {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(t) => poll_write_tls(t, cx, &[IoSlice::new(buf)]),
            Stream::Unix(u) => poll_write_unix(u, cx, &[IoSlice::new(buf)]),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(t) => poll_write_tls(t, cx, bufs),
            Stream::Unix(u) => poll_write_unix(u, cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(_) | Stream::Unix(_) => Poll::Ready(Ok(())),
            Stream::Tls(t) => poll_flush_tls(t, cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(t) => Pin::new(&mut **t).poll_shutdown(cx),
            Stream::Unix(u) => Pin::new(&mut **u).poll_shutdown(cx),
        }
    }
}

/// A failed handshake's cause: rustls's own words, with a verification failure named as
/// OpenSSL (and so nginx's logs) names it.
fn describe(e: &io::Error) -> String {
    let cause = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => {
            format!("certificate verify failed: {c}")
        }
        Some(e) => e.to_string(),
        None => match e.kind() {
            io::ErrorKind::UnexpectedEof => "the backend closed the connection".into(),
            io::ErrorKind::ConnectionReset => "connection reset".into(),
            _ => e.to_string(),
        },
    };
    format!("TLS handshake failed: {cause}")
}

/// Every certificate of the PEM bundle `file`, at least one.
fn read_roots(file: &Path) -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let pem = std::fs::read(file).map_err(|source| TrustError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let invalid = |what: String| TrustError::Invalid {
        file: file.to_path_buf(),
        what,
    };
    let roots = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("invalid PEM: {e}")))?;
    if roots.is_empty() {
        return Err(invalid(
            "no certificate in it, expected PEM \"BEGIN CERTIFICATE\" blocks".into(),
        ));
    }
    Ok(roots)
}

/// The system's CA certificates.
fn system_roots() -> Result<Vec<CertificateDer<'static>>, TrustError> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let what = match found.errors.first() {
            Some(e) => e.to_string(),
            None => "it is empty".into(),
        };
        return Err(TrustError::NoSystemRoots { what });
    }
    Ok(found.certs)
}

/// The client certificate, for any backend that asks.
#[derive(Debug)]
struct ClientCert(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `insecure_skip_verify = true`: any certificate is taken. The handshake's signatures are still
/// checked, so the backend holds the key of the certificate it sent.
#[derive(Debug)]
pub struct AnyCertificate(pub Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    /// The Unix arm costs the plain path nothing in size: the stream is as large as a TCP
    /// stream alone, as it was with only the TLS arm beside it.
    #[test]
    fn a_stream_is_as_large_as_its_tcp_arm() {
        assert_eq!(
            std::mem::size_of::<super::Stream<true>>(),
            std::mem::size_of::<tokio::net::TcpStream>()
        );
    }
}
