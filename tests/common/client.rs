//! The shared HTTP clients: hyper's HTTP/1.1 client on one connection ([`Conn`]), for tests that
//! need well-formed requests and whole responses, and the same over each protocol pinlb serves
//! ([`Client`] and [`Proto`]: HTTP/1.1, h2c and HTTP/2 over TLS).

use std::fmt;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::{Cert, ClientBody, Pki, WAIT, empty};

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
        Conn::over(stream).await.expect("handshake")
    }

    /// The HTTP/1.1 client on a connection already made (TCP, TLS).
    pub async fn over<S>(io: S) -> Result<Conn, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender })
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

    /// The names of the response's header fields, less the hop-by-hop ones (which HTTP/2 has
    /// not) and Date: what must be the same whichever protocol carried the response.
    pub fn header_names(&self) -> std::collections::BTreeSet<String> {
        const LEFT_OUT: [&str; 8] = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "te",
            "trailer",
            "upgrade",
            "date",
        ];
        self.headers
            .keys()
            .map(|k| k.as_str().to_string())
            .filter(|k| !LEFT_OUT.contains(&k.as_str()))
            .collect()
    }

    /// The one value of the header `name`, as text; fails the test when it is missing, twice or
    /// not text.
    pub fn one(&self, name: &str) -> &str {
        let all: Vec<_> = self.headers.get_all(name).iter().collect();
        assert_eq!(all.len(), 1, "{name} once in {:?}", self.headers);
        all[0].to_str().expect("a header in ASCII")
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

// ---------------------------------------------------------------------------------------------
// The same request over each protocol pinlb serves clients
// ---------------------------------------------------------------------------------------------

/// The name the TLS listeners of [`Setup::for_proto`](super::Setup::for_proto) carry a
/// certificate for, and the Host (`:authority`) every request of [`request`] names.
pub const TLS_NAME: &str = "pinlb.test";

/// How a test client speaks to pinlb: each listener and route feature runs one test body over
/// each (see [`each_proto!`](crate::common::each_proto)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1 over plain TCP.
    Http11,
    /// HTTP/1.1 over TLS (ALPN `http/1.1`), for the features that need TLS (client
    /// certificates).
    Http11Tls,
    /// HTTP/2 with prior knowledge on a plain listener with `h2c = true`.
    H2c,
    /// HTTP/2 over TLS (ALPN `h2`).
    H2Tls,
}

impl Proto {
    pub fn tls(self) -> bool {
        matches!(self, Proto::Http11Tls | Proto::H2Tls)
    }

    pub fn h2(self) -> bool {
        matches!(self, Proto::H2c | Proto::H2Tls)
    }

    /// `http` or `https`: what the backend gets in X-Forwarded-Proto.
    pub fn scheme(self) -> &'static str {
        if self.tls() { "https" } else { "http" }
    }

    /// The request's protocol as the access log writes it (`{server_protocol}`).
    pub fn log_protocol(self) -> &'static str {
        if self.h2() { "HTTP/2.0" } else { "HTTP/1.1" }
    }
}

/// One client connection over a [`Proto`]: hyper's HTTP/1.1 or HTTP/2 client, over TCP or TLS.
pub enum Client {
    H1(Conn),
    H2 {
        send: SendRequest2<ClientBody>,
        scheme: &'static str,
    },
}

type SendRequest2<B> = hyper::client::conn::http2::SendRequest<B>;

impl Client {
    /// Connects to `addr` over `proto`; a TLS one trusts `pki`'s CA for [`TLS_NAME`].
    pub async fn open(proto: Proto, addr: SocketAddr, pki: &Pki) -> Client {
        Client::try_open(proto, addr, pki, None)
            .await
            .unwrap_or_else(|e| panic!("{proto:?} connection to {addr}: {e}"))
    }

    /// Like [`Client::open`], showing the client certificate `cert` in the TLS handshake.
    pub async fn open_with_cert(proto: Proto, addr: SocketAddr, pki: &Pki, cert: &Cert) -> Client {
        Client::try_open(proto, addr, pki, Some(cert))
            .await
            .unwrap_or_else(|e| panic!("{proto:?} connection to {addr}: {e}"))
    }

    /// Connects, handing back what failed (the connect, the TLS handshake, the HTTP/2 preface
    /// exchange) instead of failing the test. Bounded by [`WAIT`].
    pub async fn try_open(
        proto: Proto,
        addr: SocketAddr,
        pki: &Pki,
        cert: Option<&Cert>,
    ) -> Result<Client, String> {
        tokio::time::timeout(WAIT, Client::connect(proto, addr, pki, cert))
            .await
            .map_err(|_| "not connected within the wait limit".to_string())?
    }

