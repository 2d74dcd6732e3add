//! Active health checks: [`probe`] sends one `GET` (in the upstream's protocol) and reads the
//! status, or, for a TCP listener's upstream, connects (and sends and expects what the check
//! names), and [`run`] probes
//! every backend of every upstream that has a `health` table, on the control thread (pinned to
//! `runtime.cpus`), spreading the probes over the interval. Each result goes through the pure
//! `health::Checks` counter of its backend, in `upstream::BackendState`.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};
use tracing::{info, warn};

use crate::backend_address::BackendAddress;
use crate::config::{Fastcgi, Health, Protocol, TcpCheck};
use crate::http1::client::{ConnectError, UpstreamBody, connect, describe_io};
use crate::tls::client::Connector;
use crate::upstream::health::Checks;
use crate::upstream::shared::SharedUpstream;

/// Sends one health probe: `GET path` with `Connection: close`, and checks the status against
/// `expect`. The whole exchange, connect included, must fit in `timeout`. Returns why it failed.
/// Over TLS when `tls` is given, as requests to the backend go: a probe passes only when a
/// request could (the certificate verifies, the handshake succeeds).
pub async fn probe(
    addr: BackendAddress,
    health: &Health,
    protocol: Protocol,
    tls: Option<&Connector>,
    first: &[u8],
) -> Result<(), String> {
    probe_with(addr, health, protocol, tls, first, None).await
}

/// [`probe`], with a FastCGI upstream's script rules (`[upstream.NAME.fastcgi]`), which a
/// FastCGI probe's PARAMS are made by; without them its SCRIPT_NAME and SCRIPT_FILENAME are the
/// health path, which is what php-fpm's `ping.path` and `pm.status_path` look at.
pub async fn probe_with(
    addr: BackendAddress,
    health: &Health,
    protocol: Protocol,
    tls: Option<&Connector>,
    first: &[u8],
    fastcgi: Option<&Arc<Fastcgi>>,
) -> Result<(), String> {
    if let Some(check) = &health.tcp {
        return match tokio::time::timeout(
            health.timeout,
            exchange_tcp(addr, (check, health.timeout), tls, first),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {:?}", health.timeout)),
        };
    }
    let exchange = async {
        let status = match protocol {
            Protocol::Http1 => exchange(addr, health, tls, first).await?,
            Protocol::H2c | Protocol::H2 => exchange_h2(addr, health, tls).await?,
            Protocol::Fastcgi => {
                let f = fastcgi.map(|f| &**f);
                crate::upstream::probe_fastcgi::exchange(addr, health, tls, first, f).await?
            }
        };
        if health.expect.contains(status) {
            Ok(())
        } else {
            Err(format!("status {status}, expected {}", health.expect))
        }
    };
    match tokio::time::timeout(health.timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no response within {:?}", health.timeout)),
    }
}

/// The probe of a TCP listener's upstream (HAProxy's `tcp-check`): a connect, then `send`
/// written and the answer's first bytes compared with `receive`, as far as each is set. The
/// connection is closed with a FIN after it, so that the backend sees an orderly close.
async fn exchange_tcp(
    addr: BackendAddress,
    (check, timeout): (&TcpCheck, Duration),
    tls: Option<&Connector>,
    first: &[u8],
) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let mut conn = connect(addr, timeout, tls, first)
        .await
        .map_err(|e| e.cause)?;
    if !check.send.is_empty() {
        let sent = async {
            conn.stream.write_all(&check.send).await?;
            conn.stream.flush().await
        };
        sent.await
            .map_err(|e| format!("sending the check failed: {e}"))?;
    }
    if check.mysql {
        return greeting(&mut conn.stream).await;
    }
    let want = &check.receive;
    let mut got = Vec::with_capacity(want.len());
    let mut buf = [0u8; 1024];
    // Bounded: every pass reads at least one byte of at most `want.len()`, or returns.
    while got.len() < want.len() {
        let room = (want.len() - got.len()).min(buf.len());
        let n = conn
            .stream
            .read(&mut buf[..room])
            .await
            .map_err(|e| format!("reading the answer failed: {e}"))?;
        if n == 0 {
            return Err(format!(
                "closed after {} byte(s) of its answer, expected it to begin with {}",
                got.len(),
                escaped(want)
            ));
        }
        got.extend_from_slice(&buf[..n]);
        if !want.starts_with(&got) {
            return Err(format!(
                "answered {}, expected {}",
                escaped(&got),
                escaped(want)
            ));
        }
    }
    let _ = conn.stream.shutdown().await;
    Ok(())
}

