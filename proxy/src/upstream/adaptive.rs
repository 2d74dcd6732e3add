//! The adaptive concurrency limit: how many requests one backend may be working on at once,
//! learned from how long it takes to answer, so that requests past what it can serve wait in
//! pinlb's queue (in arrival order, for every client alike) instead of in the backend's accept
//! queue, where a full one drops connections into seconds-long SYN retransmissions.
//!
//! What is limited is the requests **awaiting their response head**: sent (or being sent) and
//! not yet answered. A WebSocket after its `101`, an SSE stream or a large body being read out
//! holds no place, so long-lived requests neither fill the limit nor count as slow answers;
//! `max_conns`, a fixed limit, counts requests until their bodies end, as nginx's does.
//!
//! The rule is a gradient controller, as Envoy's `adaptive_concurrency` filter and Netflix's
//! `concurrency-limits` have it: each window (at least 100 ms and 8 answers), the window's
//! time to the response head (`time`, its answers' median) is set against the backend's time
//! without queueing (`min_rtt`):
//!
//! `limit × clamp(target / time, 0.5, 2)`, with `target = min_rtt + max(min_rtt / 4, 2 ms)`.
//!
//! A backend answering within its target gets more room; one whose answers wait inside it gets
//! less, at most half as much per window. The traps the peers document, and what is done here:
//!
//! - **A noisy time that ratchets the limit down.** The median of a window, not a mean or a
//!   maximum, and a tolerance of at least 2 ms: queueing that costs less than that inside a
//!   backend is not worth queueing in pinlb instead (the fast backend of `benches/compare.sh`
//!   answers in well under a millisecond, and a scheduler's time slice is milliseconds).
//! - **pinlb's own delay taken for the backend's.** A response is timed when the worker reads
//!   it. A worker that is itself the bottleneck reads each response a turn of its event loop
//!   after it came, and that turn grows with the requests in flight, just as a backend's queue
//!   would: a cut then only moves the wait into pinlb's queue, and adds the queue's work to a
//!   worker that has no time to spare. So a window closed by a worker that was busy 75% or
//!   more of the time since it last looked (its thread's CPU time, read once per window) cuts
//!   nothing and starts no probe, nor does the window after it (which may end in a lull, its
//!   answers still timed while the worker was busy). The limit is held where it is, so a
//!   backend that was limited stays limited, unless requests wait at it: their place in the
//!   queue costs the busy worker more, so it grows by a quarter (a backend that cannot take
//!   that shows it in the next window a worker with time to spare closes, or in a dropped
//!   connect). Under callgrind with h2c's 160 streams in flight, a held limit below them
//!   cost 42,100 to 43,600 instructions a request against the base's 41,700. Under callgrind, which runs pinlb some fifty times slower, a fast
//!   backend's 16 requests in flight kept the worker 85% busy; with its own processing in
//!   every time, the limit was cut below 16 and the plain path took 13,000 to 13,500
//!   instructions a request instead of 10,300.
//! - **A `min_rtt` measured under load, or gone stale.** The first window's time is taken as
//!   it comes, at [`INITIAL`], under whatever load there is; then it is measured at the floor,
//!   where the backend has the fewest requests the limit allows, in a probe window (the limit
//!   held at the floor for one window, as Envoy's `min_rtt` calculation does) 2 to 3 s after
//!   the first window and every 30 to 40 s after that, and whenever the limit falls to the
//!   floor on its own. In between, it falls with any window faster than it. A backend that
//!   turned slower for good is cut to the floor, measured there, and grows again from there.
//!   A backend whose time is within the slack (2 ms) gets no probe: its target cannot be off
//!   by more than twice the slack, and a probe queues every request over the floor for a
//!   window (with `benches/compare.sh`'s fast backend and 64 clients, about 18,000 requests
//!   went through the queue in one).
//! - **A limit that never probes upward.** Any window under the target grows it, by at least
//!   one; only a backend that is not given enough requests to fill half its limit keeps it
//!   (it has shown nothing about more), so an idle backend's limit does not drift to the
//!   ceiling and let a burst through unlimited.
//! - **A full accept queue, which the times do not show.** A connect whose SYN the backend's
//!   full accept queue dropped waits a second for its retransmission, and is timed only when
//!   it ends, while the requests that got in answer quickly: the median says all is well. A
//!   connect that waited that long, or timed out while the backend served others, halves the
//!   limit at once ([`Limiter::dropped`]), as a loss halves TCP's window.
//! - **Slow start from 1.** It starts at [`INITIAL`] (Netflix's initial limit), and doubles
//!   per window while the backend answers within 10% of its time without queueing, as TCP's
//!   slow start does until the first sign of a queue: a burst to a backend that waits rather
//!   than works (a database call) is not held back for long.
//!
//! The request path pays, while a backend learns: a count in and out of `awaiting`, two clock
//! reads (at the pick and at the head, as plain nanoseconds) and one counter in the window's
//! histogram per answer; the answer that ends a window
//! works out the next limit (no lock: the one that swaps `closing` does it). A backend that
//! does not learn pays one load per pick.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

