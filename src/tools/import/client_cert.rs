//! nginx's client certificate directives as `[listener.tls]` keys: `ssl_client_certificate` →
//! `client_ca`, `ssl_verify_client on|optional` → `client_auth`, `ssl_crl` → `crl`, and
//! `proxy_set_header NAME $ssl_client_s_dn` (`$ssl_client_verify`, `$ssl_client_serial`) →
//! `client_cert_headers`.
//!
//! Refused, each with its reason: `ssl_verify_client optional_no_ca` (nginx passes a
//! certificate it could not verify on to the backend; pinlb refuses its handshake) and
//! `ssl_verify_depth` (pinlb has no depth limit). A server's directives come from the nearest
//! level that sets them (`http`, then `server`), as nginx inherits them.

use toml::{Table, Value};

use super::parse::Directive;

/// The directives read here (and not refused as unconverted TLS settings).
pub(super) const NAMES: [&str; 4] = [
    "ssl_client_certificate",
    "ssl_verify_client",
    "ssl_crl",
    "ssl_verify_depth",
];

/// A server's client certificate directives, each from the nearest level that sets it.
#[derive(Debug, Clone, Default)]
pub(super) struct Levels {
    ca: Option<Directive>,
    verify: Option<Directive>,
    crl: Option<Directive>,
    depth: Option<Directive>,
}

impl Levels {
    /// What a block's own directives make of what it inherits.
    pub(super) fn level(&self, block: &[Directive]) -> Levels {
        let mut out = self.clone();
        for d in block.iter().filter(|d| d.block.is_none()) {
            let slot = match d.name.as_str() {
                "ssl_client_certificate" => &mut out.ca,
                "ssl_verify_client" => &mut out.verify,
                "ssl_crl" => &mut out.crl,
                "ssl_verify_depth" => &mut out.depth,
                _ => continue,
            };
            *slot = Some(d.clone());
        }
        out
    }

    /// The `[listener.tls]` keys of a server that listens with `ssl`; `None` when it asks for
    /// no client certificate (or cannot be converted: then refused). `path` makes a file
    /// nginx names absolute.
    pub(super) fn convert(
        &self,
        path: impl Fn(&Directive, &str) -> String,
        notes: &mut Vec<String>,
        refused: &mut Vec<String>,
    ) -> Option<Table> {
        let mode = self
            .verify
            .as_ref()
            .and_then(|v| v.args.first().map(|a| (v, a.as_str())));
        let required = match mode {
            None | Some((_, "off")) => {
                for d in [&self.ca, &self.crl, &self.depth].into_iter().flatten() {
                    notes.push(format!(
                        "{}: {} not converted: no ssl_verify_client, so nginx asks for no client certificate",
                        d.at(),
                        d.name
                    ));
                }
                return None;
            }
            Some((_, "on")) => true,
            Some((_, "optional")) => false,
            Some((v, other)) => {
                let why = match other {
                    "optional_no_ca" => "nginx takes a certificate it cannot verify and leaves the check to the backend ($ssl_client_verify FAILED); pinlb verifies every certificate a client sends and refuses the handshake of one that fails, so clients nginx serves would be refused".to_string(),
                    o => format!("\"{o}\" is not a mode nginx has (on, off, optional, optional_no_ca)"),
                };
                refused.push(format!(
                    "{}: ssl_verify_client {other} not converted: {why}",
                    v.at()
                ));
                return None;
            }
        };
        let verify = self.verify.as_ref()?;
        let Some((ca_d, ca)) = (self.ca.as_ref()).and_then(|d| d.args.first().map(|a| (d, a)))
        else {
            refused.push(format!(
                "{}: ssl_verify_client not converted: no ssl_client_certificate names the CAs (nginx refuses this configuration too); without it pinlb asks for no client certificate",
                verify.at()
            ));
            return None;
        };
        if let Some(d) = &self.depth {
            refused.push(format!(
                "{}: ssl_verify_depth {} not converted: pinlb has no depth limit (rustls builds the path through whatever intermediates the client sends), so it would take chains nginx refuses; put only the CAs that sign client certificates in client_ca",
                d.at(),
                d.args.join(" ")
            ));
        }
        let mut t = Table::new();
        t.insert("client_ca".into(), Value::String(path(ca_d, ca)));
        if !required {
            t.insert("client_auth".into(), Value::String("optional".into()));
        }
        if let Some((d, crl)) = (self.crl.as_ref()).and_then(|d| d.args.first().map(|a| (d, a))) {
            t.insert("crl".into(), Value::String(path(d, crl)));
        }
        notes.push(format!(
            "{}: ssl_verify_client {} became client_ca{}: pinlb has no ssl_verify_depth (nginx's default is 1: a client certificate signed by a CA of the file); a client sending intermediates that chain to it is taken",
            verify.at(),
            if required { "on" } else { "optional" },
            if required { "" } else { " with client_auth = \"optional\"" }
        ));
        Some(t)
    }
}

/// `client_cert_headers`' field for a `proxy_set_header` value that is exactly one of the
/// nginx variables pinlb writes, or `None`.
pub(super) fn header_field(value: &str) -> Option<&'static str> {
    Some(match value {
        "$ssl_client_s_dn" => "subject",
        "$ssl_client_verify" => "verify",
        "$ssl_client_serial" => "serial",
        _ => return None,
    })
}

/// The client certificate keys of the servers on one TLS listener: pinlb has one setting per
/// listener (nginx: per server, chosen by SNI), so where the servers differ the strictest
/// (`required` over `optional` over none) applies to all, and a note says so.
pub(super) fn merge<'a>(
    servers: impl Iterator<Item = Option<&'a Table>>,
    at: &str,
    notes: &mut Vec<String>,
) -> Option<Table> {
    let all: Vec<Option<&Table>> = servers.collect();
    let strictest = all
        .iter()
        .flatten()
        .min_by_key(|t| t.contains_key("client_auth"))
        .copied()
        .cloned();
    if all.windows(2).any(|w| w[0] != w[1]) {
        notes.push(format!(
            "{at}: the servers on this address ask for client certificates differently; pinlb has one setting per listener, the strictest of theirs"
        ));
    }
    strictest
}

/// Adds `client_cert_headers` (the `proxy_set_header` lines converted, field to name) to a
/// listener's TLS table that asks for client certificates; whether it did.
pub(super) fn add_headers(tls: &mut Table, headers: &Table) -> bool {
    if headers.is_empty() || !tls.contains_key("client_ca") {
        return false;
    }
    tls.insert("client_cert_headers".into(), Value::Table(headers.clone()));
    true
}
