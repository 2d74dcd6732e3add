//! TLS for listeners: the certificates a listener serves (PEM chains and keys, checked against
//! each other when the configuration is validated), which one a handshake gets (by SNI, with a
//! default), and the rustls server configuration built around them.
//!
//! A listener's [`Terminator`] is made once per configuration generation, while the file is
//! validated: a reload that fails keeps the running one, and one that succeeds gives new
//! handshakes the new certificates while connections already open keep theirs.
//!
//! Session resumption works across workers and across reloads: the ticket keys (rotated by
//! rustls every 6 hours, the previous key still accepted) and the server-side session cache
//! (for TLS 1.2 clients without tickets) are made once per process and shared by every
//! listener's configuration. Both take a lock per handshake that resumes or issues a session;
//! a handshake costs far more than that lock, and no request takes it.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ProducesTickets, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, SignatureScheme};

pub use super::cert_error::CertError;
use super::cert_error::{invalid, read_file as read};
use super::client_auth::ClientAuth;

#[cfg(not(any(feature = "aws-lc-rs", feature = "ring")))]
compile_error!("pinlb needs a TLS crypto provider: build with the `aws-lc-rs` or `ring` feature");

/// Sessions kept for TLS 1.2 resumption by session id, per process (about 10 MB at most;
/// nginx's `shared:SSL:10m` holds about 40,000).
const SESSION_CACHE: usize = 20_480;

/// The protocols a connection may speak inside TLS, offered by ALPN in the server's order of
/// preference: HTTP/2 where the listener serves it, then HTTP/1.1. A client that offers
/// neither (or sends no ALPN) speaks HTTP/1.1.
/// What an HTTP listener offers by ALPN with `http2` on, and off.
pub const ALPN_H2: &[&[u8]] = &[H2, b"http/1.1"];
pub const ALPN_H1: &[&[u8]] = &[b"http/1.1"];
/// ALPN's name for HTTP/2 over TLS.
pub const H2: &[u8] = b"h2";

/// The crypto provider pinlb was built with.
pub fn provider() -> Arc<CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    return Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Arc::new(rustls::crypto::ring::default_provider());
}

/// Ticket keys for the whole process: one set, so that a ticket one worker issued resumes on
/// another, and before a reload on after it.
fn ticketer() -> Result<Arc<dyn ProducesTickets>, rustls::Error> {
    static TICKETER: OnceLock<Result<Arc<dyn ProducesTickets>, rustls::Error>> = OnceLock::new();
    TICKETER.get_or_init(new_ticketer).clone()
}

/// Ticket keys of their own (rotated as the process's are).
fn new_ticketer() -> Result<Arc<dyn ProducesTickets>, rustls::Error> {
    #[cfg(feature = "aws-lc-rs")]
    return rustls::crypto::aws_lc_rs::Ticketer::new();
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return rustls::crypto::ring::Ticketer::new();
}

/// The session cache for the whole process, for the same reason.
fn session_cache() -> Arc<dyn StoresServerSessions> {
    static CACHE: OnceLock<Arc<dyn StoresServerSessions>> = OnceLock::new();
    CACHE
        .get_or_init(|| rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE))
        .clone()
}

/// One certificate chain and its key, as the configuration names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate chain with its key, ready to sign handshakes.
struct Certificate {
    files: CertFiles,
    key: Arc<CertifiedKey>,
}

