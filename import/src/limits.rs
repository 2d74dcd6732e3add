//! nginx's request rate and connection limits as pinlb's: `limit_req_zone` becomes a
//! `[limit.NAME]` zone, and the `limit_req`s in force in a `location` (its own, or the nearest
//! enclosing level's: nginx inherits a level's list whole or not at all) its route's
//! `rate_limit`, with `limit_req_status` as each entry's `status`. A server's `limit_conn` on a
//! zone keyed by the client's address becomes its listener's `conn_limit`.
//!
//! What converts: keys `$binary_remote_addr`/`$remote_addr` (`client_ip`), `$http_NAME`
//! (`header:NAME`) and `$cookie_NAME` (`cookie:NAME`); `rate=Nr/s` and `Nr/m`; `burst`,
//! `nodelay`, and `delay=N` where it delays nothing (`N >= burst`). Refused, with the reason:
//! another key, a `limit_req` whose excess nginx delays (pinlb answers at once), and a
//! `limit_req` naming a zone that did not convert; a `limit_conn_zone` keyed by anything but
//! the address, a location's own `limit_conn` (pinlb limits a listener's connections), and
//! servers on one address with different `limit_conn`s (pinlb's is one per listener).

use std::collections::BTreeMap;

use pinlb::config::raw::RawRoute;
use pinlb::modules::rate_limit::{RawRateLimit, RawRateZone};

use super::parse::Directive;
use super::values::spanned;

/// The directives read here, which the level loops leave alone.
pub(super) const NAMES: [&str; 6] = [
    "limit_req_zone",
    "limit_req",
    "limit_req_status",
    "limit_conn_zone",
    "limit_conn",
    "limit_conn_status",
];

/// The `limit_req`s and the `limit_req_status` in force at one level.
#[derive(Debug, Clone, Default)]
pub(super) struct Inherited {
    reqs: Option<Vec<Directive>>,
    status: Option<u16>,
    conns: Option<Vec<Directive>>,
}

impl Inherited {
    /// What a block's own directives make of what it inherits.
    pub(super) fn level(&self, block: &[Directive]) -> Inherited {
        let mut out = self.clone();
        let own: Vec<Directive> = (block.iter())
            .filter(|d| d.name == "limit_req" && d.block.is_none())
            .cloned()
            .collect();
        if !own.is_empty() {
            out.reqs = Some(own);
        }
        let own: Vec<Directive> = (block.iter())
            .filter(|d| d.name == "limit_conn" && d.block.is_none())
            .cloned()
            .collect();
        if !own.is_empty() {
            out.conns = Some(own);
        }
        if let Some(s) = (block.iter())
            .rfind(|d| d.name == "limit_req_status" && d.block.is_none())
            .and_then(|d| d.args.first()?.parse().ok())
        {
            out.status = Some(s);
        }
        out
    }
}

pub(super) fn refuse(refused: &mut Vec<String>, d: &Directive, why: &str) {
    let line = format!(
        "{}: {} not converted: {why}; without it pinlb lets through what nginx limits",
        d.at(),
        d.name
    );
    if !refused.contains(&line) {
        refused.push(line);
    }
}

/// nginx's key variable as a zone's `key`.
fn key(var: &str) -> Option<String> {
    match var {
        "$binary_remote_addr" | "$remote_addr" => Some("client_ip".into()),
        v => {
            if let Some(h) = v.strip_prefix("$http_") {
                return (!h.is_empty()).then(|| format!("header:{}", h.replace('_', "-")));
            }
            let c = v.strip_prefix("$cookie_")?;
            (!c.is_empty()).then(|| format!("cookie:{c}"))
        }
    }
}

/// The http block's `limit_req_zone`s as `[limit.NAME]` tables, into `zones`.
pub(super) fn zones(
    http: &[Directive],
    zones: &mut BTreeMap<String, RawRateZone>,
    refused: &mut Vec<String>,
) {
    for d in http.iter().filter(|d| d.name == "limit_req_zone") {
        let mut params: BTreeMap<&str, &str> = BTreeMap::new();
        for a in d.args.iter().skip(1) {
            if let Some((k, v)) = a.split_once('=') {
                params.insert(k, v);
            }
        }
        let Some(k) = d.args.first().and_then(|k| key(k)) else {
            refuse(
                refused,
                d,
                "only $binary_remote_addr, $remote_addr, $http_NAME and $cookie_NAME keys convert",
            );
            continue;
        };
        let (Some(zone), Some(rate)) = (params.get("zone"), params.get("rate")) else {
            refuse(refused, d, "expected zone=NAME:SIZE and rate=");
            continue;
        };
        let (name, size) = zone.split_once(':').unwrap_or((zone, ""));
        let rate_ok = (rate
            .strip_suffix("r/s")
            .or_else(|| rate.strip_suffix("r/m")))
        .is_some_and(|n| n.parse::<u64>().is_ok_and(|n| n > 0));
        if !rate_ok {
            refuse(refused, d, "only whole rates in r/s or r/m convert");
            continue;
        }
        let zone = RawRateZone {
            key: Some(spanned(k)),
            rate: spanned(rate.to_string()),
            // nginx keeps a key in about 64 bytes of its zone (128 for a long key); pinlb's
            // table is sized by keys, 16 bytes each.
            keys: zone_bytes(size).map(|bytes| spanned((bytes / 64).max(1) as i64)),
        };
        zones.insert(name.to_string(), zone);
    }
}

