//! pinlb: a pinned, TOML-configured HTTP/1.1 reverse proxy and load balancer.
//!
//! # Layout
//!
//! Data flows one way: config → validated plan → workers on cores → per-request path.
//!
//! - [`config`]: the TOML file, raw types and validation into a [`Config`]; errors carry
//!   `file:line:col` and the key.
//! - [`cpus`]: core lists, the process's allowed cores, and thread pinning.
//! - [`coremap`]: `check`'s per-core map, and the processes serving each backend found in `/proc`.
//! - [`check`]: what `pinlb check` prints: the resolved plan, the core map, the verdict.
//! - [`balance`]: backend selection (smooth weighted round robin, least_conn) as pure functions.
//! - [`upstream`]: backend state shared by workers (atomics) and each worker's own pool.
//! - [`health`]: whether a backend may be picked: active checks (rise/fall), passive failure
//!   accounting (max_fails/fail_timeout) and slow start, as pure state machines, plus the probe
//!   loop that runs on the control thread.
//! - [`downstream`]: the client side of HTTP/1.1: parsing and validating request heads, reading
//!   request bodies, writing responses; one task per connection.
//! - [`h1`]: the backend side of HTTP/1.1: request writing, response head parsing and body
//!   framing on pooled connections.
//! - [`proxy`]: the request path: rewrite headers, pick, forward (retrying by nginx's
//!   `proxy_next_upstream` rules), stream back, map errors to 502/503/504.
//! - [`idle`]: a worker's open client connections: one sweeper closes the idle ones, makes room
//!   at `max_connections` and drains them for a stop; no timer per connection.
//! - [`server`]: binding `SO_REUSEPORT` sockets and running one pinned single-threaded runtime per
//!   core, with graceful shutdown; each worker follows the running configuration generation.
//! - [`reload`]: hot reload (SIGHUP, `POST /reload`): validate, bind new listeners, hand every
//!   worker a new generation that keeps the state of the backends that stay.
//! - [`metrics`]: the counters the request path bumps (atomics, no lock) and their Prometheus
//!   rendering.
//! - [`admin`]: the admin listener: `/metrics`, `/status`, the status page, drain/disable/enable,
//!   `/reload`.
//! - [`accesslog`]: the access log, formatted and written by its own thread.
//! - [`backend`]: `pinlb backend`, pinned hello-world test servers, one per core.
//! - [`demo`]: `pinlb demo`, the embedded default: backends, proxy and bench in one process,
//!   laid out on the allowed cores.
//! - [`bench`](mod@bench): `pinlb bench`, a pinned load generator that compares targets in
//!   interleaved rounds: HDR latency percentiles, errors by kind, each target's overhead over the
//!   first.
//!
//! A test (or an embedding program) binds first, reads the ports, then runs:
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = pinlb::Config::load("config/pinlb.toml".as_ref())?;
//! let server = pinlb::Server::bind(config)?;
//! println!("listening on {:?}", server.local_addrs());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; })?;
//! # Ok(()) }
//! ```

pub mod accesslog;
pub mod admin;
pub mod backend;
pub mod balance;
pub mod bench;
pub mod check;
pub mod config;
pub mod coremap;
pub mod cpus;
pub mod demo;
pub mod downstream;
pub mod h1;
pub mod health;
pub mod idle;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod server;
pub mod upstream;

pub use config::{Config, ConfigError};
pub use server::{Server, ServerError};
