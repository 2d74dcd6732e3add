//! nginx directives to a pinlb configuration: what has an equivalent becomes TOML, everything
//! else becomes a note naming its `file:line`.

use std::collections::BTreeMap;

use toml::{Table, Value};

use super::parse::Directive;

/// The converted configuration and what could not be.
pub struct Converted {
    pub toml: Table,
    pub notes: Vec<String>,
}

struct Builder {
    runtime: Table,
    limits: Table,
    /// `[[listener]]`s by address, in first-seen order.
    listeners: Vec<(String, Vec<Server>)>,
    upstreams: BTreeMap<String, Table>,
    /// http-level `keepalive_timeout`, for every upstream's `client_idle`.
    client_idle: Option<String>,
    notes: Vec<String>,
}

/// One `server` block: its names (empty for the catch-all `_`), whether it is the default for
/// its address, and its routes, in the order nginx would match them.
struct Server {
    names: Vec<String>,
    default: bool,
    routes: Vec<Table>,
}

pub fn convert(directives: &[Directive]) -> Converted {
    let mut b = Builder {
        runtime: Table::new(),
        limits: Table::new(),
        listeners: Vec::new(),
        upstreams: BTreeMap::new(),
        client_idle: None,
        notes: Vec::new(),
    };
    let mut workers: Option<(usize, String)> = None;
    let mut affinity: Option<Vec<usize>> = None;
    let mut connections: Option<usize> = None;
    for d in directives {
        match (d.name.as_str(), d.block.as_deref()) {
            ("worker_processes", None) => match d.args.first().map(String::as_str) {
                Some("auto") | None => {}
                Some(n) => workers = n.parse().ok().map(|n| (n, d.at())),
            },
            ("worker_cpu_affinity", None) => affinity = cpu_affinity(&d.args),
            ("events", Some(events)) => {
                for e in events {
                    match e.name.as_str() {
                        "worker_connections" => {
                            connections = e.args.first().and_then(|n| n.parse().ok())
                        }
                        _ => b.skip(
                            e,
                            "event-loop tuning: pinlb's runtime is tokio's, one per core",
                        ),
                    }
                }
            }
            ("http", Some(http)) => b.http(http),
            _ => b.skip(d, "no pinlb equivalent"),
        }
    }
    match (affinity, &workers) {
        (Some(cores), _) => {
            b.runtime.insert(
                "cpus".into(),
                Value::Array(
                    cores
                        .into_iter()
                        .map(|c| Value::Integer(c as i64))
                        .collect(),
                ),
            );
        }
        (None, Some((n, at))) => {
            let n = *n;
            b.runtime.insert(
                "cpus".into(),
                Value::String(format!("0-{}", n.saturating_sub(1))),
            );
            b.notes.push(format!(
                "{at}: worker_processes {n} without worker_cpu_affinity: pinlb pins its {n} workers to cores 0-{} (nginx left them unpinned); change runtime.cpus to the cores pinlb should own",
                n.saturating_sub(1)
            ));
        }
        (None, None) => {}
    }
    if let Some(c) = connections {
        let total = c * workers.as_ref().map_or(1, |w| w.0).max(1);
        b.limits
            .insert("max_connections".into(), Value::Integer(total as i64));
    }
    b.finish()
}

impl Builder {
    fn skip(&mut self, d: &Directive, why: &str) {
        self.notes
            .push(format!("{}: {} not converted: {why}", d.at(), d.name));
    }

    fn http(&mut self, http: &[Directive]) {
        for d in http {
            match (d.name.as_str(), d.block.as_deref()) {
                ("upstream", Some(block)) => self.upstream(d, block),
                ("server", Some(block)) => self.server(d, block),
                ("client_max_body_size", None) => match d.args.first().and_then(|s| size(s)) {
                    Some(n) => {
                        self.limits
                            .insert("max_body".into(), Value::Integer(n as i64));
                    }
                    None => self.skip(d, "not a size"),
                },
                ("large_client_header_buffers", None) => {
                    match (
                        d.args.first().and_then(|n| n.parse::<u64>().ok()),
                        d.args.get(1).and_then(|s| size(s)),
                    ) {
                        (Some(n), Some(s)) => {
                            self.limits
                                .insert("max_header_bytes".into(), Value::Integer((n * s) as i64));
                        }
                        _ => self.skip(d, "expected a count and a size"),
                    }
                }
                ("keepalive_timeout", None) => match d.args.first().and_then(|t| duration(t)) {
                    Some(t) => self.client_idle = Some(t),
                    None => self.skip(d, "not a duration"),
                },
                _ => self.skip(d, "no pinlb equivalent"),
            }
        }
    }

