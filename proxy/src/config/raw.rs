//! The file as written: serde types that mirror it, and the deserialisers of its value types.
//!
//! Every table denies unknown keys. A value that validation may need to point at is kept as
//! [`Spanned`], so that its error can name the line and column; a key left out is `None`, and
//! validation fills in the default from the validated type's `Default` impl. Only the keys of a
//! table that also has required keys (an upstream, a backend) get their defaults here, from a
//! named function.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use toml::Spanned;

use super::{Algorithm, Protocol, StatusSet};
use crate::modules::{self, RawModules, Taken};
use crate::syntax::error::{ConfigError, ConfigErrors, Source};
use crate::syntax::keys;
pub use crate::syntax::values::{Dur, Size};
use crate::sys::cpus::parse_cpu_list;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default, skip_serializing_if = "is_default")]
    pub runtime: RawRuntime,
    #[serde(default, rename = "listener", skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<RawListener>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub upstream: BTreeMap<String, RawUpstream>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: RawLimits,
    #[serde(default, skip_serializing_if = "is_default")]
    pub forwarded: RawForwarded,
    pub admin: Option<RawAdmin>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub log: RawLog,
    #[serde(default, skip_serializing_if = "is_default")]
    pub http2: RawHttp2,
    #[serde(default, skip_serializing_if = "is_default")]
    pub resolver: RawResolver,
    pub request_id: Option<crate::modules::request_id::Raw>,
    /// `[limit.NAME]`: the rate zones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limit: BTreeMap<String, modules::rate_limit::RawRateZone>,
    /// `[cache.NAME]`: the response cache's zones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cache: BTreeMap<String, crate::modules::cache::zone::RawZone>,
}

/// `[resolver]`: where backends' DNS names are looked up.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawResolver {
    pub nameservers: Option<Vec<Spanned<String>>>,
}

/// `[upstream.NAME.resolve]`: how often its backends' names are looked up again.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawResolve {
    pub interval: Option<Spanned<Dur>>,
    pub min_interval: Option<Spanned<Dur>>,
}

/// What [`RawConfig::parse`] read: the file's values less the keys whose values were wrong,
/// and the errors of those keys.
pub(super) struct Parsed {
    pub raw: RawConfig,
    /// One for each key left out, in the order found.
    pub errors: Vec<ConfigError>,
    /// The dotted paths of the keys left out (as an error's key writes them:
    /// `upstream.app.backends[0].weight`), so that validation does not report again what their
    /// absence causes.
    pub dropped: Vec<String>,
}

/// The most errors one file is read for: each costs a deserialisation of the whole file.
const MAX_ERRORS: usize = 100;

/// Serde's key for the value inside a `Spanned`; users never wrote it.
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";

