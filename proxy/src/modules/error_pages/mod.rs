//! `error_page` and `intercept_errors`: an answer replaced by its error page: pinlb's own 4xx
//! and 5xx, and with `intercept_errors` a backend's response whose status has a page (nginx's
//! `error_page 502 503 504 /50x.html` with a local file, `proxy_intercept_errors`; HAProxy's
//! `errorfile`).
//!
//! On a listener or a route: a route's own `error_page` list (or `intercept_errors`) replaces
//! the listener's whole list, as an nginx `location` with its own `error_page` inherits none
//! of its `server`'s; a route that sets only one of the two takes the other from its listener.
//! The listener's pages also answer what no route has seen (a malformed or too large head).
//!
//! The page changes the body, `Content-Type` and `Content-Length`; the other header lines
//! pinlb set on its own answer stay (`Retry-After`, `WWW-Authenticate`, `Location`, `Allow`).
//! Of a backend's response only those four stay, as nginx keeps the upstream's
//! `WWW-Authenticate` on an intercepted 401; its body is dropped unread, which closes the
//! backend connection unless the body was already complete (nginx closes it too).
//!
//! - [`config`]: the keys, the pages' files read at load, their content types.

mod config;

use std::sync::Arc;

use super::{Module, NoFilter, Paged, Place};
use crate::syntax::error::ConfigError;
use config::ErrorPages;
pub use config::{Raw, RawErrorPage, Statuses};

pub use config::{MAX_PAGE_BYTES, content_type_for};

/// The module.
pub(crate) enum ErrorPage {}

/// The lines of pinlb's own answer that a page replaces.
const REPLACED: [&str; 2] = ["content-type", "content-length"];

/// The lines of a backend's response that an intercepting page keeps.
const KEPT: [&str; 4] = ["www-authenticate", "location", "allow", "retry-after"];

impl Module for ErrorPage {
    const KEYS: &'static [&'static str] = &["error_page", "intercept_errors"];
    type Raw = Raw;
    type Config = ErrorPages;
    type Local = ();
    type Filter = NoFilter;
    const PAGES: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<ErrorPages>>,
    ) -> Result<Option<Arc<ErrorPages>>, ConfigError> {
        config::validate(at.src, at.key, raw, inherited)
    }

    /// The page of an answer with `status` and header lines `headers`, when it has one:
    /// always for an answer of pinlb's own, for a backend's only with `intercept_errors`
    /// (every status with a page is 400 or over, so only errors are intercepted, as nginx's
    /// ≥ 300).
    fn page(pages: &Arc<ErrorPages>, status: u16, own: bool, headers: &[u8]) -> Option<Paged> {
        let page = pages.get(status)?;
        let lines = match own {
            true => lines_where(headers, |name| !named(name, &REPLACED)),
            false if pages.intercept => lines_where(headers, |name| named(name, &KEPT)),
            false => return None,
        };
        Some(Paged {
            content_type: page.content_type.clone(),
            lines,
            body: page.body.clone(),
        })
    }

    /// `error pages: 502, 503 from files, intercept_errors on`.
    fn describe(p: &ErrorPages) -> String {
        let statuses: Vec<String> = p.statuses().map(|s| s.to_string()).collect();
        let listed = match statuses.is_empty() {
            true => "none".to_string(),
            false => format!("{} from files", statuses.join(", ")),
        };
        match p.intercept {
            true => format!("error pages: {listed}, intercept_errors on"),
            false => format!("error pages: {listed}"),
        }
    }
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
    use bytes::Bytes;

    use super::config::Page;
    use super::*;

    fn pages(intercept: bool) -> Arc<ErrorPages> {
        let page = Page {
            content_type: b"content-type: text/html\r\n".to_vec(),
            body: Bytes::from_static(b"<p>sign in</p>"),
        };
        Arc::new(ErrorPages::new(vec![(401, Arc::new(page))], intercept))
    }

    const REFUSAL: &[u8] =
        b"content-type: text/plain; charset=utf-8\r\nwww-authenticate: Basic realm=\"x\"\r\n";

    #[test]
    fn a_refusal_gets_the_page_and_keeps_its_challenge() {
        let p = ErrorPage::page(&pages(false), 401, true, REFUSAL).unwrap();
        assert_eq!(p.content_type, b"content-type: text/html\r\n");
        assert_eq!(p.lines, b"www-authenticate: Basic realm=\"x\"\r\n");
        assert_eq!(&p.body[..], b"<p>sign in</p>");
    }

    #[test]
    fn a_backends_error_gets_the_page_only_with_intercept_errors() {
        let backend = b"content-type: text/plain\r\nwww-authenticate: Basic\r\nx-a: b\r\n";
        assert!(ErrorPage::page(&pages(false), 401, false, backend).is_none());
        let p = ErrorPage::page(&pages(true), 401, false, backend).unwrap();
        assert_eq!(p.lines, b"www-authenticate: Basic\r\n");
    }

    #[test]
    fn a_status_without_a_page_is_left_alone() {
        assert!(ErrorPage::page(&pages(true), 404, true, b"").is_none());
    }

    #[test]
    fn check_lists_the_statuses_and_intercept_errors() {
        assert_eq!(
            ErrorPage::describe(&pages(true)),
            "error pages: 401 from files, intercept_errors on"
        );
        assert_eq!(
            ErrorPage::describe(&ErrorPages::default()),
            "error pages: none"
        );
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