    fn upstream(&mut self, d: &Directive, block: &[Directive]) {
        let Some(name) = d.args.first() else {
            return self.skip(d, "an upstream needs a name");
        };
        let mut up = Table::new();
        let mut backends = Vec::new();
        let mut passive = Table::new();
        for s in block {
            match s.name.as_str() {
                "server" => {
                    let Some(address) = s.args.first() else {
                        continue;
                    };
                    let mut backend = Table::new();
                    backend.insert("address".into(), Value::String(address.clone()));
                    let mut down = false;
                    for param in &s.args[1..] {
                        let (key, value) = param.split_once('=').unwrap_or((param, ""));
                        match key {
                            "weight" | "max_conns" => {
                                if let Ok(n) = value.parse::<i64>() {
                                    backend.insert(key.into(), Value::Integer(n));
                                }
                            }
                            "max_fails" => {
                                if let Ok(n) = value.parse::<i64>() {
                                    passive.entry("max_fails").or_insert(Value::Integer(n));
                                }
                            }
                            "fail_timeout" => {
                                if let Some(t) = duration(value) {
                                    passive.entry("fail_timeout").or_insert(Value::String(t));
                                }
                            }
                            "backup" => {
                                backend.insert("backup".into(), Value::Boolean(true));
                            }
                            "down" => down = true,
                            _ => self.notes.push(format!(
                                "{}: server parameter {param} not converted",
                                s.at()
                            )),
                        }
                    }
                    if down {
                        self.notes.push(format!(
                            "{}: server {address} is marked down: left out (add it back, or drain it at run time with POST /backends/{address}/drain)",
                            s.at()
                        ));
                    } else {
                        backends.push(Value::Table(backend));
                    }
                }
                "least_conn" => {
                    up.insert("algorithm".into(), "least_conn".into());
                }
                "ip_hash" => {
                    up.insert("algorithm".into(), "hash".into());
                    up.insert("hash".into(), "client_ip".into());
                    self.notes.push(format!(
                        "{}: ip_hash became hash = \"client_ip\": each client keeps one backend, but pinlb hashes the whole address (nginx the first three octets), so which backend differs from nginx's",
                        s.at()
                    ));
                }
                "hash" => match s.args.first().and_then(|k| hash_key(k)) {
                    Some(key) => {
                        up.insert("algorithm".into(), "hash".into());
                        up.insert("hash".into(), Value::String(key));
                    }
                    None => self.skip(
                        s,
                        "only $remote_addr, $request_uri, $http_NAME and $cookie_NAME keys convert",
                    ),
                },
                "random" => {
                    up.insert("algorithm".into(), "random_two".into());
                    if s.args.first().map(String::as_str) != Some("two") {
                        self.notes.push(format!("{}: random became random_two (two random choices, fewer in flight wins)", s.at()));
                    }
                }
                "keepalive" => {
                    if let Some(n) = s.args.first().and_then(|n| n.parse::<i64>().ok()) {
                        up.insert("keepalive".into(), Value::Integer(n));
                    }
                }
                _ => self.skip(s, "no pinlb equivalent"),
            }
        }
        if !passive.is_empty() {
            up.insert("passive".into(), Value::Table(passive));
        }
        up.insert("backends".into(), Value::Array(backends));
        self.upstreams.insert(name.clone(), up);
    }

    fn server(&mut self, d: &Directive, block: &[Directive]) {
        let mut addresses = Vec::new();
        let mut names = Vec::new();
        let mut default = false;
        let mut locations = Vec::new();
        for s in block {
            match s.name.as_str() {
                "listen" => {
                    if let Some(a) = s.args.first() {
                        addresses.push(listen_address(a));
                    }
                    default |= s
                        .args
                        .iter()
                        .any(|a| a == "default_server" || a == "default");
                    for flag in s.args.iter().skip(1) {
                        if flag != "default_server" && flag != "default" {
                            self.notes
                                .push(format!("{}: listen parameter {flag} not converted", s.at()));
                        }
                    }
                }
                "server_name" => names.extend(
                    s.args
                        .iter()
                        .filter(|n| *n != "_" && !n.is_empty())
                        .cloned(),
                ),
                "location" => locations.push(s),
                _ => self.skip(s, "no pinlb equivalent"),
            }
        }
        if addresses.is_empty() {
            addresses.push("0.0.0.0:80".into());
        }
        // nginx matches `location = ...` first, then the longest prefix.
        let mut routes: Vec<(u8, usize, Table)> = Vec::new();
        for l in locations {
            if let Some(route) = self.location(l) {
                let (rank, len) = match l.args.first().map(String::as_str) {
                    Some("=") => (0, 0),
                    _ => (1, usize::MAX - l.args.last().map_or(0, String::len)),
                };
                routes.push((rank, len, route));
            }
        }
        routes.sort_by_key(|(rank, len, _)| (*rank, *len));
        for address in addresses {
            let server = Server {
                names: names.clone(),
                default,
                routes: routes.iter().map(|(_, _, r)| r.clone()).collect(),
            };
            match self.listeners.iter_mut().find(|(a, _)| *a == address) {
                Some((_, servers)) => servers.push(server),
                None => self.listeners.push((address, vec![server])),
            }
        }
        let _ = d;
    }