impl RawConfig {
    /// Deserialises `src`'s text, reporting every wrong key at once. A type error names the key
    /// as the user wrote it and points at the value.
    ///
    /// Serde stops at the first error, so the document is parsed once and deserialised again
    /// with each wrong key taken out (an unknown key, a value of the wrong type; the whole list
    /// for a wrong element of one), until the rest deserialises: every table's mistakes are
    /// then found, in whatever order serde meets them. A syntax error stops at itself: what
    /// follows one can't be read reliably. A table that lacks a key it needs (missing, or taken
    /// out for its wrong value) can't be built, so its whole section (`listener`, `upstream`…)
    /// is taken out and the other sections are read on; the file is then not validated
    /// further, and the errors of its keys are what is reported.
    pub(super) fn parse(src: &Source) -> Result<Parsed, ConfigErrors> {
        let mut doc = toml::de::DeTable::parse(src.text)
            .map_err(|e| src.at(e.span().unwrap_or(0..0), "", e.message()))?;
        let mut errors = Vec::new();
        let taken = take_module_keys(doc.get_mut());
        let mut dropped = Vec::new();
        // Sections taken out whole: the file can't then be validated as a whole.
        let mut sections_dropped = false;
        // Bounded: every pass returns, or takes a key out of the document.
        for _ in 0..MAX_ERRORS {
            let de = toml::Deserializer::from(doc.clone());
            let e = match serde_path_to_error::deserialize(de) {
                Ok(_) if sections_dropped => break,
                Ok(mut raw) => {
                    read_module_keys(src, &taken, &mut raw, &mut errors);
                    return Ok(Parsed {
                        raw,
                        errors,
                        dropped,
                    });
                }
                Err(e) => e,
            };
            let steps = steps(e.path());
            let key = e
                .path()
                .to_string()
                .replace(&format!(".{SPANNED_VALUE}"), "");
            let key = if key == "." { String::new() } else { key };
            let inner = e.into_inner();
            let mut message = inner.message().to_string();
            // A required key taken out for its wrong value: its error is reported already.
            let consequence =
                missing_field(&message).is_some_and(|field| dropped.contains(&join(&key, field)));
            if !consequence {
                with_module_keys(&key, &mut message);
                if let Some(hint) = elsewhere(&key, &message) {
                    message.push_str("; ");
                    message.push_str(&hint);
                }
                errors.push(src.at(inner.span().unwrap_or(0..0), &key, message));
            }
            let Some(steps) = steps else { break };
            let last = steps.iter().rposition(|s| matches!(s, Step::Key(_)));
            let wrong_key = last.filter(|_| missing_field(inner.message()).is_none());
            if let Some(last) = wrong_key
                && take_out(doc.get_mut(), &steps[..=last])
            {
                dropped.push(path_text(&steps[..=last]));
                continue;
            }
            // A table without a key it needs: its whole section goes, so that the others are
            // still read for their own mistakes.
            match steps.first() {
                Some(Step::Key(section)) if doc.get_mut().remove(section.as_str()).is_some() => {
                    sections_dropped = true;
                }
                _ => break,
            }
        }
        Err(ConfigErrors::new(errors).expect("a pass that did not deserialise left an error"))
    }
}

/// Each listener's module keys and each of its routes', by index.
type TakenKeys<'a> = Vec<(Taken<'a>, Vec<Taken<'a>>)>;

/// Takes the feature modules' keys (`modules::KEYS`) out of each `[[listener]]` table of `doc`,
/// and those a route may have (`modules::ROUTE_KEYS`) out of each `[[listener.route]]`, so that
/// serde reads the rest of each table as before (a listener-only key in a route is unknown
/// there) and each module reads its own ([`read_module_keys`]).
fn take_module_keys<'a>(doc: &mut toml::de::DeTable<'a>) -> TakenKeys<'a> {
    use toml::de::DeValue;
    let take = |table: &mut toml::de::DeTable<'a>, keys: &[&[&str]]| {
        let mut taken = Taken::new();
        for key in keys.iter().flat_map(|k| k.iter()) {
            if let Some((k, v)) = table.remove_entry(*key) {
                taken.insert(k, v);
            }
        }
        taken
    };
    let Some(DeValue::Array(listeners)) = doc.get_mut("listener").map(|l| l.get_mut()) else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(listeners.len());
    for listener in listeners.iter_mut() {
        let DeValue::Table(table) = listener.get_mut() else {
            out.push((Taken::new(), Vec::new()));
            continue;
        };
        let own = take(table, modules::KEYS);
        let routes = match table.get_mut("route").map(|r| r.get_mut()) {
            Some(DeValue::Array(routes)) => (routes.iter_mut())
                .map(|r| match r.get_mut() {
                    DeValue::Table(route) => take(route, modules::ROUTE_KEYS),
                    _ => Taken::new(),
                })
                .collect(),
            _ => Vec::new(),
        };
        out.push((own, routes));
    }
    out
}

/// Each module reads its keys `taken` from the listeners and routes of `raw`; the errors of
/// wrong ones are added to `errors`.
fn read_module_keys(
    src: &Source,
    taken: &TakenKeys<'_>,
    raw: &mut RawConfig,
    errors: &mut Vec<ConfigError>,
) {
    for (i, (listener, (own, routes))) in raw.listeners.iter_mut().zip(taken).enumerate() {
        let key = format!("listener[{i}]");
        listener.modules = RawModules::read(src, &key, own, errors);
        listener.module_keys = (own.iter())
            .map(|(k, _)| (k.get_ref().to_string(), k.span()))
            .collect();
        for (j, (route, taken)) in listener.route.iter_mut().zip(routes).enumerate() {
            let key = format!("{key}.route[{j}]");
            route.get_mut().modules = RawModules::read(src, &key, taken, errors);
        }
    }
}

