//! pinlb: a pinned, TOML-configured reverse proxy and load balancer for HTTP/1.1, HTTP/2, TLS
//! and WebSocket. This crate is the proxy; its commands beside `serve` (`check`'s report,
//! `bench`, `sweep`, `backend`, `demo`) are the `pinlb-tools` crate's, `import` is
//! `pinlb-import`'s, and the `pinlb` binary (the workspace's root package) parses the command line.
//!
//! # Layout
//!
//! A request meets the folders in this order: the configuration is read and validated into a
//! plan (`config`); the process binds its listeners and starts one pinned single-threaded
//! runtime per core (`process`); a worker accepts a client connection and reads its requests
//! (`downstream`); each request gets its route (`route`) and is proxied (`proxy`) to a backend
//! that `upstream` picks, over pinlb's HTTP/1.1 codec (`http1`) or hyper's HTTP/2, plain or TLS
//! (`tls`). Beside the workers, the control thread (`control`) serves the admin listener and
//! follows spawned processes and DNS names; `server` starts both.
//!
//! Downstream is always the client side and upstream the backend side. Inside the codecs
//! (`http1`, `tls`) *client* and *server* name the role pinlb plays in that protocol.
//!
//! Imports run one way, up this list: each folder uses only folders listed before it, and each
//! folder's own list (its `mod.rs`) is in the same order (`tests/layout.rs` checks both).
//! `config` sits above the codecs because it validates into their types (TLS files, header
//! tables, path forms); the codecs take their limits as arguments and import no configuration.
//!
//! - [`sys`]: cores and pinning, pinned runtimes and child processes, the local executor, systemd
//!   notify.
//! - [`backend_address`]: a backend's address, TCP or a Unix socket's path, as parsed and shown.
//! - [`tls`]: rustls for listeners (the server role) and for backends (the client role).
//! - [`http1`]: the HTTP/1.1 codec on httparse: framing, request heads, the backend side.
//! - [`fastcgi`]: the FastCGI codec: records, the request's CGI params, the CGI response head.
//! - [`proxy_protocol`]: the PROXY protocol's header (v1, v2): framed, parsed and built.
//! - [`syntax`]: the configuration file's errors (`file:line:col`) and shared value types.
//! - [`modules`]: features as modules: each one's keys, configuration and body filter, and the
//!   registry.
//! - [`config`]: the TOML file validated into a [`Config`]; errors carry `file:line:col`.
//! - [`upstream`]: backend state, selection, health, probes, counters, discovery, pools.
//! - [`proxy`]: the retry loop, forwarding, both bodies, local replies, the access log.
//! - [`edge`]: the edge controls' assembly: the process's limit tables, and each route's
//!   controls compiled from the `rate_limit` module.
//! - [`route`]: the compiled route table and each request's decision.
//! - [`downstream`]: client connections: HTTP/1.1 and HTTP/2 sessions, streams, tunnels.
//! - [`process`]: shared state and admission, listeners, pinned workers, reload, handover.
//! - [`control`]: the admin listener, metrics, status, spawned backends' supervisor, DNS.
//! - [`server`]: binding everything, starting workers and the control thread, the stop.
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

pub mod backend_address;
pub mod config;
pub(crate) mod control;
pub(crate) mod downstream;
pub(crate) mod edge;
pub mod fastcgi;
pub mod http1;
pub mod modules;
pub mod process;
pub(crate) mod proxy;
pub mod proxy_protocol;
pub(crate) mod route;
pub mod server;
pub mod syntax;
pub mod sys;
pub mod tls;
pub mod upstream;

pub use config::{Config, ConfigError, ConfigErrors};
pub use server::{Server, ServerError};
