//! One request as the client side hands it to the proxy ([`DownstreamRequest`]), and the
//! proxy's answer to it ([`Answer`]): what `handle` and the route's cache (`cache`) take and
//! give back.

use crate::http1::common::Reply;
use crate::http1::request::{ClientError, RequestHead};
use crate::http1::timer::Timer;
use crate::proxy::accesslog::Upstreamed;
use crate::proxy::body::ProxyBody;
use crate::proxy::forward::Overrides;

/// The proxy's answer to one request.
pub struct Answer {
    pub response: Reply<ProxyBody>,
    /// When the request is timed: which backend answered, and where the time went. Boxed:
    /// an answer that carries none (the plain path's) stays small to move.
    pub upstreamed: Option<Box<Upstreamed>>,
    /// The client is at fault: its connection closes after the answer, since what follows on it
    /// (an unread body, a confused framing) can't be trusted.
    pub close: bool,
}

/// One request as the client side hands it to the proxy.
pub struct DownstreamRequest<'a, B> {
    /// The head `http1::request` parsed.
    pub head: &'a RequestHead,
    /// What the request's route changes, if it changes anything.
    pub overrides: Option<&'a Overrides>,
    /// The body, read off the client connection as it is sent on.
    pub body: &'a mut B,
    /// Set when the parser refused the request: it is answered at once, never forwarded.
    pub refused: Option<ClientError>,
    /// Lines pinlb adds to the request (its ID, a started traceparent); empty for most.
    pub added: &'a [u8],
    /// The answer carries the request's spans ([`Answer::upstreamed`]), when it is timed: the
    /// access log or `Server-Timing` reads them.
    pub spans: bool,
    /// The client connection's timer for the wait for an HTTP/1.1 backend's response head,
    /// polled by the connection's one task request after request; `None` uses the backend
    /// connection's own (see `http1::timer`).
    pub waiter: Option<&'a mut Timer>,
}
