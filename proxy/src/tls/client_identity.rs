//! What a TLS connection learned of its client's certificate: read once, after the handshake
//! verified it, in the forms nginx's variables have, for the backend's header lines
//! (`client_cert_headers`) and the access log (`{ssl_client_s_dn}` and the others).
//!
//! Every value is printable ASCII, whatever the certificate holds: a control character or a
//! non-ASCII byte is written `\XX` (RFC 4514's hex escape; OpenSSL's `ESC_MSB`), so a value is
//! always a valid header value and a log field cannot be broken by a certificate.

use std::fmt::Write as _;
use std::net::IpAddr;

use x509_parser::der_parser::asn1_rs::{Any, Tag, ToDer};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate, X509Name};

use super::client_auth::CertHeaders;

/// A connection's client, as its certificate says; made once per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// `SUCCESS` (a certificate verified) or `NONE` (none sent, `client_auth = "optional"`),
    /// as nginx's `$ssl_client_verify`. A certificate that fails verification fails the
    /// handshake, so no request carries `FAILED`.
    pub verify: &'static str,
    /// The subject, RFC 4514 (`CN=alice,O=Example`), as nginx's `$ssl_client_s_dn`; empty
    /// without a certificate.
    pub subject: String,
    /// The issuer, in the same form (`$ssl_client_i_dn`).
    pub issuer: String,
    /// The subject alternative names, as OpenSSL prints them: `DNS:a.example, IP
    /// Address:10.0.0.1, email:a@example, URI:spiffe://…`.
    pub san: String,
    /// The serial number, upper-case hex (`$ssl_client_serial`).
    pub serial: String,
}

impl ClientIdentity {
    /// A connection whose client sent no certificate.
    pub fn none() -> ClientIdentity {
        ClientIdentity {
            verify: "NONE",
            subject: String::new(),
            issuer: String::new(),
            san: String::new(),
            serial: String::new(),
        }
    }

    /// A client's verified certificate (DER). rustls verified it already, so a part x509-parser
    /// cannot read is left empty rather than refused.
    pub fn of(der: &[u8]) -> ClientIdentity {
        let Ok((_, cert)) = X509Certificate::from_der(der) else {
            return ClientIdentity {
                verify: "SUCCESS",
                ..ClientIdentity::none()
            };
        };
        ClientIdentity {
            verify: "SUCCESS",
            subject: rfc4514(cert.subject()),
            issuer: rfc4514(cert.issuer()),
            san: san(&cert),
            serial: serial(cert.raw_serial()),
        }
    }

    /// The header lines `headers` names, `name: value\r\n` each; a value that is empty (no
    /// certificate, or none of its SANs) is not sent, only `verify` always is.
    pub fn lines(&self, headers: &CertHeaders) -> Vec<u8> {
        let mut out = Vec::new();
        let mut line = |name: &Option<String>, value: &str| {
            if let Some(name) = name
                && !value.is_empty()
            {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        };
        line(&headers.verify, self.verify);
        line(&headers.subject, &self.subject);
        line(&headers.san, &self.san);
        line(&headers.serial, &self.serial);
        out
    }
}

/// An attribute type's name in RFC 4514 (and OpenSSL's for the few it adds); `None`: written
/// as its dotted OID.
fn attribute_name(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.4" => "SN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "STREET",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "2.5.4.12" => "title",
        "2.5.4.42" => "GN",
        "0.9.2342.19200300.100.1.1" => "UID",
        "0.9.2342.19200300.100.1.25" => "DC",
        "1.2.840.113549.1.9.1" => "emailAddress",
        _ => return None,
    })
}

/// A name in RFC 4514's string form: the last RDN first, RDNs joined by `,` and the values of
/// one by `+`, as OpenSSL's `XN_FLAG_RFC2253` that nginx uses.
fn rfc4514(name: &X509Name<'_>) -> String {
    let mut out = String::new();
    let rdns: Vec<_> = name.iter_rdn().collect();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, attr) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            let oid = attr.attr_type().to_id_string();
            let known = attribute_name(&oid);
            out.push_str(known.unwrap_or(&oid));
            out.push('=');
            match (known, text(attr.attr_value())) {
                (Some(_), Some(s)) => escape_value(&mut out, &s),
                // An unknown type, or a value that is no string: `#` and its DER in hex.
                _ => {
                    out.push('#');
                    let der = attr.attr_value().to_der_vec().unwrap_or_default();
                    for b in der {
                        let _ = write!(out, "{b:02x}");
                    }
                }
            }
        }
    }
    out
}

/// A string attribute's text.
fn text(value: &Any<'_>) -> Option<String> {
    let data = value.data;
    match value.tag() {
        Tag::Utf8String
        | Tag::PrintableString
        | Tag::Ia5String
        | Tag::NumericString
        | Tag::VisibleString => std::str::from_utf8(data).ok().map(str::to_owned),
        // Latin-1 in practice.
        Tag::T61String => Some(data.iter().map(|&b| char::from(b)).collect()),
        Tag::BmpString => {
            let units = data
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]));
            Some(
                char::decode_utf16(units)
                    .map(|c| c.unwrap_or('\u{fffd}'))
                    .collect(),
            )
        }
        _ => None,
    }
}

