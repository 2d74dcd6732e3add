//! The shared HTTP client: hyper's HTTP/1.1 client on one connection, for tests that need
//! well-formed requests and whole responses.

use std::fmt;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{ClientBody, WAIT, empty};

/// One client connection (hyper's HTTP/1.1 client), reusable for keep-alive requests.
pub struct Conn {
    sender: SendRequest<ClientBody>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender }
    }

    /// Sends a request; the error, if the connection fails, is the caller's to judge.
    pub async fn try_send(
        &mut self,
        req: Request<ClientBody>,
    ) -> hyper::Result<Response<Incoming>> {
        self.sender.ready().await?;
        self.sender.send_request(req).await
    }

    /// Sends a request and returns the response with its body still streaming.
    pub async fn send(&mut self, req: Request<ClientBody>) -> Response<Incoming> {
        tokio::time::timeout(WAIT, async {
            self.sender.ready().await.expect("connection ready");
            self.sender.send_request(req).await.expect("send request")
        })
        .await
        .expect("no response within the wait limit")
    }

    /// Sends a request and reads the whole response.
    pub async fn fetch(&mut self, req: Request<ClientBody>) -> Reply {
        let resp = self.send(req).await;
        Reply::read(resp).await
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        self.fetch(request(Method::GET, path, empty())).await
    }
}

pub fn request(method: Method, path: &str, body: ClientBody) -> Request<ClientBody> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "pinlb.test")
        .body(body)
        .unwrap()
}

/// A whole response.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body as text (lossy), for the many tests whose bodies are text...
    pub body: String,
    /// ...and as it arrived, for those that compare bytes.
    pub bytes: Bytes,
}

/// Without `bytes`, which `body` already shows.
impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("body", &self.body)
            .finish()
    }
}

impl Reply {
    pub async fn read(resp: Response<Incoming>) -> Reply {
        let (parts, body) = resp.into_parts();
        let bytes = tokio::time::timeout(WAIT, body.collect())
            .await
            .expect("body not complete within the wait limit")
            .expect("read body")
            .to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
        }
    }

    /// The `x-backend` header: which backend answered.
    pub fn backend(&self) -> &str {
        self.headers
            .get("x-backend")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    }
}

/// GET on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    Conn::open(addr).await.get(path).await
}
