//! The request path between a decided route and a backend: pick, forward (retrying by nginx's
//! `proxy_next_upstream` rules), stream back, map errors to 502/503/504; and the access log.
//!
//! - [`downstream`]: the client as the proxy sees it (address, trust, TLS) and its request body.
//! - [`timing`]: where a request's time went, and its `Server-Timing` header.
//! - [`accesslog`]: the access log, formatted and written by its own thread.
//! - [`spool`]: a buffered body's bytes, in memory then in a temporary file, and the channel a
//!   buffered response is read from.
//! - [`fastcgi_body`]: a FastCGI application's response body, streamed off its connection.
//! - [`body`]: a response's body (a backend's, streamed, or pinlb's own) and local replies.
//! - [`error`]: why a request got no backend's answer, and the status each cause maps to.
//! - [`request_body`]: the client's body on its way to a backend, kept for a retry.
//! - [`request_buffering`]: a client's body read whole before a backend is picked.
//! - [`response_buffering`]: a backend's body drained as fast as it comes, for a slow client.
//! - [`attempt`]: one attempt at one backend, HTTP/1.1 or HTTP/2, and how it fails.
//! - [`fastcgi`]: one attempt at a FastCGI backend (php-fpm), and the reply it makes.
//! - [`forward`]: the retry loop: pick, attempt, decide whether to try the next backend.
//! - [`side_request`]: the copies modules send beside a request (`mirror`), never waited for.
//! - [`exchange`]: one request as the client side hands it to the proxy, and the answer.
//! - [`cache`]: a request through its route's cache: a stored answer, or the backend's, stored.
//! - [`handle`]: one request's way to its answer: the cache, the forwarding it takes, a
//!   mirror's kept body.

pub(crate) mod accesslog;
pub(crate) mod attempt;
pub(crate) mod body;
pub(crate) mod cache;
pub(crate) mod downstream;
pub(crate) mod error;
pub(crate) mod exchange;
pub(crate) mod fastcgi;
pub(crate) mod fastcgi_body;
pub(crate) mod forward;
pub(crate) mod handle;
pub(crate) mod request_body;
pub(crate) mod request_buffering;
pub(crate) mod response_buffering;
pub(crate) mod side_request;
pub(crate) mod spool;
pub(crate) mod timing;
