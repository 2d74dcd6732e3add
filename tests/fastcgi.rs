//! `protocol = "fastcgi"` against a real php-fpm, started by each test on a free port with a
//! pool config and PHP scripts the test writes in a temporary directory: GET with a query, POST
//! forms (by length and chunked), a file upload, `header()` and `http_response_code()`, a large
//! streamed response, a PHP fatal error, a worker that dies before answering, php-fpm stopped,
//! health checks through FastCGI, and keep-alive reuse of one php-fpm connection.
//!
//! php-fpm's binary is versioned on Debian (`/usr/sbin/php-fpm8.2`): scripts/test finds it and
//! passes it as `PINLB_TEST_PHP_FPM`; without it these tests skip, saying why.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use http::{Method, StatusCode};
use tokio::net::{TcpListener, TcpStream};

/// The scripts every pool serves.
const SCRIPTS: &[(&str, &str)] = &[
    (
        "q.php",
        r#"<?php header('Content-Type: application/json'); echo json_encode(['get' => $_GET, 'script' => $_SERVER['SCRIPT_NAME'], 'filename' => $_SERVER['SCRIPT_FILENAME'], 'uri' => $_SERVER['REQUEST_URI'], 'method' => $_SERVER['REQUEST_METHOD'], 'header' => $_SERVER['HTTP_X_TEST'] ?? null, 'proxy' => $_SERVER['HTTP_PROXY'] ?? null, 'host' => $_SERVER['HTTP_HOST'] ?? null, 'remote' => $_SERVER['REMOTE_ADDR'], 'path_info' => $_SERVER['PATH_INFO'] ?? null, 'pid' => getmypid()]);"#,
    ),
    (
        "post.php",
        r#"<?php header('Content-Type: application/json'); echo json_encode(['post' => $_POST, 'length' => $_SERVER['CONTENT_LENGTH'], 'type' => $_SERVER['CONTENT_TYPE'] ?? null]);"#,
    ),
    (
        "upload.php",
        r#"<?php $f = $_FILES['doc']; echo json_encode(['name' => $f['name'], 'size' => $f['size'], 'error' => $f['error'], 'md5' => md5_file($f['tmp_name']), 'note' => $_POST['note'] ?? null]);"#,
    ),
    (
        "status.php",
        r#"<?php http_response_code(201); header('X-App: made'); header('Set-Cookie: a=1'); header('Set-Cookie: b=2', false); echo 'created';"#,
    ),
    ("redirect.php", r#"<?php header('Location: /elsewhere'); "#),
    (
        "teapot.php",
        r#"<?php header('Status: 418 I am a teapot'); echo 'short and stout';"#,
    ),
    (
        "big.php",
        r#"<?php $line = str_repeat('0123456789abcdef', 4096); for ($i = 0; $i < 128; $i++) { echo $line; flush(); }"#,
    ),
    (
        "fatal.php",
        r#"<?php error_log('about to fail'); undefined_function_here();"#,
    ),
    ("die.php", r#"<?php posix_kill(getmypid(), 9);"#),
    (
        "index.php",
        r#"<?php echo 'index of ' . $_SERVER['SCRIPT_NAME'];"#,
    ),
];

/// The php-fpm binary, or `None` (the test then skips) when scripts/test did not pass one.
fn php_fpm() -> Option<PathBuf> {
    match std::env::var_os("PINLB_TEST_PHP_FPM") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            eprintln!(
                "skipped: PINLB_TEST_PHP_FPM is unset (scripts/test sets it to /usr/sbin/php-fpm*)"
            );
            None
        }
    }
}

/// A php-fpm master with a static pool of two workers, its scripts and logs in a temporary
/// directory; killed on drop.
struct PhpFpm {
    dir: tempfile::TempDir,
    listen: String,
    child: Option<Child>,
    bin: PathBuf,
}

impl PhpFpm {
    /// Starts php-fpm on a free loopback port, and waits until it accepts.
    async fn start(bin: &Path) -> PhpFpm {
        let port = free_port();
        PhpFpm::start_on(bin, format!("127.0.0.1:{port}")).await
    }

