//! The edge controls: who may send a listener's requests, and how many, decided before the
//! proxy sees a request.
//!
//! - [`controls`]: a listener's or a route's controls, compiled once per generation, and their
//!   check for each request.

pub(crate) mod controls;
