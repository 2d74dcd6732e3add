//! `cache`: nginx's `proxy_cache`, by the rules of RFC 9111. A listener's or a route's proxied
//! responses are kept in a zone of the process's memory (`[cache.NAME]`, nginx's
//! `proxy_cache_path … keys_zone=NAME`), shared by every worker, and later requests for the same
//! key are answered from it while the response is fresh:
//!
//! ```toml
//! [cache.micro]
//! max_size = "64MiB"              # what its responses (heads and bodies) may take in all
//!
//! [[listener]]                    # or [[listener.route]]; a route's `cache = false` turns it off
//! cache = { zone = "micro", valid = { "200 301 302" = "1s" }, status_header = "X-Cache-Status" }
//! ```
//!
//! - What is stored is what RFC 9111 lets a shared cache store (`http-cache-semantics`):
//!   `no-store`, `private`, a request with `Authorization`, a status the rules don't
//!   understand are not; how long it stays fresh is the response's (`s-maxage`, `max-age`,
//!   `Expires`, the heuristic from `Last-Modified`), or `valid`'s for its status when the
//!   response gives none (nginx's `proxy_cache_valid`; `any` for every status). A response with
//!   `Set-Cookie` or `Vary: *` is not stored (nginx's rule), nor one over the zone's
//!   `max_object`. `ignore_headers` (nginx's `proxy_ignore_headers`) leaves `Cache-Control`,
//!   `Expires`, `Set-Cookie` or `Vary` out of that decision; an ignored `Set-Cookie` is not
//!   stored, so one client's cookie never goes to another.
//! - The key is `key` rendered for the request (`{scheme}://{host}{uri}` by default, nginx's
//!   `proxy_cache_key`). A response that varies (`Vary`) is kept per value of the headers it
//!   names, as nginx keeps its variants.
//! - `GET` and `HEAD` are looked up (nginx's `proxy_cache_methods` default; `POST` is refused:
//!   a key of the URL can't tell POSTs apart); a `HEAD` is answered from a stored `GET`, and a
//!   `HEAD` that misses goes to the backend as it is and is not stored (nginx turns it into a
//!   `GET`; pinlb does not change the method). A request with another method goes on, and a
//!   `POST`, `PUT`, `PATCH` or `DELETE` answered with a success removes what its key holds
//!   (RFC 9111 section 4.4).
//! - A request that fills the cache goes without the client's conditions and ranges
//!   (`If-None-Match`, `If-Modified-Since`, `If-Match`, `If-Unmodified-Since`, `Range`,
//!   `If-Range`: nginx's `proxy_cache_headers`), so its answer can be stored. A request the
//!   client made conditional is answered `304 Not Modified` from a fresh stored 2xx it matches. The client's own
//!   `Cache-Control` is not obeyed, as nginx does not: a client can't make every request miss.
//! - `lock` (on by default; nginx's `proxy_cache_lock`, off there): of the requests that miss
//!   one key at once, across every worker, one goes to the backend and the others wait for its
//!   response, at most `lock_timeout` (5 s), after which they go to the backend themselves and
//!   their responses are not stored (nginx's rule).
//! - A stale response is revalidated (`revalidate`, on by default: nginx's
//!   `proxy_cache_revalidate`), served instead of the backend's failure (`use_stale`, nginx's
//!   `proxy_cache_use_stale`, and the response's own `stale-if-error`), served while another
//!   request updates it (`use_stale` `updating`, `stale-while-revalidate`), or served at once
//!   while a request of pinlb's own updates it (`background_update`): `proxy::cache`.
//! - `status_header` names a response header that says what the cache did (nginx's
//!   `add_header X-Cache-Status $upstream_cache_status`): `HIT`, `MISS`, `EXPIRED`, `STALE`,
//!   `UPDATING`, `REVALIDATED` or `BYPASS`; the access log's `cache_status` field says the same.
//! - `bypass`, `no_cache` and `min_uses` are nginx's `proxy_cache_bypass`, `proxy_no_cache`
//!   and `proxy_cache_min_uses`, with `header:NAME`, `cookie:NAME` and `arg:NAME` for nginx's
//!   `$http_`, `$cookie_` and `$arg_` variables.
//!
//! - [`policy`]: RFC 9111's rules: whether a response may be stored, and for how long.
//! - [`stored`]: what a key holds: a stored response and its freshness, or its variants' names.
//! - [`zone`]: `[cache.NAME]` and its store, shared by every worker, with the misses in flight.
//! - [`fill`]: the body filter that stores a response once its body went out whole.