    async fn connect(
        proto: Proto,
        addr: SocketAddr,
        pki: &Pki,
        cert: Option<&Cert>,
    ) -> Result<Client, String> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let scheme = proto.scheme();
        Ok(match proto {
            Proto::Http11 => Client::H1(Conn::over(tcp).await?),
            Proto::H2c => Client::H2 {
                send: try_h2_handshake(tcp).await?,
                scheme,
            },
            Proto::Http11Tls => {
                let tls = tls_connect(tcp, pki.client_config(b"http/1.1", cert), TLS_NAME).await?;
                Client::H1(Conn::over(tls).await?)
            }
            Proto::H2Tls => {
                let tls = tls_connect(tcp, pki.client_config(b"h2", cert), TLS_NAME).await?;
                Client::H2 {
                    send: try_h2_handshake(tls).await?,
                    scheme,
                }
            }
        })
    }

    /// Sends a request made by [`request`] (a path and `Host`); over HTTP/2 the Host becomes
    /// the `:authority` (and the scheme the connection's), as an HTTP/2 client sends it.
    pub async fn try_send(
        &mut self,
        req: Request<ClientBody>,
    ) -> hyper::Result<Response<Incoming>> {
        match self {
            Client::H1(conn) => conn.try_send(req).await,
            Client::H2 { send, scheme } => {
                let req = for_h2(req, scheme);
                send.ready().await?;
                let resp = send.send_request(req).await?;
                assert_eq!(resp.version(), http::Version::HTTP_2);
                Ok(resp)
            }
        }
    }

    /// Sends a request and returns the response with its body still streaming.
    pub async fn send(&mut self, req: Request<ClientBody>) -> Response<Incoming> {
        tokio::time::timeout(WAIT, self.try_send(req))
            .await
            .expect("no response within the wait limit")
            .expect("send request")
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

/// `req` as an HTTP/2 client sends it: an absolute URI of `scheme` and the Host, no Host line.
fn for_h2(mut req: Request<ClientBody>, scheme: &str) -> Request<ClientBody> {
    if req.uri().authority().is_none() {
        let host = req
            .headers_mut()
            .remove(http::header::HOST)
            .map(|h| h.to_str().expect("a Host in ASCII").to_string())
            .unwrap_or_else(|| TLS_NAME.to_string());
        let path = req
            .uri()
            .path_and_query()
            .map_or("/".to_string(), |p| p.to_string());
        *req.uri_mut() = format!("{scheme}://{host}{path}")
            .parse()
            .expect("an absolute URI");
    }
    req
}

/// A TLS client handshake for the server name `name` with `config`.
async fn tls_connect(
    tcp: TcpStream,
    config: std::sync::Arc<rustls::ClientConfig>,
    name: &'static str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let name = rustls::pki_types::ServerName::try_from(name).unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))
}

/// A hyper HTTP/2 client connection with prior knowledge (h2c).
pub async fn h2_client(addr: SocketAddr) -> SendRequest2<ClientBody> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).unwrap();
    h2_handshake(tcp).await
}

/// A hyper HTTP/2 client connection over TLS, `a.test` verified against `pki`'s CA, that
/// offers only ALPN h2 (and checks that it got it).
pub async fn h2_tls_client(addr: SocketAddr, pki: &Pki) -> SendRequest2<ClientBody> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).unwrap();
    let mut config = (*pki.client(&[&rustls::version::TLS13])).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tls = tokio::time::timeout(WAIT, tls_connect(tcp, config.into(), "a.test"))
        .await
        .expect("a handshake in time")
        .expect("handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2_handshake(tls).await
}

/// The HTTP/2 client handshake on `io`; its connection runs as a task.
pub async fn h2_handshake<S>(io: S) -> SendRequest2<ClientBody>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    try_h2_handshake(io).await.expect("HTTP/2 handshake")
}

async fn try_h2_handshake<S>(io: S) -> Result<SendRequest2<ClientBody>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(send)
}

/// `each_proto!(name)` after `async fn name(p: Proto) { … }` runs that test body once per
/// protocol: a module `name` of one `#[tokio::test]` per protocol, `name::http11`, `name::h2c`
/// and `name::h2_tls` (a module, as `macro_rules!` cannot make `name_http11`; and the function
/// stays outside the macro, where rustfmt and clippy see it). `each_proto!(plain: name)` runs it
/// over HTTP/1.1 and h2c only (a feature of plain listeners, as `redirect_https`),
/// `each_proto!(tls: name)` over HTTP/1.1 and HTTP/2 over TLS (`http11_tls`, `h2_tls`).
// Allowed unused: tests/backend.rs and tests/fuzz_replay.rs compile `common` without using it.
#[allow(unused_macros)]
macro_rules! each_proto {
    ($name:ident) => {
        $crate::common::each_proto!(@tests $name [http11 Http11, h2c H2c, h2_tls H2Tls]);
    };
    (plain: $name:ident) => {
        $crate::common::each_proto!(@tests $name [http11 Http11, h2c H2c]);
    };
    (tls: $name:ident) => {
        $crate::common::each_proto!(@tests $name [http11_tls Http11Tls, h2_tls H2Tls]);
    };
    (@tests $name:ident [$($test:ident $variant:ident),*]) => {
        mod $name {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$name($crate::common::Proto::$variant).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use each_proto;
