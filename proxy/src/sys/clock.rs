//! Clocks as plain nanoseconds: `CLOCK_MONOTONIC` (what `Instant` reads) for the request
//! path's own bookkeeping, where an `Instant`'s seconds-and-nanoseconds subtraction costs about
//! a hundred instructions and a `u64`'s one; and the thread's CPU time. Through libc (nix), as
//! `Instant` reads: rustix's own vDSO reader crashed pinlb under valgrind, which
//! `benches/callgrind.sh` needs.

use nix::time::{ClockId, clock_gettime};

/// Nanoseconds on `CLOCK_MONOTONIC`; 0 only if the clock cannot be read.
#[inline]
pub fn monotonic_ns() -> u64 {
    read(ClockId::CLOCK_MONOTONIC)
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) in nanoseconds; 0 if it cannot be
/// read. A system call, not a vDSO read: for once-a-window bookkeeping, not per request.
pub fn thread_cpu_ns() -> u64 {
    read(ClockId::CLOCK_THREAD_CPUTIME_ID)
}

#[inline]
fn read(clock: ClockId) -> u64 {
    clock_gettime(clock).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    })
}