/// A MySQL or MariaDB server's greeting, read and closed (HAProxy's `mysql-check` without a
/// user): passes on a handshake packet (protocol version 10), fails on an error packet with
/// its message, or on anything else.
async fn greeting(stream: &mut crate::http1::client::BackendStream) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 4];
    stream
        .read_exact(&mut header)
        .await
        .map_err(|e| format!("no greeting: {e}"))?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    if len == 0 || len > 16 * 1024 {
        return Err(format!("not a MySQL greeting: a packet of {len} bytes"));
    }
    let mut packet = vec![0u8; len];
    stream
        .read_exact(&mut packet)
        .await
        .map_err(|e| format!("a greeting cut short: {e}"))?;
    let _ = stream.shutdown().await;
    match packet[0] {
        10 => Ok(()),
        // 0xff, the error code (2 bytes), then the message (after a `#` and the SQL state on
        // a 4.1 server).
        0xff if len >= 3 => {
            let code = u16::from_le_bytes([packet[1], packet[2]]);
            let text = String::from_utf8_lossy(&packet[3..]);
            Err(format!("the server refused: {code} {text}"))
        }
        v => Err(format!("not a MySQL greeting: protocol version {v}")),
    }
}

/// Bytes as a quoted, escaped string for a log line: `"+PONG\r\n"`.
fn escaped(bytes: &[u8]) -> String {
    format!("\"{}\"", bytes.escape_ascii())
}

/// The probe over HTTP/1.1; the response's status.
async fn exchange(
    addr: BackendAddress,
    health: &Health,
    tls: Option<&Connector>,
    first: &[u8],
) -> Result<u16, String> {
    // The probe's own timeout bounds the whole exchange, the connect included.
    let mut conn = connect(addr, health.timeout, tls, first)
        .await
        .map_err(|e| e.cause)?;
    let host = health.host.clone().unwrap_or_else(|| addr.host());
    let request = format!(
        "GET {} HTTP/1.1\r\nhost: {host}\r\nuser-agent: pinlb-health\r\nconnection: close\r\n\r\n",
        health.path
    );
    let sent = async {
        conn.stream.write_all(request.as_bytes()).await?;
        conn.stream.flush().await
    };
    sent.await
        .map_err(|e| format!("sending the probe failed: {e}"))?;
    let head = conn
        .read_head(&Method::GET)
        .await
        .map_err(|e| e.to_string())?;
    let status = head.status.as_u16();
    // Read the body to its end so the backend sees an orderly close rather than a reset.
    let mut body = UpstreamBody::new(conn, &head);
    while let Some(piece) = poll_fn(|cx| body.poll_data(cx)).await {
        piece.map_err(|e| format!("reading the body failed: {e}"))?;
    }
    Ok(status)
}

/// The probe over HTTP/2 (over TLS with `tls`), on a connection of its own (closed after it,
/// as the HTTP/1.1 probe's is); the response's status.
async fn exchange_h2(
    addr: BackendAddress,
    health: &Health,
    tls: Option<&Connector>,
) -> Result<u16, String> {
    let tcp_addr = match addr {
        BackendAddress::Tcp(a) => a,
        BackendAddress::Unix(path) => {
            let unix = UnixStream::connect(path)
                .await
                .map_err(|e| ConnectError::unix(path, &e).cause)?;
            return exchange_h2_on(TokioIo::new(unix), addr, health, "http").await;
        }
    };
    let tcp = TcpStream::connect(tcp_addr)
        .await
        .map_err(|e| describe_io(&e))?;
    let _ = tcp.set_nodelay(true);
    match tls {
        None => exchange_h2_on(TokioIo::new(tcp), addr, health, "http").await,
        Some(connector) => {
            let stream = connector.handshake(tcp).await?;
            exchange_h2_on(TokioIo::new(stream), addr, health, "https").await
        }
    }
}

