//! `request_headers`: what changes in a request's header lines on the way to a backend
//! (nginx's `proxy_set_header`, `proxy_hide_header` for requests): the rules of
//! [`header_rules`](super::header_rules), rendered for each proxied request.
//!
//! On a listener or a route (a route's own replace the listener's whole); in a route that
//! answers itself (`respond`, `redirect`) it is refused, since nothing goes anywhere from it.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::header_rules::{self, HeaderRules};
use super::{Module, NoFilter, Place};
use crate::syntax::error::ConfigError;
use crate::syntax::template::Request;

/// The module.
pub(crate) enum RequestHeaders {}

/// Its key as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub request_headers: Option<Spanned<header_rules::Raw>>,
}

impl Raw {
    /// Where the key is written, when it is.
    pub(crate) fn span(&self) -> Option<Range<usize>> {
        self.request_headers.as_ref().map(Spanned::span)
    }
}

impl Module for RequestHeaders {
    const KEYS: &'static [&'static str] = &["request_headers"];
    type Raw = Raw;
    type Config = HeaderRules;
    type Local = ();
    type Filter = NoFilter;
    const FORWARD: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<HeaderRules>>,
    ) -> Result<Option<Arc<HeaderRules>>, ConfigError> {
        let key = format!("{}.request_headers", at.key);
        header_rules::resolve(at.src, &key, raw.request_headers.as_ref(), inherited)
    }

    fn forward(rules: &Arc<HeaderRules>, request: &Request<'_>, lines: &mut Option<Vec<u8>>) {
        let edited = rules.apply(lines.as_deref().unwrap_or(request.head.lines()), request);
        *lines = Some(edited);
    }

    /// `request_headers: set x-real-ip: {client_ip}; remove x-debug`.
    fn describe(rules: &HeaderRules) -> String {
        format!("request headers: {}", rules.describe())
    }
}
