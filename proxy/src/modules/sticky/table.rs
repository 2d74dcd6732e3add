//! Sticky sessions by an inserted cookie (`sticky = { cookie = "NAME" }`, HAProxy's `cookie NAME
//! insert indirect nocache`): each backend's opaque value, the cookie read from a request and
//! taken out of what the backend sees, and the `Set-Cookie` line. The named backend is tried first by `pick::prefer`.
//!
//! A backend's value is a keyed hash (xxh3, seeded by `seed`) of the upstream's name and the
//! backend's address, written as 16 hex digits: never the address itself, and the same in every
//! worker, across reloads that keep the backend, and in every pinlb instance with the same
//! configuration, so clients keep their backend across all of these.
//!
//! Only upstreams with `sticky` come here: the request path tests one `Option` (the upstream's
//! [`StickyTable`]) and does the rest out of line.

use crate::backend_address::BackendAddress;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::Sticky;

/// An upstream's sticky cookie in one generation: its settings and each backend's value.
#[derive(Debug)]
pub struct StickyTable {
    pub config: Sticky,
    /// The upstream's name, hashed into each value.
    upstream: String,
    /// `xxh3(seed)`: the key every value is hashed with.
    key: u64,
    /// Each backend's value, by backend index.
    values: Vec<u64>,
    /// What `Set-Cookie` writes after the value ([`Sticky::attributes`]).
    attributes: String,
}

/// What a request's Cookie header says to a sticky upstream.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Arrived {
    /// The backend the cookie names, when it names one of this generation's.
    pub preferred: Option<usize>,
    /// The header lines without the sticky cookie (`indirect`: the backend never sees it),
    /// when the request carried it; a Cookie line left empty is dropped.
    pub stripped: Option<Vec<u8>>,
}

/// A backend's value: the keyed hash of its upstream's name and its address.
pub fn value(key: u64, upstream: &str, address: BackendAddress) -> u64 {
    let text = format!("{upstream}\0{address}");
    xxh3_64_with_seed(text.as_bytes(), key)
}

/// `value` as the cookie carries it: 16 lower-case hex digits.
fn hex(value: u64) -> String {
    format!("{value:016x}")
}

/// A cookie's value read back; `None` for anything [`hex`] never writes.
fn parse_hex(v: &[u8]) -> Option<u64> {
    if v.len() != 16 || !v.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(v).ok()?, 16).ok()
}

impl StickyTable {
    /// The table of `upstream`'s backends at `addresses`, by index.
    pub fn new(config: &Sticky, upstream: &str, addresses: &[BackendAddress]) -> Self {
        let key = xxh3_64(config.seed.as_bytes());
        StickyTable {
            values: addresses.iter().map(|a| value(key, upstream, *a)).collect(),
            attributes: config.attributes(),
            config: config.clone(),
            upstream: upstream.to_string(),
            key,
        }
    }

    /// The value of the backend at `address`.
    pub fn value_of(&self, address: BackendAddress) -> u64 {
        value(self.key, &self.upstream, address)
    }

    /// The backend a value names, by index; `None` for a value no backend of this generation
    /// has (a removed backend's, a forged one): such a cookie counts as none.
    fn backend(&self, value: u64) -> Option<usize> {
        self.values.iter().position(|v| *v == value)
    }

    /// Reads the sticky cookie in `lines` (a request's end-to-end header lines, `name:
    /// value\r\n` each) and takes it out of them.
    #[cold]
    #[inline(never)]
    pub fn arrived(&self, lines: &[u8]) -> Arrived {
        let name = self.config.cookie.as_bytes();
        let mut arrived = Arrived::default();
        let mut out = Vec::new();
        let mut found = false;
        for line in lines.split_inclusive(|&b| b == b'\n') {
            let Some(value) = cookie_line(line) else {
                out.extend_from_slice(line);
                continue;
            };
            let mut kept: Vec<&[u8]> = Vec::new();
            for pair in value.split(|&b| b == b';') {
                let pair = pair.trim_ascii();
                if pair.is_empty() {
                    continue;
                }
                let (n, v) = match pair.iter().position(|&b| b == b'=') {
                    Some(eq) => (pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii()),
                    None => (pair, &b""[..]),
                };
                if n != name {
                    kept.push(pair);
                    continue;
                }
                found = true;
                // The first of several copies that names a backend decides.
                if arrived.preferred.is_none() {
                    arrived.preferred = parse_hex(v).and_then(|v| self.backend(v));
                }
            }
            if !kept.is_empty() {
                out.extend_from_slice(b"cookie: ");
                out.extend_from_slice(&kept.join(&b"; "[..]));
                out.extend_from_slice(b"\r\n");
            }
        }
        if found {
            arrived.stripped = Some(out);
        }
        arrived
    }

