//! UDP listeners (`mode = "udp"`): `dig` through pinlb to two `dnsmasq` resolvers, balanced and
//! logged one line per session; a resolver that stops answering is skipped by the passive
//! checks; a session ends after `responses` answers, or idle; and the keys a UDP listener may
//! not have are refused.

use crate::common;

use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A `dnsmasq` on a free UDP port answering `example.test` with `answer`; killed on drop.
struct Resolver {
    addr: SocketAddr,
    child: Child,
}

impl Resolver {
    async fn start(answer: &str) -> Resolver {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new("dnsmasq")
            .args([
                "--no-daemon",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--user=root",
                "--pid-file=",
            ])
            .arg(format!("--port={}", addr.port()))
            .arg(format!("--address=/example.test/{answer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run dnsmasq (apt-get install dnsmasq-base)");
        let resolver = Resolver { addr, child };
        let port = addr.port();
        poll(100, Duration::from_millis(50), async || {
            (dig(port).await.as_deref() == Some(answer)).then_some(())
        })
        .await
        .expect("dnsmasq answers");
        resolver
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free for UDP and TCP both: dnsmasq listens on both, and fails if either is taken.
fn free_port() -> u16 {
    // Bounded: a port free for one is almost always free for the other.
    for _ in 0..100 {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both UDP and TCP");
}

/// `dig +short example.test` at 127.0.0.1:`port`, one try of one second: its answer, `None`
/// when none came.
async fn dig(port: u16) -> Option<String> {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("dig")
            .args(["+short", "+tries=1", "+time=1", "-p"])
            .arg(port.to_string())
            .args(["@127.0.0.1", "example.test"])
            .output()
            .expect("run dig (apt-get install dnsutils)")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty() && !text.contains("timed out")).then_some(text)
}

/// A UDP listener with `keys` over an upstream of `backends` with `upstream_keys`.
fn udp_config(backends: &[SocketAddr], keys: &str, upstream_keys: &str) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address = \"{b}\" }}"))
        .collect();
    format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"udp\"\nupstream = \"dns\"\n{keys}\n\
         [upstream.dns]\nbackends = [{}]\n{upstream_keys}\n",
        list.join(", ")
    )
}

#[tokio::test]
async fn dig_answers_through_a_udp_listener_balanced_over_two_resolvers() {
    let a = Resolver::start("10.9.9.1").await;
    let b = Resolver::start("10.9.9.2").await;
    let (path, log) = log_table("combined");
    let toml = udp_config(&[a.addr, b.addr], "responses = 1", "") + &log;
    let proxy = Proxy::start_toml(&toml);
    let port = proxy.addr.port();
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(dig(port).await.expect("an answer through pinlb"));
    }
    // Round robin in each worker (the kernel spreads client ports over the workers' sockets):
    // six queries over two workers at most, so one has had two and both resolvers answered.
    for ip in ["10.9.9.1", "10.9.9.2"] {
        assert!(
            answers.iter().any(|a| a == ip),
            "{ip} never answered: {answers:?}"
        );
    }
    assert!(
        answers.iter().all(|a| a == "10.9.9.1" || a == "10.9.9.2"),
        "{answers:?}"
    );
    let lines = lines_after(proxy, &path).await;
    assert_eq!(lines.len(), 6, "{lines:?}");
    for line in &lines {
        assert!(
            line.contains(&format!("\"UDP 127.0.0.1:{port}\" 200 ")),
            "{line}"
        );
        assert!(line.ends_with(" end=answered"), "{line}");
    }
}

#[tokio::test]
async fn a_resolver_that_stops_is_skipped_and_its_sessions_counted_failed() {
    let a = Resolver::start("10.9.9.1").await;
    let b = Resolver::start("10.9.9.2").await;
    // A session unanswered for 300 ms ends, and counts as a failure: the kernel sends at most
    // one ICMP port unreachable per second to a host, so a refusal may not come.
    let toml = udp_config(
        &[a.addr, b.addr],
        "responses = 1\nsession_idle = \"300ms\"",
        "",
    );
    let proxy = Proxy::start_toml(&toml);
    let port = proxy.addr.port();
    drop(b);
    // Queries to the stopped one get nothing (dig's one try of each), until its failure takes
    // it out for `fail_timeout`: a few at most, one per worker.
    let mut answers = Vec::new();
    let mut in_a_row = 0;
    for _ in 0..12 {
        let got = dig(port).await;
        in_a_row = if got.is_some() { in_a_row + 1 } else { 0 };
        answers.push(got);
        if in_a_row == 4 {
            break;
        }
    }
    assert_eq!(
        in_a_row, 4,
        "the stopped resolver was never skipped: {answers:?}"
    );
    assert!(
        answers.iter().flatten().all(|a| a == "10.9.9.1"),
        "{answers:?}"
    );
}

#[tokio::test]
async fn a_session_without_responses_lasts_until_idle_and_carries_every_answer() {
    // A backend that answers each datagram twice.
    let backend = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 512];
        // Bounded by the test: the runtime ends with it.
        loop {
            let Ok((n, from)) = backend.recv_from(&mut buf).await else {
                return;
            };
            for _ in 0..2 {
                let _ = backend.send_to(&buf[..n], from).await;
            }
        }
    });
    let (path, log) = log_table("combined");
    let toml = udp_config(&[backend_addr], "session_idle = \"300ms\"", "") + &log;
    let proxy = Proxy::start_toml(&toml);
    let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(proxy.addr).await.unwrap();
    let mut buf = [0u8; 512];
    for msg in [&b"one"[..], b"two"] {
        client.send(msg).await.unwrap();
        for _ in 0..2 {
            let n = tokio::time::timeout(WAIT, client.recv(&mut buf))
                .await
                .expect("an answer in time")
                .unwrap();
            assert_eq!(&buf[..n], msg);
        }
    }
    // One session for both datagrams, ended by its idle time.
    let lines = poll(100, Duration::from_millis(50), async || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        text.contains("end=idle").then_some(text)
    })
    .await
    .expect("the session ends within session_idle");
    let line = lines.lines().next().unwrap().to_string();
    // 12 bytes to the client (four answers of 3), 6 from it, after the duration.
    assert!(line.contains("\" 200 12 \"-\" \"-\" "), "{line}");
    assert!(line.ends_with(" 6 end=idle"), "{line}");
    drop(proxy);
}

#[test]
fn a_udp_listeners_keys_are_checked() {
    let parse = |toml: &str| {
        pinlb::Config::parse("test.toml", toml, &allowed())
            .unwrap_err()
            .to_string()
    };
    let one = "127.0.0.1:1".parse().unwrap();
    let e = parse(&udp_config(&[one], "backlog = 10", ""));
    assert!(
        e.contains("test.toml:5:")
            && e.contains("listener[0].backlog")
            && e.contains("not for a UDP listener"),
        "{e}"
    );
    let e = parse(&udp_config(&[one], "responses = 0", ""));
    assert!(
        e.contains("listener[0].responses") && e.contains("out of range"),
        "{e}"
    );
    let e = parse(&udp_config(
        &[one],
        "",
        "[upstream.dns.health]\ninterval = \"5s\"\n",
    ));
    assert!(
        e.contains("upstream.dns.health") && e.contains("checked by their answers"),
        "{e}"
    );
    let http = "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"a\"\nresponses = 1\n\
                [upstream.a]\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    let e = parse(http);
    assert!(
        e.contains("test.toml:4:")
            && e.contains("listener[0].responses")
            && e.contains("only for a UDP listener"),
        "{e}"
    );
}
