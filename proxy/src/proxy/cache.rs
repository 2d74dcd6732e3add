//! A request whose route caches (`modules::cache`): answered from the zone while a fresh
//! response is stored for its key, else forwarded, with one request per key at a time when
//! the route's `lock` is on, and the backend's response stored on its way to the client when
//! RFC 9111 lets it. The request pipeline (`downstream::pipeline::forward`) sends only such a
//! route's requests here.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::sync::Notify;

use crate::config::Limits;
use crate::http1::common::{Reply, content_length_line};
use crate::http1::request::RequestHead;
use crate::modules::Filter;
use crate::modules::cache::fill::Pending;
use crate::modules::cache::stored::{Entry, Stored, variant_key};
use crate::modules::cache::zone::{Lead, Zone};
use crate::modules::cache::{CacheStatus, Cached, Fill, policy};
use crate::proxy::body::ProxyBody;
use crate::proxy::downstream::{Downstream, DownstreamBody};
use crate::proxy::handle::{Answer, DownstreamRequest};
use crate::syntax::template::Request;
use crate::upstream::local::WorkerUpstream;

/// `request` through `cached`: a stored answer, or the backend's, stored when it may be.
pub(crate) async fn handle(
    cached: &Cached,
    upstream: Rc<WorkerUpstream>,
    downstream: Rc<Downstream>,
    limits: Limits,
    at: Option<Instant>,
    request: DownstreamRequest<'_, impl DownstreamBody>,
) -> Answer {
    let (config, zone) = (&cached.config, &cached.zone);
    let head = request.head;
    let key = config.key(&Request {
        head,
        https: downstream.https,
        client: downstream.ip,
    });
    if request.refused.is_some() || !config.looks_up(&head.method) {
        // Not looked up; an unsafe method's success makes what the key holds stale.
        let method = head.method.clone();
        let answer = super::handle::handle(upstream, downstream, limits, at, request).await;
        if policy::invalidates(&method, answer.response.status) {
            zone.remove(&key);
        }
        return answer;
    }
    let mut status = CacheStatus::Miss;
    let entry = lookup(zone, &key, head);
    match entry.as_deref().and_then(stored) {
        Some(s) if s.is_fresh(Instant::now()) => return hit(cached, s, head),
        Some(_) => status = CacheStatus::Expired,
        None => {}
    }
    drop(entry);
    let mut lead = None;
    let mut may_store = true;
    if let Some(wait) = config.lock {
        match zone.lead(&key) {
            Ok(l) => lead = Some(l),
            Err(notify) => {
                zone.counters.collapsed.fetch_add(1, Ordering::Relaxed);
                let woken = wait_for(zone, &key, &notify, wait).await;
                let entry = lookup(zone, &key, head);
                if let Some(s) = entry.as_deref().and_then(stored) {
                    if s.is_fresh(Instant::now()) {
                        return hit(cached, s, head);
                    }
                }
                // Not stored (the response could not be): this request goes on its own. One
                // that waited the whole `lock_timeout` is not stored either (nginx's rule).
                may_store = woken;
            }
        }
    }
    let counter = match status {
        CacheStatus::Expired => &zone.counters.expired,
        _ => &zone.counters.misses,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    cached.status.set(Some(status));
    let mut answer = super::handle::handle(upstream, downstream, limits, at, request).await;
    if may_store && head.method == Method::GET {
        store_on_the_way(cached, key, head, &mut answer.response, lead);
    }
    status_line(cached, &mut answer.response.headers, status);
    answer
}

/// What `key` holds for `head`: its response, or the variant for `head`'s values of the
/// headers the key's responses vary by.
fn lookup(zone: &Zone, key: &[u8], head: &RequestHead) -> Option<Arc<Entry>> {
    let entry = zone.get(key)?;
    match &*entry {
        Entry::Response(_) => Some(entry),
        Entry::Vary(names) => zone.get(&variant_key(key, names, head)),
    }
}

fn stored(entry: &Entry) -> Option<&Stored> {
    match entry {
        Entry::Response(s) => Some(s),
        Entry::Vary(_) => None,
    }
}

/// Waits, at most `wait`, for the miss of `key` in flight to end. `false`: it did not in time.
async fn wait_for(zone: &Zone, key: &[u8], notify: &Arc<Notify>, wait: Duration) -> bool {
    let woken = notify.notified();
    let mut woken = std::pin::pin!(woken);
    woken.as_mut().enable();
    // The miss may have ended between the lookup and `enable`: then nothing will wake this one.
    if !zone.waits_on(key, notify) {
        return true;
    }
    tokio::time::timeout(wait, woken).await.is_ok()
}

/// The answer from `s`, a fresh stored response: `304 Not Modified` when the request's own
/// condition holds for it.
fn hit(cached: &Cached, s: &Stored, head: &RequestHead) -> Answer {
    cached.zone.counters.hits.fetch_add(1, Ordering::Relaxed);
    cached.status.set(Some(CacheStatus::Hit));
    let not_modified = s.not_modified(head);
    let mut headers = Vec::with_capacity(s.lines.len() + 48);
    headers.extend_from_slice(&s.lines);
    headers.extend_from_slice(b"age: ");
    headers.extend_from_slice(itoa::Buffer::new().format(s.age(Instant::now())).as_bytes());
    headers.extend_from_slice(b"\r\n");
    let (status, body) = if not_modified {
        (StatusCode::NOT_MODIFIED, Bytes::new())
    } else if head.method == Method::HEAD {
        content_length_line(&mut headers, s.body.len() as u64);
        (s.status, Bytes::new())
    } else {
        (s.status, s.body.clone())
    };
    status_line(cached, &mut headers, CacheStatus::Hit);
    Answer {
        response: Reply {
            status,
            headers,
            body: ProxyBody::Local(Some(body)),
        },
        upstreamed: None,
        close: false,
    }
}

/// Wraps `response`'s body so that it is stored under `key` once it went out whole, when the
/// rules let it be; `lead`, this request's hold on the key, goes with it (or is let go now).
fn store_on_the_way(
    cached: &Cached,
    key: Vec<u8>,
    head: &RequestHead,
    response: &mut Reply<ProxyBody>,
    lead: Option<Lead>,
) {
    if matches!(response.body, ProxyBody::Local(_)) {
        // pinlb's own 502/503/504: nothing of the backend's to keep.
        return;
    }
    let Some(v) = policy::verdict(&cached.config, head, response.status, &response.headers) else {
        return;
    };
    let variant = (!v.vary.is_empty()).then(|| variant_key(&key, &v.vary, head));
    let pending = Pending {
        zone: cached.zone.clone(),
        key,
        status: response.status,
        lines: kept_lines(&response.headers),
        age: v.age,
        fresh_for: v.fresh_for,
        vary: v.vary,
        variant,
        lead,
    };
    let body = std::mem::replace(&mut response.body, ProxyBody::Local(None));
    response.body = body.filtered(Filter::Cache(Fill::new(pending)));
}

/// The header lines a stored response keeps: all but `Set-Cookie` (stored only when ignored,
/// and then without it) and `Age` (made anew for each hit).
fn kept_lines(lines: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.len());
    for line in lines.split_inclusive(|&b| b == b'\n') {
        let name = line.split(|&b| b == b':').next().unwrap_or_default();
        if name.eq_ignore_ascii_case(b"set-cookie") || name.eq_ignore_ascii_case(b"age") {
            continue;
        }
        out.extend_from_slice(line);
    }
    out
}

/// `status_header: STATUS`, when the route names one.
fn status_line(cached: &Cached, headers: &mut Vec<u8>, status: CacheStatus) {
    if let Some(name) = &cached.config.status_header {
        headers.extend_from_slice(name);
        headers.extend_from_slice(status.as_str().as_bytes());
        headers.extend_from_slice(b"\r\n");
    }
}
