//! `CLOCK_MONOTONIC` (what `Instant` reads) as plain nanoseconds, for the request path's own
//! bookkeeping: an `Instant`'s seconds-and-nanoseconds subtraction costs about a hundred
//! instructions, a `u64`'s one.

/// Nanoseconds on `CLOCK_MONOTONIC`; 0 only if the clock cannot be read.
pub fn monotonic_ns() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    })
}
