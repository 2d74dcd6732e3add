//! The integration tests, as one test binary: each file beside this one is a module of it, so
//! `tests/common` is compiled once and an edit to one file re-links one binary, not 37 (the
//! shape of linkerd's `app/integration`). Run one file's tests with a filter:
//! `scripts/test --test integration proxy::`.
//!
//! Two files stay binaries of their own, for what they watch process-wide:
//! - `backend.rs` reads the cores and CPU time of every `pinlb-be*` thread in its process;
//! - `fuzz_replay.rs` sets a panic hook that fails its replay on a panic anywhere in the process.

mod common;

mod access;
mod admin;
mod balance;
mod bench;
mod browser;
mod buffering;
mod cache;
mod cli;
mod client_cert;
mod compression;
mod corpus;
mod deploy;
mod dns;
mod error_pages;
mod fairness;
mod fastcgi;
mod grpc;
mod health;
mod http2;
mod import;
mod import_stream;
mod layout;
mod limit_rate;
mod limits;
mod mirror;
mod overload;
mod prop;
mod protocols;
mod proxy;
mod proxy_protocol;
mod rate_limit;
mod routes;
mod spawn;
mod sticky;
mod sweep;
mod systemd;
mod tcp;
mod tcp_mariadb;
mod tcp_tls;
mod timing;
mod tls;
mod udp;
mod unix_socket;
mod upgrade;
mod websocket;