/// One step of the way to a value: a table's key or a list's index.
#[derive(Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// `path`'s steps, without serde's `Spanned` ones; `None` where a step is not a key or an index.
fn steps(path: &serde_path_to_error::Path) -> Option<Vec<Step>> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter(|s| !matches!(s, Segment::Map { key } if key == SPANNED_VALUE))
        .map(|s| match s {
            Segment::Map { key } => Some(Step::Key(key.clone())),
            Segment::Enum { variant } => Some(Step::Key(variant.clone())),
            Segment::Seq { index } => Some(Step::Index(*index)),
            Segment::Unknown => None,
        })
        .collect()
}

/// `steps` as an error's key writes them: `upstream.app.backends[0].weight`.
fn path_text(steps: &[Step]) -> String {
    let mut text = String::new();
    for step in steps {
        match step {
            Step::Key(k) => text = join(&text, k),
            Step::Index(i) => text.push_str(&format!("[{i}]")),
        }
    }
    text
}

/// `table.key`, or `key` at the top level.
fn join(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_string()
    } else {
        format!("{table}.{key}")
    }
}

/// The field of serde's "missing field `NAME`" message.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// Takes the key at the end of `steps` out of `table`; false when the way there does not exist.
fn take_out(table: &mut toml::de::DeTable<'_>, steps: &[Step]) -> bool {
    match steps {
        [Step::Key(k)] => table.remove(k.as_str()).is_some(),
        [Step::Key(k), rest @ ..] => table
            .get_mut(k.as_str())
            .is_some_and(|v| take_out_of(v.get_mut(), rest)),
        _ => false,
    }
}

fn take_out_of(value: &mut toml::de::DeValue<'_>, steps: &[Step]) -> bool {
    use toml::de::DeValue;
    match (value, steps) {
        (DeValue::Table(t), _) => take_out(t, steps),
        (DeValue::Array(a), [Step::Index(i), rest @ ..]) => a
            .get_mut(*i)
            .is_some_and(|v| take_out_of(v.get_mut(), rest)),
        _ => false,
    }
}

/// Whether a validation error about `key` may only be a consequence of the key at `dropped`
/// having been left out: it is about that key's value (`dropped` is `key` or a table above it),
/// or about a table that holds it.
pub(super) fn follows_from(key: &str, dropped: &str) -> bool {
    let under = |inner: &str, outer: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    };
    under(key, dropped) || under(dropped, key)
}

/// Every table of the file and its keys, as [`keys::of`] reads them from [`RawConfig`] and from
/// each module's keys: made once, when a file first has an unknown key.
pub(super) fn tables() -> &'static keys::Tables {
    static TABLES: OnceLock<keys::Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut tables = keys::of::<RawConfig>();
        // The modules' keys, which serde reads apart, are keys of the listener and its routes.
        for (module, on_routes) in RawModules::tables() {
            let homes: &[&str] = match on_routes {
                true => &["listener", "listener.route"],
                false => &["listener"],
            };
            for (shape, keys) in module {
                for &table in homes {
                    let table = if shape.is_empty() {
                        table.to_string()
                    } else {
                        format!("{table}.{shape}")
                    };
                    tables
                        .entry(table)
                        .or_default()
                        .extend(keys.iter().copied());
                }
            }
        }
        tables
    })
}

/// The most tables an unknown key's hint names: a key that many tables have (`address`,
/// `status`) says nothing about where it was meant to go.
const MAX_HOMES: usize = 3;

/// For serde's unknown-field `message` about the key at dotted path `key`
/// (`upstream.app.backends[0].max_fails`): where that key belongs, when another table
/// has it (`max_fails is a key of [upstream.app.passive], not of a backend`).
fn elsewhere(key: &str, message: &str) -> Option<String> {
    if !message.starts_with("unknown field") {
        return None;
    }
    let (table, name) = key.rsplit_once('.').unwrap_or(("", key));
    // The upstream it was written under names the one it belongs to.
    let upstream = table
        .strip_prefix("upstream.")
        .map(|rest| rest.split(['.', '[']).next().unwrap_or(rest));
    let shape = table_shape(table);
    let homes: Vec<String> = tables()
        .iter()
        .filter(|(home, keys)| **home != shape && keys.contains(&name))
        .map(
            |(home, _)| match (home.strip_prefix("upstream.NAME"), upstream) {
                (Some(rest), Some(upstream)) => describe(&format!("upstream.{upstream}{rest}")),
                _ => describe(home),
            },
        )
        .collect();
    if homes.is_empty() || homes.len() > MAX_HOMES {
        return None;
    }
    Some(format!(
        "{name} is a key of {}, not of {}",
        homes.join(" or "),
        describe(table)
    ))
}

