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
    use std::sync::Arc;

    use bytes::Bytes;
    use http::StatusCode;

    use super::*;
    use crate::config::Page;

    fn pages() -> ErrorPages {
        let page = Page {
            content_type: b"content-type: text/html\r\n".to_vec(),
            body: Bytes::from_static(b"<p>sign in</p>"),
        };
        ErrorPages::new(vec![(401, Arc::new(page))], false)
    }

    fn refusal(method: &Method) -> Reply<ProxyBody> {
        local_reply(
            StatusCode::UNAUTHORIZED,
            b"content-type: text/plain; charset=utf-8\r\n",
            Bytes::from_static(b"401 Unauthorized\n"),
            b"www-authenticate: Basic realm=\"x\"\r\n",
            method,
        )
    }

    fn body(reply: &Reply<ProxyBody>) -> &[u8] {
        match &reply.body {
            ProxyBody::Local(Some(b)) => b,
            _ => panic!("not a local body"),
        }
    }

    #[test]
    fn a_refusal_gets_the_page_and_keeps_its_challenge() {
        let mut reply = refusal(&Method::GET);
        apply(&pages(), &mut reply, &Method::GET);
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            reply.headers,
            b"content-type: text/html\r\nwww-authenticate: Basic realm=\"x\"\r\n"
        );
        assert_eq!(body(&reply), b"<p>sign in</p>");
    }

    #[test]
    fn a_head_gets_the_pages_length_without_its_body() {
        let mut reply = refusal(&Method::HEAD);
        apply(&pages(), &mut reply, &Method::HEAD);
        let headers = String::from_utf8(reply.headers.clone()).unwrap();
        assert!(headers.contains("content-length: 14\r\n"), "{headers}");
        assert_eq!(headers.matches("content-length").count(), 1, "{headers}");
        assert!(
            headers.starts_with("content-type: text/html\r\n"),
            "{headers}"
        );
        assert_eq!(body(&reply), b"");
    }

    #[test]
    fn a_status_without_a_page_is_left_alone() {
        let mut reply = local_reply(
            StatusCode::NOT_FOUND,
            b"content-type: text/plain\r\n",
            Bytes::from_static(b"404\n"),
            b"",
            &Method::GET,
        );
        apply(&pages(), &mut reply, &Method::GET);
        assert_eq!(reply.headers, b"content-type: text/plain\r\n");
        assert_eq!(body(&reply), b"404\n");
    }

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
