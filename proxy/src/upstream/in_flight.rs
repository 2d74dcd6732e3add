//! The in-flight guard: one request counted against one backend for as long as it lives, and
//! the place where that request's outcome is recorded (passive health, the EWMA, counters), as
//! tower's load handle records its own latency; the proxy's retry loop only decides.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use tracing::info;

use crate::http1::client::ConnectFailure;
use crate::sys::clock::monotonic_ns;
use crate::upstream::adaptive::Fall;
use crate::upstream::backend::BackendState;
use crate::upstream::counters::ErrorKind;
use crate::upstream::outlier::Pool;
use crate::upstream::shared::SharedUpstream;

/// Counts one request against a backend's `in_flight` for as long as it lives.
///
/// It travels with the response body and is dropped when the body ends or the client goes away,
/// so errors, timeouts and cancelled clients can never leak a count.
#[derive(Debug)]
pub struct InFlight {
    pub(super) state: Arc<BackendState>,
    /// This request is the one trial a skipped backend gets after `fail_timeout`.
    pub(super) trial: bool,
    /// While it counts against the backend's learned limit (until its response head comes):
    /// when it was picked, on [`monotonic_ns`]'s clock; 0 otherwise.
    sent_ns: AtomicU64,
}

impl InFlight {
    /// The address of the backend this request counts against.
    pub fn address(&self) -> crate::backend_address::BackendAddress {
        self.state.address
    }

    /// Counts a request against `b`, unless that would exceed its `max_conns` or its learned
    /// limit. The increment comes first, so two workers racing for the last slot cannot both
    /// get it.
    pub(super) fn acquire(b: &Arc<BackendState>) -> Option<Self> {
        let before = b.in_flight.fetch_add(1, Ordering::Relaxed);
        let mut guard = InFlight {
            state: b.clone(),
            trial: false,
            sent_ns: AtomicU64::new(0),
        };
        let max = b.max_conns.load(Ordering::Relaxed);
        if max != 0 && before >= max {
            return None;
        }
        // Timed from the pick, which comes right before the request is sent.
        if b.limiter.enter()? {
            *guard.sent_ns.get_mut() = monotonic_ns().max(1);
        }
        Some(guard)
    }

    /// Records the backend's response to this request: a status in `fail_on_status` counts as
    /// a passive failure, any other as a success (the trial's brings a skipped backend back);
    /// `ewma` takes the time since `sent`; the learned limit the time since the pick (a
    /// `101`'s is no answer's time), and the place it held there is free now; `/metrics`
    /// counts the status and the time since `started`, the request's first attempt. Returns
    /// the instant the clock was read at, when `/metrics` or `timed` (the request's spans are
    /// wanted) read it.
    #[inline(always)]
    pub fn answered(
        &self,
        upstream: &SharedUpstream,
        status: StatusCode,
        sent: Option<Instant>,
        started: Instant,
        timed: bool,
    ) -> Option<Instant> {
        let state = &*self.state;
        if upstream
            .config
            .passive
            .fail_on_status
            .contains(status.as_u16())
        {
            upstream.record_failure(state);
        } else {
            upstream.record_success(state, self.trial);
        }
        if let Some(outlier) = &upstream.outlier {
            let (name, backends) = (&upstream.config.name, &upstream.backends);
            let pool = Pool {
                name,
                backends,
                counting: upstream.counting,
            };
            outlier.answered(&pool, state, status.as_u16());
        }
        if let Some(sent) = sent {
            state.observe_response_time(sent.elapsed(), upstream.config.ewma_decay);
        }
        let sent_ns = self.sent_ns.load(Ordering::Relaxed);
        if sent_ns != 0 {
            self.sent_ns.store(0, Ordering::Relaxed);
            let sample = (status != StatusCode::SWITCHING_PROTOCOLS).then(|| {
                let now = monotonic_ns();
                (now.saturating_sub(sent_ns), now)
            });
            if let Some(fall) = state.limiter.headed(sample) {
                log_fall(upstream, state, fall);
            }
            if let Some(queue) = state.queue.get() {
                queue.slot_freed();
            }
        }
        // The clock is read only when something uses it.
        let now = (upstream.counting || timed).then(Instant::now);
        if let (true, Some(now)) = (upstream.counting, now) {
            state.stats.response(status.as_u16());
            state
                .stats
                .response_time
                .observe(now.saturating_duration_since(started));
        }
        now
    }

