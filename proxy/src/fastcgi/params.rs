//! The request as CGI variables (RFC 3875 §4.1), the FastCGI PARAMS a responder reads: the set
//! nginx's `fastcgi_params` sends, with `SCRIPT_FILENAME $document_root$fastcgi_script_name`,
//! `PATH_INFO` from `fastcgi_split_path_info`, `REDIRECT_STATUS=200` (php-cgi's
//! `cgi.force_redirect`), and every request header as `HTTP_*` but `Proxy` (httpoxy,
//! CVE-2016-5385: `HTTP_PROXY` would read as the application's outbound proxy).
//!
//! Which script runs is decided here from the path, as nginx's variables are: the path is
//! percent-decoded and its dot segments removed (nginx's `$uri`), so a script outside `root`
//! is never named.

use std::borrow::Cow;
use std::net::SocketAddr;

use super::record;
use crate::http1::path::normalize;

/// How a path names its script: an upstream's `root`, `index`, `script` and
/// `split_path_info`.
#[derive(Debug, Clone, Copy)]
pub struct Scripts<'a> {
    /// The document root, without a trailing slash.
    pub root: &'a str,
    /// Appended to a path that ends in `/` (nginx's `fastcgi_index`).
    pub index: &'a str,
    /// One script for every request (a front controller), its path under `root`.
    pub script: Option<&'a str>,
    /// Splits the path into the script's name and `PATH_INFO`: two capture groups.
    pub split: Option<&'a regex::bytes::Regex>,
}

/// The script a path names: `SCRIPT_NAME` (nginx's `$fastcgi_script_name`), `PATH_INFO` and
/// `DOCUMENT_URI`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    pub name: Vec<u8>,
    pub path_info: Vec<u8>,
    pub document_uri: Vec<u8>,
}

impl Scripts<'_> {
    /// The script `target` (origin-form, its query kept off) names.
    pub fn script(&self, target: &[u8]) -> Script {
        let uri = uri(target);
        if let Some(script) = self.script {
            let name = script.as_bytes().to_vec();
            return Script {
                document_uri: name.clone(),
                name,
                path_info: Vec::new(),
            };
        }
        let (mut name, path_info) = match self.split.and_then(|re| re.captures(&uri)) {
            Some(c) => match (c.get(1), c.get(2)) {
                (Some(n), p) => (n.as_bytes().to_vec(), p.map_or(&[][..], |p| p.as_bytes())),
                (None, _) => (uri.to_vec(), &[][..]),
            },
            None => (uri.to_vec(), &[][..]),
        };
        let path_info = path_info.to_vec();
        if name.ends_with(b"/") {
            name.extend_from_slice(self.index.as_bytes());
        }
        Script {
            name,
            path_info,
            document_uri: uri.into_owned(),
        }
    }
}

/// nginx's `$uri`: the path, percent-decoded, its dot segments and repeated slashes gone.
/// Decoded first and normalised after, so an encoded slash cannot bring a `..` back.
fn uri(target: &[u8]) -> Cow<'_, [u8]> {
    let path = match target.iter().position(|&b| b == b'?') {
        Some(q) => &target[..q],
        None => target,
    };
    let decoded: Cow<'_, [u8]> = percent_encoding::percent_decode(path).into();
    match decoded {
        Cow::Borrowed(b) => normalize(b),
        Cow::Owned(o) => Cow::Owned(normalize(&o).into_owned()),
    }
}

/// What the request says of itself, beside its script.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The target as the client sent it (origin-form): `REQUEST_URI`, and the query.
    pub target: &'a [u8],
    pub host: &'a [u8],
    /// The header lines, `name: value\r\n` each, without Host and the framing headers.
    pub lines: &'a [u8],
    pub content_length: Option<u64>,
    /// `SERVER_PROTOCOL`.
    pub protocol: &'a str,
    pub https: bool,
    pub client: SocketAddr,
    /// The listener address the client connected to.
    pub server: SocketAddr,
}

