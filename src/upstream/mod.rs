//! The backend side: backends' state shared by workers (atomics, no lock), how one is picked,
//! whether it is healthy, and each worker's connections to it.
//!
//! - [`balance`]: selection as pure functions: smooth weighted round robin, least_conn, two
//!   random choices, consistent (rendezvous) hashing.
//! - [`health`]: active-check rise/fall, passive failure accounting (max_fails/fail_timeout)
//!   and slow start, as pure state machines.
//! - [`stats`]: the counters the request path bumps (atomics, no lock).
//! - [`hash_key`]: what a `hash` upstream hashes for a request: client address, URI, header,
//!   cookie.
//! - [`h2`]: HTTP/2 to backends (`protocol = "h2c"`): hyper's client on connections each worker
//!   multiplexes.
//! - [`pool`]: backend state shared by workers and each worker's view of an upstream.
//! - [`probe`]: active health checks, run on the control thread.
//! - [`discovery`]: backends' DNS names (A/AAAA, SRV) looked up with hickory-resolver.

pub mod balance;
pub mod discovery;
pub(crate) mod h2;
pub(crate) mod hash_key;
pub(crate) mod health;
pub(crate) mod pool;
pub(crate) mod probe;
pub(crate) mod stats;
