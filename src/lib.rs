//! pinlb: a pinned, TOML-configured HTTP/1.1 reverse proxy and load balancer.
//!
//! # Layout
//!
//! Data flows one way: config → validated plan → workers on cores → per-request path. Each
//! module below imports only modules listed before it (`tests/layout.rs` checks that no two import
//! each other, directly or round a cycle).
//!
//! - [`cpus`]: core lists, the process's allowed cores, and thread pinning.
//! - [`balance`]: backend selection as pure functions: smooth weighted round robin, least_conn,
//!   two random choices, consistent (rendezvous) hashing.
//! - [`notify`]: systemd's readiness protocol (`READY`, `RELOADING`, `STOPPING`, `MAINPID`) on
//!   `$NOTIFY_SOCKET`, when it is set.
//! - [`child`]: child processes pinned to their cores before they run, killed when pinlb dies.
//! - [`spawn`]: spawned backends as `/status` and `/metrics` see them (pid, port, core, state,
//!   restarts), and the restart backoff.
//! - [`tls`]: a TLS listener's certificates (PEM chains and keys, checked against each other),
//!   which one a handshake gets (SNI, a default), and the rustls configuration around them.
//! - [`tls_client`]: TLS to backends: an upstream's CA certificates (a file or the system's),
//!   the name verified, a client certificate, a session cache per backend, the handshake.
//! - [`hop`]: the hop-by-hop header table.
//! - [`path`]: the normalised form of a request path that routes match (dot segments, escapes,
//!   repeated slashes).
//! - [`config`]: the TOML file, raw types and validation into a [`Config`]; errors carry
//!   `file:line:col` and the key.
//! - [`dns`]: backends' DNS names (A/AAAA, SRV) looked up with hickory-resolver, and a
//!   configuration with each name expanded into the backends its answer gives.
//! - [`coremap`]: `check`'s per-core map, and the processes serving each backend found in `/proc`.
//! - [`import`]: `pinlb import`: an nginx configuration as a pinlb one, with notes on what has no
//!   equivalent.
//! - [`check`]: what `pinlb check` prints: the resolved plan, the core map, the verdict.
//! - [`health`]: whether a backend may be picked: active-check rise/fall, passive failure
//!   accounting (max_fails/fail_timeout) and slow start, as pure state machines.
//! - [`stats`]: the counters the request path bumps (atomics, no lock).
//! - [`http1`]: pinlb's HTTP/1.1 codec: shared rules, body framing, request heads (pure,
//!   fuzzed), and the backend side on pooled connections.
//! - [`hash_key`]: what a `hash` upstream hashes for a request: client address, URI, header, cookie.
//! - [`exec`]: the executor that runs hyper's HTTP/2 tasks on the worker's own thread.
//! - [`http2_backend`]: HTTP/2 to backends (`protocol = "h2c"`): hyper's client on
//!   connections each worker multiplexes, the request's fields and its body's feed.
//! - [`upstream`]: backend state shared by workers (atomics) and each worker's own pool.
//! - [`probe`]: active health checks, run on the control thread.
//! - [`accesslog`]: the access log, formatted and written by its own thread.
//! - [`proxy`]: the request path: rewrite headers, pick, forward (retrying by nginx's
//!   `proxy_next_upstream` rules), stream back, map errors to 502/503/504.
//! - [`tunnel`]: after a `101 Switching Protocols`, relaying bytes both ways between client and
//!   backend, one fixed buffer per direction, until both close or `timeouts.tunnel_idle`.
//! - [`idle`]: a worker's open client connections: one sweeper closes the idle ones, makes room
//!   at `max_connections` and drains them for a stop, and idle ones park; no timer per connection.
//! - [`stream`]: a client connection's socket, plain or TLS (rustls driven by hand on it), and
//!   the TLS handshake.
//! - [`router`]: a listener's routes compiled for matching: by host, then in file order on the
//!   normalised path, method and headers.
//! - [`route`]: where a listener's requests go (its upstream, TLS, h2c) and the rules for its
//!   clients, read anew per request so open connections follow a reload.
//! - [`http2`]: HTTP/2 client connections on hyper's server (ALPN `h2`, or h2c), each stream
//!   translated to the HTTP/1.1 head it stands for and sent through the same request path.
//! - [`connection`]: one client connection's life: read a request, hand it to the proxy, write
//!   the response; keep it, close it, linger or park it.
//! - [`listen`]: binding `SO_REUSEPORT` sockets per listener per worker, and accepting.
//! - [`upgrade`](mod@upgrade): binary upgrade: the running process passes every listening socket
//!   over a unix socket (`SCM_RIGHTS`) to a new one, which serves on them while the old drains.
//! - [`process`]: what the whole process shares: the running configuration generation, the
//!   admission of connections under `max_connections`, and the errors that stop pinlb.
//! - [`worker`]: one pinned single-threaded runtime per core: the accept loops, and following
//!   each new configuration generation.
//! - [`reload`]: hot reload (SIGHUP, `POST /reload`): validate, bind new listeners, hand every
//!   worker a new generation that keeps the state of the backends that stay.
//! - [`dns_watch`]: on the control thread, names looked up again as their TTLs run out, and a
//!   changed answer published as a new generation (as a reload does).
//! - [`supervisor`]: `[upstream.NAME.spawn]`'s processes: started pinned from the control
//!   thread, added to the pool once they answer, restarted with backoff, rolled one at a time
//!   on a reload that changes their table, stopped after the drain.
//! - [`metrics`]: the Prometheus rendering of every counter and backend state.
//! - [`status`]: what `/status` and the status page show, and the last minute the counters
//!   don't keep (latency percentiles, time in a state), sampled every second.
//! - [`admin`]: the admin listener (on hyper): `/metrics`, `/status`, the status page,
//!   drain/disable/enable, `/reload`.
//! - [`server`]: binding everything, starting the workers and the control thread, signals, and
//!   the graceful stop.
//! - [`bench`](mod@bench): `pinlb bench`, a pinned load generator that compares targets in
//!   interleaved rounds: HDR latency percentiles, errors by kind, each target's overhead over the
//!   first.
//! - [`backend`]: `pinlb backend`, pinned hello-world test servers, one per core, with a
//!   WebSocket echo.
//! - [`demo`]: `pinlb demo`, the embedded default: backends, proxy and bench in one process,
//!   laid out on the allowed cores.
//! - [`sweep`]: `pinlb sweep`, every split of the cores between proxy and backends (pinned child
//!   processes), loaded through the bench at every concurrency, and the best split with its margin.
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

#![allow(rustdoc::private_intra_doc_links)]

mod accesslog;
mod admin;
pub mod backend;
pub mod balance;
pub mod bench;
pub mod check;
pub mod child;
pub mod config;
mod connection;
pub mod coremap;
pub mod cpus;
pub mod demo;
pub mod dns;
mod dns_watch;
mod exec;
mod hash_key;
mod health;
mod hop;
mod http1;
mod http2;
mod http2_backend;
mod idle;
pub mod import;
mod listen;
mod metrics;
mod notify;
mod path;
mod probe;
mod process;
mod proxy;
mod reload;
mod route;
mod router;
pub mod server;
pub mod spawn;
mod stats;
mod status;
mod stream;
mod supervisor;
pub mod sweep;
mod tls;
mod tls_client;
mod tunnel;
pub mod upgrade;
mod upstream;
mod worker;

pub use config::{Config, ConfigError};
pub use server::{Server, ServerError};