    /// One `location` as a route without its host; `None` (with a note) when it can't be one.
    fn location(&mut self, l: &Directive) -> Option<Table> {
        let mut route = Table::new();
        let block = l.block.as_deref().unwrap_or_default();
        match l.args.as_slice() {
            [modifier, path] if modifier == "=" => {
                route.insert("path_exact".into(), Value::String(path.clone()));
            }
            [modifier, path] if modifier == "^~" => {
                route.insert("path".into(), Value::String(path.clone()));
            }
            [path] if path.starts_with('/') => {
                route.insert("path".into(), Value::String(path.clone()));
            }
            _ => {
                self.skip(
                    l,
                    "only exact (=) and prefix locations convert; regex locations don't",
                );
                return None;
            }
        }
        let mut set = Table::new();
        let mut timeouts = Table::new();
        let mut handled = false;
        for d in block {
            match d.name.as_str() {
                "proxy_pass" => {
                    let Some((upstream, uri)) = d.args.first().and_then(|u| proxy_target(u)) else {
                        self.skip(d, "only http:// targets convert");
                        continue;
                    };
                    if !self.upstreams.contains_key(&upstream) && upstream.contains(':') {
                        // A plain address: an upstream of one backend, named after it.
                        let mut up = Table::new();
                        let mut b = Table::new();
                        b.insert("address".into(), Value::String(upstream.clone()));
                        up.insert("backends".into(), Value::Array(vec![Value::Table(b)]));
                        self.upstreams.insert(upstream.clone(), up);
                    }
                    route.insert("upstream".into(), Value::String(upstream.clone()));
                    if let Some(uri) = uri {
                        route.insert("rewrite_prefix".into(), Value::String(uri));
                    }
                    handled = true;
                }
                "return" => {
                    let code = d.args.first().and_then(|c| c.parse::<i64>().ok());
                    match (code, d.args.get(1), d.args.first()) {
                        (Some(c @ (301 | 302 | 303 | 307 | 308)), Some(url), _) => {
                            route.insert("redirect".into(), redirect(c, url));
                        }
                        (Some(c), body, _) => {
                            let mut t = Table::new();
                            t.insert("status".into(), Value::Integer(c));
                            if let Some(body) = body {
                                t.insert("body".into(), Value::String(body.clone()));
                            }
                            route.insert("respond".into(), Value::Table(t));
                        }
                        (None, _, Some(url)) => {
                            route.insert("redirect".into(), redirect(302, url));
                        }
                        _ => self.skip(d, "return without a code"),
                    }
                    handled = true;
                }
                "proxy_set_header" => match (d.args.first(), d.args.get(1)) {
                    (Some(name), Some(value)) => self.set_header(d, name, value, &mut set),
                    _ => self.skip(d, "expected a name and a value"),
                },
                "proxy_connect_timeout" | "proxy_read_timeout" | "proxy_send_timeout" => {
                    let key = match d.name.as_str() {
                        "proxy_connect_timeout" => "connect",
                        "proxy_read_timeout" => "response",
                        _ => "send",
                    };
                    match d.args.first().and_then(|t| duration(t)) {
                        Some(t) => {
                            timeouts.insert(key.into(), Value::String(t));
                        }
                        None => self.skip(d, "not a duration"),
                    }
                }
                "proxy_http_version" => {} // pinlb always speaks HTTP/1.1 to backends.
                "proxy_next_upstream"
                | "proxy_next_upstream_tries"
                | "proxy_next_upstream_timeout" => {
                    self.next_upstream(d, &route);
                }
                _ => self.skip(d, "no pinlb equivalent"),
            }
        }
        if !handled {
            self.skip(l, "it neither proxies nor returns (pinlb serves no files)");
            return None;
        }
        if !set.is_empty() && route.contains_key("upstream") {
            let mut rh = Table::new();
            rh.insert("set".into(), Value::Table(set));
            route.insert("request_headers".into(), Value::Table(rh));
        }
        if !timeouts.is_empty() && route.contains_key("upstream") {
            route.insert("timeouts".into(), Value::Table(timeouts));
        }
        Some(route)
    }