pub(crate) mod fill;
pub(crate) mod policy;
pub(crate) mod stored;
pub mod zone;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use serde::{Deserialize, Serialize};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use toml::Spanned;

use super::{BodyFilter, Module, Place};
use crate::http1::request::RequestHead;
use crate::syntax::error::ConfigError;
use crate::syntax::template::{Request, Template};
use crate::syntax::values::Dur;

pub(crate) use fill::Fill;

/// The module.
pub(crate) enum Cache {}

/// Its key as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub cache: Option<Spanned<Switch>>,
}

/// `cache = { … }`, or `cache = false` on a route whose listener caches.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Switch {
    Off(bool),
    On(Box<RawCache>),
}

impl<'de> Deserialize<'de> for Switch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Switch;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table such as { zone = \"NAME\" }, or false")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Switch, E> {
                Ok(Switch::Off(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Switch, A::Error> {
                RawCache::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|c| Switch::On(Box::new(c)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `cache = { … }`'s keys.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    pub zone: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
    pub valid: Option<BTreeMap<Spanned<String>, Spanned<Dur>>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    pub lock: Option<Spanned<bool>>,
    pub lock_timeout: Option<Spanned<Dur>>,
    pub status_header: Option<Spanned<String>>,
    pub ignore_headers: Option<Spanned<Vec<Spanned<String>>>>,
    pub use_stale: Option<Spanned<Vec<Spanned<String>>>>,
    pub background_update: Option<Spanned<bool>>,
    pub revalidate: Option<Spanned<bool>>,
    pub bypass: Option<Spanned<Vec<Spanned<String>>>>,
    pub no_cache: Option<Spanned<Vec<Spanned<String>>>>,
    pub min_uses: Option<Spanned<u32>>,
}

/// `key` when left out: nginx's `$scheme$proxy_host$request_uri`, with the request's host.
pub(crate) const DEFAULT_KEY: &str = "{scheme}://{host}{uri}";
/// `lock_timeout` when left out: nginx's `proxy_cache_lock_timeout`.
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// The response headers `ignore_headers` may name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ignore {
    pub cache_control: bool,
    pub expires: bool,
    pub set_cookie: bool,
    pub vary: bool,
}

/// When a stale response is served (nginx's `proxy_cache_use_stale`): on the proxy's own
/// failure to get an answer (`error`: no backend to pick, or none connected or answered
/// whole; `timeout`), on a backend's answer with a listed status, and while another request
/// updates it (`updating`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UseStale {
    pub error: bool,
    pub timeout: bool,
    pub updating: bool,
    /// `http_500`, `http_502`…: a backend's answer with one of these statuses.
    pub statuses: Vec<u16>,
}

/// A request's value that `bypass` and `no_cache` test (nginx's `$http_NAME`, `$cookie_NAME`,
/// `$arg_NAME`): it holds when the request has it, not empty and not `0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Condition {
    Header(String),
    Cookie(String),
    Arg(String),
}

impl Condition {
    fn parse(s: &str) -> Option<Condition> {
        let (kind, name) = s.split_once(':')?;
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        let name = name.to_string();
        match kind {
            "header" => Some(Condition::Header(name.to_ascii_lowercase())),
            "cookie" => Some(Condition::Cookie(name)),
            "arg" => Some(Condition::Arg(name)),
            _ => None,
        }
    }

    fn holds(&self, head: &RequestHead) -> bool {
        let value = match self {
            Condition::Header(n) => head.header_values(n).find(|v| !v.is_empty()),
            Condition::Cookie(n) => head.cookie(n),
            Condition::Arg(n) => head.arg(n),
        };
        value.is_some_and(|v| v != b"0")
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Header(n) => write!(f, "header:{n}"),
            Condition::Cookie(n) => write!(f, "cookie:{n}"),
            Condition::Arg(n) => write!(f, "arg:{n}"),
        }
    }
}

/// `use_stale`'s values with a status.
const STALE_STATUSES: [u16; 7] = [500, 502, 503, 504, 403, 404, 429];

