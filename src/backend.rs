//! `pinlb backend`: pinned test backends, the hello-world servers people benchmark behind a
//! balancer.
//!
//! One server per listen address, each on a thread of its own with a single-threaded tokio
//! runtime, pinned to one core, all in one process. A server answers every request with the same
//! status and body; `work` burns CPU per request (a busy loop on the monotonic clock, like a
//! business loop) and `delay` waits without CPU (like a database call). `/health` always answers
//! 200 at once.
//!
//! These servers must never be the bottleneck of a measurement: on one core they serve at least
//! 0.9× the rate of an nginx `return 200` worker (`benches/backend.sh`). So the request path
//! allocates no body (each server builds its body once and hands out reference-counted clones),
//! takes no lock, touches no cache line another core writes, and keeps connections alive.
//!
//! Stopping is nginx's fast shutdown (its SIGTERM): the listening sockets close and open
//! connections are dropped, in-flight requests included. A test backend has nothing to finish.

use std::convert::Infallible;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::LocalSet;
use tracing::{debug, error, info, warn};

use crate::cpus::{allowed_cpus, format_cpu_list, parse_cpu_list, pin_current_thread};
use crate::server::Signals;

/// What to run: the servers, where they run and how they answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// One server per address, in this order; port 0 gets a free port from the kernel.
    pub listen: Vec<SocketAddr>,
    /// One core for every server, or one per server in `listen` order. Empty: the cores this
    /// process may run on, assigned round robin.
    pub cpus: Vec<usize>,
    /// Response body size in bytes ("hello world\n" repeated and cut to size).
    pub body: usize,
    /// Response status, 200-599; `/health` answers 200 whatever this is.
    pub status: u16,
    /// CPU burnt per request (busy loop).
    pub work: Duration,
    /// Time waited per request without CPU.
    pub delay: Duration,
}

impl Default for BackendSpec {
    fn default() -> Self {
        BackendSpec {
            listen: Vec::new(),
            cpus: Vec::new(),
            body: HELLO.len(),
            status: 200,
            work: Duration::ZERO,
            delay: Duration::ZERO,
        }
    }
}

impl BackendSpec {
    /// The core each server runs on, in `listen` order, checked against the cores this process
    /// may run on.
    pub fn cores(&self) -> Result<Vec<usize>, BackendError> {
        let allowed = allowed_cpus().map_err(BackendError::AllowedCpus)?;
        assign_cores(self.listen.len(), &self.cpus, &allowed)
    }
}

/// Errors that stop the backends from starting.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("no address to listen on")]
    NoListen,
    #[error(
        "{cpus} cores listed for {servers} {}: list one core for all of them, or one per listen address",
        if *servers == 1 { "server" } else { "servers" }
    )]
    CoreCount { cpus: usize, servers: usize },
    #[error("core {core} is not one this process may run on (allowed: {allowed})")]
    CoreNotAllowed { core: usize, allowed: String },
    #[error("cannot read the cores this process may run on: {0}")]
    AllowedCpus(nix::Error),
    #[error("status {0} is not allowed: expected 200-599")]
    Status(u16),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot pin backend {server} to core {core}: {source}")]
    Pin {
        server: usize,
        core: usize,
        source: nix::Error,
    },
    #[error("cannot start backend {server}: {source}")]
    Thread {
        server: usize,
        source: std::io::Error,
    },
    #[error("a backend thread panicked while starting")]
    Panicked,
    #[error("body size {0} bytes does not fit in memory here")]
    BodyTooLarge(u64),
}

/// The default body, and the pattern longer or shorter bodies are cut from.
const HELLO: &[u8] = b"hello world\n";

/// Running servers, one pinned thread each. Dropping it stops them, like [`Backends::stop`].
pub struct Backends {
    /// Bound addresses, port 0 resolved, in `listen` order.
    addrs: Vec<SocketAddr>,
    /// The core of each server.
    cores: Vec<usize>,
    /// Requests answered by each server. One per server, each on its own cache line, so that two
    /// servers on two cores never write the same line.
    counters: Vec<Arc<Counter>>,
    /// Set to true to stop every server. A watch wakes receivers on any runtime, so one send
    /// reaches all the servers' threads.
    stop: watch::Sender<bool>,
    /// Emptied by the first stop; `Drop` then has nothing left to join.
    threads: Vec<JoinHandle<()>>,
}

/// A request counter alone on its cache line (128 bytes: adjacent-line prefetchers pair lines).
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicU64);

