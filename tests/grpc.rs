//! gRPC through pinlb: a real tonic service behind an `h2c` upstream, and tonic's client in
//! front of an `h2c` listener. Unary, server-streaming and client-streaming calls, metadata,
//! and gRPC statuses carried in trailers, all over HTTP/2 both ways.
//!
//! The messages are written by hand with prost's derive, and the service as tonic's generated
//! code would be, so that no protoc is needed to build the tests.

use crate::common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use common::*;
use tokio_stream::{Stream, StreamExt};
use tonic::codegen::{BoxFuture, Service, http};
use tonic::{Code, Request, Response, Status, Streaming};

#[derive(Clone, PartialEq, prost::Message)]
struct Echo {
    #[prost(string, tag = "1")]
    message: String,
    /// For the streaming calls: how many replies, or the running total.
    #[prost(uint32, tag = "2")]
    count: u32,
}

const SERVICE: &str = "pinlb.test.Echo";

/// The test service: `Unary` echoes (or fails with the status the message names),
/// `Stream` sends `count` replies and then fails with `DATA_LOSS` if asked, `Sum` adds up the
/// counts of a stream of requests.
#[derive(Clone)]
struct EchoService;

impl tonic::server::NamedService for EchoService {
    const NAME: &'static str = SERVICE;
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<Echo, Status>> + Send>>;

struct Unary;
impl tonic::server::UnaryService<Echo> for Unary {
    type Response = Echo;
    type Future = BoxFuture<Response<Echo>, Status>;
    fn call(&mut self, request: Request<Echo>) -> Self::Future {
        Box::pin(async move {
            let seen = request
                .metadata()
                .get("x-test")
                .map(|v| v.to_str().unwrap_or("").to_string())
                .unwrap_or_default();
            let echo = request.into_inner();
            if echo.message == "not found" {
                return Err(Status::not_found("no such thing, said the backend"));
            }
            let mut reply = Response::new(Echo {
                message: format!("{}|{seen}", echo.message),
                count: echo.count,
            });
            reply
                .metadata_mut()
                .insert("x-backend", "tonic".parse().expect("ascii"));
            Ok(reply)
        })
    }
}

struct ServerStream;
impl tonic::server::ServerStreamingService<Echo> for ServerStream {
    type Response = Echo;
    type ResponseStream = ReplyStream;
    type Future = BoxFuture<Response<ReplyStream>, Status>;
    fn call(&mut self, request: Request<Echo>) -> Self::Future {
        Box::pin(async move {
            let echo = request.into_inner();
            let fail = echo.message == "fail";
            let replies = (0..echo.count).map(|i| {
                Ok(Echo {
                    message: format!("reply {i}"),
                    count: i,
                })
            });
            let end = fail.then(|| Err(Status::data_loss("the stream broke, on purpose")));
            let stream: ReplyStream = Box::pin(tokio_stream::iter(replies.chain(end)));
            Ok(Response::new(stream))
        })
    }
}

struct Sum;
impl tonic::server::ClientStreamingService<Echo> for Sum {
    type Response = Echo;
    type Future = BoxFuture<Response<Echo>, Status>;
    fn call(&mut self, request: Request<Streaming<Echo>>) -> Self::Future {
        Box::pin(async move {
            let mut stream = request.into_inner();
            let (mut total, mut n) = (0u32, 0u32);
            while let Some(echo) = stream.next().await {
                total += echo?.count;
                n += 1;
            }
            Ok(Response::new(Echo {
                message: format!("{n} messages"),
                count: total,
            }))
        })
    }
}

impl<B> Service<http::Request<B>> for EchoService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let codec = tonic_prost::ProstCodec::<Echo, Echo>::default;
        match req.uri().path() {
            "/pinlb.test.Echo/Unary" => {
                Box::pin(
                    async move { Ok(tonic::server::Grpc::new(codec()).unary(Unary, req).await) },
                )
            }
            "/pinlb.test.Echo/Stream" => Box::pin(async move {
                Ok(tonic::server::Grpc::new(codec())
                    .server_streaming(ServerStream, req)
                    .await)
            }),
            "/pinlb.test.Echo/Sum" => Box::pin(async move {
                Ok(tonic::server::Grpc::new(codec())
                    .client_streaming(Sum, req)
                    .await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// Starts the service on `127.0.0.1:0`; dropping the handle stops it.
async fn grpc_backend() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(EchoService)
            .serve_with_incoming(incoming)
            .await;
    });
    (addr, task)
}

fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    return std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return std::sync::Arc::new(rustls::crypto::ring::default_provider());
}

/// Starts the service over TLS (ALPN `h2` only) on `127.0.0.1:0`, with a self-signed
/// certificate for `grpc.test`; the certificate's PEM file is the CA to trust.
async fn grpc_tls_backend() -> (SocketAddr, std::path::PathBuf, tokio::task::JoinHandle<()>) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let certified = rcgen::generate_simple_self_signed(vec!["grpc.test".to_string()]).unwrap();
    let pem = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "grpc-tls-{}-{:?}.pem",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&pem, certified.cert.pem()).unwrap();
    let chain = vec![CertificateDer::from(certified.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        // Bounded by the test: the task is dropped with it.
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(|req| {
                    let mut svc = EchoService;
                    async move { svc.call(req).await }
                });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
            });
        }
    });
    (addr, pem, task)
}

