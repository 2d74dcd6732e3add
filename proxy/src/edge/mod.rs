//! The edge controls: who may send a listener's requests, and how many, decided before the
//! proxy sees a request.
//!
//! - [`rate`]: a rate zone's table of keys, shared by every worker (GCRA, no lock).
//! - [`conn_limit`]: open connections per client address, shared by every worker.
//! - [`tables`]: the process's tables, kept across reloads that keep them, and their counters.
//! - [`rate_limit`]: a route's `rate_limit` checked for each request, and its answer.
//! - [`controls`]: a listener's or a route's controls, compiled once per generation, and their
//!   check for each request.

pub(crate) mod conn_limit;
pub(crate) mod controls;
pub(crate) mod rate;
pub(crate) mod rate_limit;
pub(crate) mod tables;
