//! TLS on rustls, both roles. In this folder (as in `http1/`) *server* and *client* name the role
//! pinlb plays in the handshake: the server side is downstream, the client side upstream.
//!
//! - [`cert_error`]: why a certificate, key, CA or CRL file could not be used.
//! - [`client_auth`]: client certificates on a listener: the CAs, the CRLs, the rustls
//!   verifier, the header names.
//! - [`client_identity`]: what a connection learned of its client's certificate (subject,
//!   SANs, serial), in nginx's variables' forms.
//! - [`server`]: a listener's certificates (PEM chains and keys, checked against each other),
//!   which one a handshake gets (SNI, a default), and the rustls configuration around them.
//! - [`client_hello`]: a client's ClientHello read without answering it: the server name and
//!   ALPN a TCP listener routes by (`ssl_preread`).
//! - [`client`]: TLS to backends: an upstream's CA certificates (a file or the system's), the
//!   name verified, a client certificate, a session cache per backend, the handshake.

pub(crate) mod cert_error;
pub mod client;
pub(crate) mod client_auth;
pub mod client_hello;
pub(crate) mod client_identity;
pub mod server;
