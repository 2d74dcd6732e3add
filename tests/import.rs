//! `pinlb import` proved by behaviour, not by its text: each nginx fixture that proxies
//! (tests/fixtures/nginx) runs in nginx itself and, imported, in pinlb; the same requests go to
//! both, and each must get the same answer: the same status, the same Location, the same pool
//! of backends, the same path and query at the backend, and the same values for the headers the
//! configuration sets, Host included.
//!
//! Each fixture is rewritten for the run, the same way for both: every `127.0.0.1:PORT` that a
//! `listen` does not name becomes a recording backend ([`Backend`], its id the address the
//! fixture wrote), except `127.0.0.1:79xx`, which become refusing ports (a dead server);
//! `listen` addresses become free loopback ports (one set for nginx, another for pinlb, so both
//! run at once); `user`, `pid`, `error_log` and `access_log` are dropped (nginx gets its own in
//! a temporary directory). nginx runs as a child process (`master_process off`, one process, so
//! killing it leaves nothing behind), pinlb as `pinlb serve` on `pinlb import`'s output.
//!
//! **Balancing within a pool differs legitimately** (round robin's starting point, ip_hash's
//! three octets against pinlb's whole address, nginx's hash against pinlb's rendezvous), so a
//! request is compared by the pool it reached (the `upstream` block, or the one address of a
//! `proxy_pass http://ADDR`), and the backend must be one of that pool's primary servers (never
//! a `backup` while the others are up, never a `down` one). A request to a hashing pool is sent
//! twice more to each, and must reach the backend it reached first.

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::nginx::Nginx;
use common::*;

/// Headers that differ by design, left out of the comparison, with why:
/// - `connection`, `upgrade`: hop-by-hop. nginx sends `Connection: close` (HTTP/1.0 upstream)
///   unless told otherwise, and the `Upgrade`/`Connection` pair a WebSocket location sets;
///   pinlb speaks HTTP/1.1 with keep-alive to backends and passes upgrades on its own
///   (docs/behaviour.md), so there is nothing for the import to reproduce.
///
/// Two more are compared, with a rule:
/// - `host`: where no `proxy_set_header Host` applies, nginx sends `$proxy_host` (the upstream's
///   name, or the address of a `proxy_pass http://ADDR`); pinlb always sends the client's Host
///   and has no setting for another (the import notes it at the `proxy_pass`). A request whose
///   nginx Host is its `$proxy_host` is not compared on Host; every other is. The requests send
///   Host without a port, since `$host` drops it and pinlb passes it as sent.
/// - `x-forwarded-for`, `x-forwarded-proto`: pinlb always sends them (docs/behaviour.md) and has
///   no setting to send none, while nginx sends them only where `proxy_set_header` says so; a
///   request nginx sent none of them is not compared on them, every other is. The requests send
///   no X-Forwarded-For of their own, since nginx's `$proxy_add_x_forwarded_for` appends to a
///   client's and pinlb keeps a client's only from a `[forwarded] trusted` one.
const BY_DESIGN: [&str; 2] = ["connection", "upgrade"];
/// Headers pinlb always sends: compared only where nginx sent one too.
const ALWAYS_SENT: [&str; 2] = ["x-forwarded-for", "x-forwarded-proto"];

/// One request, sent the same way to both.
#[derive(Clone)]
struct Req {
    method: &'static str,
    host: &'static str,
    target: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: usize,
}

fn get(host: &'static str, target: &'static str) -> Req {
    Req {
        method: "GET",
        host,
        target,
        headers: Vec::new(),
        body: 0,
    }
}

impl Req {
    fn header(mut self, name: &'static str, value: &'static str) -> Req {
        self.headers.push((name, value));
        self
    }

    fn post(mut self, body: usize) -> Req {
        self.method = "POST";
        self.body = body;
        self
    }
}

/// The requests each fixture gets. A fixture that proxies and is missing here fails the test.
fn requests(fixture: &str) -> Vec<Req> {
    let h = "www.example.test";
    match fixture {
        "app-routes.conf" => vec![
            get(h, "/api/users?page=2"),
            get("example.test", "/api/"),
            get(h, "/ws/chat"),
            get(h, "/"),
            get(h, "/shop/item?id=7"),
            get(h, "/old"),
            get(h, "/old?x=1"),
            get("admin.example.test", "/"),
            get("admin.example.test", "/api/users"),
            // Not a name of either server: the default one (the first on the address).
            get("other.example.test", "/api/v"),
        ],
        // /static/ is a 404 route where nginx finds no file; /static (no slash) is not under
        // it, in nginx as in pinlb: the application's.
        "node-app.conf" => vec![
            get("example.com", "/"),
            get("www.example.com", "/api/users?page=2"),
            get("example.com", "/static/app.css"),
            get("example.com", "/static/"),
            get("example.com", "/static"),
            get("example.com", "/socket.io/?EIO=4&transport=polling"),
        ],
        "node-pool.conf" => vec![
            get("127.0.0.1", "/"),
            get("127.0.0.1", "/a/b?c=d"),
            get("other.test", "/x"),
        ],
        "tuned-least-conn.conf" => vec![get(h, "/"), get(h, "/x/y?z=1"), get(h, "/x/y?z=2")],
        "upstream-servers.conf" => vec![get(h, "/"), get(h, "/a"), get(h, "/b"), get(h, "/c")],
        "least-conn.conf" => vec![get(h, "/"), get(h, "/a?b=c")],
        "access.conf" => {
            let (ann, cat) = ("Basic YW5uOnNlY3JldA==", "Basic Y2F0OnNlY3JldA==");
            let wrong = "Basic YW5uOndyb25n";
            vec![
                get(h, "/"),
                get(h, "/").header("Authorization", ann),
                get(h, "/x").header("Authorization", cat),
                get(h, "/").header("Authorization", wrong),
                get(h, "/public/x"),
                get(h, "/blocked/x").header("Authorization", ann),
                get(h, "/either/x"),
                get(h, "/either/x").header("Authorization", cat),
            ]
        }
        "ip-hash.conf" => vec![get(h, "/"), get(h, "/again")],
        "hash-key.conf" => vec![
            get(h, "/static/app.css"),
            get(h, "/static/app.js?v=3"),
            get(h, "/").header("X-User", "alice"),
            get(h, "/me").header("X-User", "bob"),
        ],
        "random-two.conf" => vec![get(h, "/"), get(h, "/x"), get(h, "/y")],
        "server-names.conf" => vec![
            get("unknown.test", "/"),
            get("shop.example.test", "/"),
            get("www.shop.example.test", "/cart?item=3"),
            get("SHOP.Example.TEST", "/case"),
            get("blog.example.test", "/"),
            get("x.blog.example.test", "/post/1"),
            get("a.api.example.test", "/v1/users"),
            get("a.api.example.test", "/v2/users"),
            get("api.example.test", "/v1/users"),
        ],
        "locations.conf" => vec![
            get(h, "/api/health"),
            get(h, "/api/health/deep"),
            get(h, "/api/users"),
            get(h, "/api/admin/x"),
            // A proxying prefix location's path without its slash: 301 to it.
            get(h, "/api/admin"),
            get(h, "/api/admin?x=1"),
            get(h, "/api"),
            get(h, "/assets"),
            get(h, "/API/health"),
            get(h, "/api/./health"),
            get(h, "/assets/logo.png"),
            get(h, "/nothing"),
            get(h, "/"),
        ],
        "proxy-pass.conf" => vec![
            get(h, "/plain/a?x=1"),
            get(h, "/old-api/users?id=2"),
            get(h, "/old-api/"),
            get(h, "/strip/x/y"),
            get(h, "/direct"),
            get(h, "/directory/z"),
            // Normalised before the prefix is replaced, the query kept as sent.
            get(h, "/old-api/a/../b//c?q=a%20b"),
            get(h, "/old-api/%7Euser"),
            // Passed as sent without a URI part.
            get(h, "/plain/a%20b?x=%2F"),
        ],
        "set-header.conf" => vec![
            get(h, "/inherits/a"),
            get(h, "/own/b?c=d").header("Accept-Encoding", "gzip"),
            get(h, "/default-host/c"),
        ],
        "timeouts-retry.conf" => vec![get(h, "/"), get(h, "/a"), get(h, "/b"), get(h, "/c")],
        // Not /m: nginx answers 404 to an outside request for its internal location, pinlb
        // (whose mirror has no location) sends it to the route for /.
        "mirror-retry.conf" => vec![get(h, "/"), get(h, "/a?b=1"), get(h, "/c/d")],
        "return.conf" => vec![
            get("old.example.test", "/a/b?c=1"),
            get(h, "/moved"),
            get(h, "/moved?x=1"),
            get("old.example.test", "/"),
            get("noport.example.test", "/go"),
            get("relative.example.test", "/x?y=1"),
            get(h, "/away"),
            get(h, "/private/x"),
            get(h, "/ping"),
            get(h, "/other?y=2"),
        ],
        // /legacy/ is left out: its rewrite (the suffix after a prefix) is noted, not converted.
        "rewrite.conf" => vec![
            get("secure.example.test", "/a?b=1"),
            get("secure.example.test", "/"),
            get(h, "/old"),
            get(h, "/old?x=1"),
            // nginx appends the query, and only when there is one.
            get(h, "/keep"),
            get(h, "/keep?x=1&y=2"),
            // nginx matches the decoded path, pinlb the normalised one: both are /old.
            get(h, "/ol%64"),
            get(h, "/old/"),
            get(h, "/docs/guide"),
            get(h, "/moved/page?q=1"),
            get(h, "/moved/"),
            get(h, "/other?z=1"),
        ],
        "workers-limits.conf" => vec![
            get(h, "/"),
            get(h, "/upload").post(100),
            get(h, "/upload").post(4096),
        ],
        // The file-only server's requests: nginx finds no file (its root does not exist), 404.
        "partly-files.conf" => vec![
            get(h, "/"),
            get(h, "/files/a"),
            get("static.example.test", "/"),
            get("static.example.test", "/index.html"),
        ],
        _ => Vec::new(),
    }
}

/// What one request got, as compared.
#[derive(Debug, PartialEq)]
struct Outcome {
    status: u16,
    /// With the proxy's own listening port written `:LISTEN`.
    location: Option<String>,
    /// The pool the request reached: an upstream's name, or a `proxy_pass` address.
    pool: Option<String>,
    /// Path and query as the backend received them.
    target: Option<String>,
    /// The headers the configuration sets, and Host, as the backend received them.
    headers: BTreeMap<String, Option<String>>,
    /// The body of an answer of the proxy's own (2xx, no backend); error pages differ in text.
    body: Option<String>,
}

/// A fixture's pools as nginx reads them: each `upstream`'s servers (primary or not) and the
/// plain addresses `proxy_pass` names.
struct Pools {
    /// Address as written → (pool, primary).
    of: BTreeMap<String, (String, bool)>,
    /// The pools that hash (`ip_hash`, `hash KEY`): each key keeps one backend.
    hashing: Vec<String>,
}

impl Pools {
    fn read(text: &str) -> Pools {
        let text: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        let mut of = BTreeMap::new();
        let mut hashing = Vec::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("upstream ") {
            let after = &rest[i + "upstream ".len()..];
            // The directive, not the end of proxy_next_upstream.
            if i > 0 && !rest[..i].ends_with(char::is_whitespace) {
                rest = after;
                continue;
            }
            let open = after.find('{').expect("upstream block");
            let close = after.find('}').expect("upstream block end");
            let name = after[..open].trim().to_string();
            for stmt in after[open + 1..close].split(';') {
                let words: Vec<&str> = stmt.split_whitespace().collect();
                if matches!(words.first(), Some(&"ip_hash" | &"hash")) {
                    hashing.push(name.clone());
                }
                if words.first() == Some(&"server") {
                    let primary = !words.iter().any(|w| *w == "backup" || *w == "down");
                    of.insert(words[1].to_string(), (name.clone(), primary));
                }
            }
            rest = &after[close..];
        }
        for line in text.lines() {
            if let Some(target) = line.trim().strip_prefix("proxy_pass http://") {
                let addr = target.trim_end_matches(';').split('/').next().unwrap();
                if addr.starts_with("127.0.0.1:") {
                    of.insert(addr.to_string(), (addr.to_string(), true));
                }
            }
        }
        Pools { of, hashing }
    }
}

