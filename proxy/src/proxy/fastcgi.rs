//! One attempt at a FastCGI backend (`protocol = "fastcgi"`, php-fpm), and the response body
//! that streams its FCGI_STDOUT to the client.
//!
//! The exchange runs on the same pooled [`Conn`] an HTTP/1.1 one does, so the pool, connect
//! limits, the PROXY header and TLS need nothing of their own. One request at a time per
//! connection, always request ID 1 (php-fpm does not multiplex), with FCGI_KEEP_CONN: the
//! connection goes back to the pool after the application's FCGI_END_REQUEST, and a response
//! it cut short closes it. FCGI_STDERR records are logged at the backend as they come.
//!
//! The application's answer is passed on as nginx's fastcgi module does: a PHP fatal error is
//! php-fpm's own `Status: 500` (with `display_errors` off), passed on as a 500; a connection
//! that closes, or a request that ends, before a whole CGI head is a 502.

use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, StatusCode};
use tracing::debug;

use crate::backend_address::BackendAddress;
use crate::config::{Fastcgi, Timeouts};
use crate::fastcgi::params::{self, Scripts};
use crate::fastcgi::record::{self, Record};
use crate::fastcgi::response::{self, CgiHead};
use crate::http1::client::{Conn, UpstreamError};
use crate::http1::common::{Reply, RequestFraming, content_length_line};
use crate::http1::request::RequestHead;
use crate::proxy::attempt::{Failure, Plan, connect};
use crate::proxy::body::ProxyBody;
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::proxy::fastcgi_body::{FastcgiBody, ID, log_stderr};
use crate::proxy::request_body::RequestBody;
use crate::upstream::in_flight::InFlight;
use crate::upstream::local::WorkerUpstream;

/// The application's response head, and the connection its body comes on.
pub(crate) struct Answer {
    pub status: StatusCode,
    head: CgiHead,
    conn: Conn,
    /// The body's first bytes, read with the head.
    early: Bytes,
}

/// One attempt at one FastCGI backend: a pooled or new connection, the request's PARAMS and
/// STDIN, the CGI head of the response. A pooled connection that breaks before any answer is
/// tried again on a fresh one by the rules an HTTP/1.1 attempt follows (see
/// `attempt::attempt`).
pub(crate) async fn attempt(
    upstream: &WorkerUpstream,
    backend: usize,
    plan: &Plan<'_>,
    (head, downstream): (&RequestHead, &Downstream),
    body: &mut RequestBody<'_, impl DownstreamBody>,
) -> Result<Answer, Failure> {
    let invalid = |why| Failure::Exchange(UpstreamError::Invalid(why));
    let fcgi = upstream.shared.config.fastcgi.as_deref();
    let fcgi = fcgi.ok_or_else(|| invalid("no [upstream.NAME.fastcgi] table"))?;
    let length = match plan.framing {
        RequestFraming::None => None,
        RequestFraming::Length(n) => Some(n),
        RequestFraming::Chunked => Some(
            body.read_whole(fcgi.chunked_body_max)
                .await
                .map_err(|e| Failure::Exchange(UpstreamError::Client(e)))?,
        ),
    };
    let mut request = Vec::with_capacity(1024);
    begin(&mut request, fcgi, head, downstream, length);
    let pooled = poll_fn(|cx| Poll::Ready(upstream.checkout(backend, plan.origin, cx))).await;
    let mut conn = match pooled {
        Some(conn) => conn,
        None => connect(upstream, backend, plan).await?,
    };
    let addr = upstream.shared.backends[backend].address;
    loop {
        match exchange(&mut conn, &request, body, plan.timeouts, addr).await {
            Ok((head, early)) => {
                return Ok(Answer {
                    status: head.status,
                    head,
                    conn,
                    early,
                });
            }
            Err(e) if conn.reused && e.is_stale() && plan.resendable && body.replayable() => {
                debug!(backend = %addr, "stale pooled FastCGI connection ({e}), reconnecting");
                conn = connect(upstream, backend, plan).await?;
            }
            Err(e) => return Err(Failure::Exchange(e)),
        }
    }
}

/// The request's BEGIN_REQUEST and PARAMS records, in one buffer written at once.
fn begin(
    out: &mut Vec<u8>,
    fcgi: &Fastcgi,
    head: &RequestHead,
    downstream: &Downstream,
    content_length: Option<u64>,
) {
    record::begin_request(out, ID, true);
    let scripts = Scripts {
        root: &fcgi.root,
        index: &fcgi.index,
        script: fcgi.script.as_deref(),
        split: fcgi.split_path_info.as_ref().map(|s| &s.0),
    };
    let script = scripts.script(head.path());
    let req = params::Request {
        method: head.method.as_str(),
        target: head.path(),
        host: head.host().unwrap_or_default(),
        lines: head.lines(),
        content_length,
        protocol: match head.version {
            http::Version::HTTP_10 => "HTTP/1.0",
            http::Version::HTTP_2 => "HTTP/2.0",
            _ => "HTTP/1.1",
        },
        https: downstream.https,
        client: downstream.origin.0,
        server: downstream.origin.1,
    };
    let mut pairs = Vec::with_capacity(1024);
    params::encode(&mut pairs, &req, &fcgi.root, &script, &fcgi.params);
    record::stream(out, record::PARAMS, ID, &pairs);
}

