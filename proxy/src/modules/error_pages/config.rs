//! `[[listener.error_page]]` and `intercept_errors`: the pages pinlb answers its own 4xx and 5xx
//! with, read from their files when the configuration is loaded (and again at each reload), as
//! nginx's `error_page 502 503 504 /50x.html` with a local file and HAProxy's `errorfile`.
//!
//! A route's own `error_page` list (or `intercept_errors`) replaces the listener's whole list,
//! as an nginx `location` with its own `error_page` inherits none of its `server`'s; a route
//! that sets only one of the two takes the other from its listener.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};

/// The largest page file pinlb reads (1 MiB): a page is held in memory for the generation's
/// life and written whole in one answer; HAProxy's `errorfile` must fit its buffer (16 kB).
pub const MAX_PAGE_BYTES: u64 = 1 << 20;

/// The content type a page gets from its file's extension when `content_type` is not given.
const TYPES: [(&str, &str); 6] = [
    ("html", "text/html; charset=utf-8"),
    ("htm", "text/html; charset=utf-8"),
    ("txt", "text/plain; charset=utf-8"),
    ("json", "application/json"),
    ("xml", "application/xml"),
    ("svg", "image/svg+xml"),
];

/// The keys as the file writes them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub error_page: Option<Vec<Spanned<RawErrorPage>>>,
    pub intercept_errors: Option<Spanned<bool>>,
}

/// One `[[listener.error_page]]` (or `[[listener.route.error_page]]`) as written.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawErrorPage {
    /// One status or a list.
    pub status: Spanned<Statuses>,
    pub file: Spanned<String>,
    pub content_type: Option<Spanned<String>>,
}

/// `status = 404` or `status = [502, 503, 504]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Statuses {
    One(i64),
    Many(Vec<i64>),
}

/// One page: its `content-type` header line and its body.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Page {
    /// `content-type: …\r\n`, as pinlb keeps header lines.
    pub content_type: Vec<u8>,
    /// The file's bytes, as read at load.
    pub body: Bytes,
}

/// The content type and the body's length: a page may be a megabyte.
impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = String::from_utf8_lossy(&self.content_type);
        write!(f, "Page({}, {} bytes)", line.trim_end(), self.body.len())
    }
}

/// A listener's or a route's error pages, by status, and whether a backend's own errors that
/// have a page are replaced by it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ErrorPages {
    /// Sorted by status, each status once.
    pages: Vec<(u16, Arc<Page>)>,
    /// `intercept_errors` (nginx's `proxy_intercept_errors`), off by default as nginx's: a
    /// backend's response with a status that has a page is answered with the page instead.
    pub intercept: bool,
}

impl ErrorPages {
    /// `pages` by status (each once; the order does not matter).
    #[cfg(test)]
    pub fn new(mut pages: Vec<(u16, Arc<Page>)>, intercept: bool) -> ErrorPages {
        pages.sort_by_key(|(s, _)| *s);
        pages.dedup_by_key(|(s, _)| *s);
        ErrorPages { pages, intercept }
    }

    /// The statuses that have a page, in order (`pinlb check` lists them).
    pub fn statuses(&self) -> impl Iterator<Item = u16> + '_ {
        self.pages.iter().map(|(s, _)| *s)
    }

    /// The page for `status`, if there is one.
    pub fn get(&self, status: u16) -> Option<&Arc<Page>> {
        let i = self.pages.binary_search_by_key(&status, |(s, _)| *s).ok()?;
        Some(&self.pages[i].1)
    }
}

type Result<T> = std::result::Result<T, ConfigError>;

/// The pages of the table at `key` from its keys `raw`, over its listener's `inherited` (for
/// a route): its own when it sets `error_page` or `intercept_errors` (what it does not set
/// taken from the listener's), else the listener's whole; `None` when none apply.
pub(super) fn validate(
    src: &Source,
    key: &str,
    raw: &Raw,
    inherited: Option<&Arc<ErrorPages>>,
) -> Result<Option<Arc<ErrorPages>>> {
    if raw.error_page.is_none() && raw.intercept_errors.is_none() {
        return Ok(inherited.cloned());
    }
    let pages = match &raw.error_page {
        Some(p) => table(src, key, p)?,
        None => inherited.map(|l| l.pages.clone()).unwrap_or_default(),
    };
    let intercept = match &raw.intercept_errors {
        Some(v) => *v.get_ref(),
        None => inherited.is_some_and(|l| l.intercept),
    };
    Ok(Some(Arc::new(ErrorPages { pages, intercept })))
}

/// Every entry of an `error_page` list checked and its file read.
fn table(src: &Source, key: &str, raw: &[Spanned<RawErrorPage>]) -> Result<Vec<(u16, Arc<Page>)>> {
    let mut pages: Vec<(u16, Arc<Page>)> = Vec::new();
    for (i, entry) in raw.iter().enumerate() {
        let ekey = format!("{key}.error_page[{i}]");
        let e = entry.get_ref();
        let statuses = statuses(src, &ekey, &e.status)?;
        let page = Arc::new(page(src, &ekey, e)?);
        for status in statuses {
            if pages.iter().any(|(s, _)| *s == status) {
                return Err(src.at(
                    e.status.span(),
                    &format!("{ekey}.status"),
                    format!("{status} has a page already, expected each status in one error_page"),
                ));
            }
            pages.push((status, page.clone()));
        }
    }
    pages.sort_by_key(|(s, _)| *s);
    Ok(pages)
}

