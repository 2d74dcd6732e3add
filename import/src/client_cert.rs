//! nginx's client certificate directives as `[listener.tls]` keys: `ssl_client_certificate` →
//! `client_ca`, `ssl_verify_client on|optional` → `client_auth`, `ssl_crl` → `crl`, and
//! `proxy_set_header NAME $ssl_client_s_dn` (`$ssl_client_verify`, `$ssl_client_serial`) →
//! `client_cert_headers`.
//!
//! Refused, each with its reason: `ssl_verify_client optional_no_ca` (nginx passes a
//! certificate it could not verify on to the backend; pinlb refuses its handshake) and
//! `ssl_verify_depth` (pinlb has no depth limit). A server's directives come from the nearest
//! level that sets them (`http`, then `server`), as nginx inherits them.

use pinlb::config::raw::{RawListener, RawTls};
use pinlb::modules::client_cert::RawHeaders;
use toml::Spanned;

use super::parse::Directive;
use super::values::{spanned, text};

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
    ) -> Option<RawTls> {
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
        let crl = (self.crl.as_ref()).and_then(|d| d.args.first().map(|a| (d, a)));
        let t = RawTls {
            client_ca: Some(spanned(path(ca_d, ca))),
            client_auth: (!required).then(|| spanned("optional".into())),
            crl: crl.map(|(d, crl)| spanned(path(d, crl))),
            ..RawTls::default()
        };
        notes.push(format!(
            "{}: ssl_verify_client {} became client_ca{}: pinlb has no ssl_verify_depth (nginx's default is 1: a client certificate signed by a CA of the file); a client sending intermediates that chain to it is taken",
            verify.at(),
            if required { "on" } else { "optional" },
            if required { "" } else { " with client_auth = \"optional\"" }
        ));
        Some(t)
    }
}

/// A field of `client_cert_headers`: what a header tells of the client's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Subject,
    Verify,
    Serial,
}

impl Field {
    /// The header's name this field has in `headers`.
    pub fn of(self, headers: &mut RawHeaders) -> &mut Option<Spanned<String>> {
        match self {
            Field::Subject => &mut headers.subject,
            Field::Verify => &mut headers.verify,
            Field::Serial => &mut headers.serial,
        }
    }
}

/// `client_cert_headers`' field for a `proxy_set_header` value that is exactly one of the
/// nginx variables pinlb writes, or `None`.
pub(super) fn header_field(value: &str) -> Option<Field> {
    Some(match value {
        "$ssl_client_s_dn" => Field::Subject,
        "$ssl_client_verify" => Field::Verify,
        "$ssl_client_serial" => Field::Serial,
        _ => return None,
    })
}

