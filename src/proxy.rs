//! The request path: pick a backend, forward the request, stream the response back.
//!
//! Per request this does no locking and, on the common path, allocates nothing beyond what hyper
//! itself needs: the client's body streams to the backend as it arrives, the backend's body
//! streams back, and the upstream connection returns to the worker's pool when the response body
//! ends.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use crate::upstream::{FAIL_TIMEOUT, InFlight, Sender, WorkerUpstream};

/// Everything one client connection's requests need to know about the client.
pub struct Client {
    /// The client's IP, rendered once per connection for X-Forwarded-For.
    pub xff: HeaderValue,
}

impl Client {
    pub fn new(peer: SocketAddr) -> Self {
        let ip = peer.ip().to_string();
        // An IP address is always a valid header value.
        let xff = HeaderValue::from_str(&ip).unwrap_or(HeaderValue::from_static("unknown"));
        Client { xff }
    }
}

/// Why a request could not be answered by a backend. Each kind maps to one status, in
/// [`ProxyError::status`].
#[derive(Debug)]
pub enum ProxyError {
    /// Every backend is skipped: each failed within the last [`FAIL_TIMEOUT`].
    NoBackend,
    /// Every backend was tried and failed to connect, or the chosen one failed mid-exchange.
    BadGateway { backend: SocketAddr, cause: String },
    /// The backend did not send response headers within `timeouts.response`.
    Timeout {
        backend: SocketAddr,
        after: Duration,
    },
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoBackend => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BadGateway { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::NoBackend => f.write_str(
                "no backend available: every backend failed within the last fail_timeout",
            ),
            ProxyError::BadGateway { backend, cause } => {
                write!(f, "backend {backend} failed: {cause}")
            }
            ProxyError::Timeout { backend, after } => {
                write!(
                    f,
                    "backend {backend} sent no response headers within {after:?}"
                )
            }
        }
    }
}

/// Headers that describe one hop, not the message; never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Removes hop-by-hop headers, including every header the Connection header names, and says
/// whether Connection asked to close.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // One pass comparing names first: most messages carry no hop-by-hop header, or only
    // `Connection: keep-alive`, and comparing names is cheaper than seven hash lookups.
    let mut present = 0u8;
    for k in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == k) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return false;
    }
    let mut close = false;
    let mut named: Vec<HeaderName> = Vec::new();
    for token in headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
    {
        if token.eq_ignore_ascii_case("close") {
            close = true;
        } else if !token.eq_ignore_ascii_case("keep-alive") {
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                named.push(name);
            }
        }
    }
    for name in named {
        headers.remove(name);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    close
}

/// Rewrites a client request into the one sent upstream: hop-by-hop headers removed, the client's
/// address appended to X-Forwarded-For, X-Forwarded-Proto set, origin-form URI, HTTP/1.1.
///
/// `Expect: 100-continue` is answered by pinlb itself (hyper sends `100 Continue` when the body is
/// first read, which happens once a backend connection is ready), so it is not forwarded, as nginx
/// does.
pub fn prepare_request(parts: &mut http::request::Parts, client: &Client) {
    let h = &mut parts.headers;
    strip_hop_by_hop(h);
    h.remove(header::EXPECT);
    match h.entry(X_FORWARDED_FOR) {
        header::Entry::Vacant(e) => {
            e.insert(client.xff.clone());
        }
        header::Entry::Occupied(mut e) => {
            // Several XFF lines are one comma-separated list; fold them and append the client.
            let mut joined = Vec::new();
            for v in e.iter() {
                if !joined.is_empty() {
                    joined.extend_from_slice(b", ");
                }
                joined.extend_from_slice(v.as_bytes());
            }
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(client.xff.as_bytes());
            match HeaderValue::from_bytes(&joined) {
                Ok(v) => {
                    e.insert(v);
                }
                Err(_) => {
                    e.insert(client.xff.clone());
                }
            }
        }
    }
    h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
        // Absolute-form from the client: backends expect origin-form.
        let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        parts.uri = Uri::try_from(pq).unwrap_or_else(|_| Uri::from_static("/"));
    }
    parts.version = Version::HTTP_11;
}

/// Forwards one request. Never fails at the hyper level: every failure becomes an error response.
pub async fn handle(
    upstream: Rc<WorkerUpstream>,
    client: Rc<Client>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let method = req.method().clone();
    match forward(&upstream, &client, req).await {
        Ok(resp) => Ok(resp),
        Err(e) => {
            warn!(upstream = %upstream.shared.config.name, "{method} answered {}: {e}", e.status().as_u16());
            Ok(error_response(&e, &method))
        }
    }
}

