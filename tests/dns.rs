//! Backends from DNS: a real DNS server on loopback (`common::dns`, UDP and TCP) whose records
//! the test changes while pinlb runs, real backends on 127.0.0.1 told apart by their ports
//! (SRV records give ports), and a request loop that must see no failure while the set moves.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::dns::DnsServer;
use common::*;
use http::{Method, StatusCode};

const SRV: &str = "_http._tcp.app.test.";

/// One upstream `app` whose backends are `backends` (TOML inline tables), looked up at
/// `dns` every 100 ms at most, and the admin listener.
fn config(dns: SocketAddr, backends: &str) -> String {
    format!(
        r#"[runtime]
cpus = [{core}]
shutdown_timeout = "3s"

[resolver]
nameservers = ["{dns}"]

[[listener]]
address = "127.0.0.1:0"
upstream = "app"

[upstream.app]
backends = [{backends}]

[upstream.app.resolve]
interval = "100ms"
min_interval = "50ms"

[admin]
address = "127.0.0.1:0"
"#,
        core = first_core()
    )
}

/// Requests one after another on a kept-alive connection (a new one after any failure) until
/// told to stop, at most 200 000 or 60 s: how many got a 200, and why each other failed.
struct Load {
    ok: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Load {
        let (ok, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let task = tokio::spawn({
            let (ok, stop) = (ok.clone(), stop.clone());
            async move {
                let mut why = Vec::new();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
                let mut conn = Conn::open(addr).await;
                for _ in 0..200_000 {
                    if stop.load(Ordering::Relaxed) || tokio::time::Instant::now() > deadline {
                        break;
                    }
                    let sent = tokio::time::timeout(
                        WAIT,
                        conn.try_send(request(Method::GET, "/", empty())),
                    )
                    .await;
                    match sent {
                        Ok(Ok(r)) if r.status() == StatusCode::OK => {
                            let _ = Reply::read(r).await;
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            why.push(format!("{other:?}"));
                            conn = Conn::open(addr).await;
                        }
                    }
                }
                why
            }
        });
        Load { ok, stop, task }
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let why = self.task.await.expect("the load task");
        (self.ok.load(Ordering::Relaxed), why)
    }
}

/// Waits (bounded) until `backend` has answered `n` more requests than it had.
async fn gets_more(backend: &Backend, n: usize) -> bool {
    let from = backend.hits();
    poll(200, Duration::from_millis(25), async || {
        (backend.hits() >= from + n).then_some(())
    })
    .await
    .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_that_change_under_load_move_requests_without_a_failure() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let dns = DnsServer::start();
    dns.set_srv(SRV, &[(a.addr.port(), 1), (b.addr.port(), 1)]);
    let proxy = Proxy::start_toml(&config(dns.addr, &format!("{{ srv = \"{SRV}\" }}")));
    // Resolved before the first request: both are backends from the start.
    let s = proxy.status().await;
    let names = &s["upstreams"][0]["names"][0];
    assert_eq!(names["name"], format!("srv {}", SRV.trim_end_matches('.')));
    assert_eq!(names["addresses"].as_array().unwrap().len(), 2, "{s}");

    let load = Load::start(proxy.addr);
    assert!(gets_more(&a, 5).await && gets_more(&b, 5).await);

    // a leaves, c joins.
    dns.set_srv(SRV, &[(b.addr.port(), 1), (c.addr.port(), 1)]);
    assert!(gets_more(&c, 5).await, "c never got a request");
    let a_after = a.hits();
    assert!(gets_more(&c, 50).await && gets_more(&b, 50).await);
    assert_eq!(a.hits(), a_after, "the removed backend got new requests");

    // Weights from the records: c gets three times b's share.
    dns.set_srv(SRV, &[(b.addr.port(), 1), (c.addr.port(), 3)]);
    let reweighted = poll(100, Duration::from_millis(50), async || {
        let s = proxy.status().await;
        let addrs = s["upstreams"][0]["names"][0]["addresses"].clone();
        addrs
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["weight"] == 3)
            .then_some(())
    })
    .await;
    assert!(reweighted.is_some(), "the new weight never showed");
    let (b0, c0) = (b.hits(), c.hits());
    assert!(gets_more(&c, 150).await);
    let (db, dc) = (b.hits() - b0, c.hits() - c0);
    assert!(dc >= 2 * db, "c {dc} against b {db}: weights 3 and 1");