/// Every PARAMS pair for `req` running `script` under `root`, name-value encoded (not yet
/// framed as records), then `extra`'s, which may replace one of them (php-fpm keeps a name's
/// last value, as nginx's later `fastcgi_param` lines win).
pub fn encode(
    out: &mut Vec<u8>,
    req: &Request<'_>,
    root: &str,
    script: &Script,
    extra: &[(String, String)],
) {
    let mut kv = |n: &str, v: &[u8]| record::name_value(out, n.as_bytes(), v);
    let filename = [root.as_bytes(), &script.name].concat();
    kv("SCRIPT_FILENAME", &filename);
    kv("SCRIPT_NAME", &script.name);
    if !script.path_info.is_empty() {
        kv("PATH_INFO", &script.path_info);
        kv(
            "PATH_TRANSLATED",
            &[root.as_bytes(), &script.path_info].concat(),
        );
    }
    kv("DOCUMENT_ROOT", root.as_bytes());
    kv("DOCUMENT_URI", &script.document_uri);
    kv("REQUEST_URI", req.target);
    let query = match req.target.iter().position(|&b| b == b'?') {
        Some(q) => &req.target[q + 1..],
        None => b"",
    };
    kv("QUERY_STRING", query);
    kv("REQUEST_METHOD", req.method.as_bytes());
    let mut n = itoa::Buffer::new();
    match req.content_length {
        Some(len) => kv("CONTENT_LENGTH", n.format(len).as_bytes()),
        None => kv("CONTENT_LENGTH", b""),
    }
    kv("SERVER_PROTOCOL", req.protocol.as_bytes());
    kv("GATEWAY_INTERFACE", b"CGI/1.1");
    kv("SERVER_SOFTWARE", b"pinlb");
    kv("REMOTE_ADDR", req.client.ip().to_string().as_bytes());
    kv("REMOTE_PORT", n.format(req.client.port()).as_bytes());
    kv("SERVER_ADDR", req.server.ip().to_string().as_bytes());
    kv("SERVER_PORT", n.format(req.server.port()).as_bytes());
    kv(
        "SERVER_NAME",
        crate::http1::request::host_without_port(req.host),
    );
    kv(
        "REQUEST_SCHEME",
        if req.https { &b"https"[..] } else { b"http" },
    );
    if req.https {
        kv("HTTPS", b"on");
    }
    kv("REDIRECT_STATUS", b"200");
    if !req.host.is_empty() {
        kv("HTTP_HOST", req.host);
    }
    headers(out, req.lines);
    for (name, value) in extra {
        record::name_value(out, name.as_bytes(), value.as_bytes());
    }
}