/// Serde's unknown-field `message` about the key at `key`, in a `[[listener]]` or
/// `[[listener.route]]` table, lists the keys serde reads there: the modules' keys, which it
/// does not see (`take_module_keys`), are added to that list.
fn with_module_keys(key: &str, message: &mut String) {
    let table = key.rsplit_once('.').map_or("", |(t, _)| t);
    let keys = match &*table_shape(table) {
        "listener" => modules::KEYS,
        "listener.route" => modules::ROUTE_KEYS,
        _ => return,
    };
    if !message.starts_with("unknown field") {
        return;
    }
    for k in keys.iter().flat_map(|k| k.iter()) {
        message.push_str(&format!(", `{k}`"));
    }
}

/// A table's path with the upstream's name as `NAME` and list indices as `[]`
/// (`upstream.app.backends[0]` → `upstream.NAME.backends[]`), as [`keys::Tables`] writes it.
fn table_shape(table: &str) -> String {
    let mut shape = String::with_capacity(table.len());
    let mut rest = table;
    if let Some(after) = table.strip_prefix("upstream.") {
        shape.push_str("upstream.NAME");
        rest = after.find(['.', '[']).map_or("", |i| &after[i..]);
    }
    let mut in_index = false;
    for c in rest.chars() {
        match c {
            '[' => in_index = true,
            ']' => {
                in_index = false;
                shape.push_str("[]");
            }
            _ if in_index => {}
            _ => shape.push(c),
        }
    }
    keys::shape(&shape)
}

/// How an error names a table: `[upstream.app.passive]`, `a backend` for an entry of a
/// `backends` list, `the top level` for the file itself.
fn describe(table: &str) -> String {
    if table.is_empty() {
        return "the top level".to_string();
    }
    if table.ends_with(']') && table.contains(".backends[") {
        return "a backend".to_string();
    }
    let mut name = String::with_capacity(table.len());
    let mut in_index = false;
    for c in table.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            _ if !in_index => name.push(c),
            _ => {}
        }
    }
    format!("[{name}]")
}

/// `[runtime]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRuntime {
    pub cpus: Option<Spanned<CpuList>>,
    pub shutdown_timeout: Option<Dur>,
    pub upgrade_socket: Option<Spanned<String>>,
}

/// `[limits]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_header_bytes: Option<Spanned<Size>>,
    pub max_headers: Option<Spanned<usize>>,
    pub max_uri_bytes: Option<Spanned<Size>>,
    pub max_body: Option<Spanned<Size>>,
    pub header_timeout: Option<Spanned<Dur>>,
    pub body_timeout: Option<Spanned<Dur>>,
    pub max_connections: Option<Spanned<usize>>,
}

/// `[http2]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp2 {
    pub max_concurrent_streams: Option<Spanned<u32>>,
    pub initial_stream_window: Option<Spanned<Size>>,
    pub initial_connection_window: Option<Spanned<Size>>,
    pub ping_interval: Option<Spanned<Dur>>,
    pub ping_timeout: Option<Spanned<Dur>>,
}

