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
//! read through a [`Tee`] that keeps what goes by (at most [`KEPT_MAX`]), and the copies go
//! when the request has its answer ([`send_kept`]), with the body if it was read whole within
//! the bound; otherwise they are dropped and counted.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tracing::debug;

use crate::config::Limits;
use crate::http1::common::RequestFraming;
use crate::http1::request::{ClientError, RequestHead};
use crate::modules::SideRequest;
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::proxy::forward::{Overrides, PendingCopy, forward};
use crate::sys::summed::summed_warn;
use crate::upstream::local::WorkerUpstream;

/// The most of a request's body kept for its copies.
pub(crate) const KEPT_MAX: usize = 64 * 1024;

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
        };
        let request = (&copy, Some(&overrides), &b""[..]);
        let (limits, mut body) = (Limits::default(), Kept(body));
        match forward(
            &upstream,
            &downstream,
            &limits,
            request,
            &mut body,
            None,
            None,
        )
        .await
        {
            Ok((mut reply, _)) => {
                // Bounded by the upstream's timeouts: its body ends, breaks off or times out.
                while let Some(Ok(_)) = poll_fn(|cx| reply.body.poll_data(cx)).await {}
            }
            Err(e) => {
                debug!(upstream = %upstream.shared.config.name, "a mirrored copy got no answer: {e}")
            }
        }
    });
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

/// After the request has its answer: its copies that wait for the body, sent with what `kept`
/// kept of it, or dropped when it did not keep it whole.
#[cold]
#[inline(never)]
pub(crate) fn send_kept<B: DownstreamBody>(
    copies: &[PendingCopy],
    head: &RequestHead,
    kept: Tee<'_, B>,
) {
    let body = kept.whole();
    for c in copies {
        match &body {
            Ok(body) => send(&c.upstream, head, c.peer, &c.side, Some(body.clone())),
            Err(why) => dropped(&c.upstream, why),
        }
    }
}

/// A request's body on its way upstream, kept as it goes (up to [`KEPT_MAX`]) for its copies.
pub(crate) struct Tee<'b, B> {
    inner: &'b mut B,
    kept: Vec<u8>,
    /// More went by than is kept.
    over: bool,
}

impl<'b, B: DownstreamBody> Tee<'b, B> {
    pub(crate) fn new(inner: &'b mut B) -> Self {
        Tee {
            inner,
            kept: Vec::new(),
            over: false,
        }
    }

    /// The body, when it was read whole within the bound; why not, otherwise.
    fn whole(self) -> Result<Bytes, &'static str> {
        match (self.over, self.inner.is_done()) {
            (true, _) => Err("its body is larger than the 64 KiB a copy keeps"),
            (false, false) => Err("the request's body was not read whole"),
            (false, true) => Ok(Bytes::from(self.kept)),
        }
    }
}

impl<B: DownstreamBody> DownstreamBody for Tee<'_, B> {
    fn framing(&self) -> RequestFraming {
        self.inner.framing()
    }

    fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        let piece = self.inner.next().await?;
        if let Some(p) = &piece {
            if self.kept.len() + p.len() <= KEPT_MAX {
                self.kept.extend_from_slice(p);
            } else {
                self.over = true;
            }
        }
        Ok(piece)
    }

    fn take_trailers(&mut self) -> Option<http::HeaderMap> {
        self.inner.take_trailers()
    }
}

/// A copy's body: the one kept, or none.
struct Kept(Option<Bytes>);

impl DownstreamBody for Kept {
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
