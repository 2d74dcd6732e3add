//! `error_page` and `intercept_errors` end to end, with curl: pinlb's own 4xx and 5xx answered
//! with the pages read from their files (502 refused, 503 queue, 504 slow, 404 no route, 400
//! malformed, 408 slow head, 413 body), a route's pages over the listener's, a backend's own
//! errors intercepted, HEAD, HTTP/2, a reload that changes a file, and the config errors.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use http::Method;

/// What curl said: the status, the header lines (lower-cased names) and the body.
#[derive(Debug)]
struct Curl {
    status: u16,
    headers: String,
    body: String,
}

impl Curl {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Runs curl with `args` on a blocking thread (the backends run on this runtime).
async fn curl(args: &[&str]) -> Curl {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
    // `--head` writes the head to stdout itself.
    if !args.contains(&"--head") {
        cmd.args(["-D", "-"]);
    }
    cmd.args(args);
    let what = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run curl"))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (rest, status) = stdout.rsplit_once('\n').expect("curl's -w output");
    let (headers, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
    Curl {
        status: status.trim().parse().expect("a status"),
        headers: headers.to_string(),
        body: body.to_string(),
    }
}

/// A fresh directory for a test's page files.
fn pages_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pinlb-pages-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `dir/name` and returns the path, as TOML can hold it.
fn page(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

const HTML: &str = "text/html; charset=utf-8";

/// A listener with pages for 502/503/504 (HTML), 404 (plain text) and 400/413 (JSON), no
/// default upstream (404 when no route matches), and a route for each way pinlb fails.
fn own_errors_config(
    dir: &std::path::Path,
    gone: SocketAddr,
    ok: SocketAddr,
    slow: SocketAddr,
) -> String {
    format!(
        r#"[runtime]
cpus = [{core}]

[limits]
max_body = "10"
header_timeout = "300ms"

[[listener]]
address = "127.0.0.1:0"

[[listener.error_page]]
status = [502, 503, 504]
file = "{x50}"

[[listener.error_page]]
status = 404
file = "{notfound}"

[[listener.error_page]]
status = [400, 408, 413]
file = "{bad}"

[[listener.route]]
path = "/gone/"
upstream = "gone"

[[listener.route]]
path = "/busy/"
upstream = "busy"

[[listener.route]]
path = "/slow/"
upstream = "slow"
timeouts = {{ response = "200ms" }}

[[listener.route]]
path = "/ok/"
upstream = "ok"

[upstream.gone]
backends = [{{ address = "{gone}" }}]

[upstream.busy]
backends = [{{ address = "{slow}", max_conns = 1 }}]
queue = 1

[upstream.busy.timeouts]
queue = "100ms"

[upstream.slow]
backends = [{{ address = "{slow}" }}]

[upstream.ok]
backends = [{{ address = "{ok}" }}]
"#,
        core = first_core(),
        x50 = page(dir, "50x.html", "<h1>we are sorry</h1>\n"),
        notfound = page(dir, "404.txt", "nothing here\n"),
        bad = page(dir, "bad.json", "{\"error\": \"bad request\"}\n"),
    )
}

#[tokio::test]
async fn pinlbs_own_errors_are_answered_with_the_listeners_pages() {
    let dir = pages_dir("own");
    let ok = Backend::start("ok").await;
    let slow = Backend::start_with_delay("slow", Duration::from_secs(5)).await;
    // Held for the test: the port stays reserved and refusing.
    let gone = Refusing::new();
    let proxy = Proxy::start_toml(&own_errors_config(&dir, gone.addr, ok.addr, slow.addr));
    let url = |p: &str| format!("http://{}{p}", proxy.addr);

    // 502: the backend's port refuses.
    let c = curl(&[&url("/gone/x")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (502, "<h1>we are sorry</h1>\n"),
        "{c:?}"
    );
    assert_eq!(c.header("content-type"), Some(HTML));
    assert_eq!(c.header("content-length"), Some("22"));

    // 504: the backend sends no head within the route's timeouts.response.
    let c = curl(&[&url("/slow/x")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (504, "<h1>we are sorry</h1>\n"),
        "{c:?}"
    );
    assert_eq!(c.header("content-type"), Some(HTML));

    // 503: the only backend is at max_conns with a request that holds it, and the next one
    // waits out timeouts.queue. Its Retry-After stays.
    let held = tokio::spawn(curl_owned(url("/busy/held")));
    slow.wait_for_hits(2).await;
    let c = curl(&[&url("/busy/x")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (503, "<h1>we are sorry</h1>\n"),
        "{c:?}"
    );
    assert_eq!(c.header("content-type"), Some(HTML));
    assert_eq!(c.header("retry-after"), Some("1"), "{c:?}");
    held.abort();

    // 404: no route matches.
    let c = curl(&[&url("/nowhere")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (404, "nothing here\n"),
        "{c:?}"
    );
    assert_eq!(c.header("content-type"), Some("text/plain; charset=utf-8"));

    // 413: a body over limits.max_body.
    let c = curl(&["--data", "0123456789abcdef", &url("/ok/up")]).await;
    assert_eq!(c.status, 413, "{c:?}");
    assert_eq!(c.body, "{\"error\": \"bad request\"}\n");
    assert_eq!(c.header("content-type"), Some("application/json"));
    assert_eq!(
        ok.hits(),
        0,
        "the body was refused before the backend saw it"
    );

    // A HEAD gets the page's headers without its body.
    let c = curl(&["--head", &url("/nowhere")]).await;
    assert_eq!((c.status, c.body.as_str()), (404, ""), "{c:?}");
    assert_eq!(c.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(c.header("content-length"), Some("13"));

    // 400: a malformed head, written raw.
    let r = raw_request(
        proxy.addr,
        b"GET /ok/ HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.body, b"{\"error\": \"bad request\"}\n");

    // 408: a head that stops coming, past limits.header_timeout.
    let mut conn = RawConn::open(proxy.addr).await;
    let r = conn
        .exchange(b"GET /ok/ HTTP/1.1\r\nHost: a\r\n", false)
        .await;
    assert_eq!(r.status, 408, "{}", r.head);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.body, b"{\"error\": \"bad request\"}\n");
    let _ = std::fs::remove_dir_all(dir);
}

async fn curl_owned(url: String) -> Curl {
    curl(&[&url]).await
}

#[tokio::test]
async fn a_routes_own_pages_replace_the_listeners_whole() {
    let dir = pages_dir("route");
    let gone = Refusing::new();
    let toml = format!(
        r#"[runtime]
cpus = [{core}]

[[listener]]
address = "127.0.0.1:0"

[[listener.error_page]]
status = [404, 502]
file = "{listener}"

[[listener.route]]
path = "/own/"
upstream = "gone"

[[listener.route.error_page]]
status = 502
file = "{own}"
content_type = "text/x-own"

[[listener.route]]
path = "/none/"
upstream = "gone"
error_page = []

[[listener.route]]
path = "/inherits/"
upstream = "gone"

[[listener.route]]
path = "/plain/"
respond = {{ status = 404 }}

[[listener.route]]
path = "/texted/"
respond = {{ status = 404, body = "its own\n" }}

[upstream.gone]
backends = [{{ address = "{gone}" }}]
"#,
        core = first_core(),
        listener = page(&dir, "listener.html", "listener's page\n"),
        own = page(&dir, "own.page", "route's page\n"),
        gone = gone.addr,
    );
    let proxy = Proxy::start_toml(&toml);
    let url = |p: &str| format!("http://{}{p}", proxy.addr);

    let c = curl(&[&url("/own/x")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (502, "route's page\n"),
        "{c:?}"
    );
    assert_eq!(c.header("content-type"), Some("text/x-own"));
    let c = curl(&[&url("/inherits/x")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (502, "listener's page\n"),
        "{c:?}"
    );
    assert_eq!(c.header("content-type"), Some(HTML));
    // An empty list of its own: pinlb's own text, as nginx's location inherits none.
    let c = curl(&[&url("/none/x")]).await;
    assert_eq!(c.status, 502, "{c:?}");
    assert!(c.body.starts_with("502 Bad Gateway: "), "{c:?}");
    assert_eq!(c.header("content-type"), Some("text/plain; charset=utf-8"));
    let c = curl(&[&url("/elsewhere")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (404, "listener's page\n"),
        "{c:?}"
    );
    // A `respond` without a body gets its status's page, as nginx's `return 404;`; with one,
    // its own, as `return 404 "text";`.
    let c = curl(&[&url("/plain/")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (404, "listener's page\n"),
        "{c:?}"
    );
    let c = curl(&[&url("/texted/")]).await;
    assert_eq!((c.status, c.body.as_str()), (404, "its own\n"), "{c:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A backend that answers `/STATUS` with that status, a body and a header of its own.
async fn status_backend() -> RawServer {
    RawServer::start(|seen| {
        let path = seen.head.split(' ').nth(1).unwrap_or("/");
        let status: u16 = (path.trim_start_matches('/').split('/').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        RawAction::Respond(raw_status("app", status))
    })
    .await
}

#[tokio::test]
async fn intercept_errors_replaces_a_backends_500_and_leaves_its_200_and_unpaged_404() {
    let dir = pages_dir("intercept");
    let app = status_backend().await;
    let toml = format!(
        r#"[runtime]
cpus = [{core}]

[[listener]]
address = "127.0.0.1:0"
upstream = "app"
intercept_errors = true

[[listener.error_page]]
status = [500, 502]
file = "{x50}"

[[listener.route]]
path = "/passed/"
upstream = "app"
rewrite_prefix = "/"
intercept_errors = false

[upstream.app]
backends = [{{ address = "{app}" }}]
"#,
        core = first_core(),
        x50 = page(&dir, "50x.html", "<p>oops</p>\n"),
        app = app.addr,
    );
    let proxy = Proxy::start_toml(&toml);
    let url = |p: &str| format!("http://{}{p}", proxy.addr);

    let c = curl(&[&url("/500")]).await;
    assert_eq!((c.status, c.body.as_str()), (500, "<p>oops</p>\n"), "{c:?}");
    assert_eq!(c.header("content-type"), Some(HTML));
    assert_eq!(
        c.header("x-backend"),
        None,
        "the backend's own headers are dropped"
    );

    let c = curl(&[&url("/200")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (200, "status 200 from app\n"),
        "{c:?}"
    );
    assert_eq!(c.header("x-backend"), Some("app"));
    let c = curl(&[&url("/404")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (404, "status 404 from app\n"),
        "{c:?}"
    );
    // A route that turns it off passes the backend's 500 through.
    let c = curl(&[&url("/passed/500")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (500, "status 500 from app\n"),
        "{c:?}"
    );
    assert_eq!(c.header("x-backend"), Some("app"));
    // The intercepted 500's body was dropped unread, and its connection with it; the others
    // went over one kept-alive connection.
    assert_eq!(app.accepts(), 2);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn http2_clients_get_the_pages_too() {
    let dir = pages_dir("h2");
    let gone = Refusing::new();
    let app = status_backend().await;
    let toml = format!(
        r#"[runtime]
cpus = [{core}]

[[listener]]
address = "127.0.0.1:0"
h2c = true
intercept_errors = true

[[listener.error_page]]
status = [404, 500, 502]
file = "{x50}"

[[listener.route]]
path = "/gone/"
upstream = "gone"

[[listener.route]]
path = "/app/"
upstream = "app"
rewrite_prefix = "/"

[upstream.gone]
backends = [{{ address = "{gone}" }}]

[upstream.app]
backends = [{{ address = "{app}" }}]
"#,
        core = first_core(),
        x50 = page(&dir, "50x.html", "<p>h2 page</p>\n"),
        gone = gone.addr,
        app = app.addr,
    );
    let proxy = Proxy::start_toml(&toml);
    let url = |p: &str| format!("http://{}{p}", proxy.addr);
    for (path, status) in [("/gone/x", 502), ("/nowhere", 404), ("/app/500", 500)] {
        let c = curl(&["--http2-prior-knowledge", &url(path)]).await;
        assert!(c.headers.starts_with("HTTP/2 "), "{c:?}");
        assert_eq!(
            (c.status, c.body.as_str()),
            (status, "<p>h2 page</p>\n"),
            "{c:?}"
        );
        assert_eq!(c.header("content-type"), Some(HTML), "{c:?}");
    }
    let c = curl(&["--http2-prior-knowledge", "--head", &url("/gone/x")]).await;
    assert_eq!((c.status, c.body.as_str()), (502, ""), "{c:?}");
    assert_eq!(c.header("content-type"), Some(HTML));
    let c = curl(&["--http2-prior-knowledge", &url("/app/200")]).await;
    assert_eq!(
        (c.status, c.body.as_str()),
        (200, "status 200 from app\n"),
        "{c:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_reload_reads_the_page_file_again() {
    let dir = pages_dir("reload");
    let file = page(&dir, "404.html", "first\n");
    let toml = format!(
        r#"[runtime]
cpus = [{core}]

[admin]
address = "127.0.0.1:0"

[[listener]]
address = "127.0.0.1:0"

[[listener.error_page]]
status = 404
file = "{file}"

[[listener.route]]
path = "/app/"
respond = {{ status = 200, body = "ok\n" }}

[upstream.unused]
backends = [{{ address = "127.0.0.1:1" }}]
"#,
        core = first_core(),
    );
    let proxy = Proxy::start_file(&toml);
    let url = format!("http://{}/nowhere", proxy.addr);
    let c = curl(&[&url]).await;
    assert_eq!((c.status, c.body.as_str()), (404, "first\n"), "{c:?}");

    std::fs::write(&file, "second, longer\n").unwrap();
    // The file is read at load: until the reload, the page stays.
    let c = curl(&[&url]).await;
    assert_eq!(c.body, "first\n");
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = poll(50, Duration::from_millis(20), async || {
        let c = curl(&[&url]).await;
        (c.body == "second, longer\n").then_some(c)
    })
    .await
    .expect("the new page after the reload");
    assert_eq!(seen.header("content-length"), Some("15"));

    // A reload whose page file is gone fails, naming the file's key; the page that runs stays.
    std::fs::remove_file(&file).unwrap();
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_ne!(r.status, 200, "{}", r.body);
    assert!(
        r.body
            .contains("listener[0].error_page[0].file: cannot read"),
        "{}",
        r.body
    );
    let c = curl(&[&url]).await;
    assert_eq!(c.body, "second, longer\n");
    let _ = std::fs::remove_dir_all(dir);
}

/// The error `check` gives for a listener with `pages` (its TOML, `[[listener.error_page]]`
/// tables or a route's).
fn config_error(pages: &str) -> String {
    let toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"a\"\n{pages}\n[upstream.a]\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n"
    );
    match pinlb::Config::parse("test.toml", &toml, &allowed()) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_pages_are_config_errors_at_their_place() {
    let dir = pages_dir("bad");
    let ok = page(&dir, "ok.html", "ok");
    let missing = dir.join("missing.html");
    let missing = missing.to_str().unwrap();

    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = 502\nfile = \"{missing}\"\n"
    ));
    assert!(
        e.starts_with(&format!(
            "test.toml:6:8: listener[0].error_page[0].file: cannot read \"{missing}\""
        )),
        "{e}"
    );
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = [502, 302]\nfile = \"{ok}\"\n"
    ));
    assert!(
        e.starts_with("test.toml:5:10: listener[0].error_page[0].status: 302 is not an error status, expected statuses from 400 to 599"),
        "{e}"
    );
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = 600\nfile = \"{ok}\"\n"
    ));
    assert!(e.contains("600 is not an error status"), "{e}");
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = [502, 503]\nfile = \"{ok}\"\n[[listener.error_page]]\nstatus = 503\nfile = \"{ok}\"\n"
    ));
    assert!(
        e.starts_with("test.toml:8:10: listener[0].error_page[1].status: 503 has a page already"),
        "{e}"
    );
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = [404, 404]\nfile = \"{ok}\"\n"
    ));
    assert!(e.contains("404 is listed twice"), "{e}");
    let noext = page(&dir, "page", "x");
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = 404\nfile = \"{noext}\"\n"
    ));
    assert!(
        e.contains("error_page[0].file: no content type known"),
        "{e}"
    );
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = 404\nfile = \"{ok}\"\ncontent_type = \"a\\nb\"\n"
    ));
    assert!(e.contains("error_page[0].content_type: "), "{e}");
    let big = page(
        &dir,
        "big.html",
        &"a".repeat(pinlb::config::MAX_PAGE_BYTES as usize + 1),
    );
    let e = config_error(&format!(
        "[[listener.error_page]]\nstatus = 404\nfile = \"{big}\"\n"
    ));
    assert!(e.contains("is over 1048576 bytes"), "{e}");
    // A route's page is checked the same way, at its own key.
    let e = config_error(&format!(
        "[[listener.route]]\npath = \"/a/\"\nupstream = \"a\"\n[[listener.route.error_page]]\nstatus = 502\nfile = \"{missing}\"\n"
    ));
    assert!(
        e.starts_with("test.toml:9:8: listener[0].route[0].error_page[0].file: cannot read"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
