//! A request on a listener with `client_cert_headers`: the client's own lines of those names
//! taken out (with or without a certificate, so that no client can forge them), and the
//! verified certificate's lines added, over HTTP/1.1 and HTTP/2 alike.
//!
//! The certificate was read once, after the handshake (`tls::client_identity`); a request
//! only copies its values. A listener without the setting never comes here: the request path
//! tests one flag (`Plan::client_cert`, set per generation).

use std::sync::Arc;

use crate::http1::request::RequestHead;
use crate::proxy::accesslog::Pending;
use crate::route::decision::Plan;
use crate::tls::client_identity::ClientIdentity;

/// On a listener with `client_ca`: edits `head` as its `client_cert_headers` say, and gives
/// the access log's entry the certificate (`client` is asked only then).
#[inline]
pub(crate) fn edit<'a>(
    plan: &Plan,
    client: impl FnOnce() -> Option<&'a Arc<ClientIdentity>>,
    head: &mut RequestHead,
    pending: Option<&mut Pending>,
) {
    if plan.client_cert {
        edit_lines(plan, client(), head, pending);
    }
}

#[inline(never)]
fn edit_lines(
    plan: &Plan,
    client: Option<&Arc<ClientIdentity>>,
    head: &mut RequestHead,
    pending: Option<&mut Pending>,
) {
    if let Some(p) = pending {
        p.client_cert(client);
    }
    let Some(auth) = plan.tls.as_ref().and_then(|t| t.client_auth.as_ref()) else {
        return;
    };
    if auth.headers.is_empty() {
        return;
    }
    // `X_Client_Verify` too: CGI, FastCGI, WSGI and Rack read `_` and `-` as one
    // (`HTTP_X_CLIENT_VERIFY`), so a client must not forge the header under that spelling.
    for name in auth.headers.names() {
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
    let lines = client.map_or(&none, |c| &**c).lines(&auth.headers);
    head.append_lines(&lines);
}
