//! Repeated warnings summed over a second, per thread, so that an overload writes a few lines a
//! second instead of one per failed request.
//!
//! The first occurrence of a message is written at once, with its fields. The same message from
//! the same call site again is only counted until the second ends; then one line says how many
//! more there were (`…: 12,345 more in the last 1 s`), at the original's level and log target.
//! A message quiet for a whole second is written at once again the next time. At most
//! [`MAX_KINDS`] messages are told apart per thread; beyond those, one `N other warnings` line.
//!
//! The state is the thread's own (`thread_local!`, no lock): each worker is a thread with its own
//! runtime, and each flushes its sums every second with a timer task ([`flush`]). A thread
//! without that timer flushes on its next summed warning once a second has passed.
//!
//! Only warnings written per request or per connection go through here; transitions (a backend
//! skipped, back) are written as they happen. Nothing runs for a request that logs nothing.

use std::cell::RefCell;
use std::time::{Duration, Instant};

/// How long counts add up before their line is written.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// Messages told apart per thread per window; more are summed into one line, so a flood of
/// distinct messages (each naming another client or cause) cannot grow memory.
pub(crate) const MAX_KINDS: usize = 64;

/// A summed warning's call site: how it writes its summary line, at its own level and target
/// (the macros make one per call site, as a `static`).
pub struct Site {
    pub summary: fn(&str),
}

/// A message seen in this window, or the last.
struct Kind {
    site: &'static Site,
    message: String,
    /// Occurrences counted, not written, since the last flush.
    more: u64,
    /// Whether it occurred since the last flush; one that did not is forgotten.
    seen: bool,
}

/// One thread's sums; pure (the clock comes in as `now`), so tests drive it.
pub(crate) struct Sums {
    kinds: Vec<Kind>,
    /// Occurrences of messages beyond [`MAX_KINDS`] since the last flush.
    others: u64,
    /// The last flush, or the first occurrence.
    since: Instant,
    /// Whether a timer flushes these sums every [`WINDOW`]. Then an occurrence flushes only
    /// when the timer is a window late: one that flushed whenever a window had passed would
    /// race the timer's own tick and write two summaries a moment apart.
    timed: bool,
}

/// A line a flush writes: a site's summary, or (with `None`) the others' line.
pub(crate) struct Summary {
    pub site: Option<&'static Site>,
    pub line: String,
}

impl Sums {
    pub(crate) fn new(now: Instant) -> Sums {
        Sums {
            kinds: Vec::new(),
            others: 0,
            since: now,
            timed: false,
        }
    }

    /// Notes one occurrence of `message` from `site`: `true` when it is to be written now (its
    /// first in a second), `false` when it is counted.
    pub(crate) fn note(&mut self, site: &'static Site, message: &str) -> bool {
        if let Some(k) = self
            .kinds
            .iter_mut()
            .find(|k| std::ptr::eq(k.site, site) && k.message == message)
        {
            k.more += 1;
            k.seen = true;
            return false;
        }
        if self.kinds.len() >= MAX_KINDS {
            self.others += 1;
            return false;
        }
        self.kinds.push(Kind {
            site,
            message: message.to_owned(),
            more: 0,
            seen: true,
        });
        true
    }

    /// Whether an occurrence at `now` flushes first: a window has passed since the last
    /// flush, or two when a timer flushes.
    pub(crate) fn due(&self, now: Instant) -> bool {
        let window = if self.timed { 2 * WINDOW } else { WINDOW };
        now.saturating_duration_since(self.since) >= window
    }

    /// The summary lines of the window that ends at `now`; forgets the messages that were
    /// quiet through it.
    pub(crate) fn flush(&mut self, now: Instant) -> Vec<Summary> {
        let secs = seconds(now.saturating_duration_since(self.since));
        self.since = now;
        let mut out = Vec::new();
        self.kinds.retain_mut(|k| {
            if k.more > 0 {
                out.push(Summary {
                    site: Some(k.site),
                    line: format!(
                        "{}: {} more in the last {secs} s",
                        k.message,
                        thousands(k.more)
                    ),
                });
            }
            let keep = k.seen;
            k.more = 0;
            k.seen = false;
            keep
        });
        if self.others > 0 {
            out.push(Summary {
                site: None,
                line: format!(
                    "{} other warnings in the last {secs} s (over {MAX_KINDS} different ones)",
                    thousands(self.others)
                ),
            });
            self.others = 0;
        }
        out
    }
}

