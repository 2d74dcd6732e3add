//! nginx's values as pinlb writes them: addresses with their port, `listen` addresses, an
//! address as an upstream of its own, durations, the files a directive names and
//! `ssl_protocols`; shared by the http block's conversion and the stream block's.

use std::time::Duration;

use pinlb::config::raw::{Dur, RawBackend, RawListener, RawRespond, RawUpstream};
use pinlb::modules::RawModules;
use toml::Spanned;

use crate::parse::Directive;

/// An address as nginx reads it: without a port, port 80.
pub(crate) fn with_port(address: &str) -> String {
    let bracketed_v6 = address.starts_with('[') && address.ends_with(']');
    if bracketed_v6 || !address.contains(':') {
        format!("{address}:80")
    } else {
        address.to_string()
    }
}

/// `listen`'s address: `8080` → `0.0.0.0:8080`, `127.0.0.1:8080` and `[::]:80` as they are.
pub(crate) fn listen_address(a: &str) -> String {
    if a.chars().all(|c| c.is_ascii_digit()) {
        format!("0.0.0.0:{a}")
    } else if !a.contains(':') {
        format!("{a}:80")
    } else {
        a.to_string()
    }
}

/// nginx times (`30s`, `65`, `1m`, `500ms`, `1h30m`) as pinlb's durations.
pub(crate) fn dur(s: &str) -> Option<Dur> {
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
    Some(Dur(Duration::from_millis(ms)))
}

/// A value of pinlb's configuration types, as `pinlb import` builds them: at no place in a file
/// until the file it writes is read.
pub(crate) fn spanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

/// A text value of the configuration's types, when it has one.
pub(crate) fn text(v: &Option<Spanned<String>>) -> Option<&str> {
    v.as_ref().map(|v| v.get_ref().as_str())
}

/// An upstream of the one backend at `address` (nginx's `proxy_pass` to an address), its port
/// added as nginx reads it.
pub(crate) fn one_backend(address: &str) -> RawUpstream {
    upstream_at(with_port(address))
}

/// An upstream of the one backend at `address`, written as pinlb reads it.
pub(crate) fn upstream_at(address: String) -> RawUpstream {
    RawUpstream {
        backends: Some(spanned(vec![backend(address)])),
        ..RawUpstream::default()
    }
}

/// A route's fixed answer.
pub(crate) fn respond(status: u16, body: Option<String>) -> Spanned<RawRespond> {
    spanned(RawRespond {
        status: spanned(status),
        body,
    })
}

/// A listener on `address`, its other keys left out.
pub(crate) fn listener(address: String) -> RawListener {
    RawListener {
        address: spanned(address),
        mode: None,
        responses: None,
        session_idle: None,
        upstream: None,
        tls: None,
        h2c: None,
        http2: None,
        backlog: None,
        route: Vec::new(),
        sni: Vec::new(),
        rate_limit: None,
        conn_limit: None,
        proxy_protocol: None,
        proxy_protocol_from: None,
        modules: RawModules::default(),
        module_keys: Vec::new(),
    }
}

/// A backend at `address`, its other keys left out.
pub(crate) fn backend(address: String) -> RawBackend {
    RawBackend {
        address: Some(spanned(address)),
        srv: None,
        weight: spanned(1),
        cpus: None,
        max_conns: None,
        slow_start: None,
        backup: None,
    }
}

/// A file a directive names, as nginx finds it: relative to the directory of the file it was
/// written in.
pub(crate) fn conf_path(d: &Directive, file: &str) -> String {
    let p = std::path::Path::new(file);
    match p.is_absolute() {
        true => file.to_string(),
        false => {
            let joined = d.file.parent().unwrap_or(std::path::Path::new("")).join(p);
            std::path::absolute(&joined)
                .unwrap_or(joined)
                .display()
                .to_string()
        }
    }
}

/// `ssl_protocols` against pinlb's fixed TLS 1.2 and 1.3: refused when it leaves TLS 1.2 out
/// (pinlb would take handshakes nginx refuses), noted when it differs otherwise.
pub(crate) fn ssl_protocols(p: &Directive, notes: &mut Vec<String>, refused: &mut Vec<String>) {
    let has = |v: &str| p.args.iter().any(|a| a == v);
    if !has("TLSv1.2") {
        refused.push(format!(
            "{}: ssl_protocols {} not converted: pinlb always offers TLS 1.2 and 1.3, so it would take TLS 1.2 handshakes nginx refuses",
            p.at(),
            p.args.join(" ")
        ));
        return;
    }
    let older: Vec<&str> = (p.args.iter().map(String::as_str))
        .filter(|a| !["TLSv1.2", "TLSv1.3"].contains(a))
        .collect();
    if !older.is_empty() || !has("TLSv1.3") {
        notes.push(format!(
            "{}: ssl_protocols {}: pinlb offers TLS 1.2 and 1.3, fixed{}",
            p.at(),
            p.args.join(" "),
            match older.is_empty() {
                true => String::new(),
                false => format!(" ({} clients fail the handshake)", older.join(", ")),
            }
        ));
    }
}
