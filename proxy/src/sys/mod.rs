//! What pinlb asks of the operating system, below everything else: cores and pinning, child
//! processes, the threads' runtimes and the thread-local executor, systemd's readiness protocol,
//! the kernel's limits, and the per-thread log state beneath the request path.
//!
//! - [`clock`]: the monotonic clock as plain nanoseconds, for the request path's bookkeeping.
//! - [`limits`]: the kernel's listen backlog ceiling and the open file limit, raised at start.
//! - [`cpus`]: core lists, the process's allowed cores, and thread pinning.
//! - [`runtime`]: the threads' single-threaded tokio runtimes, pinned to a core first.
//! - [`socket`]: the plain path's socket reads and writes, made without libc's wrappers.
//! - [`head_bufs`]: the thread's spare buffers for request and response heads.
//! - [`recycle`]: memory for a future made again and again (a request's exchange), kept by the
//!   thread between uses.
//! - [`child`]: child processes pinned to their cores before they run, killed when pinlb dies.
//! - [`exec`]: the executor that runs hyper's HTTP/2 tasks on the worker's own thread.
//! - [`summed`]: repeated warnings on the request path summed per second per thread, so an
//!   overload writes a readable log.
//! - [`notify`]: systemd's readiness protocol (`READY`, `RELOADING`, `STOPPING`, `MAINPID`) on
//!   `$NOTIFY_SOCKET`, when it is set.

pub mod child;
pub mod clock;
pub mod cpus;
pub mod exec;
pub(crate) mod head_bufs;
pub mod limits;
pub(crate) mod notify;
pub(crate) mod recycle;
pub mod runtime;
pub(crate) mod socket;
pub(crate) mod summed;