pub use crate::config::Adaptive as Bounds;

/// The limit a backend starts at.
pub const INITIAL: usize = 20;

/// A window lasts at least this long, and until it has [`MIN_SAMPLES`] answers or lasts
/// [`LONGEST_WINDOW`].
const WINDOW: Duration = Duration::from_millis(100);
const LONGEST_WINDOW: Duration = Duration::from_secs(1);
const MIN_SAMPLES: u32 = 8;

/// The least tolerance over `min_rtt` before the limit is cut.
const SLACK: Duration = Duration::from_millis(2);

/// How often `min_rtt` is measured again, at the floor (Envoy's `min_rtt_calc_interval` is
/// 60 s): a time measured while the backend was busier than its floor would hold the limit too
/// high. The first probe comes [`FIRST_PROBE`] after the first window, since that window's
/// time was taken at [`INITIAL`], under whatever load there was. Each probe is put off by up
/// to a third more again, so a pool's backends do not all probe at once.
const PROBE_EVERY: Duration = Duration::from_secs(30);
const FIRST_PROBE: Duration = Duration::from_secs(2);

/// What one window measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The window's time to head: the median of its answers' times from the pick to the
    /// response head.
    pub time: Duration,
    /// The most requests awaiting a head at once during the window.
    pub peak: usize,
    /// The worker that closed the window, or the window before, was busy 75% or more of the
    /// time: the times include its own delay.
    pub busy: bool,
    /// A connect found the backend's accept queue full during the window
    /// ([`Limiter::dropped`]): whatever the times say, it has no room for more.
    pub dropped: bool,
}

/// What the limiter knows between windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learned {
    pub limit: usize,
    /// The backend's time without queueing; zero before the first window.
    pub min_rtt: Duration,
    /// During a probe (a window at the floor, to measure `min_rtt`), the limit it ends at.
    pub resume: Option<usize>,
}

impl Learned {
    /// A backend that starts learning: [`INITIAL`], and its time as the first window finds it.
    pub fn start(bounds: Bounds) -> Self {
        Learned {
            limit: INITIAL.clamp(bounds.min, bounds.max),
            min_rtt: Duration::ZERO,
            resume: None,
        }
    }
}

/// The next window's limit, from the last one's measures: the controller as a pure function.
/// `probe`: `min_rtt` is due to be measured again: the next window runs at the floor.
pub fn next(bounds: Bounds, now: Learned, w: Window, probe: bool) -> Learned {
    let time = w.time.max(Duration::from_nanos(1));
    if let Some(resume) = now.resume {
        return Learned {
            limit: resume.clamp(bounds.min, bounds.max),
            min_rtt: time,
            resume: None,
        };
    }
    if now.min_rtt.is_zero() {
        // The first window: nothing to compare its time with yet.
        return Learned {
            min_rtt: time,
            ..now
        };
    }
    let at_floor = now.limit <= bounds.min;
    let min_rtt = if time < now.min_rtt || at_floor {
        time
    } else {
        now.min_rtt
    };
    let target = min_rtt + (min_rtt / 4).max(SLACK);
    let gradient = if time <= min_rtt + min_rtt / 10 {
        // No queueing at all: as fast as the gradient may go (slow start).
        2.0
    } else {
        (target.as_secs_f64() / time.as_secs_f64()).clamp(0.5, 2.0)
    };
    let limit = now.limit.max(1);
    let stepped = if gradient > 1.0 {
        if 2 * w.peak < limit || w.dropped {
            // Not given enough requests to show it can take more, or a connect showed it
            // cannot.
            limit
        } else {
            ((limit as f64 * gradient).round() as usize).max(limit + 1)
        }
    } else if w.busy {
        // Perhaps the worker's own delay, not the backend's: a cut would not shorten it. While
        // requests wait at the limit, their place in pinlb's queue costs the busy worker more:
        // a quarter more room (a backend that cannot take it shows it in the next window a
        // worker with time to spare closes, or in a dropped connect).
        if w.peak >= limit && !w.dropped {
            (limit as f64 * 1.25).ceil() as usize
        } else {
            limit
        }
    } else {
        (limit as f64 * gradient).round() as usize
    };
    let limit = stepped.clamp(bounds.min, bounds.max);
    // A time within the slack, even taken under load, leaves the target within twice the
    // slack of the true one: not worth a window at the floor.
    if probe && !w.busy && limit > bounds.min && min_rtt >= SLACK {
        return Learned {
            limit: bounds.min,
            min_rtt,
            resume: Some(limit),
        };
    }
    Learned {
        limit,
        min_rtt,
        resume: None,
    }
}

