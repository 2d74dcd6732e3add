//! Where one proxied request's time went, measured once on the monotonic clock (the
//! `Server-Timing` header, `modules::server_timing`, shows some of it).
//!
//! The request meets these instants: its head arrives (`t0`); it may wait in the upstream's
//! queue; the first attempt begins; failed attempts, if any, end and the answering attempt `a`
//! begins; its connection is ready (pooled, or connected in `connect`); the request head is
//! written (`s`); the response head is read (`h`); the response's last byte is written to the
//! client (`e`). Of those spans:
//!
//! | field      | span                         | nginx / HAProxy                                  |
//! |------------|------------------------------|--------------------------------------------------|
//! | `queue`    | the wait in the queue        | HAProxy's Tw                                     |
//! | `connect`  | the answering attempt's      | nginx's `$upstream_connect_time` (0 when reused),|
//! |            | connect; none when pooled    | HAProxy's Tc                                     |
//! | `header`   | `s` to `h`                   | HAProxy's Tr; nginx's `$upstream_header_time` is |
//! |            |                              | `a` to `h`, the connect and the write included   |
//! | `response` | `h` to `e`                   | HAProxy's Td                                     |
//! | `total`    | `t0` to `e`                  | nginx's `$request_time`, HAProxy's Ta            |
//!
//! The proxy's own share is what is left of `total` once the waits on others are taken out:
//! the queue, failed attempts (`retried`), the connect, the backend's `header` time, and the
//! `response`'s relay, which streams and so waits on the backend's next bytes and on the client
//! taking them. What is left is pinlb's work before the request reaches the backend: the route,
//! the pick, the pool, the head written (`before` + `write`). The same number is the log's
//! `proxy_time`, `Server-Timing`'s `pinlb`, and `pinlb_proxy_added_seconds`.
//!
//! All of this is measured only when something reads it (the access log, `Server-Timing`, or
//! `/metrics`): a request on a listener with none of them reads the clock no more than before.

use std::time::{Duration, Instant};

/// One proxied request's instants up to its response head, from which its spans are cut
/// when they are read (the response's relay is measured when it ends; see the module
/// documentation). Taking them costs clock reads only; the subtractions are made by whoever
/// reads a span, most of them on the log thread.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// In the upstream's queue, before the first attempt.
    pub queue: Duration,
    /// When the request head arrived.
    pub at: Instant,
    /// When the first attempt began, and the answering one.
    pub started: Instant,
    pub begun: Instant,
    /// The answering attempt's connect (for TLS, the handshake too); `None` when it went on a
    /// pooled connection (HTTP/2: an open connection's new stream).
    pub connect: Option<Duration>,
    /// When its request head was written (handed to hyper, for HTTP/2).
    pub sent: Instant,
    /// When the response head was read.
    pub responded: Instant,
}

impl Timing {
    /// The instants of a request whose head arrived `at` and waited `queue`, answered `now` by
    /// the attempt begun at `begun` (the first began at `started`), which connected in
    /// `connect` (`None`: pooled) and wrote its request head at `sent` (`None`: not read,
    /// taken as `begun`).
    pub fn measured(
        at: Instant,
        queue: Duration,
        (started, begun, connect, sent): (Instant, Instant, Option<Duration>, Option<Instant>),
        now: Instant,
    ) -> Timing {
        Timing {
            queue,
            at,
            started,
            begun,
            connect,
            sent: sent.unwrap_or(begun),
            responded: now,
        }
    }

    /// From the head's arrival to the first attempt, less the queue: the route and the pick.
    pub fn before(&self) -> Duration {
        (self.started.saturating_duration_since(self.at)).saturating_sub(self.queue)
    }

    /// From the first attempt to the one that answered: attempts that failed.
    pub fn retried(&self) -> Duration {
        self.begun.saturating_duration_since(self.started)
    }

    /// From the answering attempt's connection being ready to its request head written.
    pub fn write(&self) -> Duration {
        (self.sent.saturating_duration_since(self.begun))
            .saturating_sub(self.connect.unwrap_or_default())
    }

    /// From the request head written to the response head read: the backend's time, with the
    /// request body's upload when there is one.
    pub fn header(&self) -> Duration {
        self.responded.saturating_duration_since(self.sent)
    }

    /// The proxy's own share up to the response head: everything but the waits on others.
    pub fn proxy(&self) -> Duration {
        self.before() + self.write()
    }

    /// From the first attempt to the response head (the access log's `upstream_time`).
    pub fn upstream(&self) -> Duration {
        self.responded.saturating_duration_since(self.started)
    }

    /// The answering attempt, from its start to the response head: nginx's
    /// `$upstream_header_time`.
    pub fn attempt(&self) -> Duration {
        self.responded.saturating_duration_since(self.begun)
    }

    /// The time waited on backends up to the response head: the connects and the backend's
    /// answer, with failed attempts (`Server-Timing`'s `upstream`).
    pub fn waited(&self) -> Duration {
        self.retried() + self.connect.unwrap_or_default() + self.header()
    }

    /// The spans `Server-Timing` shows (`modules::server_timing`): the queue, the proxy's own
    /// share (the access log's `proxy_time`), and the waits on backends.
    pub fn shown(&self) -> crate::modules::Timing {
        crate::modules::Timing {
            queue: self.queue,
            proxy: self.proxy(),
            upstream: self.waited(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// 30 µs before the attempt, 22 µs writing, 20,113 µs waiting on the backend.
    fn timing() -> Timing {
        let at = Instant::now();
        let started = at + us(30);
        let sent = started + us(22);
        Timing::measured(
            at,
            Duration::ZERO,
            (started, started, None, Some(sent)),
            sent + us(20_113),
        )
    }

    #[test]
    fn spans_are_cut_at_the_attempts_instants() {
        let at = Instant::now();
        let ms = Duration::from_millis;
        let started = at + ms(5);
        let begun = started + ms(3);
        let sent = begun + ms(2);
        let now = sent + ms(20);
        let t = Timing::measured(at, ms(4), (started, begun, Some(ms(1)), Some(sent)), now);
        assert_eq!((t.queue, t.before(), t.retried()), (ms(4), ms(1), ms(3)));
        assert_eq!(
            (t.connect, t.write(), t.header()),
            (Some(ms(1)), ms(1), ms(20))
        );
        assert_eq!(t.responded, now);
        // The proxy's share is what is not waiting on others.
        assert_eq!(t.proxy(), ms(2));
        assert_eq!(t.waited(), ms(3 + 1 + 20));
        assert_eq!(t.upstream(), ms(3 + 1 + 1 + 20));
        assert_eq!(t.attempt(), ms(1 + 1 + 20));
        // Unread: the write is taken as instant.
        let unread = Timing::measured(at, ms(4), (started, begun, None, None), now);
        assert_eq!((unread.write(), unread.header()), (Duration::ZERO, ms(22)));
    }

    #[test]
    fn server_timing_shows_the_proxy_s_share_and_the_waits_on_the_backend() {
        let shown = timing().shown();
        assert_eq!(
            (shown.queue, shown.proxy, shown.upstream),
            (Duration::ZERO, us(52), us(20_113))
        );
    }
}
