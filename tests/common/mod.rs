//! Shared helpers for the integration tests: real backends, real clients, the proxy run in
//! process (library) or as the `pinlb` binary.
//!
//! Everything talks real TCP on `127.0.0.1` with kernel-chosen ports, so tests can run in
//! parallel without sharing anything.
//!
//! # Layout
//!
//! - [`config`]: the cores a test may use, [`Setup`] (the TOML a test proxy runs with), config
//!   files;
//! - [`proxy`]: pinlb in process ([`Proxy`]), its admin listener and metrics;
//! - [`process`]: pinlb as the binary ([`BinProxy`]), and the threads of a process ([`threads`]);
//! - [`backend`]: hyper test backends ([`Backend`]) and a refusing port ([`Refusing`]);
//! - [`raw_backend`]: backends that speak HTTP by hand ([`RawServer`], [`raw_backend`]);
//! - [`client`]: the shared HTTP client ([`Conn`], [`get`]), and the same over HTTP/1.1, h2c
//!   and HTTP/2 over TLS ([`Client`], [`Proto`], [`each_proto!`]);
//! - [`nginx`]: nginx as a peer ([`nginx::Nginx`]);
//! - [`log`]: access-log files and their lines ([`with_log`], [`lines_after`], [`LogLine`]);
//! - [`raw_client`]: the shared raw client, byte by byte ([`RawConn`], [`raw_request`],
//!   [`read_response`]);
//! - [`body`]: request and response bodies ([`GenBody`], [`count_body`]);
//! - [`wait`]: bounded waits ([`WAIT`], [`poll`], [`settle`]);
//! - [`framing`]: the framing invariant, shared with the fuzz target;
//! - [`pki`]: certificates made in the test ([`Pki`]);
//! - [`tls_server`]: `openssl s_server` as a TLS backend ([`TlsServer`]);
//! - [`dns`]: a DNS server on loopback whose records the test changes ([`dns::DnsServer`]);
//! - [`echo`]: TCP and UDP echo backends ([`echo::tcp_echo`], [`echo::udp_echo`]) and a
//!   round trip through one ([`echo::echoed`]);
//! - [`h2frames`]: HTTP/2 frames by hand ([`h2frames::H2Conn`], [`h2frames::Hpack`]).

// Each test file (`proxy.rs`, `cli.rs`) uses a different part of this module.
#![allow(dead_code)]

pub mod backend;
pub mod body;
pub mod client;
pub mod config;
pub mod dns;
pub mod echo;
pub mod framing;
pub mod h2frames;
pub mod log;
pub mod nginx;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod raw_backend;
pub mod raw_client;
pub mod tls_server;
pub mod wait;

// Flat re-exports, so a test says `use common::*;`. Each test file uses only some of them.
#[allow(unused_imports)]
pub use {
    backend::*, body::*, client::*, config::*, echo::*, log::*, pki::*, process::*, proxy::*,
    raw_backend::*, raw_client::*, tls_server::*, wait::*,
};