/// How an upstream limits what each backend is sent at once, in one line for `pinlb check` and
/// the start-up log: the learned limit and its bounds, the backends whose fixed `max_conns`
/// applies instead, and the queue where the rest wait. `u` as the file says it (DNS names not
/// yet expanded into addresses, so a name counts once):
///
/// `adaptive concurrency limit per backend, 2 to 1000 (starts at 20, probes at 2 every 30 to 40
/// s); queue 10000, 30s`
pub fn summary(u: &crate::config::Upstream) -> String {
    let fixed: Vec<(String, usize)> = u
        .backends
        .iter()
        .filter(|b| b.max_conns > 0)
        .map(|b| (b.address.to_string(), b.max_conns))
        .chain(
            u.names
                .iter()
                .filter(|n| n.max_conns > 0)
                .map(|n| (n.name.to_string(), n.max_conns)),
        )
        .collect();
    let all = u.backends.len() + u.names.len();
    let learning = all - fixed.len();
    // At most four named; more are counted.
    let named = if fixed.len() <= 4 {
        let each: Vec<String> = fixed.iter().map(|(b, n)| format!("{b} ({n})")).collect();
        each.join(", ")
    } else {
        format!("{} backends", fixed.len())
    };
    let mut parts = Vec::new();
    match u.adaptive {
        Some(b) if learning > 0 => {
            let initial = INITIAL.clamp(b.min, b.max);
            parts.push(format!(
                "adaptive concurrency limit per backend, {} to {} (starts at {initial}, probes at {} every 30 to 40 s)",
                b.min, b.max, b.min
            ));
            if !fixed.is_empty() {
                parts.push(format!("max_conns applies instead to {named}"));
            }
        }
        Some(_) => parts.push(format!(
            "no learned concurrency limit: max_conns, a fixed limit, applies to every backend: {named}"
        )),
        None => {
            parts.push("adaptive concurrency limit off (adaptive = false)".into());
            if !fixed.is_empty() {
                parts.push(format!("max_conns limits {named}"));
            }
        }
    }
    let limited = (u.adaptive.is_some() && learning > 0) || !fixed.is_empty();
    parts.push(if !limited {
        "no backend has a limit, so no request waits in the queue".into()
    } else if u.queue == 0 {
        "no queue: a request that finds every backend at its limit gets 503".into()
    } else {
        format!("queue {}, {:?}", u.queue, u.timeouts.queue)
    });
    parts.join("; ")
}

/// Histogram buckets: eight per power of two of microseconds (about 9% wide), from 1 µs to
/// past 17 minutes.
const BUCKETS: usize = 240;

/// The bucket of a time in nanoseconds: the top four bits of its count of 1,024 ns.
fn bucket(ns: u64) -> usize {
    let v = (ns >> 10).max(1);
    let e = 63 - v.leading_zeros();
    let i = if e < 3 {
        v as usize
    } else {
        (e as usize - 2) * 8 + ((v >> (e - 3)) & 7) as usize
    };
    i.min(BUCKETS - 1)
}

/// The middle of bucket `i`'s range.
fn bucket_middle(i: usize) -> Duration {
    let (low, width) = if i < 8 {
        (i as u64, 1)
    } else {
        let e = (i / 8 + 2) as u32;
        ((8 + (i % 8) as u64) << (e - 3), 1u64 << (e - 3))
    };
    Duration::from_nanos((2 * low + width) << 9)
}

/// One backend's limiter, shared by every worker (atomics, no lock), kept across reloads with
/// the backend.
#[derive(Debug)]
pub struct Limiter {
    /// The learned limit; 0 while the backend does not learn (a fixed `max_conns`, or
    /// `adaptive = false`).
    limit: AtomicUsize,
    min: AtomicUsize,
    max: AtomicUsize,
    /// Requests sent to the backend that await their response head, across workers; counted
    /// by the in-flight guards of requests picked while it learns.
    awaiting: AtomicUsize,
    /// This window's answers by time to head.
    buckets: [AtomicU32; BUCKETS],
    /// When this window began, on `sys::clock::monotonic_ns`'s clock; 0 before the first.
    began_ns: AtomicU64,
    peak: AtomicUsize,
    /// Taken by the answer that closes the window.
    closing: AtomicBool,
    min_rtt_ns: AtomicU64,
    /// The highest limit since a fall was last logged.
    reference: AtomicUsize,
    /// During a probe, the limit it ends at; 0 otherwise.
    resume: AtomicUsize,
    /// When the next probe is due, on the window's clock; 0 until the first window closes.
    probe_at_ns: AtomicU64,
    /// The last window was closed by a busy worker.
    was_busy: AtomicBool,
    /// When a dropped connect last halved the limit, on the window's clock.
    dropped_ns: AtomicU64,
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter {
            limit: AtomicUsize::new(0),
            min: AtomicUsize::new(Bounds::DEFAULT.min),
            max: AtomicUsize::new(Bounds::DEFAULT.max),
            awaiting: AtomicUsize::new(0),
            buckets: std::array::from_fn(|_| AtomicU32::new(0)),
            began_ns: AtomicU64::new(0),
            peak: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            min_rtt_ns: AtomicU64::new(0),
            reference: AtomicUsize::new(0),
            resume: AtomicUsize::new(0),
            probe_at_ns: AtomicU64::new(0),
            was_busy: AtomicBool::new(false),
            dropped_ns: AtomicU64::new(0),
        }
    }
}