    fn set_header(&mut self, d: &Directive, name: &str, value: &str, set: &mut Table) {
        let lower = name.to_ascii_lowercase();
        let managed = match (lower.as_str(), value) {
            ("host", "$host" | "$http_host") => Some("pinlb sends Host as the client sent it"),
            ("x-forwarded-for", "$proxy_add_x_forwarded_for") => {
                Some("pinlb appends the client's address itself")
            }
            ("x-forwarded-proto", "$scheme") => Some("pinlb sends X-Forwarded-Proto itself"),
            ("upgrade", "$http_upgrade") | ("connection", _) => {
                Some("pinlb passes upgrades (WebSocket) on by default")
            }
            _ => None,
        };
        if let Some(why) = managed {
            self.notes.push(format!(
                "{}: proxy_set_header {name} {value}: nothing to convert, {why}",
                d.at()
            ));
            return;
        }
        match template(value) {
            Some(t) => {
                set.insert(name.to_string(), Value::String(t));
            }
            None => self.skip(d, "its value uses a variable pinlb has no equivalent for"),
        }
    }

    /// `proxy_next_upstream*` apply to the upstream the location proxies to.
    fn next_upstream(&mut self, d: &Directive, route: &Table) {
        let Some(Value::String(name)) = route.get("upstream") else {
            return self.skip(d, "put it after proxy_pass to convert it");
        };
        let Some(up) = self.upstreams.get_mut(name) else {
            return;
        };
        let retry = up
            .entry("retry")
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(retry) = retry else { return };
        match d.name.as_str() {
            "proxy_next_upstream_tries" => {
                if let Some(n) = d.args.first().and_then(|n| n.parse::<i64>().ok()) {
                    retry.insert("tries".into(), Value::Integer(n));
                }
            }
            "proxy_next_upstream_timeout" => {
                if let Some(t) = d
                    .args
                    .first()
                    .and_then(|t| duration(t))
                    .filter(|t| t != "0s")
                {
                    retry.insert("timeout".into(), Value::String(t));
                }
            }
            _ => {
                if d.args.iter().any(|a| a == "off") {
                    retry.insert("tries".into(), Value::Integer(1));
                }
                if d.args.iter().any(|a| a == "non_idempotent") {
                    retry.insert("non_idempotent".into(), Value::Boolean(true));
                }
                let statuses: Vec<&str> = d
                    .args
                    .iter()
                    .filter_map(|a| a.strip_prefix("http_"))
                    .collect();
                if !statuses.is_empty() {
                    self.notes.push(format!(
                        "{}: proxy_next_upstream on http_{}: pinlb retries on connect errors and timeouts; to count these statuses as failures set [upstream.{name}.passive] fail_on_status",
                        d.at(),
                        statuses.join(", http_")
                    ));
                }
            }
        }
    }

    fn finish(self) -> Converted {
        let mut root = Table::new();
        if !self.runtime.is_empty() {
            root.insert("runtime".into(), Value::Table(self.runtime));
        }
        if !self.limits.is_empty() {
            root.insert("limits".into(), Value::Table(self.limits));
        }
        let mut listeners = Vec::new();
        for (address, mut servers) in self.listeners {
            // The default server: the one marked so, else the first, as nginx picks it.
            let default = servers.iter().position(|s| s.default).unwrap_or(0);
            let catch_all = servers.remove(default);
            let mut routes = Vec::new();
            for s in servers.iter().filter(|s| !s.names.is_empty()) {
                for r in &s.routes {
                    let mut r = r.clone();
                    let hosts = s
                        .names
                        .iter()
                        .map(|n| Value::String(host_name(n)))
                        .collect();
                    r.insert("host".into(), Value::Array(hosts));
                    routes.push(Value::Table(r));
                }
            }
            routes.extend(catch_all.routes.into_iter().map(Value::Table));
            let mut l = Table::new();
            l.insert("address".into(), Value::String(address));
            l.insert("route".into(), Value::Array(routes));
            listeners.push(Value::Table(l));
        }
        if !listeners.is_empty() {
            root.insert("listener".into(), Value::Array(listeners));
        }
        let mut upstreams = Table::new();
        for (name, mut up) in self.upstreams {
            if let Some(idle) = &self.client_idle {
                let mut t = Table::new();
                t.insert("client_idle".into(), Value::String(idle.clone()));
                up.insert("timeouts".into(), Value::Table(t));
            }
            upstreams.insert(name, Value::Table(up));
        }
        root.insert("upstream".into(), Value::Table(upstreams));
        Converted {
            toml: root,
            notes: self.notes,
        }
    }
}