/// `[upstream.NAME]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub algorithm: Option<Spanned<Algorithm>>,
    /// What `algorithm = "hash"` hashes.
    pub hash: Option<Spanned<String>>,
    pub ewma_decay: Option<Spanned<Dur>>,
    #[serde(
        default = "default_keepalive",
        skip_serializing_if = "is_default_keepalive"
    )]
    pub keepalive: usize,
    /// Required unless `spawn` gives the backends.
    pub backends: Option<Spanned<Vec<RawBackend>>>,
    /// Backends pinlb starts and supervises itself, instead of `backends`.
    pub spawn: Option<Spanned<RawSpawn>>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub timeouts: RawTimeouts,
    /// Default for every backend's `max_conns`; 0 = unlimited.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_conns: usize,
    /// Most requests waiting for a backend with room (below its `max_conns` or learned
    /// limit); 0 = no queue.
    pub queue: Option<Spanned<usize>>,
    /// Whether backends without a `max_conns` learn their concurrency limit.
    pub adaptive: Option<Spanned<bool>>,
    /// The learned limit's floor and ceiling.
    pub adaptive_min: Option<Spanned<usize>>,
    pub adaptive_max: Option<Spanned<usize>>,
    /// Most connects in progress to one backend at once; 0 = unbounded.
    pub max_connecting: Option<Spanned<usize>>,
    /// Default for every backend's `slow_start`.
    pub slow_start: Option<Dur>,
    pub health: Option<RawHealth>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub passive: RawPassive,
    #[serde(default, skip_serializing_if = "is_default")]
    pub retry: RawRetry,
    /// Whether requests that ask to upgrade (WebSocket) are passed on.
    pub upgrade: Option<bool>,
    pub protocol: Option<Spanned<Protocol>>,
    pub max_streams: Option<Spanned<usize>>,
    /// TLS to the backends; plain TCP without the table.
    pub tls: Option<Spanned<RawUpstreamTls>>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub resolve: RawResolve,
    /// The PROXY protocol header written first on each backend connection: "v1" or "v2".
    pub proxy_protocol: Option<Spanned<String>>,
    /// `[upstream.NAME.buffering]`: request and response bodies read whole for slow clients.
    pub buffering: Option<Spanned<crate::modules::buffering::Raw>>,
    pub outlier: Option<Spanned<RawOutlier>>,
    /// Sticky sessions by an inserted cookie (HAProxy's `cookie NAME insert indirect nocache`).
    pub sticky: Option<Spanned<crate::modules::sticky::Raw>>,
    /// `[upstream.NAME.fastcgi]`: with `protocol = "fastcgi"`, which script a request runs.
    pub fastcgi: Option<Spanned<RawFastcgi>>,
}

/// An upstream with every key left out, each default the file's reading gives it.
impl Default for RawUpstream {
    fn default() -> Self {
        toml::Value::Table(toml::Table::new())
            .try_into()
            .expect("every key of an upstream may be left out")
    }
}

/// `[upstream.NAME.spawn]`: processes pinlb starts, pinned, and whose addresses are the
/// upstream's backends.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpawn {
    /// Each element spanned: an error about the program points at it.
    pub command: Spanned<Vec<Spanned<String>>>,
    pub count: Option<Spanned<usize>>,
    pub cpus: Spanned<CpuList>,
    pub port_base: Spanned<u32>,
    pub address: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Spanned<String>>,
    pub cwd: Option<Spanned<String>>,
    pub grace: Option<Spanned<Dur>>,
    pub ready_timeout: Option<Spanned<Dur>>,
}

/// `[upstream.NAME.tls]`: its presence turns TLS to the backends on.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTls {
    pub sni: Option<Spanned<String>>,
    pub ca_file: Option<Spanned<String>>,
    pub insecure_skip_verify: Option<Spanned<bool>>,
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
}

/// Idle connections kept per backend, per worker.
fn default_keepalive() -> usize {
    64
}

/// One entry of `backends`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBackend {
    /// `IP:PORT`, `unix:/path` (a Unix socket), or `NAME:PORT` looked up (A/AAAA); exactly
    /// one of it and `srv`.
    pub address: Option<Spanned<String>>,
    /// An SRV name, whose records give the addresses, ports and weights.
    pub srv: Option<Spanned<String>>,
    #[serde(default = "default_weight", skip_serializing_if = "is_default_weight")]
    pub weight: Spanned<u32>,
    pub cpus: Option<Spanned<CpuList>>,
    pub max_conns: Option<usize>,
    pub slow_start: Option<Dur>,
    pub backup: Option<Spanned<bool>>,
}

/// Weight 1, at no place in the file (it is never wrong, so never pointed at).
fn default_weight() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

