//! Directives whose behaviour pinlb already has: they convert to nothing and are noted nowhere,
//! so that the notes are left for what pinlb does differently. Each entry says why pinlb
//! matches it; a directive of the same name asking for something else gets its note with
//! the reason ([`Matched::Differs`]).

use super::parse::Directive;

/// What pinlb makes of a directive no converter reads.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Matched {
    /// pinlb does what it asks without a key: no note.
    Same,
    /// pinlb does otherwise, for this reason.
    Differs(&'static str),
    /// Not one this module knows: "no pinlb equivalent".
    Unknown,
}

/// What the whole configuration tells about the directives below: the variables of nginx's
/// WebSocket `map`.
#[derive(Debug, Default)]
pub(super) struct Known {
    /// `$VAR` of each `map $http_upgrade $VAR { … }` whose variable is used only as a
    /// `proxy_set_header Connection` value (the WebSocket idiom, `Connection: upgrade` for an
    /// upgrade and `close` otherwise): pinlb passes upgrades and manages Connection itself.
    upgrade_maps: Vec<String>,
}

impl Known {
    /// Reads the whole configuration once.
    pub fn read(all: &[Directive]) -> Known {
        let mut flat = Vec::new();
        flatten(all, &mut flat);
        let upgrade_maps = (flat.iter())
            .filter(|d| d.name == "map" && d.block.is_some())
            .filter(|d| d.args.first().is_some_and(|a| a == "$http_upgrade"))
            .filter_map(|d| d.args.get(1).cloned())
            .filter(|var| {
                (flat.iter())
                    .filter(|d| d.args.iter().any(|a| uses(a, var)))
                    .all(|d| {
                        d.name == "map"
                            || d.name == "proxy_set_header"
                                && (d.args.first())
                                    .is_some_and(|n| n.eq_ignore_ascii_case("connection"))
                    })
            })
            .collect();
        Known { upgrade_maps }
    }

    /// What pinlb makes of `d`, a directive no converter of its level reads.
    pub fn directive(&self, d: &Directive) -> Matched {
        let arg = d.args.first().map(String::as_str);
        match (d.name.as_str(), arg) {
            // pinlb speaks HTTP/1.1, with keep-alive, to every HTTP backend.
            ("proxy_http_version", Some("1.1")) => Matched::Same,
            ("proxy_http_version", _) => Matched::Differs(
                "pinlb speaks HTTP/1.1 with keep-alive to every backend, whatever version this asks for",
            ),
            // Every client connection gets TCP_NODELAY (proxy/src/process/listen.rs).
            ("tcp_nodelay", Some("on")) => Matched::Same,
            ("tcp_nodelay", _) => Matched::Differs("pinlb sets TCP_NODELAY on every connection"),
            // They change how nginx sends a file; pinlb sends none (a location that serves
            // files has its own note).
            ("sendfile" | "tcp_nopush", _) => Matched::Same,
            // The sizes of nginx's own lookup tables: pinlb has none to size.
            (
                "types_hash_max_size"
                | "types_hash_bucket_size"
                | "server_names_hash_max_size"
                | "server_names_hash_bucket_size"
                | "variables_hash_max_size"
                | "variables_hash_bucket_size"
                | "map_hash_max_size"
                | "map_hash_bucket_size"
                | "proxy_headers_hash_max_size"
                | "proxy_headers_hash_bucket_size",
                _,
            ) => Matched::Same,
            // pinlb names itself in no header, so no version of it is shown either.
            ("server_tokens", Some("off")) => Matched::Same,
            // Where a location's files come from, named in the note of each location that
            // serves files; a location that proxies reads no file (an error page's `root` is
            // read by the error_page conversion).
            ("root" | "index", _) => Matched::Same,
            // The types of the files nginx serves, by extension (the stock mime.types): pinlb
            // serves none, and types an error page's file by its extension itself.
            ("types", _) if d.block.is_some() => Matched::Same,
            ("default_type", _) => Matched::Differs(
                "pinlb serves no files, and sends a respond route's body as text/plain",
            ),
            ("user", _) => Matched::Differs(
                "pinlb runs as the user that starts it (deploy/systemd/pinlb.service gives it a user of its own)",
            ),
            ("pid", _) => Matched::Differs("pinlb writes no pid file"),
            ("error_log", _) => Matched::Differs(
                "pinlb logs to stderr (the journal, under systemd), at RUST_LOG's level (info by default)",
            ),
            ("map", _) if d.args.get(1).is_some_and(|v| self.upgrade_maps.contains(v)) => {
                Matched::Same
            }
            _ => Matched::Unknown,
        }
    }

