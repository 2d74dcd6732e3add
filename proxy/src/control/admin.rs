//! The admin listener (`[admin]`): metrics, status, runtime control and reload.
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text format (`promtool check metrics` passes it) |
//! | `GET /status` | JSON: version, generation, uptime, workers and cores, listeners with their connections and responses, every backend with its state and the last minute (see `status`) |
//! | `GET /` | a small HTML page that renders `/status` every second, with drain/disable/enable buttons and a chart of each learning backend's concurrency limit over the last ten minutes |
//! | `POST /backends/{address}/drain` | no new requests; those in flight finish |
//! | `POST /backends/{address}/disable` | like down; health checks go on |
//! | `POST /backends/{address}/enable` | back to taking requests |
//! | `POST /upstreams/{name}/backends/{address}/{action}` | the same, in that upstream only |
//! | `POST /reload` | read the config file again, as SIGHUP does |
//! | `GET /live` | `200 live` while the control thread answers (a liveness probe) |
//! | `GET /ready` | `200 ready` when every worker accepts on the running generation's listeners and every upstream has a backend up; else `503` and one line per reason, naming the upstream; `503` while draining for a stop |
//!
//! Every `GET` answers `HEAD` too, with the same headers and no body.
//!
//! Two upstreams may list one address, and each then has a backend of its own there. An address
//! alone names the backend in every upstream that has it; `/upstreams/{name}/...` in that one only.
//! `/live` and `/ready` never need the token: kubelet probes and load balancers' health checks
//! cannot easily send one (HAProxy's `monitor-uri` and Envoy's `/ready` are unauthenticated too),
//! and they tell no more than whether pinlb is up and which upstream has no backend.
//! With `admin.token` set, every other request but the page itself needs `Authorization: Bearer
//! <token>`; the page asks for the token once and keeps it in the tab's session storage. A POST
//! that a browser says comes from a page of another origin is refused (403), so no web page can
//! drive a tokenless admin listener. At most 64 admin connections are open at once, each bounded
//! in time.
//!
//! It runs on the control thread (pinned to `runtime.cpus`), never on a worker, so a scrape
//! takes nothing from the request path but the atomics it reads.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{debug, info, warn};

use crate::backend_address::BackendAddress;
use crate::control::status::{Window, status};
use crate::process::shared::{Generation, Process};
use crate::upstream::backend::AdminState;

