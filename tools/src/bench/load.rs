//! Generating load on one target for one run (a warm-up, then the recorded window): pinned
//! threads, each with its own single-threaded tokio runtime and its share of the connections.
//!
//! Nothing is shared between threads while they run except one progress counter each: every
//! thread records into its own histogram and counts, which the coordinating thread merges when
//! they are done, as wrk does. Inside a thread, the closed loop is one task that drives all the
//! thread's connections like an event loop (`closed.rs`); the open loop is one task per
//! connection, on the thread's runtime. Either way they share the thread's statistics through a
//! `RefCell`, since no borrow is ever held across an await.
//!
//! Accounting is exact: a request belongs to the recorded window when it was sent (closed loop)
//! or scheduled (open loop) inside it, to the warm-up otherwise. After the window closes no new
//! request goes out, and every request already out is waited for (up to the timeout) and counted,
//! so the requests a server saw are exactly the `sent` of the warm-up plus the recorded window.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::BenchError;
use super::closed::closed_loop;
use super::stats::Counts;
use super::stats::new_histogram;
use super::thread::{Failed, Progress, READ_BUF, Stats, Thread, connect};
use super::ws::WsPlan;
use pinlb::sys::runtime::{self, PinnedError};

/// How often the coordinating thread reports progress while the threads run.
const TICK: Duration = Duration::from_millis(250);
/// With `-n`, the recorded window ends when the requests are spent; this only bounds a run whose
/// requests never finish (each is bounded by the timeout, so it is never reached in practice).
const COUNTED_WINDOW_BOUND: Duration = Duration::from_secs(7 * 24 * 3600);

/// One run of one target, as the threads need it.
#[derive(Debug)]
pub(crate) struct Plan {
    pub addr: SocketAddr,
    /// `https://`: how connections shake hands.
    pub tls: Option<super::tls::Tls>,
    /// The request bytes, built once for the whole bench and written as is on every exchange
    /// (with `--ws`, the message's frame).
    pub request: Arc<[u8]>,
    /// `--ws`: the handshake each connection opens with, and the echo's size.
    pub websocket: Option<Arc<WsPlan>>,
    pub connections: usize,
    pub threads: usize,
    /// Thread `i` is pinned to `cpus[i % cpus.len()]`.
    pub cpus: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    /// `-n`: the recorded window is this many requests, not `duration`.
    pub requests: Option<u64>,
    pub timeout: Duration,
    /// The request is a `HEAD` (its responses have no body).
    pub head_request: bool,
    /// `--disable-keepalive` turns this off: one request per connection.
    pub keep_alive: bool,
    /// Total requests per second in open loop; `None` is closed loop.
    pub rate: Option<f64>,
    /// `--h2`: the HTTP/2 request and the streams per connection.
    pub h2: Option<Arc<super::h2::H2Plan>>,
}

/// `--h2`: one request to the target on a runtime of this thread's own, before any load, so a
/// target that does not speak HTTP/2 fails the bench with a message that says so. Does nothing
/// without `--h2`.
pub(crate) fn probe_h2(plan: &Plan) -> Result<(), String> {
    let Some(h2) = &plan.h2 else {
        return Ok(());
    };
    let rt = runtime::local().map_err(|e| e.to_string())?;
    rt.block_on(super::h2::probe(
        plan.addr,
        plan.timeout,
        plan.tls.as_ref(),
        h2,
    ))
}

/// What one run measured, merged over its threads.
#[derive(Debug)]
pub(crate) struct RunResult {
    /// Latencies of the recorded window's responses, in ns.
    pub histogram: Histogram<u64>,
    /// pinlb's own time on the recorded window's responses that said it (`Server-Timing`),
    /// in ns; empty when none did.
    pub pinlb_time: Histogram<u64>,
    pub recorded: Counts,
    pub warmup: Counts,
    /// From the start of the recorded window until the slowest thread had every request it sent
    /// answered (or timed out): the time the recorded requests took.
    pub elapsed: Duration,
    /// Why the first failed connect failed, if one did.
    pub connect_failure: Option<std::io::ErrorKind>,
}