    /// Starts php-fpm listening on `listen` (an address, or a socket path).
    async fn start_on(bin: &Path, listen: String) -> PhpFpm {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("www");
        std::fs::create_dir(&root).expect("www");
        for (name, text) in SCRIPTS {
            std::fs::write(root.join(name), text).expect("write script");
        }
        std::fs::create_dir(root.join("sub")).expect("sub");
        std::fs::write(root.join("sub/index.php"), SCRIPTS[9].1).expect("sub index");
        let mut fpm = PhpFpm {
            dir,
            listen,
            child: None,
            bin: bin.to_path_buf(),
        };
        fpm.run().await;
        fpm
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    /// The address pinlb connects to.
    fn addr(&self) -> String {
        if self.listen.starts_with('/') {
            format!("unix:{}", self.listen)
        } else {
            self.listen.clone()
        }
    }

    async fn run(&mut self) {
        let d = self.dir.path();
        let conf = d.join("php-fpm.conf");
        std::fs::write(
            &conf,
            format!(
                "[global]\nerror_log = {log}\ndaemonize = no\npid = {pid}\n\n[www]\nlisten = {listen}\npm = static\npm.max_children = 2\nping.path = /ping\npm.status_path = /status\nphp_admin_flag[display_errors] = off\nphp_admin_flag[log_errors] = on\n",
                log = d.join("fpm.log").display(),
                pid = d.join("fpm.pid").display(),
                listen = self.listen,
            ),
        )
        .expect("write php-fpm.conf");
        let mut command = Command::new(&self.bin);
        command
            .arg("-F")
            .arg("-y")
            .arg(&conf)
            .arg("-p")
            .arg(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if nix::unistd::geteuid().is_root() {
            // php-fpm refuses to run its workers as root unless told to.
            command.arg("-R");
        }
        self.child = Some(command.spawn().expect("start php-fpm"));
        let listen = self.listen.clone();
        let up = wait::poll(200, Duration::from_millis(25), async || {
            let ok = if listen.starts_with('/') {
                tokio::net::UnixStream::connect(&listen).await.is_ok()
            } else {
                TcpStream::connect(&listen).await.is_ok()
            };
            ok.then_some(())
        })
        .await;
        assert!(
            up.is_some(),
            "php-fpm never listened on {}: {}",
            self.listen,
            self.log()
        );
    }

    /// php-fpm's own log.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fpm.log")).unwrap_or_default()
    }

    /// Stops php-fpm and waits until it is gone: SIGTERM, which the master passes on to its
    /// workers (a SIGKILL would leave them serving on the socket they inherited); SIGKILL
    /// after the wait limit.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = wait::poll_blocking(400, Duration::from_millis(25), || {
            child.try_wait().ok().flatten()
        });
        if exited.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PhpFpm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port nothing listens on now, for php-fpm to take.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// pinlb in front of `backends`, `protocol = "fastcgi"` with `fastcgi` as the table's keys.
fn config(backends: &[String], root: &Path, upstream: &str, fastcgi: &str) -> String {
    let list: String = backends
        .iter()
        .map(|b| format!("  {{ address = \"{b}\" }},\n"))
        .collect();
    format!(
        r#"[runtime]
cpus = [{cpu}]

[[listener]]
address = "127.0.0.1:0"
upstream = "php"

[upstream.php]
protocol = "fastcgi"
keepalive = 8
{upstream}
backends = [
{list}]

[upstream.php.fastcgi]
root = "{root}"
{fastcgi}
"#,
        cpu = first_core(),
        root = root.display(),
    )
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test]
async fn a_get_with_a_query_runs_its_script_with_nginxs_params() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    let mut req = request(Method::GET, "/q.php?name=ada&n=2", empty());
    req.headers_mut().insert("x-test", "yes".parse().unwrap());
    req.headers_mut()
        .insert("proxy", "http://evil:1".parse().unwrap());
    req.headers_mut()
        .insert("host", "shop.example".parse().unwrap());
    let reply = Conn::open(proxy.addr).await.fetch(req).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.headers["content-type"], "application/json");
    let v = json(&reply.body);
    assert_eq!(v["get"]["name"], "ada");
    assert_eq!(v["get"]["n"], "2");
    assert_eq!(v["script"], "/q.php");
    assert_eq!(
        v["filename"],
        fpm.root().join("q.php").display().to_string()
    );
    assert_eq!(v["uri"], "/q.php?name=ada&n=2");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["header"], "yes");
    assert_eq!(v["host"], "shop.example");
    assert_eq!(v["remote"], "127.0.0.1");
    // httpoxy: the client's Proxy header never becomes the application's HTTP_PROXY.
    assert!(v["proxy"].is_null(), "{v}");
    // A directory gets its index script.
    let reply = get(proxy.addr, "/sub/").await;
    assert_eq!(reply.body, "index of /sub/index.php");
}

