//! The control thread's work beside the workers: the admin listener, what it shows, and the
//! processes and names it follows.
//!
//! - [`metrics`]: the Prometheus rendering of every counter and backend state.
//! - [`status`]: what `/status` and the status page show, and the last minute the counters
//!   don't keep (latency percentiles, time in a state, request and error rates), sampled every
//!   second.
//! - [`admin`]: the admin listener (on hyper): `/metrics`, `/status`, the status page,
//!   drain/disable/enable, `/reload`.
//! - [`dns_refresh`]: names looked up again as their TTLs run out, and a changed answer
//!   published as a new generation (as a reload does).
//! - [`supervisor`]: `[upstream.NAME.spawn]`'s processes: started pinned, added to the pool
//!   once they answer, restarted with backoff, rolled one at a time on a reload.

pub(crate) mod admin;
pub(crate) mod dns_refresh;
pub(crate) mod metrics;
pub(crate) mod status;
pub(crate) mod supervisor;