/// A cache that is on, for one listener or route.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Config {
    /// Its zone, by index in the configuration's `[cache.NAME]` tables (name order).
    pub zone: usize,
    zone_name: String,
    key: Template,
    /// Lifetimes for responses that give none, by status (`None`: any status), in the
    /// order they apply: the first that names a status wins.
    pub valid: Vec<(Option<Vec<u16>>, Duration)>,
    /// Looked up: `GET` and `HEAD` by default.
    methods: Vec<Method>,
    /// How long a miss waits for the same key's request in flight; `None`: it does not.
    pub lock: Option<Duration>,
    /// `name: ` of the response header that says what the cache did.
    pub status_header: Option<Vec<u8>>,
    pub ignore: Ignore,
    pub use_stale: UseStale,
    /// A stale response is served at once while a request of pinlb's own updates it (nginx's
    /// `proxy_cache_background_update`; needs `use_stale` with `updating`).
    pub background_update: bool,
    /// An expired response with a validator is asked for again conditionally, and a `304`
    /// refreshes it (nginx's `proxy_cache_revalidate`).
    pub revalidate: bool,
    /// A request any of these hold for is not answered from the cache (nginx's
    /// `proxy_cache_bypass`); its response may be stored.
    bypass: Vec<Condition>,
    /// A request any of these hold for does not have its response stored (nginx's
    /// `proxy_no_cache`).
    no_cache: Vec<Condition>,
    /// The misses of a key before its response is stored (nginx's `proxy_cache_min_uses`).
    pub min_uses: u32,
}

impl Config {
    /// Whether a request with `method` is looked up in the cache.
    pub(crate) fn looks_up(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// The key of `request`.
    pub(crate) fn key(&self, request: &Request<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.key.render(request, &mut out);
        out
    }

    /// Whether `head` is not to be answered from the cache (`bypass`).
    pub(crate) fn bypasses(&self, head: &RequestHead) -> bool {
        self.bypass.iter().any(|c| c.holds(head))
    }

    /// Whether `head`'s response is not to be stored (`no_cache`).
    pub(crate) fn stores_nothing_for(&self, head: &RequestHead) -> bool {
        self.no_cache.iter().any(|c| c.holds(head))
    }

    /// `valid`'s lifetime for a response with `status`, if it names one.
    pub(crate) fn valid_for(&self, status: u16) -> Option<Duration> {
        self.valid
            .iter()
            .find(|(codes, _)| codes.as_ref().is_none_or(|c| c.contains(&status)))
            .map(|(_, d)| *d)
    }
}

impl Module for Cache {
    const KEYS: &'static [&'static str] = &["cache"];
    type Raw = Raw;
    type Config = Config;
    type Local = ();
    type Filter = Fill;

    fn validate(
        at: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<Config>>,
    ) -> Result<Option<Arc<Config>>, ConfigError> {
        let key = format!("{}.cache", at.key);
        match raw.cache.as_ref().map(|s| (s.span(), s.get_ref())) {
            None => Ok(inherited.cloned()),
            Some((_, Switch::Off(false))) => Ok(None),
            Some((span, Switch::Off(true))) => Err(at.src.at(
                span,
                &key,
                "true says nothing of where to keep responses, expected a table such as { zone = \"NAME\" }, or false to turn a listener's cache off",
            )),
            Some((span, Switch::On(raw))) => validate(at, &key, span, raw).map(|c| Some(Arc::new(c))),
        }
    }

    fn describe(config: &Config) -> String {
        let mut out = format!("cache in zone {}, key {}", config.zone_name, config.key);
        for (codes, d) in &config.valid {
            let codes = match codes {
                None => "any".to_string(),
                Some(c) => c.iter().map(u16::to_string).collect::<Vec<_>>().join(" "),
            };
            out.push_str(&format!(", valid {codes} {}", humantime::format_duration(*d)));
        }
        match config.lock {
            Some(t) => out.push_str(&format!(", lock {}", humantime::format_duration(t))),
            None => out.push_str(", no lock"),
        }
        out
    }
}

