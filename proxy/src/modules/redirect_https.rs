//! `redirect_https`: a plain listener that answers every request with a `301` to the same host
//! (without its port) and target over https, as nginx's `return 301
//! https://$host$request_uri;` in a `server` of its own. Nothing is proxied, so the listener
//! needs no `upstream`.
//!
//! A listener key only (a route can't turn it on or off), and not beside `[listener.tls]`: a
//! listener that redirects to https serves plain HTTP. It answers before the route and the
//! edge controls, as nginx's `return` in the server's rewrite phase comes before `limit_req`
//! and `allow`/`deny`. A request without a Host to redirect to gets `400` and the connection
//! closes; both answers are logged with their status and get the listener's error page for it,
//! if it has one.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{Answer, Module, Place};
use crate::http1::common::error_page;
use crate::http1::request::{RequestHead, host_without_port};
use crate::syntax::error::ConfigError;

/// The module.
pub(crate) enum RedirectHttps {}

/// Its key as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub redirect_https: Option<Spanned<bool>>,
}

/// On: it has nothing to configure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct On;

impl Module for RedirectHttps {
    const KEYS: &'static [&'static str] = &["redirect_https"];
    type Raw = Raw;
    type Config = On;
    type Local = ();
    type Filter = super::NoFilter;
    const ON_ROUTES: bool = false;
    const REQUEST: bool = true;
    const ANSWERS_ALL: Option<&'static str> = Some("redirect to https");

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<On>>,
    ) -> Result<Option<Arc<On>>, ConfigError> {
        let Some(on) = &raw.redirect_https else {
            return Ok(inherited.cloned());
        };
        if !*on.get_ref() {
            return Ok(None);
        }
        if let Some(tls) = &at.tls {
            return Err(at.src.at(
                tls.clone(),
                &format!("{}.tls", at.key),
                "set together with redirect_https, expected one of them: a listener that redirects to https serves plain HTTP",
            ));
        }
        Ok(Some(Arc::new(On)))
    }

    fn request(_: &Arc<On>, head: &RequestHead) -> Option<Answer> {
        let Some(location) = https_location(head) else {
            let status = StatusCode::BAD_REQUEST;
            let page = error_page(status, &"no Host header to redirect to https with");
            return Some(Answer {
                status,
                lines: Vec::new(),
                body: Bytes::from(page),
                close: true,
                refused: None,
            });
        };
        let status = StatusCode::MOVED_PERMANENTLY;
        Some(Answer {
            status,
            lines: location,
            body: Bytes::from(error_page(status, &"this site is served over https")),
            close: false,
            refused: None,
        })
    }

    fn describe(_: &On) -> String {
        "redirect_https: every request answered 301 to https".into()
    }
}

/// The `location` header line of the answer: the same host (without its port) and target over
/// https. `None` for a request without a Host to redirect to.
fn https_location(head: &RequestHead) -> Option<Vec<u8>> {
    let host = host_without_port(head.host()?);
    let mut location = Vec::with_capacity(32 + host.len() + head.path().len());
    location.extend_from_slice(b"location: https://");
    location.extend_from_slice(host);
    location.extend_from_slice(head.path());
    location.extend_from_slice(b"\r\n");
    Some(location)
}
