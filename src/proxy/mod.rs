//! The request path between a decided route and a backend: pick, forward (retrying by nginx's
//! `proxy_next_upstream` rules), stream back, map errors to 502/503/504; and the access log.
//!
//! - [`accesslog`]: the access log, formatted and written by its own thread.
//! - [`forward`]: the retry loop and one attempt's exchange.

pub(crate) mod accesslog;
pub(crate) mod forward;
