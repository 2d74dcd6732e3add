//! A request on a listener with `client_cert_headers`: the client's own lines of those names
//! taken out (with or without a certificate, so that no client can forge them), and the
//! verified certificate's lines added, over every protocol alike.
//!
//! The certificate was read once, after the handshake (`tls::client_identity`); a request
//! only copies its values. A listener without the setting never comes here: the request
//! pipeline tests one flag (`Plan::client_cert`, set per generation) before it calls [`edit`],
//! and gives the access log's entry the certificate itself.

use std::sync::Arc;

use crate::http1::request::RequestHead;
use crate::tls::client_auth::CertHeaders;
use crate::tls::client_identity::ClientIdentity;

/// Edits `head` as `headers` (the listener's `client_cert_headers`) say, for the certificate
/// of `client` (`None`: a connection that verified none).
pub(crate) fn edit(
    headers: &CertHeaders,
    client: Option<&Arc<ClientIdentity>>,
    head: &mut RequestHead,
) {
    if headers.is_empty() {
        return;
    }
    // `X_Client_Verify` too: CGI, FastCGI, WSGI and Rack read `_` and `-` as one
    // (`HTTP_X_CLIENT_VERIFY`), so a client must not forge the header under that spelling.
    for name in headers.names() {
        let same = |n: &[u8]| {
            n.len() == name.len()
                && (n.iter().zip(name.as_bytes())).all(|(&a, &b)| {
                    let fold = |c: u8| {
                        if c == b'_' {
                            b'-'
                        } else {
                            c.to_ascii_lowercase()
                        }
                    };
                    fold(a) == fold(b)
                })
        };
        head.remove_lines_named(same);
    }
    // A connection accepted before a reload turned `client_ca` on verified no certificate.
    let none = ClientIdentity::none();
    let lines = client.map_or(&none, |c| &**c).lines(headers);
    head.append_lines(&lines);
}