/// Writes `value` escaped as RFC 4514 §2.4 asks (`,+"\<>;` and `=` with a backslash, a
/// leading `#` or space and a trailing space too), and every byte outside printable ASCII as
/// `\XX`.
fn escape_value(out: &mut String, value: &str) {
    let bytes = value.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let special = matches!(b, b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';' | b'=')
            || (i == 0 && (b == b'#' || b == b' '))
            || (i + 1 == bytes.len() && b == b' ');
        if special {
            out.push('\\');
            out.push(char::from(b));
        } else if (0x20..0x7f).contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\{b:02X}");
        }
    }
}

/// `s` with every byte outside printable ASCII as `\XX`, for a SAN (IA5 strings, unchecked).
fn printable(out: &mut String, s: &str) {
    for &b in s.as_bytes() {
        if (0x20..0x7f).contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\{b:02X}");
        }
    }
}

/// The SANs as OpenSSL's `subjectAltName` text, `, ` between them.
fn san(cert: &X509Certificate<'_>) -> String {
    let mut out = String::new();
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return out;
    };
    for name in &ext.value.general_names {
        let start = out.len();
        if start > 0 {
            out.push_str(", ");
        }
        match name {
            GeneralName::DNSName(s) => {
                out.push_str("DNS:");
                printable(&mut out, s);
            }
            GeneralName::RFC822Name(s) => {
                out.push_str("email:");
                printable(&mut out, s);
            }
            GeneralName::URI(s) => {
                out.push_str("URI:");
                printable(&mut out, s);
            }
            GeneralName::IPAddress(b) => {
                let ip = match b.len() {
                    4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                    _ => None,
                };
                match ip {
                    Some(ip) => {
                        let _ = write!(out, "IP Address:{ip}");
                    }
                    None => out.push_str("IP Address:<invalid>"),
                }
            }
            GeneralName::DirectoryName(n) => {
                out.push_str("DirName:");
                out.push_str(&rfc4514(n));
            }
            GeneralName::RegisteredID(oid) => {
                let _ = write!(out, "Registered ID:{}", oid.to_id_string());
            }
            // othername, X400 and EDI party names: OpenSSL prints them without their value
            // too.
            GeneralName::OtherName(..) => out.push_str("othername:<unsupported>"),
            GeneralName::X400Address(_) => out.push_str("X400Name:<unsupported>"),
            GeneralName::EDIPartyName(_) => out.push_str("EdiPartyName:<unsupported>"),
            GeneralName::Invalid(..) => out.truncate(start),
        }
    }
    out
}

/// The serial number's bytes in upper-case hex, without the sign byte DER puts before a high
/// bit (OpenSSL's form, which nginx writes).
fn serial(raw: &[u8]) -> String {
    let raw = match raw {
        [0, rest @ ..] if !rest.is_empty() => rest,
        r => r,
    };
    let mut out = String::with_capacity(raw.len() * 2);
    for b in raw {
        let _ = write!(out, "{b:02X}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(s: &str) -> String {
        let mut out = String::new();
        escape_value(&mut out, s);
        out
    }

    #[test]
    fn rfc4514_escapes_its_specials_and_every_unprintable_byte() {
        assert_eq!(escaped("alice"), "alice");
        assert_eq!(escaped("Doe, John+1"), "Doe\\, John\\+1");
        assert_eq!(escaped("#a b "), "\\#a b\\ ");
        assert_eq!(escaped(" x"), "\\ x");
        assert_eq!(escaped("a\r\nb"), "a\\0D\\0Ab");
        assert_eq!(escaped("é"), "\\C3\\A9");
    }

    #[test]
    fn the_serial_drops_its_sign_byte_and_is_upper_case_hex() {
        assert_eq!(serial(&[0x00, 0xab, 0x01]), "AB01");
        assert_eq!(serial(&[0x00]), "00");
        assert_eq!(serial(&[0x1f]), "1F");
    }

    #[test]
    fn a_certificates_subject_reads_last_rdn_first_and_its_sans_as_openssl_prints_them() {
        let mut params =
            rcgen::CertificateParams::new(vec!["a.example".into(), "10.0.0.1".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Example, Inc");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        params.serial_number = Some(vec![0x00, 0x9a, 0x10].into());
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let id = ClientIdentity::of(cert.der());
        assert_eq!(id.verify, "SUCCESS");
        assert_eq!(id.subject, "CN=alice,O=Example\\, Inc");
        assert_eq!(id.issuer, id.subject);
        assert_eq!(id.san, "DNS:a.example, IP Address:10.0.0.1");
        assert_eq!(id.serial, "9A10");
        let headers = CertHeaders {
            subject: Some("x-client-subject".into()),
            verify: Some("x-client-verify".into()),
            ..CertHeaders::default()
        };
        assert_eq!(
            String::from_utf8(id.lines(&headers)).unwrap(),
            "x-client-verify: SUCCESS\r\nx-client-subject: CN=alice,O=Example\\, Inc\r\n"
        );
        assert_eq!(
            String::from_utf8(ClientIdentity::none().lines(&headers)).unwrap(),
            "x-client-verify: NONE\r\n"
        );
    }
}
