//! A request whose route caches (`modules::cache`): answered from the zone while a fresh
//! response is stored for its key, else forwarded, with one request per key at a time when
//! the route's `lock` is on, and the backend's response stored on its way to the client when
//! RFC 9111 lets it. `handle` asks [`before`] and [`after`] for such a route's requests only:
//! a route without a cache pays for one test.
//!
//! A stale response is asked for again conditionally when it has a validator (`revalidate`):
//! a `304` refreshes it (`REVALIDATED`). It is served instead of the backend's answer when
//! the backend fails in a way `use_stale` names or its own `stale-if-error` allows (`STALE`),
//! and while another request updates it, under `use_stale` `updating` or its own
//! `stale-while-revalidate` (`UPDATING`). With `background_update`, the request that finds it
//! stale gets it at once (`STALE`) and a request of pinlb's own, a task on the worker,
//! updates it.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::sync::Notify;
use tracing::debug;

use crate::config::Limits;
use crate::http1::common::{Reply, content_length_line};
use crate::http1::request::{ClientError, RequestHead};
use crate::modules::Filter;
use crate::modules::cache::fill::{Pending, store};
use crate::modules::cache::policy::{self, Verdict};
use crate::modules::cache::stored::{Entry, Stored, variant_key};
use crate::modules::cache::zone::{Lead, Zone};
use crate::modules::cache::{CacheStatus, Cached, Config, Fill};
use crate::proxy::body::ProxyBody;
use crate::proxy::downstream::Downstream;
use crate::proxy::exchange::Answer;
use crate::proxy::forward::Overrides;
use crate::proxy::side_request::{drain, own_request};
use crate::syntax::template::Request;
use crate::upstream::local::WorkerUpstream;

/// What the cache makes of a request before it goes to a backend.
pub(crate) enum Before {
    /// Answered from the zone.
    Answered(Answer),
    /// On to a backend; [`after`] takes its answer.
    Forward(Box<Forwarded>),
}

/// A request the cache sent on to a backend, and what it needs of the answer.
pub(crate) struct Forwarded {
    key: Vec<u8>,
    mode: Mode,
    /// Its hold on the key, when it leads the key's update: let go once the answer is stored
    /// (or won't be), which wakes the requests waiting for it.
    lead: Option<Lead>,
    /// The stale response it may refresh or stand in for.
    stale: Option<Arc<Entry>>,
    /// The route's overrides for a request that fills the cache: without the client's
    /// conditions, with the stale response's validators when it is revalidated.
    filling: Option<Overrides>,
    /// The request asks with the stale response's validators: a 304 refreshes it.
    revalidating: bool,
}

impl Forwarded {
    /// The overrides the request goes with, when the cache changed them.
    pub(crate) fn overrides(&self) -> Option<&Overrides> {
        self.filling.as_ref()
    }
}

/// Why the request went on, which decides what [`after`] does with the answer.
enum Mode {
    /// Its method is not looked up: an unsafe one's success removes what the key holds.
    NotLookedUp,
    /// `bypass` held: the answer is stored, unless `no_cache` holds.
    Bypass,
    /// It waited `lock_timeout` in vain: the answer goes out, not stored (nginx's rule).
    TimedOut(CacheStatus),
    /// A miss, or a stale response: the answer stored, refreshing or standing in for it.
    Update(CacheStatus),
}