async fn forward(
    upstream: &Rc<WorkerUpstream>,
    client: &Client,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    prepare_request(&mut parts, client);
    let timeouts = upstream.shared.config.timeouts;

    // Connect failures move on to the next backend: nothing was sent, so trying elsewhere is
    // always safe. Each backend is tried at most once per request.
    // A backend whose connect failed recently is skipped, as with nginx's max_fails=1
    // fail_timeout=10s; a lone backend never is, since skipping it cannot help.
    let backends = &upstream.shared.backends;
    let n = backends.len();
    let mut tried = Tried::new(n);
    let mut last_error: Option<ProxyError> = None;
    let (backend, conn) = loop {
        let Some(b) = upstream.pick(|i| !tried.contains(i) && (n == 1 || !backends[i].is_failed()))
        else {
            return Err(last_error.unwrap_or(ProxyError::NoBackend));
        };
        tried.insert(b);
        let addr = backends[b].address;
        if let Some(conn) = upstream.checkout(b).await {
            break (b, conn);
        }
        match connect(addr, timeouts.connect).await {
            Ok(conn) => {
                backends[b].mark_ok();
                break (b, conn);
            }
            Err(cause) => {
                warn!(backend = %addr, "connect failed: {cause}; skipping it for {FAIL_TIMEOUT:?}, trying the next backend");
                backends[b].mark_failed();
                last_error = Some(ProxyError::BadGateway {
                    backend: addr,
                    cause,
                });
            }
        }
    };
    let addr = upstream.shared.backends[backend].address;
    let guard = InFlight::new(upstream.shared.clone(), backend);

    let mut conn = conn;
    let mut req = Request::from_parts(parts, body);
    let sent = tokio::time::timeout(timeouts.response, async {
        loop {
            match conn.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => match e.take_message() {
                    // The pooled connection went stale before the request left: nothing reached
                    // the backend, so a fresh connection to the same backend is safe.
                    Some(back) => {
                        debug!(backend = %addr, "stale pooled connection, reconnecting");
                        req = back;
                        conn = connect(addr, timeouts.connect).await.map_err(|cause| {
                            ProxyError::BadGateway {
                                backend: addr,
                                cause,
                            }
                        })?;
                    }
                    None => {
                        return Err(ProxyError::BadGateway {
                            backend: addr,
                            cause: describe_hyper(&e.into_error()),
                        });
                    }
                },
            }
        }
    })
    .await;
    let resp = match sent {
        Ok(r) => r?,
        Err(_) => {
            return Err(ProxyError::Timeout {
                backend: addr,
                after: timeouts.response,
            });
        }
    };

    let (mut parts, body) = resp.into_parts();
    let reusable = !strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::HTTP_11;
    let body = ProxyBody::Upstream {
        body,
        release: Some(Release {
            _guard: guard,
            conn: reusable.then(|| (upstream.clone(), backend, conn)),
        }),
    };
    Ok(Response::from_parts(parts, body))
}

/// Opens a new keep-alive connection to a backend and starts its connection task on this worker.
async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Sender, String> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(describe_io(&e)),
        Err(_) => return Err(format!("connect timed out after {timeout:?}")),
    };
    // Small requests and responses must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| describe_hyper(&e))?;
    tokio::task::spawn_local(async move {
        if let Err(e) = conn.await {
            debug!(backend = %addr, "upstream connection ended: {e}");
        }
    });
    Ok(sender)
}

fn describe_io(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => "connection refused".into(),
        ConnectionReset => "connection reset".into(),
        TimedOut => "connect timed out".into(),
        _ => e.to_string(),
    }
}