/// A limit that fell by half or more in one window, and why: for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fall {
    pub from: usize,
    pub to: usize,
    pub min_rtt: Duration,
    pub time: Duration,
    pub peak: usize,
}

impl Limiter {
    /// Applies a (re)loaded configuration: `Some(bounds)` to learn, `None` not to. A backend
    /// that learned already keeps its limit, within the new bounds.
    pub fn configure(&self, bounds: Option<Bounds>) {
        let Some(b) = bounds else {
            self.limit.store(0, Ordering::Relaxed);
            return;
        };
        self.min.store(b.min, Ordering::Relaxed);
        self.max.store(b.max, Ordering::Relaxed);
        let was = self.limit.load(Ordering::Relaxed);
        if was == 0 {
            let start = Learned::start(b);
            self.min_rtt_ns.store(0, Ordering::Relaxed);
            self.resume.store(0, Ordering::Relaxed);
            self.limit.store(start.limit, Ordering::Relaxed);
            self.reference.store(start.limit, Ordering::Relaxed);
        } else {
            self.limit.store(was.clamp(b.min, b.max), Ordering::Relaxed);
        }
    }

    /// The learned limit; `None` while the backend does not learn.
    pub fn limit(&self) -> Option<usize> {
        Some(self.limit.load(Ordering::Relaxed)).filter(|&l| l != 0)
    }

    /// The backend's time without queueing, once measured.
    pub fn min_rtt(&self) -> Option<Duration> {
        Some(Duration::from_nanos(
            self.min_rtt_ns.load(Ordering::Relaxed),
        ))
        .filter(|d| !d.is_zero())
    }

    /// Requests awaiting their response head.
    pub fn awaiting(&self) -> usize {
        self.awaiting.load(Ordering::Relaxed)
    }

