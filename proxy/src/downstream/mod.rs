//! The client side: one worker's client connections, from the accepted socket to the response
//! written.
//!
//! - [`idle`]: a worker's open client connections: one sweeper closes the idle ones, makes room
//!   at `max_connections` and drains them for a stop; no timer per connection.
//! - [`stream`]: a client connection's socket, plain or TLS (rustls driven by hand), and the
//!   handshake.
//! - [`splice`]: one direction of a tunnel moved by `splice(2)` through a pipe, for bulk.
//! - [`tunnel`]: after a `101 Switching Protocols`, bytes relayed both ways until both close.
//! - [`session`]: what the pipeline asks of a protocol (HTTP/1.1's exchange, HTTP/2's stream):
//!   the head, the body, the client's leaving, the answer sent.
//! - [`pipeline`]: a request's exchange from its head to its response, once for every
//!   protocol: begun (ID, log entry), decided (route, edge controls, `redirect_https`),
//!   forwarded, finished (response filters, counted, logged), sent by the session.
//! - [`h2`]: HTTP/2 client connections on hyper's server, each stream sent through the same
//!   request path as an HTTP/1.1 request.
//! - [`h1`]: one HTTP/1.1 client connection's life: read a request, route it, proxy it, write
//!   the response; keep, close, linger or park the connection.
//! - [`proxied`]: a `proxy_protocol` listener's connection: its PROXY protocol header read and
//!   checked, then served as from the client it names.
//! - [`tcp`]: a TCP listener's connection (`mode = "tcp"`): a backend picked and connected,
//!   the bytes relayed both ways by the tunnel, one log line.
//! - [`udp`]: a UDP listener's datagrams (`mode = "udp"`): a session per client address and
//!   port, with a socket of its own connected to one backend.

pub(crate) mod h1;
pub(crate) mod h2;
pub(crate) mod idle;
pub(crate) mod pipeline;
pub(crate) mod proxied;
pub(crate) mod session;
pub(crate) mod splice;
pub(crate) mod stream;
pub(crate) mod tcp;
pub(crate) mod tunnel;
pub(crate) mod udp;