impl Counter {
    /// Only the server's own thread writes its counter, so a plain load and store is exact and
    /// avoids a locked read-modify-write on every request.
    fn bump(&self) {
        let n = self.0.load(Ordering::Relaxed);
        self.0.store(n + 1, Ordering::Relaxed);
    }
}

impl Backends {
    /// Binds every address first, so a taken port fails before any thread starts; then starts one
    /// thread per server and returns once each is pinned to its core and accepting.
    pub fn start(spec: &BackendSpec) -> Result<Backends, BackendError> {
        if spec.listen.is_empty() {
            return Err(BackendError::NoListen);
        }
        let status = match StatusCode::from_u16(spec.status) {
            Ok(s) if (200..=599).contains(&spec.status) => s,
            _ => return Err(BackendError::Status(spec.status)),
        };
        let cores = spec.cores()?;
        let mut listeners = Vec::with_capacity(spec.listen.len());
        let mut addrs = Vec::with_capacity(spec.listen.len());
        for &address in &spec.listen {
            let bound = listen(address).and_then(|l| Ok((l.local_addr()?, l)));
            let (addr, listener) =
                bound.map_err(|source| BackendError::Bind { address, source })?;
            addrs.push(addr);
            listeners.push(listener);
        }

        let (stop, stopped) = watch::channel(false);
        let mut backends = Backends {
            addrs,
            cores: cores.clone(),
            counters: Vec::with_capacity(listeners.len()),
            stop,
            threads: Vec::with_capacity(listeners.len()),
        };
        // Each thread reports once it is pinned and serving (or why it is not), so that `start`
        // returning Ok means every server is up on its core.
        let (ready_tx, ready_rx) = mpsc::channel();
        for (server, (listener, core)) in listeners.into_iter().zip(cores).enumerate() {
            let counter = Arc::new(Counter::default());
            backends.counters.push(counter.clone());
            let answer = Answer {
                status,
                body: body_of(spec.body),
                work: spec.work,
                delay: spec.delay,
                counter,
            };
            let stopped = stopped.clone();
            let ready = ready_tx.clone();
            // Linux keeps 15 bytes of a thread's name: `pinlb-be` leaves room for 7 digits.
            let spawned = std::thread::Builder::new()
                .name(format!("pinlb-be{server}"))
                .spawn(move || server_main(server, core, listener, answer, stopped, ready));
            match spawned {
                Ok(t) => backends.threads.push(t),
                // Dropping `backends` stops and joins the threads already started.
                Err(source) => return Err(BackendError::Thread { server, source }),
            }
        }
        drop(ready_tx);
        for _ in 0..backends.threads.len() {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                // Every sender is gone without a report: a thread panicked while starting.
                Err(_) => return Err(BackendError::Panicked),
            }
        }
        Ok(backends)
    }

    /// The bound addresses, port 0 resolved, in `listen` order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The core of each server, in `listen` order.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }

    /// Requests answered so far by all servers, `/health` not counted.
    pub fn requests(&self) -> u64 {
        self.counters
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Stops accepting, closes every connection and joins the threads. A server busy with `work`
    /// finishes that request's loop first; one waiting out `delay` stops at once.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        for (server, t) in self.threads.drain(..).enumerate() {
            if t.join().is_err() {
                error!("backend {server} panicked");
            }
        }
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Which core each of `servers` servers runs on: `cpus[0]` for all, `cpus[i]` for server i, or,
/// with `cpus` empty, the allowed cores round robin.
fn assign_cores(
    servers: usize,
    cpus: &[usize],
    allowed: &[usize],
) -> Result<Vec<usize>, BackendError> {
    let allowed_list = || format_cpu_list(allowed);
    if let Some(&core) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(BackendError::CoreNotAllowed {
            core,
            allowed: allowed_list(),
        });
    }
    let pool = if cpus.is_empty() { allowed } else { cpus };
    if pool.is_empty() {
        return Err(BackendError::CoreNotAllowed {
            core: 0,
            allowed: allowed_list(),
        });
    }
    if !cpus.is_empty() && cpus.len() != 1 && cpus.len() != servers {
        return Err(BackendError::CoreCount {
            cpus: cpus.len(),
            servers,
        });
    }
    Ok((0..servers).map(|i| pool[i % pool.len()]).collect())
}

/// A body of `len` bytes: "hello world\n" repeated and cut.
fn body_of(len: usize) -> Bytes {
    HELLO
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect::<Vec<u8>>()
        .into()
}

fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    // Not SO_REUSEPORT: two backends must never share a port unnoticed. The backlog is that of
    // benches/peers/backend-nginx.conf, the server this one is measured against.
    crate::server::listener(addr, false, 4096)
}

/// How one server answers, shared by its connections (on its one thread, hence `Rc`).
struct Answer {
    status: StatusCode,
    /// Built once per server, not once for all: cloning bumps a reference count, and a count
    /// shared by servers on different cores would bounce its cache line between them.
    body: Bytes,
    work: Duration,
    delay: Duration,
    counter: Arc<Counter>,
}

fn server_main(
    server: usize,
    core: usize,
    listener: std::net::TcpListener,
    answer: Answer,
    mut stopped: watch::Receiver<bool>,
    ready: mpsc::Sender<Result<(), BackendError>>,
) {
    if let Err(source) = pin_current_thread(&[core]) {
        let _ = ready.send(Err(BackendError::Pin {
            server,
            core,
            source,
        }));
        return;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(source) => {
            let _ = ready.send(Err(BackendError::Thread { server, source }));
            return;
        }
    };
    let listener = {
        let _entered = rt.enter();
        match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(source) => {
                let _ = ready.send(Err(BackendError::Thread { server, source }));
                return;
            }
        }
    };
    let _ = ready.send(Ok(()));
    drop(ready);

    // Connections are spawned onto this LocalSet; the accept loop ends at stop, and dropping the
    // LocalSet and the runtime then drops (closes) every connection.
    let local = LocalSet::new();
    local.block_on(&rt, async move {
        tokio::select! {
            biased;
            // Err: the `Backends` is gone, which means stop too.
            _ = stopped.wait_for(|s| *s) => {}
            () = accept_loop(listener, Rc::new(answer)) => {}
        }
    });
    debug!("backend {server} stopped");
}

async fn accept_loop(listener: TcpListener, answer: Rc<Answer>) {
    let mut builder = http1::Builder::new();
    // No timer is configured; an explicit None keeps hyper from looking for one per connection.
    builder.header_read_timeout(None);
    loop {
        let (stream, peer) = crate::server::accept(&listener).await;
        let answer = answer.clone();
        let service = service_fn(move |req| respond(answer.clone(), req));
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::task::spawn_local(async move {
            if let Err(e) = conn.await {
                debug!(client = %peer, "connection ended: {e}");
            }
        });
    }
}

async fn respond(
    answer: Rc<Answer>,
    req: Request<Incoming>,
) -> Result<Response<Fixed>, Infallible> {
    let health = req.uri().path() == "/health";
    // A request body left unread would make hyper close the connection after the response.
    drain(req.into_body()).await;
    if health {
        return Ok(Response::new(Fixed(Some(Bytes::from_static(b"ok\n")))));
    }
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    if !answer.work.is_zero() {
        burn(answer.work);
    }
    answer.counter.bump();
    let mut resp = Response::new(Fixed(Some(answer.body.clone())));
    *resp.status_mut() = answer.status;
    Ok(resp)
}

