//! pinlb under more load than its own sockets and descriptors take: each listener's backlog
//! reaches its sockets (and a reload changes it), the open file limit is raised and reported,
//! a process out of descriptors keeps serving what it can without spinning, and a flood of
//! failed requests writes a summed log instead of a line per request.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use tokio::net::TcpStream;

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: app\r\n\r\n";

/// The backlog (Send-Q) of every socket listening on `port`, as `ss -ltn` shows it.
fn backlogs(port: u16) -> Vec<u32> {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .expect("run ss (iproute2)");
    assert!(out.status.success(), "ss failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cols[0], "LISTEN", "{l}");
            cols[2].parse().expect("Send-Q")
        })
        .collect()
}

/// The kernel's `net.core.somaxconn`.
fn somaxconn() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("read somaxconn")
        .trim()
        .parse()
        .unwrap()
}

/// The process's CPU time so far (utime + stime from `/proc/PID/stat`), in seconds.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // The command name may hold spaces; the fields after it are plain.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // /proc counts in USER_HZ, which Linux fixes at 100 for user space on every architecture.
    ticks as f64 / 100.0
}

/// Sends one request on `conn` and reads its response, bounded by [`WAIT`].
async fn request(conn: &mut RawConn) -> RawResponse {
    tokio::time::timeout(WAIT, conn.exchange(GET, false))
        .await
        .expect("a response within WAIT")
}

#[test]
fn the_default_backlog_is_the_kernels_somaxconn() {
    let backend: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let config =
        pinlb::Config::parse("test.toml", &Setup::with(&[backend]).toml(), &allowed()).unwrap();
    let server = pinlb::Server::bind(config).expect("bind");
    let port = server.local_addrs()[0].port();
    let found = backlogs(port);
    assert_eq!(found.len(), 1, "one worker, one socket: {found:?}");
    assert_eq!(found, [somaxconn()]);
}

#[tokio::test]
async fn the_configured_backlog_reaches_the_socket_and_a_reload_changes_it() {
    let backend = Backend::start("a").await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.listener_keys = "backlog = 128\n".into();
    let mut proxy = BinProxy::spawn(&setup).await;
    assert_eq!(backlogs(proxy.addr.port()), [128]);

    setup.listener_keys = "backlog = 64\n".into();
    std::fs::write(proxy.config_path(), setup.toml()).unwrap();
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy
        .wait_for_log("listener 127.0.0.1:0: backlog 128 -> 64")
        .await;
    proxy.wait_for_log("reloaded: generation 2").await;
    // The same socket, listening all along, with its new queue length.
    assert_eq!(backlogs(proxy.addr.port()), [64]);
    let mut conn = RawConn::open(proxy.addr).await;
    assert_eq!(request(&mut conn).await.status, 200);
}

#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_the_hard_one_and_reported() {
    let hard = pinlb::sys::limits::nofile()
        .unwrap()
        .hard
        .expect("a finite hard limit");
    assert!(
        hard > 1024,
        "this test needs a hard limit above 1024, have {hard}"
    );
    let backend = Backend::start("a").await;
    let mut setup = Setup::with(&[backend.addr]);
    setup.extra = "[limits]\nmax_connections = 100\n".into();
    let mut proxy = BinProxy::spawn_with_ulimit(&setup.toml(), "-Sn 1024").await;
    let line = proxy.wait_for_log("open file limit ").await;
    assert!(
        line.contains(&format!("open file limit {hard}: room for ")),
        "{line}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", proxy.pid)).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let values: Vec<&str> = open_files.split_whitespace().collect();
    assert_eq!(
        values[3..5],
        [hard.to_string(), hard.to_string()],
        "{open_files}"
    );
    // 100 connections fit: no warning (it would come right after the limit's line, before
    // the "listening on" line the spawn waited for).
    assert!(
        !proxy.log().iter().any(|l| l.contains("does not fit")),
        "{:#?}",
        proxy.log()
    );
}

/// With 1024 descriptors and `max_connections` left to its default (10,000, which needs about
/// 20,000), pinlb lowers it to what fits and says so once, without a warning; a reload of the
/// same file is no change to it, and the lowered limit is what admission holds to.
#[tokio::test]
async fn a_default_max_connections_that_does_not_fit_is_lowered_and_said_once() {
    let backend = Backend::start("a").await;
    let setup = Setup::with(&[backend.addr]);
    let mut proxy = BinProxy::spawn_with_ulimit(&setup.toml(), "-n 1024").await;
    let line = proxy.wait_for_log("limits.max_connections is ").await;
    assert!(
        line.contains("what the open file limit 1024 has room for (the default, 10000, does not fit; set it to choose)"),
        "{line}"
    );
    let room: usize = line
        .split("limits.max_connections is ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a number in {line:?}"));
    assert!((400..512).contains(&room), "{line}");

    // Right after the start: the reload waits for the workers to run the first generation.
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    proxy.wait_for_log("reloaded: generation 2").await;
    let log = proxy.log();
    assert!(
        !log.iter().any(|l| l.contains("WARN")
            || l.contains("does not fit in")
            || l.contains("needs a restart")),
        "{log:#?}"
    );
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("limits.max_connections is "))
            .count(),
        1,
        "{log:#?}"
    );
    let mut conn = RawConn::open(proxy.addr).await;
    assert_eq!(request(&mut conn).await.status, 200);
}

