//! Clocks as plain nanoseconds: `CLOCK_MONOTONIC` (what `Instant` reads) for the request
//! path's own bookkeeping, where an `Instant`'s seconds-and-nanoseconds subtraction costs about
//! a hundred instructions and a `u64`'s one; and the thread's CPU time. rustix reads both
//! without libc (the monotonic clock through the vDSO), and neither can fail on Linux.

use rustix::time::{ClockId, Timespec, clock_gettime};

/// Nanoseconds on `CLOCK_MONOTONIC`.
#[inline]
pub fn monotonic_ns() -> u64 {
    nanos(clock_gettime(ClockId::Monotonic))
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) in nanoseconds. A system call,
/// not a vDSO read: for once-a-window bookkeeping, not per request.
pub fn thread_cpu_ns() -> u64 {
    nanos(clock_gettime(ClockId::ThreadCPUTime))
}

#[inline]
fn nanos(t: Timespec) -> u64 {
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}