/// The client certificate keys of the servers on one TLS listener: pinlb has one setting per
/// listener (nginx: per server, chosen by SNI), so where the servers differ the strictest
/// (`required` over `optional` over none) applies to all, and a note says so.
pub(super) fn merge<'a>(
    servers: impl Iterator<Item = Option<&'a RawTls>>,
    at: &str,
    notes: &mut Vec<String>,
) -> Option<RawTls> {
    let all: Vec<Option<&RawTls>> = servers.collect();
    let strictest = all
        .iter()
        .flatten()
        .min_by_key(|t| t.client_auth.is_some())
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
pub(super) fn add_headers(tls: &mut RawTls, headers: &RawHeaders) -> bool {
    if *headers == RawHeaders::default() || tls.client_ca.is_none() {
        return false;
    }
    tls.client_cert_headers = Some(spanned(headers.clone()));
    true
}

/// A note when `proxy_set_header NAME $ssl_client_*` lines were read but no listener asks for
/// client certificates: nginx sends those headers empty there, pinlb sends none.
pub(super) fn unsent_headers(
    listeners: &[RawListener],
    headers: &RawHeaders,
    notes: &mut Vec<String>,
) {
    let taken = (listeners.iter())
        .any(|l| (l.tls.as_ref()).is_some_and(|t| t.get_ref().client_cert_headers.is_some()));
    // In the order of the fields' names, as the table is written.
    let fields = [
        &headers.san,
        &headers.serial,
        &headers.subject,
        &headers.verify,
    ];
    let names: Vec<&str> = fields.iter().filter_map(|h| text(h)).collect();
    if !names.is_empty() && !taken {
        notes.push(format!(
            "proxy_set_header {} $ssl_client_*: not converted: no server asks for client certificates (ssl_verify_client), so nginx sends them empty; pinlb sends none",
            names.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(line: usize, name: &str, args: &[&str]) -> Directive {
        Directive {
            name: name.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block: None,
            file: "nginx.conf".into(),
            line,
        }
    }

    fn convert(
        http: &[Directive],
        server: &[Directive],
    ) -> (Option<RawTls>, Vec<String>, Vec<String>) {
        let levels = Levels::default().level(http).level(server);
        let (mut notes, mut refused) = (Vec::new(), Vec::new());
        let t = levels.convert(|_, f| format!("/etc/nginx/{f}"), &mut notes, &mut refused);
        (t, notes, refused)
    }

    #[test]
    fn a_server_inherits_the_ca_and_crl_and_sets_its_own_mode() {
        let http = [
            d(1, "ssl_client_certificate", &["ca.pem"]),
            d(2, "ssl_crl", &["crl.pem"]),
        ];
        let (t, notes, refused) = convert(&http, &[d(5, "ssl_verify_client", &["optional"])]);
        let t = t.expect("converted");
        assert_eq!(text(&t.client_ca), Some("/etc/nginx/ca.pem"));
        assert_eq!(text(&t.crl), Some("/etc/nginx/crl.pem"));
        assert_eq!(text(&t.client_auth), Some("optional"));
        assert!(refused.is_empty(), "{refused:?}");
        assert!(
            notes[0].starts_with("nginx.conf:5: ssl_verify_client optional became client_ca"),
            "{notes:?}"
        );
        // `on` is pinlb's default, so it is not written.
        let (t, _, _) = convert(&http, &[d(5, "ssl_verify_client", &["on"])]);
        assert!(t.unwrap().client_auth.is_none());
    }

    #[test]
    fn what_does_not_convert_is_refused_or_noted_at_its_line() {
        let ca = d(1, "ssl_client_certificate", &["ca.pem"]);
        let (t, _, refused) = convert(
            std::slice::from_ref(&ca),
            &[d(4, "ssl_verify_client", &["optional_no_ca"])],
        );
        assert!(t.is_none());
        assert!(refused[0].starts_with("nginx.conf:4: ssl_verify_client optional_no_ca not converted: nginx takes a certificate it cannot verify"), "{refused:?}");
        let (t, _, refused) = convert(&[], &[d(4, "ssl_verify_client", &["on"])]);
        assert!(t.is_none());
        assert!(
            refused[0].contains("no ssl_client_certificate names the CAs"),
            "{refused:?}"
        );
        let (t, _, refused) = convert(
            std::slice::from_ref(&ca),
            &[
                d(4, "ssl_verify_client", &["on"]),
                d(5, "ssl_verify_depth", &["3"]),
            ],
        );
        assert!(t.is_some(), "the rest still converts");
        assert!(
            refused[0].starts_with(
                "nginx.conf:5: ssl_verify_depth 3 not converted: pinlb has no depth limit"
            ),
            "{refused:?}"
        );
        // Without ssl_verify_client nginx asks for nothing: notes.
        let (t, notes, refused) = convert(&[ca], &[d(6, "ssl_verify_client", &["off"])]);
        assert!(t.is_none() && refused.is_empty());
        assert!(
            notes[0].starts_with(
                "nginx.conf:1: ssl_client_certificate not converted: no ssl_verify_client"
            ),
            "{notes:?}"
        );
    }

    #[test]
    fn servers_that_differ_on_one_address_get_the_strictest_and_a_note() {
        let required = RawTls {
            client_ca: Some(spanned("ca.pem".into())),
            ..RawTls::default()
        };
        let optional = RawTls {
            client_auth: Some(spanned("optional".into())),
            ..required.clone()
        };
        let mut notes = Vec::new();
        let got = merge(
            [Some(&optional), None, Some(&required)].into_iter(),
            "nginx.conf:3",
            &mut notes,
        );
        assert_eq!(got.as_ref(), Some(&required));
        assert_eq!(notes.len(), 1, "{notes:?}");
        let mut notes = Vec::new();
        let got = merge(
            [Some(&optional), Some(&optional)].into_iter(),
            "nginx.conf:3",
            &mut notes,
        );
        assert_eq!(got.as_ref(), Some(&optional));
        assert!(notes.is_empty());
        assert_eq!(merge([None, None].into_iter(), "x", &mut notes), None);
    }

    #[test]
    fn only_nginxs_variables_pinlb_writes_become_headers() {
        assert_eq!(header_field("$ssl_client_s_dn"), Some(Field::Subject));
        assert_eq!(header_field("$ssl_client_verify"), Some(Field::Verify));
        assert_eq!(header_field("$ssl_client_serial"), Some(Field::Serial));
        assert_eq!(header_field("$ssl_client_escaped_cert"), None);
        assert_eq!(header_field("dn=$ssl_client_s_dn"), None);
    }
}