/// A fixture rewritten for one proxy: the text, and each `listen` address → the port it got.
fn rewrite(text: &str, backends: &BTreeMap<String, SocketAddr>) -> (String, Vec<SocketAddr>) {
    let mut listens: BTreeMap<String, SocketAddr> = BTreeMap::new();
    let mut out = String::new();
    for line in text.lines() {
        let code = line.split('#').next().unwrap_or_default();
        let first = code.split_whitespace().next().unwrap_or_default();
        if ["user", "pid", "error_log", "access_log"].contains(&first) {
            continue;
        }
        let mut line = line.to_string();
        if first == "listen" {
            let written = code
                .split_whitespace()
                .nth(1)
                .unwrap()
                .trim_end_matches(';');
            let addr = *listens.entry(written.to_string()).or_insert_with(free_port);
            line = line.replacen(written, &addr.to_string(), 1);
        } else {
            for (from, to) in backends {
                line = line.replace(from.as_str(), &to.to_string());
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    (out, listens.into_values().collect())
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Every `127.0.0.1:PORT` a fixture names outside `listen` lines.
fn backend_addresses(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split('#').next().unwrap_or_default();
        if code.split_whitespace().next() == Some("listen") {
            continue;
        }
        let mut rest = code;
        while let Some(i) = rest.find("127.0.0.1:") {
            let tail = &rest[i + "127.0.0.1:".len()..];
            let end = tail
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(tail.len());
            let addr = format!("127.0.0.1:{}", &tail[..end]);
            if !found.contains(&addr) {
                found.push(addr);
            }
            rest = &tail[end..];
        }
    }
    found
}

/// Waits until every address accepts connections; panics with `why()` if one never does.
async fn await_listening(addrs: &[SocketAddr], why: impl Fn() -> String) {
    for &a in addrs {
        let up = poll(400, Duration::from_millis(25), async || {
            tokio::net::TcpStream::connect(a).await.ok().map(|_| ())
        })
        .await;
        if up.is_none() {
            panic!("nothing listens on {a}:\n{}", why());
        }
    }
}

struct Run<'a> {
    listens: Vec<SocketAddr>,
    backends: &'a [(String, Backend)],
    pools: &'a Pools,
    /// Rewritten backend address → the address the fixture wrote.
    written: BTreeMap<String, String>,
    compared: Vec<String>,
}

impl Run<'_> {
    /// Sends `req` (tagged `tag`, so the backend's record of it can be found) to the listener
    /// nginx or pinlb has for the fixture's first `listen`.
    async fn send(&self, req: &Req, tag: &str) -> Outcome {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nX-Import-Seq: {tag}\r\nConnection: close\r\n",
            req.method, req.target, req.host
        );
        for (k, v) in &req.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if req.method == "POST" {
            head.push_str(&format!("Content-Length: {}\r\n", req.body));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend(std::iter::repeat_n(b'x', req.body));
        let resp = raw_request(self.listens[0], &bytes, false).await;
        let mut location = resp.header("location").map(str::to_string);
        for l in &self.listens {
            location = location.map(|s| s.replace(&format!(":{}", l.port()), ":LISTEN"));
        }
        let seen = self.recorded(tag);
        let (pool, target, headers) = match &seen {
            None => (None, None, BTreeMap::new()),
            Some((written, r)) => {
                let pool = match self.pools.of.get(written) {
                    Some((name, true)) => name.clone(),
                    Some((name, false)) => format!("{name} (its backup or down {written})"),
                    None => format!("no pool has {written}"),
                };
                let headers = self
                    .compared
                    .iter()
                    .map(|name| {
                        let value = r.headers.get(name.as_str()).map(|v| {
                            let v = String::from_utf8_lossy(v.as_bytes()).to_string();
                            self.written.get(&v).cloned().unwrap_or(v)
                        });
                        (name.clone(), value)
                    })
                    .collect();
                (Some(pool), Some(r.uri.clone()), headers)
            }
        };
        let body = (seen.is_none() && (200..300).contains(&resp.status))
            .then(|| String::from_utf8_lossy(&resp.body).to_string());
        Outcome {
            status: resp.status,
            location,
            pool,
            target,
            headers,
            body,
        }
    }
}

/// The import of `fixture` and nginx on it answer `requests(fixture)` alike; returns the number
/// of requests compared.
async fn compare(fixture: &Path) -> usize {
    let name = fixture.file_name().unwrap().to_string_lossy().to_string();
    let text = std::fs::read_to_string(fixture).unwrap();
    let reqs = requests(&name);
    assert!(
        !reqs.is_empty(),
        "{name} proxies but has no requests in tests/import.rs's requests()"
    );
    let pools = Pools::read(&text);
    let mut backends = Vec::new();
    let mut refusing = Vec::new();
    let mut map = BTreeMap::new();
    for written in backend_addresses(&text) {
        let addr = if written.starts_with("127.0.0.1:79") {
            let r = Refusing::new();
            let a = r.addr;
            refusing.push(r);
            a
        } else {
            let b = Backend::start(&written).await;
            let a = b.addr;
            backends.push((written.clone(), b));
            a
        };
        map.insert(written, addr);
    }
    let mut compared: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("proxy_set_header "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_ascii_lowercase)
        .chain(["host".to_string()])
        .filter(|h| !BY_DESIGN.contains(&h.as_str()))
        .collect();
    compared.sort();
    compared.dedup();

    let dir = tempfile::Builder::new()
        .prefix("pinlb-import-")
        .tempdir()
        .unwrap();
    // A user file named relative: beside each one's main file (nginx's prefix, and the
    // import's source, which the import resolves it against).
    for line in text.lines() {
        if let Some(f) = line.trim().strip_prefix("auth_basic_user_file ") {
            let f = f.trim_end_matches(';');
            let from = fixture.with_file_name(f);
            for to in [dir.path().join("nginx"), dir.path().to_path_buf()] {
                std::fs::create_dir_all(&to).unwrap();
                std::fs::copy(&from, to.join(f)).unwrap();
            }
        }
    }

    // nginx on the fixture.
    let (nginx_text, nginx_listens) = rewrite(&text, &map);
    let nginx = Nginx::start(&dir.path().join("nginx"), &nginx_text);
    await_listening(&nginx_listens, || nginx.log()).await;

    // pinlb on the import of the same fixture (its own ports).
    let (pinlb_text, pinlb_listens) = rewrite(&text, &map);
    let source = dir.path().join(&name);
    std::fs::write(&source, &pinlb_text).unwrap();
    let out = Command::new(bin())
        .arg("import")
        .arg(&source)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{name}: import failed: {notes}");
    let toml = String::from_utf8(out.stdout).unwrap();
    // Cores are not behaviour: pinlb runs on the cores this test may use, whatever the
    // fixture's worker_processes asked for.
    let toml = pin_to_test_cores(&toml);
    let pinlb = BinProxy::spawn_toml(&toml, &[]).await;
    // A listener whose servers only serve files is left out of the import (and noted).
    let kept: Vec<SocketAddr> = pinlb_listens
        .iter()
        .copied()
        .filter(|a| toml.contains(&format!("\"{a}\"")))
        .collect();
    await_listening(&kept, || pinlb.log().join("\n")).await;

    let run = |listens: Vec<SocketAddr>| Run {
        listens,
        backends: &backends,
        pools: &pools,
        written: Run::written_of(&map),
        compared: compared.clone(),
    };
    let (on_nginx, on_pinlb) = (run(nginx_listens), run(pinlb_listens));
    let mut differences = Vec::new();
    for (i, req) in reqs.iter().enumerate() {
        let n = on_nginx.send(req, &format!("nginx-{i}")).await;
        let mut p = on_pinlb.send(req, &format!("pinlb-{i}")).await;
        let mut n = n;
        // nginx's default Host ($proxy_host): by design, see BY_DESIGN.
        if let (Some(pool), Some(Some(host))) = (&n.pool, n.headers.get("host")) {
            if host == pool {
                n.headers.remove("host");
                p.headers.remove("host");
            }
        }
        for h in ALWAYS_SENT {
            if n.headers.get(h) == Some(&None) {
                n.headers.remove(h);
                p.headers.remove(h);
            }
        }
        if n != p {
            differences.push(format!(
                "{name}: {} {} (Host {}):\n  nginx: {n:?}\n  pinlb: {p:?}",
                req.method, req.target, req.host
            ));
        }
        // A hashing pool must keep each key on one backend, in both.
        for (run, tag) in [
            (&on_nginx, format!("nginx-{i}")),
            (&on_pinlb, format!("pinlb-{i}")),
        ] {
            if let Err(e) = run.sticks(req, &tag).await {
                differences.push(format!(
                    "{name}: {} {}: not sticky: {e}",
                    req.method, req.target
                ));
            }
        }
    }
    drop(nginx);
    drop(pinlb);
    assert!(
        differences.is_empty(),
        "{} of {} requests differ:\n{}\nimport notes:\n{notes}\nimported:\n{toml}",
        differences.len(),
        reqs.len(),
        differences.join("\n")
    );
    reqs.len()
}

impl Run<'_> {
    /// The backend (as the fixture wrote its address) that received the request tagged `tag`,
    /// and what it received.
    fn recorded(&self, tag: &str) -> Option<(String, Recorded)> {
        self.backends.iter().find_map(|(written, b)| {
            b.requests()
                .into_iter()
                .rfind(|r| {
                    r.headers
                        .get("x-import-seq")
                        .is_some_and(|v| v.as_bytes() == tag.as_bytes())
                })
                .map(|r| (written.clone(), r))
        })
    }

    /// Whether `req`, sent again, reaches the backend its first sending (`tag`) reached: what
    /// a hashing pool promises, on nginx and on pinlb alike, though not the same backend.
    async fn sticks(&self, req: &Req, tag: &str) -> Result<(), String> {
        let Some((first, _)) = self.recorded(tag) else {
            return Ok(());
        };
        let hashing = self
            .pools
            .of
            .get(&first)
            .is_some_and(|(pool, _)| self.pools.hashing.contains(pool));
        if !hashing {
            return Ok(());
        }
        for k in 0..2 {
            let again = format!("{tag}-again-{k}");
            self.send(req, &again).await;
            let then = self.recorded(&again).map(|(w, _)| w);
            if then.as_deref() != Some(first.as_str()) {
                return Err(format!("{tag} went to {first}, then to {then:?}"));
            }
        }
        Ok(())
    }

    fn written_of(map: &BTreeMap<String, SocketAddr>) -> BTreeMap<String, String> {
        map.iter()
            .map(|(w, a)| (a.to_string(), w.clone()))
            .collect()
    }
}

fn pin_to_test_cores(toml: &str) -> String {
    let core = first_core();
    toml.lines()
        .map(|l| match l.starts_with("cpus = ") {
            true => format!("cpus = [{core}]"),
            false => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nginx");
    let mut list: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the nginx fixtures are at {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "conf"))
        .collect();
    list.sort();
    list
}

/// Every fixture that proxies behaves in pinlb, imported, as in nginx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imported_fixtures_answer_as_nginx_does() {
    Nginx::binary();
    let mut table = Vec::new();
    for f in fixtures() {
        let text = std::fs::read_to_string(&f).unwrap();
        if !text.contains("proxy_pass") {
            continue;
        }
        let n = compare(&f).await;
        table.push(format!(
            "{}: {n} requests, all equal",
            f.file_name().unwrap().to_string_lossy()
        ));
    }
    assert!(table.len() >= 14, "only {} fixtures proxy", table.len());
    println!("{}", table.join("\n"));
}

/// A configuration that only serves files (CentOS's and Debian's stock ones) is refused: the
/// notes, then one line saying why, and exit status 1, since pinlb serves no files.
#[test]
fn file_only_configs_are_refused_with_one_line() {
    for name in ["centos-default.conf", "debian-default.conf"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/nginx")
            .join(name);
        let out = Command::new(bin())
            .arg("import")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}: printed a configuration");
        let last = stderr.lines().last().unwrap_or_default();
        assert_eq!(
            last,
            "pinlb import: nothing to proxy: its servers only serve files; pinlb serves no files",
            "{name}"
        );
        assert!(
            stderr.contains("location / not converted: it serves files from "),
            "{name}: {stderr}"
        );
    }
}

/// The notes `pinlb import` prints for a fixture (exit 0), one a line.
fn fixture_notes(name: &str) -> (String, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nginx")
        .join(name);
    let out = Command::new(bin())
        .arg("import")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{name}: {stderr}");
    let notes = stderr.lines().map(str::to_string).collect();
    (String::from_utf8(out.stdout).unwrap(), notes)
}

/// The tutorial Node.js configuration (node-app.conf): its `location /static/`, which serves
/// files, becomes a route that answers 404 before `/`'s (nginx answers from disk, never from
/// the application), and its note says so and where the requests would go without it: route /
/// to upstream node, under its rate limit zone and compression. (nginx beside pinlb answers
/// /static/app.css alike: `imported_fixtures_answer_as_nginx_does`.)
#[test]
fn a_location_that_serves_files_answers_404_and_its_note_says_where_requests_would_go() {
    let (toml, notes) = fixture_notes("node-app.conf");
    let static_note = notes
        .iter()
        .find(|n| n.contains("location /static/ not converted"))
        .unwrap_or_else(|| panic!("no note on /static/:\n{}", notes.join("\n")));
    assert!(
        static_note.ends_with(
            "node-app.conf:55: location /static/ not converted: it serves files from /var/www/node-app (with expires), and pinlb serves no files: pinlb answers its requests 404 (route /static/ → respond 404). If the backend serves these paths, delete that route: they then go to route / → upstream node (rate_limit zone api, compress gzip)"
        ),
        "{static_note}"
    );
    let config: toml::Table = toml::from_str(&toml).unwrap();
    let routes = config["listener"][0]["route"].as_array().unwrap();
    assert_eq!(routes[0]["path"].as_str(), Some("/static/"), "{toml}");
    assert_eq!(routes[0]["respond"]["status"].as_integer(), Some(404));
    assert_eq!(routes[1]["path"].as_str(), Some("/"), "{toml}");
    assert_eq!(routes[1]["upstream"].as_str(), Some("node"), "{toml}");
}