/// What the threads have done so far, warm-up included, for the progress line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Done {
    pub responses: u64,
    pub errors: u64,
}

/// What each thread sends the coordinating thread.
enum Msg {
    /// Pinned and ready to start, or why not.
    Ready(Result<(), BenchError>),
    /// Boxed: a run's counts are large beside the other messages.
    Done(Result<Box<RunResult>, BenchError>),
}

/// Runs `plan` on its pinned threads and blocks until they are done. While they run, `tick` is
/// called every 250 ms on this thread with the time since the start and the responses and
/// errors so far (warm-up included), and `window` once, when the recorded window starts (after
/// the warm-up; at the start without one): what reads the servers' CPU at the window's edges.
///
/// The calling thread is not pinned: it only waits, and it belongs to the caller.
pub(crate) fn run(
    plan: &Arc<Plan>,
    tick: &mut dyn FnMut(Duration, Done),
    window: &mut dyn FnMut(),
) -> Result<RunResult, BenchError> {
    let (tx, rx) = mpsc::channel();
    let progress: Arc<Vec<Progress>> =
        Arc::new((0..plan.threads).map(|_| Progress::default()).collect());
    let mut go = Vec::with_capacity(plan.threads);
    let mut handles = Vec::with_capacity(plan.threads);
    for thread in 0..plan.threads {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let core = plan.cpus[thread % plan.cpus.len()];
        // Connection `g` goes to thread `g % threads`, so open-loop send offsets interleave.
        let conns: Vec<usize> = (thread..plan.connections).step_by(plan.threads).collect();
        let (plan, tx, progress) = (plan.clone(), tx.clone(), progress.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("pinlb-bench{thread}"))
            .spawn(move || thread_main(thread, core, &plan, conns, &tx, &go_rx, progress));
        match spawned {
            Ok(h) => {
                handles.push(h);
                go.push(go_tx);
            }
            Err(source) => {
                // Dropping the go senders tells the threads already started to give up.
                drop(go);
                join(handles)?;
                return Err(BenchError::Thread { thread, source });
            }
        }
    }
    drop(tx);

    // Every thread pinned and its runtime built before any load starts, so the first thread's
    // connections don't run alone while the others set up.
    let mut failed = None;
    for _ in 0..plan.threads {
        match rx.recv() {
            Ok(Msg::Ready(Ok(()))) => {}
            Ok(Msg::Ready(Err(e)) | Msg::Done(Err(e))) => {
                failed.get_or_insert(e);
            }
            Ok(Msg::Done(Ok(_))) => {}
            // Every thread reports once (see `SetupGuard`), so this cannot happen.
            Err(_) => break,
        }
    }
    if let Some(e) = failed {
        drop(go);
        join(handles)?;
        return Err(e);
    }
    let begin = Instant::now();
    let window_at = begin + plan.warmup;
    let mut in_window = plan.warmup.is_zero();
    if in_window {
        window();
    }
    for g in &go {
        let _ = g.send(());
    }

    let mut results = Vec::with_capacity(plan.threads);
    while results.len() < plan.threads {
        // Woken at the window's start too, to call `window` then.
        let wait = if in_window {
            TICK
        } else {
            TICK.min(window_at.saturating_duration_since(Instant::now()))
        };
        let msg = rx.recv_timeout(wait);
        if !in_window && Instant::now() >= window_at {
            in_window = true;
            window();
        }
        match msg {
            Ok(Msg::Done(r)) => results.push(r),
            Ok(Msg::Ready(_)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let done = Done {
                    responses: progress
                        .iter()
                        .map(|p| p.responses.load(Ordering::Relaxed))
                        .sum(),
                    errors: progress
                        .iter()
                        .map(|p| p.errors.load(Ordering::Relaxed))
                        .sum(),
                };
                tick(begin.elapsed(), done);
            }
            // A thread died without reporting; `join` says which.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    join(handles)?;
    if !in_window {
        window();
    }

    let mut merged = RunResult {
        histogram: new_histogram()?,
        pinlb_time: new_histogram()?,
        recorded: Counts::default(),
        warmup: Counts::default(),
        elapsed: Duration::ZERO,
        connect_failure: None,
    };
    for r in results {
        let r = r?;
        merged.histogram.add(&r.histogram)?;
        merged.pinlb_time.add(&r.pinlb_time)?;
        merged.recorded.add(&r.recorded);
        merged.warmup.add(&r.warmup);
        merged.elapsed = merged.elapsed.max(r.elapsed);
        merged.connect_failure = merged.connect_failure.or(r.connect_failure);
    }
    Ok(merged)
}

fn join(handles: Vec<std::thread::JoinHandle<()>>) -> Result<(), BenchError> {
    let mut result = Ok(());
    for (thread, h) in handles.into_iter().enumerate() {
        if h.join().is_err() {
            result = Err(BenchError::ThreadPanicked { thread });
        }
    }
    result
}

fn thread_main(
    thread: usize,
    core: usize,
    plan: &Plan,
    conns: Vec<usize>,
    tx: &mpsc::Sender<Msg>,
    go: &mpsc::Receiver<()>,
    progress: Arc<Vec<Progress>>,
) {
    // Until this thread reports Ready, a panic must still report something: the coordinator
    // waits for one message per thread before it starts any load.
    let guard = SetupGuard { tx, thread };
    let setup = (|| {
        let rt = runtime::pinned(core).map_err(|e| match e {
            PinnedError::Pin(source) => BenchError::Pin {
                thread,
                core,
                source,
            },
            PinnedError::Runtime(source) => BenchError::Thread { thread, source },
        })?;
        Ok((rt, new_histogram()?, new_histogram()?))
    })();
    std::mem::forget(guard);
    let (rt, histogram, pinlb_time) = match setup {
        Ok(s) => {
            let _ = tx.send(Msg::Ready(Ok(())));
            s
        }
        Err(e) => {
            let _ = tx.send(Msg::Ready(Err(e)));
            return;
        }
    };
    if go.recv().is_err() {
        return;
    }

    let begin = Instant::now();
    let t0 = begin + plan.warmup;
    // With `-n` the window ends when the budget is spent; `end` only has to be out of reach.
    let (end, budget) = match plan.requests {
        Some(n) => {
            let threads = plan.threads as u64;
            let share = n / threads + u64::from((thread as u64) < n % threads);
            (t0 + COUNTED_WINDOW_BOUND, share)
        }
        None => (t0 + plan.duration, u64::MAX),
    };
    let shared = Rc::new(Thread {
        addr: plan.addr,
        tls: plan.tls.clone(),
        request: plan.request.clone(),
        websocket: plan.websocket.clone(),
        timeout: plan.timeout,
        head_request: plan.head_request,
        keep_alive: plan.keep_alive,
        budget: std::cell::Cell::new(budget),
        begin,
        t0,
        end,
        stats: RefCell::new(Stats {
            histogram,
            pinlb_time,
            recorded: Counts::default(),
            warmup: Counts::default(),
            responses: 0,
            errors: 0,
            connect_failure: None,
        }),
        progress,
        thread,
    });
    let panicked = rt.block_on(async {
        let tasks: Vec<_> = match (&plan.h2, plan.rate) {
            (Some(h2), _) => {
                let h2 = Rc::new((**h2).clone());
                conns
                    .iter()
                    .map(|_| {
                        let (sh, h2) = (shared.clone(), h2.clone());
                        tokio::task::spawn_local(super::h2::connection(sh, h2))
                    })
                    .collect()
            }
            (None, None) => {
                let (sh, n) = (shared.clone(), conns.len());
                vec![tokio::task::spawn_local(async move {
                    closed_loop(&sh, n).await
                })]
            }
            (None, Some(rate)) => conns
                .into_iter()
                .map(|g| {
                    let (sh, connections) = (shared.clone(), plan.connections);
                    tokio::task::spawn_local(
                        async move { open_loop(&sh, g, connections, rate).await },
                    )
                })
                .collect(),
        };
        let mut panicked = false;
        for t in tasks {
            panicked |= t.await.is_err();
        }
        panicked
    });
    let elapsed = Instant::now().saturating_duration_since(t0);
    let result = if panicked {
        Err(BenchError::ThreadPanicked { thread })
    } else {
        match Rc::try_unwrap(shared) {
            Ok(sh) => {
                let s = sh.stats.into_inner();
                Ok(RunResult {
                    histogram: s.histogram,
                    pinlb_time: s.pinlb_time,
                    recorded: s.recorded,
                    warmup: s.warmup,
                    elapsed,
                    connect_failure: s.connect_failure,
                })
            }
            // Every task has ended and dropped its handle; this is the last one.
            Err(_) => Err(BenchError::ThreadPanicked { thread }),
        }
    };
    let _ = tx.send(Msg::Done(result.map(Box::new)));
}

/// Sends `Ready(Err(ThreadPanicked))` if dropped, which only happens when setup panics; a
/// thread that gets through setup forgets it and reports for itself.
struct SetupGuard<'a> {
    tx: &'a mpsc::Sender<Msg>,
    thread: usize,
}

impl Drop for SetupGuard<'_> {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Ready(Err(BenchError::ThreadPanicked {
            thread: self.thread,
        })));
    }
}

