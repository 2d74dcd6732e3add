//! Side requests: the copies a module asks for beside a request (`modules::SideRequest`,
//! `mirror`'s), each sent by a task of its own on the worker through the target upstream's
//! retry loop ([`forward`]): its balancing, pools, timeouts and counters. The request they copy
//! never waits for them. Each answer's body is read to its end (so the connection goes back to
//! the pool) and dropped.
//!
//! Copies not yet answered are counted per upstream across workers; past the side request's
//! `max_in_flight` a copy is dropped, counted (`pinlb_upstream_side_requests_dropped_total`)
//! and logged, summed: a slow or dead mirror holds that many copies, never more.
//!
//! A copy without a body goes at once. One with the body waits for it: the request's body is
//! read through a [`Tee`] that keeps what goes by (at most the copies' `max_body`), and they go
//! as soon as it has been read whole, with it; a larger body, or one never read whole, drops
//! them, counted.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tracing::debug;

use crate::config::Limits;
use crate::http1::common::Reply;
use crate::http1::common::RequestFraming;
use crate::http1::request::{ClientError, RequestHead};
use crate::modules::SideRequest;
use crate::proxy::body::ProxyBody;
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::proxy::error::ProxyError;
use crate::proxy::forward::{Overrides, PendingCopy, forward};
use crate::sys::summed::summed_warn;
use crate::upstream::local::WorkerUpstream;

/// Sends `side`, a copy of `head` (from the client at `peer`) with `body`, to `upstream`, unless
/// as many copies as it allows are in flight there already.
#[cold]
#[inline(never)]
pub(crate) fn send(
    upstream: &Rc<WorkerUpstream>,
    head: &RequestHead,
    peer: SocketAddr,
    side: &SideRequest,
    body: Option<Bytes>,
) {
    let shared = &upstream.shared;
    if shared.side_in_flight.fetch_add(1, Ordering::Relaxed) >= side.max_in_flight {
        shared.side_in_flight.fetch_sub(1, Ordering::Relaxed);
        let why = format!(
            "{} copies to this upstream are in flight already (mirror.max_in_flight)",
            side.max_in_flight
        );
        dropped(upstream, &why);
        return;
    }
    let copy = head.copy_without_body();
    let lines = [copy.lines(), &side.lines].concat();
    let upstream = upstream.clone();
    tokio::task::spawn_local(async move {
        let _slot = Slot(upstream.clone());
        let downstream = Downstream::new(peer, &[]);
        let overrides = Overrides {
            path: None,
            lines: Some(lines),
            timeouts: None,
            preferred: None,
            copies: Vec::new(),
            cache: None,
        };
        let limits = Limits::default();
        let idle = upstream.shared.config.timeouts.response;
        match own_request(&upstream, &downstream, &limits, (&copy, &overrides), body).await {
            Ok(mut reply) => drain(&mut reply.body, idle).await,
            Err(e) => {
                debug!(upstream = %upstream.shared.config.name, "a mirrored copy got no answer: {e}")
            }
        }
    });
}

/// A request of pinlb's own (a mirror's copy, a cache's background update) through `upstream`'s
/// retry loop, with `overrides` and `body`, untimed and with no lines added.
pub(crate) async fn own_request(
    upstream: &Rc<WorkerUpstream>,
    downstream: &Downstream,
    limits: &Limits,
    (head, overrides): (&RequestHead, &Overrides),
    body: Option<Bytes>,
) -> Result<Reply<ProxyBody>, ProxyError> {
    let request = (head, Some(overrides), &b""[..]);
    let mut body = CopyBody(body);
    let sent = forward(upstream, downstream, limits, request, &mut body, None, None).await;
    sent.map(|(reply, _)| reply)
}

/// Reads `body` to its end, dropping it, so its connection goes back to the pool; a body that
/// sends nothing for `idle` (the upstream's response timeout) is dropped there.
pub(crate) async fn drain(body: &mut ProxyBody, idle: std::time::Duration) {
    // Bounded: each pass reads a piece, or the body ends, breaks off or goes quiet.
    while let Ok(Some(Ok(_))) = tokio::time::timeout(idle, poll_fn(|cx| body.poll_data(cx))).await {
    }
}