    /// Records a TCP listener's connect to this backend: a success for the passive checks (the
    /// trial's brings a skipped backend back). Its place under the learned limit is free from
    /// now on, as a tunnel's after its `101`: a relayed connection awaits no answer, and its
    /// length is no sample. It counts in flight (least_conn, `max_conns`) until it closes.
    pub fn connected(&self, upstream: &SharedUpstream) {
        let state = &*self.state;
        upstream.record_success(state, self.trial);
        if self.sent_ns.swap(0, Ordering::Relaxed) != 0 {
            if let Some(fall) = state.limiter.headed(None) {
                log_fall(upstream, state, fall);
            }
            if let Some(queue) = state.queue.get() {
                queue.slot_freed();
            }
        }
    }

    /// Records, for `/metrics`, the proxy's own share of a request this backend answered
    /// (`pinlb_proxy_added_seconds`).
    #[inline]
    pub fn proxied(&self, upstream: &SharedUpstream, proxy: Duration) {
        if upstream.counting {
            self.state.stats.proxy_added.observe(proxy);
        }
    }

    /// Records a failed attempt: `/metrics` counts its kind, the passive checks a failure.
    pub fn failed(&self, upstream: &SharedUpstream, kind: ErrorKind) {
        if upstream.counting {
            self.state.stats.error(kind);
        }
        upstream.record_failure(&self.state);
    }

    /// Records a failed connect: `/metrics` counts it, and the passive checks count it
    /// against the backend unless it says nothing about the backend: pinlb's own side ran out,
    /// or the backend is busy ([`ConnectFailure::Busy`]: its accept queue was full while it
    /// took other connections). Counting those would skip every busy backend of a pool at
    /// once. A dead host takes no connections and a closed port refuses: both still count.
    /// Returns why the failure was not counted, for the log line.
    pub fn connect_failed(
        &self,
        upstream: &SharedUpstream,
        kind: ConnectFailure,
    ) -> Option<&'static str> {
        // pinlb's own shortage is no error of the backend's, in `/metrics` either.
        if upstream.counting && kind != ConnectFailure::Local {
            self.state.stats.error(ErrorKind::Connect);
        }
        let excuse = match kind {
            ConnectFailure::Backend | ConnectFailure::TimedOut => None,
            ConnectFailure::Local => Some("not counted against the backend"),
            ConnectFailure::Busy => Some("the backend is busy, not down: not counted as a failure"),
        };
        if excuse.is_none() {
            upstream.record_failure(&self.state);
        }
        excuse
    }

    /// Records that the request moves on to another backend after failing on this one.
    pub fn retried(&self, upstream: &SharedUpstream) {
        if upstream.counting {
            self.state.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Says why a backend's learned limit fell by half or more. At `info`: the limit doing its job
/// (the backend's answers slowed as requests queued in it), not a fault; a connect that fails
/// or times out is the `warn` (`upstream::local`).
#[cold]
#[inline(never)]
fn log_fall(upstream: &SharedUpstream, b: &BackendState, fall: Fall) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    info!(
        upstream = %upstream.config.name,
        "backend {}: concurrency limit {} -> {}: its answers took {:.2} ms (median) with up \
         to {} requests in flight, against {:.2} ms without queueing",
        b.address,
        fall.from,
        fall.to,
        ms(fall.time),
        fall.peak,
        ms(fall.min_rtt)
    );
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let state = &*self.state;
        state.in_flight.fetch_sub(1, Ordering::Relaxed);
        let awaiting = *self.sent_ns.get_mut() != 0;
        if awaiting {
            // It ended without a head: failed, timed out, or its client left.
            state.limiter.headed(None);
        }
        // The slot this request held goes to the first request waiting, if any.
        if let (true, Some(queue)) = (awaiting || state.has_max_conns(), state.queue.get()) {
            queue.slot_freed();
        }
    }
}
