//! The running process: what it shares, its listening sockets, its pinned workers, and how it
//! changes configuration (reload) or binary (handover) without dropping a connection.
//!
//! - [`spawned`]: spawned backends as `/status` and `/metrics` see them, and the restart backoff.
//! - [`listen`]: binding `SO_REUSEPORT` sockets per listener per worker, and accepting.
//! - [`handover`]: binary upgrade: the running process passes every listening socket over a unix
//!   socket (`SCM_RIGHTS`) to a new one, which serves on them while the old drains.
//! - [`changes`]: what a reload changes, one line per setting, for the log and the reply.
//! - [`shared`]: the running configuration generation, the admission of connections under
//!   `max_connections`, and the errors that stop pinlb.
//! - [`worker`]: one pinned single-threaded runtime per core: the accept loops, and following
//!   each new configuration generation.
//! - [`reload`]: hot reload (SIGHUP, `POST /reload`): validate, bind new listeners, hand every
//!   worker a new generation that keeps the state of the backends that stay.

pub(crate) mod changes;
pub mod handover;
pub mod listen;
pub(crate) mod reload;
pub(crate) mod shared;
pub mod spawned;
pub(crate) mod worker;