#[tokio::test]
async fn split_path_info_and_a_front_controller_name_the_script() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let split = r#"split_path_info = '^(.+\.php)(/.+)$'"#;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", split));
    let v = json(&get(proxy.addr, "/q.php/users/7?x=1").await.body);
    assert_eq!(v["script"], "/q.php");
    assert_eq!(v["path_info"], "/users/7");
    let front = Proxy::start_toml(&config(
        &[fpm.addr()],
        &fpm.root(),
        "",
        r#"script = "/q.php""#,
    ));
    let v = json(&get(front.addr, "/users/7?x=1").await.body);
    assert_eq!(v["script"], "/q.php");
    assert_eq!(v["uri"], "/users/7?x=1");
    assert_eq!(v["get"]["x"], "1");
}

#[tokio::test]
async fn a_posted_form_reaches_post_by_length_and_chunked() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    let mut req = request(Method::POST, "/post.php", full("a=1&b=two+words"));
    req.headers_mut().insert(
        "content-type",
        "application/x-www-form-urlencoded".parse().unwrap(),
    );
    let reply = Conn::open(proxy.addr).await.fetch(req).await;
    let v = json(&reply.body);
    assert_eq!(v["post"]["a"], "1");
    assert_eq!(v["post"]["b"], "two words");
    assert_eq!(v["length"], "15");
    // A chunked body is read whole first: PHP needs its CONTENT_LENGTH.
    let raw = raw_request(
        proxy.addr,
        b"POST /post.php HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n5\r\na=1&b\r\n3\r\n=22\r\n0\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(raw.status, 200);
    let v = json(&String::from_utf8_lossy(&raw.body));
    assert_eq!(v["post"]["a"], "1");
    assert_eq!(v["post"]["b"], "22");
    assert_eq!(v["length"], "8");
}

#[tokio::test]
async fn a_chunked_body_over_its_bound_is_413() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(
        &[fpm.addr()],
        &fpm.root(),
        "",
        "chunked_body_max = 4",
    ));
    let raw = raw_request(
        proxy.addr,
        b"POST /post.php HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(raw.status, 413);
}

#[tokio::test]
async fn a_file_upload_reaches_files_whole() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    // 300 KiB: several STDIN records.
    let content: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
    let boundary = "xyzBOUNDARYzyx";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"doc\"; filename=\"data.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
    );
    body.extend_from_slice(&content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let mut req = request(Method::POST, "/upload.php", full(body));
    req.headers_mut().insert(
        "content-type",
        format!("multipart/form-data; boundary={boundary}")
            .parse()
            .unwrap(),
    );
    let reply = Conn::open(proxy.addr).await.fetch(req).await;
    let v = json(&reply.body);
    assert_eq!(v["name"], "data.bin");
    assert_eq!(v["error"], 0);
    assert_eq!(v["size"], content.len());
    assert_eq!(v["note"], "hello");
    let md5 = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(&content)?;
            c.wait_with_output()
        })
        .expect("md5sum");
    let md5 = String::from_utf8_lossy(&md5.stdout);
    assert_eq!(v["md5"], md5.split_whitespace().next().unwrap_or_default());
}

