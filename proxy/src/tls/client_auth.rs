//! Client certificates on a TLS listener (`[listener.tls] client_ca`, `client_auth`, `crl`): the CA certificates and CRLs read and checked when the configuration is
//! validated, and the rustls verifier built on them.
//!
//! Verification is rustls's own (`WebPkiClientVerifier`): the chain to one of the CAs, the
//! validity dates, the key usage, and with CRLs the revocation of every certificate of the
//! verified chain but the CA's own, as nginx (`ssl_crl`: OpenSSL's `CRL_CHECK_ALL`). As with
//! nginx, a certificate whose issuer has no CRL among the files is refused (its status is
//! unknown), and so is one checked against a CRL past its `nextUpdate`.
//!
//! There is no depth limit (nginx's `ssl_verify_depth`, 1 by default): rustls builds the path
//! through the intermediates the client sends, up to webpki's own bound, and tells no one how
//! long it was; measuring it would mean building the path a second time. A `client_ca` that
//! holds only the CAs meant to sign client certificates (not a root above intermediates the
//! clients could show) gives nginx's depth 1.
//!
//! With `client_auth = "optional"` a client that sends no certificate is served without one;
//! one that sends a certificate that does not verify is refused at the handshake all the same,
//! as rustls does (nginx's `optional` finishes that handshake and answers 400): the client
//! gets the alert that names the fault (`unknown_ca`, `certificate_expired`,
//! `certificate_revoked`…) instead of a page, and no request is read from it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

pub use super::cert_error::CertError;
use super::cert_error::{invalid, read_file};

/// The header lines a backend gets about a connection's client certificate
/// (`client_cert_headers`), their names lower-case; `None`: not sent. Whatever the client
/// sent under these names is always taken out of its requests, so no client can forge them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertHeaders {
    /// The subject's distinguished name, RFC 4514 (nginx's `$ssl_client_s_dn`).
    pub subject: Option<String>,
    /// The subject alternative names, as OpenSSL prints them (`DNS:a, IP Address:…`).
    pub san: Option<String>,
    /// `SUCCESS` or `NONE` (nginx's `$ssl_client_verify`).
    pub verify: Option<String>,
    /// The serial number in upper-case hex (nginx's `$ssl_client_serial`).
    pub serial: Option<String>,
}

impl CertHeaders {
    /// Every name configured, for taking the client's own lines out.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        [&self.subject, &self.san, &self.verify, &self.serial]
            .into_iter()
            .flatten()
            .map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.names().next().is_none()
    }
}

/// A listener's client certificate settings, as the configuration names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuthFiles {
    /// `client_ca`: PEM, one or more CA certificates.
    pub ca: PathBuf,
    /// `crl`: PEM files of one or more CRLs each; empty: no revocation check.
    pub crls: Vec<PathBuf>,
    /// `client_auth = "required"` (the default) or `"optional"`.
    pub required: bool,
}

/// A listener's client certificate verification, read and built once per generation.
pub struct ClientAuth {
    pub files: ClientAuthFiles,
    pub headers: CertHeaders,
    /// What was read, so that a reload that changed a file is seen as a change.
    read: Vec<Vec<u8>>,
    pub verifier: Arc<dyn ClientCertVerifier>,
}

impl ClientAuth {
    /// Reads the CA and CRL files and builds the verifier. Each error names its file.
    pub fn load(
        files: ClientAuthFiles,
        headers: CertHeaders,
        provider: Arc<CryptoProvider>,
    ) -> Result<ClientAuth, CertError> {
        let mut read = Vec::with_capacity(1 + files.crls.len());
        let pem = read_file(&files.ca)?;
        let cas = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(&files.ca, format!("invalid PEM: {e}")))?;
        if cas.is_empty() {
            return Err(invalid(
                &files.ca,
                "no certificate in it, expected PEM \"BEGIN CERTIFICATE\" blocks of the CAs that sign client certificates".into(),
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for (i, ca) in cas.into_iter().enumerate() {
            roots
                .add(ca)
                .map_err(|e| invalid(&files.ca, format!("certificate {}: {e}", i + 1)))?;
        }
        read.push(pem);
        let mut crls = Vec::new();
        for file in &files.crls {
            let pem = read_file(file)?;
            let these = CertificateRevocationListDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(file, format!("invalid PEM: {e}")))?;
            if these.is_empty() {
                return Err(invalid(
                    file,
                    "no CRL in it, expected PEM \"BEGIN X509 CRL\" blocks".into(),
                ));
            }
            // Parsed here, one by one, so that a bad one is blamed on its file.
            for (i, crl) in these.iter().enumerate() {
                webpki::OwnedCertRevocationList::from_der(crl)
                    .map_err(|e| invalid(file, format!("CRL {}: invalid: {e:?}", i + 1)))?;
            }
            crls.extend(these);
            read.push(pem);
        }
        let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if !crls.is_empty() {
            builder = builder.with_crls(crls).enforce_revocation_expiration();
        }
        if !files.required {
            builder = builder.allow_unauthenticated();
        }
        let verifier = builder
            .build()
            .map_err(|e| invalid(&files.ca, format!("cannot verify with it: {e}")))?;
        Ok(ClientAuth {
            files,
            headers,
            read,
            verifier,
        })
    }
}

impl PartialEq for ClientAuth {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files && self.headers == other.headers && self.read == other.read
    }
}

impl Eq for ClientAuth {}

impl fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientAuth")
            .field("files", &self.files)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

/// Why a client's certificate was refused at the handshake, for the log: `None` when the
/// handshake failed for another reason.
pub fn refusal(e: &rustls::Error) -> Option<String> {
    match e {
        rustls::Error::NoCertificatesPresented => {
            Some("no client certificate, and client_auth = \"required\"".into())
        }
        rustls::Error::InvalidCertificate(c) => {
            Some(format!("client certificate refused: {}", cause(c)))
        }
        _ => None,
    }
}

/// A certificate's fault in words that do not change from one handshake to the next (rustls's
/// own carry the time of the check), so that the log sums a client's refusals.
fn cause(c: &rustls::CertificateError) -> std::borrow::Cow<'static, str> {
    use rustls::CertificateError as E;
    match c {
        E::Expired | E::ExpiredContext { .. } => "certificate expired".into(),
        E::NotValidYet | E::NotValidYetContext { .. } => "certificate not valid yet".into(),
        E::Revoked => "certificate revoked (crl)".into(),
        E::UnknownIssuer => "unknown CA: the chain leads to no CA of client_ca".into(),
        E::UnknownRevocationStatus => {
            "revocation status unknown: the crl has no CRL of its issuer".into()
        }
        E::ExpiredRevocationList | E::ExpiredRevocationListContext { .. } => {
            "the crl's CRL is past its nextUpdate".into()
        }
        E::BadSignature => "bad signature".into(),
        E::InvalidPurpose | E::InvalidPurposeContext { .. } => {
            "not for client authentication (its extended key usage)".into()
        }
        E::BadEncoding => "malformed certificate".into(),
        other => format!("{other:?}").into(),
    }
}
