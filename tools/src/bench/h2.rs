//! `--h2`: HTTP/2 load, h2load's way: each connection carries `--streams` requests at once, and
//! each stream sends its next request as soon as its response has been read (closed loop per
//! stream). Prior knowledge on `http://`, ALPN `h2` on `https://`.
//!
//! The client is hyper's (`hyper::client::conn::http2`), its connection driver and its streams
//! tasks on the load thread's own single-threaded runtime, so a thread's connections stay on its
//! pinned core as the HTTP/1.1 loop's do. Every stream of a thread shares the thread's counts and
//! histogram exactly as HTTP/1.1 exchanges do (`Thread::record`): a request belongs to the
//! recorded window when it is sent inside it, nothing is sent after the window closes, and every
//! request sent is waited for up to the timeout and counted. Latency runs from handing the
//! request to hyper to the end of the response body.
//!
//! A connection whose stream breaks (GOAWAY, reset, a closed socket) is opened anew once all its
//! streams have ended, as an HTTP/1.1 connection is after a broken exchange.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};

use super::thread::{Failed, Outcome, Thread, connect};
use super::tls::{Stream, Tls};
use super::wire::RequestSpec;
use pinlb::sys::exec::LocalExec;

/// What every HTTP/2 request of a target is, built once.
#[derive(Debug, Clone)]
pub(crate) struct H2Plan {
    /// Concurrent streams per connection.
    pub streams: usize,
    request: Request<Full<Bytes>>,
}

impl H2Plan {
    /// The request `spec` asks for on `url`: `:authority` from the URL unless a `Host` header
    /// is given (which then becomes the authority, as h2load's `-H host:` does), the other
    /// headers as fields.
    pub(crate) fn new(url: &Uri, spec: &RequestSpec, streams: usize) -> Result<H2Plan, String> {
        let mut uri = url.clone();
        let mut headers = http::HeaderMap::new();
        for (name, value) in &spec.headers {
            let bad = |e: &dyn std::fmt::Display| format!("header {name:?}: {e}");
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(&e))?;
            let value = HeaderValue::from_str(value).map_err(|e| bad(&e))?;
            if name == http::header::HOST {
                let mut parts = uri.into_parts();
                parts.authority = Some(
                    value
                        .to_str()
                        .unwrap_or_default()
                        .parse()
                        .map_err(|e: http::uri::InvalidUri| bad(&e))?,
                );
                uri = Uri::from_parts(parts).map_err(|e| bad(&e))?;
                continue;
            }
            headers.append(name, value);
        }
        let body = spec.body.clone().unwrap_or_default();
        let mut request = Request::builder()
            .method(spec.method.clone())
            .uri(uri)
            .version(http::Version::HTTP_2)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        *request.headers_mut() = headers;
        Ok(H2Plan { streams, request })
    }

    fn request(&self) -> Request<Full<Bytes>> {
        let mut r = Request::new(self.request.body().clone());
        *r.method_mut() = self.request.method().clone();
        *r.uri_mut() = self.request.uri().clone();
        *r.version_mut() = http::Version::HTTP_2;
        *r.headers_mut() = self.request.headers().clone();
        r
    }
}

/// Why an HTTP/2 connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("{0}")]
    Connect(io::Error),
    #[error("the server did not select h2 by ALPN (it offered HTTP/1.1 only, or nothing)")]
    NoAlpn,
    #[error("HTTP/2 handshake failed: {0}")]
    Handshake(hyper::Error),
}

/// Connects, checks ALPN on TLS, and starts hyper's HTTP/2 client with its driver spawned on
/// this thread.
pub(crate) async fn open(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Tls>,
) -> Result<SendRequest<Full<Bytes>>, OpenError> {
    let stream = connect(addr, timeout, tls)
        .await
        .map_err(OpenError::Connect)?;
    if let Stream::Tls(s) = &stream {
        if s.get_ref().1.alpn_protocol() != Some(b"h2") {
            return Err(OpenError::NoAlpn);
        }
    }
    let handshake = hyper::client::conn::http2::Builder::new(LocalExec)
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(stream));
    let (send, conn) = tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| OpenError::Connect(io::ErrorKind::TimedOut.into()))?
        .map_err(OpenError::Handshake)?;
    tokio::task::spawn_local(async move {
        // How the connection ended shows in its streams' outcomes.
        let _ = conn.await;
    });
    Ok(send)
}