#[tokio::test]
async fn status_and_headers_set_by_the_script_reach_the_client() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    let mut conn = Conn::open(proxy.addr).await;
    let reply = conn.get("/status.php").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.headers["x-app"], "made");
    let cookies: Vec<_> = reply.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(reply.body, "created");
    let reply = conn.get("/teapot.php").await;
    assert_eq!(reply.status.as_u16(), 418);
    assert_eq!(reply.body, "short and stout");
    let reply = conn.get("/redirect.php").await;
    assert_eq!(reply.status, StatusCode::FOUND);
    assert_eq!(reply.headers["location"], "/elsewhere");
    // php-fpm's own answer for a script that is not there.
    let reply = conn.get("/missing.php").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_large_response_streams_whole() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    let raw = raw_request(
        proxy.addr,
        b"GET /big.php HTTP/1.1\r\nHost: x\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(raw.status, 200);
    // PHP gave no length: chunked to the client.
    assert_eq!(raw.header("transfer-encoding"), Some("chunked"));
    let line = b"0123456789abcdef".repeat(4096);
    assert_eq!(raw.body.len(), 128 * line.len());
    assert!(raw.body.chunks(line.len()).all(|c| c == line));
}

#[tokio::test]
async fn a_fatal_error_is_phps_500_and_its_message_is_logged_at_the_backend() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let mut proxy = BinProxy::spawn_toml(&config(&[fpm.addr()], &fpm.root(), "", ""), &[]).await;
    let reply = get(proxy.addr, "/fatal.php").await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    let line = proxy.wait_for_log("FastCGI stderr").await;
    assert!(line.contains(&fpm.addr()), "{line}");
    proxy.wait_for_log("Call to undefined function").await;
}

#[tokio::test]
async fn a_worker_that_dies_before_answering_is_a_502() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    let reply = get(proxy.addr, "/die.php").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    // The pool's other worker (and the replacement) go on serving.
    let reply = get(proxy.addr, "/sub/").await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn php_fpm_stopped_is_retried_then_502() {
    let Some(bin) = php_fpm() else { return };
    let mut down = PhpFpm::start(&bin).await;
    let up = PhpFpm::start(&bin).await;
    let backends = [down.addr(), up.addr()];
    // Both pools serve the same scripts from their own roots; root is the first's, so the
    // second's scripts are read from the first's directory, which stays.
    let proxy = Proxy::start_toml(&config(&backends, &down.root(), "", ""));
    down.stop();
    for _ in 0..4 {
        let reply = get(proxy.addr, "/sub/").await;
        assert_eq!(reply.status, StatusCode::OK, "retried on the running pool");
    }
    let mut up = up;
    up.stop();
    // Every backend refuses: the last refusal is the answer (503 once health checks have
    // taken them down, see the next test).
    let reply = get(proxy.addr, "/sub/").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
}