/// Looks `head` up in `cached`'s zone: a fresh response (or a stale one, where the rules let
/// it be served) answers it; else it goes on, at most one request per key at once when the
/// route's `lock` is on, the others waiting for that one's answer.
pub(crate) async fn before(
    cached: &Cached,
    (upstream, downstream, limits): (&Rc<WorkerUpstream>, &Rc<Downstream>, &Limits),
    head: &RequestHead,
    overrides: Option<&Overrides>,
    refused: &Option<ClientError>,
) -> Before {
    let (config, zone) = (&cached.config, &cached.zone);
    let key = config.key(&Request {
        head,
        https: downstream.https,
        client: downstream.ip,
    });
    let on = |mode, lead, stale: Option<Arc<Entry>>, filling, revalidating| {
        Before::Forward(Box::new(Forwarded {
            key: key.clone(),
            mode,
            lead,
            stale,
            filling,
            revalidating,
        }))
    };
    if refused.is_some() || !config.looks_up(&head.method) {
        return on(Mode::NotLookedUp, None, None, None, false);
    }
    if config.bypasses(head) {
        return on(Mode::Bypass, None, None, None, false);
    }
    let now = Instant::now();
    let mut entry = lookup(zone, &key, head);
    if let Some(s) = entry.as_deref().and_then(stored) {
        if s.is_fresh(now) {
            return Before::Answered(served(cached, s, head, CacheStatus::Hit));
        }
    }
    // Missed, or stale: one request updates the key, the others wait or are served stale.
    let lead = match zone.lead(&key) {
        Ok(lead) => Some(lead),
        Err(notify) => {
            if let Some(s) = entry.as_deref().and_then(stored) {
                let updating = config.use_stale.updating && s.may_be_served_stale();
                if updating || s.may_serve_while_revalidating(now) {
                    return Before::Answered(served(cached, s, head, CacheStatus::Updating));
                }
            }
            if let Some(wait) = config.lock {
                zone.counters.collapsed.fetch_add(1, Ordering::Relaxed);
                let woken = wait_for(zone, &key, &notify, wait).await;
                entry = lookup(zone, &key, head);
                if let Some(s) = entry.as_deref().and_then(stored) {
                    if s.is_fresh(Instant::now()) {
                        return Before::Answered(served(cached, s, head, CacheStatus::Hit));
                    }
                }
                if !woken {
                    let status = miss_status(entry.as_deref());
                    return on(Mode::TimedOut(status), None, None, None, false);
                }
            }
            // Woken with nothing fresh (the response could not be stored), or no lock: this
            // request goes on its own, storing what it may.
            None
        }
    };
    let status = miss_status(entry.as_deref());
    let Some(s) = entry.as_deref().and_then(stored) else {
        return on(
            Mode::Update(status),
            lead,
            None,
            Some(filling(overrides, head, None)),
            false,
        );
    };
    let background = config.background_update && s.may_be_served_stale();
    // Only a GET is refreshed behind the client: a HEAD brings no body to store.
    let by_get = head.method == Method::GET;
    if by_get && lead.is_some() && (background || s.may_serve_while_revalidating(now)) {
        let answer = served(cached, s, head, CacheStatus::Stale);
        let refresh = Refresh {
            cached: Cached {
                config: config.clone(),
                zone: zone.clone(),
                status: std::cell::Cell::new(None),
            },
            key,
            head: head.copy_without_body(),
            entry: entry.clone(),
            overrides: overrides.map(owned_overrides),
        };
        refresh.spawn((upstream.clone(), downstream.clone(), *limits), lead);
        return Before::Answered(answer);
    }
    let validators = config.revalidate.then(|| s.validator_lines()).flatten();
    let revalidating = validators.is_some();
    let filling = filling(overrides, head, validators.as_deref());
    on(
        Mode::Update(status),
        lead,
        entry.clone(),
        Some(filling),
        revalidating,
    )
}

/// What the cache makes of a backend's `answer` to a request [`before`] sent on: stored on its
/// way to the client when the rules let it; a `304` to a revalidation refreshes the stale
/// response, which answers; a failure `use_stale` names is answered with the stale response.
pub(crate) fn after(
    cached: &Cached,
    f: Box<Forwarded>,
    head: &RequestHead,
    mut answer: Answer,
) -> Answer {
    let Forwarded {
        key,
        mode,
        lead,
        stale,
        revalidating,
        ..
    } = *f;
    let status = match mode {
        Mode::NotLookedUp => {
            if policy::invalidates(&head.method, answer.response.status) {
                cached.zone.remove(&key);
            }
            return answer;
        }
        Mode::TimedOut(status) => {
            count(cached, status);
            status_line(cached, &mut answer.response.headers, status);
            return answer;
        }
        Mode::Bypass => CacheStatus::Bypass,
        Mode::Update(status) => status,
    };
    if let Some(s) = stale.as_deref().and_then(stored) {
        if revalidating && answer.response.status == StatusCode::NOT_MODIFIED {
            let refreshed = refresh(cached, &key, head, s, &answer.response.headers, lead);
            let s = refreshed.as_deref().and_then(stored).unwrap_or(s);
            return served(cached, s, head, CacheStatus::Revalidated);
        }
        if stale_on_failure(&cached.config, s, &answer.response) {
            return served(cached, s, head, CacheStatus::Stale);
        }
    }
    count(cached, status);
    if head.method == Method::GET {
        store_on_the_way(cached, key, head, &mut answer.response, lead);
    }
    status_line(cached, &mut answer.response.headers, status);
    answer
}

/// MISS for nothing stored, EXPIRED for a stale response.
fn miss_status(entry: Option<&Entry>) -> CacheStatus {
    match entry.and_then(stored) {
        Some(_) => CacheStatus::Expired,
        None => CacheStatus::Miss,
    }
}

