//! The admin status page in a real headless browser (Debian's `chromium`; `scripts/test`
//! installs it): it loads, shows every backend, and updates in place when one goes down; its
//! first paint already has the rates, counts with separators, numbers on the in-flight bars, the
//! chart of a learning backend's limit, and no value broken over two lines.
//!
//! The tests drive chromium over the DevTools protocol: they read the page's DOM with
//! `Runtime.evaluate`, so what they check is what a person would see, and the first-paint test
//! saves a screenshot of it (`status-first-paint.png` under the target's test scratch folder).

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// A headless chromium with its DevTools endpoint; killed on drop.
struct Chromium {
    child: Child,
    profile: std::path::PathBuf,
    /// `ws://127.0.0.1:PORT/devtools/browser/...`
    devtools: String,
}

impl Chromium {
    fn start(url: &str) -> Chromium {
        // One profile per browser: two chromiums on one profile directory refuse to start.
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let profile = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("chromium-{}-{n}", std::process::id()));
        // Its temporary files (the profile's lock socket among them) inside the profile, which
        // the drop removes: a killed chromium cleans up nothing itself, and each run left a
        // directory in /tmp.
        let tmp = profile.join("tmp");
        std::fs::create_dir_all(&tmp).expect("make the browser's temporary directory");
        let mut child = Command::new("chromium")
            .env("TMPDIR", &tmp)
            .args([
                "--headless=new",
                // Tests run as root in CI, where chromium's sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                // Wide enough for the backend table's columns, as on a desktop screen.
                "--window-size=1600,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium (Debian package `chromium`; scripts/test installs it)");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("ws://") {
                    let _ = tx.send(line[at..].trim().to_string());
                }
            }
        });
        let devtools = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium never printed its DevTools address");
        Chromium {
            child,
            profile,
            devtools,
        }
    }

    /// The DevTools WebSocket of the page chromium opened.
    async fn page(&self) -> Page {
        let port: u16 = self
            .devtools
            .trim_start_matches("ws://127.0.0.1:")
            .split('/')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("DevTools port");
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        // DevTools answers only a Host that is an IP address or localhost.
        let mut req = request(http::Method::GET, "/json/list", empty());
        req.headers_mut()
            .insert("host", format!("127.0.0.1:{port}").parse().unwrap());
        let listed = Conn::open(addr).await.fetch(req).await;
        let list: Value = serde_json::from_str(&listed.body)
            .unwrap_or_else(|e| panic!("{e}: {} {}", listed.status, listed.body));
        let url = list
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .expect("connect to the page's DevTools");
        Page { ws, next_id: 1 }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

struct Page {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Page {
    /// Evaluates `expression` in the page and returns its value.
    async fn eval(&mut self, expression: &str) -> Value {
        let params = json!({ "expression": expression, "returnByValue": true });
        self.call("Runtime.evaluate", params).await["result"]["value"].clone()
    }

    /// [`Page::eval`] while the page may be navigating: an evaluation that the navigation cut
    /// off ("Inspected target navigated or closed") is `null`, to be asked again.
    async fn eval_navigating(&mut self, expression: &str) -> Value {
        let params = json!({ "expression": expression, "returnByValue": true });
        match self.try_call("Runtime.evaluate", params).await {
            Ok(result) => result["result"]["value"].clone(),
            Err(e)
                if e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("navigated")) =>
            {
                Value::Null
            }
            Err(e) => panic!("Runtime.evaluate: {e}"),
        }
    }

    /// Sends one DevTools command and returns its `result`.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params).await {
            Ok(result) => result,
            Err(e) => panic!("{method}: {e}"),
        }
    }

    /// Sends one DevTools command and returns its `result`, or its `error`.
    async fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        let cmd = json!({ "id": id, "method": method, "params": params });
        self.ws
            .send(Message::text(cmd.to_string()))
            .await
            .expect("send to DevTools");
        // Events may come first; bounded by the wait limit.
        tokio::time::timeout(WAIT, async {
            while let Some(msg) = self.ws.next().await {
                let Ok(Message::Text(text)) = msg else {
                    continue;
                };
                let v: Value = serde_json::from_str(&text).unwrap();
                if v["id"] == id {
                    return match v["error"].is_null() {
                        true => Ok(v["result"].clone()),
                        false => Err(v["error"].clone()),
                    };
                }
            }
            panic!("DevTools closed the connection");
        })
        .await
        .expect("no DevTools reply in time")
    }

    /// Evaluates `expression` every 100 ms until `done` accepts its value (at most 100 times),
    /// through any navigation under way.
    async fn eval_until(&mut self, expression: &str, done: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let shown = poll(100, Duration::from_millis(100), async || {
            last = self.eval_navigating(expression).await;
            done(&last).then(|| last.clone())
        })
        .await;
        shown.unwrap_or_else(|| panic!("the page never showed what was expected; last: {last}"))
    }
}