/// A location whose content does not convert (`grpc_pass`) is no route, and its note names the
/// route that takes its requests instead; a location that serves files keeps its own access
/// rules on its 404 route (nginx checks them before it looks for a file), without the note
/// about answers given before the access phase.
#[test]
fn a_dropped_location_s_note_names_the_route_that_takes_its_requests() {
    let imported = import_text(
        "http {
    server {
        listen 8080;
        location / { proxy_pass http://127.0.0.1:8081; }
        location /rpc/ { grpc_pass grpc://127.0.0.1:9000; }
        location /files/ {
            allow 10.0.0.0/8;
            deny all;
            alias /srv/files/;
        }
    }
}
",
        &[],
    );
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let at = |line: usize| format!("{}:{line}: ", imported.path.display());
    assert!(
        imported.stderr.contains(&format!(
            "{}location not converted: what answers its requests (grpc_pass) did not convert; its requests go to route / → upstream 127.0.0.1:8081",
            at(5)
        )),
        "{}",
        imported.stderr
    );
    assert!(
        imported.stderr.contains(&format!(
            "{}location /files/ not converted: it serves files from alias /srv/files/, and pinlb serves no files: pinlb answers its requests 404 (route /files/ → respond 404 (its access rules))",
            at(6)
        )),
        "{}",
        imported.stderr
    );
    assert!(
        !imported.stderr.contains("before its access phase"),
        "{}",
        imported.stderr
    );
    let toml: toml::Table = toml::from_str(&imported.stdout).unwrap();
    let routes = toml["listener"][0]["route"].as_array().unwrap();
    let files = routes
        .iter()
        .find(|r| r.get("path").and_then(|p| p.as_str()) == Some("/files/"))
        .unwrap_or_else(|| panic!("no /files/ route:\n{}", imported.stdout));
    assert_eq!(
        files["access"],
        toml::Value::Array(vec!["allow 10.0.0.0/8".into(), "deny all".into()])
    );
    assert!(
        routes
            .iter()
            .all(|r| r.get("path").and_then(|p| p.as_str()) != Some("/rpc/")),
        "{}",
        imported.stdout
    );
}

/// What pinlb already does is not noted: `proxy_http_version 1.1` (pinlb speaks HTTP/1.1 to
/// every backend), the WebSocket `Upgrade`/`Connection` lines, `X-Forwarded-Proto $scheme`,
/// `proxy_cache_bypass` without a cache, `tcp_nodelay on`, and the file-sending and table-size
/// tuning; the notes come in file order, and the worker note reads in the singular.
#[test]
fn an_import_notes_only_what_differs_in_file_order() {
    let (_, notes) = fixture_notes("node-app.conf");
    let all = notes.join("\n");
    for quiet in [
        "proxy_http_version",
        "Upgrade",
        "Connection",
        "X-Forwarded-Proto",
        "proxy_cache_bypass",
        "tcp_nodelay",
        "sendfile",
        "tcp_nopush",
        "types_hash_max_size",
        "server_tokens",
        "root not converted",
    ] {
        assert!(!all.contains(quiet), "{quiet} noted:\n{all}");
    }
    assert!(
        all.contains("worker_processes 1 without worker_cpu_affinity: pinlb pins its worker to core 0 (nginx left it unpinned)"),
        "{all}"
    );
    let lines: Vec<usize> = notes
        .iter()
        .map(|n| {
            let rest = n.split_once("node-app.conf:").map(|(_, r)| r).unwrap_or(n);
            let line = rest.split(':').next().unwrap_or_default();
            line.parse()
                .unwrap_or_else(|_| panic!("a note without its line: {n}"))
        })
        .collect();
    assert!(lines.len() >= 5, "{all}");
    assert!(lines.is_sorted(), "not in file order:\n{all}");

    // An included file's notes come after the main file's, each file in line order
    // (debian-default.conf's `http` block includes sites-enabled/default).
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nginx/debian-default.conf");
    let out = Command::new(bin())
        .arg("import")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let notes: Vec<&str> = stderr.lines().collect();
    let main_last = notes
        .iter()
        .rposition(|n| n.contains("debian-default.conf:"));
    let included_first = notes
        .iter()
        .position(|n| n.contains("sites-enabled/default:"));
    assert!(
        main_last.zip(included_first).is_some_and(|(m, i)| m < i),
        "{stderr}"
    );
}

/// `pinlb check` on the Node.js import shows what was converted onto its route: the rate
/// limit, the compression, the header rules and the 30 s read timeout, as the route's own
/// (and the upstream says which route overrides its 60 s).
#[test]
fn check_on_an_import_shows_the_route_s_limits_compression_headers_and_timeout() {
    let (toml, _) = fixture_notes("node-app.conf");
    // This machine's listen address and core, and a log anyone can write.
    let toml = pin_to_test_cores(&toml)
        .replace("0.0.0.0:80", "127.0.0.1:0")
        .replace("\"/var/log/nginx/access.log\"", "\"stdout\"");
    let dir = tempfile::Builder::new()
        .prefix("pinlb-import-check-")
        .tempdir()
        .unwrap();
    let file = dir.path().join("pinlb.toml");
    std::fs::write(&file, &toml).unwrap();
    let out = Command::new(bin())
        .arg("check")
        .arg("-c")
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: Vec<&str> = stdout.lines().collect();
    let route = plan
        .iter()
        .position(|l| *l == "  route[1] path /* -> upstream node")
        .unwrap_or_else(|| panic!("no route to node:\n{stdout}"));
    assert_eq!(
        plan[route - 1],
        "  route[0] path /static/* -> respond 404 (0 bytes)"
    );
    assert_eq!(
        plan[route + 1..route + 5],
        [
            "    rate limit: zone api (10r/s per client_ip, 163840 keys), burst 20, over it 503",
            "    timeouts: connect 5s, response 30s (its own), send 60s",
            "    request headers: set x-real-ip: {client_ip}",
            "    compress: gzip level 6, types text/html, text/plain, text/css, application/json, application/javascript, from 20 bytes",
        ],
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "\n  route[1] of listener[0] 127.0.0.1:0 sets its own timeouts: response 30s\n"
        ),
        "{stdout}"
    );
}

/// What the comparison leaves out is noted by the import, at its file:line: the rewrite a route
/// can't express (rewrite.conf's /legacy/) and the Host nginx sends by default.
#[test]
fn what_pinlb_cannot_reproduce_is_noted_where_it_is_written() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nginx");
    let notes = |name: &str| {
        let out = Command::new(bin())
            .arg("import")
            .arg(dir.join(name))
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}");
        String::from_utf8(out.stderr).unwrap()
    };
    let rewrite = notes("rewrite.conf");
    assert!(
        rewrite.contains("rewrite.conf:22: rewrite not converted: the regex ^/legacy/(.*)$ is not one a route can match"),
        "{rewrite}"
    );
    let pool = notes("node-pool.conf");
    assert!(
        pool.contains("node-pool.conf:22: proxy_pass: nginx sends Host: $proxy_host"),
        "{pool}"
    );
}

/// What `pinlb import` made of a configuration: exit status, stdout, stderr, and the file it
/// read (in `_dir`, removed when dropped).
struct Imported {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// `pinlb import ARGS FILE` on `text` written to a temporary directory.
fn import_text(text: &str, args: &[&str]) -> Imported {
    let dir = tempfile::Builder::new()
        .prefix("pinlb-import-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("nginx.conf");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(bin())
        .arg("import")
        .args(args)
        .arg(&path)
        .output()
        .unwrap();
    Imported {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
        path,
        _dir: dir,
    }
}

/// A directive left out that would make pinlb answer where nginx refuses (a regex location
/// that returns 403, an `allow unix:`, a user file named by a variable, `limit_req`) makes the import exit 1, each listed at
/// its file:line, and no configuration printed; `--allow-less-strict` prints it, the refusals
/// kept as notes. What only loses convenience (gzip_disable) stays a note, exit 0.
#[test]
fn less_strict_directives_refuse_with_their_file_and_line() {
    let refusing = "\
http {
    upstream app { server 127.0.0.1:8081; }
    server {
        listen 8080;
        gzip_disable \"msie6\";
        location / { proxy_pass http://app; }
        location ~ ^/(?!public) { return 403; }
        location /admin/ {
            allow unix:;
            proxy_pass http://app;
        }
        location /private/ {
            auth_basic \"staff\";
            auth_basic_user_file $document_root/htpasswd;
            limit_req zone=one;
            proxy_pass http://app;
        }
    }
}
";
    let Imported {
        code,
        stdout,
        stderr,
        path,
        _dir,
    } = import_text(refusing, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty(), "printed a configuration:\n{stdout}");
    let at = |line: usize| format!("{}:{line}: ", path.display());
    for (line, what) in [
        (
            7,
            "location not converted: its regular expression is not one pinlb's engine takes",
        ),
        (9, "allow unix: not converted: pinlb listens on TCP only"),
        (
            14,
            "auth_basic_user_file $document_root/htpasswd not converted",
        ),
        (15, "limit_req not converted"),
    ] {
        assert!(
            stderr.contains(&format!("{}{what}", at(line))),
            "line {line} ({what}) not refused:\n{stderr}"
        );
    }
    // A note, not a refusal: listed, but not counted.
    assert!(
        stderr.contains(&format!("{}gzip_disable not converted", at(5))),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().last().unwrap_or_default(),
        "pinlb import: 4 directive(s) above not converted would make pinlb less strict than nginx; convert them by hand, or pass --allow-less-strict to print the configuration without them",
        "{stderr}"
    );

    let accepted = import_text(refusing, &["--allow-less-strict"]);
    let (code, stdout, stderr) = (accepted.code, accepted.stdout, accepted.stderr);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("[[listener]]"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "{}:7: location not converted",
            accepted.path.display()
        )) && stderr.contains("(accepted: --allow-less-strict)"),
        "{stderr}"
    );

    // Convenience only: exit 0, the notes on stderr.
    let convenient = "\
http {
    gzip_disable \"msie6\";
    server {
        listen 8080;
        location / { proxy_pass http://127.0.0.1:8081; }
    }
}
";
    let Imported {
        code,
        stdout,
        stderr,
        ..
    } = import_text(convenient, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("[[listener]]"), "{stdout}");
    assert!(stderr.contains("gzip_disable not converted"), "{stderr}");
}

/// allow/deny, auth_basic and satisfy convert onto every route as nginx merges them into its
/// location, the user file resolved against nginx's prefix; a `return` behind them is noted,
/// since pinlb checks them first.
#[test]
fn access_directives_convert_onto_each_route_as_nginx_merges_them() {
    let text = "\
http {
    allow 10.1.1.0/16;
    deny all;
    auth_basic \"Staff\";
    auth_basic_user_file conf.d/htpasswd;
    server {
        listen 8080;
        location / { proxy_pass http://127.0.0.1:8081; }
        location /open/ {
            auth_basic off;
            allow all;
            proxy_pass http://127.0.0.1:8081;
        }
        location = /ping {
            satisfy any;
            return 200 pong;
        }
    }
}
";
    let i = import_text(text, &[]);
    assert_eq!(i.code, Some(0), "{}", i.stderr);
    let toml: toml::Table = toml::from_str(&i.stdout).unwrap();
    let routes = toml["listener"][0]["route"].as_array().unwrap();
    let by_path = |key: &str, p: &str| {
        routes
            .iter()
            .find(|r| r.get(key).and_then(|v| v.as_str()) == Some(p))
            .unwrap_or_else(|| panic!("no route {p}: {}", i.stdout))
            .clone()
    };
    let file = i
        .path
        .with_file_name("conf.d/htpasswd")
        .display()
        .to_string();
    let root = by_path("path", "/");
    assert_eq!(
        root["access"],
        toml::Value::Array(vec!["allow 10.1.0.0/16".into(), "deny all".into()])
    );
    assert_eq!(root["auth_basic"]["realm"].as_str(), Some("Staff"));
    assert_eq!(root["auth_basic"]["user_file"].as_str(), Some(&file[..]));
    let open = by_path("path", "/open/");
    assert_eq!(open["access"], toml::Value::Array(vec!["allow all".into()]));
    assert!(open.get("auth_basic").is_none(), "{open:?}");
    let ping = by_path("path_exact", "/ping");
    assert_eq!(ping["satisfy"].as_str(), Some("any"));
    assert!(ping.get("respond").is_some());
    assert!(
        i.stderr
            .contains("nginx answers a return or rewrite before its access phase"),
        "{}",
        i.stderr
    );
    assert!(
        i.stderr
            .contains("allow 10.1.1.0/16 became allow 10.1.0.0/16"),
        "{}",
        i.stderr
    );
}

