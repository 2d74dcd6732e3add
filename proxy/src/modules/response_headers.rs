//! `response_headers`: what changes in a response's header lines on the way to the client
//! (nginx's `add_header`, `proxy_hide_header`): the rules of
//! [`header_rules`](super::header_rules), rendered for the request it answers.
//!
//! On a listener or a route (a route's own replace the listener's whole). They apply to every
//! response of the requests they are on: a backend's, pinlb's 502/503/504 in its place, a
//! route's own `respond` or `redirect`, and a refusal (as nginx's `add_header … always`, so
//! that security headers such as HSTS are on every answer).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::header_rules::{self, HeaderRules};
use super::{Module, NoFilter, Place, Response};
use crate::syntax::error::ConfigError;

/// The module.
pub(crate) enum ResponseHeaders {}

/// Its key as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub response_headers: Option<Spanned<header_rules::Raw>>,
}

impl Module for ResponseHeaders {
    const KEYS: &'static [&'static str] = &["response_headers"];
    type Raw = Raw;
    type Config = HeaderRules;
    type Local = ();
    type Filter = NoFilter;
    const RESPONSE: bool = true;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<HeaderRules>>,
    ) -> Result<Option<Arc<HeaderRules>>, ConfigError> {
        let key = format!("{}.response_headers", at.key);
        header_rules::resolve(at.src, &key, raw.response_headers.as_ref(), inherited)
    }

    fn response(rules: &Arc<HeaderRules>, response: &mut Response<'_>) {
        *response.headers = rules.apply(response.headers, &response.request);
    }

    /// `response headers: add x-served-by: pinlb`.
    fn describe(rules: &HeaderRules) -> String {
        format!("response headers: {}", rules.describe())
    }
}
