//! Backends on Unix-domain sockets (`address = "unix:/path"`): Node.js servers listening on
//! sockets in a temporary directory, started by the test, behind pinlb.
//!
//! Node.js is the peer (`PINLB_TEST_NODE`, which `scripts/test` sets); a test that needs it
//! skips, saying so, only when that is unset. The WebSocket backend is tokio-tungstenite on a
//! tokio `UnixListener`, as tests/websocket.rs's is on TCP.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use http::StatusCode;
use tokio_tungstenite::tungstenite::Message;

/// The Node.js servers: `http` or `h2` (cleartext HTTP/2) on the socket `path`, answering with
/// their id, the HTTP version, which of their connections carried the request, and the Host.
const SERVER_JS: &str = r#"
const [mode, path, id] = process.argv.slice(2);
const answer = (req, res, conn) => {
  const host = req.headers.host || req.headers[':authority'] || '-';
  res.writeHead(req.url === '/health' && process.env.SICK ? 500 : 200, { 'content-type': 'text/plain' });
  res.end(`${id} ${req.httpVersion} conn=${conn} host=${host}`);
};
let server;
if (mode === 'h2') {
  server = require('http2').createServer((req, res) => answer(req, res, 0));
} else {
  let conns = 0;
  server = require('http').createServer((req, res) => answer(req, res, req.socket.n));
  server.on('connection', (s) => { s.n = ++conns; });
}
server.listen(path, () => console.log('listening on ' + path));
"#;

/// A Node.js server on a Unix socket; killed when dropped.
struct Node {
    child: Child,
}