impl Certificate {
    /// Reads and checks `files`: a chain of one or more PEM certificates, the server's first,
    /// and its private key (PKCS#8, PKCS#1 RSA or SEC1 EC) matching the first certificate.
    fn load(files: &CertFiles, provider: &CryptoProvider) -> Result<Certificate, CertError> {
        let pem = read(&files.cert)?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(&files.cert, format!("invalid PEM: {e}")))?;
        let Some(first) = chain.first() else {
            return Err(invalid(
                &files.cert,
                "no certificate in it, expected PEM \"BEGIN CERTIFICATE\" blocks".into(),
            ));
        };
        webpki::EndEntityCert::try_from(first)
            .map_err(|e| invalid(&files.cert, format!("invalid certificate: {e}")))?;
        let pem = read(&files.key)?;
        let der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
            let what = match e {
                rustls::pki_types::pem::Error::NoItemsFound => {
                    "no private key in it, expected a PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block".to_string()
                }
                e => format!("invalid PEM: {e}"),
            };
            invalid(&files.key, what)
        })?;
        let signing = provider
            .key_provider
            .load_private_key(der)
            .map_err(|e| invalid(&files.key, format!("unsupported private key: {e}")))?;
        let key = CertifiedKey::new(chain, signing);
        match key.keys_match() {
            Ok(()) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(CertError::Mismatch {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                });
            }
            Err(e) => {
                return Err(invalid(
                    &files.key,
                    format!("cannot check it against the certificate: {e}"),
                ));
            }
        }
        Ok(Certificate {
            files: files.clone(),
            key: Arc::new(key),
        })
    }
}

/// The chain and key of `files`, checked as a listener's are: for a client certificate that
/// pinlb shows to backends (`[upstream.NAME.tls] cert` and `key`).
pub fn certified_key(
    files: &CertFiles,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, CertError> {
    Certificate::load(files, provider).map(|c| c.key)
}

impl Certificate {
    /// Whether the certificate names `name` (wildcards included), as a client would check.
    fn serves(&self, name: &ServerName<'_>) -> bool {
        let Some(der) = self.key.cert.first() else {
            return false;
        };
        webpki::EndEntityCert::try_from(der)
            .is_ok_and(|c| c.verify_is_valid_for_subject_name(name).is_ok())
    }

    /// Whether the key can sign with one of the client's `schemes`.
    fn signs_for(&self, schemes: &[SignatureScheme]) -> bool {
        self.key.key.choose_scheme(schemes).is_some()
    }
}

/// A listener's certificates, and which one a handshake gets.
pub struct Certificates {
    /// Chosen by the name the client asks for (SNI), in order.
    by_name: Vec<Certificate>,
    /// For a client that asks for no name, or for one that no certificate names.
    default: Option<Certificate>,
}

impl Certificates {
    /// The certificate for a client that asks for `sni` and can verify `schemes`: the first
    /// that names it and whose key can sign for the client (so an ECDSA and an RSA certificate
    /// for one name serve old and new clients alike), else the default. `None` when there is no
    /// default: the handshake is refused.
    fn choose(&self, sni: Option<&str>, schemes: &[SignatureScheme]) -> Option<&Certificate> {
        let name = sni.and_then(|s| DnsName::try_from(s).ok().map(ServerName::DnsName));
        if let Some(name) = &name {
            let mut named = self.by_name.iter().filter(|c| c.serves(name));
            if let Some(c) = named.clone().find(|c| c.signs_for(schemes)) {
                return Some(c);
            }
            // None can sign for this client: the first still fails the handshake clearly.
            if let Some(c) = named.next() {
                return Some(c);
            }
        }
        self.default.as_ref()
    }

    /// How many certificates there are, the default included.
    pub fn count(&self) -> usize {
        self.by_name.len() + usize::from(self.default.is_some())
    }

    pub fn has_default(&self) -> bool {
        self.default.is_some()
    }

    /// Whether a client asking for `sni` gets a certificate.
    pub fn has(&self, sni: Option<&str>, schemes: &[SignatureScheme]) -> bool {
        self.choose(sni, schemes).is_some()
    }
}

impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files = |c: &Certificate| c.files.cert.display().to_string();
        f.debug_struct("Certificates")
            .field(
                "by_name",
                &self.by_name.iter().map(files).collect::<Vec<_>>(),
            )
            .field("default", &self.default.as_ref().map(files))
            .finish()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.choose(hello.server_name(), hello.signature_schemes())
            .map(|c| c.key.clone())
    }
}

