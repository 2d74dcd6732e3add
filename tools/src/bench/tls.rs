//! `https://` targets: the client side of TLS for the load threads, on tokio-rustls with the
//! crypto provider pinlb was built with.
//!
//! Which certificates are trusted: `--cacert FILE` (curl's flag), else the system's bundle
//! (`/etc/ssl/certs/ca-certificates.crt`, Debian's); `--insecure` (curl's `-k`, oha's
//! `--insecure`) takes any certificate, for a test server's self-signed one. Each connection
//! does a full handshake when it opens and keeps its session for every request on it; with
//! `--disable-keepalive` every request pays a handshake, as it would for a client without
//! keep-alive (rustls resumes sessions across connections by default, as browsers do).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::BenchError;
// `--insecure`: the same verifier as `insecure_skip_verify` to backends, which takes every
// certificate and still checks the handshake's signatures, so a handshake costs what a
// verifying client's does but for the chain.
use pinlb::tls::client::AnyCertificate;

/// Debian's bundle of the system's trusted certificates.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How https targets are trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Trust {
    /// The system's bundle.
    #[default]
    System,
    /// The certificates in this PEM file.
    File(PathBuf),
    /// Any certificate at all.
    Insecure,
}

/// What a load thread needs to open TLS connections to one target.
#[derive(Clone)]
pub(crate) struct Tls {
    pub connector: TlsConnector,
    /// The URL's host, sent as SNI and checked against the certificate.
    pub name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("name", &self.name).finish()
    }
}

impl Tls {
    /// The client configuration for `host` under `trust`, offering HTTP/1.1 by ALPN, or only
    /// `h2` for `--h2` (as h2load does when told `--h2`).
    pub(crate) fn new(host: &str, trust: &Trust, h2: bool) -> Result<Tls, BenchError> {
        let bad = |reason: String| BenchError::Tls(reason);
        let provider = pinlb::tls::server::provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?;
        let mut config = match trust {
            Trust::Insecure => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth(),
            Trust::System => builder
                .with_root_certificates(roots(Path::new(SYSTEM_BUNDLE))?)
                .with_no_client_auth(),
            Trust::File(path) => builder
                .with_root_certificates(roots(path)?)
                .with_no_client_auth(),
        };
        config.alpn_protocols = if h2 {
            vec![b"h2".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .map_err(|e| bad(format!("{host:?} is not a name TLS can check: {e}")))?
            .to_owned();
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }
}

/// The trusted certificates in a PEM file.
fn roots(path: &Path) -> Result<rustls::RootCertStore, BenchError> {
    let bad = |reason: String| BenchError::Tls(format!("{}: {reason}", path.display()));
    let mut store = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))?;
    for cert in certs {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        store.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if store.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    Ok(store)
}

/// A load connection: plain TCP, or TLS over it. A server that closes TLS without a close_notify
/// alert fails the read, and the connection counts as broken.
pub(crate) type Stream = pinlb::tls::client::Stream<false>;

/// Wraps a connected socket: as it is, or after a TLS handshake.
pub(crate) async fn open(tcp: TcpStream, tls: Option<&Tls>) -> io::Result<Stream> {
    match tls {
        None => Ok(Stream::Plain(tcp)),
        Some(t) => {
            let s = t.connector.connect(t.name.clone(), tcp).await?;
            Ok(Stream::Tls(Box::new(s)))
        }
    }
}