impl Node {
    /// Starts it and waits (bounded) for its "listening" line: the socket accepts from then on.
    fn start(node: &str, script: &Path, mode: &str, path: &Path, id: &str) -> Node {
        let mut child = Command::new(node)
            .arg(script)
            .args([mode, path.to_str().unwrap(), id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run node");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(WAIT).expect("node printed its line");
        assert!(line.starts_with("listening on"), "{line:?}");
        Node { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Node.js, or why the test is skipped.
fn node() -> Option<String> {
    match std::env::var("PINLB_TEST_NODE") {
        Ok(n) if !n.is_empty() => Some(n),
        _ => {
            println!("skipped: PINLB_TEST_NODE is unset (scripts/test sets it to Node.js)");
            None
        }
    }
}

/// A temporary directory for the sockets, with the server script in it.
fn dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("pinlb-unix-")
        .tempdir()
        .unwrap();
    let script = dir.path().join("server.js");
    std::fs::write(&script, SERVER_JS).unwrap();
    (dir, script)
}

/// One worker, an admin listener, and upstream `app` with `backends` (socket paths) and `more`
/// lines in its table.
fn config(backends: &[&Path], more: &str) -> String {
    let list: String = backends
        .iter()
        .map(|p| format!("  {{ address = \"unix:{}\" }},\n", p.display()))
        .collect();
    format!(
        "[runtime]\ncpus = [{core}]\n\n[admin]\naddress = \"127.0.0.1:0\"\n\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\n\
         [upstream.app]\nbackends = [\n{list}]\n{more}",
        core = first_core(),
    )
}

#[tokio::test]
async fn requests_go_through_a_unix_socket_and_reuse_the_backend_connection() {
    let Some(node) = node() else { return };
    let (dir, script) = dir();
    let sock = dir.path().join("a.sock");
    let _a = Node::start(&node, &script, "http", &sock, "a");
    let proxy = Proxy::start_toml(&config(&[&sock], ""));
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let r = get(proxy.addr, "/").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        bodies.push(r.body);
    }
    // The client's Host goes through; each request went on the one pooled connection.
    let want = "a 1.1 conn=1 host=pinlb.test";
    assert_eq!(bodies, [want; 3]);
    let sock_label = format!("unix:{}", sock.display());
    let metrics = proxy.metrics().await;
    let opened = metrics.value(
        "pinlb_backend_connections_opened_total",
        &format!("upstream=\"app\",backend=\"{sock_label}\""),
    );
    assert_eq!(opened, 1.0, "{}", metrics.0);
    let status = proxy.status().await;
    let shown = status["upstreams"][0]["backends"][0]["address"].clone();
    assert_eq!(shown, sock_label.as_str(), "{status}");
    // The admin API takes the address as it is shown, and with its slashes encoded.
    let encoded = sock_label.replace('/', "%2F");
    for (path, admin) in [
        (format!("/backends/{sock_label}/drain"), "draining"),
        (
            format!("/upstreams/app/backends/{encoded}/enable"),
            "active",
        ),
    ] {
        let r = proxy.admin(http::Method::POST, &path, None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
        let status = proxy.status().await;
        assert_eq!(
            status["upstreams"][0]["backends"][0]["admin"], admin,
            "{path}: {status}"
        );
    }
}

#[tokio::test]
async fn a_request_without_host_names_localhost_to_a_socket_backend() {
    let Some(node) = node() else { return };
    let (dir, script) = dir();
    let sock = dir.path().join("a.sock");
    let _a = Node::start(&node, &script, "http", &sock, "a");
    let proxy = Proxy::start_toml(&config(&[&sock], ""));
    let resp = raw_request(proxy.addr, b"GET / HTTP/1.0\r\n\r\n", false).await;
    let body = String::from_utf8_lossy(&resp.body);
    assert_eq!(
        (resp.status, body.as_ref()),
        (200, "a 1.1 conn=1 host=localhost")
    );
}

#[tokio::test]
async fn health_checks_take_a_stopped_socket_backend_down_and_traffic_moves() {
    let Some(node) = node() else { return };
    let (dir, script) = dir();
    let (sa, sb) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    let mut a = Node::start(&node, &script, "http", &sa, "a");
    let _b = Node::start(&node, &script, "http", &sb, "b");
    let health = "[upstream.app.health]\npath = \"/health\"\ninterval = \"100ms\"\n\
                  timeout = \"80ms\"\nrise = 1\nfall = 2\n";
    let proxy = Proxy::start_toml(&config(&[&sa, &sb], health));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let r = get(proxy.addr, "/").await;
        seen.insert(r.body.split(' ').next().unwrap_or_default().to_string());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["a", "b"]);
    a.stop();
    let label = format!("unix:{}", sa.display());
    let down = poll(100, Duration::from_millis(50), async || {
        let status = proxy.status().await;
        let backends = status["upstreams"][0]["backends"].as_array()?.clone();
        backends
            .iter()
            .find(|b| b["address"] == label.as_str() && b["state"] == "down")
            .map(|_| ())
    })
    .await;
    assert!(
        down.is_some(),
        "{label} is not down: {}",
        proxy.status().await
    );
    for _ in 0..6 {
        let r = get(proxy.addr, "/").await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.body.starts_with("b "), "{}", r.body);
    }
}

#[tokio::test]
async fn h2c_goes_to_a_node_http2_server_on_a_socket() {
    let Some(node) = node() else { return };
    let (dir, script) = dir();
    let sock = dir.path().join("h2.sock");
    let _h2 = Node::start(&node, &script, "h2", &sock, "h2");
    let health = "protocol = \"h2c\"\n\n[upstream.app.health]\npath = \"/health\"\n\
                  interval = \"100ms\"\ntimeout = \"80ms\"\nrise = 1\nfall = 1\n";
    let proxy = Proxy::start_toml(&config(&[&sock], health));
    for _ in 0..2 {
        let r = get(proxy.addr, "/").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.body, "h2 2.0 conn=0 host=pinlb.test");
    }
    let label = format!("unix:{}", sock.display());
    let up = poll(100, Duration::from_millis(50), async || {
        let status = proxy.status().await;
        let b = status["upstreams"][0]["backends"][0].clone();
        (b["address"] == label.as_str() && b["state"] == "up").then_some(())
    })
    .await;
    assert!(up.is_some(), "h2c probes: {}", proxy.status().await);
}

#[tokio::test]
async fn a_websocket_tunnels_to_a_backend_on_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ws.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                // Bounded by the client: every pass echoes one message, or ends.
                while let Some(Ok(m)) = ws.next().await {
                    if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let proxy = Proxy::start_toml(&config(&[&sock], ""));
    let (mut ws, resp) = tokio::time::timeout(
        WAIT,
        tokio_tungstenite::connect_async(format!("ws://{}/echo", proxy.addr)),
    )
    .await
    .expect("handshake in time")
    .expect("handshake");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    for text in ["one", "two"] {
        ws.send(Message::text(text)).await.unwrap();
        let back = tokio::time::timeout(WAIT, ws.next()).await.unwrap();
        assert_eq!(back.unwrap().unwrap(), Message::text(text));
    }
    ws.close(None).await.unwrap();
}

#[test]
fn a_missing_path_or_a_file_that_is_no_socket_is_an_error_at_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.sock");
    let file = dir.path().join("plain");
    std::fs::write(&file, "x").unwrap();
    let line = |toml: &str| toml.lines().position(|l| l.contains("unix:")).unwrap() + 1;
    for (path, what) in [
        (
            &missing,
            "does not exist, expected the path of a listening Unix socket",
        ),
        (&file, "is a regular file, not a socket"),
    ] {
        let toml = config(&[path], "");
        let e = pinlb::Config::parse("test.toml", &toml, &allowed())
            .err()
            .unwrap_or_else(|| panic!("{} accepted", path.display()))
            .to_string();
        let at = format!(
            "test.toml:{}:15: upstream.app.backends[0].address: {} {what}",
            line(&toml),
            path.display()
        );
        assert!(e.contains(&at), "{e}\nexpected {at}");
    }
    let toml = config(&[&missing], "").replace(
        "backends = [",
        "backends = [\n  { address = \"unix:relative.sock\" },",
    );
    let e = pinlb::Config::parse("test.toml", &toml, &allowed())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("upstream.app.backends[0].address: socket path \"relative.sock\" is relative"),
        "{e}"
    );
}