/// `cache = { … }` at `key`, whose table is at `span`.
fn validate(
    at: &Place<'_>,
    key: &str,
    span: std::ops::Range<usize>,
    raw: &RawCache,
) -> Result<Config, ConfigError> {
    let src = at.src;
    let Some(zone_name) = &raw.zone else {
        return Err(src.at(
            span,
            &format!("{key}.zone"),
            "missing, expected the name of a [cache.NAME] table",
        ));
    };
    let Some(zone) = at.caches.iter().position(|z| z == zone_name.get_ref()) else {
        let known = match at.caches {
            [] => "there is no [cache.NAME] table".to_string(),
            names => format!("expected one of {}", names.join(", ")),
        };
        return Err(src.at(
            zone_name.span(),
            &format!("{key}.zone"),
            format!("unknown cache zone \"{}\", {known}", zone_name.get_ref()),
        ));
    };
    let template = match &raw.key {
        None => Template::parse(DEFAULT_KEY).map_err(|e| src.at(span.clone(), key, e))?,
        Some(k) => Template::parse(k.get_ref())
            .map_err(|e| src.at(k.span(), &format!("{key}.key"), e))?,
    };
    let mut valid = Vec::new();
    for (codes, d) in raw.valid.iter().flatten() {
        let at_key = format!("{key}.valid");
        let listed = match codes.get_ref().trim() {
            "any" => None,
            list => {
                let mut out = Vec::new();
                for c in list.split_whitespace() {
                    match c.parse::<u16>() {
                        Ok(n @ 100..=599) => out.push(n),
                        _ => {
                            return Err(src.at(
                                codes.span(),
                                &at_key,
                                format!("\"{c}\" is not a status, expected statuses such as \"200 301\", or \"any\""),
                            ));
                        }
                    }
                }
                if out.is_empty() {
                    return Err(src.at(codes.span(), &at_key, "expected statuses such as \"200 301\", or \"any\""));
                }
                Some(out)
            }
        };
        valid.push((listed, d.get_ref().0));
    }
    // The statuses a table names before `any`, which applies to the rest (nginx's order).
    valid.sort_by_key(|(codes, _)| codes.is_none());
    let methods = match &raw.methods {
        None => vec![Method::GET, Method::HEAD],
        Some(list) => {
            for m in list.get_ref() {
                match m.get_ref().as_str() {
                    "GET" | "HEAD" => {}
                    "POST" => {
                        return Err(src.at(
                            m.span(),
                            &format!("{key}.methods"),
                            "POST is not cached: pinlb keys responses by URL, and a POST's answer depends on its body; expected GET or HEAD",
                        ));
                    }
                    other => {
                        return Err(src.at(
                            m.span(),
                            &format!("{key}.methods"),
                            format!("\"{other}\" is not a method a cache looks up, expected GET or HEAD"),
                        ));
                    }
                }
            }
            vec![Method::GET, Method::HEAD]
        }
    };
    let lock_on = raw.lock.as_ref().is_none_or(|l| *l.get_ref());
    let lock_timeout = raw.lock_timeout.as_ref().map_or(DEFAULT_LOCK_TIMEOUT, |t| t.get_ref().0);
    let status_header = match &raw.status_header {
        None => None,
        Some(h) => {
            let name = h.get_ref();
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(src.at(
                    h.span(),
                    &format!("{key}.status_header"),
                    format!("\"{name}\" is not a header name, expected one such as \"X-Cache-Status\""),
                ));
            }
            Some(format!("{name}: ").into_bytes())
        }
    };
    let mut ignore = Ignore::default();
    for h in raw.ignore_headers.iter().flat_map(|l| l.get_ref()) {
        match h.get_ref().to_ascii_lowercase().as_str() {
            "cache-control" => ignore.cache_control = true,
            "expires" => ignore.expires = true,
            "set-cookie" => ignore.set_cookie = true,
            "vary" => ignore.vary = true,
            _ => {
                return Err(src.at(
                    h.span(),
                    &format!("{key}.ignore_headers"),
                    format!("\"{}\" is not a header the cache reads, expected Cache-Control, Expires, Set-Cookie or Vary", h.get_ref()),
                ));
            }
        }
    }
    let mut use_stale = UseStale::default();
    for v in raw.use_stale.iter().flat_map(|l| l.get_ref()) {
        let status = v.get_ref().strip_prefix("http_").and_then(|s| s.parse::<u16>().ok());
        match (v.get_ref().as_str(), status) {
            ("error", _) => use_stale.error = true,
            ("timeout", _) => use_stale.timeout = true,
            ("updating", _) => use_stale.updating = true,
            (_, Some(s)) if STALE_STATUSES.contains(&s) => use_stale.statuses.push(s),
            (other, _) => {
                return Err(src.at(
                    v.span(),
                    &format!("{key}.use_stale"),
                    format!("\"{other}\" is not a case for a stale response, expected error, timeout, updating, http_500, http_502, http_503, http_504, http_403, http_404 or http_429"),
                ));
            }
        }
    }
    let conditions = |list: &Option<Spanned<Vec<Spanned<String>>>>, name: &str| {
        let mut out = Vec::new();
        for v in list.iter().flat_map(|l| l.get_ref()) {
            match Condition::parse(v.get_ref()) {
                Some(c) => out.push(c),
                None => {
                    return Err(src.at(
                        v.span(),
                        &format!("{key}.{name}"),
                        format!("\"{}\" is not a request value, expected \"header:NAME\", \"cookie:NAME\" or \"arg:NAME\"", v.get_ref()),
                    ));
                }
            }
        }
        Ok(out)
    };
    let (bypass, no_cache) = (conditions(&raw.bypass, "bypass")?, conditions(&raw.no_cache, "no_cache")?);
    let min_uses = match &raw.min_uses {
        Some(m) if *m.get_ref() == 0 => {
            return Err(src.at(m.span(), &format!("{key}.min_uses"), "expected 1 or more"));
        }
        Some(m) => *m.get_ref(),
        None => 1,
    };
    let background_update = match &raw.background_update {
        Some(b) if *b.get_ref() && !use_stale.updating => {
            return Err(src.at(
                b.span(),
                &format!("{key}.background_update"),
                "serves the stale response while it is updated, which use_stale allows only with \"updating\", expected use_stale = [\"updating\", …] beside it",
            ));
        }
        Some(b) => *b.get_ref(),
        None => false,
    };
    Ok(Config {
        zone,
        zone_name: zone_name.get_ref().clone(),
        key: template,
        valid,
        methods,
        lock: lock_on.then_some(lock_timeout),
        status_header,
        ignore,
        use_stale,
        background_update,
        revalidate: raw.revalidate.as_ref().is_none_or(|r| *r.get_ref()),
        bypass,
        no_cache,
        min_uses,
    })
}