/// `[[address, state], ...]` of the backend rows, as the page shows them.
const ROWS: &str = "JSON.stringify([...document.querySelectorAll('tr.backend')]\
    .map(r => [r.dataset.address, r.querySelector('.state').textContent]))";

fn rows(v: &Value) -> Vec<(String, String)> {
    serde_json::from_str(v.as_str().unwrap_or("[]")).unwrap_or_default()
}

#[tokio::test]
async fn the_status_page_shows_every_backend_and_updates_in_place_when_one_goes_down() {
    let a = Backend::start("a").await;
    let mut b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let mut setup = Setup::with(&[a.addr, b.addr, c.addr]);
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\n\n\
                   [upstream.app.health]\npath = \"/health\"\ninterval = \"200ms\"\n\
                   timeout = \"100ms\"\nrise = 1\nfall = 1\n"
        .into();
    let proxy = Proxy::start(&setup);
    let admin = proxy.admin.unwrap();

    let browser = Chromium::start(&format!("http://{admin}/"));
    let mut page = browser.page().await;
    let shown = page
        .eval_until(ROWS, |v| {
            let r = rows(v);
            r.len() == 3 && r.iter().all(|(_, s)| s == "up")
        })
        .await;
    let addrs: Vec<String> = rows(&shown).into_iter().map(|(a, _)| a).collect();
    assert_eq!(
        addrs,
        [a.addr.to_string(), b.addr.to_string(), c.addr.to_string()]
    );
    let workers = page
        .eval("document.querySelectorAll('#workers tbody tr').length")
        .await;
    assert_eq!(workers, 1);
    // Each row says when its last health check passed.
    page.eval_until(
        "document.querySelectorAll('tr.backend td.check.passed').length",
        |v| v == 3,
    )
    .await;
    // A mark on this page load: if the page reloaded instead of updating, it would be gone.
    page.eval("window.pinlbTestMark = 42").await;

    b.kill().await;
    let after = page
        .eval_until(ROWS, |v| {
            rows(v)
                .iter()
                .any(|(addr, s)| *addr == b.addr.to_string() && s == "down")
        })
        .await;
    let states: Vec<String> = rows(&after).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, ["up", "down", "up"]);
    assert_eq!(page.eval("window.pinlbTestMark").await, 42);
    let colour = page
        .eval("getComputedStyle(document.querySelectorAll('tr.backend .state')[1]).backgroundColor")
        .await;
    assert_eq!(colour, "rgb(192, 57, 43)", "a down backend is shown red");
}

#[tokio::test]
async fn the_status_page_shows_the_last_minute_and_its_drain_button_drains_with_the_token() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\ntoken = \"s3cret\"\n".into();
    let proxy = Proxy::start(&setup);
    let admin = proxy.admin.unwrap();
    for _ in 0..10 {
        assert_eq!(get(proxy.addr, "/").await.status, http::StatusCode::OK);
    }

    // The token goes into the tab's session storage on a page of the admin origin that asks
    // for nothing (a 401 in plain text), as the page's own prompt would leave it.
    let browser = Chromium::start(&format!("http://{admin}/nope"));
    let mut page = browser.page().await;
    // Chromium may still show about:blank when DevTools first answers: storage is per origin.
    page.eval_until(
        "location.pathname === '/nope' && document.readyState === 'complete'",
        |v| *v == Value::Bool(true),
    )
    .await;
    page.eval_navigating("sessionStorage.setItem('pinlb-token', 's3cret'); location.href = '/'; 1")
        .await;
    page.eval_until(ROWS, |v| {
        let r = rows(v);
        r.len() == 2 && r.iter().all(|(_, s)| s == "up")
    })
    .await;
    let version = page
        .eval("document.getElementById('version').textContent")
        .await;
    assert_eq!(
        version.as_str().unwrap_or_default(),
        format!("{} (debug)", env!("CARGO_PKG_VERSION"))
    );
    // The listener's row counts the ten requests and their 2xx.
    let listener = page
        .eval_until(
            "JSON.stringify([...document.querySelectorAll('tr.listener td')].map(td => td.textContent))",
            |v| v.as_str().is_some_and(|s| s.contains("\"10\"")),
        )
        .await;
    let cells: Vec<String> = serde_json::from_str(listener.as_str().unwrap()).unwrap();
    assert_eq!(cells[0], format!("http://{}", proxy.addr));
    assert_eq!(
        (cells[1].as_str(), cells[3].as_str(), cells[6].as_str()),
        ("app", "10", "10")
    );
    // Each backend served five in the last minute: its p50 is a number, not "–".
    let p50 = page
        .eval("[...document.querySelectorAll('tr.backend td.p50')].map(td => td.textContent).join(' ')")
        .await;
    assert!(
        p50.as_str()
            .is_some_and(|s| !s.contains('–') && !s.is_empty()),
        "{p50}"
    );
    page.eval("window.pinlbTestMark = 7").await;

    let press = format!(
        "document.querySelector('tr.backend[data-address=\"{}\"] button[data-action=\"drain\"]').click(); 1",
        b.addr
    );
    assert_eq!(page.eval(&press).await, 1);
    let after = page
        .eval_until(ROWS, |v| {
            rows(v)
                .iter()
                .any(|(addr, s)| *addr == b.addr.to_string() && s == "draining")
        })
        .await;
    let states: Vec<String> = rows(&after).into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, ["up", "draining"]);
    assert_eq!(
        page.eval("window.pinlbTestMark").await,
        7,
        "updated in place"
    );
    // The API saw it, not just the page.
    let s = proxy
        .admin(http::Method::GET, "/status", Some("s3cret"))
        .await;
    let s: Value = serde_json::from_str(&s.body).unwrap();
    assert_eq!(s["upstreams"][0]["backends"][1]["admin"], "draining");
    assert_eq!(get(proxy.addr, "/").await.backend(), "a");
}