/// Writes the request and its body, and reads the CGI head, within the upstream's timeouts.
async fn exchange(
    conn: &mut Conn,
    request: &[u8],
    body: &mut RequestBody<'_, impl DownstreamBody>,
    timeouts: &Timeouts,
    addr: BackendAddress,
) -> Result<(CgiHead, Bytes), UpstreamError> {
    if body.is_empty() {
        let end = record::header(record::STDIN, ID, 0);
        let mut out = [std::io::IoSlice::new(request), std::io::IoSlice::new(&end)];
        conn.write_all_within(&mut out, timeouts.send).await?;
    } else {
        let mut out = [std::io::IoSlice::new(request)];
        conn.write_all_within(&mut out, timeouts.send).await?;
        body.send_fastcgi(conn, ID, timeouts.send).await?;
    }
    let mut stdout = BytesMut::new();
    let read = std::future::poll_fn(|cx| poll_head(conn, &mut stdout, addr, cx));
    tokio::time::timeout(timeouts.response, read)
        .await
        .map_err(|_| UpstreamError::Timeout)?
}

/// Reads records until FCGI_STDOUT holds a whole CGI head.
fn poll_head(
    conn: &mut Conn,
    stdout: &mut BytesMut,
    addr: BackendAddress,
    cx: &mut Context<'_>,
) -> Poll<Result<(CgiHead, Bytes), UpstreamError>> {
    // Bounded by what the backend sends: every pass takes a record, reads, or returns.
    loop {
        match record::decode(conn.read_buf(), ID) {
            Ok(Some(Record::Stdout(data))) => {
                stdout.extend_from_slice(&data);
                match response::parse(stdout) {
                    Ok(Some((head, len))) => {
                        stdout.advance(len);
                        return Poll::Ready(Ok((head, std::mem::take(stdout).freeze())));
                    }
                    Ok(None) if data.is_empty() => {
                        return Poll::Ready(Err(UpstreamError::Invalid(
                            "FastCGI output ended inside its CGI head",
                        )));
                    }
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Err(UpstreamError::Invalid(cgi_error(&e)))),
                }
            }
            Ok(Some(Record::Stderr(text))) => log_stderr(addr, &text),
            Ok(Some(Record::End {
                protocol_status, ..
            })) => {
                return Poll::Ready(Err(UpstreamError::Invalid(match protocol_status {
                    0 => "FastCGI request ended without a response",
                    1 => "FastCGI application cannot multiplex connections",
                    2 => "FastCGI application overloaded",
                    _ => "FastCGI application refused the responder role",
                })));
            }
            Ok(Some(Record::Other(_))) => {}
            Ok(None) => {
                let n = ready!(conn.poll_fill(cx))?;
                if n == 0 {
                    return Poll::Ready(Err(UpstreamError::ClosedBeforeResponse));
                }
            }
            Err(_) => {
                return Poll::Ready(Err(UpstreamError::Invalid("malformed FastCGI record")));
            }
        }
    }
}

fn cgi_error(e: &response::CgiError) -> &'static str {
    match e {
        response::CgiError::TooLarge => "CGI response head too large",
        response::CgiError::Invalid => "invalid CGI response head",
        response::CgiError::Status => "invalid CGI Status header",
        response::CgiError::ContentLength => "invalid CGI Content-Length",
    }
}

/// The response to the client: the CGI head's status and lines, the body streamed from the
/// connection, which holds the in-flight count (`guard`) and goes back to `backend`'s pool when
/// the application ends the request.
pub(crate) fn reply(
    answer: Answer,
    guard: InFlight,
    upstream: Rc<WorkerUpstream>,
    backend: usize,
    method: &Method,
) -> Reply<ProxyBody> {
    let Answer {
        status,
        head,
        conn,
        early,
    } = answer;
    let bodiless = method == Method::HEAD || status == StatusCode::NOT_MODIFIED;
    let mut headers = head.headers;
    if let (Some(n), true) = (head.content_length, bodiless) {
        content_length_line(&mut headers, n);
    }
    let addr = upstream.shared.backends[backend].address;
    let body = FastcgiBody {
        conn: Some(conn),
        next: Some(early).filter(|_| !bodiless && status != StatusCode::NO_CONTENT),
        remaining: head.content_length.filter(|_| !bodiless),
        discard: bodiless || status == StatusCode::NO_CONTENT,
        has_date: head.has_date,
        held: Some((guard, upstream, backend)),
        addr,
    };
    Reply {
        status,
        headers,
        body: ProxyBody::Fastcgi(Box::new(body)),
    }
}
