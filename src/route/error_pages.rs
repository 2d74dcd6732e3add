//! An answer replaced by its error page (`error_page`): pinlb's own 4xx and 5xx, and with
//! `intercept_errors` a backend's response whose status has a page.
//!
//! The page changes the body, `Content-Type` and `Content-Length`; the other header lines
//! pinlb set on its own answer stay (`Retry-After`, `WWW-Authenticate`, `Location`, `Allow`).
//! Of a backend's response only those four stay, as nginx keeps the upstream's
//! `WWW-Authenticate` on an intercepted 401; its body is dropped unread, which closes the
//! backend connection unless the body was already complete (nginx closes it too).

use http::Method;

use crate::config::ErrorPages;
use crate::http1::common::Reply;
use crate::proxy::body::{ProxyBody, local_reply};

/// The lines of pinlb's own answer that a page replaces.
const REPLACED: [&str; 2] = ["content-type", "content-length"];

/// The lines of a backend's response that an intercepting page keeps.
const KEPT: [&str; 4] = ["www-authenticate", "location", "allow", "retry-after"];

/// `reply` answered with its status's page from `pages`, when there is one: always for an
/// answer of pinlb's own, for a backend's only with `intercept_errors` (every status with a
/// page is 400 or over, so only errors are intercepted, as nginx's ≥ 300). A HEAD gets the
/// page's headers without its body.
pub(crate) fn apply(pages: &ErrorPages, reply: &mut Reply<ProxyBody>, method: &Method) {
    let Some(page) = pages.get(reply.status.as_u16()) else {
        return;
    };
    let lines = match reply.body {
        ProxyBody::Local(_) => lines_where(&reply.headers, |name| !named(name, &REPLACED)),
        _ if pages.intercept => lines_where(&reply.headers, |name| named(name, &KEPT)),
        _ => return,
    };
    *reply = local_reply(
        reply.status,
        &page.content_type,
        page.body.clone(),
        &lines,
        method,
    );
}

fn named(name: &[u8], names: &[&str]) -> bool {
    names
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

/// The header lines whose name `keep` takes.
fn lines_where(headers: &[u8], keep: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len());
    for line in headers.split_inclusive(|&b| b == b'\n') {
        let name = &line[..line.iter().position(|&b| b == b':').unwrap_or(0)];
        if keep(name.trim_ascii()) {
            out.extend_from_slice(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_lines_are_kept() {
        let h = b"content-type: text/plain\r\nretry-after: 1\r\nContent-Length: 3\r\nx-a: b\r\n";
        let kept = lines_where(h, |n| !named(n, &REPLACED));
        assert_eq!(kept, b"retry-after: 1\r\nx-a: b\r\n");
        let kept = lines_where(h, |n| named(n, &KEPT));
        assert_eq!(kept, b"retry-after: 1\r\n");
        assert!(lines_where(b"", |_| true).is_empty());
    }
}
