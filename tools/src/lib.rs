//! pinlb's commands beside `serve`: they use the proxy's parts (the codec, `sys`, the
//! configuration, a `Server`), and nothing of the proxy uses them.
//!
//! - [`import`]: `pinlb import`: an nginx configuration as a pinlb one, with notes on what has no
//!   equivalent.
//! - [`coremap`]: `check`'s per-core map, and the processes serving each backend found in `/proc`.
//! - [`fairness`]: what would make a bench unfair (shared or busy cores, a debug build, no
//!   keep-alive, SMT siblings, the governor, local ports), warned about before `bench`, `sweep`
//!   and `demo` run.
//! - [`launch`]: the pinned children `sweep` and `bench --proxy` start, awaited and stopped.
//! - [`peers`]: the proxies `sweep --proxy` and `bench --proxy` run (pinlb, nginx, HAProxy) and
//!   their equivalent configurations.
//! - [`features`]: `check`'s lines for what each listener, route and upstream does besides
//!   routing (limits, access, compression, header rules, timeouts, error pages, buffering).
//! - [`check`]: what `pinlb check` prints: the resolved plan, the core map, the verdict.
//! - [`bench`](mod@bench): `pinlb bench`, a pinned load generator comparing targets in
//!   interleaved rounds.
//! - [`sweep`]: `pinlb sweep`, every split of the cores between proxy and backends, benched.
//! - [`backend`]: `pinlb backend`, pinned hello-world test servers with a WebSocket echo.
//! - [`demo`]: `pinlb demo`, the embedded default: backends, proxy and bench in one process.

pub mod backend;
pub mod bench;
pub mod check;
pub mod coremap;
pub mod demo;
pub mod fairness;
mod features;
pub mod launch;
pub mod peers;
pub mod sweep;