#[test]
fn tls_to_a_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let toml = config(
        &[&sock],
        "\n[upstream.app.tls]\ninsecure_skip_verify = true\n",
    );
    let e = pinlb::Config::parse("test.toml", &toml, &allowed())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("TLS over a Unix socket is not supported"), "{e}");
}

#[tokio::test]
async fn a_socket_pinlb_may_not_open_is_logged_as_pinlb_s_side() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Its directory may be searched (the config check looks at the socket), the socket itself
    // may not be opened by anyone but root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("closed.sock");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o000)).unwrap();
    let config = temp_config(&config(&[&sock], ""));
    // Root opens every socket whatever its mode: pinlb runs as nobody then (setpriv, from
    // util-linux, which Debian always has).
    let mut command = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()]);
        c
    } else {
        Command::new(bin())
    };
    command.args(["serve", "-c"]).arg(&config);
    let mut proxy = BinProxy::spawn_command(command, config).await;
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.body);
    let line = proxy
        .wait_for_log("permission denied opening the socket")
        .await;
    assert!(line.contains(&sock.display().to_string()), "{line}");
    assert!(
        line.contains("on pinlb's side, not the backend's"),
        "{line}"
    );
}

#[test]
fn check_s_core_map_finds_the_node_process_holding_the_socket() {
    let Some(node) = node() else { return };
    let (dir, script) = dir();
    let sock = dir.path().join("a.sock");
    let a = Node::start(&node, &script, "http", &sock, "a");
    let path = temp_config(&config(&[&sock], ""));
    let out = Command::new(bin())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = format!(
        "backend unix:{} (upstream app): served by pid {} (node)",
        sock.display(),
        a.pid()
    );
    assert!(stdout.contains(&want), "{stdout}\nexpected {want}");
}

#[tokio::test]
async fn a_spawned_backend_listens_on_its_socket_which_goes_when_pinlb_stops() {
    let Some(node) = node() else { return };
    let runtime = tempfile::tempdir().unwrap();
    let script = runtime.path().join("spawned.js");
    std::fs::write(
        &script,
        "const path = process.argv[2];\n\
         require('http').createServer((req, res) => res.end('spawned ' + path + ' ' + process.env.SOCKET))\n\
         .listen(path, () => console.log('listening on ' + path));\n",
    )
    .unwrap();
    // The ports still number the ranges (and go in PORT); nothing binds them.
    let base = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .min(60_000);
    let toml = format!(
        "[runtime]\ncpus = [{worker}]\n\n[admin]\naddress = \"127.0.0.1:0\"\n\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\n\
         [upstream.app.spawn]\ncommand = [\"{node}\", \"{script}\", \"{{socket}}\"]\n\
         cpus = [{core}]\nport_base = {base}\n",
        worker = first_core(),
        script = script.display(),
        core = allowed().last().unwrap(),
    );
    let mut proxy =
        BinProxy::spawn_toml(&toml, &[("XDG_RUNTIME_DIR", runtime.path().as_os_str())]).await;
    let dir = runtime.path().join(format!("pinlb-{}", proxy.pid));
    let sock = dir.join("app-0-0.sock");
    let line = proxy.wait_for_log("in the pool").await;
    assert!(
        line.contains(&format!("answers on unix:{}", sock.display())),
        "{line}"
    );
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());
    assert!(std::fs::metadata(&sock).unwrap().file_type().is_socket());
    let r = get(proxy.addr, "/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, format!("spawned {0} {0}", sock.display()));
    let pid_line = format!(
        "pinlb_spawn_pid{{upstream=\"app\",process=\"0\",address=\"unix:{}\"",
        sock.display()
    );
    let admin = proxy.admin_addr().await;
    let metrics = get(admin, "/metrics").await;
    assert!(metrics.body.contains(&pid_line), "{}", metrics.body);
    proxy.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(proxy.wait_exit().await.success());
    assert!(!sock.exists(), "{} is still there", sock.display());
    assert!(!dir.exists(), "{} is still there", dir.display());
}