/// What a TLS listener hands each new connection: its certificates and the rustls
/// configuration that uses them.
pub struct Terminator {
    pub certificates: Arc<Certificates>,
    pub config: Arc<ServerConfig>,
    /// `client_ca`: the client certificates asked for and verified; `None`: none asked for.
    pub client_auth: Option<Arc<ClientAuth>>,
}

impl Terminator {
    /// Reads every certificate and key and builds the configuration. `default` is served to
    /// clients whose name no certificate of `by_name` has; without one, they are refused.
    /// `alpn` is what ALPN offers ([`ALPN_H2`], [`ALPN_H1`]; none for a TCP listener, whose
    /// clients may ask for any protocol); `client_auth`, whether clients are asked for a
    /// certificate.
    pub fn load(
        default: Option<&CertFiles>,
        by_name: &[CertFiles],
        alpn: &[&[u8]],
        client_auth: Option<ClientAuth>,
    ) -> Result<Self, CertError> {
        let provider = provider();
        let default = default
            .map(|f| Certificate::load(f, &provider))
            .transpose()?;
        let by_name = by_name
            .iter()
            .map(|f| Certificate::load(f, &provider))
            .collect::<Result<Vec<_>, _>>()?;
        let certificates = Arc::new(Certificates { by_name, default });
        let builder = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(CertError::Config)?;
        let builder = match &client_auth {
            Some(auth) => builder.with_client_cert_verifier(auth.verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(certificates.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        if client_auth.is_some() {
            // Sessions of their own, per generation: a session resumes with the certificate
            // verified when it began, so one from another listener (which asked for none) or
            // from before a reload (another CA, a CRL that revokes it since) must not resume
            // here. A reload costs this listener's clients a full handshake.
            config.ticketer = new_ticketer().map_err(CertError::Config)?;
            config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
        } else {
            config.ticketer = ticketer().map_err(CertError::Config)?;
            config.session_storage = session_cache();
        }
        // The server's order of cipher suites (rustls's: AES-GCM before ChaCha20 where AES is
        // fast, all with forward secrecy), not the client's, as nginx's
        // `ssl_prefer_server_ciphers on` and testssl.sh expect.
        config.ignore_client_order = true;
        // One TLS 1.3 ticket per handshake, not rustls's two: a client resumes with one and gets
        // the next with it, and every ticket sent is work for both ends (the client parses and
        // stores each one; wrk's full-handshake rate through pinlb was 0.86× nginx's with two,
        // nginx sending one after a resumption).
        config.send_tls13_tickets = 1;
        Ok(Terminator {
            certificates,
            config: Arc::new(config),
            client_auth: client_auth.map(Arc::new),
        })
    }

    /// Whether ALPN offers HTTP/2.
    pub fn offers_h2(&self) -> bool {
        self.config.alpn_protocols.iter().any(|p| p == H2)
    }

    /// Every certificate chain served, in DER: what makes two terminators the same.
    fn chains(&self) -> impl Iterator<Item = &[CertificateDer<'static>]> {
        let c = &self.certificates;
        c.default
            .iter()
            .chain(&c.by_name)
            .map(|c| c.key.cert.as_slice())
    }
}

/// Two terminators are equal when they serve the same certificates from the same files, so
/// that a reload that changed a certificate is seen as a change.
impl PartialEq for Terminator {
    fn eq(&self, other: &Self) -> bool {
        let files = |t: &Terminator| {
            let c = &t.certificates;
            c.default
                .iter()
                .chain(&c.by_name)
                .map(|c| c.files.clone())
                .collect::<Vec<_>>()
        };
        files(self) == files(other)
            && self.chains().eq(other.chains())
            && self.config.alpn_protocols == other.config.alpn_protocols
            && self.client_auth == other.client_auth
    }
}

impl Eq for Terminator {}

impl fmt::Debug for Terminator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Terminator")
            .field("certificates", &self.certificates)
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}