/// With 1024 descriptors and 2,000 clients: the start-up log warns that the `max_connections`
/// the file sets does not fit; the clients pinlb accepted are served, a request that finds
/// no descriptor for its backend connection gets a 502 that says so, pinlb does not spin while
/// clients wait that it cannot accept, and once they are gone a new one is served.
#[tokio::test]
async fn out_of_descriptors_pinlb_serves_what_it_can_and_never_spins() {
    const CLIENTS: usize = 2_000;
    let own = pinlb::sys::limits::raise_nofile().unwrap();
    assert!(
        // The clients, the backend's side of pinlb's at most 1,024, and some to spare.
        own.soft.is_none_or(|s| s >= (CLIENTS + 1024 + 512) as u64),
        "this test holds {CLIENTS} connections and their backend side: raise the hard open file limit ({own:?})"
    );
    // Slow enough that two requests at once need two backend connections.
    let backend = Backend::start_with_delay("a", Duration::from_millis(300)).await;
    let mut setup = Setup::with(&[backend.addr]);
    // Held connections stay open while the test looks: no head timeout ends them. A value the
    // user sets is kept when it does not fit (the default would be lowered to fit).
    setup.extra = "[limits]\nheader_timeout = \"60s\"\nmax_connections = 10000\n".into();
    let mut proxy = BinProxy::spawn_with_ulimit(&setup.toml(), "-n 1024").await;
    let line = proxy.wait_for_log("open file limit ").await;
    assert!(line.contains("open file limit 1024: room for "), "{line}");
    proxy
        .wait_for_log("limits.max_connections = 10000 does not fit in the open file limit 1024")
        .await;

    // The first two connections, and one request through, so a backend connection is pooled.
    let mut first = RawConn::open(proxy.addr).await;
    let mut second = RawConn::open(proxy.addr).await;
    assert_eq!(request(&mut first).await.status, 200);

    // The kernel completes every handshake into the backlog (4096 by default); pinlb accepts
    // until its descriptors run out.
    let mut held = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let c = tokio::time::timeout(WAIT, TcpStream::connect(proxy.addr))
            .await
            .expect("connect within WAIT")
            .expect("connect");
        held.push(c);
    }
    proxy.wait_for_log("accept failed: ").await;

    // Two requests at once: one takes the pooled backend connection, the other needs a new
    // one and there is no descriptor for it.
    let (a, b) = tokio::join!(request(&mut first), request(&mut second));
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [200, 502], "{a:?}\n{b:?}");
    let failed = if a.status == 502 { &a } else { &b };
    let page = String::from_utf8_lossy(&failed.body);
    assert!(page.contains("pinlb is out of file descriptors"), "{page}");

    // Clients wait in the backlog; pinlb retries its accepts every 50 ms, not in a loop.
    let before = cpu_seconds(proxy.pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let spent = cpu_seconds(proxy.pid) - before;
    eprintln!("out of descriptors: {spent:.2} s of CPU in 2 s");
    assert!(
        spent < 0.3,
        "pinlb spent {spent:.2} s of CPU in 2 s out of descriptors"
    );
    // The accept errors are summed, not written 20 times a second.
    let accept_lines = proxy
        .log()
        .iter()
        .filter(|l| l.contains("accept failed: "))
        .count();
    eprintln!("{accept_lines} accept error lines");
    assert!(
        accept_lines <= 6,
        "{accept_lines} accept error lines in about 2 s"
    );

    drop(held);
    drop(first);
    drop(second);
    let mut late = RawConn::open(proxy.addr).await;
    assert_eq!(request(&mut late).await.status, 200);
}

/// The "GET answered 502" lines of `log`: how many were written at once, how many summary lines
/// there are, and what the summary lines count.
fn tally(log: &[String]) -> (u64, u64, u64) {
    let (mut firsts, mut summaries, mut summed) = (0, 0, 0);
    for l in log.iter().filter(|l| l.contains("GET answered 502")) {
        // `…: 12,345 more in the last 1 s`
        let count = l
            .rsplit_once(" more in the last ")
            .and_then(|(before, _)| before.rsplit_once(": "))
            .map(|(_, n)| n);
        match count {
            Some(n) => {
                summaries += 1;
                summed += n.replace(',', "").parse::<u64>().expect("a count");
            }
            None => firsts += 1,
        }
    }
    (firsts, summaries, summed)
}

/// 200 requests to a lone backend whose port is closed: a few "answered 502" lines, and the
/// summary lines' counts add up to 200 with them.
#[tokio::test]
async fn a_flood_of_failed_requests_is_summed_into_a_few_lines() {
    const REQUESTS: u64 = 200;
    let closed = Refusing::new();
    let mut proxy = BinProxy::spawn(&Setup::with(&[closed.addr])).await;
    let mut conn = RawConn::open(proxy.addr).await;
    for _ in 0..REQUESTS {
        assert_eq!(request(&mut conn).await.status, 502);
    }
    let first = proxy.wait_for_log("GET answered 502").await;
    // Written at once, with its field, as before.
    assert!(first.contains("upstream=app"), "{first}");
    assert!(!first.contains(" more in the last "), "{first}");
    // The last summary comes when the worker's second ends.
    let all_told = poll(50, Duration::from_millis(100), async || {
        let (firsts, _, summed) = tally(&proxy.log());
        (firsts + summed == REQUESTS).then_some(())
    })
    .await;
    let log = proxy.log();
    let (firsts, summaries, summed) = tally(&log);
    let answered: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("GET answered 502"))
        .collect();
    assert!(
        all_told.is_some(),
        "{firsts} written and {summed} summed, for {REQUESTS}:\n{answered:#?}"
    );
    eprintln!("{REQUESTS} failed requests: {answered:#?}");
    assert!(summaries >= 1, "{answered:#?}");
    assert!(
        firsts + summaries < 20,
        "{} lines for {REQUESTS} failed requests:\n{answered:#?}",
        firsts + summaries
    );
}
