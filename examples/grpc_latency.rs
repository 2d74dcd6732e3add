//! gRPC unary latency, for `benches/grpc.sh`: a tonic echo server, and a tonic client that
//! makes unary calls in closed loop and prints their latency percentiles.
//!
//! ```text
//! grpc_latency serve ADDR
//! grpc_latency call URL CONCURRENCY SECONDS [WARMUP_SECONDS]
//! ```
//!
//! `serve` answers `/pinlb.bench.Echo/Unary` on ADDR (h2c) with the request's message, on one
//! single-threaded runtime (the script pins it to one core), until killed. `call` opens one
//! HTTP/2 connection (a tonic `Channel`) to URL and keeps CONCURRENCY calls in flight on it,
//! each call's next one sent when its reply has arrived; after the warm-up (default 1 s) it
//! records each call's time from the call to its decoded reply for SECONDS, then prints one
//! line: `calls N errors E rate R p50_us X p90_us Y p99_us Z max_us W`. A call counts as an
//! error when it ends in any gRPC status but OK (the status is in the trailers, which a proxy
//! must carry back), and has no latency then. The messages are written by hand with prost's
//! derive, as in `tests/grpc.rs`, so no protoc is needed.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tonic::codegen::{BoxFuture, Service, http};
use tonic::{Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Echo {
    #[prost(string, tag = "1")]
    message: String,
}

const PATH: &str = "/pinlb.bench.Echo/Unary";

#[derive(Clone)]
struct EchoService;

impl tonic::server::NamedService for EchoService {
    const NAME: &'static str = "pinlb.bench.Echo";
}

struct Unary;
impl tonic::server::UnaryService<Echo> for Unary {
    type Response = Echo;
    type Future = BoxFuture<Response<Echo>, Status>;
    fn call(&mut self, request: Request<Echo>) -> Self::Future {
        Box::pin(async move { Ok(Response::new(request.into_inner())) })
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
        if req.uri().path() != PATH {
            return Box::pin(
                async move { Ok(Status::unimplemented("no such method").into_http()) },
            );
        }
        let codec = tonic_prost::ProstCodec::<Echo, Echo>::default();
        Box::pin(async move { Ok(tonic::server::Grpc::new(codec).unary(Unary, req).await) })
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", addr] => rt.block_on(serve(addr)),
        ["call", url, concurrency, seconds] => call(&rt, url, concurrency, seconds, "1"),
        ["call", url, concurrency, seconds, warmup] => call(&rt, url, concurrency, seconds, warmup),
        _ => Err("usage: grpc_latency serve ADDR | call URL CONCURRENCY SECONDS [WARMUP]".into()),
    };
    if let Err(e) = result {
        eprintln!("grpc_latency: {e}");
        std::process::exit(1);
    }
}

async fn serve(addr: &str) -> Result<(), String> {
    let addr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    // Nagle off, as every server in the comparison has it: a reply is small writes that must
    // go out at once.
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(EchoService)
        .serve(addr)
        .await
        .map_err(|e| e.to_string())
}

/// What the callers share on the one thread.
struct Tally {
    histogram: hdrhistogram::Histogram<u64>,
    calls: u64,
    errors: u64,
}

fn call(
    rt: &tokio::runtime::Runtime,
    url: &str,
    concurrency: &str,
    seconds: &str,
    warmup: &str,
) -> Result<(), String> {
    let concurrency: usize = concurrency
        .parse()
        .map_err(|e| format!("concurrency: {e}"))?;
    let secs = |s: &str| s.parse::<f64>().map(Duration::from_secs_f64);
    let window = secs(seconds).map_err(|e| format!("seconds: {e}"))?;
    let warmup = secs(warmup).map_err(|e| format!("warm-up: {e}"))?;
    let channel = rt.block_on(async {
        tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("{url}: {e}"))
    })?;
    let tally = Rc::new(RefCell::new(Tally {
        histogram: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| e.to_string())?,
        calls: 0,
        errors: 0,
    }));
    let t0 = Instant::now() + warmup;
    let end = t0 + window;
    let local = tokio::task::LocalSet::new();
    local.block_on(rt, async {
        let callers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (tally, mut grpc) = (tally.clone(), tonic::client::Grpc::new(channel.clone()));
                tokio::task::spawn_local(async move {
                    // Bounded by `end`: each turn is one call, ended by its timeout at worst.
                    while Instant::now() < end {
                        let start = Instant::now();
                        let mut request = Request::new(Echo {
                            message: "hello world".into(),
                        });
                        request.set_timeout(Duration::from_secs(2));
                        let ok = match grpc.ready().await {
                            Ok(()) => grpc
                                .unary::<Echo, Echo, _>(
                                    request,
                                    http::uri::PathAndQuery::from_static(PATH),
                                    tonic_prost::ProstCodec::default(),
                                )
                                .await
                                .is_ok_and(|r| r.get_ref().message == "hello world"),
                            Err(_) => false,
                        };
                        if start < t0 {
                            continue;
                        }
                        let mut t = tally.borrow_mut();
                        t.calls += 1;
                        if ok {
                            let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                            t.histogram.saturating_record(ns);
                        } else {
                            t.errors += 1;
                        }
                    }
                })
            })
            .collect();
        for c in callers {
            let _ = c.await;
        }
    });
    let t = tally.borrow();
    let us = |q: f64| t.histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "calls {} errors {} rate {:.0} p50_us {:.1} p90_us {:.1} p99_us {:.1} max_us {:.1}",
        t.calls,
        t.errors,
        t.calls as f64 / window.as_secs_f64(),
        us(0.5),
        us(0.9),
        us(0.99),
        t.histogram.max() as f64 / 1000.0
    );
    if t.calls == 0 || t.errors == t.calls {
        return Err(format!("no call succeeded ({} errors)", t.errors));
    }
    Ok(())
}