/// Admin connections open at once; more wait in the kernel's backlog. The admin listener shares
/// the process's file descriptors with the workers, so it must not be able to use them up.
const MAX_CONNECTIONS: usize = 64;
/// An admin connection must send a whole request head within this, and is closed after this
/// long idle: the token is checked only once a head has arrived.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts admin connections until the control runtime stops.
pub(crate) async fn serve(listener: TcpListener, process: Arc<Process>) {
    if let Ok(addr) = listener.local_addr() {
        info!("admin listening on http://{addr}/");
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let window = Arc::new(Window::default());
    // The status page's last minute; it ends with this task, when the control runtime stops.
    tokio::spawn({
        let (window, process) = (window.clone(), process.clone());
        async move {
            let mut every = tokio::time::interval(crate::control::status::SAMPLE_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                window.sample(&process);
            }
        }
    });
    loop {
        // The semaphore is never closed.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = crate::process::listen::accept(&listener).await;
        let (process, window) = (process.clone(), window.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req| {
                let (process, window) = (process.clone(), window.clone());
                async move { Ok::<_, Infallible>(route(&process, &window, req, peer).await) }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(ADMIN_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            // Bounds the whole connection too, so a client that stops reading a reply can't
            // hold its slot either; `/reload` waits for the workers at most a few seconds.
            match tokio::time::timeout(ADMIN_TIMEOUT * 6, conn).await {
                Ok(Err(e)) => debug!(client = %peer, "admin connection ended: {e}"),
                Err(_) => {
                    debug!(client = %peer, "admin connection closed after {:?}", ADMIN_TIMEOUT * 6)
                }
                Ok(Ok(())) => {}
            }
        });
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn text(status: StatusCode, body: impl Into<String>) -> Reply {
    let mut body = body.into();
    body.push('\n');
    reply(status, "text/plain; charset=utf-8", body)
}

fn json_reply(status: StatusCode, v: &serde_json::Value) -> Reply {
    reply(status, "application/json", v.to_string())
}

async fn route(
    process: &Process,
    window: &Window,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Reply {
    let generation = process.generations.borrow().clone();
    // The page holds no data (it fetches `/status`, which needs the token), and a browser that
    // opens it sends no Authorization header: it must load to ask for the token.
    // HEAD is GET without the body (hyper leaves it out), on every GET endpoint.
    let method = if req.method() == Method::HEAD {
        Method::GET
    } else {
        req.method().clone()
    };
    if method == Method::GET && req.uri().path() == "/" {
        return reply(StatusCode::OK, "text/html; charset=utf-8", PAGE);
    }
    // Probes carry no token (see the module's doc).
    if method == Method::GET && req.uri().path() == "/live" {
        return text(StatusCode::OK, "live");
    }
    if method == Method::GET && req.uri().path() == "/ready" {
        return match unready(process, &generation) {
            None => text(StatusCode::OK, "ready"),
            Some(why) => text(StatusCode::SERVICE_UNAVAILABLE, why),
        };
    }
    // A web page in a browser on this host can send a POST to a loopback address without the
    // user knowing (CSRF). Browsers say where such a request comes from; refuse it.
    if req.method() == Method::POST && cross_site(&req) {
        warn!(client = %peer, "admin: POST {} refused: sent by a page from another origin", req.uri().path());
        return text(
            StatusCode::FORBIDDEN,
            "403 Forbidden: a POST from a web page of another origin",
        );
    }
    if let Some(token) = generation
        .config
        .admin
        .as_ref()
        .and_then(|a| a.token.as_deref())
    {
        if !authorized(&req, token) {
            warn!(client = %peer, "admin: {} {} refused: missing or wrong bearer token", req.method(), req.uri().path());
            let mut r = text(
                StatusCode::UNAUTHORIZED,
                "401 Unauthorized: this admin listener needs Authorization: Bearer <admin.token>",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"pinlb\""),
            );
            return r;
        }
    }
    let path = req.uri().path().to_string();
    let joined;
    let mut segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if let Some((at, address)) = unix_address_segments(&segments) {
        joined = address;
        let action = segments.last().copied().unwrap_or_default();
        segments.truncate(at);
        segments.extend([joined.as_str(), action]);
    }
    match (&method, segments.as_slice()) {
        (&Method::GET, ["metrics"]) => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::control::metrics::render(
                &generation.upstreams,
                &process.registered,
                generation.number,
                &generation
                    .config
                    .listeners
                    .iter()
                    .map(|l| {
                        let upstream = &generation.config.upstreams[l.upstream].name;
                        (l.address, upstream.clone())
                    })
                    .collect::<Vec<_>>(),
                &process.dns.names(),
                &process.spawned.all(),
                (&process.edge.limited_counts(), &process.caches.figures()),
            ),
        ),
        (&Method::GET, ["status"]) => json_reply(StatusCode::OK, &status(process, window)),
        (&Method::POST, ["backends", address, action]) => control(process, None, address, action),
        (&Method::POST, ["upstreams", upstream, "backends", address, action]) => {
            control(process, Some(upstream), address, action)
        }
        (&Method::POST, ["cache", zone, "purge"]) => purge(process, zone, req.uri().query()),
        (&Method::POST, ["reload"]) => match crate::process::reload::reload(process).await {
            Ok(summary) => {
                info!("admin: {summary}");
                text(StatusCode::OK, summary)
            }
            Err(e) => {
                warn!("admin: {e}");
                let status = match e {
                    crate::process::reload::ReloadError::Refused(_) => StatusCode::BAD_REQUEST,
                    crate::process::reload::ReloadError::Unconfirmed(_) => {
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                };
                text(status, e.to_string())
            }
        },
        (_, [""] | ["metrics"] | ["status"] | ["live"] | ["ready"]) => {
            method_not_allowed("GET, HEAD")
        }
        (
            _,
            ["backends", _, _]
            | ["upstreams", _, "backends", _, _]
            | ["reload"]
            | ["cache", _, "purge"],
        ) => method_not_allowed("POST"),
        _ => text(
            StatusCode::NOT_FOUND,
            format!(
                "404 Not Found: {path}; see GET / , /status, /metrics, /live, /ready, POST /backends/{{address}}/{{drain,disable,enable}}, /upstreams/{{name}}/backends/{{address}}/{{drain,disable,enable}}, /reload, /cache/{{zone}}/purge[?key=KEY|?prefix=PREFIX]"
            ),
        ),
    }
}

/// `POST /cache/{zone}/purge`: forgets the key `?key=` names (with its variants), every key
/// that begins with `?prefix=`, or, with neither, every key of the zone. Keys are as the
/// route's `cache.key` renders them (`http://example.com/path` by default), percent-encoded
/// in the query.
fn purge(process: &Process, zone: &str, query: Option<&str>) -> Response<Full<Bytes>> {
    use crate::modules::cache::zone::Purge;
    let param = |name: &str| -> Option<Vec<u8>> {
        let q = query?;
        let v = q
            .split('&')
            .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))?;
        Some(percent_encoding::percent_decode_str(v).collect())
    };
    let (key, prefix) = (param("key"), param("prefix"));
    let what = match (&key, &prefix) {
        (Some(k), None) => Purge::Key(k),
        (None, Some(p)) => Purge::Prefix(p),
        (None, None) => Purge::All,
        (Some(_), Some(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                "400 Bad Request: key or prefix, not both",
            );
        }
    };
    match process.caches.purge(zone, what) {
        Some(n) => {
            info!("admin: cache zone {zone}: purged {n} entries");
            text(
                StatusCode::OK,
                format!("purged {n} entries from cache zone {zone}"),
            )
        }
        None => text(
            StatusCode::NOT_FOUND,
            format!("404 Not Found: no cache zone {zone} in use"),
        ),
    }
}

/// Why pinlb should not be sent traffic now, one line per reason; `None` when it is ready. A
/// worker that has not switched to the running generation may not yet accept on its new
/// listeners; an upstream with no backend up would answer 503.
fn unready(process: &Process, generation: &Generation) -> Option<String> {
    use std::sync::atomic::Ordering;
    if process.stopping.load(Ordering::Relaxed) {
        return Some("not ready: draining for a stop".into());
    }
    let mut why = Vec::new();
    let accepting = generation.acked.load(Ordering::Relaxed);
    if accepting < process.workers {
        why.push(format!(
            "not ready: {accepting} of {} workers accept on generation {}'s listeners",
            process.workers, generation.number
        ));
    }
    for u in generation.upstreams.iter().filter(|u| !u.has_backend_up()) {
        let reason = if u.backends.is_empty() {
            "no backends (none of its names resolved)".to_string()
        } else {
            u.unavailable()
        };
        why.push(format!("not ready: upstream {}: {reason}", u.config.name));
    }
    (!why.is_empty()).then(|| why.join("\n"))
}

fn method_not_allowed(allow: &'static str) -> Reply {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("405 Method Not Allowed: use {allow}"),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Whether a browser says the request comes from a page of another origin: `Sec-Fetch-Site`
/// other than same-origin or none (typed by the user), or an `Origin` that is not this host.
/// Clients that are not browsers (curl, Prometheus) send neither and pass.
fn cross_site<B>(req: &Request<B>) -> bool {
    let h = req.headers();
    if let Some(site) = h.get("sec-fetch-site") {
        return site != "same-origin" && site != "none";
    }
    match (h.get(header::ORIGIN), h.get(header::HOST)) {
        (None, _) => false,
        (Some(origin), Some(host)) => {
            origin.as_bytes().strip_prefix(b"http://") != Some(host.as_bytes())
        }
        (Some(_), None) => true,
    }
}

/// Compares the bearer token without stopping at the first differing byte (`subtle`). The
/// scheme is case-insensitive (RFC 9110 §11.1).
fn authorized<B>(req: &Request<B>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .filter(|v| v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
        .map(|v| &v[7..])
    else {
        return false;
    };
    given.ct_eq(token.as_bytes()).into()
}

/// Sets the admin state of the backend at `address` in `upstream`, or in every upstream that
/// has one there.
fn control(process: &Process, upstream: Option<&str>, address: &str, action: &str) -> Reply {
    let state = match action {
        "drain" => AdminState::Draining,
        "disable" => AdminState::Disabled,
        "enable" => AdminState::Active,
        other => {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "404 Not Found: unknown action \"{other}\", expected drain, disable or enable"
                ),
            );
        }
    };
    // curl and browsers may percent-encode an IPv6 address's brackets and colons.
    let decoded = percent_decode(address);
    let Some(Ok(addr)) = BackendAddress::parse(&decoded) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "400 Bad Request: \"{address}\" is not a backend address (IP:PORT or unix:/path)"
            ),
        );
    };
    // An upstream's name is a TOML key, which may hold any character.
    let only = upstream.map(percent_decode);
    let generation = process.generations.borrow().clone();
    if let Some(name) = &only {
        if !generation.upstreams.iter().any(|u| &u.config.name == name) {
            return text(
                StatusCode::NOT_FOUND,
                format!("404 Not Found: no upstream \"{name}\""),
            );
        }
    }
    let mut upstreams = Vec::new();
    for u in &generation.upstreams {
        if only.as_ref().is_some_and(|name| name != &u.config.name) {
            continue;
        }
        for b in u.backends.iter().filter(|b| b.address == addr) {
            let before = b.set_admin_state(state);
            info!(
                upstream = %u.config.name,
                "admin: backend {addr} {} (was {})",
                state.as_str(),
                before.as_str()
            );
            upstreams.push(u.config.name.clone());
        }
    }
    if upstreams.is_empty() {
        return text(
            StatusCode::NOT_FOUND,
            match &only {
                Some(name) => format!("404 Not Found: upstream \"{name}\" has no backend {addr}"),
                None => format!("404 Not Found: no upstream has backend {addr}"),
            },
        );
    }
    json_reply(
        StatusCode::OK,
        &json!({ "backend": addr.to_string(), "state": state.as_str(), "upstreams": upstreams }),
    )
}