#[tokio::test]
async fn health_checks_go_through_fastcgi_to_php_fpms_ping() {
    let Some(bin) = php_fpm() else { return };
    let mut fpm = PhpFpm::start(&bin).await;
    let health = "[upstream.php.health]\npath = \"/ping\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nfall = 1\nrise = 1\n\n[admin]\naddress = \"127.0.0.1:0\"\n";
    let text = config(&[fpm.addr()], &fpm.root(), "", "") + health;
    let proxy = Proxy::start_toml(&text);
    let check = async |passed: bool| {
        let s = proxy.status().await;
        let c = s["upstreams"][0]["backends"][0]["last_check"].clone();
        (c["passed"] == passed).then_some(c)
    };
    // php-fpm's ping.path answers the probe's FastCGI request itself.
    let passed = wait::poll(50, Duration::from_millis(100), async || check(true).await).await;
    assert!(passed.is_some(), "no probe passed: {}", fpm.log());
    assert_eq!(get(proxy.addr, "/sub/").await.status, StatusCode::OK);
    fpm.stop();
    let failed = wait::poll(50, Duration::from_millis(100), async || check(false).await).await;
    assert!(failed.is_some(), "no probe failed with php-fpm stopped");
    // The only backend is down: nothing to try.
    let refused = wait::poll(50, Duration::from_millis(100), async || {
        let r = get(proxy.addr, "/sub/").await;
        (r.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
    assert!(refused.is_some(), "the backend never went down");
}

/// A relay in front of php-fpm that counts the connections it accepts.
async fn counting_relay(to: String) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let addr = l.local_addr().expect("relay addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn one_php_fpm_connection_serves_request_after_request() {
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let (relay, accepted) = counting_relay(fpm.addr()).await;
    let proxy = Proxy::start_toml(&config(&[relay.to_string()], &fpm.root(), "", ""));
    let mut pids = Vec::new();
    for _ in 0..5 {
        // A new client connection each time: only pinlb's pool links the requests.
        let v = json(&get(proxy.addr, "/q.php").await.body);
        pids.push(v["pid"].clone());
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "FCGI_KEEP_CONN reuses the connection"
    );
    // php-fpm's worker stays with the connection it accepted.
    assert!(pids.windows(2).all(|w| w[0] == w[1]), "{pids:?}");
}

#[tokio::test]
async fn php_fpm_on_a_unix_socket() {
    let Some(bin) = php_fpm() else { return };
    let dir = tempfile::tempdir().expect("socket dir");
    let sock = dir.path().join("php.sock").display().to_string();
    let fpm = PhpFpm::start_on(&bin, sock).await;
    let proxy = Proxy::start_toml(&config(&[fpm.addr()], &fpm.root(), "", ""));
    let v = json(&get(proxy.addr, "/q.php?via=socket").await.body);
    assert_eq!(v["get"]["via"], "socket");
}

/// `[upstream.NAME.buffering]` drains a FastCGI answer as nginx's `fastcgi_buffering` does:
/// while one client has read nothing of an 8 MiB response, php-fpm's only slot (`max_conns = 1`)
/// is already free, so the next request, waiting in the queue for it, is answered; and the
/// first client still gets every byte once it reads. Without buffering the second request
/// would wait in the queue until `timeouts.queue` and get 503.
#[tokio::test]
async fn a_buffered_response_frees_php_fpm_before_the_client_reads() {
    use tokio::io::AsyncWriteExt;
    let Some(bin) = php_fpm() else { return };
    let fpm = PhpFpm::start(&bin).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let upstream = "max_conns = 1\nqueue = 8";
    let toml = config(&[fpm.addr()], &fpm.root(), upstream, "")
        + &format!(
            "\n[upstream.php.buffering]\nmemory = \"16KiB\"\ntemp_dir = \"{}\"\n",
            dir.path().display()
        );
    let proxy = Proxy::start_toml(&toml);
    // A small receive window, so that pinlb's socket to this client cannot take the 8 MiB
    // either: unbuffered, the response would stay on php-fpm's connection.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut slow = tokio::io::BufReader::new(socket.connect(proxy.addr).await.expect("connect"));
    slow.get_mut()
        .write_all(b"GET /big.php HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    // Its head has come: php-fpm is answering it, in the one slot there is.
    let head = tokio::time::timeout(Duration::from_secs(20), read_head(&mut slow))
        .await
        .expect("the big response's head");
    assert_eq!(head.status, 200);
    let next = tokio::time::timeout(Duration::from_secs(20), get(proxy.addr, "/q.php?next=1"))
        .await
        .expect("the queued request answered while the first client reads nothing");
    assert_eq!(next.status, StatusCode::OK, "{}", next.body);
    let mut rest = Vec::new();
    use tokio::io::AsyncReadExt;
    tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest))
        .await
        .expect("the buffered response in time")
        .expect("read");
    let body = dechunk(&rest);
    let line = b"0123456789abcdef".repeat(4096);
    assert_eq!(body.len(), 128 * line.len());
    assert!(body.chunks(line.len()).all(|c| c == line));
}

/// A chunked body, as the test reads it whole: sizes in hex, then the data, to the last chunk.
fn dechunk(mut buf: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    // Bounded by the buffer: every pass takes a chunk, or ends.
    while let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&buf[..eol]).expect("size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex size");
        if size == 0 {
            break;
        }
        out.extend_from_slice(&buf[eol + 2..eol + 2 + size]);
        buf = &buf[eol + 4 + size..];
    }
    out
}