/// `text` as the page shows a count or a rate ("12,345", "1,234.5"), as a number: `None` when
/// it is not one, or its thousands are not grouped by commas.
fn shown_number(text: &str) -> Option<f64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let groups: Vec<&str> = whole.split(',').collect();
    let grouped = (1..=3).contains(&groups[0].len())
        && groups[1..].iter().all(|g| g.len() == 3)
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()))
        && fraction.bytes().all(|b| b.is_ascii_digit());
    grouped
        .then(|| text.replace(',', "").parse().ok())
        .flatten()
}

/// The text of every cell, by class (`td.rps`, ...), as a JSON list.
fn cells(selector: &str) -> String {
    format!(
        "JSON.stringify([...document.querySelectorAll('{selector}')].map(td => td.textContent))"
    )
}

fn texts(v: &Value) -> Vec<String> {
    serde_json::from_str(v.as_str().unwrap_or("[]")).unwrap_or_default()
}

/// The text of every value in a table cell that the browser broke over more than one line.
const WRAPPED: &str = "JSON.stringify([...document.querySelectorAll('td')].flatMap(td => {\
    const walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT); const out = [];\
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {\
      const r = document.createRange(); r.selectNodeContents(n);\
      const tops = [...r.getClientRects()].map(x => x.top);\
      if (tops.length && Math.max(...tops) - Math.min(...tops) > 1) out.push(n.textContent);\
    }\
    return out; }))";