/// `%XX` escapes decoded; anything malformed is left as it is (and then fails to parse).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// The status page: plain HTML and a script that fetches `/status` every second and redraws the
/// tables in place.
const PAGE: &str = include_str!("admin.html");

/// A Unix backend's address written into an admin path as it is (`/backends/unix:/run/app.sock/
/// drain`): its slashes split it into segments, which are joined back here. Returns where the
/// address begins among the segments and the address; `None` when the path names none that
/// way (an encoded one, `unix:%2Frun%2Fapp.sock`, is one segment already).
fn unix_address_segments(segments: &[&str]) -> Option<(usize, String)> {
    let at = segments.iter().position(|s| *s == "unix:")?;
    if at == 0 || segments[at - 1] != "backends" || segments.len() < at + 3 {
        return None;
    }
    Some((at, segments[at..segments.len() - 1].join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_token_must_match_exactly() {
        let req = |v: &str| {
            Request::builder()
                .header("authorization", v)
                .body(())
                .unwrap()
        };
        assert!(authorized(&req("Bearer s3cret"), "s3cret"));
        assert!(!authorized(&req("Bearer s3cre"), "s3cret"));
        assert!(!authorized(&req("Bearer s3cretX"), "s3cret"));
        assert!(!authorized(&req("Bearer s3creT"), "s3cret"));
        assert!(authorized(&req("bearer s3cret"), "s3cret"));
        assert!(!authorized(&req("s3cret"), "s3cret"));
        assert!(!authorized(&Request::new(()), "s3cret"));
    }

    #[test]
    fn backend_addresses_in_paths_may_be_percent_encoded() {
        assert_eq!(percent_decode("%5B::1%5D:8080"), "[::1]:8080");
        assert_eq!(percent_decode("%5b%3A%3a1%5d%3A80"), "[::1]:80");
        assert_eq!(percent_decode("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(percent_decode("%zz%5"), "%zz%5");
        assert_eq!(percent_decode("%"), "%");
        // An upstream's name may hold any character; bytes that are not UTF-8 become U+FFFD.
        assert_eq!(percent_decode("caf%C3%A9"), "café");
        assert_eq!(percent_decode("a%FFb"), "a\u{FFFD}b");
    }

    #[test]
    fn posts_from_pages_of_other_origins_are_told_apart() {
        let req = |headers: &[(&str, &str)]| {
            let mut b = Request::builder()
                .method("POST")
                .header("host", "127.0.0.1:9901");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap()
        };
        assert!(!cross_site(&req(&[])), "curl sends neither header");
        assert!(!cross_site(&req(&[("sec-fetch-site", "same-origin")])));
        assert!(!cross_site(&req(&[("origin", "http://127.0.0.1:9901")])));
        assert!(cross_site(&req(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&req(&[("origin", "http://evil.example")])));
        assert!(cross_site(&req(&[("origin", "null")])));
    }
}