fn describe_hyper(e: &hyper::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// The set of backends already tried for one request.
struct Tried {
    small: u64,
    large: Vec<bool>,
}

impl Tried {
    fn new(n: usize) -> Self {
        Tried {
            small: 0,
            large: if n > 64 { vec![false; n] } else { Vec::new() },
        }
    }
    fn contains(&self, i: usize) -> bool {
        if self.large.is_empty() {
            self.small & (1 << i) != 0
        } else {
            self.large[i]
        }
    }
    fn insert(&mut self, i: usize) {
        if self.large.is_empty() {
            self.small |= 1 << i;
        } else {
            self.large[i] = true;
        }
    }
}

/// A short text response for a request pinlb had to answer itself.
fn error_response(e: &ProxyError, method: &Method) -> Response<ProxyBody> {
    let status = e.status();
    let text = format!(
        "{} {}: {e}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let len = text.len();
    let body = if method == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from(text)
    };
    let mut resp = Response::new(ProxyBody::Local(Some(body)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    resp
}

/// What to do when an upstream response body is over.
pub struct Release {
    _guard: InFlight,
    /// The connection goes back to the pool only after a complete exchange; `None` when the
    /// backend asked to close it.
    conn: Option<(Rc<WorkerUpstream>, usize, Sender)>,
}

impl Release {
    fn finish(self) {
        if let Some((upstream, backend, conn)) = self.conn {
            upstream.checkin(backend, conn);
        }
    }
}

/// The body of a response to a client.
pub enum ProxyBody {
    /// Streamed from a backend.
    Upstream {
        body: Incoming,
        release: Option<Release>,
    },
    /// Made by pinlb (an error page).
    Local(Option<Bytes>),
}

impl ProxyBody {
    fn release(&mut self, complete: bool) {
        if let ProxyBody::Upstream { release, .. } = self {
            if let Some(r) = release.take() {
                if complete {
                    r.finish();
                }
                // Otherwise dropping `r` closes the upstream connection: its exchange is unfinished.
            }
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = Box<dyn StdError + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut *self {
            ProxyBody::Upstream { body, .. } => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(None) => {
                    self.release(true);
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Err(e))) => {
                    self.release(false);
                    Poll::Ready(Some(Err(e.into())))
                }
                other => other.map_err(Into::into),
            },
            ProxyBody::Local(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Upstream { body, .. } => body.is_end_stream(),
            ProxyBody::Local(data) => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Upstream { body, .. } => body.size_hint(),
            ProxyBody::Local(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl Drop for ProxyBody {
    fn drop(&mut self) {
        // hyper may drop a body it knows is empty (HEAD, 204, 304, Content-Length: 0) without
        // polling it; that exchange is still complete and its connection reusable.
        let complete = matches!(self, ProxyBody::Upstream { body, .. } if body.is_end_stream());
        self.release(complete);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut h = headers(&[
            ("connection", "keep-alive, X-Secret"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-secret", "1"),
            ("x-kept", "2"),
            ("host", "example.com"),
        ]);
        assert!(!strip_hop_by_hop(&mut h));
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-kept", "host"]);
    }

    #[test]
    fn connection_close_is_reported_and_plain_headers_are_untouched() {
        let mut h = headers(&[("connection", "Keep-Alive, close"), ("x-a", "1")]);
        assert!(strip_hop_by_hop(&mut h));
        assert_eq!(h.len(), 1);
        let mut h = headers(&[("x-a", "1"), ("content-length", "3")]);
        assert!(!strip_hop_by_hop(&mut h));
        assert_eq!(h.len(), 2);
    }

    fn request(uri: &str, hs: &[(&str, &str)]) -> http::request::Parts {
        let mut b = Request::builder().uri(uri).version(Version::HTTP_10);
        for (k, v) in hs {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn forwarded_for_is_set_or_appended() {
        let client = Client::new("10.1.2.3:5555".parse().unwrap());
        let mut p = request("/", &[]);
        prepare_request(&mut p, &client);
        assert_eq!(p.headers["x-forwarded-for"], "10.1.2.3");
        assert_eq!(p.headers["x-forwarded-proto"], "http");
        assert_eq!(p.version, Version::HTTP_11);

        let mut p = request(
            "/",
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("X-Forwarded-For", "2.2.2.2"),
            ],
        );
        prepare_request(&mut p, &client);
        assert_eq!(p.headers.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(p.headers["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.1.2.3");
    }

    #[test]
    fn host_is_kept_and_expect_is_answered_locally() {
        let client = Client::new("[::1]:1".parse().unwrap());
        let mut p = request(
            "/a?b",
            &[("host", "app.example"), ("expect", "100-continue")],
        );
        prepare_request(&mut p, &client);
        assert_eq!(p.headers["host"], "app.example");
        assert!(!p.headers.contains_key("expect"));
        assert_eq!(p.headers["x-forwarded-for"], "::1");
    }

    #[test]
    fn absolute_form_becomes_origin_form() {
        let client = Client::new("127.0.0.1:1".parse().unwrap());
        let mut p = request("http://example.com/x/y?z=1", &[]);
        prepare_request(&mut p, &client);
        assert_eq!(p.uri, "/x/y?z=1");
    }

    #[test]
    fn tried_set_handles_many_backends() {
        for n in [3, 64, 65, 300] {
            let mut t = Tried::new(n);
            assert!(!t.contains(n - 1));
            t.insert(n - 1);
            assert!(t.contains(n - 1));
            assert!(!t.contains(0));
        }
    }

    #[test]
    fn each_error_maps_to_one_status() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(ProxyError::NoBackend.status(), 503);
        assert_eq!(
            ProxyError::BadGateway {
                backend: a,
                cause: "x".into()
            }
            .status(),
            502
        );
        assert_eq!(
            ProxyError::Timeout {
                backend: a,
                after: Duration::from_secs(1)
            }
            .status(),
            504
        );
    }
}
