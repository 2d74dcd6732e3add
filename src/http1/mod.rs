//! pinlb's own HTTP/1.1 codec, on `httparse`, for both sides of the proxy. Split by role, as
//! Pingora's `protocols/http/v1`:
//!
//! - [`common`]: what both sides share: the hop-by-hop table, Connection tokens,
//!   Content-Length, status and chunk-size lines, error pages; one of each.
//! - [`body`]: body framing and the decoder both sides read bodies with.
//! - [`request`]: request heads from clients: parsing and validation, pure (fuzzed).
//! - [`client`]: the backend side: writing requests and reading responses on pooled connections.
//!
//! The client-facing session (sockets, timeouts, the connection's life) is `connection`.

pub mod body;
pub mod client;
pub mod common;
pub mod request;