/// The statuses of one entry: each from 400 to 599, none twice.
fn statuses(src: &Source, ekey: &str, raw: &Spanned<Statuses>) -> Result<Vec<u16>> {
    let list = match raw.get_ref() {
        Statuses::One(s) => vec![*s],
        Statuses::Many(v) => v.clone(),
    };
    let skey = format!("{ekey}.status");
    if list.is_empty() {
        return Err(src.at(
            raw.span(),
            &skey,
            "empty, expected statuses from 400 to 599",
        ));
    }
    let mut out: Vec<u16> = Vec::with_capacity(list.len());
    for s in list {
        match u16::try_from(s) {
            Ok(s) if (400..=599).contains(&s) && !out.contains(&s) => out.push(s),
            Ok(s) if out.contains(&s) => {
                return Err(src.at(raw.span(), &skey, format!("{s} is listed twice")));
            }
            _ => {
                return Err(src.at(
                    raw.span(),
                    &skey,
                    format!(
                        "{s} is not an error status, expected statuses from 400 to 599 (pinlb's own 4xx and 5xx)"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// One entry's file, read now, and its content type.
fn page(src: &Source, ekey: &str, e: &RawErrorPage) -> Result<Page> {
    let file = e.file.get_ref();
    let fkey = format!("{ekey}.file");
    let at = |span: Range<usize>, key: &str, why: String| src.at(span, key, why);
    let content_type = match &e.content_type {
        Some(t) => {
            let v = t.get_ref();
            if v.is_empty() || http::HeaderValue::from_str(v).is_err() {
                return Err(at(
                    t.span(),
                    &format!("{ekey}.content_type"),
                    format!(
                        "{v:?} is not a header value, expected a media type such as \"text/html; charset=utf-8\""
                    ),
                ));
            }
            v.clone()
        }
        None => match content_type_for(file) {
            Some(t) => t.to_string(),
            None => {
                let known: Vec<&str> = TYPES.iter().map(|(e, _)| *e).collect();
                return Err(at(
                    e.file.span(),
                    &fkey,
                    format!(
                        "no content type known for {file:?}, expected content_type, or a file ending in one of: {}",
                        known.join(", ")
                    ),
                ));
            }
        },
    };
    let body = read(file).map_err(|why| at(e.file.span(), &fkey, why))?;
    let mut line = b"content-type: ".to_vec();
    line.extend_from_slice(content_type.as_bytes());
    line.extend_from_slice(b"\r\n");
    Ok(Page {
        content_type: line,
        body,
    })
}

/// The content type a page file gets by its extension, from [`TYPES`] (for `pinlb import` too).
pub fn content_type_for(file: &str) -> Option<&'static str> {
    let ext = std::path::Path::new(file).extension()?.to_str()?;
    TYPES
        .iter()
        .find(|(e, _)| e.eq_ignore_ascii_case(ext))
        .map(|(_, t)| *t)
}

/// `file`'s bytes, at most [`MAX_PAGE_BYTES`] of them.
fn read(file: &str) -> std::result::Result<Bytes, String> {
    use std::io::Read;
    let f = std::fs::File::open(file).map_err(|e| format!("cannot read {file:?}: {e}"))?;
    let mut body = Vec::new();
    f.take(MAX_PAGE_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("cannot read {file:?}: {e}"))?;
    if body.len() as u64 > MAX_PAGE_BYTES {
        return Err(format!(
            "{file:?} is over {MAX_PAGE_BYTES} bytes, expected an error page of at most 1 MiB"
        ));
    }
    Ok(Bytes::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_of(status: u16) -> (u16, Arc<Page>) {
        let page = Page {
            content_type: b"content-type: text/plain\r\n".to_vec(),
            body: Bytes::from(status.to_string()),
        };
        (status, Arc::new(page))
    }

    #[test]
    fn a_page_is_found_by_its_status_and_no_other() {
        let pages = ErrorPages {
            pages: vec![page_of(404), page_of(502), page_of(503)],
            intercept: false,
        };
        assert_eq!(&pages.get(502).unwrap().body[..], b"502");
        assert_eq!(&pages.get(404).unwrap().body[..], b"404");
        assert!(pages.get(500).is_none());
        assert!(pages.get(200).is_none());
        assert!(ErrorPages::default().get(404).is_none());
    }

    #[test]
    fn the_content_type_follows_the_extension_in_any_case() {
        assert_eq!(
            content_type_for("50x.html"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(
            content_type_for("/srv/E.HTM"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(content_type_for("a.json"), Some("application/json"));
        assert_eq!(content_type_for("a.txt"), Some("text/plain; charset=utf-8"));
        assert_eq!(content_type_for("page"), None);
        assert_eq!(content_type_for("page.gif"), None);
    }

    #[test]
    fn a_file_over_the_bound_is_refused_and_one_at_it_is_read() {
        let dir = std::env::temp_dir().join(format!("pinlb-error-pages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join("at.html");
        let over = dir.join("over.html");
        std::fs::write(&at, vec![b'a'; MAX_PAGE_BYTES as usize]).unwrap();
        std::fs::write(&over, vec![b'a'; MAX_PAGE_BYTES as usize + 1]).unwrap();
        assert_eq!(
            read(at.to_str().unwrap()).unwrap().len() as u64,
            MAX_PAGE_BYTES
        );
        let e = read(over.to_str().unwrap()).unwrap_err();
        assert!(e.contains("over 1048576 bytes"), "{e}");
        let e = read(dir.join("missing.html").to_str().unwrap()).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
