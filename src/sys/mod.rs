//! What pinlb asks of the operating system, below everything else: cores and pinning, child
//! processes, the threads' runtimes and the thread-local executor, systemd's readiness protocol and
//! the kernel's limits.
//!
//! - [`limits`]: the kernel's listen backlog ceiling and the open file limit, raised at start.
//! - [`cpus`]: core lists, the process's allowed cores, and thread pinning.
//! - [`runtime`]: the threads' single-threaded tokio runtimes, pinned to a core first.
//! - [`child`]: child processes pinned to their cores before they run, killed when pinlb dies.
//! - [`exec`]: the executor that runs hyper's HTTP/2 tasks on the worker's own thread.
//! - [`notify`]: systemd's readiness protocol (`READY`, `RELOADING`, `STOPPING`, `MAINPID`) on
//!   `$NOTIFY_SOCKET`, when it is set.

pub mod limits;
pub mod child;
pub mod cpus;
pub(crate) mod exec;
pub(crate) mod notify;
pub(crate) mod runtime;