/// A window's length as the summary line says it: the nearest whole second, at least 1 (the
/// timer's window is a second, give or take its wake-up; a thread without it may say more).
fn seconds(d: Duration) -> u64 {
    (((d.as_millis() + 500) / 1000) as u64).max(1)
}

/// `12345` as `12,345`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

thread_local! {
    static SUMS: RefCell<Option<Sums>> = const { RefCell::new(None) };
}

/// Notes `message` from `site` in this thread's sums (writing the lines of a window that has
/// passed first): `true` when the caller writes it now. The macros call it.
pub fn first(site: &'static Site, message: &str) -> bool {
    let now = Instant::now();
    let noted = SUMS.try_with(|cell| {
        // Only a summary's own writing could be here already, and it never calls back.
        let mut sums = cell.try_borrow_mut().ok()?;
        let sums = sums.get_or_insert_with(|| Sums::new(now));
        let due = if sums.due(now) {
            sums.flush(now)
        } else {
            Vec::new()
        };
        Some((sums.note(site, message), due))
    });
    match noted {
        Ok(Some((first, due))) => {
            write(due);
            first
        }
        // No state (the thread is ending): written, never lost.
        _ => true,
    }
}

/// Writes this thread's sums of the window that ends now. Each worker's timer task calls it
/// every second (from then on the thread counts as timed), and a worker once more as it stops.
pub(crate) fn flush() {
    let now = Instant::now();
    let due = SUMS.try_with(|cell| {
        let mut sums = cell.try_borrow_mut().ok()?;
        let sums = sums.get_or_insert_with(|| Sums::new(now));
        sums.timed = true;
        Some(sums.flush(now))
    });
    if let Ok(Some(due)) = due {
        write(due);
    }
}

fn write(lines: Vec<Summary>) {
    for s in lines {
        match s.site {
            Some(site) => (site.summary)(&s.line),
            None => tracing::warn!("{}", s.line),
        }
    }
}

/// The event behind [`summed_warn`] and [`summed_error`]: `$level` is tracing's `Level` const,
/// `$write` its macro for that level.
macro_rules! summed_event {
    ($level:ident, $write:ident, $($k:ident = %$v:expr),* ; $($arg:tt)+) => {
        if ::tracing::enabled!(::tracing::Level::$level) {
            // Defined here, so that the summary has this call site's level and target.
            fn summary(line: &str) {
                ::tracing::$write!("{line}");
            }
            static SITE: $crate::sys::summed::Site = $crate::sys::summed::Site { summary };
            let message = ::std::format!($($arg)+);
            if $crate::sys::summed::first(&SITE, &message) {
                ::tracing::$write!($($k = %$v,)* "{message}");
            }
        }
    };
}

/// `warn!`, summed per second: `summed_warn!(client = %peer; "answered {status}: {e}")`, the
/// fields (`name = %value`, written with the first occurrence only) before a `;`, or none.
macro_rules! summed_warn {
    ($($k:ident = %$v:expr),+ ; $($arg:tt)+) => {
        $crate::sys::summed::summed_event!(WARN, warn, $($k = %$v),+ ; $($arg)+)
    };
    ($($arg:tt)+) => {
        $crate::sys::summed::summed_event!(WARN, warn, ; $($arg)+)
    };
}

/// `error!`, summed per second, as [`summed_warn`].
macro_rules! summed_error {
    ($($k:ident = %$v:expr),+ ; $($arg:tt)+) => {
        $crate::sys::summed::summed_event!(ERROR, error, $($k = %$v),+ ; $($arg)+)
    };
    ($($arg:tt)+) => {
        $crate::sys::summed::summed_event!(ERROR, error, ; $($arg)+)
    };
}

