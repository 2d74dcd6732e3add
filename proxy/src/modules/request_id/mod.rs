//! `[request_id]`, nginx's `$request_id`: an ID for every request, passed to the backend,
//! returned to the client and written to the access log, with the W3C trace context beside it.
//! Its table is the file's own (`[request_id]`), not a listener's: every listener's requests
//! get their IDs alike. This file has its keys and their validation; the request path makes
//! each request's ID at its head (`downstream::pipeline::begin`), sends its lines with the
//! request (`proxy::forward`), adds the ID to the response and gives it to the log.
//!
//! - [`id`]: one request's ID and trace id, and the lines pinlb writes for them.

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};

pub(crate) mod id;

/// `[request_id]` as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub enabled: Option<Spanned<bool>>,
    pub header: Option<Spanned<String>>,
    pub traceparent: Option<Spanned<bool>>,
}

/// `[request_id]`: an ID for every request, in the log and on both sides' headers, and the W3C
/// trace context.
///
/// The ID a client sends is kept when it is valid (1 to 200 characters of letters, digits and
/// `-_.:/+=@`: what UUIDs, ULIDs, nginx's hex and base64 IDs are made of, and nothing that could
/// break a header or a log line); otherwise one is made: 32 lower-case hex digits of 128 random
/// bits, nginx's `$request_id` form, so that tools that read nginx's IDs read pinlb's, and
/// exactly a W3C trace id's size, so that a traceparent pinlb starts carries the same ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestIds {
    /// The header, lower-case (`header`, default `x-request-id`).
    pub header: String,
    /// `traceparent = true`: a request without a valid W3C `traceparent` gets one, started with
    /// the request ID as its trace id; one the client sent is always passed on unchanged.
    pub traceparent: bool,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds {
            header: "x-request-id".into(),
            traceparent: false,
        }
    }
}

/// `[request_id]`: on by default while the access log is (`logging`), so that a line can be
/// matched to the backend's by its ID; `None`: off.
pub(crate) fn validate(
    src: &Source,
    raw: Option<&Raw>,
    logging: bool,
) -> Result<Option<RequestIds>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(logging.then(RequestIds::default));
    };
    let mut ids = RequestIds::default();
    if let Some(h) = &raw.header {
        let name = h.get_ref();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(src.at(
                h.span(),
                "request_id.header",
                format!("\"{name}\" is not a header name, expected one such as X-Request-ID"),
            ));
        }
        ids.header = name.to_ascii_lowercase();
    }
    ids.traceparent = raw.traceparent.as_ref().is_some_and(|v| *v.get_ref());
    let enabled = raw.enabled.as_ref().map_or(logging, |v| *v.get_ref());
    Ok(enabled.then_some(ids))
}