/// Open loop: connection `g` of `connections` sends at fixed times, `connections / rate` seconds
/// apart, offset by `g / rate` so that together they send `rate` requests per second evenly.
///
/// Latency is measured from the scheduled send time when the connection is behind schedule (a
/// slow response held it up), so waiting on a slow server counts, as in wrk2; this is the
/// correction for coordinated omission. When the connection was idle and waited for its slot, it
/// counts from the moment it woke instead: tokio's timer wakes up to a millisecond late, and that
/// delay is the load generator's, not the server's. A connection that has to reconnect counts
/// the connect, since a user would wait for it too. A failed connect costs that slot. Nothing
/// is sent once the window has closed, even for slots inside it that came due late.
async fn open_loop(sh: &Thread, g: usize, connections: usize, rate: f64) {
    let mut buf = vec![0u8; READ_BUF];
    let mut conn: Option<super::tls::Stream> = None;
    let timer = tokio::time::sleep(sh.timeout);
    tokio::pin!(timer);
    let wait = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(wait);
    let interval = connections as f64 / rate;
    let offset = g as f64 / rate;
    for k in 0u64.. {
        let Ok(at) = Duration::try_from_secs_f64(offset + k as f64 * interval) else {
            break;
        };
        let slot = sh.begin + at;
        if slot >= sh.end {
            break;
        }
        let recorded = slot >= sh.t0;
        let start = if Instant::now() < slot {
            wait.as_mut().reset(tokio::time::Instant::from_std(slot));
            wait.as_mut().await;
            Instant::now()
        } else {
            slot
        };
        // A connection far behind schedule (a server that times out) still stops with the
        // window: its remaining slots are not sent at all.
        if Instant::now() >= sh.end || (recorded && !sh.take()) {
            break;
        }
        let stream = match conn {
            Some(ref mut s) => s,
            None => match connect(sh.addr, sh.timeout, sh.tls.as_ref()).await {
                Ok(s) => conn.insert(s),
                Err(e) => {
                    // The slot's `-n` budget was taken above: the failed connect is its outcome.
                    sh.connect_error(recorded, Failed::Connect(e.kind()));
                    continue;
                }
            },
        };
        let (outcome, keep_alive, bytes) = sh.exchange(stream, &mut buf, timer.as_mut()).await;
        sh.record(recorded, outcome, start.elapsed(), bytes);
        if !keep_alive {
            conn = None;
        }
    }
}
