//! The backend side: backends' state shared by workers (atomics, no lock), how one is picked,
//! whether it is healthy, and each worker's connections to it.
//!
//! - [`balance`]: selection as pure functions: smooth weighted round robin, least_conn, two
//!   random choices, consistent (rendezvous) hashing.
//! - [`health`]: active-check rise/fall, passive failure accounting (max_fails/fail_timeout)
//!   and slow start, as pure state machines.
//! - [`counters`]: the counters the request path bumps, per backend and per listener (atomics).
//! - [`queue`]: the upstream's queue for backends at their limits, woken across workers (the
//!   one lock, taken only while requests wait).
//! - [`adaptive`]: each backend's learned concurrency limit: the controller as a pure
//!   function, and its shared state (atomics).
//! - [`connecting`]: connects in progress to one backend, and their bound.
//! - [`backend`]: one backend's shared state: settings, health, failures, in-flight count,
//!   slow start, response-time average, admin state.
//! - [`outlier`]: ejection by answers: 5xx in a row, or a success rate well below the pool's.
//! - [`shared`]: an upstream as every worker sees it in one generation, and its passive rules.
//! - [`retry_budget`]: one worker's budget of retries on a status: a share of its requests.
//! - [`in_flight`]: the guard that counts a request against its backend and records the
//!   request's outcome there.
//! - [`pick`]: which backend a request goes to, by the upstream's algorithm.
//! - [`hash_key`]: what a `hash` upstream hashes for a request: client address, URI, header,
//!   cookie.
//! - [`proxy_header`]: the PROXY protocol header an upstream with `proxy_protocol` writes first
//!   on each backend connection, and which pooled connections a request may take.
//! - [`h2`]: HTTP/2 to backends (`protocol = "h2c"`): hyper's client on connections each worker
//!   multiplexes.
//! - [`local`]: one worker's view of an upstream: its selection state, its pool of idle
//!   HTTP/1.1 connections, and its HTTP/2 connections.
//! - [`probe_fastcgi`]: a FastCGI upstream's health check, a FastCGI request for the path.
//! - [`probe`]: active health checks, run on the control thread.
//! - [`discovery`]: backends' DNS names (A/AAAA, SRV) looked up with hickory-resolver.

pub mod adaptive;
pub(crate) mod backend;
pub mod balance;
pub(crate) mod connecting;
pub(crate) mod counters;
pub mod discovery;
pub(crate) mod h2;
pub(crate) mod hash_key;
pub(crate) mod health;
pub(crate) mod in_flight;
pub(crate) mod local;
pub(crate) mod outlier;
pub(crate) mod pick;
pub(crate) mod probe;
pub(crate) mod probe_fastcgi;
pub(crate) mod proxy_header;
pub(crate) mod queue;
pub(crate) mod retry_budget;
pub(crate) mod shared;