/// `worker_processes N` that `worker_cpu_affinity` does not pin (`auto`, or none) becomes the
/// core list as docs/configuration.md writes it, `cpus = [0, ...]`, not a range string.
#[test]
fn worker_cores_are_printed_as_a_list() {
    for (workers, cpus) in [(1, "cpus = [0]"), (3, "cpus = [0, 1, 2]")] {
        let text = format!(
            "worker_processes {workers};\nworker_cpu_affinity auto;\nhttp {{\n    server {{\n        listen 8080;\n        location / {{ proxy_pass http://127.0.0.1:8081; }}\n    }}\n}}\n"
        );
        let imported = import_text(&text, &[]);
        assert_eq!(imported.code, Some(0), "{}", imported.stderr);
        let line = imported
            .stdout
            .lines()
            .find(|l| l.starts_with("cpus = "))
            .unwrap_or_else(|| panic!("no runtime.cpus:\n{}", imported.stdout));
        assert_eq!(line, cpus, "worker_processes {workers}");
    }
}

/// A server that listens with `ssl` (and `http2`), its `ssl_certificate`/`ssl_certificate_key`
/// and `ssl_protocols` inherited from `http`, imports as a TLS listener: `pinlb serve` on the
/// import serves HTTPS with that certificate, and proxies to the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssl_server_imports_as_a_tls_listener_serving_its_certificate() {
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncWriteExt, BufReader};

    let pki = Pki::new();
    let cert = pki.issue("site", &["www.example.test"], false);
    let backend = Backend::start("app").await;
    let listen = free_port();
    let text = format!(
        "http {{
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate {};
    ssl_certificate_key {};
    server {{
        listen {listen} ssl http2;
        server_name www.example.test;
        location / {{ proxy_pass http://{}; }}
    }}
}}
",
        cert.cert.display(),
        cert.key.display(),
        backend.addr
    );
    let imported = import_text(&text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml = pin_to_test_cores(&imported.stdout);
    let pinlb = BinProxy::spawn_toml(&toml, &[]).await;
    await_listening(&[listen], || pinlb.log().join("\n")).await;

    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let tcp = tokio::net::TcpStream::connect(listen).await.unwrap();
        let name = ServerName::try_from("www.example.test").unwrap();
        let tls = tokio::time::timeout(
            WAIT,
            tokio_rustls::TlsConnector::from(pki.client(&[version])).connect(name, tcp),
        )
        .await
        .expect("a handshake in time")
        .unwrap_or_else(|e| panic!("{version:?}: no TLS handshake: {e}\nimported:\n{toml}"));
        let served = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        assert_eq!(served, cert.der(), "another certificate served");
        let mut conn = BufReader::new(tls);
        conn.get_mut()
            .write_all(
                b"GET /over-tls HTTP/1.1\r\nHost: www.example.test\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
        let resp = tokio::time::timeout(WAIT, read_response(&mut conn, false))
            .await
            .expect("a response in time");
        assert_eq!(resp.status, 200, "{version:?}");
        let seen = backend
            .requests()
            .pop()
            .expect("the backend got the request");
        assert_eq!(seen.uri, "/over-tls");
        assert_eq!(seen.headers["x-forwarded-proto"], "https");
    }
    drop(pinlb);

    // What pinlb's TLS can't match is refused at its line: TLS 1.3 only (pinlb also takes 1.2),
    // a cipher list, a server that listens with ssl without a certificate.
    for (from, to, line, refused) in [
        (
            "ssl_protocols TLSv1.2 TLSv1.3;",
            "ssl_protocols TLSv1.3;",
            2,
            "ssl_protocols TLSv1.3 not converted",
        ),
        (
            "ssl_protocols TLSv1.2 TLSv1.3;",
            "ssl_ciphers HIGH:!aNULL;",
            2,
            "ssl_ciphers not converted",
        ),
        (
            "ssl_certificate ",
            "# ssl_certificate ",
            5,
            "listen ... ssl not converted: the server has no ssl_certificate",
        ),
    ] {
        let imported = import_text(&text.replacen(from, to, 1), &[]);
        assert_eq!(imported.code, Some(1), "{to}: {}", imported.stderr);
        assert!(
            imported
                .stderr
                .contains(&format!("{}:{line}: {refused}", imported.path.display())),
            "{to}: {}",
            imported.stderr
        );
    }
}

/// `access_log PATH FORMAT` becomes `[log] access` with FORMAT as a template of the same
/// fields, and a note naming those pinlb's lines can't carry; `pinlb serve` on the import writes the
/// request there. `access_log off` writes no `[log]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_becomes_the_log_table_and_names_the_fields_lost() {
    let backend = Backend::start("app").await;
    let listen = free_port();
    let logs = tempfile::tempdir().unwrap();
    let file = logs.path().join("access.log");
    let text = format!(
        "http {{
    log_format main '$remote_addr [$time_local] \"$request\" $status $request_time $http_x_request_id $ssl_protocol';
    access_log {} main;
    server {{
        listen {listen};
        location / {{ proxy_pass http://{}; }}
    }}
}}
",
        file.display(),
        backend.addr
    );
    let imported = import_text(&text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    // The format becomes a template of the same fields; the one pinlb has not is a `-`.
    assert!(
        imported.stdout.contains(&format!(
            "[log]\naccess = \"{}\"\nformat = '{{remote_addr}} [{{time_local}}] \"{{request}}\" {{status}} {{request_time}} {{http_x_request_id}} -'\n",
            file.display()
        )),
        "{}",
        imported.stdout
    );
    assert!(
        imported.stderr.contains(&format!(
            "{}:3: access_log {} main: pinlb's template format, without $ssl_protocol",
            imported.path.display(),
            file.display()
        )),
        "{}",
        imported.stderr
    );

    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(&imported.stdout), &[]).await;
    await_listening(&[listen], || pinlb.log().join("\n")).await;
    let resp = raw_request(
        listen,
        b"GET /logged HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(resp.status, 200);
    let line = poll(400, Duration::from_millis(25), async || {
        std::fs::read_to_string(&file)
            .ok()
            .filter(|t| t.contains("] \"GET /logged HTTP/1.1\" 200 ") && t.ends_with(" - -\n"))
    })
    .await;
    assert!(line.is_some(), "nothing logged to {}", file.display());
    drop(pinlb);

    let off = import_text(
        &text.replace(&format!("{} main", file.display()), "off"),
        &[],
    );
    assert_eq!(off.code, Some(0), "{}", off.stderr);
    assert!(!off.stdout.contains("[log]"), "{}", off.stdout);
    assert!(!off.stderr.contains("access_log"), "{}", off.stderr);
}

