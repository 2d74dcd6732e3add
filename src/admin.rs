//! The admin listener (`[admin]`): metrics, status, runtime control and reload.
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | Prometheus text format |
//! | `GET /status` | JSON: generation, uptime, workers and cores, listeners, every backend |
//! | `GET /` | a small HTML page that renders `/status` and refreshes it every second |
//! | `POST /backends/{address}/drain` | no new requests; those in flight finish |
//! | `POST /backends/{address}/disable` | like down; health checks go on |
//! | `POST /backends/{address}/enable` | back to taking requests |
//! | `POST /reload` | read the config file again, as SIGHUP does |
//!
//! A backend address names that backend in every upstream that has it. With `admin.token` set,
//! every request needs `Authorization: Bearer <token>`; the page asks for the token once and keeps
//! it in the tab's session storage.
//!
//! It runs on the control thread (pinned to `runtime.cpus`), never on a worker, so a scrape
//! takes nothing from the request path but the atomics it reads.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::server::Process;
use crate::upstream::{AdminState, BackendState};

/// Accepts admin connections until the control runtime stops.
pub(crate) async fn serve(listener: TcpListener, process: Arc<Process>) {
    if let Ok(addr) = listener.local_addr() {
        info!("admin listening on http://{addr}/");
    }
    loop {
        let (stream, peer) = crate::server::accept(&listener).await;
        let process = process.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let process = process.clone();
                async move { Ok::<_, Infallible>(route(&process, req, peer).await) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(client = %peer, "admin connection ended: {e}");
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

async fn route(process: &Process, req: Request<Incoming>, peer: SocketAddr) -> Reply {
    let generation = process.generations.borrow().clone();
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
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, [""]) => reply(StatusCode::OK, "text/html; charset=utf-8", PAGE),
        (&Method::GET, ["metrics"]) => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::render(
                &generation.upstreams,
                &process.registered,
                generation.number,
            ),
        ),
        (&Method::GET, ["status"]) => json_reply(StatusCode::OK, &status(process)),
        (&Method::POST, ["backends", address, action]) => control(process, address, action),
        (&Method::POST, ["reload"]) => match crate::reload::reload(process).await {
            Ok(summary) => {
                info!("admin: {summary}");
                text(StatusCode::OK, summary)
            }
            Err(e) => {
                warn!("admin: reload failed, the running configuration stays: {e}");
                text(
                    StatusCode::BAD_REQUEST,
                    format!("reload failed, the running configuration stays: {e}"),
                )
            }
        },
        (_, [""] | ["metrics"] | ["status"]) => method_not_allowed("GET"),
        (_, ["backends", _, _] | ["reload"]) => method_not_allowed("POST"),
        _ => text(
            StatusCode::NOT_FOUND,
            format!(
                "404 Not Found: {path}; see GET / , /status, /metrics, POST /backends/{{address}}/{{drain,disable,enable}}, /reload"
            ),
        ),
    }
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

/// Compares the bearer token without stopping at the first differing byte.
fn authorized<B>(req: &Request<B>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (given.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn control(process: &Process, address: &str, action: &str) -> Reply {
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
    let Ok(addr) = address.parse::<SocketAddr>() else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("400 Bad Request: \"{address}\" is not a backend address (IP:PORT)"),
        );
    };
    let generation = process.generations.borrow().clone();
    let mut upstreams = Vec::new();
    for u in &generation.upstreams {
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
            format!("404 Not Found: no upstream has backend {addr}"),
        );
    }
    json_reply(
        StatusCode::OK,
        &json!({ "backend": addr.to_string(), "state": state.as_str(), "upstreams": upstreams }),
    )
}

/// What the status page and `GET /status` show: the same picture as `/metrics`.
fn status(process: &Process) -> serde_json::Value {
    let generation = process.generations.borrow().clone();
    let config = &generation.config;
    let listeners = process.registered.all();
    let workers: Vec<_> = config
        .runtime
        .cpus
        .iter()
        .enumerate()
        .map(|(w, core)| {
            let requests: u64 = listeners
                .iter()
                .filter(|l| l.worker == w)
                .map(|l| l.requests.load(Ordering::Relaxed))
                .sum();
            json!({ "worker": w, "core": core, "requests": requests })
        })
        .collect();
    let upstreams: Vec<_> = generation
        .upstreams
        .iter()
        .map(|u| {
            let backends: Vec<_> = u.backends.iter().map(|b| backend_status(b)).collect();
            json!({
                "name": u.config.name,
                "algorithm": u.config.algorithm.as_str(),
                "health_checks": u.config.health.is_some(),
                "backends": backends,
            })
        })
        .collect();
    let listener_list: Vec<_> = config
        .listeners
        .iter()
        .map(|l| json!({ "address": l.address.to_string(), "upstream": config.upstreams[l.upstream].name }))
        .collect();
    json!({
        "generation": generation.number,
        "uptime_seconds": process.started.elapsed().as_secs_f64(),
        "config_file": process.config_path.as_ref().map(|p| p.display().to_string()),
        "metrics": config.admin.is_some(),
        "workers": workers,
        "listeners": listener_list,
        "upstreams": upstreams,
    })
}

fn backend_status(b: &BackendState) -> serde_json::Value {
    let admin = b.admin_state();
    // One word for the page's colour: what keeps the backend from taking requests, if anything.
    let state = if admin != AdminState::Active {
        admin.as_str()
    } else if !b.is_up() {
        "down"
    } else if b.is_skipped() {
        "skipped"
    } else if b.is_full() {
        "full"
    } else {
        "up"
    };
    let s = &b.stats;
    json!({
        "address": b.address.to_string(),
        "state": state,
        "health": if b.is_up() { "up" } else { "down" },
        "admin": admin.as_str(),
        "weight": b.weight(),
        "in_flight": b.in_flight(),
        "requests": s.requests.load(Ordering::Relaxed),
        "errors": s.errors_total(),
    })
}

/// The status page: plain HTML and a script that fetches `/status` every second and redraws the
/// tables in place.
const PAGE: &str = include_str!("admin.html");

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
        assert!(!authorized(&req("bearer s3cret"), "s3cret"));
        assert!(!authorized(&req("s3cret"), "s3cret"));
        assert!(!authorized(&Request::new(()), "s3cret"));
    }
}