/// A request on its way through a route's cache: the route's configuration, its zone in this
/// process, and what the cache did (for the request's log line).
pub(crate) struct Cached {
    pub config: Arc<Config>,
    pub zone: Arc<zone::Zone>,
    pub status: std::cell::Cell<Option<CacheStatus>>,
}

impl fmt::Debug for Cached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cached({})", self.zone.name)
    }
}

/// What the cache did for one response: nginx's `$upstream_cache_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Answered from a fresh stored response.
    Hit,
    /// Nothing stored for its key: the backend answered.
    Miss,
    /// What was stored was no longer fresh: the backend answered.
    Expired,
    /// A stale response, served since the backend failed (`use_stale`), or while a request of
    /// pinlb's own updates it (`background_update`).
    Stale,
    /// A stale response, served while another request updates it (`use_stale` `updating`).
    Updating,
    /// A stale response the backend said is still good (`304` to a conditional request).
    Revalidated,
    /// Not answered from the cache: `bypass` holds for the request.
    Bypass,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Miss => "MISS",
            CacheStatus::Expired => "EXPIRED",
            CacheStatus::Stale => "STALE",
            CacheStatus::Updating => "UPDATING",
            CacheStatus::Revalidated => "REVALIDATED",
            CacheStatus::Bypass => "BYPASS",
        }
    }
}

impl BodyFilter for Fill {
    fn push(&mut self, piece: Option<bytes::Bytes>) -> std::io::Result<()> {
        self.take(piece);
        Ok(())
    }
    fn poll_out(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<bytes::Bytes>> {
        std::task::Poll::Ready(self.out())
    }
    fn is_empty(&self) -> bool {
        self.holds_nothing()
    }
    fn keeps_length(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::error::Source;

    fn config(toml_text: &str, caches: &[&str]) -> Result<Option<Arc<Config>>, String> {
        let src = Source { file: "t.toml", text: toml_text };
        let raw: Raw = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        let at = Place { src: &src, key: "listener[0]", upstreams: &[], caches, tls: None };
        Cache::validate(&at, &raw, None).map_err(|e| e.to_string())
    }

    #[test]
    fn statuses_are_tried_before_any_and_only_get_and_head_are_looked_up() {
        let c = config(
            "cache = { zone = \"z\", valid = { any = \"1m\", \"200 302\" = \"10m\" }, methods = [\"GET\"] }",
            &["z"],
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.valid_for(200), Some(Duration::from_secs(600)));
        assert_eq!(c.valid_for(404), Some(Duration::from_secs(60)));
        assert!(c.looks_up(&Method::GET) && c.looks_up(&Method::HEAD));
        assert!(!c.looks_up(&Method::POST));
        assert_eq!(c.lock, Some(DEFAULT_LOCK_TIMEOUT));
    }

    #[test]
    fn a_zone_must_exist_and_a_status_be_one() {
        let e = config("cache = { zone = \"nope\" }", &["micro"]).unwrap_err();
        assert!(e.contains("unknown cache zone \"nope\", expected one of micro"), "{e}");
        let e = config("cache = { zone = \"micro\", valid = { \"2xx\" = \"1s\" } }", &["micro"])
            .unwrap_err();
        assert!(e.contains("\"2xx\" is not a status"), "{e}");
        let e = config("cache = true", &["micro"]).unwrap_err();
        assert!(e.contains("expected a table such as { zone = \"NAME\" }, or false"), "{e}");
        assert!(config("cache = false", &["micro"]).unwrap().is_none());
    }
}