    /// What a response from the backend at `answered` gets when the request's cookie named
    /// `preferred`: nothing when that is the backend that answered (`indirect`: the client has
    /// the right cookie already); otherwise the `Set-Cookie` line naming it and, unless the
    /// response is already private, `Cache-Control: private` (`nocache`: no shared cache may
    /// hand one client's cookie to others, HAProxy's line).
    #[cold]
    #[inline(never)]
    pub fn respond(
        &self,
        headers: &mut Vec<u8>,
        answered: BackendAddress,
        preferred: Option<usize>,
    ) {
        let value = self.value_of(answered);
        if preferred.is_some_and(|b| self.values.get(b) == Some(&value)) {
            return;
        }
        self.set_cookie_line(headers, value);
        if !is_private(headers) {
            headers.extend_from_slice(b"cache-control: private\r\n");
        }
    }

    /// `set-cookie: NAME=VALUE; Path=/; …\r\n`
    fn set_cookie_line(&self, out: &mut Vec<u8>, value: u64) {
        out.extend_from_slice(b"set-cookie: ");
        out.extend_from_slice(self.config.cookie.as_bytes());
        out.push(b'=');
        out.extend_from_slice(hex(value).as_bytes());
        out.extend_from_slice(self.attributes.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// The value of a `Cookie` line (`cookie: a=1; b=2\r\n`), or `None` for another header.
fn cookie_line(line: &[u8]) -> Option<&[u8]> {
    let colon = line.iter().position(|&b| b == b':')?;
    let (n, v) = line.split_at(colon);
    n.eq_ignore_ascii_case(b"cookie")
        .then(|| v[1..].trim_ascii())
}

/// Whether response header `lines` already keep shared caches from storing the response
/// (`Cache-Control` with `private`, `no-cache` or `no-store`).
fn is_private(lines: &[u8]) -> bool {
    lines.split(|&b| b == b'\n').any(|line| {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return false;
        };
        let (n, v) = line.split_at(colon);
        n.eq_ignore_ascii_case(b"cache-control")
            && v[1..].split(|&b| b == b',').any(|d| {
                let d = d.trim_ascii();
                let d = &d[..d.iter().position(|&b| b == b'=').unwrap_or(d.len())];
                [&b"private"[..], b"no-cache", b"no-store"]
                    .iter()
                    .any(|p| d.eq_ignore_ascii_case(p))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sticky(name: &str) -> Sticky {
        Sticky {
            cookie: name.to_string(),
            path: "/".to_string(),
            domain: None,
            max_age: None,
            secure: false,
            httponly: true,
            samesite: None,
            seed: String::new(),
        }
    }

    fn addrs() -> Vec<BackendAddress> {
        ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect()
    }

    fn table() -> StickyTable {
        StickyTable::new(&sticky("SRV"), "app", &addrs())
    }

    #[test]
    fn values_are_opaque_and_stable() {
        let t = table();
        let again = table();
        assert_eq!(t.values, again.values);
        let distinct: std::collections::BTreeSet<_> = t.values.iter().collect();
        assert_eq!(distinct.len(), 3);
        for (v, a) in t.values.iter().zip(addrs()) {
            assert!(!hex(*v).contains(&a.tcp().expect("TCP").port().to_string()));
            assert_eq!(parse_hex(hex(*v).as_bytes()), Some(*v));
        }
        // Another upstream or another seed gives other values.
        let other = StickyTable::new(&sticky("SRV"), "web", &addrs());
        assert_ne!(t.values, other.values);
        let seeded = StickyTable::new(
            &Sticky {
                seed: "s3cret".into(),
                ..sticky("SRV")
            },
            "app",
            &addrs(),
        );
        assert_ne!(t.values, seeded.values);
        // A backend keeps its value when others come and go.
        let fewer = StickyTable::new(&sticky("SRV"), "app", &addrs()[1..]);
        assert_eq!(fewer.values, t.values[1..]);
    }

    #[test]
    fn the_cookie_names_its_backend_and_is_taken_out() {
        let t = table();
        let v = hex(t.values[2]);
        let lines = format!("accept: */*\r\ncookie: a=1; SRV={v}; b=2\r\nx-y: z\r\n");
        let arrived = t.arrived(lines.as_bytes());
        assert_eq!(arrived.preferred, Some(2));
        assert_eq!(
            arrived.stripped.as_deref(),
            Some(&b"accept: */*\r\ncookie: a=1; b=2\r\nx-y: z\r\n"[..])
        );
    }

    #[test]
    fn a_cookie_line_left_empty_is_dropped() {
        let t = table();
        let v = hex(t.values[0]);
        let lines = format!("Cookie: SRV={v}\r\ncookie: other=x\r\n");
        let arrived = t.arrived(lines.as_bytes());
        assert_eq!(arrived.preferred, Some(0));
        assert_eq!(
            arrived.stripped.as_deref(),
            Some(&b"cookie: other=x\r\n"[..])
        );
    }

    #[test]
    fn unknown_or_malformed_values_count_as_none_but_are_still_taken_out() {
        let t = table();
        for bad in [
            "0000000000000000",
            "zz",
            "",
            "127.0.0.1:9001",
            &hex(t.values[0]).to_uppercase(),
        ] {
            let lines = format!("cookie: SRV={bad}; keep=1\r\n");
            let arrived = t.arrived(lines.as_bytes());
            assert_eq!(arrived.preferred, None, "{bad}");
            assert_eq!(
                arrived.stripped.as_deref(),
                Some(&b"cookie: keep=1\r\n"[..]),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_request_without_the_cookie_is_left_alone() {
        let t = table();
        let lines = b"cookie: SRVX=1; xSRV=2\r\naccept: */*\r\n";
        assert_eq!(t.arrived(lines), Arrived::default());
        assert_eq!(t.arrived(b""), Arrived::default());
    }

    #[test]
    fn set_cookie_carries_the_attributes() {
        let config = Sticky {
            domain: Some("example.com".into()),
            max_age: Some(3600),
            secure: true,
            samesite: Some(crate::config::SameSite::Lax),
            path: "/app".into(),
            ..sticky("SRV")
        };
        let t = StickyTable::new(&config, "app", &addrs());
        let mut headers = b"content-type: text/plain\r\n".to_vec();
        t.respond(&mut headers, addrs()[1], None);
        let want = format!(
            "content-type: text/plain\r\nset-cookie: SRV={}; Path=/app; Domain=example.com; Max-Age=3600; Secure; HttpOnly; SameSite=Lax\r\ncache-control: private\r\n",
            hex(t.values[1])
        );
        assert_eq!(String::from_utf8(headers).unwrap(), want);
    }

    #[test]
    fn the_right_cookie_is_not_sent_again() {
        let t = table();
        let mut headers = Vec::new();
        t.respond(&mut headers, addrs()[1], Some(1));
        assert!(headers.is_empty());
        // Moved to another backend: a new cookie.
        t.respond(&mut headers, addrs()[0], Some(1));
        let text = String::from_utf8(headers).unwrap();
        assert!(
            text.starts_with(&format!(
                "set-cookie: SRV={}; Path=/; HttpOnly\r\n",
                hex(t.values[0])
            )),
            "{text}"
        );
    }

    #[test]
    fn a_private_response_gets_no_second_cache_control() {
        let t = table();
        for cc in [
            "private",
            "no-cache",
            "public, no-store",
            "No-Cache=\"set-cookie\"",
        ] {
            let mut headers = format!("Cache-Control: {cc}\r\n").into_bytes();
            t.respond(&mut headers, addrs()[0], None);
            let text = String::from_utf8(headers).unwrap();
            assert!(!text.contains("cache-control: private"), "{text}");
            assert!(text.contains("set-cookie: SRV="), "{text}");
        }
        let mut headers = b"cache-control: public, max-age=60\r\n".to_vec();
        t.respond(&mut headers, addrs()[0], None);
        assert!(
            String::from_utf8(headers)
                .unwrap()
                .ends_with("cache-control: private\r\n")
        );
    }

    proptest::proptest! {
        /// Any header lines: no panic; what goes on names no sticky cookie, keeps every other
        /// header line and every other cookie pair, in order; a real value names its backend.
        #[test]
        fn any_lines_are_read_and_stripped_without_panic(
            raw in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
            pairs in proptest::collection::vec(("[a-zA-Z]{1,4}", "[a-z0-9]{0,6}"), 0..6),
            backend in 0usize..3,
        ) {
            let t = table();
            let _ = t.arrived(&raw);
            let real = format!("SRV={}", hex(t.values[backend]));
            let mut all: Vec<String> = pairs.iter().map(|(n, v)| format!("{n}={v}")).collect();
            let others = all.clone();
            all.insert(all.len() / 2, real);
            let lines = format!("accept: */*\r\ncookie: {}\r\nx: y\r\n", all.join("; "));
            let arrived = t.arrived(lines.as_bytes());
            proptest::prop_assert_eq!(arrived.preferred, Some(backend));
            let out = String::from_utf8(arrived.stripped.unwrap()).unwrap();
            let kept: Vec<&String> = others.iter().filter(|p| !p.starts_with("SRV=")).collect();
            let want = if kept.is_empty() {
                "accept: */*\r\nx: y\r\n".to_string()
            } else {
                let kept: Vec<&str> = kept.iter().map(|s| s.as_str()).collect();
                format!("accept: */*\r\ncookie: {}\r\nx: y\r\n", kept.join("; "))
            };
            proptest::prop_assert_eq!(out, want);
        }
    }
}