/// `[upstream.NAME.timeouts]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimeouts {
    pub connect: Option<Spanned<Dur>>,
    pub response: Option<Spanned<Dur>>,
    pub send: Option<Spanned<Dur>>,
    pub client_idle: Option<Spanned<Dur>>,
    pub tunnel_idle: Option<Spanned<Dur>>,
    pub tunnel_fin: Option<Spanned<Dur>>,
    pub queue: Option<Spanned<Dur>>,
}

/// `[upstream.NAME.health]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub path: Option<Spanned<String>>,
    pub interval: Option<Spanned<Dur>>,
    pub timeout: Option<Spanned<Dur>>,
    pub rise: Option<Spanned<u32>>,
    pub fall: Option<Spanned<u32>>,
    pub expect: Option<Spanned<StatusSet>>,
    pub host: Option<Spanned<String>>,
    /// A TCP upstream's check: what it writes once connected.
    pub send: Option<Spanned<String>>,
    /// A TCP upstream's check: what the backend's answer must begin with.
    pub receive: Option<Spanned<String>>,
    /// A TCP upstream's check by name: `connect`, `redis` or `mysql`.
    pub check: Option<Spanned<String>>,
}

/// `[upstream.NAME.passive]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPassive {
    pub max_fails: Option<u32>,
    pub fail_timeout: Option<Spanned<Dur>>,
    pub fail_on_status: Option<StatusSet>,
}

/// `[upstream.NAME.outlier]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutlier {
    pub consecutive_5xx: Option<u32>,
    pub success_rate: Option<Spanned<f64>>,
    pub interval: Option<Spanned<Dur>>,
    pub min_requests: Option<u32>,
    pub base_time: Option<Spanned<Dur>>,
    pub max_time: Option<Spanned<Dur>>,
    pub max_ejected: Option<Spanned<f64>>,
}

/// `[upstream.NAME.retry]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub tries: Option<usize>,
    pub timeout: Option<Spanned<Dur>>,
    pub non_idempotent: Option<bool>,
    pub buffer: Option<Size>,
    /// nginx's `proxy_next_upstream` conditions: "error", "timeout", "http_503", ...
    pub on: Option<Spanned<Vec<Spanned<String>>>>,
    pub budget: Option<Spanned<f64>>,
    pub budget_min: Option<u32>,
}

/// One `[[listener]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    pub address: Spanned<String>,
    /// `"http"` (the default), `"tcp"` (bytes relayed without reading HTTP) or `"udp"`.
    pub mode: Option<Spanned<String>>,
    /// A UDP listener's answers per client datagram that end a session.
    pub responses: Option<Spanned<i64>>,
    /// How long a UDP listener's session lasts without a datagram.
    pub session_idle: Option<Spanned<Dur>>,
    /// Required unless a module answers every request (`redirect_https`).
    pub upstream: Option<Spanned<String>>,
    pub tls: Option<Spanned<RawTls>>,
    /// Cleartext HTTP/2 with prior knowledge, beside HTTP/1.1, on a plain listener.
    pub h2c: Option<Spanned<bool>>,
    /// Whether a TLS listener offers `h2` by ALPN.
    pub http2: Option<Spanned<bool>>,
    /// The kernel's queue of connections not yet accepted (`listen(2)`'s backlog).
    pub backlog: Option<Spanned<i64>>,
    /// `[[listener.route]]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<Spanned<RawRoute>>,
    /// `[[listener.sni]]`: a TCP listener's upstreams by TLS server name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sni: Vec<Spanned<RawSni>>,
    pub rate_limit: modules::rate_limit::RawRateLimits,
    pub conn_limit: Option<Spanned<modules::conn_limit::RawConnLimit>>,
    /// Connections from `proxy_protocol_from` begin with a PROXY protocol header.
    pub proxy_protocol: Option<Spanned<bool>>,
    /// The networks allowed to send that header.
    pub proxy_protocol_from: Option<Spanned<Vec<Spanned<String>>>>,
    /// The feature modules' keys, taken out of the table before serde reads it.
    #[serde(skip_deserializing, flatten)]
    pub modules: RawModules,
    /// Those keys as the file writes them, each with its span: what a TCP listener checks.
    #[serde(skip)]
    pub module_keys: Vec<(String, std::ops::Range<usize>)>,
}

