//! Certificates made in the test: a CA, and ECDSA P-256 or RSA server certificates it signed,
//! as files pinlb reads and clients (rustls, curl, nghttp) trust.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{ClientConfig, SupportedProtocolVersion};

/// The crypto provider pinlb was built with, for the test's own TLS clients.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    return Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Arc::new(rustls::crypto::ring::default_provider());
}

/// `[listener.tls]`'s `client_cert_headers`, each field under its `X-Client-*` name.
pub const CLIENT_CERT_HEADERS: &str = "client_cert_headers = { subject = \"X-Client-Subject\", san = \"X-Client-SAN\", verify = \"X-Client-Verify\", serial = \"X-Client-Serial\" }\n";

/// A CA, and files of server certificates it signed, in a directory of their own.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate's files.
#[derive(Clone)]
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Cert {
    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(&self.cert).expect("read cert")
    }
}

impl Pki {
    pub fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "pinlb-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        // Named apart from the servers': a certificate whose issuer is its own subject reads as
        // self-signed to OpenSSL.
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "pinlb test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    /// A certificate for `names` under `file`.pem and `file`.key: ECDSA P-256, or RSA 2048.
    pub fn issue(&self, file: &str, names: &[&str], rsa: bool) -> Cert {
        let key = if rsa {
            KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap()
        } else {
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
        };
        let list: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(list).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0]);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let out = Cert {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        // The chain: the server's certificate, then the CA's.
        std::fs::write(&out.cert, cert.pem() + &self.ca.pem()).unwrap();
        std::fs::write(&out.key, key.serialize_pem()).unwrap();
        out
    }

    /// A CA named `name` (not `pinlb test CA`: a CA named as another is found as the issuer of
    /// that one's certificates, and fails on their signature instead of as unknown).
    pub fn named(name: &str) -> Pki {
        let pki = Pki::new();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(pki.ca_file(), ca.pem()).unwrap();
        Pki { dir: pki.dir, ca }
    }

    /// A client certificate under `file`.pem and `file`.key: subject `CN=cn,O=Example, Inc`,
    /// SANs `DNS:cn.clients.test` and `email:cn@example.test`, serial `serial`, valid now or
    /// (`expired`) only in 2020.
    pub fn issue_client(&self, file: &str, cn: &str, serial: u64, expired: bool) -> Cert {
        use rcgen::{DnType, SanType};
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Example, Inc");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = vec![
            SanType::DnsName(format!("{cn}.clients.test").try_into().unwrap()),
            SanType::Rfc822Name(format!("{cn}@example.test").try_into().unwrap()),
        ];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let out = Cert {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&out.cert, cert.pem()).unwrap();
        std::fs::write(&out.key, key.serialize_pem()).unwrap();
        out
    }

    /// Writes this CA's CRL revoking `serials` to `file`, valid from a day ago to a day on.
    pub fn write_crl(&self, file: &std::path::Path, serials: &[u64]) {
        use rcgen::{CertificateRevocationListParams, RevokedCertParams, SerialNumber};
        let now = time::OffsetDateTime::now_utc();
        let crl = CertificateRevocationListParams {
            this_update: now - time::Duration::days(1),
            next_update: now + time::Duration::days(1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: now - time::Duration::hours(1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.ca)
        .unwrap();
        std::fs::write(file, crl.pem().unwrap()).unwrap();
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// This CA alone, as a client's roots.
    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(self.ca.der().to_vec()))
            .unwrap();
        roots
    }

    /// A client that trusts this CA, speaks `versions`, and offers ALPN http/1.1.
    pub fn client(&self, versions: &[&'static SupportedProtocolVersion]) -> Arc<ClientConfig> {
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(self.roots())
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A client that trusts this CA, speaks TLS 1.2 and 1.3, offers only the ALPN protocol
    /// `alpn`, and shows `cert` (a certificate of [`Pki::issue_client`]) when the server asks.
    pub fn client_config(&self, alpn: &[u8], cert: Option<&Cert>) -> Arc<ClientConfig> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots());
        let mut config = match cert {
            None => builder.with_no_client_auth(),
            Some(c) => {
                let chain = CertificateDer::pem_file_iter(&c.cert)
                    .expect("read the client certificate")
                    .collect::<Result<Vec<_>, _>>()
                    .expect("a certificate in PEM");
                let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&c.key)
                    .expect("read the client key");
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("a client certificate and its key")
            }
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(config)
    }
}
