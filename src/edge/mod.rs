//! The edge controls: who may send a listener's requests, and how many, decided before the
//! proxy sees a request.
//!
//! - [`basic_auth`]: HTTP basic auth against htpasswd users, with a cache of credentials
//!   verified recently.
//! - [`access`]: allow/deny rules on the client's address, and `satisfy` with basic auth.
//! - [`controls`]: a listener's or a route's controls, compiled once per generation, and their
//!   check for each request.

pub(crate) mod access;
pub(crate) mod basic_auth;
pub(crate) mod controls;