/// One `[[listener.sni]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSni {
    /// One name or a list: `a.test`, `*.b.test`.
    pub server_name: Spanned<OneOrMany>,
    /// ALPN protocols, one of which the client must offer.
    pub alpn: Option<Spanned<Vec<Spanned<String>>>>,
    pub upstream: Spanned<String>,
}

/// One `[[listener.route]]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    /// One name or a list.
    pub host: Option<Spanned<OneOrMany>>,
    pub path: Option<Spanned<String>>,
    pub path_exact: Option<Spanned<String>>,
    /// A regular expression the normalised path must match (nginx's `location ~`).
    pub path_regex: Option<Spanned<String>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    pub headers: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    pub upstream: Option<Spanned<String>>,
    pub rewrite_prefix: Option<Spanned<String>>,
    pub redirect: Option<Spanned<RawRedirect>>,
    pub respond: Option<Spanned<RawRespond>>,
    pub timeouts: Option<RawRouteTimeouts>,
    /// Its own list replaces the listener's.
    pub rate_limit: modules::rate_limit::RawRateLimits,
    /// The feature modules' keys, taken out of the table before serde reads it.
    #[serde(skip_deserializing, flatten)]
    pub modules: RawModules,
}

/// A route's `timeouts = { connect, response, send }`, over its upstream's.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteTimeouts {
    pub connect: Option<Spanned<Dur>>,
    pub response: Option<Spanned<Dur>>,
    pub send: Option<Spanned<Dur>>,
}

/// A string or a list of strings.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A route's `redirect = { status = 301, location = "..." }`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedirect {
    pub status: Option<Spanned<u16>>,
    pub location: Spanned<String>,
}

/// A route's `respond = { status = 403, body = "..." }`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRespond {
    pub status: Spanned<u16>,
    pub body: Option<String>,
}

/// `[listener.tls]`: a default certificate (`cert` and `key`), more chosen by SNI
/// (`[[listener.tls.certificate]]`), or both.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: Option<Spanned<String>>,
    pub key: Option<Spanned<String>>,
    #[serde(default, rename = "certificate", skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<RawCertificate>,
    /// Client certificates (`modules::client_cert`): the CAs that sign them (`client_ca`),
    /// whether one is required (`client_auth`), the CRLs (`crl`) and the lines that tell the
    /// backend (`client_cert_headers`).
    pub client_ca: Option<Spanned<String>>,
    pub client_auth: Option<Spanned<String>>,
    pub crl: Option<Spanned<String>>,
    pub client_cert_headers: Option<Spanned<modules::client_cert::RawHeaders>>,
}

impl RawTls {
    /// The keys of the client certificate module (`modules::client_cert`).
    pub(super) fn client_cert(&self) -> modules::client_cert::Keys<'_> {
        modules::client_cert::Keys {
            client_ca: self.client_ca.as_ref(),
            client_auth: self.client_auth.as_ref(),
            crl: self.crl.as_ref(),
            client_cert_headers: self.client_cert_headers.as_ref(),
        }
    }
}

/// One `[[listener.tls.certificate]]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    pub cert: Spanned<String>,
    pub key: Spanned<String>,
}

/// `[forwarded]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawForwarded {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted: Vec<Spanned<String>>,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub address: Option<Spanned<String>>,
    pub token: Option<Spanned<String>>,
    pub token_file: Option<Spanned<String>>,
}

/// `[log]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub access: Option<Spanned<String>>,
    pub format: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for Algorithm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "round_robin" => Ok(Algorithm::RoundRobin),
            "least_conn" => Ok(Algorithm::LeastConn),
            "random_two" => Ok(Algorithm::RandomTwo),
            "ewma" => Ok(Algorithm::Ewma),
            "hash" => Ok(Algorithm::Hash),
            other => Err(de::Error::custom(format!(
                "unknown value \"{other}\", expected one of {}",
                Algorithm::NAMES
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "http1" => Ok(Protocol::Http1),
            "h2c" => Ok(Protocol::H2c),
            "h2" => Ok(Protocol::H2),
            "fastcgi" => Ok(Protocol::Fastcgi),
            other => Err(de::Error::custom(format!(
                "unknown value \"{other}\", expected one of {}",
                Protocol::NAMES
            ))),
        }
    }
}