/// The HTTP/2 probe on a connected `io`. The control thread's runtime is not a worker's, so
/// hyper's tasks go on it through tokio's own executor.
async fn exchange_h2_on<T>(
    io: T,
    addr: BackendAddress,
    health: &Health,
    scheme: &str,
) -> Result<u16, String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    use http_body_util::{BodyExt, Empty};
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    let driver = tokio::spawn(conn);
    let host = health.host.clone().unwrap_or_else(|| addr.host());
    let request = http::Request::get(format!("{scheme}://{host}{}", health.path))
        .header(http::header::USER_AGENT, "pinlb-health")
        .body(Empty::new())
        .map_err(|e| format!("cannot send the probe: {e}"))?;
    let exchanged = async {
        let response = send
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP/2: {e}"))?;
        let status = response.status().as_u16();
        // Read to its end, so the stream closes in order.
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the body failed: {e}"))?;
        Ok(status)
    }
    .await;
    driver.abort();
    exchanged
}

/// Probes every backend of every upstream that has a `health` table, until dropped; never
/// returns. A reload drops it and starts it again with the new generation's upstreams.
///
/// Each backend has its own loop. Their first probes are spread evenly over the interval, and
/// every wait gets up to ±10% jitter, so probes of many backends (or many pinlb processes) do not
/// fire together. Runs on the caller's runtime: the control thread's, pinned to `runtime.cpus`.
pub async fn run(upstreams: Vec<Arc<SharedUpstream>>) {
    let mut loops = tokio::task::JoinSet::new();
    for up in upstreams {
        let Some(health) = up.config.health.clone() else {
            continue;
        };
        let n = up.backends.len() as u32;
        for i in 0..up.backends.len() {
            let offset = health.interval / n.max(1) * i as u32;
            loops.spawn(check_loop(up.clone(), i, health.clone(), offset));
        }
    }
    // The loops run until the set is dropped with this future.
    while loops.join_next().await.is_some() {}
    std::future::pending::<()>().await;
}

async fn check_loop(up: Arc<SharedUpstream>, backend: usize, health: Health, offset: Duration) {
    let state = &up.backends[backend];
    // After a reload the loop starts again, from the backend's state and the streak the last
    // loop left: frequent reloads must not keep a failing backend from ever reaching `fall`.
    let mut checks = Checks {
        up: state.is_up(),
        streak: state.check_streak(),
    };
    let mut next = tokio::time::Instant::now() + offset;
    loop {
        tokio::time::sleep_until(next).await;
        // From now when behind (the thread stalled, or a probe ran long), so missed probes are
        // skipped rather than fired back to back.
        next = next.max(tokio::time::Instant::now()) + jittered(health.interval);
        let started = std::time::Instant::now();
        let first = crate::upstream::proxy_header::for_probe(up.config.proxy_protocol);
        let result = probe_with(
            state.address,
            &health,
            up.config.protocol,
            up.tls(backend),
            &first,
            up.config.fastcgi.as_ref(),
        )
        .await;
        if up.counting {
            state.stats.check_time.observe(started.elapsed());
            state.stats.checked(result.is_ok());
        }
        let changed = checks.record(result.is_ok(), health.rise, health.fall);
        state.set_check_streak(checks.streak);
        let Some(up_now) = changed else {
            continue;
        };
        state.set_up(up_now);
        match result {
            Ok(()) => info!(
                upstream = %up.config.name,
                "backend {} UP after {} passing checks",
                state.address, health.rise
            ),
            Err(cause) => warn!(
                upstream = %up.config.name,
                "backend {} DOWN after {} failed checks: {cause}",
                state.address, health.fall
            ),
        }
    }
}

/// `interval` changed by a random amount of up to ±10%.
fn jittered(interval: Duration) -> Duration {
    let tenth = interval / 10;
    interval - tenth + tenth.mul_f64(2.0 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let i = Duration::from_secs(2);
        for _ in 0..1000 {
            let j = jittered(i);
            assert!(j >= Duration::from_millis(1800) && j <= Duration::from_millis(2200));
        }
    }
}