#[tokio::test]
async fn the_status_pages_first_paint_shows_rates_grouped_counts_and_numbered_bars_on_one_line() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut setup = Setup::with(&[a.addr, b.addr]);
    setup.backend_keys = vec!["max_conns = 4".into()];
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\n".into();
    let proxy = Proxy::start(&setup);
    let admin = proxy.admin.unwrap();

    // One request held at `a`, so that its bar has something to draw. Round robin sends one of
    // the first two to `a`; one that went to `b` comes back at once.
    a.set_gate(false);
    let held = tokio::spawn(async move {
        for _ in 0..2 {
            get(proxy.addr, "/gated").await;
        }
    });
    poll(100, Duration::from_millis(100), async || {
        let s = proxy.status().await;
        (s["upstreams"][0]["backends"][0]["in_flight"] == 1).then_some(())
    })
    .await
    .expect("a request held at a");

    // Traffic through the proxy from before the page loads until after its first paint, so
    // the server's last completed second has requests in it whenever the page asks.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let traffic = tokio::spawn({
        let (addr, mut stopped) = (proxy.addr, stopped.clone());
        async move {
            let mut conn = Conn::open(addr).await;
            for _ in 0..1_000_000 {
                tokio::select! {
                    r = conn.get("/") => assert_eq!(r.status, http::StatusCode::OK),
                    _ = stopped.changed() => return,
                }
            }
        }
    });
    drop(stopped);
    poll(100, Duration::from_millis(100), async || {
        let s = proxy.status().await;
        let rate = s["listeners"][0]["requests_per_second"].as_f64();
        rate.is_some_and(|r| r > 0.0).then_some(())
    })
    .await
    .expect("the server reports a request rate");

    // The page's timer is stubbed out before its script runs: the one draw it makes is its
    // first paint, and what is read below and the screenshot are of that draw.
    let browser = Chromium::start("about:blank");
    let mut page = browser.page().await;
    page.call(
        "Page.addScriptToEvaluateOnNewDocument",
        json!({ "source": "window.setInterval = () => 0;" }),
    )
    .await;
    page.call(
        "Page.navigate",
        json!({ "url": format!("http://{admin}/") }),
    )
    .await;
    page.eval_until("document.querySelectorAll('tr.backend').length", |v| {
        *v == 2
    })
    .await;
    let shot = page
        .call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        )
        .await;
    let _ = stop.send(true);
    traffic.await.unwrap();
    let png = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        shot["data"].as_str().expect("a screenshot"),
    )
    .expect("base64");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-first-paint.png");
    std::fs::write(&path, png).unwrap();
    eprintln!("first paint: {}", path.display());

    // Every rate is there and a number; the listener's and the worker's saw the traffic.
    for selector in ["tr.listener td.rps", "#workers td.rps", "tr.backend td.rps"] {
        let shown = texts(&page.eval(&cells(selector)).await);
        assert!(!shown.is_empty(), "{selector}: no cell");
        for text in &shown {
            let rate = shown_number(text).unwrap_or_else(|| panic!("{selector}: {text:?}"));
            assert!(
                selector == "tr.backend td.rps" || rate > 0.0,
                "{selector}: {text}"
            );
        }
    }
    let errors = texts(&page.eval(&cells("tr.backend td.eps")).await);
    assert_eq!(errors, ["0.0", "0.0"]);

    // Counts are grouped by thousands, in whatever locale the browser has.
    assert_eq!(page.eval("count(1234567)").await, "1,234,567");
    let counts = texts(&page.eval(&cells("tr.listener td.num")).await);
    assert!(
        counts.iter().all(|c| shown_number(c).is_some()),
        "{counts:?}"
    );

    // `a`'s bar says how many of its 4 it holds and is that full: the held request, and the
    // traffic's one at a time may be there too. `b` has no limit: no bar, only its count.
    let in_flight = texts(&page.eval(&cells("tr.backend td.inflight")).await);
    let shown: Vec<(u64, &str)> = in_flight
        .iter()
        .map(|t| {
            let (count, limit) = t.split_once("\u{a0}/\u{a0}").expect("count / limit");
            (count.parse().expect("a count"), limit)
        })
        .collect();
    let (held_at_a, at_b) = (shown[0].0, shown[1].0);
    assert!((1..=2).contains(&held_at_a) && at_b <= 1, "{in_flight:?}");
    assert_eq!((shown[0].1, shown[1].1), ("4", "∞"));
    let bars = page
        .eval(
            "JSON.stringify([...document.querySelectorAll('tr.backend td.inflight')]\
             .map(td => [...td.querySelectorAll('.bar span')].map(s => s.style.width)))",
        )
        .await;
    assert_eq!(bars, format!(r#"[["{}%"],[]]"#, held_at_a * 25).as_str());

    // `b` learns its limit (`a`'s max_conns is a fixed one): what awaits its head against it,
    // and the line of the limit the server has kept since its start, there at the first paint.
    let limits = page
        .eval(
            "JSON.stringify([...document.querySelectorAll('tr.backend td.limit')]\
             .map(td => [td.firstChild.textContent,\
                         [...td.querySelectorAll('svg.spark path')].map(p => p.getAttribute('d'))]))",
        )
        .await;
    let limits: Vec<(String, Vec<String>)> =
        serde_json::from_str(limits.as_str().unwrap_or("[]")).unwrap_or_default();
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert_eq!(limits[0], ("–".to_string(), Vec::new()));
    let (awaiting, learned) = limits[1]
        .0
        .split_once("\u{a0}/\u{a0}")
        .expect("awaiting / limit");
    assert!(awaiting.parse::<u64>().is_ok(), "{limits:?}");
    assert!(
        learned
            .parse::<u64>()
            .is_ok_and(|l| (2..=1000).contains(&l)),
        "{limits:?}"
    );
    assert!(
        limits[1].1.len() == 1 && limits[1].1[0].starts_with('M'),
        "a line: {limits:?}"
    );

    // No value is broken over two lines, on a wide window and on a narrow one.
    assert_eq!(page.eval(WRAPPED).await, "[]");
    page.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 600, "height": 800, "deviceScaleFactor": 1, "mobile": false }),
    )
    .await;
    assert_eq!(page.eval(WRAPPED).await, "[]");

    a.set_gate(true);
    held.await.unwrap();
}
