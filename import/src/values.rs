//! nginx's values as pinlb writes them: addresses with their port, `listen` addresses, an
//! address as an upstream of its own, and durations; shared by the http block's conversion and
//! the stream block's.

use toml::{Table, Value};

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

/// nginx times (`30s`, `65`, `1m`, `500ms`, `1h30m`) as pinlb writes durations.
pub(crate) fn duration(s: &str) -> Option<String> {
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

/// An upstream of the one backend at `address` (nginx's `proxy_pass` to an address), its port
/// added as nginx reads it.
pub(crate) fn one_backend(address: &str) -> Table {
    let mut backend = Table::new();
    backend.insert("address".into(), Value::String(with_port(address)));
    let mut up = Table::new();
    up.insert("backends".into(), Value::Array(vec![Value::Table(backend)]));
    up
}