pub(crate) use {summed_error, summed_event, summed_warn};

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing(_: &str) {}
    static A: Site = Site { summary: nothing };
    static B: Site = Site { summary: nothing };

    fn lines(s: Vec<Summary>) -> Vec<String> {
        s.into_iter().map(|s| s.line).collect()
    }

    #[test]
    fn the_first_is_written_and_the_rest_of_the_second_summed_into_one_line() {
        let t0 = Instant::now();
        let mut sums = Sums::new(t0);
        assert!(sums.note(&A, "502 x"));
        for _ in 0..12_345 {
            assert!(!sums.note(&A, "502 x"));
        }
        assert!(!sums.due(t0 + Duration::from_millis(999)));
        assert!(sums.due(t0 + WINDOW));
        assert_eq!(
            lines(sums.flush(t0 + WINDOW)),
            ["502 x: 12,345 more in the last 1 s"]
        );
        // Still going: counted on, not written again.
        assert!(!sums.note(&A, "502 x"));
        assert_eq!(
            lines(sums.flush(t0 + 2 * WINDOW)),
            ["502 x: 1 more in the last 1 s"]
        );
    }

    #[test]
    fn after_a_quiet_second_the_next_is_written_at_once() {
        let t0 = Instant::now();
        let mut sums = Sums::new(t0);
        assert!(sums.note(&A, "m"));
        // Seen in the window that ends: kept, with nothing to say.
        assert!(lines(sums.flush(t0 + WINDOW)).is_empty());
        // Quiet through the next: forgotten.
        assert!(lines(sums.flush(t0 + 2 * WINDOW)).is_empty());
        assert!(sums.note(&A, "m"));
    }

    #[test]
    fn messages_and_sites_are_summed_apart() {
        let t0 = Instant::now();
        let mut sums = Sums::new(t0);
        assert!(sums.note(&A, "m"));
        assert!(sums.note(&A, "n"));
        assert!(sums.note(&B, "m"));
        assert!(!sums.note(&A, "n"));
        assert!(!sums.note(&B, "m"));
        assert!(!sums.note(&B, "m"));
        assert_eq!(
            lines(sums.flush(t0 + WINDOW)),
            ["n: 1 more in the last 1 s", "m: 2 more in the last 1 s"]
        );
    }

    #[test]
    fn past_the_bound_distinct_messages_sum_into_one_other_line() {
        let t0 = Instant::now();
        let mut sums = Sums::new(t0);
        for i in 0..MAX_KINDS {
            assert!(sums.note(&A, &format!("m{i}")));
        }
        for i in 0..1000 {
            assert!(!sums.note(&A, &format!("new {i}")));
        }
        assert_eq!(sums.kinds.len(), MAX_KINDS);
        assert_eq!(
            lines(sums.flush(t0 + WINDOW)),
            ["1,000 other warnings in the last 1 s (over 64 different ones)"]
        );
    }

    #[test]
    fn a_late_flush_says_how_long_it_summed() {
        let t0 = Instant::now();
        let mut sums = Sums::new(t0);
        sums.note(&A, "m");
        sums.note(&A, "m");
        assert_eq!(
            lines(sums.flush(t0 + Duration::from_millis(4200))),
            ["m: 1 more in the last 4 s"]
        );
        sums.note(&A, "m");
        // A timer that woke a little late still says a second.
        assert_eq!(
            lines(sums.flush(t0 + Duration::from_millis(5300))),
            ["m: 1 more in the last 1 s"]
        );
    }

    #[test]
    fn with_a_timer_an_occurrence_leaves_the_flush_to_it_unless_it_is_late() {
        let t0 = Instant::now();
        let mut sums = Sums::new(t0);
        sums.timed = true;
        // Just past the window, the timer's tick is due any moment: not flushed here.
        assert!(!sums.due(t0 + WINDOW + Duration::from_millis(3)));
        assert!(sums.due(t0 + 2 * WINDOW));
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(69_000), "69,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_thread_local_writes_the_first_and_counts_the_rest() {
        static C: Site = Site { summary: nothing };
        assert!(first(&C, "thread"));
        assert!(!first(&C, "thread"));
        flush();
        // Seen in the flushed window: still counted.
        assert!(!first(&C, "thread"));
    }
}
