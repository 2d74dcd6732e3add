//! A TLS listener's client certificates (nginx's `ssl_client_certificate`, `ssl_verify_client`,
//! `ssl_crl` and the `$ssl_client_*` headers it is often used to send; HAProxy's `ca-file`,
//! `verify` and `crl-file`): the keys `client_ca`, `client_auth`, `crl` and
//! `client_cert_headers`, checked together and their files read at the start or reload, so a
//! missing or bad CA or CRL fails there at the key that names it. Its keys sit in
//! `[listener.tls]`, whose other keys are the listener's certificates, so that table
//! (`config::raw`'s `RawTls`) holds them, typed by this module; the handshake's verification
//! and the certificate's values read once per connection are the TLS layer's
//! (`tls::client_auth`, `tls::client_identity`). What each request gets is [`lines`]'s.
//!
//! - [`lines`]: a request's lines of the verified certificate, the client's own of those names
//!   taken out.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};
use crate::tls::client_auth::{CertHeaders, ClientAuth, ClientAuthFiles};

pub(crate) mod lines;

/// `[listener.tls] client_cert_headers = { subject = "X-Client-Subject", … }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaders {
    pub subject: Option<Spanned<String>>,
    pub san: Option<Spanned<String>>,
    pub verify: Option<Spanned<String>>,
    pub serial: Option<Spanned<String>>,
}

/// This module's keys of one `[listener.tls]` table, as the file wrote them.
pub(crate) struct Keys<'a> {
    /// The CAs that sign client certificates.
    pub client_ca: Option<&'a Spanned<String>>,
    /// `"required"` (the default) or `"optional"`.
    pub client_auth: Option<&'a Spanned<String>>,
    pub crl: Option<&'a Spanned<String>>,
    /// The lines that tell the backend what the certificate says.
    pub client_cert_headers: Option<&'a Spanned<RawHeaders>>,
}

type Result<T> = std::result::Result<T, ConfigError>;

/// Header names pinlb writes itself, which a certificate line must not replace.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "x-forwarded-for",
    "x-forwarded-proto",
];

/// The client certificate settings of the `[listener.tls]` table at `tkey`; `None` when it
/// has no `client_ca`, and then none of the other keys may be set.
pub(crate) fn validate(
    src: &Source,
    tkey: &str,
    t: Keys<'_>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Option<ClientAuth>> {
    let Some(ca) = t.client_ca else {
        let stray = [
            ("client_auth", t.client_auth.map(Spanned::span)),
            ("crl", t.crl.map(Spanned::span)),
            (
                "client_cert_headers",
                t.client_cert_headers.map(Spanned::span),
            ),
        ];
        if let Some((k, Some(span))) = stray.into_iter().find(|(_, s)| s.is_some()) {
            return Err(src.at(
                span,
                &format!("{tkey}.{k}"),
                "set without client_ca, expected client_ca = \"ca.pem\" (the CAs that sign client certificates) with it",
            ));
        }
        return Ok(None);
    };
    let required = match t.client_auth {
        None => true,
        Some(v) => match v.get_ref().as_str() {
            "required" => true,
            "optional" => false,
            other => {
                return Err(src.at(
                    v.span(),
                    &format!("{tkey}.client_auth"),
                    format!("\"{other}\" is not a mode, expected \"required\" (the default: no certificate, no handshake) or \"optional\""),
                ));
            }
        },
    };
    let headers = match t.client_cert_headers {
        None => CertHeaders::default(),
        Some(h) => headers(src, &format!("{tkey}.client_cert_headers"), h)?,
    };
    let empty = |v: &Spanned<String>, k: &str| {
        if v.get_ref().is_empty() {
            Err(src.at(
                v.span(),
                &format!("{tkey}.{k}"),
                "empty, expected a PEM file",
            ))
        } else {
            Ok(())
        }
    };
    empty(ca, "client_ca")?;
    if let Some(crl) = t.crl {
        empty(crl, "crl")?;
    }
    let files = ClientAuthFiles {
        ca: ca.get_ref().into(),
        crls: t.crl.iter().map(|c| c.get_ref().into()).collect(),
        required,
    };
    ClientAuth::load(files, headers, provider)
        .map(Some)
        .map_err(|e| {
            let (k, span) = match t.crl {
                Some(c) if e.file() == Some(std::path::Path::new(c.get_ref())) => ("crl", c.span()),
                _ => ("client_ca", ca.span()),
            };
            src.at(span, &format!("{tkey}.{k}"), e.to_string())
        })
}

/// `client_cert_headers`: each a header name, none twice and none of pinlb's own.
fn headers(src: &Source, hkey: &str, raw: &Spanned<RawHeaders>) -> Result<CertHeaders> {
    let r = raw.get_ref();
    let mut seen: Vec<String> = Vec::new();
    let mut name = |k: &str, v: &Option<Spanned<String>>| -> Result<Option<String>> {
        let Some(v) = v else { return Ok(None) };
        let key = format!("{hkey}.{k}");
        let n = v.get_ref();
        if http::HeaderName::from_bytes(n.as_bytes()).is_err() {
            return Err(src.at(
                v.span(),
                &key,
                format!("\"{n}\" is not a header name, expected one such as X-Client-Subject"),
            ));
        }
        let lower = n.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str()) {
            return Err(src.at(
                v.span(),
                &key,
                format!("\"{n}\" is a header pinlb writes itself, expected a name of your own such as X-Client-Subject"),
            ));
        }
        if seen.contains(&lower) {
            return Err(src.at(
                v.span(),
                &key,
                format!(
                    "\"{n}\" is named twice in client_cert_headers, expected one name per field"
                ),
            ));
        }
        seen.push(lower.clone());
        Ok(Some(lower))
    };
    let headers = CertHeaders {
        subject: name("subject", &r.subject)?,
        san: name("san", &r.san)?,
        verify: name("verify", &r.verify)?,
        serial: name("serial", &r.serial)?,
    };
    if headers.is_empty() {
        return Err(src.at(
            raw.span(),
            hkey,
            "no header named, expected one or more of subject, san, verify, serial = \"Header-Name\"",
        ));
    }
    Ok(headers)
}
