//! One request's way to its answer: its route's cache (`cache`, before and after), the
//! forwarding it takes (its body read whole first, a sticky cookie's backend, or the plain retry
//! loop), a mirror's copy of its body kept on the way (`side_request`), and every failure made
//! an error response.

use std::rc::Rc;
use std::time::Instant;

use crate::config::Limits;
use crate::proxy::cache::{self, Before, Forwarded};
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::proxy::error::{ProxyError, error_response};
use crate::proxy::exchange::{Answer, DownstreamRequest};
use crate::proxy::forward::{forward, forward_buffered, sticky_forward};
use crate::proxy::side_request::Tee;
use crate::sys::summed::summed_warn;
use crate::upstream::local::WorkerUpstream;

/// Forwards one request, or answers its `refused` at once. Never fails: every failure becomes
/// an error response. With `at` (when the head arrived; given when the access log,
/// `Server-Timing` or `/metrics` reads the request's times), a response from a backend comes
/// with its [`Upstreamed`]: which backend, and where the time went.
///
/// The request goes upstream as HTTP/1.1, origin-form, with Host first and X-Forwarded-For and
/// X-Forwarded-Proto last. The parser already left out the hop-by-hop headers and Expect:
/// `100 Continue` is pinlb's own answer, sent when the body is first read, once a backend
/// connection is ready, as nginx does (at once, when the upstream buffers request bodies).
pub async fn handle(
    upstream: Rc<WorkerUpstream>,
    downstream: Rc<Downstream>,
    limits: Limits,
    at: Option<Instant>,
    request: DownstreamRequest<'_, impl DownstreamBody>,
) -> Answer {
    let DownstreamRequest {
        head,
        overrides,
        body,
        refused,
        added,
        spans,
        waiter,
    } = request;
    // A route with a cache: answered from it, or on to a backend with what the cache makes of
    // the answer after. Boxed: the plain path's future carries none of its state.
    let cached = overrides.and_then(|o| o.cache.as_ref());
    let mut through = None;
    if let Some(cached) = cached {
        let before = cache::before(
            cached,
            (&upstream, &downstream, &limits),
            head,
            overrides,
            &refused,
        );
        match Box::pin(before).await {
            Before::Answered(answer) => return answer,
            Before::Forward(forwarded) => through = Some(forwarded),
        }
    }
    // A revalidation asks with the stored response's validators.
    let overrides = through
        .as_deref()
        .and_then(Forwarded::overrides)
        .or(overrides);
    let method = &head.method;
    let forwarded = match refused {
        Some(e) => Err(ProxyError::Downstream(e)),
        None => {
            let request = (head, overrides, added);
            let timed = at.map(|at| (at, spans));
            // A mirror's copies that take the body: it is kept as it goes, and they are sent
            // once it has been read. For every other request the tee keeps nothing.
            let copies = overrides.map_or(&[][..], |o| &o.copies[..]);
            let body = &mut Tee::new(body, copies, head);
            match &upstream.shared.config.buffering {
                // Boxed: the plain path's future carries none of the buffered one's state.
                Some(b) if b.request && !body.is_done() => {
                    let buffered =
                        forward_buffered(&upstream, &downstream, &limits, b, request, body, timed);
                    Box::pin(buffered).await
                }
                // Boxed: the plain path's future does not grow by the sticky one's state.
                _ if upstream.shared.sticky.is_some() => {
                    let (up, down) = (&upstream, &downstream);
                    let sticky = sticky_forward(up, down, &limits, request, body, timed, waiter);
                    Box::pin(sticky).await
                }
                _ => {
                    forward(
                        &upstream,
                        &downstream,
                        &limits,
                        request,
                        body,
                        timed,
                        waiter,
                    )
                    .await
                }
            }
        }
    };
    let answer = match forwarded {
        Ok((response, upstreamed)) => Answer {
            response,
            upstreamed,
            close: false,
        },
        Err(e) => {
            let status = e.status().as_u16();
            // The log line blames the side at fault: a client's bad request is not the
            // upstream's.
            let close = matches!(e, ProxyError::Downstream(_));
            if close {
                summed_warn!(client = %downstream.ip; "{method} answered {status}: {e}");
            } else {
                summed_warn!(upstream = %upstream.shared.config.name; "{method} answered {status}: {e}");
            }
            Answer {
                response: error_response(&e, method),
                upstreamed: None,
                close,
            }
        }
    };
    match (cached, through) {
        (Some(cached), Some(forwarded)) => cache::after(cached, forwarded, head, answer),
        _ => answer,
    }
}
