//! What the request pipeline ([`pipeline::run`](super::pipeline::run)) asks of a protocol: a
//! downstream session. HTTP/1.1 ([`h1`](super::h1): one exchange of a connection) and HTTP/2
//! ([`h2`](super::h2): one stream) are sessions; HTTP/3 will be one more. The pipeline runs the
//! request's phases in one order for all of them; how a head arrives, how the body is read, how
//! the client's leaving shows, and how the answer goes out (a trailer, a 1xx, a tunnel,
//! keep-alive) are the session's business.
//!
//! The trait is static: `run` is generic over the session, so each protocol gets its own copy
//! of the pipeline, with the session's methods inlined into it, and no virtual call.

use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crate::config::Timeouts;
use crate::http1::common::Reply;
use crate::http1::request::RequestHead;
use crate::http1::timer::Timer;
use crate::proxy::accesslog::{Batch, Logged};
use crate::proxy::body::ProxyBody;
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::route::decision::{Plan, Route};
use crate::tls::client_identity::ClientIdentity;

/// One request's side of a client connection, as the pipeline sees it.
pub(crate) trait Session {
    /// How the exchange ends: HTTP/1.1's next step for the connection, HTTP/2's response for
    /// hyper to send.
    type Out;
    /// Where a head that is not whole yet (or can't be served) stands, for [`read_head`].
    ///
    /// [`read_head`]: Session::read_head
    type Partial;
    /// The request body as the proxy reads it.
    type Body<'s>: DownstreamBody
    where
        Self: 's;
    /// Ends, with how the exchange ends then, when the client leaves while its request is with
    /// a backend; a protocol whose client abandons a request by resetting its stream (HTTP/2:
    /// hyper drops the exchange) never ends it.
    type Gone<'s>: Future<Output = Self::Out>
    where
        Self: 's;
    /// What sending an answer came to, for [`sent`](Session::sent).
    type Sent;

    /// The plan the request is served under: taken before its head is read (HTTP/1.1: a reload
    /// while the head arrives applies to the next request) or when its stream opened (HTTP/2).
    fn plan(&self, route: &Route) -> Rc<Plan>;

    /// The request head, when it is already here whole (nearly always). Returned straight into
    /// the pipeline's own future, not out of one of the session's: a head moved out of a
    /// future costs about 90 instructions a request (HTTP/1.1's `parse_whole`).
    fn head(&mut self, plan: &Plan) -> Result<RequestHead, Self::Partial>;

    /// The rest of the head read, or how the exchange ends without one: the client left, or
    /// its head was answered by the session (malformed, too large, too late).
    async fn read_head(
        &mut self,
        plan: &Plan,
        partial: Self::Partial,
    ) -> Result<RequestHead, Self::Out>;

    /// When the request began, where the plan measures time (`Plan::timed`).
    fn started(&self, plan: &Plan) -> Option<Instant>;

    /// The client's address (the PROXY protocol's, on such a listener).
    fn peer(&self) -> SocketAddr;

    /// The client as the request goes upstream, under the plan's rules.
    fn client(&self, plan: &Plan) -> Rc<Downstream>;

    /// The worker's access-log batch, on a listener that logs.
    fn batch(&self) -> Option<&Rc<Batch>>;

    /// What the client's certificate says, on a listener with `client_ca`.
    fn client_identity(&self) -> Option<&Arc<ClientIdentity>>;

    /// What the proxy needs while it forwards the request: its body, the client's leaving, and
    /// the timer to wait on.
    fn forwarding(&mut self, head: &RequestHead) -> Forwarding<'_, Self>;

    /// Sends the answer, once every phase ran: the future the pipeline awaits itself, so
    /// that the answer is moved once, into it (one more future around it cost about 110
    /// instructions a request).
    fn send<'a>(
        &'a mut self,
        response: Reply<ProxyBody>,
        logged: Logged,
        ending: &Ending<'a>,
    ) -> impl Future<Output = Self::Sent> + 'a;

    /// How the exchange ends, once the answer went (or broke off).
    fn sent(&mut self, sent: Self::Sent, ending: &Ending<'_>) -> Self::Out;

    /// A `101 Switching Protocols` instead: the backend took the client's upgrade, and the
    /// connection becomes a tunnel. Only HTTP/1.1 asks for one (HTTP/2 has no upgrade, and
    /// its requests' heads never ask).
    async fn upgrade(
        &mut self,
        response: Reply<ProxyBody>,
        logged: Logged,
        ending: Ending<'_>,
    ) -> Self::Out;
}

/// [`Session::forwarding`]'s parts, borrowed from the session while the proxy has the request.
pub(crate) struct Forwarding<'s, S: Session + ?Sized + 's> {
    pub body: S::Body<'s>,
    pub gone: S::Gone<'s>,
    /// The timer the proxy's waits register with; `None` for one of their own.
    pub waiter: Option<&'s mut Timer>,
}

/// What the session needs to know to send an answer, besides the answer.
pub(crate) struct Ending<'a> {
    pub head: &'a RequestHead,
    pub plan: &'a Plan,
    /// The request's timeouts (its route's, or its upstream's): `response` bounds each wait for
    /// the body; over HTTP/1.1 `client_idle` bounds each wait for the client to take it (an
    /// HTTP/2 connection's stalled streams are bounded by its listener's upstream's, checked
    /// per connection).
    pub timeouts: Timeouts,
    /// The connection closes after it (HTTP/1.1's: a backend's `Connection: close`, or a
    /// request a module refused to serve on it).
    pub close: bool,
    /// The whole request body was read.
    pub body_read: bool,
    pub at: Option<Instant>,
}
