//! Side requests: the copies a module asks for beside a request (`modules::SideRequest`,
//! `mirror`'s), each sent by a task of its own on the worker through the target upstream's
//! retry loop ([`forward`]): its balancing, pools, timeouts and counters. The request they copy
//! never waits for them. Each answer's body is read to its end (so the connection goes back to
//! the pool) and dropped.
//!
//! Copies not yet answered are counted per upstream across workers; past the side request's
//! `max_in_flight` a copy is dropped, counted (`pinlb_upstream_side_requests_dropped_total`)
//! and logged, summed: a slow or dead mirror holds that many copies, never more.

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
use crate::proxy::forward::{Overrides, forward};
use crate::sys::summed::summed_warn;
use crate::upstream::local::WorkerUpstream;

/// Sends `side`, a copy of `head` (from the client at `peer`), to `upstream`, unless as many
/// copies as it allows are in flight there already.
#[cold]
#[inline(never)]
pub(crate) fn send(
    upstream: &Rc<WorkerUpstream>,
    head: &RequestHead,
    peer: SocketAddr,
    side: SideRequest,
) {
    let shared = &upstream.shared;
    if shared.side_in_flight.fetch_add(1, Ordering::Relaxed) >= side.max_in_flight {
        shared.side_in_flight.fetch_sub(1, Ordering::Relaxed);
        shared.side_dropped.fetch_add(1, Ordering::Relaxed);
        summed_warn!(
            upstream = %shared.config.name;
            "a mirrored copy was dropped: {} copies to this upstream are in flight already (mirror.max_in_flight)",
            side.max_in_flight
        );
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
        };
        let request = (&copy, Some(&overrides), &b""[..]);
        let limits = Limits::default();
        match forward(
            &upstream,
            &downstream,
            &limits,
            request,
            &mut NoBody,
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

/// A copy's body: none.
struct NoBody;

impl DownstreamBody for NoBody {
    fn framing(&self) -> RequestFraming {
        RequestFraming::None
    }

    fn is_done(&self) -> bool {
        true
    }

    async fn next(&mut self) -> Result<Option<Bytes>, ClientError> {
        Ok(None)
    }
}