/// A copy in flight, counted until it is dropped.
struct Slot(Rc<WorkerUpstream>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.shared.side_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts and logs (summed) a copy dropped, and why.
fn dropped(upstream: &WorkerUpstream, why: &str) {
    let shared = &upstream.shared;
    shared.side_dropped.fetch_add(1, Ordering::Relaxed);
    summed_warn!(upstream = %shared.config.name; "a mirrored copy was dropped: {why}");
}

/// A request's body on its way upstream; for a request with copies that take it, kept as it
/// goes (up to the largest of their `max_body`), and the copies sent as soon as it has been
/// read whole (or, when
/// it was never read whole or was larger, dropped and counted when the request ends). Every
/// request's body goes through one, so the plain path's forwarding is the same code as a
/// mirrored one's; keeping nothing, it costs a test per piece.
pub(crate) struct Tee<'b, B: DownstreamBody> {
    inner: &'b mut B,
    kept: Option<Box<Kept<'b>>>,
}

/// What a [`Tee`] keeps, and for whom.
struct Kept<'b> {
    bytes: Vec<u8>,
    /// The most it keeps: the largest `max_body` of its copies.
    limit: usize,
    /// More went by than is kept.
    over: bool,
    copies: &'b [PendingCopy],
    head: &'b RequestHead,
}

impl<'b, B: DownstreamBody> Tee<'b, B> {
    /// `inner`, kept as it goes for `copies` of `head` (none: nothing is kept).
    #[inline(always)]
    pub(crate) fn new(inner: &'b mut B, copies: &'b [PendingCopy], head: &'b RequestHead) -> Self {
        let kept = (!copies.is_empty()).then(|| {
            Box::new(Kept {
                bytes: Vec::new(),
                limit: copies.iter().map(|c| c.side.max_body).max().unwrap_or(0),
                over: false,
                copies,
                head,
            })
        });
        Tee { inner, kept }
    }

    /// The body is over: the copies go with it, or are dropped if it was larger than kept.
    #[cold]
    #[inline(never)]
    fn over(&mut self) {
        let Some(kept) = self.kept.take() else {
            return;
        };
        let Kept {
            bytes,
            over,
            copies,
            head,
            ..
        } = *kept;
        // One buffer, shared by the copies.
        let body = Bytes::from(bytes);
        for c in copies {
            match !over && body.len() <= c.side.max_body {
                true => send(&c.upstream, head, c.peer, &c.side, Some(body.clone())),
                false => {
                    let why = format!(
                        "its body is larger than the {} bytes a copy keeps (mirror.max_body)",
                        c.side.max_body
                    );
                    dropped(&c.upstream, &why);
                }
            }
        }
    }
}

impl<B: DownstreamBody> Drop for Tee<'_, B> {
    fn drop(&mut self) {
        if self.kept.is_some() {
            // Whole but never read to its end (`Content-Length: 0`, or its last piece's end
            // unseen): the copies go. Never read whole (the backend answered first, or the
            // request failed): they are dropped.
            match self.inner.is_done() {
                true => self.over(),
                false => cold_end(self.kept.take()),
            }
        }
    }
}

/// A [`Tee`] whose body was never read whole: its copies are dropped.
#[cold]
#[inline(never)]
fn cold_end(kept: Option<Box<Kept<'_>>>) {
    for c in kept.iter().flat_map(|k| k.copies) {
        dropped(&c.upstream, "the request's body was not read whole");
    }
}

impl<B: DownstreamBody> DownstreamBody for Tee<'_, B> {
    #[inline(always)]
    fn framing(&self) -> RequestFraming {
        self.inner.framing()
    }

    #[inline(always)]
    fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    #[inline(always)]
    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        let piece = self.inner.next().await?;
        if let Some(kept) = &mut self.kept {
            if let Some(p) = &piece {
                if kept.bytes.len() + p.len() <= kept.limit {
                    kept.bytes.extend_from_slice(p);
                } else {
                    kept.over = true;
                }
            }
            if piece.is_none() || self.inner.is_done() {
                self.over();
            }
        }
        Ok(piece)
    }

    #[inline(always)]
    fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        self.inner.take_trailers()
    }
}

/// A copy's body: the one kept, or none.
struct CopyBody(Option<Bytes>);

impl DownstreamBody for CopyBody {
    fn framing(&self) -> RequestFraming {
        match &self.0 {
            Some(b) if !b.is_empty() => RequestFraming::Length(b.len() as u64),
            _ => RequestFraming::None,
        }
    }

    fn is_done(&self) -> bool {
        self.0.as_ref().is_none_or(Bytes::is_empty)
    }

    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        Ok(self.0.take().filter(|b| !b.is_empty()))
    }
}