/// A list of cores: `[0, 2]`, `"2-5"`, `"0,2-3"` or `[0, "2-5"]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl<'de> Deserialize<'de> for CpuList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str = "a core id, a range string like \"2-5\", or a list of them";
        impl<'de> Visitor<'de> for V {
            type Value = CpuList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<CpuList, E> {
                usize::try_from(v)
                    .map(|c| CpuList(vec![c]))
                    .map_err(|_| E::custom(format!("invalid core {v}, expected {EXPECTED}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<CpuList, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<CpuList, E> {
                parse_cpu_list(s).map(CpuList).map_err(|e| {
                    E::custom(format!(
                        "invalid core list \"{s}\" ({e}), expected {EXPECTED}"
                    ))
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CpuList, A::Error> {
                let mut out = Vec::new();
                while let Some(CpuList(part)) = seq.next_element::<CpuList>()? {
                    out.extend(part);
                }
                Ok(CpuList(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for StatusSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const EXPECTED: &str =
            "a status such as 200, a range string like \"200-399\", or a list of them";
        fn status<E: de::Error>(v: i64) -> Result<u16, E> {
            u16::try_from(v)
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or_else(|| E::custom(format!("invalid status {v}, expected 100 to 599")))
        }
        impl<'de> Visitor<'de> for V {
            type Value = StatusSet;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusSet, E> {
                let s = status(v)?;
                Ok(StatusSet(vec![(s, s)]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusSet, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StatusSet, E> {
                let bad =
                    || E::custom(format!("invalid status range \"{s}\", expected {EXPECTED}"));
                let (lo, hi) = s.split_once('-').unwrap_or((s, s));
                let lo = status(lo.trim().parse().map_err(|_| bad())?)?;
                let hi = status(hi.trim().parse().map_err(|_| bad())?)?;
                if lo > hi {
                    return Err(bad());
                }
                Ok(StatusSet(vec![(lo, hi)]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StatusSet, A::Error> {
                let mut out = Vec::new();
                while let Some(StatusSet(part)) = seq.next_element::<StatusSet>()? {
                    out.extend(part);
                }
                Ok(StatusSet(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration that must not be zero, when given: a zero timeout or interval would fail every
/// request or close every connection at once.
pub(super) fn positive(
    src: &Source,
    v: &Option<Spanned<Dur>>,
    key: &str,
) -> Result<Option<Duration>, ConfigError> {
    match v {
        None => Ok(None),
        Some(x) if x.get_ref().0.is_zero() => Err(src.at(
            x.span(),
            key,
            "a duration of 0 is not allowed, expected a positive duration such as \"1s\"",
        )),
        Some(x) => Ok(Some(x.get_ref().0)),
    }
}

/// `[upstream.NAME.fastcgi]`: nginx's `root`, `fastcgi_index`, `fastcgi_split_path_info` and
/// `fastcgi_param`, for a `protocol = "fastcgi"` upstream.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawFastcgi {
    pub root: Option<Spanned<String>>,
    pub index: Option<Spanned<String>>,
    pub script: Option<Spanned<String>>,
    pub split_path_info: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, Spanned<String>>,
    pub chunked_body_max: Option<Spanned<Size>>,
}

/// Whether `v` is its type's default: a table left out of what is written.
fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

fn is_default_keepalive(v: &usize) -> bool {
    *v == default_keepalive()
}

fn is_default_weight(v: &Spanned<u32>) -> bool {
    *v.get_ref() == 1
}

impl Serialize for Algorithm {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Serialize for Protocol {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Written as docs/configuration.md writes it: the list of core ids (`[0, 1, 2]`).
impl Serialize for CpuList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Written as read: one status as a number, a range as `"200-399"`, several as a list of
/// those.
impl Serialize for StatusSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Range((u16, u16));
        impl Serialize for Range {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self.0 {
                    (lo, hi) if lo == hi => s.serialize_u16(lo),
                    (lo, hi) => s.serialize_str(&format!("{lo}-{hi}")),
                }
            }
        }
        match self.0.as_slice() {
            [range] => Range(*range).serialize(s),
            ranges => s.collect_seq(ranges.iter().map(|&r| Range(r))),
        }
    }
}