/// One request and its whole response, bounded by the timeout: the status, the bytes of the
/// body, or why not.
async fn exchange(
    send: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
    timeout: Duration,
) -> (Outcome, u64) {
    let go = async {
        send.ready().await?;
        let resp = send.send_request(request).await?;
        let status = resp.status().as_u16();
        let pinlb = resp
            .headers()
            .get_all("server-timing")
            .iter()
            .find_map(|v| super::wire::pinlb_time(v.as_bytes()));
        let body = resp.into_body().collect().await?;
        Ok::<_, hyper::Error>((status, pinlb, body.to_bytes().len() as u64))
    };
    match tokio::time::timeout(timeout, go).await {
        Ok(Ok((status, pinlb, bytes))) => (Outcome::Response(status, pinlb), bytes),
        Ok(Err(_)) => (Outcome::Broken, 0),
        Err(_) => (Outcome::Timeout, 0),
    }
}

/// Checks, before any load, that a target speaks HTTP/2: one connection, one request.
pub(crate) async fn probe(
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&Tls>,
    plan: &H2Plan,
) -> Result<(), String> {
    let mut send = open(addr, timeout, tls).await.map_err(|e| e.to_string())?;
    let go = async {
        send.ready().await?;
        let resp = send.send_request(plan.request()).await?;
        resp.into_body().collect().await.map(|_| ())
    };
    match tokio::time::timeout(timeout, go).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!(
            "no HTTP/2 response (is it an HTTP/1.1-only server?): {e}"
        )),
        Err(_) => Err(format!("no HTTP/2 response within {timeout:?}")),
    }
}

/// Runs one connection of the thread: opened (again, after a broken one) until the window
/// closes, `plan.streams` streams on it at once.
pub(crate) async fn connection(sh: Rc<Thread>, plan: Rc<H2Plan>) {
    // Bounded: every turn either ends with the window, or uses a request of the window's
    // budget (a failed connect counts as one, as for HTTP/1.1).
    loop {
        let now = Instant::now();
        if sh.over(now) {
            return;
        }
        let send = match open(sh.addr, sh.timeout, sh.tls.as_ref()).await {
            Ok(s) => s,
            Err(e) => {
                let now = Instant::now();
                if now >= sh.end {
                    return;
                }
                let recorded = now >= sh.t0;
                if recorded && !sh.take() {
                    return;
                }
                let failed = match e {
                    OpenError::Connect(e) => Failed::Connect(e.kind()),
                    OpenError::NoAlpn | OpenError::Handshake(_) => Failed::Handshake,
                };
                sh.connect_error(recorded, failed);
                // A refused connect returns at once: yield so a dead target doesn't spin.
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        let streams: Vec<_> = (0..plan.streams)
            .map(|_| {
                let (sh, plan, send) = (sh.clone(), plan.clone(), send.clone());
                tokio::task::spawn_local(async move { stream(&sh, &plan, send).await })
            })
            .collect();
        drop(send);
        for s in streams {
            let _ = s.await;
        }
    }
}

/// One stream's closed loop: request, whole response, next request, until the window closes
/// or the connection breaks.
async fn stream(sh: &Thread, plan: &H2Plan, mut send: SendRequest<Full<Bytes>>) {
    loop {
        let now = Instant::now();
        let recorded = now >= sh.t0;
        if now >= sh.end || (recorded && !sh.take()) {
            return;
        }
        let start = Instant::now();
        let (outcome, bytes) = exchange(&mut send, plan.request(), sh.timeout).await;
        let ended = !matches!(outcome, Outcome::Response(..));
        sh.record(recorded, outcome, start.elapsed(), bytes);
        if ended {
            return;
        }
    }
}
