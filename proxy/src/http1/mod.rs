//! pinlb's own HTTP/1.1 codec, on `httparse`, for both sides of the proxy. Split by role, as
//! Pingora's `protocols/http/v1`:
//!
//! - [`name`]: header names compared with the ones pinlb knows, ignoring case.
//! - [`hop`]: the hop-by-hop header table.
//! - [`path`]: the normalised form of a request path that routes match (dot segments, escapes,
//!   repeated slashes).
//! - [`common`]: what both sides share: the hop-by-hop table, Connection tokens,
//!   Content-Length, status and chunk-size lines, error pages; one of each.
//! - [`body`]: body framing and the decoder both sides read bodies with.
//! - [`request`]: request heads from clients: parsing and validation, pure (fuzzed).
//! - [`timer`]: a connection's timer for its waits, moved only when it would fire too late.
//! - [`client`]: the backend side: writing requests and reading responses on pooled connections.
//!
//! In this folder *client* names the role pinlb plays: the backend side. The client-facing
//! session (sockets, timeouts, the connection's life) is `downstream::h1`.

pub mod body;
pub mod client;
pub mod common;
pub mod hop;
pub mod name;
pub mod path;
pub mod request;
pub mod timer;