/// `client_max_body_size` in `server` blocks becomes `[limits] max_body` when every server
/// says the same (pinlb's limit is one for the process); where a server's is smaller than the
/// one pinlb gets, pinlb would take bodies nginx refuses: refused at its line. nginx's default
/// (1m) is written out when nothing sets it.
#[test]
fn server_body_limits_convert_where_pinlb_can_hold_them() {
    let servers = |a: &str, b: &str| {
        format!(
            "http {{
    server {{
        listen 8080;
        {a}
        location / {{ proxy_pass http://127.0.0.1:8081; }}
    }}
    server {{
        listen 8081;
        {b}
        location / {{ proxy_pass http://127.0.0.1:8082; }}
    }}
}}
"
        )
    };
    let same = import_text(
        &servers("client_max_body_size 1k;", "client_max_body_size 1k;"),
        &[],
    );
    assert_eq!(same.code, Some(0), "{}", same.stderr);
    assert!(
        same.stdout.contains("[limits]\nmax_body = 1024\n"),
        "{}",
        same.stdout
    );

    let none = import_text(&servers("", ""), &[]);
    assert_eq!(none.code, Some(0), "{}", none.stderr);
    assert!(
        none.stdout.contains("[limits]\nmax_body = 1048576\n"),
        "{}",
        none.stdout
    );

    // 1k and 10m: pinlb keeps nginx's default 1m, so the 1k server would take more than nginx.
    let apart = import_text(
        &servers("client_max_body_size 1k;", "client_max_body_size 10m;"),
        &[],
    );
    assert_eq!(apart.code, Some(1), "{}", apart.stderr);
    assert!(
        apart.stderr.contains(&format!(
            "{}:4: client_max_body_size 1k not converted",
            apart.path.display()
        )),
        "{}",
        apart.stderr
    );
    assert!(
        !apart
            .stderr
            .contains(":9: client_max_body_size 10m not converted"),
        "{}",
        apart.stderr
    );
}

/// `curl URL`'s status, `Content-Type` and body (curl runs on a blocking thread).
async fn curl_page(url: String) -> (u16, String, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "-D", "-", "-w", "\n%{http_code}"])
            .arg(&url)
            .output()
            .expect("run curl")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (rest, status) = stdout.rsplit_once('\n').expect("curl's -w output");
    let (head, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
    let content_type = (head.lines())
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    (
        status.trim().parse().unwrap(),
        content_type,
        body.to_string(),
    )
}

/// nginx's usual error pages (`error_page 500 502 503 504 /50x.html;` with
/// `location = /50x.html { root …; }`), a location's own `error_page`, and
/// `proxy_intercept_errors on`, run in nginx and, imported, in pinlb: each answer has the same
/// status, content type and body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_pages_import_and_answer_as_nginx_does() {
    Nginx::binary();
    let dir = tempfile::Builder::new()
        .prefix("pinlb-import-pages-")
        .tempdir()
        .unwrap();
    let html = dir.path().join("html");
    std::fs::create_dir_all(&html).unwrap();
    std::fs::write(html.join("50x.html"), "<h1>Something went wrong</h1>\n").unwrap();
    std::fs::write(html.join("own.html"), "<p>own page</p>\n").unwrap();
    let gone = Refusing::new();
    let app = RawServer::start(|seen| {
        let path = seen.head.split(' ').nth(1).unwrap_or("/");
        let status = path
            .rsplit('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        RawAction::Respond(raw_status("app", status))
    })
    .await;
    let config = |listen: SocketAddr| {
        format!(
            "events {{}}
http {{
    types {{ text/html html; }}
    charset utf-8;
    server {{
        listen {listen};
        proxy_intercept_errors on;
        error_page 500 502 503 504 /50x.html;
        location = /50x.html {{ root {html}; }}
        location = /own.html {{ root {html}; }}
        location /gone/ {{ proxy_pass http://{gone}; }}
        location /app/ {{ proxy_pass http://{app}; }}
        location /own/ {{
            error_page 502 /own.html;
            proxy_pass http://{gone};
        }}
    }}
}}
",
            html = html.display(),
            gone = gone.addr,
            app = app.addr,
        )
    };
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let nginx = Nginx::start(&dir.path().join("nginx"), &config(nginx_at));
    await_listening(&[nginx_at], || nginx.log()).await;

    let imported = import_text(&config(pinlb_at), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml = &imported.stdout;
    assert!(toml.contains("intercept_errors = true"), "{toml}");
    assert!(
        toml.contains(&format!("file = \"{}/50x.html\"", html.display())),
        "{toml}"
    );
    assert!(
        imported.stderr.contains(&format!(
            "{}:9: location = /50x.html not converted: it serves error_page's file",
            imported.path.display()
        )),
        "{}",
        imported.stderr
    );
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(toml), &[]).await;
    await_listening(&[pinlb_at], || pinlb.log().join("\n")).await;

    for (path, status) in [
        ("/gone/x", 502),
        ("/app/500", 500),
        ("/app/503", 503),
        ("/app/404", 404),
        ("/app/200", 200),
        ("/own/x", 502),
    ] {
        let from_nginx = curl_page(format!("http://{nginx_at}{path}")).await;
        let from_pinlb = curl_page(format!("http://{pinlb_at}{path}")).await;
        assert_eq!(
            from_nginx.0,
            status,
            "{path}: {from_nginx:?}\n{}",
            nginx.log()
        );
        assert_eq!(from_pinlb, from_nginx, "{path}\n{toml}");
    }
}

/// The forms of `error_page` that are no local file are noted with their reason, and the rest
/// of the configuration converts.
#[test]
fn error_page_forms_without_a_file_are_noted_with_why() {
    let imported = import_text(
        "http {
    server {
        listen 8080;
        error_page 404 =200 /empty.gif;
        error_page 500 @fallback;
        error_page 403 http://example.com/forbidden.html;
        error_page 502 /proxied/e.html;
        error_page 504 /nowhere.html;
        location /proxied/ { proxy_pass http://127.0.0.1:8081; }
        location @fallback { proxy_pass http://127.0.0.1:8082; }
    }
}
",
        &["--allow-less-strict"],
    );
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let at = |line: usize, text: &str| format!("{}:{line}: {text}", imported.path.display());
    for (line, note) in [
        (
            4,
            "error_page 404 =200 /empty.gif not converted: the `=code` form",
        ),
        (
            5,
            "error_page 500 @fallback not converted: a named location",
        ),
        (
            6,
            "error_page 403 http://example.com/forbidden.html not converted: a URL",
        ),
        (
            7,
            "error_page 502 /proxied/e.html not converted: /proxied/e.html is answered by proxy_pass (line 9)",
        ),
        (
            8,
            "error_page 504 /nowhere.html not converted: no root for /nowhere.html",
        ),
    ] {
        assert!(
            imported.stderr.contains(&at(line, note)),
            "{}",
            imported.stderr
        );
    }
    assert!(
        !imported.stdout.contains("error_page"),
        "{}",
        imported.stdout
    );
}

/// `limit_req_zone` and `limit_req ... nodelay` (with `limit_req_status`) import as a rate
/// zone and the route's `rate_limit`; nginx and the imported pinlb, each on its own port,
/// answer the same requests alike: the burst passes, then the configured status. A `limit_req`
/// nginx delays, and a zone keyed by another variable, keep refusing with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_req_imports_as_a_rate_zone_that_answers_as_nginx_does() {
    let backend = Backend::start("app").await;
    let text = |listen: SocketAddr| {
        format!(
            "events {{}}
http {{
    limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;
    limit_req_zone $http_x_api_key zone=api:1m rate=1r/m;
    limit_req_status 429;
    server {{
        listen {listen};
        limit_req zone=one burst=2 nodelay;
        location / {{ proxy_pass http://{}; }}
        location /api/ {{
            limit_req zone=api;
            proxy_pass http://{};
        }}
    }}
}}
",
            backend.addr, backend.addr
        )
    };
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let imported = import_text(&text(pinlb_at), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let out = &imported.stdout;
    assert!(
        out.contains("[limit.one]\nkey = \"client_ip\"\nkeys = 16384\nrate = \"1r/m\"\n"),
        "{out}"
    );
    assert!(out.contains("key = \"header:x-api-key\""), "{out}");
    assert!(
        out.contains(
            "[[listener.route.rate_limit]]\nburst = 2\nnodelay = true\nstatus = 429\nzone = \"one\"\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("[[listener.route.rate_limit]]\nstatus = 429\nzone = \"api\"\n"),
        "{out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let nginx = Nginx::start(dir.path(), &text(nginx_at));
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(out), &[]).await;
    await_listening(&[nginx_at, pinlb_at], || {
        format!("{}\n{}", nginx.log(), pinlb.log().join("\n"))
    })
    .await;
    for (at, who) in [(nginx_at, "nginx"), (pinlb_at, "pinlb")] {
        let mut got = Vec::new();
        for target in ["/", "/", "/", "/", "/api/a", "/api/a"] {
            let req = format!(
                "GET {target} HTTP/1.1\r\nHost: a.test\r\nX-Api-Key: k\r\nConnection: close\r\n\r\n"
            );
            got.push(raw_request(at, req.as_bytes(), false).await.status);
        }
        assert_eq!(got, [200, 200, 200, 429, 200, 429], "{who}");
    }
    drop(pinlb);
    drop(nginx);

    let refusing = "\
http {
    limit_req_zone $binary_remote_addr zone=one:10m rate=10r/s;
    limit_req_zone $server_name zone=host:10m rate=10r/s;
    server {
        listen 8080;
        location / {
            limit_req zone=one burst=5;
            proxy_pass http://127.0.0.1:8081;
        }
        location /h/ {
            limit_req zone=host;
            proxy_pass http://127.0.0.1:8081;
        }
    }
}
";
    let r = import_text(refusing, &[]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let at = |line: usize| format!("{}:{line}: ", r.path.display());
    for (line, what) in [
        (3, "limit_req_zone not converted: only $binary_remote_addr"),
        (
            7,
            "limit_req not converted: nginx delays the requests over the rate",
        ),
        (
            11,
            "limit_req not converted: its zone host has no limit_req_zone that converted",
        ),
    ] {
        assert!(
            r.stderr.contains(&format!("{}{what}", at(line))),
            "line {line} ({what}) not refused:\n{}",
            r.stderr
        );
    }
}

/// A server's `limit_conn` on a zone keyed by the address becomes its listener's `conn_limit`,
/// which the imported pinlb holds; a location's own `limit_conn`, and a zone keyed by another
/// variable, keep refusing with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_conn_imports_as_the_listener_s_conn_limit() {
    let backend = Backend::start("app").await;
    let listen = free_port();
    let text = format!(
        "http {{
    limit_conn_zone $binary_remote_addr zone=addr:1m;
    server {{
        listen {listen};
        limit_conn addr 1;
        location / {{ proxy_pass http://{}; }}
    }}
}}
",
        backend.addr
    );
    let imported = import_text(&text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        imported
            .stdout
            .contains("[listener.conn_limit]\nkeys = 16384\nmax = 1\n"),
        "{}",
        imported.stdout
    );
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(&imported.stdout), &[]).await;
    // Not `await_listening`: its probe connection would count against the limit of 1 until
    // pinlb saw it close. A worker's start line says the socket is taken instead (a connection
    // made before its accept loop runs waits in the backlog).
    let running = poll(400, Duration::from_millis(25), async || {
        pinlb
            .log()
            .iter()
            .any(|l| l.contains("running on core"))
            .then_some(())
    })
    .await;
    assert!(running.is_some(), "{}", pinlb.log().join("\n"));
    let mut held = RawConn::open(listen).await;
    let r = held
        .exchange(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", false)
        .await;
    assert_eq!(r.status, 200);
    // A second connection from the same address while the first is open: closed unanswered.
    let mut second = RawConn::open(listen).await;
    second.send(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    let seen = tokio::time::timeout(WAIT, second.read_until(|_| false))
        .await
        .expect("closed");
    assert!(seen.is_empty(), "{}", String::from_utf8_lossy(&seen));
    drop(pinlb);

    let refusing = "\
http {
    limit_conn_zone $binary_remote_addr zone=addr:10m;
    limit_conn_zone $server_name zone=perhost:10m;
    server {
        listen 8080;
        limit_conn perhost 10;
        location / {
            limit_conn addr 5;
            proxy_pass http://127.0.0.1:8081;
        }
    }
}
";
    let r = import_text(refusing, &[]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let at = |line: usize| format!("{}:{line}: ", r.path.display());
    for (line, what) in [
        (
            3,
            "limit_conn_zone not converted: pinlb limits connections per client address only",
        ),
        (
            6,
            "limit_conn not converted: its zone perhost has no limit_conn_zone that converted",
        ),
        (
            8,
            "limit_conn not converted: pinlb limits a listener's connections",
        ),
    ] {
        assert!(
            r.stderr.contains(&format!("{}{what}", at(line))),
            "line {line} ({what}) not refused:\n{}",
            r.stderr
        );
    }
}

/// Writes a v1 PROXY header naming `source`, then a GET that closes; the response's text.
async fn get_as(addr: SocketAddr, source: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "PROXY TCP4 {source} {} 5000 {}\r\nGET {path} HTTP/1.1\r\nHost: pp.test\r\nConnection: close\r\n\r\n",
        addr.ip(),
        addr.port()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("an answer in time")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// `listen … proxy_protocol` with `set_real_ip_from` and `real_ip_header proxy_protocol`
/// becomes `proxy_protocol = true` from those addresses: nginx and pinlb, each on the same
/// configuration, pass the header's client to the backend. Without `set_real_ip_from` the
/// import refuses at the listen line; a `stream` block is noted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_proxy_protocol_imports_with_set_real_ip_from_as_the_allowed_sources() {
    let backend = Backend::start("app").await;
    let conf = |listen: SocketAddr| {
        format!(
            "http {{
    set_real_ip_from 10.0.0.0/8;
    server {{
        listen {listen} proxy_protocol;
        set_real_ip_from 127.0.0.1;
        real_ip_header proxy_protocol;
        location / {{
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_pass http://{};
        }}
    }}
}}
",
            backend.addr
        )
    };
    let (for_nginx, for_pinlb) = (free_port(), free_port());
    let dir = tempfile::Builder::new()
        .prefix("pinlb-pp-nginx-")
        .tempdir()
        .unwrap();
    let nginx = Nginx::start(dir.path(), &format!("events {{}}\n{}", conf(for_nginx)));
    let imported = import_text(&conf(for_pinlb), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        imported.stdout.contains("proxy_protocol = true"),
        "{}",
        imported.stdout
    );
    // The server's own set_real_ip_from, not http's.
    assert!(
        imported
            .stdout
            .contains("proxy_protocol_from = [\"127.0.0.1\"]"),
        "{}",
        imported.stdout
    );
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(&imported.stdout), &[]).await;
    await_listening(&[for_nginx], || nginx.log()).await;
    await_listening(&[for_pinlb], || pinlb.log().join("\n")).await;
    for (name, addr) in [("nginx", for_nginx), ("pinlb", for_pinlb)] {
        let answer = get_as(addr, "203.0.113.7", &format!("/{name}")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{name}: {answer}");
        let seen = backend.requests().pop().expect("the backend got it");
        assert_eq!(seen.uri, format!("/{name}"));
        assert_eq!(seen.headers["x-forwarded-for"], "203.0.113.7", "{name}");
    }
    drop(pinlb);

    let open = "http {
    server {
        listen 8080 proxy_protocol;
        location / { proxy_pass http://127.0.0.1:8081; }
    }
}
stream {
    server { listen 9000; proxy_pass 127.0.0.1:9001; proxy_protocol on; }
}
";
    let refused = import_text(open, &[]);
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    let at = format!(
        "{}:3: listen 0.0.0.0:8080 proxy_protocol not converted",
        refused.path.display()
    );
    assert!(refused.stderr.contains(&at), "{}", refused.stderr);
    let allowed = import_text(open, &["--allow-less-strict"]);
    assert_eq!(allowed.code, Some(0), "{}", allowed.stderr);
    // The stream server is a TCP listener, its proxy_protocol on its upstream's header.
    for want in [
        "address = \"0.0.0.0:9000\"\nmode = \"tcp\"\nupstream = \"stream_127_0_0_1_9001\"",
        "[upstream.stream_127_0_0_1_9001]\nproxy_protocol = \"v1\"",
    ] {
        assert!(allowed.stdout.contains(want), "{want}:\n{}", allowed.stdout);
    }
    assert!(
        allowed
            .stdout
            .contains("proxy_protocol_from = [\"0.0.0.0/0\", \"::/0\"]"),
        "{}",
        allowed.stdout
    );
}

/// curl to `https://a.test:PORT/` trusting `ca`, with `args`: the status (`000` when the
/// handshake failed).
fn curl_status(port: u16, ca: &Path, args: &[&str]) -> String {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["--tls-max", "1.2"])
        .args(args)
        .arg("--cacert")
        .arg(ca)
        .args(["--resolve", &format!("a.test:{port}:127.0.0.1")])
        .arg(format!("https://a.test:{port}/cert"))
        .output()
        .expect("run curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ssl_client_certificate`, `ssl_verify_client on`, `ssl_crl` and `proxy_set_header NAME
/// $ssl_client_s_dn` (`$ssl_client_verify`, `$ssl_client_serial`) import as the listener's
/// client certificate keys: nginx on the configuration and pinlb on its import send the backend
/// the same values for one certificate, refuse the revoked one and the one without any, and a
/// client's own header of those names does not get through either. `optional_no_ca` and
/// `ssl_verify_depth` are refused with their reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_directives_import_and_pass_the_backend_what_nginx_does() {
    let server = Pki::new();
    let cert = server.issue("site", &["a.test"], false);
    let clients = Pki::named("pinlb test client CA");
    let good = clients.issue_client("good", "alice", 0x1234, false);
    let revoked = clients.issue_client("revoked", "mallory", 0x66, false);
    let crl = clients.dir.join("crl.pem");
    clients.write_crl(&crl, &[0x66]);
    let backend = Backend::start("app").await;
    let config = |listen: SocketAddr, verify: &str| {
        format!(
            "events {{}}
http {{
    ssl_certificate {};
    ssl_certificate_key {};
    ssl_client_certificate {};
    ssl_crl {};
    server {{
        listen {listen} ssl;
        server_name a.test;
        {verify}
        location / {{
            proxy_pass http://{};
            proxy_set_header X-SSL-Client-S-DN $ssl_client_s_dn;
            proxy_set_header X-SSL-Client-Verify $ssl_client_verify;
            proxy_set_header X-SSL-Client-Serial $ssl_client_serial;
        }}
    }}
}}
",
            cert.cert.display(),
            cert.key.display(),
            clients.ca_file().display(),
            crl.display(),
            backend.addr
        )
    };
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let dir = tempfile::Builder::new()
        .prefix("pinlb-import-")
        .tempdir()
        .unwrap();
    let nginx = Nginx::start(
        &dir.path().join("nginx"),
        &config(nginx_at, "ssl_verify_client on;"),
    );
    await_listening(&[nginx_at], || nginx.log()).await;
    let imported = import_text(&config(pinlb_at, "ssl_verify_client on;"), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    for key in [
        format!("client_ca = \"{}\"", clients.ca_file().display()),
        format!("crl = \"{}\"", crl.display()),
        "X-SSL-Client-S-DN".into(),
    ] {
        assert!(
            imported.stdout.contains(&key),
            "{key}:\n{}",
            imported.stdout
        );
    }
    assert!(
        imported.stderr.contains("pinlb has no ssl_verify_depth"),
        "{}",
        imported.stderr
    );
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(&imported.stdout), &[]).await;
    await_listening(&[pinlb_at], || pinlb.log().join("\n")).await;

    let ca = server.ca_file();
    let with_cert = |c: &Cert| {
        vec![
            "--cert".to_string(),
            c.cert.display().to_string(),
            "--key".to_string(),
            c.key.display().to_string(),
            "-H".to_string(),
            "X-SSL-Client-Verify: forged".to_string(),
        ]
    };
    let mut seen = Vec::new();
    for at in [nginx_at, pinlb_at] {
        let (ca, args) = (ca.clone(), with_cert(&good));
        let status = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            curl_status(at.port(), &ca, &args)
        })
        .await
        .unwrap();
        assert_eq!(status, "200", "{at}");
        let r = backend.requests().pop().expect("the backend got it");
        let one = |name: &str| {
            let all: Vec<String> = (r.headers.get_all(name).iter())
                .map(|v| v.to_str().unwrap().to_string())
                .collect();
            all
        };
        seen.push((
            one("x-ssl-client-s-dn"),
            one("x-ssl-client-verify"),
            one("x-ssl-client-serial"),
        ));
    }
    assert_eq!(seen[0], seen[1], "nginx's, then pinlb's");
    assert_eq!(seen[1].0, ["CN=alice,O=Example\\, Inc"]);
    assert_eq!(seen[1].1, ["SUCCESS"]);
    assert_eq!(seen[1].2, ["1234"]);
    let hits = backend.hits();
    for at in [nginx_at, pinlb_at] {
        for args in [with_cert(&revoked), Vec::new()] {
            let (ca, shown) = (ca.clone(), args.clone());
            let status = tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                curl_status(at.port(), &ca, &args)
            })
            .await
            .unwrap();
            // nginx completes the handshake and answers 400; pinlb refuses the handshake.
            let want = if at == nginx_at { "400" } else { "000" };
            assert_eq!(status, want, "{at} {shown:?}");
        }
    }
    assert_eq!(
        backend.hits(),
        hits,
        "no refused client reached the backend"
    );
    drop((nginx, pinlb));

    for (verify, refused) in [
        (
            "ssl_verify_client optional_no_ca;",
            "ssl_verify_client optional_no_ca not converted: nginx takes a certificate it cannot verify",
        ),
        (
            "ssl_verify_client on; ssl_verify_depth 2;",
            "ssl_verify_depth 2 not converted: pinlb has no depth limit",
        ),
    ] {
        let imported = import_text(&config(pinlb_at, verify), &[]);
        assert_eq!(imported.code, Some(1), "{verify}: {}", imported.stderr);
        assert!(
            imported
                .stderr
                .contains(&format!("{}:10: {refused}", imported.path.display())),
            "{verify}: {}",
            imported.stderr
        );
    }
    // optional: the import says so.
    let imported = import_text(&config(pinlb_at, "ssl_verify_client optional;"), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        imported.stdout.contains("client_auth = \"optional\""),
        "{}",
        imported.stdout
    );
}

/// nginx's gzip directives (`gzip`, `gzip_types`, `gzip_min_length`, `gzip_comp_level`, each
/// inherited on its own) import as each route's `compress`, and the imported pinlb compresses
/// what nginx does, to within 2% of its size; `gzip off` in a location stays off; what pinlb
/// does differently (gzip_proxied, gzip_vary off) is a note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_imports_as_compress_and_compresses_as_nginx_does() {
    let json: String = (0..600)
        .map(|i| {
            format!(
                r#"{{"id":{i},"name":"user {i}","mail":"u{i}@example.com","n":{}}},"#,
                i * 7919 % 1000
            )
        })
        .collect();
    let body = json.clone();
    let backend = RawServer::start(move |_| {
        RawAction::Respond(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        )
    })
    .await;
    let text = |listen: SocketAddr| {
        format!(
            "events {{}}
http {{
    gzip_types application/json;
    gzip_comp_level 1;
    gzip_proxied off;
    server {{
        listen {listen};
        gzip on;
        gzip_min_length 1k;
        location / {{ proxy_pass http://{0}; }}
        location /raw/ {{
            gzip off;
            proxy_pass http://{0};
        }}
    }}
}}
",
            backend.addr
        )
    };
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let imported = import_text(&text(pinlb_at), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let out = &imported.stdout;
    assert!(
        out.contains(
            "[listener.route.compress]\nalgorithms = [\"gzip\"]\ngzip_level = 1\nmin_length = 1024\ntypes = [\"text/html\", \"application/json\"]\n"
        ),
        "{out}"
    );
    assert_eq!(out.matches("[listener.route.compress]").count(), 1, "{out}");
    assert!(
        imported.stderr.contains(&format!(
            "{}:5: gzip_proxied not converted: pinlb compresses every request's response",
            imported.path.display()
        )),
        "{}",
        imported.stderr
    );

    let dir = tempfile::tempdir().unwrap();
    let nginx = Nginx::start(dir.path(), &text(nginx_at));
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(out), &[]).await;
    await_listening(&[nginx_at, pinlb_at], || {
        format!("{}\n{}", nginx.log(), pinlb.log().join("\n"))
    })
    .await;
    let mut sizes = Vec::new();
    for at in [nginx_at, pinlb_at] {
        let fetch = |path: &'static str| {
            let url = format!("http://{at}{path}");
            tokio::task::spawn_blocking(move || {
                let out = Command::new("curl")
                    .args([
                        "-sS",
                        "--max-time",
                        "10",
                        "-H",
                        "Accept-Encoding: gzip",
                        "-D",
                        "-",
                    ])
                    .arg(&url)
                    .output()
                    .expect("run curl");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let split = out
                    .stdout
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .unwrap();
                let head = String::from_utf8_lossy(&out.stdout[..split]).to_ascii_lowercase();
                (head, out.stdout[split + 4..].to_vec())
            })
        };
        let (head, gz) = fetch("/data").await.unwrap();
        assert!(head.contains("content-encoding: gzip"), "{at}: {head}");
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain).unwrap();
        assert_eq!(plain, json.as_bytes(), "{at}");
        sizes.push(gz.len() as f64);
        let (head, raw) = fetch("/raw/data").await.unwrap();
        assert!(!head.contains("content-encoding"), "{at}: {head}");
        assert_eq!(raw, json.as_bytes(), "{at}");
    }
    let ratio = sizes[1] / sizes[0];
    assert!(
        (0.98..=1.02).contains(&ratio),
        "pinlb {} bytes, nginx {}",
        sizes[1],
        sizes[0]
    );
    drop((nginx, pinlb));

    // A level nginx would refuse: a note, and pinlb's default level.
    let bad = "http {
    gzip on;
    gzip_comp_level 12;
    server {
        listen 8080;
        location / { proxy_pass http://127.0.0.1:8081; }
    }
}
";
    let imported = import_text(bad, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        imported.stderr.contains(&format!(
            "{}:3: gzip_comp_level not converted: expected a level from 1 to 9",
            imported.path.display()
        )),
        "{}",
        imported.stderr
    );
    assert!(
        imported.stdout.contains("gzip_level = 1\n"),
        "{}",
        imported.stdout
    );
}

/// nginx buffers both bodies by default and pinlb only with `[upstream.NAME.buffering]`, so
/// the import writes the table for every upstream a location proxies to, with what the
/// location turns off (`proxy_buffering off`, `proxy_request_buffering off`), none where both
/// are off, and `proxy_max_temp_file_size` as `max_temp`; imported, pinlb buffers what nginx
/// does.
#[test]
fn nginx_buffering_imports_as_each_upstreams_buffering_table() {
    let imported = import_text(
        "\
http {
    upstream app { server 127.0.0.1:8081; }
    upstream events { server 127.0.0.1:8082; }
    upstream raw { server 127.0.0.1:8083; }
    server {
        listen 8080;
        proxy_max_temp_file_size 10m;
        location / { proxy_pass http://app; }
        location /events { proxy_buffering off; proxy_pass http://events; }
        location /raw { proxy_buffering off; proxy_request_buffering off; proxy_pass http://raw; }
        location /again { proxy_buffering off; proxy_pass http://app; }
    }
}
",
        &[],
    );
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml: toml::Table = imported.stdout.parse().expect("TOML");
    let buffering = |name: &str| toml["upstream"][name].get("buffering").cloned();
    let app = buffering("app").expect("app buffers");
    assert_eq!(app["request"].as_bool(), Some(true));
    assert_eq!(app["response"].as_bool(), Some(true));
    assert_eq!(app["max_temp"].as_integer(), Some(10 << 20));
    let events = buffering("events").expect("events buffers its requests");
    assert_eq!(events["request"].as_bool(), Some(true));
    assert_eq!(events["response"].as_bool(), Some(false));
    assert_eq!(buffering("raw"), None, "both off: no table");
    assert!(
        imported.stderr.contains(&format!(
            "{}:11: proxy_pass: this location buffers differently from an earlier one to the same upstream",
            imported.path.display()
        )),
        "{}",
        imported.stderr
    );
    // What the import wrote is a configuration pinlb loads.
    std::fs::write(imported.path.with_extension("toml"), &imported.stdout).unwrap();
    let loaded = pinlb::Config::load(&imported.path.with_extension("toml"));
    assert!(loaded.is_ok(), "{:?}", loaded.err());
}

/// nginx Plus's `sticky cookie` imports as the upstream's `sticky` table, which `check` takes;
/// its other forms (`sticky route`, `sticky learn`) are left out with the reason, at their line.
#[test]
fn sticky_cookie_imports_as_the_upstreams_sticky_table() {
    let text = "\
http {
    upstream app {
        server 127.0.0.1:8081;
        server 127.0.0.1:8082;
        sticky cookie srv_id expires=1h domain=example.com path=/ httponly secure samesite=strict;
    }
    upstream other {
        server 127.0.0.1:8083;
        sticky route $route_cookie $route_uri;
    }
    server {
        listen 8080;
        location / { proxy_pass http://app; }
        location /other/ { proxy_pass http://other; }
    }
}
";
    let imported = import_text(text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml = pin_to_test_cores(&imported.stdout);
    let config = pinlb::Config::parse("imported.toml", &toml, &allowed())
        .unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let app = config.upstreams.iter().find(|u| u.name == "app").unwrap();
    let sticky = app.sticky.as_ref().expect("app is sticky");
    assert_eq!(sticky.cookie, "srv_id");
    assert_eq!(sticky.max_age, Some(3600));
    assert_eq!(sticky.domain.as_deref(), Some("example.com"));
    assert_eq!(sticky.path, "/");
    assert!(sticky.httponly && sticky.secure);
    assert_eq!(sticky.samesite, Some(pinlb::config::SameSite::Strict));
    let other = config.upstreams.iter().find(|u| u.name == "other").unwrap();
    assert!(other.sticky.is_none());
    let at = imported.path.display();
    assert!(
        imported.stderr.contains(&format!(
            "{at}:9: sticky not converted: only `sticky cookie NAME …` converts"
        )),
        "{}",
        imported.stderr
    );
    // nginx sets HttpOnly only when asked: the import keeps it off without `httponly`.
    let plain = import_text(&text.replace(" httponly", ""), &[]);
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(
        plain.stdout.contains("httponly = false"),
        "{}",
        plain.stdout
    );
}

/// The usual PHP location (`location ~ \.php$` with `fastcgi_pass`) converts: a regex route
/// to an upstream with `protocol = "fastcgi"` and the server's root, beside the rest.
#[test]
fn a_fastcgi_pass_location_imports_as_a_fastcgi_upstream() {
    let text = "\
http {
    upstream app { server 127.0.0.1:8081; }
    server {
        listen 8080;
        root /var/www/html;
        location / { proxy_pass http://app; }
        location ~ \\.php$ {
            include fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_pass 127.0.0.1:9000;
        }
    }
}
";
    let imported = import_text(text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml: toml::Table = imported.stdout.parse().unwrap();
    let php = &toml["upstream"]["127.0.0.1:9000"];
    assert_eq!(php["protocol"].as_str(), Some("fastcgi"), "{toml}");
    assert_eq!(php["fastcgi"]["root"].as_str(), Some("/var/www/html"));
    let routes = toml["listener"][0]["route"].as_array().unwrap();
    // The regex before the prefix, as nginx tries it before `location /`.
    assert_eq!(routes[0]["path_regex"].as_str(), Some("\\.php$"), "{toml}");
    assert_eq!(routes[1]["path"].as_str(), Some("/"), "{toml}");
    // The rest of the server converts.
    assert!(
        imported.stdout.contains("[[upstream.app.backends]]"),
        "{}",
        imported.stdout
    );
}

/// A backend on the Unix socket `path` that answers every request with `NAME PATH` (its
/// request's target), keeping the connection open, as long as the test runs.
fn unix_backend(path: &Path, name: &'static str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut s = BufReader::new(s);
                // Bounded by the client: every pass answers one request, or ends.
                loop {
                    let mut first = String::new();
                    if s.read_line(&mut first).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut line = String::new();
                    while s.read_line(&mut line).await.unwrap_or(0) > 2 {
                        line.clear();
                    }
                    let target = first.split(' ').nth(1).unwrap_or("?");
                    let body = format!("{name} {target}");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if s.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// `server unix:/path` in an upstream and `proxy_pass http://unix:/path:/uri` become backends
/// at `unix:/path`, which answer through the imported pinlb as through nginx; a relative socket
/// path is not converted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_servers_import_and_answer_as_nginx_does() {
    let sockets = tempfile::tempdir().unwrap();
    let (app, api) = (
        sockets.path().join("app.sock"),
        sockets.path().join("api.sock"),
    );
    unix_backend(&app, "app");
    unix_backend(&api, "api");
    let text = |listen: SocketAddr| {
        format!(
            "events {{}}
http {{
    upstream app {{
        server unix:{} weight=2;
    }}
    server {{
        listen {listen};
        location / {{ proxy_pass http://app; }}
        location /api/ {{ proxy_pass http://unix:{}:/v1/; }}
    }}
}}
",
            app.display(),
            api.display()
        )
    };
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let imported = import_text(&text(pinlb_at), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml: toml::Table = imported.stdout.parse().unwrap();
    let ups = toml["upstream"].as_table().unwrap();
    let first = |name: &str| ups[name]["backends"][0].clone();
    let app_label = format!("unix:{}", app.display());
    let api_label = format!("unix:{}", api.display());
    assert_eq!(first("app")["address"].as_str(), Some(app_label.as_str()));
    assert_eq!(first("app")["weight"].as_integer(), Some(2));
    assert_eq!(
        first(&api_label)["address"].as_str(),
        Some(api_label.as_str())
    );

    let dir = tempfile::tempdir().unwrap();
    let nginx = Nginx::start(dir.path(), &text(nginx_at));
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(&imported.stdout), &[]).await;
    await_listening(&[nginx_at, pinlb_at], || {
        format!("{}\n{}", nginx.log(), pinlb.log().join("\n"))
    })
    .await;
    for (at, who) in [(nginx_at, "nginx"), (pinlb_at, "pinlb")] {
        let mut got = Vec::new();
        for target in ["/x", "/api/y"] {
            let req = format!("GET {target} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
            let r = raw_request(at, req.as_bytes(), false).await;
            got.push((r.status, String::from_utf8_lossy(&r.body).into_owned()));
        }
        let want = [(200, "app /x".to_string()), (200, "api /v1/y".to_string())];
        assert_eq!(got, want, "{who}");
    }
    drop((nginx, pinlb));

    let relative = import_text(
        "http {\n  upstream app { server unix:app.sock; }\n  server {\n    listen 8080;\n    location / { proxy_pass http://app; }\n  }\n}\n",
        &[],
    );
    assert!(
        relative.stderr.contains(&format!(
            "{}:2: server not converted: the socket path \"app.sock\" is relative",
            relative.path.display()
        )),
        "{}",
        relative.stderr
    );
}

/// The PHP scripts the FastCGI import test serves: each says what php-fpm was asked to run.
/// An empty PATH_INFO reads as none: nginx's `fastcgi_param PATH_INFO $fastcgi_path_info` sends
/// it empty, pinlb leaves it out (the import notes it).
const PHP_INFO: &str = r#"<?php header('Content-Type: application/json'); echo json_encode(['script' => $_SERVER['SCRIPT_NAME'], 'filename' => $_SERVER['SCRIPT_FILENAME'], 'path_info' => ($_SERVER['PATH_INFO'] ?? '') ?: null, 'query' => $_SERVER['QUERY_STRING'], 'uri' => $_SERVER['REQUEST_URI'], 'document_uri' => $_SERVER['DOCUMENT_URI'], 'method' => $_SERVER['REQUEST_METHOD'], 'get' => $_GET, 'post' => $_POST]);"#;

/// A php-fpm master listening on a Unix socket in a temporary directory, with `info.php` and
/// `index.php` under `www/`, and workers enough for pinlb's kept connections (each holds one)
/// and nginx's; stopped (SIGTERM, which it passes to its workers) on drop. `None`
/// when scripts/test passed no php-fpm (`PINLB_TEST_PHP_FPM`), as tests/fastcgi.rs skips.
struct Fpm {
    dir: tempfile::TempDir,
    child: Child,
}

impl Fpm {
    async fn start() -> Option<Fpm> {
        let Some(bin) = std::env::var_os("PINLB_TEST_PHP_FPM") else {
            eprintln!(
                "skipped: PINLB_TEST_PHP_FPM is unset (scripts/test sets it to /usr/sbin/php-fpm*)"
            );
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("pinlb-import-fpm-")
            .tempdir()
            .unwrap();
        let www = dir.path().join("www");
        std::fs::create_dir(&www).unwrap();
        std::fs::write(www.join("info.php"), PHP_INFO).unwrap();
        std::fs::write(www.join("index.php"), PHP_INFO).unwrap();
        let conf = dir.path().join("php-fpm.conf");
        let socket = dir.path().join("php.sock");
        std::fs::write(
            &conf,
            format!(
                "[global]\nerror_log = {}\ndaemonize = no\npid = {}\n\n[www]\nlisten = {}\nlisten.mode = 0666\npm = static\npm.max_children = 16\n",
                dir.path().join("fpm.log").display(),
                dir.path().join("fpm.pid").display(),
                socket.display(),
            ),
        )
        .unwrap();
        let mut command = Command::new(bin);
        command
            .arg("-F")
            .arg("-y")
            .arg(&conf)
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if nix::unistd::geteuid().is_root() {
            // php-fpm refuses to run its workers as root unless told to.
            command.arg("-R");
        }
        let fpm = Fpm {
            child: command.spawn().expect("start php-fpm"),
            dir,
        };
        let up = poll(400, Duration::from_millis(25), async || {
            tokio::net::UnixStream::connect(&socket)
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        assert!(
            up.is_some(),
            "php-fpm never listened: {}",
            std::fs::read_to_string(fpm.dir.path().join("fpm.log")).unwrap_or_default()
        );
        Some(fpm)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("php.sock")
    }

    fn www(&self) -> PathBuf {
        self.dir.path().join("www")
    }
}

impl Drop for Fpm {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = poll_blocking(400, Duration::from_millis(25), || {
            self.child.try_wait().ok().flatten()
        });
        if exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The usual PHP server (a front controller's `location /` with `try_files … /index.php?
/// $query_string`, and `location ~ [^/]\.php(/|$)` with `fastcgi_pass unix:…`, the standard
/// params, `fastcgi_split_path_info` and its `PATH_INFO` line) run in nginx and, imported, in
/// pinlb, both in front of one real php-fpm: a script with a query, PATH_INFO, a POST form, a
/// path that is no PHP (the front controller), `/` and a missing script get the same status
/// and body from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_php_server_imports_and_answers_as_nginx_does_through_one_php_fpm() {
    Nginx::binary();
    let Some(fpm) = Fpm::start().await else {
        return;
    };
    let text = |listen: SocketAddr| {
        format!(
            "events {{}}
http {{
    server {{
        listen {listen};
        server_name example.test;
        root {www};
        index index.php index.html;
        location / {{
            try_files $uri $uri/ /index.php?$query_string;
        }}
        location ~ [^/]\\.php(/|$) {{
            fastcgi_split_path_info ^(.+?\\.php)(/.*)$;
            include fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_param PATH_INFO $fastcgi_path_info;
            fastcgi_index index.php;
            fastcgi_read_timeout 30s;
            fastcgi_pass unix:{socket};
        }}
    }}
}}
",
            www = fpm.www().display(),
            socket = fpm.socket().display(),
        )
    };
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let imported = import_text(&text(pinlb_at), &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml: toml::Table = imported.stdout.parse().unwrap();
    let php = format!("unix:{}", fpm.socket().display());
    let up = &toml["upstream"][&php];
    assert_eq!(up["protocol"].as_str(), Some("fastcgi"), "{toml}");
    assert_eq!(
        up["fastcgi"]["split_path_info"].as_str(),
        Some("^(.+?\\.php)(/.*)$")
    );
    assert_eq!(
        toml["upstream"][&format!("{php}#2")]["fastcgi"]["script"].as_str(),
        Some("/index.php"),
        "{toml}"
    );
    assert!(
        imported.stderr.contains("became a route to upstream unix:"),
        "{}",
        imported.stderr
    );

    // nginx reads `include fastcgi_params` beside its configuration; the import knew it by name.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path()).unwrap();
    std::fs::copy(
        "/etc/nginx/fastcgi_params",
        dir.path().join("fastcgi_params"),
    )
    .expect("Debian's /etc/nginx/fastcgi_params (the nginx package)");
    let nginx = Nginx::start(dir.path(), &text(nginx_at));
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(&imported.stdout), &[]).await;
    await_listening(&[nginx_at, pinlb_at], || {
        format!("{}\n{}", nginx.log(), pinlb.log().join("\n"))
    })
    .await;
    let form = "name=ada&n=2";
    let requests = [
        "GET /info.php?a=1&b=two HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
            .to_string(),
        "GET /info.php/extra/path?x=1 HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
            .to_string(),
        format!(
            "POST /info.php HTTP/1.1\r\nHost: example.test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
            form.len()
        ),
        "GET /about/team?page=3 HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
            .to_string(),
        "GET / HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n".to_string(),
        "GET /missing.php HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n".to_string(),
    ];
    let mut statuses = Vec::new();
    for req in &requests {
        let from_nginx = raw_request(nginx_at, req.as_bytes(), false).await;
        let from_pinlb = raw_request(pinlb_at, req.as_bytes(), false).await;
        let body = |r: &RawResponse| String::from_utf8_lossy(&r.body).into_owned();
        assert_eq!(
            (from_pinlb.status, body(&from_pinlb)),
            (from_nginx.status, body(&from_nginx)),
            "{req}\n{}\n{toml}",
            nginx.log()
        );
        statuses.push(from_nginx.status);
    }
    // Each ran what it should: the scripts, the front controller, and php-fpm's own 404.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 404]);
    let info = |req: String| async move {
        let r = raw_request(pinlb_at, req.as_bytes(), false).await;
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()
    };
    let v = info(requests[1].clone()).await;
    assert_eq!(v["script"], "/info.php");
    assert_eq!(v["path_info"], "/extra/path");
    let v = info(requests[2].clone()).await;
    assert_eq!(v["post"]["name"], "ada");
    let v = info(requests[3].clone()).await;
    assert_eq!(v["script"], "/index.php");
    assert_eq!(v["uri"], "/about/team?page=3");
    assert_eq!(v["get"]["page"], "3");
}

/// What the FastCGI import refuses, at its line and naming why: a `fastcgi_param` whose value
/// is a variable pinlb has no equivalent for, a plain prefix under a `^~` one in a server with
/// regex locations, and another `fastcgi_*` that changes what is answered; Debian's snippet,
/// read by name, converts to its split and index, with a note for its `try_files`.
#[test]
fn fastcgi_imports_refuse_what_pinlb_would_answer_differently() {
    let refusing = "\
http {
    server {
        listen 8080;
        root /var/www/html;
        location ^~ /static/ { proxy_pass http://127.0.0.1:8081; }
        location /static/img/ { proxy_pass http://127.0.0.1:8082; }
        location ~ \\.php$ {
            include fastcgi_params;
            fastcgi_param APP_USER $cookie_user;
            fastcgi_pass 127.0.0.1:9000;
        }
        location ~ ^/legacy/.+\\.php$ {
            fastcgi_intercept_errors on;
            fastcgi_pass 127.0.0.1:9000;
        }
    }
}
";
    let imported = import_text(refusing, &[]);
    assert_eq!(imported.code, Some(1), "{}", imported.stderr);
    let at = |line: usize| format!("{}:{line}: ", imported.path.display());
    for (line, what) in [
        (
            6,
            "location /static/img/ not converted: it lies under location ^~ /static/",
        ),
        (
            9,
            "fastcgi_param APP_USER $cookie_user not converted: pinlb's params are fixed strings, and $cookie_user is a variable",
        ),
        (13, "fastcgi_intercept_errors not converted"),
    ] {
        assert!(
            imported.stderr.contains(&format!("{}{what}", at(line))),
            "line {line} ({what}) not refused:\n{}",
            imported.stderr
        );
    }

    // Without the regexes, a `^~` is a plain prefix and both prefixes convert, longest first.
    let plain = import_text(
        "http {\n  server {\n    listen 8080;\n    location ^~ /static/ { proxy_pass http://127.0.0.1:8081; }\n    location /static/img/ { proxy_pass http://127.0.0.1:8082; }\n  }\n}\n",
        &[],
    );
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    let toml: toml::Table = plain.stdout.parse().unwrap();
    let paths: Vec<&str> = (toml["listener"][0]["route"].as_array().unwrap().iter())
        .filter_map(|r| r.get("path").and_then(|p| p.as_str()))
        .collect();
    assert_eq!(paths, ["/static/img/", "/static/"], "{toml}");

    // Debian's snippet, known by name though no such file is beside the configuration; a
    // `^~` prefix goes before the regex, a plain one after it.
    let snippet = import_text(
        "http {\n  server {\n    listen 8080;\n    root /srv/app;\n    location / { proxy_pass http://127.0.0.1:8081; }\n    location ^~ /assets/ { proxy_pass http://127.0.0.1:8082; }\n    location ~* \\.php$ {\n      include snippets/fastcgi-php.conf;\n      fastcgi_pass php;\n    }\n  }\n  upstream php { server 127.0.0.1:9000; }\n}\n",
        &[],
    );
    assert_eq!(snippet.code, Some(0), "{}", snippet.stderr);
    assert!(
        !snippet.stderr.contains("no such file"),
        "{}",
        snippet.stderr
    );
    assert!(
        snippet.stderr.contains(&format!(
            "{}:8: include snippets/fastcgi-php.conf: its try_files $fastcgi_script_name =404 is not converted",
            snippet.path.display()
        )),
        "{}",
        snippet.stderr
    );
    let toml: toml::Table = snippet.stdout.parse().unwrap();
    let php = &toml["upstream"]["php"];
    assert_eq!(php["protocol"].as_str(), Some("fastcgi"));
    assert_eq!(php["fastcgi"]["root"].as_str(), Some("/srv/app"));
    assert_eq!(php["fastcgi"]["index"].as_str(), Some("index.php"));
    assert_eq!(
        php["fastcgi"]["split_path_info"].as_str(),
        Some("^(.+?\\.php)(/.*)$")
    );
    // The first, nginx's 301 from /assets to /assets/, is exact.
    let routes = toml["listener"][0]["route"].as_array().unwrap();
    assert_eq!(routes[0]["path_exact"].as_str(), Some("/assets"), "{toml}");
    assert_eq!(routes[1]["path"].as_str(), Some("/assets/"), "{toml}");
    assert_eq!(routes[2]["path_regex"].as_str(), Some("(?i)\\.php$"));
    assert_eq!(routes[2]["upstream"].as_str(), Some("php"));
    assert_eq!(routes[3]["path"].as_str(), Some("/"));
}

/// `fastcgi_param` and `fastcgi_index` are inherited from the server as nginx's are: a location
/// with no `fastcgi_param` of its own takes the server's, one with any takes none of them.
#[test]
fn fastcgi_params_are_inherited_from_the_server_as_nginx_merges_them() {
    let imported = import_text(
        "http {\n  server {\n    listen 8080;\n    root /srv;\n    include fastcgi_params;\n    fastcgi_param APP_ENV prod;\n    fastcgi_index app.php;\n    location ~ ^/a/.+\\.php$ { fastcgi_pass 127.0.0.1:9000; }\n    location ~ ^/b/.+\\.php$ {\n      fastcgi_param APP_ENV test;\n      fastcgi_pass 127.0.0.1:9000;\n    }\n  }\n}\n",
        &[],
    );
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        !imported.stderr.contains("fastcgi_param not converted"),
        "{}",
        imported.stderr
    );
    let toml: toml::Table = imported.stdout.parse().unwrap();
    let a = &toml["upstream"]["127.0.0.1:9000"]["fastcgi"];
    assert_eq!(a["params"]["APP_ENV"].as_str(), Some("prod"), "{toml}");
    assert_eq!(a["index"].as_str(), Some("app.php"));
    let b = &toml["upstream"]["127.0.0.1:9000#2"]["fastcgi"];
    assert_eq!(b["params"]["APP_ENV"].as_str(), Some("test"), "{toml}");
    assert_eq!(b["index"].as_str(), Some("app.php"));
    let routes = toml["listener"][0]["route"].as_array().unwrap();
    assert_eq!(routes[1]["upstream"].as_str(), Some("127.0.0.1:9000#2"));
}

/// `proxy_next_upstream`'s conditions become `retry.on`, nginx's names kept; `off` is one try.
#[test]
fn proxy_next_upstream_imports_as_retry_on_with_its_statuses() {
    let text = "\
http {
    upstream app { server 127.0.0.1:8081; server 127.0.0.1:8082; }
    upstream one { server 127.0.0.1:8083; server 127.0.0.1:8084; }
    server {
        listen 8080;
        location / {
            proxy_pass http://app;
            proxy_next_upstream error timeout http_502 http_503 non_idempotent;
        }
        location /one/ {
            proxy_pass http://one;
            proxy_next_upstream off;
        }
    }
}
";
    let imported = import_text(text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml = pin_to_test_cores(&imported.stdout);
    let config = pinlb::Config::parse("imported.toml", &toml, &allowed())
        .unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let retry = |name: &str| {
        let up = config.upstreams.iter().find(|u| u.name == name).unwrap();
        up.retry.clone()
    };
    let app = retry("app");
    assert!(
        app.on_error && app.on_timeout && app.non_idempotent,
        "{app:?}"
    );
    assert!(
        app.on_status.contains(502) && app.on_status.contains(503),
        "{app:?}"
    );
    assert!(!app.on_status.contains(504), "{app:?}");
    assert_eq!(retry("one").tries, 1);
    assert!(
        !imported.stderr.contains("proxy_next_upstream"),
        "{}",
        imported.stderr
    );
}

/// `mirror /m;` and the internal location it names become the route's `mirror`; that location is
/// no route of its own; `mirror_request_body off` is the mirror's `body = false`.
#[test]
fn mirror_imports_as_the_routes_mirror_to_the_internal_locations_upstream() {
    let text = "\
http {
    upstream app { server 127.0.0.1:8081; }
    upstream canary { server 127.0.0.1:8082; }
    server {
        listen 8080;
        location / {
            mirror /m;
            proxy_pass http://app;
        }
        location /quiet/ {
            mirror /m;
            mirror_request_body off;
            proxy_pass http://app;
        }
        location = /m {
            internal;
            proxy_pass http://canary$request_uri;
        }
    }
}
";
    let imported = import_text(text, &[]);
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let toml = pin_to_test_cores(&imported.stdout);
    let config = pinlb::Config::parse("imported.toml", &toml, &allowed())
        .unwrap_or_else(|e| panic!("{e}\n{toml}"));
    // The two proxying routes mirror, one without the body (the third is nginx's redirect of
    // /quiet to /quiet/).
    let routes = &config.listeners[0].routes;
    let described: Vec<Vec<String>> = routes.iter().map(|r| r.modules.describe()).collect();
    let with_body = ["mirror 100.0% to upstream canary (at most 64 in flight)"];
    let bare = ["mirror 100.0% to upstream canary (at most 64 in flight, without the body)"];
    assert_eq!(
        described.iter().filter(|d| *d == &with_body).count(),
        1,
        "{toml}"
    );
    assert_eq!(
        described.iter().filter(|d| *d == &bare).count(),
        1,
        "{toml}"
    );
    assert_eq!(routes.len(), 3, "{toml}");
    let at = imported.path.display();
    assert!(
        imported.stderr.contains(&format!(
            "{at}:15: location /m serves only mirror subrequests"
        )),
        "{}",
        imported.stderr
    );
}

/// The `proxy_cache` family converts to a `[cache.NAME]` zone and a route's `cache`, with
/// `add_header X-Cache-Status $upstream_cache_status` as its `status_header`; and the imported
/// pinlb caches as nginx does: the same cache status for the same requests, and the same
/// requests at each proxy's own backend.
#[tokio::test]
async fn proxy_cache_converts_and_caches_as_nginx_does() {
    let text = |dir: &Path, listen: SocketAddr, backend: SocketAddr| {
        format!(
            "events {{ worker_connections 256; }}
http {{
    proxy_cache_path {} levels=1:2 keys_zone=micro:10m max_size=16m inactive=1m;
    upstream app {{ server {backend}; }}
    server {{
        listen {listen};
        proxy_cache micro;
        proxy_cache_key $scheme$host$request_uri;
        proxy_cache_valid 200 1m;
        proxy_cache_valid any 5s;
        proxy_cache_lock on;
        proxy_cache_use_stale error timeout updating http_503;
        proxy_cache_background_update on;
        proxy_cache_bypass $cookie_nocache;
        proxy_no_cache $http_x_no_store;
        proxy_cache_min_uses 1;
        proxy_ignore_headers Expires;
        add_header X-Cache-Status $upstream_cache_status;
        location / {{ proxy_pass http://app; }}
    }}
}}
",
            dir.display()
        )
    };
    // Each proxy its own backend, answering every request with a response fresh for 60 s.
    let origin = || {
        RawServer::start(|_| {
            RawAction::Respond(
                b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 6\r\n\r\ncached"
                    .to_vec(),
            )
        })
    };
    let (nginx_backend, pinlb_backend) = (origin().await, origin().await);
    let (nginx_at, pinlb_at) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let imported = import_text(
        &text(
            &dir.path().join("pinlb-cache"),
            pinlb_at,
            pinlb_backend.addr,
        ),
        &[],
    );
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    let out = &imported.stdout;
    for want in [
        "[cache.micro]\nmax_size = 16777216\n",
        "zone = \"micro\"",
        "key = \"{scheme}{host}{uri}\"",
        "status_header = \"X-Cache-Status\"",
        "use_stale = [\"error\", \"timeout\", \"updating\", \"http_503\"]",
        "background_update = true",
        "bypass = [\"cookie:nocache\"]",
        "no_cache = [\"header:x-no-store\"]",
        "ignore_headers = [\"Expires\"]",
        "lock = true",
    ] {
        assert!(out.contains(want), "{want} missing from:\n{out}");
    }
    assert!(
        out.contains("[listener.route.cache.valid]\n200 = \"60s\"\nany = \"5s\"\n"),
        "{out}"
    );
    assert!(
        imported
            .stderr
            .contains("pinlb keeps the zone micro in memory"),
        "{}",
        imported.stderr
    );
    // A key that does not convert would share what nginx keeps apart: refused.
    let private = text(&dir.path().join("x"), pinlb_at, pinlb_backend.addr).replace(
        "$scheme$host$request_uri",
        "$host$request_uri$cookie_session",
    );
    let r = import_text(&private, &[]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("proxy_cache_key $host$request_uri$cookie_session not converted"),
        "{}",
        r.stderr
    );

    let nginx = Nginx::start(
        &dir.path().join("nginx"),
        &text(
            &dir.path().join("nginx-cache"),
            nginx_at,
            nginx_backend.addr,
        ),
    );
    let pinlb = BinProxy::spawn_toml(&pin_to_test_cores(out), &[]).await;
    await_listening(&[nginx_at, pinlb_at], || {
        format!("{}\n{}", nginx.log(), pinlb.log().join("\n"))
    })
    .await;
    let statuses = |at: SocketAddr| async move {
        let mut got = Vec::new();
        for (method, path, header) in [
            (http::Method::GET, "/c", None),
            (http::Method::GET, "/c", None),
            (http::Method::HEAD, "/c", None),
            (http::Method::GET, "/c", Some(("cookie", "nocache=1"))),
            (http::Method::GET, "/n", Some(("x-no-store", "1"))),
            (http::Method::GET, "/n", Some(("x-no-store", "1"))),
        ] {
            let mut req = request(method, path, empty());
            if let Some((k, v)) = header {
                req.headers_mut().insert(k, v.parse().unwrap());
            }
            let r = Conn::open(at).await.fetch(req).await;
            let cache = r
                .headers
                .get("x-cache-status")
                .map(|v| v.to_str().unwrap().to_string());
            got.push(format!(
                "{path} {} {}",
                r.status.as_u16(),
                cache.unwrap_or_default()
            ));
        }
        got
    };
    let via_nginx = statuses(nginx_at).await;
    let via_pinlb = statuses(pinlb_at).await;
    assert_eq!(
        via_nginx,
        [
            "/c 200 MISS",
            "/c 200 HIT",
            "/c 200 HIT",
            "/c 200 BYPASS",
            "/n 200 MISS",
            "/n 200 MISS"
        ],
        "nginx"
    );
    assert_eq!(via_pinlb, via_nginx, "pinlb and nginx disagree");
    assert_eq!(pinlb_backend.requests(), nginx_backend.requests());
}