/// Reads a request body to its end, dropping the data.
async fn drain(mut body: Incoming) {
    while !body.is_end_stream() {
        match poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
}

/// Keeps the core busy for `d`, on the monotonic clock. It blocks the server's thread on purpose:
/// that is what a request that needs CPU does to a single-threaded server.
fn burn(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// A body sent in one frame, with its exact length so hyper writes a Content-Length.
struct Fixed(Option<Bytes>);

impl Body for Fixed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// `pinlb backend`'s flags.
#[derive(Debug, clap::Args)]
pub struct BackendArgs {
    /// Address to serve on (IP:PORT; port 0 picks a free port). Repeat for more servers.
    #[arg(long, value_name = "ADDR", required = true)]
    pub listen: Vec<SocketAddr>,
    /// Cores: one for every server, or one per --listen in order ("1,2", "1-2").
    /// Default: the cores this process may run on, round robin.
    #[arg(long, value_name = "LIST", value_parser = parse_cpus)]
    pub cpus: Option<std::vec::Vec<usize>>,
    /// Response body size ("12", "1KiB", "1MB").
    #[arg(long, value_name = "SIZE", default_value = "12")]
    pub body: bytesize::ByteSize,
    /// Response status (200-599); /health answers 200 regardless.
    #[arg(long, value_name = "NNN", default_value_t = 200)]
    pub status: u16,
    /// CPU burnt per request, busy ("200us", "1ms").
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub work: humantime::Duration,
    /// Time waited per request without CPU ("5ms").
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub delay: humantime::Duration,
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    parse_cpu_list(s)
}

impl BackendArgs {
    /// The spec these flags describe.
    pub fn spec(&self) -> Result<BackendSpec, BackendError> {
        let body = usize::try_from(self.body.as_u64())
            .map_err(|_| BackendError::BodyTooLarge(self.body.as_u64()))?;
        Ok(BackendSpec {
            listen: self.listen.clone(),
            cpus: self.cpus.clone().unwrap_or_default(),
            body,
            status: self.status,
            work: self.work.into(),
            delay: self.delay.into(),
        })
    }
}

/// Runs `pinlb backend` until SIGTERM or SIGINT; exits 0 then, 1 if the servers cannot start.
pub fn main(args: BackendArgs) -> ExitCode {
    let spec = match args.spec() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pinlb backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    let control = match crate::server::control_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pinlb backend: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Registered before the ports open: a SIGTERM sent once a port answers must stop the servers
    // cleanly, not kill the process with the default action.
    let signals = match control.block_on(async { Signals::register() }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pinlb backend: cannot listen for SIGTERM/SIGINT: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The main thread only waits for signals, but it is the one `/proc/PID/status` describes:
    // pinning it to the servers' cores makes the process's allowed cores (what `pinlb check`
    // and `taskset -p` show) the cores it really uses. The server threads it starts inherit
    // this mask, so none runs outside it even before it narrows to its own core.
    match spec.cores() {
        Ok(cores) => {
            if let Err(e) = pin_current_thread(&cores) {
                warn!(
                    "cannot pin the main thread to cores {}: {e}",
                    format_cpu_list(&cores)
                );
            }
        }
        Err(e) => {
            eprintln!("pinlb backend: {e}");
            return ExitCode::FAILURE;
        }
    }
    let backends = match Backends::start(&spec) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("pinlb backend: {e}");
            return ExitCode::FAILURE;
        }
    };
    // stdout is for scripts that wait for the ports: one line per server, flushed per line.
    for (i, (addr, core)) in backends.addrs().iter().zip(backends.cores()).enumerate() {
        println!("backend {i} listening on {addr} (core {core})");
    }
    info!(
        "answering {} with {} body bytes, work {}, delay {}; /health answers 200",
        spec.status,
        spec.body,
        humantime::format_duration(spec.work),
        humantime::format_duration(spec.delay)
    );
    control.block_on(signals.wait());
    info!(
        "stopping after {} requests (not counting /health)",
        backends.requests()
    );
    backends.stop();
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_serves_every_server() {
        assert_eq!(assign_cores(3, &[1], &[0, 1, 2]).unwrap(), vec![1, 1, 1]);
    }

    #[test]
    fn one_core_per_server_goes_in_listen_order() {
        assert_eq!(assign_cores(2, &[2, 1], &[0, 1, 2]).unwrap(), vec![2, 1]);
    }

    #[test]
    fn no_cores_means_the_allowed_ones_round_robin() {
        assert_eq!(
            assign_cores(5, &[], &[0, 2, 3]).unwrap(),
            vec![0, 2, 3, 0, 2]
        );
    }

    #[test]
    fn a_core_count_that_fits_neither_rule_is_an_error() {
        let e = assign_cores(3, &[0, 1], &[0, 1, 2]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "2 cores listed for 3 servers: list one core for all of them, or one per listen address"
        );
    }

    #[test]
    fn a_core_outside_the_allowed_set_is_an_error() {
        let e = assign_cores(1, &[7], &[0, 1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "core 7 is not one this process may run on (allowed: 0-1)"
        );
    }

    #[test]
    fn bodies_are_hello_world_cut_to_size() {
        assert_eq!(body_of(12), Bytes::from_static(b"hello world\n"));
        assert_eq!(body_of(5), Bytes::from_static(b"hello"));
        assert_eq!(body_of(15), Bytes::from_static(b"hello world\nhel"));
        assert!(body_of(0).is_empty());
    }

    #[test]
    fn informational_and_out_of_range_statuses_are_refused() {
        for status in [100, 199, 600, 1000] {
            let spec = BackendSpec {
                listen: vec!["127.0.0.1:0".parse().unwrap()],
                status,
                ..BackendSpec::default()
            };
            assert!(
                matches!(Backends::start(&spec), Err(BackendError::Status(s)) if s == status),
                "{status}"
            );
        }
    }

    #[test]
    fn no_listen_address_is_an_error() {
        assert!(matches!(
            Backends::start(&BackendSpec::default()),
            Err(BackendError::NoListen)
        ));
    }
}