    /// Whether the backend learns and is at its limit.
    #[inline(always)]
    pub fn is_full(&self) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        limit != 0 && self.awaiting.load(Ordering::Relaxed) >= limit
    }

    /// Counts a request picked for the backend, if it learns: true when counted, and then the
    /// caller calls [`Self::headed`] once (the head came, or the request ended without one).
    /// `None` when it is at its limit (the count taken is given back).
    #[inline(always)]
    pub fn enter(&self) -> Option<bool> {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 {
            return Some(false);
        }
        // The increment first, so two workers racing for the last place cannot both get it.
        if self.awaiting.fetch_add(1, Ordering::Relaxed) >= limit {
            self.awaiting.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(true)
    }

    /// A counted request no longer awaits its head. With `answer`, the nanoseconds its head
    /// took and the clock then (`sys::clock::monotonic_ns`), it is a sample of the window, and
    /// may close it: a fall by half or more is returned for the log.
    #[inline]
    pub fn headed(&self, answer: Option<(u64, u64)>) -> Option<Fall> {
        let before = self.awaiting.fetch_sub(1, Ordering::Relaxed);
        let (rtt, now_ns) = answer?;
        if before > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(before, Ordering::Relaxed);
        }
        self.buckets[bucket(rtt)].fetch_add(1, Ordering::Relaxed);
        let began = self.began_ns.load(Ordering::Relaxed);
        if began != 0 && now_ns.saturating_sub(began) < WINDOW.as_nanos() as u64 {
            return None;
        }
        self.close(now_ns, began)
    }

    /// A connect to the backend waited for a SYN's retransmission, or timed out while the
    /// backend served others: its accept queue was full, which the answers' times do not show
    /// until those connects end (seconds later), while the answers that got in are quick.
    /// Halves the limit at once, as TCP halves its window on a loss, at most once a window, and
    /// never below the floor; returns the limit before and after, for the log.
    #[cold]
    pub fn dropped(&self, now_ns: u64) -> Option<(usize, usize)> {
        let limit = self.limit.load(Ordering::Relaxed);
        let last = self.dropped_ns.load(Ordering::Relaxed);
        if limit == 0 || (last != 0 && now_ns.saturating_sub(last) < WINDOW.as_nanos() as u64) {
            return None;
        }
        self.dropped_ns
            .compare_exchange(last, now_ns, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        // During a probe, what it ends at is halved.
        let resume = self.resume.load(Ordering::Relaxed);
        let min = self.min.load(Ordering::Relaxed);
        if resume != 0 {
            self.resume.store((resume / 2).max(min), Ordering::Relaxed);
            return None;
        }
        let to = (limit / 2).max(min);
        if to >= limit {
            return None;
        }
        self.limit
            .compare_exchange(limit, to, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        self.reference.store(to, Ordering::Relaxed);
        Some((limit, to))
    }

    /// Ends the window if it has enough answers, or has lasted long enough: its time and peak
    /// give the next limit.
    #[cold]
    fn close(&self, now_ns: u64, began: u64) -> Option<Fall> {
        if self.closing.swap(true, Ordering::Acquire) {
            return None;
        }
        let fall = self.close_taken(now_ns, began);
        self.closing.store(false, Ordering::Release);
        fall
    }

    fn close_taken(&self, now_ns: u64, began: u64) -> Option<Fall> {
        // Another answer closed it between this one's look and its swap.
        if self.began_ns.load(Ordering::Relaxed) != began {
            return None;
        }
        // On the stack: a window still short of answers is looked at again by each next one.
        let counts: [u32; BUCKETS] =
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        let samples: u32 = counts.iter().sum();
        let lasted = Duration::from_nanos(now_ns.saturating_sub(began));
        let first = began == 0;
        if !first && samples < MIN_SAMPLES && lasted < LONGEST_WINDOW {
            return None;
        }
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.began_ns.store(now_ns, Ordering::Relaxed);
        let peak = self.peak.swap(0, Ordering::Relaxed);
        // A window just after a busy one still holds answers timed by a busy worker.
        let busy_now = worker_busy(now_ns);
        let busy = self.was_busy.swap(busy_now, Ordering::Relaxed) || busy_now;
        let limit = self.limit.load(Ordering::Relaxed);
        // The first answer only starts the clock: a window from the process's start is no
        // window.
        if first || samples == 0 || limit == 0 {
            return None;
        }
        let time = median(&counts, samples);
        let bounds = Bounds {
            min: self.min.load(Ordering::Relaxed),
            max: self.max.load(Ordering::Relaxed),
        };
        let now = Learned {
            limit,
            min_rtt: self.min_rtt().unwrap_or_default(),
            resume: Some(self.resume.load(Ordering::Relaxed)).filter(|&r| r != 0),
        };
        let probe_at = self.probe_at_ns.load(Ordering::Relaxed);
        let probe = probe_at != 0 && now_ns >= probe_at;
        let learned = next(
            bounds,
            now,
            Window {
                time,
                peak,
                busy,
                dropped: self.dropped_ns.load(Ordering::Relaxed) >= began,
            },
            probe,
        );
        if probe_at == 0 || learned.resume.is_some() {
            let every = if probe_at == 0 {
                FIRST_PROBE
            } else {
                PROBE_EVERY
            };
            // Put off by up to a third more, from the clock's low bits.
            let every = every.as_nanos() as u64;
            let spread = now_ns % (every / 3);
            self.probe_at_ns
                .store(now_ns + every + spread, Ordering::Relaxed);
        }
        // A reload may have turned learning off meanwhile.
        if self
            .limit
            .compare_exchange(limit, learned.limit, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        self.resume
            .store(learned.resume.unwrap_or(0), Ordering::Relaxed);
        self.min_rtt_ns.store(
            u64::try_from(learned.min_rtt.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        // A probe's fall to the floor is no fall of the backend's.
        if learned.resume.is_some() {
            return None;
        }
        let reference = self.reference.load(Ordering::Relaxed);
        if learned.limit > reference {
            self.reference.store(learned.limit, Ordering::Relaxed);
        } else if 2 * learned.limit <= reference {
            self.reference.store(learned.limit, Ordering::Relaxed);
            return Some(Fall {
                from: reference,
                to: learned.limit,
                min_rtt: now.min_rtt,
                time,
                peak,
            });
        }
        None
    }
}

/// A worker busy this share of the time or more is itself a bottleneck: a response that
/// comes waits for its other work (at 75%, three times its own, by M/M/1's ρ/(1−ρ)).
const BUSY: f64 = 0.75;

thread_local! {
    /// This thread's CPU time and the clock when a window's close last looked.
    static LOOKED: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// Whether this thread (the worker closing a window) was busy [`BUSY`] or more of the time
/// since it last looked, at least 10 ms ago; false the first time. One system call.
fn worker_busy(now_ns: u64) -> bool {
    LOOKED.with(|looked| {
        let (cpu_then, then) = looked.get();
        let elapsed = now_ns.saturating_sub(then);
        if then != 0 && elapsed < 10_000_000 {
            return false;
        }
        let cpu = crate::sys::clock::thread_cpu_ns();
        looked.set((cpu, now_ns));
        then != 0 && cpu.saturating_sub(cpu_then) as f64 >= BUSY * elapsed as f64
    })
}

/// The median of a window's histogram of `samples` answers.
fn median(counts: &[u32], samples: u32) -> Duration {
    let rank = samples.div_ceil(2);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_middle(i);
        }
    }
    bucket_middle(counts.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds::DEFAULT;
    const DEFAULT_MIN: usize = BOUNDS.min;
    const DEFAULT_MAX: usize = BOUNDS.max;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    /// A backend with `workers` that each take `service` per request: its time to head with
    /// `n` requests sent to it, the queueing inside it included.
    fn saturating(workers: usize, service: Duration) -> impl Fn(usize) -> Duration {
        move |n| service.mul_f64((n.max(workers) as f64) / workers as f64)
    }

    /// The window whose end starts the first probe, as [`FIRST_PROBE`] does for 100 ms windows.
    const PROBE_AT: usize = 20;

    /// Runs `windows` windows against `backend`, with as many requests offered as the limit
    /// allows (a loaded proxy), a probe after [`PROBE_AT`], and returns each window's limit.
    fn run(
        mut learned: Learned,
        windows: usize,
        backend: impl Fn(usize) -> Duration,
    ) -> (Learned, Vec<usize>) {
        let mut limits = Vec::new();
        for i in 0..windows {
            let n = learned.limit;
            let w = Window {
                time: backend(n),
                peak: n,
                busy: false,
                dropped: false,
            };
            learned = next(BOUNDS, learned, w, i == PROBE_AT);
            limits.push(learned.limit);
        }
        (learned, limits)
    }

    fn start() -> Learned {
        Learned::start(BOUNDS)
    }

    #[test]
    fn a_backend_that_saturates_at_four_converges_to_three_to_six() {
        // 20 ms a request, four at a time (a PHP pool of four, say).
        let (_, limits) = run(start(), 60, saturating(4, ms(20.0)));
        assert!(
            limits[PROBE_AT + 10..].iter().all(|l| (3..=6).contains(l)),
            "limits: {limits:?}"
        );
    }

    #[test]
    fn a_one_at_a_time_backend_is_held_near_the_floor() {
        let (_, limits) = run(start(), 60, saturating(1, ms(10.0)));
        assert!(
            limits[PROBE_AT + 10..].iter().all(|l| (2..=4).contains(l)),
            "limits: {limits:?}"
        );
    }

    #[test]
    fn a_fast_backend_is_not_throttled() {
        // 80 µs alone, 1 ms with 64 in flight: queueing that costs less than the slack.
        let fast = |n: usize| ms(0.05) + ms(0.015 * n as f64);
        let (learned, limits) = run(start(), 30, fast);
        assert!(learned.limit >= 128, "limits: {limits:?}");
        // Offered 64 at most: it keeps room for twice that.
        let mut l = learned;
        for _ in 0..20 {
            let w = Window {
                time: fast(64),
                peak: 64,
                busy: false,
                dropped: false,
            };
            l = next(BOUNDS, l, w, false);
        }
        assert!(l.limit >= 128, "{l:?}");
    }

    #[test]
    fn a_backend_whose_time_doubles_has_its_limit_cut_within_a_few_windows_and_regains_it() {
        let (settled, _) = run(start(), 60, saturating(4, ms(20.0)));
        let before = settled.limit;
        // Its service time doubles (something else took half its CPU).
        let (slow, limits) = run(settled, 5, saturating(4, ms(40.0)));
        assert!(
            limits.iter().take(3).any(|&l| 2 * l <= before + 1),
            "before {before}, then {limits:?}"
        );
        // Back to 20 ms: its limit comes back within a few windows.
        let (_, limits) = run(slow, 10, saturating(4, ms(20.0)));
        assert!(
            limits[5..].iter().all(|&l| l + 1 >= before),
            "before {before}, then {limits:?}"
        );
    }

    #[test]
    fn one_turning_from_1_ms_to_20_ms_falls_to_the_floor_and_comes_back_when_it_recovers() {
        let (settled, _) = run(start(), 60, saturating(1, ms(1.0)));
        let before = settled.limit;
        let (slow, limits) = run(settled, 2, saturating(1, ms(20.0)));
        assert!(limits.contains(&DEFAULT_MIN), "before {before}: {limits:?}");
        let (_, limits) = run(slow, 10, saturating(1, ms(1.0)));
        assert!(
            limits[3..].iter().all(|&l| l >= before),
            "before {before}: {limits:?}"
        );
    }

    #[test]
    fn a_backend_that_waits_rather_than_works_grows_to_what_it_is_given() {
        // 20 ms whatever the load (a database call): queueing never shows.
        let (learned, _) = run(start(), 40, |_| ms(20.0));
        assert_eq!(learned.limit, DEFAULT_MAX);
    }

    #[test]
    fn a_min_rtt_measured_under_load_is_mended_by_the_next_probe() {
        // Measured at 25 in flight, 125 ms: the limit would hold at 25 for ever.
        let backend = saturating(4, ms(20.0));
        let stale = Learned {
            limit: 25,
            min_rtt: backend(25),
            resume: None,
        };
        let mut held = stale;
        for _ in 0..10 {
            let w = Window {
                time: backend(held.limit),
                peak: held.limit,
                busy: false,
                dropped: false,
            };
            held = next(BOUNDS, held, w, false);
            assert!(held.limit >= 20, "{held:?}");
        }
        let w = Window {
            time: backend(held.limit),
            peak: held.limit,
            busy: false,
            dropped: false,
        };
        let probing = next(BOUNDS, held, w, true);
        assert_eq!(probing.limit, DEFAULT_MIN);
        assert!(probing.resume.is_some(), "{probing:?}");
        let (_, limits) = run(probing, 20, &backend);
        assert!(
            limits[10..].iter().all(|l| (3..=6).contains(l)),
            "{limits:?}"
        );
    }

    #[test]
    fn a_fast_backend_gets_no_probe() {
        let fast = |n: usize| ms(0.05) + ms(0.015 * n as f64);
        let (settled, _) = run(start(), 10, fast);
        let w = Window {
            time: fast(settled.limit),
            peak: settled.limit,
            busy: false,
            dropped: false,
        };
        assert_eq!(next(BOUNDS, settled, w, true).resume, None);
    }

    #[test]
    fn a_busy_worker_cuts_nothing_starts_no_probe_and_makes_room_for_what_waits() {
        let settled = Learned {
            limit: 40,
            min_rtt: ms(1.0),
            resume: None,
        };
        // Its own turn took 10 ms: the backend is not to blame.
        let w = Window {
            time: ms(10.0),
            peak: settled.limit - 1,
            busy: true,
            dropped: false,
        };
        let held = next(BOUNDS, settled, w, true);
        assert_eq!((held.limit, held.resume), (settled.limit, None));
        // Requests waited at the limit: a quarter more room.
        let room = next(
            BOUNDS,
            settled,
            Window {
                peak: settled.limit,
                ..w
            },
            false,
        );
        assert_eq!(room.limit, (settled.limit * 5).div_ceil(4));
        // Not busy: the same window is a queue in the backend.
        let cut = next(BOUNDS, settled, Window { busy: false, ..w }, false);
        assert!(2 * cut.limit <= settled.limit + 1, "{settled:?} → {cut:?}");
    }

    #[test]
    fn a_dropped_connect_halves_the_limit_once_a_window() {
        let l = Limiter::default();
        l.configure(Some(BOUNDS));
        let t = 1_000_000_000;
        assert_eq!(l.dropped(t), Some((INITIAL, INITIAL / 2)));
        assert_eq!(l.dropped(t + 1), None, "once a window");
        let later = t + WINDOW.as_nanos() as u64;
        assert_eq!(l.dropped(later), Some((INITIAL / 2, INITIAL / 4)));
        // Never below the floor; not at all while not learning.
        assert_eq!(l.dropped(3 * later), Some((INITIAL / 4, DEFAULT_MIN)));
        assert_eq!(l.dropped(4 * later), None);
        l.configure(None);
        assert_eq!(l.dropped(5 * later), None);
    }

    #[test]
    fn noise_does_not_ratchet_the_limit_down() {
        // A 1 ms backend whose time wanders by ±40% window to window.
        let mut learned = start();
        let mut lowest = usize::MAX;
        for i in 0..200 {
            let wobble = [1.0, 1.4, 0.6, 1.2, 0.8][i % 5];
            let w = Window {
                time: ms(wobble),
                peak: learned.limit,
                busy: false,
                dropped: false,
            };
            learned = next(BOUNDS, learned, w, false);
            if i > 20 {
                lowest = lowest.min(learned.limit);
            }
        }
        assert!(lowest >= INITIAL, "fell to {lowest}");
    }

    #[test]
    fn a_burst_to_a_backend_that_waits_is_let_through_within_a_few_windows() {
        // 300 ms whatever the load: 20, then doubled each window.
        let (_, limits) = run(start(), 4, |_| ms(300.0));
        assert_eq!(limits, [20, 40, 80, 160]);
    }

    #[test]
    fn an_idle_backend_keeps_its_limit() {
        let (learned, _) = run(start(), 1, |_| ms(1.0));
        let w = Window {
            time: ms(1.0),
            peak: 3,
            busy: false,
            dropped: false,
        };
        assert_eq!(next(BOUNDS, learned, w, false).limit, INITIAL);
    }

    #[test]
    fn buckets_cover_times_in_order_within_ten_percent() {
        let mut last = 0;
        for us in [
            1u64, 2, 7, 8, 9, 15, 16, 100, 1_000, 12_345, 1_000_000, 60_000_000,
        ] {
            let t = Duration::from_micros(us);
            let i = bucket(us * 1000);
            assert!(i >= last, "{us} µs");
            last = i;
            let m = bucket_middle(i).as_secs_f64();
            let err = (m - t.as_secs_f64()).abs() / t.as_secs_f64();
            assert!(us < 16 || err < 0.1, "{us} µs → {m}: {err}");
        }
        assert_eq!(bucket(100_000 * 1_000_000_000), BUCKETS - 1);
    }

    /// One window of answers that took `rtt`, beginning at `t`: as many requests at once as
    /// the limit allows, until there are enough, then one more a window later, which closes
    /// it; returns the fall that one told, if any, and the time it came at.
    fn one_window(l: &Limiter, rtt: Duration, t: u64) -> (Option<Fall>, u64) {
        let mut samples = 0;
        while samples < MIN_SAMPLES {
            let n = l.limit().unwrap();
            for _ in 0..n {
                assert_eq!(l.enter(), Some(true));
            }
            for _ in 0..n {
                assert_eq!(l.headed(Some((rtt.as_nanos() as u64, t))), None);
            }
            samples += n as u32;
        }
        let end = t + WINDOW.as_nanos() as u64;
        assert_eq!(l.enter(), Some(true));
        (l.headed(Some((rtt.as_nanos() as u64, end))), end)
    }

    /// `pinlb check`'s and the start-up log's line for an upstream with `keys` and `backends`.
    fn summary_of(keys: &str, backends: &str) -> String {
        let text = format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
             [upstream.app]\n{keys}\nbackends = [{backends}]\n"
        );
        let config = crate::config::Config::parse("t.toml", &text, &[0]).unwrap();
        summary(&config.upstreams[0])
    }

    #[test]
    fn the_summary_says_whether_backends_learn_within_which_bounds_and_where_the_rest_wait() {
        let two = "{ address = \"127.0.0.1:1\" }, { address = \"127.0.0.1:2\" }";
        assert_eq!(
            summary_of("", two),
            "adaptive concurrency limit per backend, 2 to 1000 (starts at 20, probes at 2 every 30 to 40 s); \
             queue 10000, 30s"
        );
        assert_eq!(
            summary_of(
                "adaptive_min = 4\nadaptive_max = 10\nqueue = 50\ntimeouts = { queue = \"2s\" }",
                two
            ),
            "adaptive concurrency limit per backend, 4 to 10 (starts at 10, probes at 4 every 30 to 40 s); \
             queue 50, 2s"
        );
        let mixed = "{ address = \"127.0.0.1:1\", max_conns = 8 }, { address = \"127.0.0.1:2\" }";
        assert_eq!(
            summary_of("queue = 0", mixed),
            "adaptive concurrency limit per backend, 2 to 1000 (starts at 20, probes at 2 every 30 to 40 s); \
             max_conns applies instead to 127.0.0.1:1 (8); \
             no queue: a request that finds every backend at its limit gets 503"
        );
        assert_eq!(
            summary_of("max_conns = 3", two),
            "no learned concurrency limit: max_conns, a fixed limit, applies to every backend: \
             127.0.0.1:1 (3), 127.0.0.1:2 (3); queue 10000, 30s"
        );
        assert_eq!(
            summary_of("adaptive = false", mixed),
            "adaptive concurrency limit off (adaptive = false); max_conns limits 127.0.0.1:1 (8); \
             queue 10000, 30s"
        );
        assert_eq!(
            summary_of("adaptive = false", two),
            "adaptive concurrency limit off (adaptive = false); \
             no backend has a limit, so no request waits in the queue"
        );
    }

    #[test]
    fn the_shared_limiter_learns_from_answers_and_tells_a_fall() {
        let l = Limiter::default();
        l.configure(Some(BOUNDS));
        // The first answer starts the clock; the first window only measures.
        assert_eq!(l.limit(), Some(INITIAL));
        let (fall, t) = one_window(&l, ms(1.0), 1);
        assert_eq!((fall, l.limit()), (None, Some(INITIAL)));
        assert!(l.min_rtt().unwrap() < ms(1.1));
        let (fall, t) = one_window(&l, ms(1.0), t);
        assert_eq!((fall, l.limit()), (None, Some(2 * INITIAL)));
        // Now 40 ms: the limit is cut by half, and the fall is told.
        let (fall, _) = one_window(&l, ms(40.0), t);
        let fall = fall.expect("a fall");
        assert_eq!((fall.from, fall.to), (2 * INITIAL, INITIAL));
        assert!(fall.time > ms(38.0) && fall.min_rtt < ms(1.1), "{fall:?}");
        assert_eq!(fall.peak, 2 * INITIAL);
        // At its limit, a request is refused and nothing stays counted.
        for _ in 0..INITIAL {
            assert_eq!(l.enter(), Some(true));
        }
        assert!(l.is_full());
        assert_eq!(l.enter(), None);
        for _ in 0..INITIAL {
            l.headed(None);
        }
        assert_eq!(l.awaiting(), 0);
        // A reload keeps what was learned; turned off, nothing is counted or limited.
        l.configure(Some(BOUNDS));
        assert_eq!(l.limit(), Some(INITIAL));
        l.configure(None);
        assert_eq!((l.limit(), l.enter()), (None, Some(false)));
    }
}