    /// Whether `proxy_set_header NAME VALUE` (`name` lower-case) asks for what pinlb sends
    /// anyway, so that it needs no key and no note.
    pub fn header(&self, name: &str, value: &str) -> bool {
        match name {
            // The WebSocket lines: pinlb passes the client's Upgrade, with Connection: upgrade,
            // when the client asks to upgrade, and manages Connection (keep-alive to the backend)
            // otherwise; `Connection ""` is nginx's way to the same keep-alive.
            "upgrade" => value == "$http_upgrade",
            "connection" => {
                value.is_empty()
                    || value.eq_ignore_ascii_case("upgrade")
                    || self.upgrade_maps.iter().any(|v| v == value)
            }
            // pinlb drops a client's X-Forwarded-Proto and sends the scheme it was reached by.
            "x-forwarded-proto" => value == "$scheme",
            // pinlb sends the Host the client sent.
            "host" => value == "$http_host",
            _ => false,
        }
    }
}

/// Every directive of `list`, blocks' included, depth first.
fn flatten<'a>(list: &'a [Directive], out: &mut Vec<&'a Directive>) {
    for d in list {
        out.push(d);
        flatten(d.block.as_deref().unwrap_or_default(), out);
    }
}

/// Whether `arg` uses `var` (`$name`), and not a longer name that starts with it.
fn uses(arg: &str, var: &str) -> bool {
    let mut rest = arg;
    while let Some(i) = rest.find(var) {
        let after = &rest[i + var.len()..];
        if !after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            return true;
        }
        rest = after;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(name: &str, args: &[&str], block: Option<Vec<Directive>>) -> Directive {
        Directive {
            name: name.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block,
            file: "nginx.conf".into(),
            line: 1,
        }
    }

    #[test]
    fn what_pinlb_already_does_is_same_and_what_it_does_not_differs() {
        let k = Known::default();
        let of = |name: &str, arg: &str| k.directive(&d(name, &[arg], None));
        assert_eq!(of("proxy_http_version", "1.1"), Matched::Same);
        assert!(matches!(
            of("proxy_http_version", "1.0"),
            Matched::Differs(_)
        ));
        assert_eq!(of("tcp_nodelay", "on"), Matched::Same);
        assert!(matches!(of("tcp_nodelay", "off"), Matched::Differs(_)));
        assert_eq!(of("sendfile", "on"), Matched::Same);
        assert_eq!(of("types_hash_max_size", "2048"), Matched::Same);
        assert_eq!(of("server_tokens", "on"), Matched::Unknown);
        assert!(matches!(
            of("default_type", "text/plain"),
            Matched::Differs(_)
        ));
        assert_eq!(of("limit_rate", "10k"), Matched::Unknown);
        assert!(k.header("connection", ""));
        assert!(k.header("connection", "upgrade"));
        assert!(k.header("upgrade", "$http_upgrade"));
        assert!(k.header("x-forwarded-proto", "$scheme"));
        assert!(!k.header("connection", "close"));
        assert!(!k.header("host", "$host"));
    }

    #[test]
    fn the_websocket_map_is_matched_only_while_connection_alone_uses_it() {
        let map = || {
            d(
                "map",
                &["$http_upgrade", "$connection_upgrade"],
                Some(vec![
                    d("default", &["upgrade"], None),
                    d("''", &["close"], None),
                ]),
            )
        };
        let header = d(
            "proxy_set_header",
            &["Connection", "$connection_upgrade"],
            None,
        );
        let k = Known::read(&[d("http", &[], Some(vec![map(), header.clone()]))]);
        assert_eq!(k.directive(&map()), Matched::Same);
        assert!(k.header("connection", "$connection_upgrade"));

        let logged = d(
            "log_format",
            &["x", "$connection_upgrade_x $connection_upgrade"],
            None,
        );
        let k = Known::read(&[d("http", &[], Some(vec![map(), header, logged]))]);
        assert_eq!(k.directive(&map()), Matched::Unknown);
        assert!(!k.header("connection", "$connection_upgrade"));
    }
}