/// Each header line as `HTTP_NAME` (upper case, `-` as `_`), a name sent twice joined into one
/// value (`; ` between cookies, `, ` otherwise); `Content-Type` as `CONTENT_TYPE`. A name
/// with anything but letters, digits and `-` is left out, as nginx's
/// `ignore_invalid_headers` does: `X_Foo` would pass for `X-Foo`.
fn headers(out: &mut Vec<u8>, lines: &[u8]) {
    let mut seen: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for line in lines.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"proxy")
            || !name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        {
            continue;
        }
        let cgi: Vec<u8> = if name.eq_ignore_ascii_case(b"content-type") {
            b"CONTENT_TYPE".to_vec()
        } else {
            let upper = name.iter().map(|b| match b {
                b'-' => b'_',
                b => b.to_ascii_uppercase(),
            });
            b"HTTP_".iter().copied().chain(upper).collect()
        };
        match seen.iter_mut().find(|(n, _)| *n == cgi) {
            Some((n, v)) => {
                v.extend_from_slice(if n == b"HTTP_COOKIE" { b"; " } else { b", " });
                v.extend_from_slice(value);
            }
            None => seen.push((cgi, value.to_vec())),
        }
    }
    for (name, value) in seen {
        record::name_value(out, &name, &value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairs of an encoded PARAMS block.
    fn pairs(mut b: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let len = |b: &mut &[u8]| {
            if b[0] < 0x80 {
                let n = b[0] as usize;
                *b = &b[1..];
                n
            } else {
                let n = u32::from_be_bytes([b[0] & 0x7f, b[1], b[2], b[3]]) as usize;
                *b = &b[4..];
                n
            }
        };
        while !b.is_empty() {
            let (n, v) = (len(&mut b), len(&mut b));
            let name = String::from_utf8_lossy(&b[..n]).into_owned();
            let value = String::from_utf8_lossy(&b[n..n + v]).into_owned();
            b = &b[n + v..];
            out.push((name, value));
        }
        out
    }

    fn get<'a>(p: &'a [(String, String)], name: &str) -> Option<&'a str> {
        p.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn scripts(split: Option<&regex::bytes::Regex>) -> Scripts<'_> {
        Scripts {
            root: "/srv/www",
            index: "index.php",
            script: None,
            split,
        }
    }

    #[test]
    fn the_script_is_the_decoded_normalised_path_with_the_index_for_a_directory() {
        let s = scripts(None);
        assert_eq!(s.script(b"/a/b.php?x=1").name, b"/a/b.php");
        assert_eq!(s.script(b"/dir/").name, b"/dir/index.php");
        assert_eq!(s.script(b"/a%20b.php").name, b"/a b.php");
        assert_eq!(s.script(b"/x/../../etc/p.php").name, b"/etc/p.php");
        // An encoded slash does not bring a dot segment back.
        assert_eq!(s.script(b"/x%2F..%2F..%2Fy.php").name, b"/y.php");
        assert_eq!(s.script(b"/dir/").document_uri, b"/dir/");
    }

    #[test]
    fn split_path_info_takes_the_script_and_path_info_from_its_groups() {
        let re = regex::bytes::Regex::new(r"^(.+\.php)(/.+)$").unwrap();
        let s = scripts(Some(&re));
        let got = s.script(b"/app.php/users/7?q");
        assert_eq!(got.name, b"/app.php");
        assert_eq!(got.path_info, b"/users/7");
        assert_eq!(got.document_uri, b"/app.php/users/7");
        let plain = s.script(b"/app.php");
        assert_eq!(
            (plain.name, plain.path_info),
            (b"/app.php".to_vec(), Vec::new())
        );
    }

    #[test]
    fn a_fixed_script_serves_every_path() {
        let s = Scripts {
            script: Some("/index.php"),
            ..scripts(None)
        };
        let got = s.script(b"/users/7?page=2");
        assert_eq!(got.name, b"/index.php");
        assert!(got.path_info.is_empty());
    }

    #[test]
    fn the_params_are_nginxs_fastcgi_params_and_the_headers() {
        let req = Request {
            method: "POST",
            target: b"/a.php?x=1&y=2",
            host: b"example.com:8080",
            lines: b"Content-Type: text/plain\r\nCookie: a=1\r\nX-Thing: 1\r\nProxy: http://evil\r\ncookie: b=2\r\nX_Bad: 1\r\nx-thing: 2\r\n",
            content_length: Some(5),
            protocol: "HTTP/1.1",
            https: true,
            client: "192.0.2.1:5555".parse().unwrap(),
            server: "127.0.0.1:8080".parse().unwrap(),
        };
        let script = scripts(None).script(req.target);
        let mut out = Vec::new();
        let extra = [("APP_ENV".to_string(), "prod".to_string())];
        encode(&mut out, &req, "/srv/www", &script, &extra);
        let p = pairs(&out);
        let want = [
            ("SCRIPT_FILENAME", "/srv/www/a.php"),
            ("SCRIPT_NAME", "/a.php"),
            ("DOCUMENT_ROOT", "/srv/www"),
            ("DOCUMENT_URI", "/a.php"),
            ("REQUEST_URI", "/a.php?x=1&y=2"),
            ("QUERY_STRING", "x=1&y=2"),
            ("REQUEST_METHOD", "POST"),
            ("CONTENT_LENGTH", "5"),
            ("CONTENT_TYPE", "text/plain"),
            ("SERVER_PROTOCOL", "HTTP/1.1"),
            ("GATEWAY_INTERFACE", "CGI/1.1"),
            ("REMOTE_ADDR", "192.0.2.1"),
            ("REMOTE_PORT", "5555"),
            ("SERVER_ADDR", "127.0.0.1"),
            ("SERVER_PORT", "8080"),
            ("SERVER_NAME", "example.com"),
            ("REQUEST_SCHEME", "https"),
            ("HTTPS", "on"),
            ("REDIRECT_STATUS", "200"),
            ("HTTP_HOST", "example.com:8080"),
            ("HTTP_COOKIE", "a=1; b=2"),
            ("HTTP_X_THING", "1, 2"),
            ("APP_ENV", "prod"),
        ];
        for (name, value) in want {
            assert_eq!(get(&p, name), Some(value), "{name}");
        }
        assert_eq!(get(&p, "HTTP_PROXY"), None);
        assert_eq!(get(&p, "HTTP_X_BAD"), None);
        assert_eq!(get(&p, "PATH_INFO"), None);
    }
}