/// `.example.com` (nginx: the name and every subdomain) and `*.example.com` as pinlb writes them.
fn host_name(n: &str) -> String {
    match n.strip_prefix('.') {
        Some(rest) => format!("*.{rest}"),
        None => n.to_ascii_lowercase(),
    }
}

fn redirect(status: i64, url: &str) -> Value {
    let mut t = Table::new();
    t.insert("status".into(), Value::Integer(status));
    t.insert(
        "location".into(),
        Value::String(template(url).unwrap_or_else(|| url.to_string())),
    );
    Value::Table(t)
}

/// nginx variables in a value as pinlb template variables; `None` for one with no equivalent.
fn template(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i].replace('{', "{{").replace('}', "}}"));
        let tail = &rest[i + 1..];
        let tail = tail.strip_prefix('{').unwrap_or(tail);
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let var = match &tail[..end] {
            "host" => "{host}",
            "remote_addr" => "{client_ip}",
            "scheme" => "{scheme}",
            "request_uri" => "{uri}",
            "uri" | "document_uri" => "{path}",
            "args" | "query_string" => "{query}",
            _ => return None,
        };
        out.push_str(var);
        rest = tail[end..].strip_prefix('}').unwrap_or(&tail[end..]);
    }
    out.push_str(&rest.replace('{', "{{").replace('}', "}}"));
    Some(out)
}

/// `http://NAME[/uri]` → the upstream (or address) and the URI part, if any.
fn proxy_target(url: &str) -> Option<(String, Option<String>)> {
    let rest = url.strip_prefix("http://")?;
    match rest.find('/') {
        Some(i) => Some((rest[..i].to_string(), Some(rest[i..].to_string()))),
        None => Some((rest.to_string(), None)),
    }
}

/// `listen`'s address: `8080` → `0.0.0.0:8080`, `127.0.0.1:8080` and `[::]:80` as they are.
fn listen_address(a: &str) -> String {
    if a.chars().all(|c| c.is_ascii_digit()) {
        format!("0.0.0.0:{a}")
    } else if !a.contains(':') {
        format!("{a}:80")
    } else {
        a.to_string()
    }
}

/// `worker_cpu_affinity 0001 0010` → cores 0 and 1 (each mask one worker's cores).
fn cpu_affinity(args: &[String]) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for mask in args {
        if mask == "auto" {
            return None;
        }
        for (i, bit) in mask.chars().rev().enumerate() {
            if bit == '1' && !cores.contains(&i) {
                cores.push(i);
            }
        }
    }
    cores.sort_unstable();
    Some(cores)
}

/// nginx sizes: `10m`, `8k`, `1g`, or bytes.
fn size(s: &str) -> Option<u64> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "k" | "K" => 1 << 10,
        "m" | "M" => 1 << 20,
        "g" | "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// nginx times (`30s`, `65`, `1m`, `500ms`, `1h30m`) as pinlb writes durations.
fn duration(s: &str) -> Option<String> {
    let mut ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "" | "s" => 1000,
            "ms" => 1,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        ms = ms.checked_add(n.checked_mul(scale)?)?;
        rest = &rest[unit_end..];
    }
    Some(if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    })
}

/// `hash`'s key as pinlb's.
fn hash_key(k: &str) -> Option<String> {
    match k {
        "$remote_addr" | "$binary_remote_addr" => Some("client_ip".into()),
        "$request_uri" => Some("uri".into()),
        _ => {
            if let Some(h) = k.strip_prefix("$http_") {
                return Some(format!("header:{}", h.replace('_', "-")));
            }
            k.strip_prefix("$cookie_").map(|c| format!("cookie:{c}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_units_convert() {
        assert_eq!(size("10m"), Some(10 << 20));
        assert_eq!(size("8k"), Some(8192));
        assert_eq!(duration("65").as_deref(), Some("65s"));
        assert_eq!(duration("1m30s").as_deref(), Some("90s"));
        assert_eq!(duration("500ms").as_deref(), Some("500ms"));
        assert_eq!(
            cpu_affinity(&["0001".into(), "0010".into()]),
            Some(vec![0, 1])
        );
        assert_eq!(listen_address("8081"), "0.0.0.0:8081");
        assert_eq!(
            template("$scheme://$host$request_uri").as_deref(),
            Some("{scheme}://{host}{uri}")
        );
        assert_eq!(template("${host}x").as_deref(), Some("{host}x"));
        assert_eq!(template("$server_port"), None);
        assert_eq!(hash_key("$http_x_user").as_deref(), Some("header:x-user"));
    }
}