/// A zone's size (`10m`, `512k`) in bytes.
fn zone_bytes(s: &str) -> Option<u64> {
    let (n, scale) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<u64>().ok()?.checked_mul(scale)
}

/// The `limit_req`s in force in a location as its route's `rate_limit`.
pub(super) fn route(
    inherited: &Inherited,
    zones: &BTreeMap<String, RawRateZone>,
    route: &mut RawRoute,
    refused: &mut Vec<String>,
) {
    let Some(reqs) = &inherited.reqs else { return };
    let mut list = Vec::new();
    for d in reqs {
        let mut params: BTreeMap<&str, &str> = BTreeMap::new();
        let mut nodelay = false;
        for a in &d.args {
            match a.split_once('=') {
                Some((k, v)) => {
                    params.insert(k, v);
                }
                None if a == "nodelay" => nodelay = true,
                None => {}
            }
        }
        let Some(zone) = params.get("zone").copied() else {
            refuse(refused, d, "expected zone=NAME");
            continue;
        };
        if !zones.contains_key(zone) {
            refuse(
                refused,
                d,
                &format!("its zone {zone} has no limit_req_zone that converted"),
            );
            continue;
        }
        let Ok(burst) = params.get("burst").map_or(Ok(0), |b| b.parse::<i64>()) else {
            refuse(refused, d, "burst is not a number");
            continue;
        };
        let delay = params.get("delay").and_then(|v| v.parse::<i64>().ok());
        if burst > 0 && !nodelay && delay.is_none_or(|n| n < burst) {
            refuse(
                refused,
                d,
                "nginx delays the requests over the rate (no nodelay), and pinlb answers every request at once; add nodelay (the burst then passes at once) or convert by hand",
            );
            continue;
        }
        list.push(spanned(RawRateLimit {
            zone: spanned(zone.to_string()),
            burst: (burst > 0).then(|| spanned(burst)),
            nodelay: (burst > 0).then(|| spanned(true)),
            // nginx answers 503 unless limit_req_status says otherwise.
            status: Some(spanned(inherited.status.unwrap_or(503))),
        }));
    }
    if !list.is_empty() {
        route.rate_limit = Some(spanned(list));
    }
}

/// The http block's `limit_conn_zone`s keyed by the client's address, as zone name → the keys
/// its size holds, into `zones`.
pub(super) fn conn_zones(
    http: &[Directive],
    zones: &mut BTreeMap<String, i64>,
    refused: &mut Vec<String>,
) {
    for d in http.iter().filter(|d| d.name == "limit_conn_zone") {
        let is_addr = matches!(
            d.args.first().map(String::as_str),
            Some("$binary_remote_addr" | "$remote_addr")
        );
        let zone = d.args.iter().find_map(|a| a.strip_prefix("zone="));
        match (is_addr, zone) {
            (true, Some(zone)) => {
                let (name, size) = zone.split_once(':').unwrap_or((zone, ""));
                let keys = zone_bytes(size).map_or(100_000, |b| (b / 64).max(1) as i64);
                zones.insert(name.to_string(), keys);
            }
            (false, _) => refuse(
                refused,
                d,
                "pinlb limits connections per client address only ($binary_remote_addr, $remote_addr)",
            ),
            (true, None) => refuse(refused, d, "expected zone=NAME:SIZE"),
        }
    }
}

/// A server's `limit_conn`s (its own, or the http block's) as its listener's `conn_limit`: the
/// smallest limit of those on address zones. `None` when none is in force.
pub(super) fn conn_limit(
    server: &Inherited,
    zones: &BTreeMap<String, i64>,
    refused: &mut Vec<String>,
) -> Option<(i64, i64)> {
    let mut best: Option<(i64, i64)> = None;
    for d in server.conns.iter().flatten() {
        let (Some(zone), Some(Ok(max))) = (d.args.first(), d.args.get(1).map(|n| n.parse::<i64>()))
        else {
            refuse(refused, d, "expected a zone and a number of connections");
            continue;
        };
        let Some(&keys) = zones.get(zone) else {
            refuse(
                refused,
                d,
                &format!("its zone {zone} has no limit_conn_zone that converted"),
            );
            continue;
        };
        if best.is_none_or(|(m, _)| max < m) {
            best = Some((max, keys));
        }
    }
    best
}

/// A location's own `limit_conn`, which pinlb cannot hold: its limit is per listener.
pub(super) fn location_conns(block: &[Directive], refused: &mut Vec<String>) {
    for d in block.iter().filter(|d| d.name == "limit_conn") {
        refuse(
            refused,
            d,
            "pinlb limits a listener's connections per client address, not a location's requests; put it in the server",
        );
    }
}
