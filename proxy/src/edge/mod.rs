//! The edge controls' assembly: what the `rate_limit` and `conn_limit` modules
//! (`modules::rate_limit`, `modules::conn_limit`) need from the process and the configuration
//! around them, decided before the proxy sees a request.
//!
//! - [`tables`]: the process's tables, kept across reloads that keep them, and their counters.
//! - [`controls`]: a listener's or a route's controls, compiled once per generation, and their
//!   check for each request.

pub(crate) mod controls;
pub(crate) mod tables;