fn count(cached: &Cached, status: CacheStatus) {
    let c = &cached.zone.counters;
    let counter = match status {
        CacheStatus::Hit => &c.hits,
        CacheStatus::Expired => &c.expired,
        CacheStatus::Stale | CacheStatus::Updating => &c.stale,
        CacheStatus::Revalidated => &c.revalidated,
        CacheStatus::Miss => &c.misses,
        CacheStatus::Bypass => &c.bypassed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    cached.status.set(Some(status));
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

/// The answer from `s`, a stored response, counted as `status`: `304 Not Modified` when the
/// request's own condition holds for it.
fn served(cached: &Cached, s: &Stored, head: &RequestHead, status: CacheStatus) -> Answer {
    count(cached, status);
    let not_modified = s.not_modified(head);
    let mut headers = Vec::with_capacity(s.lines.len() + 48);
    headers.extend_from_slice(&s.lines);
    headers.extend_from_slice(b"age: ");
    headers.extend_from_slice(itoa::Buffer::new().format(s.age(Instant::now())).as_bytes());
    headers.extend_from_slice(b"\r\n");
    let (code, body) = if not_modified {
        (StatusCode::NOT_MODIFIED, Bytes::new())
    } else if head.method == Method::HEAD {
        content_length_line(&mut headers, s.body.len() as u64);
        (s.status, Bytes::new())
    } else {
        (s.status, s.body.clone())
    };
    status_line(cached, &mut headers, status);
    Answer {
        response: Reply {
            status: code,
            headers,
            body: ProxyBody::Local(Some(body)),
        },
        upstreamed: None,
        close: false,
    }
}

/// Whether the proxy's answer is a failure `use_stale` (or the stored response's own
/// `stale-if-error`) lets `s` be served instead of: pinlb's own 502 or 503 (`error`: no
/// backend answered, or none could be picked) or 504 (`timeout`), or a backend's status it
/// lists.
fn stale_on_failure(config: &Config, s: &Stored, answer: &Reply<ProxyBody>) -> bool {
    let code = answer.status.as_u16();
    let own = matches!(answer.body, ProxyBody::Local(_));
    let named = match (own, code) {
        (true, 504) => config.use_stale.timeout,
        (true, 502 | 503) => config.use_stale.error,
        (false, c) => config.use_stale.statuses.contains(&c),
        _ => false,
    };
    let failed = (own && code >= 500) || (500..600).contains(&code);
    (named && s.may_be_served_stale()) || (failed && s.may_serve_on_error(Instant::now()))
}

/// The client's lines a request that fills the cache goes without (nginx's
/// `proxy_cache_headers`): its own conditions and ranges would bring back a 304 or a 206, which
/// can't be stored. The client's own condition is answered from what is stored.
const CLIENT_CONDITIONS: [&[u8]; 6] = [
    b"if-none-match",
    b"if-modified-since",
    b"if-match",
    b"if-unmodified-since",
    b"range",
    b"if-range",
];

/// The route's overrides of a request that fills the cache: without the client's conditions
/// and ranges, and with `validators` when the stored response is revalidated.
fn filling(
    overrides: Option<&Overrides>,
    head: &RequestHead,
    validators: Option<&[u8]>,
) -> Overrides {
    let base = overrides
        .and_then(|o| o.lines.as_deref())
        .unwrap_or(head.lines());
    let validators = validators.unwrap_or_default();
    let mut lines = Vec::with_capacity(base.len() + validators.len());
    lines_without(base, &CLIENT_CONDITIONS, &mut lines);
    lines.extend_from_slice(validators);
    Overrides {
        lines: Some(lines),
        ..overrides.map(owned_overrides).unwrap_or_default()
    }
}

/// What a task of its own needs of a route's overrides: all but a mirror's pending copies and
/// the cache.
fn owned_overrides(o: &Overrides) -> Overrides {
    Overrides {
        path: o.path.clone(),
        lines: o.lines.clone(),
        timeouts: o.timeouts,
        preferred: None,
        copies: Vec::new(),
        cache: None,
    }
}

/// `s` refreshed by a `304`'s header `lines`, stored again when it still may be (`lead` let
/// go then): the new entry; `None` when the 304 made it unstorable, and it is forgotten.
fn refresh(
    cached: &Cached,
    key: &[u8],
    head: &RequestHead,
    s: &Stored,
    lines: &[u8],
    lead: Option<Lead>,
) -> Option<Arc<Entry>> {
    let merged = s.refreshed_lines(lines);
    let Some(v) = policy::verdict(&cached.config, head, s.status, &merged) else {
        cached.zone.remove(key);
        return None;
    };
    let p = pending(cached, key.to_vec(), head, (s.status, merged), v, lead);
    Some(store(p, s.body.clone()))
}

/// A stale response's update by a request of pinlb's own, on a task of the worker, while the
/// clients are served the stale one (`background_update`, `stale-while-revalidate`).
struct Refresh {
    cached: Cached,
    key: Vec<u8>,
    head: RequestHead,
    entry: Option<Arc<Entry>>,
    overrides: Option<Overrides>,
}

impl Refresh {
    /// Sends it on its own task, through `upstream` as the client's request would have gone;
    /// `lead`, the hold on the key, goes with it.
    fn spawn(
        self,
        (upstream, downstream, limits): (Rc<WorkerUpstream>, Rc<Downstream>, Limits),
        lead: Option<Lead>,
    ) {
        tokio::task::spawn_local(async move {
            let Refresh {
                cached,
                key,
                head,
                entry,
                overrides,
            } = self;
            let s = entry.as_deref().and_then(stored);
            let validators = s.and_then(|s| cached.config.revalidate.then(|| s.validator_lines()));
            let validators = validators.flatten();
            let revalidating = validators.is_some();
            let ov = filling(overrides.as_ref(), &head, validators.as_deref());
            let idle = ov
                .timeouts
                .unwrap_or(upstream.shared.config.timeouts)
                .response;
            let sent = own_request(&upstream, &downstream, &limits, (&head, &ov), None);
            match sent.await {
                Ok(reply) if revalidating && reply.status == StatusCode::NOT_MODIFIED => {
                    if let Some(s) = s {
                        refresh(&cached, &key, &head, s, &reply.headers, lead);
                    }
                }
                Ok(mut reply) => {
                    store_on_the_way(&cached, key, &head, &mut reply, lead);
                    // A body that stalls lets the key go after the response timeout.
                    drain(&mut reply.body, idle).await;
                }
                Err(e) => {
                    let upstream = &upstream.shared.config.name;
                    debug!(upstream = %upstream, "a cache's background update got no answer: {e}");
                }
            }
        });
    }
}

/// A response with head `status` and `lines` under `key`, on its way to be stored for `v`.
fn pending(
    cached: &Cached,
    key: Vec<u8>,
    head: &RequestHead,
    (status, lines): (StatusCode, Vec<u8>),
    v: Verdict,
    lead: Option<Lead>,
) -> Pending {
    Pending {
        zone: cached.zone.clone(),
        variant: (!v.vary.is_empty()).then(|| variant_key(&key, &v.vary, head)),
        key,
        status,
        lines: kept_lines(&lines),
        age: v.age,
        fresh_for: v.fresh_for,
        vary: v.vary,
        while_revalidating: v.while_revalidating,
        if_error: v.if_error,
        stale_forbidden: v.stale_forbidden,
        lead,
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
    let config = &cached.config;
    if matches!(response.body, ProxyBody::Local(_)) || config.stores_nothing_for(head) {
        // pinlb's own 502/503/504, with nothing of the backend's to keep; or `no_cache`.
        return;
    }
    if config.min_uses > 1 && cached.zone.used(&key) < config.min_uses {
        return;
    }
    let Some(v) = policy::verdict(&cached.config, head, response.status, &response.headers) else {
        return;
    };
    let lines = response.headers.clone();
    let p = pending(cached, key, head, (response.status, lines), v, lead);
    let body = std::mem::replace(&mut response.body, ProxyBody::Local(None));
    response.body = body.filtered(Filter::Cache(Fill::new(p)));
}

/// The header lines a stored response keeps: all but `Set-Cookie` (stored only when ignored,
/// and then without it), `Age` (made anew for each hit) and `Date` (the session writes the
/// time of each answer, and `Age` says how old the response is).
fn kept_lines(lines: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(lines.len());
    lines_without(lines, &[b"set-cookie", b"age", b"date"], &mut out);
    out
}

/// Appends to `out` the header `lines` (`name: value\r\n` each) not named one of `names`
/// (lower case).
fn lines_without(lines: &[u8], names: &[&[u8]], out: &mut Vec<u8>) {
    for line in lines.split_inclusive(|&b| b == b'\n') {
        let name = line
            .split(|&b| b == b':')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if !names.iter().any(|n| name.eq_ignore_ascii_case(n)) {
            out.extend_from_slice(line);
        }
    }
}

/// `status_header: STATUS`, when the route names one.
fn status_line(cached: &Cached, headers: &mut Vec<u8>, status: CacheStatus) {
    if let Some(name) = &cached.config.status_header {
        headers.extend_from_slice(name);
        headers.extend_from_slice(status.as_str().as_bytes());
        headers.extend_from_slice(b"\r\n");
    }
}