/// pinlb with an h2c listener in front of `backends`, spoken to over h2c.
fn grpc_proxy(backends: &[SocketAddr], extra: &str) -> Proxy {
    let list: String = backends
        .iter()
        .map(|b| format!("{{ address = \"{b}\" }}, "))
        .collect();
    Proxy::start_toml(&format!(
        "[runtime]\ncpus = [{core}]\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"grpc\"\nh2c = true\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [upstream.grpc]\n{protocol}backends = [{list}]\n{extra}\n",
        protocol = if extra.contains("protocol") {
            ""
        } else {
            "protocol = \"h2c\"\n"
        },
        core = first_core()
    ))
}

async fn client(addr: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(WAIT)
        .connect()
        .await
        .expect("connect");
    tonic::client::Grpc::new(channel)
}

/// The sum of every sample of `name` whose labels contain `having`.
fn sum(m: &Metrics, name: &str, having: &str) -> f64 {
    m.0.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && l.contains(having)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The backends `/status` lists as up.
async fn backends_up(proxy: &Proxy) -> Vec<String> {
    let s = proxy.status().await;
    s["upstreams"][0]["backends"]
        .as_array()
        .map(|bs| {
            bs.iter()
                .filter(|b| b["health"] == "up")
                .filter_map(|b| Some(b["address"].as_str()?.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn path(method: &str) -> http::uri::PathAndQuery {
    format!("/{SERVICE}/{method}").parse().expect("path")
}

fn echo(message: &str, count: u32) -> Echo {
    Echo {
        message: message.into(),
        count,
    }
}

async fn unary(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    request: Request<Echo>,
) -> Result<Response<Echo>, Status> {
    grpc.ready().await.expect("ready");
    grpc.unary(request, path("Unary"), tonic_prost::ProstCodec::default())
        .await
}

#[tokio::test]
async fn a_unary_call_goes_through_with_its_metadata_both_ways() {
    let (backend, _task) = grpc_backend().await;
    let proxy = grpc_proxy(&[backend], "");
    let mut grpc = client(proxy.addr).await;
    for i in 0..20 {
        let mut request = Request::new(echo("hello", i));
        request
            .metadata_mut()
            .insert("x-test", "from the client".parse().unwrap());
        let reply = unary(&mut grpc, request).await.expect("call");
        assert_eq!(
            reply
                .metadata()
                .get("x-backend")
                .map(|v| v.to_str().unwrap()),
            Some("tonic")
        );
        let reply = reply.into_inner();
        assert_eq!(reply.message, "hello|from the client");
        assert_eq!(reply.count, i);
    }
    // Every call rode the one multiplexed connection each way.
    let m = proxy.metrics().await;
    assert_eq!(sum(&m, "pinlb_http2_connections_total", ""), 1.0, "{}", m.0);
    assert_eq!(
        sum(&m, "pinlb_backend_connections_opened_total", ""),
        1.0,
        "{}",
        m.0
    );
    assert_eq!(
        sum(&m, "pinlb_backend_connections_reused_total", ""),
        19.0,
        "{}",
        m.0
    );
}

#[tokio::test]
async fn a_grpc_error_status_arrives_intact() {
    let (backend, _task) = grpc_backend().await;
    let proxy = grpc_proxy(&[backend], "");
    let mut grpc = client(proxy.addr).await;
    let status = unary(&mut grpc, Request::new(echo("not found", 0)))
        .await
        .expect_err("the backend fails the call");
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "no such thing, said the backend");
}

#[tokio::test]
async fn a_server_stream_ends_with_the_status_in_its_trailers() {
    let (backend, _task) = grpc_backend().await;
    let proxy = grpc_proxy(&[backend], "");
    let mut grpc = client(proxy.addr).await;
    for (message, fails) in [("ok", false), ("fail", true)] {
        grpc.ready().await.expect("ready");
        let response = grpc
            .server_streaming(
                Request::new(echo(message, 50)),
                path("Stream"),
                tonic_prost::ProstCodec::<Echo, Echo>::default(),
            )
            .await
            .expect("stream starts");
        let mut stream = response.into_inner();
        let mut got = 0;
        let end = loop {
            match tokio::time::timeout(WAIT, stream.message()).await {
                Ok(Ok(Some(reply))) => {
                    assert_eq!(reply.count, got);
                    got += 1;
                }
                Ok(Ok(None)) => break None,
                Ok(Err(status)) => break Some(status),
                Err(_) => panic!("the stream stalled after {got} replies"),
            }
        };
        assert_eq!(got, 50, "{message}");
        match (fails, end) {
            (false, None) => {
                // The stream ended with its OK status, in trailers.
                let trailers = stream.trailers().await.expect("an OK status");
                assert!(trailers.is_some(), "the stream ended without trailers");
            }
            (true, Some(status)) => {
                assert_eq!(status.code(), Code::DataLoss);
                assert_eq!(status.message(), "the stream broke, on purpose");
            }
            (fails, end) => panic!("fails={fails}, ended with {end:?}"),
        }
    }
}

#[tokio::test]
async fn a_client_stream_reaches_the_backend_whole() {
    let (backend, _task) = grpc_backend().await;
    let proxy = grpc_proxy(&[backend], "");
    let mut grpc = client(proxy.addr).await;
    // 2,000 messages of about 1 KB: more than the stream's initial window, so flow control
    // has to move the body along.
    let filler = "x".repeat(1000);
    let requests: Vec<Echo> = (1..=2000).map(|i| echo(&filler, i)).collect();
    grpc.ready().await.expect("ready");
    let reply = tokio::time::timeout(
        WAIT,
        grpc.client_streaming(
            Request::new(tokio_stream::iter(requests)),
            path("Sum"),
            tonic_prost::ProstCodec::<Echo, Echo>::default(),
        ),
    )
    .await
    .expect("in time")
    .expect("call")
    .into_inner();
    assert_eq!(reply.message, "2000 messages");
    assert_eq!(reply.count, (1..=2000).sum::<u32>());
}

#[tokio::test]
async fn calls_are_spread_over_backends_and_a_dead_one_is_found_by_its_health_check() {
    let (a, task_a) = grpc_backend().await;
    let (b, _task_b) = grpc_backend().await;
    // A gRPC server answers GET / with HTTP 200 (and grpc-status 12): enough for a check
    // over HTTP/2 that the server is there.
    let proxy = grpc_proxy(
        &[a, b],
        "[upstream.grpc.health]\npath = \"/\"\ninterval = \"100ms\"\ntimeout = \"90ms\"\nrise = 1\nfall = 1\n",
    );
    poll(100, Duration::from_millis(50), async || {
        (backends_up(&proxy).await.len() == 2).then_some(())
    })
    .await
    .expect("both backends up");
    let mut grpc = client(proxy.addr).await;
    for i in 0..10 {
        unary(&mut grpc, Request::new(echo("spread", i)))
            .await
            .expect("call");
    }
    let m = proxy.metrics().await;
    for backend in [a, b] {
        let served = sum(
            &m,
            "pinlb_backend_responses_total",
            &format!("backend=\"{backend}\""),
        );
        assert_eq!(served, 5.0, "{backend}: {}", m.0);
    }
    task_a.abort();
    poll(100, Duration::from_millis(50), async || {
        (backends_up(&proxy).await == [b.to_string()]).then_some(())
    })
    .await
    .expect("backend a down, b up");
    // Every call now goes to b, and none fails.
    for i in 0..10 {
        unary(&mut grpc, Request::new(echo("after", i)))
            .await
            .expect("call after a died");
    }
}

#[tokio::test]
async fn an_http1_client_reaches_an_http2_backend() {
    let (backend, _task) = grpc_backend().await;
    let proxy = grpc_proxy(&[backend], "");
    // A gRPC server answers a plain GET with 200 and its status in the headers: the request
    // went upstream over HTTP/2, and the answer came back as HTTP/1.1.
    let reply = get(proxy.addr, "/pinlb.test.Echo/Nothing").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        reply
            .headers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap()),
        Some("12"),
        "{reply:?}"
    );
    assert!(reply.headers.get("connection").is_none());
}

#[tokio::test]
async fn grpc_goes_to_a_backend_over_tls_chosen_by_alpn() {
    let (backend, ca, _task) = grpc_tls_backend().await;
    let proxy = grpc_proxy(
        &[backend],
        &format!(
            "protocol = \"h2\"\n[upstream.grpc.tls]\nsni = \"grpc.test\"\nca_file = \"{}\"\n",
            ca.display()
        ),
    );
    let mut grpc = client(proxy.addr).await;
    let reply = unary(&mut grpc, Request::new(echo("over tls", 7)))
        .await
        .expect("call")
        .into_inner();
    assert_eq!((reply.message.as_str(), reply.count), ("over tls|", 7));
    let status = unary(&mut grpc, Request::new(echo("not found", 0)))
        .await
        .expect_err("the backend fails the call");
    assert_eq!(status.code(), Code::NotFound);
}

/// An HTTP/2 backend that answers each request with the trailers it came with, as headers.
async fn trailer_echo_backend() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        // Bounded by the test: the task is dropped with it.
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        let collected = req.into_body().collect().await?;
                        let trailers = collected.trailers().cloned().unwrap_or_default();
                        let mut response =
                            http::Response::new(http_body_util::Full::new(collected.to_bytes()));
                        for (name, value) in &trailers {
                            let echoed = format!("echo-{name}");
                            response.headers_mut().insert(
                                http::HeaderName::from_bytes(echoed.as_bytes()).unwrap(),
                                value.clone(),
                            );
                        }
                        Ok::<_, hyper::Error>(response)
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                        .await;
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_clients_request_trailers_reach_an_http2_backend() {
    use http_body_util::{BodyExt, StreamBody};
    let (backend, _task) = trailer_echo_backend().await;
    let proxy = grpc_proxy(&[backend], "");
    let tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", "abc123".parse().unwrap());
    let frames: Vec<Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>> = vec![
        Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"part one, ",
        ))),
        Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"part two",
        ))),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    let body = StreamBody::new(tokio_stream::iter(frames));
    let request = http::Request::post(format!("http://{}/upload", proxy.addr))
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(WAIT, send.send_request(request))
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("echo-x-checksum")
            .map(|v| v.to_str().unwrap()),
        Some("abc123"),
        "{:?}",
        response.headers()
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"part one, part two");
}