    let (ok, why) = load.finish().await;
    assert!(why.is_empty(), "{} failed: {why:?}", why.len());
    assert!(ok > 200, "{ok}");

    let m = proxy.metrics().await;
    let name = format!("srv {}", SRV.trim_end_matches('.'));
    assert_eq!(
        m.value(
            "pinlb_dns_backend",
            &format!(
                "upstream=\"app\",name=\"{name}\",backend=\"{}\",weight=\"3\"",
                c.addr
            )
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "pinlb_dns_failures_total",
            &format!("upstream=\"app\",name=\"{name}\"")
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lookup_keeps_the_last_good_set_counts_and_warns_once() {
    let a = Backend::start("a").await;
    let mut dns = DnsServer::start();
    dns.set_a("app.test.", &[std::net::Ipv4Addr::LOCALHOST]);
    let name = format!("app.test:{}", a.addr.port());
    let mut proxy = BinProxy::spawn_toml(
        &config(dns.addr, &format!("{{ address = \"{name}\" }}")),
        &[],
    )
    .await;
    let admin = proxy.admin_addr().await;
    proxy
        .wait_for_log(&format!("{name} resolves to 127.0.0.1:{}", a.addr.port()))
        .await;
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");

    dns.stop();
    let metric = format!("upstream=\"app\",name=\"{name}\"");
    let failures = async || {
        let r = get(admin, "/metrics").await;
        Metrics(r.body).get("pinlb_dns_failures_total", &metric)
    };
    // A lookup of a server that went away fails on its timeout, a second or so each.
    let counted = poll(60, Duration::from_millis(250), async || {
        failures().await.filter(|&n| n >= 2.0)
    })
    .await;
    assert!(counted.is_some(), "failures never counted");
    // The last good set stays: requests still reach a.
    let load = Load::start(proxy.addr);
    assert!(gets_more(&a, 20).await);
    let (_, why) = load.finish().await;
    assert!(why.is_empty(), "{why:?}");
    let warned: Vec<String> = proxy
        .log()
        .into_iter()
        .filter(|l| l.contains("cannot resolve") && l.contains(&name))
        .collect();
    assert_eq!(
        warned.len(),
        1,
        "one warning, not one per lookup: {warned:?}"
    );
    assert!(
        warned[0].contains("keeping its last good set"),
        "{warned:?}"
    );
    let s: serde_json::Value = serde_json::from_str(&get(admin, "/status").await.body).unwrap();
    assert_eq!(s["upstreams"][0]["names"][0]["failing"], true, "{s}");
    assert_eq!(
        s["upstreams"][0]["backends"][0]["address"],
        a.addr.to_string()
    );
}

/// `pinlb check ARGS -c PATH`.
fn check(args: &[&str], path: &std::path::Path) -> std::process::Output {
    std::process::Command::new(bin())
        .arg("check")
        .args(args)
        .arg("-c")
        .arg(path)
        .output()
        .expect("run pinlb check")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_never_resolved_starts_with_no_backends_and_check_strict_fails_on_it() {
    let dns = DnsServer::start();
    let text = config(dns.addr, "{ address = \"missing.test:8080\" }");
    let proxy = Proxy::start_toml(&text);
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    let ready = proxy.admin(Method::GET, "/ready", None).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        ready.body.contains("upstream app: no backends"),
        "{}",
        ready.body
    );

    let path = temp_config(&text);
    let out = check(&[], &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("dns: upstream app: missing.test:8080 does not resolve"),
        "{stdout}"
    );
    let strict = check(&["--strict"], &path);
    assert!(!strict.status.success());
    assert!(
        String::from_utf8_lossy(&strict.stderr).contains(
            "--strict: backend names that do not resolve: upstream app: missing.test:8080"
        ),
        "{}",
        String::from_utf8_lossy(&strict.stderr)
    );

    // And one that resolves is printed with its addresses.
    dns.set_a("there.test.", &[std::net::Ipv4Addr::LOCALHOST]);
    let path = temp_config(&config(dns.addr, "{ address = \"there.test:8080\" }"));
    let out = check(&["--strict"], &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("dns: upstream app: there.test:8080 resolves to 127.0.0.1:8080 (weight 1)"),
        "{stdout}"
    );
}
