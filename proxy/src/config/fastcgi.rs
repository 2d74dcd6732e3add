//! `[upstream.NAME.fastcgi]`: which script a request to a `protocol = "fastcgi"` upstream runs
//! (nginx's `root`, `fastcgi_index`, `fastcgi_split_path_info`, the `SCRIPT_FILENAME
//! $document_root$fastcgi_script_name` line), the PARAMS added to the standard set
//! (`fastcgi_param`), and how much of a chunked request body is read to learn its length.

use toml::Spanned;

use super::Protocol;
use super::pattern::{Pattern, compile};
use super::raw::{RawFastcgi, RawUpstream};
use crate::syntax::error::{ConfigError, Source};

type Result<T> = std::result::Result<T, ConfigError>;

/// A FastCGI upstream's script rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fastcgi {
    /// `root`: the document root as the application sees it (nginx's `$document_root`),
    /// absolute, without a trailing slash. Not checked for existence: php-fpm may run where
    /// pinlb's view of the filesystem is not its own (a container).
    pub root: String,
    /// `index`: the script for a path ending in `/` (nginx's `fastcgi_index`).
    pub index: String,
    /// `script`: one script, its path under `root`, for every request (a front controller,
    /// nginx's `try_files $uri /index.php` done once for all); `None` runs the script the path
    /// names.
    pub script: Option<String>,
    /// `split_path_info`: the script's name and `PATH_INFO` from a path, two capture groups.
    pub split_path_info: Option<Pattern>,
    /// `params`: more PARAMS, fixed values, after the standard ones (a later one wins).
    pub params: Vec<(String, String)>,
    /// `chunked_body_max`: a chunked request body is read whole, up to this, before it goes to
    /// the application, which needs its CONTENT_LENGTH (nginx buffers it too); over it is 413.
    pub chunked_body_max: u64,
}

impl Fastcgi {
    /// `index`'s default, nginx's usual `fastcgi_index index.php`.
    pub const INDEX: &'static str = "index.php";
    /// `chunked_body_max`'s default: nginx's `client_max_body_size`.
    pub const CHUNKED_BODY_MAX: u64 = 1024 * 1024;
}

impl Fastcgi {
    /// One line for `pinlb check`: where scripts are, and which one a path runs.
    pub fn summary(&self) -> String {
        let mut line = format!("root {}", self.root);
        match &self.script {
            Some(script) => line.push_str(&format!(", every request runs {script}")),
            None => line.push_str(&format!(", index {}", self.index)),
        }
        if let Some(split) = &self.split_path_info {
            line.push_str(&format!(", split_path_info {}", split.0.as_str()));
        }
        if !self.params.is_empty() {
            let names: Vec<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
            line.push_str(&format!(", params {}", names.join(" ")));
        }
        line.push_str(&format!(
            ", chunked bodies read whole up to {} bytes",
            self.chunked_body_max
        ));
        line
    }
}

/// The table, which goes with `protocol = "fastcgi"` and only with it.
pub(super) fn fastcgi(
    src: &Source,
    key: &str,
    up: &RawUpstream,
    protocol: Protocol,
) -> Result<Option<Fastcgi>> {
    let fkey = format!("{key}.fastcgi");
    let raw = match (&up.fastcgi, protocol) {
        (None, Protocol::Fastcgi) => {
            let span = up.protocol.as_ref().map_or(0..0, Spanned::span);
            return Err(src.at(
                span,
                &fkey,
                "missing, expected an [upstream.NAME.fastcgi] table with root (the document root php-fpm sees) for protocol = \"fastcgi\"",
            ));
        }
        (None, _) => return Ok(None),
        (Some(t), Protocol::Fastcgi) => t,
        (Some(t), _) => {
            return Err(src.at(
                t.span(),
                &fkey,
                "set without protocol = \"fastcgi\", expected both (or neither)",
            ));
        }
    };
    validate(src, &fkey, raw).map(Some)
}

fn validate(src: &Source, fkey: &str, t: &Spanned<RawFastcgi>) -> Result<Fastcgi> {
    let raw: &RawFastcgi = t.get_ref();
    let Some(root) = &raw.root else {
        return Err(src.at(
            t.span(),
            &format!("{fkey}.root"),
            "missing, expected the document root as php-fpm sees it, such as \"/var/www/html\"",
        ));
    };
    let r = root.get_ref();
    if !r.starts_with('/') {
        return Err(src.at(
            root.span(),
            &format!("{fkey}.root"),
            format!("\"{r}\" is relative, expected an absolute path such as \"/var/www/html\""),
        ));
    }
    let index = match &raw.index {
        None => Fastcgi::INDEX.to_string(),
        Some(i) if !i.get_ref().is_empty() && !i.get_ref().contains('/') => i.get_ref().clone(),
        Some(i) => {
            return Err(src.at(
                i.span(),
                &format!("{fkey}.index"),
                format!(
                    "\"{}\" is not a file name, expected one such as \"index.php\"",
                    i.get_ref()
                ),
            ));
        }
    };
    let script = match &raw.script {
        None => None,
        Some(s) if s.get_ref().starts_with('/') && !s.get_ref().split('/').any(|p| p == "..") => {
            Some(s.get_ref().clone())
        }
        Some(s) => {
            return Err(src.at(
                s.span(),
                &format!("{fkey}.script"),
                format!(
                    "\"{}\" is not a path under root, expected one starting with / such as \"/index.php\"",
                    s.get_ref()
                ),
            ));
        }
    };
    let split_path_info = match &raw.split_path_info {
        None => None,
        Some(s) => Some(split_path(src, fkey, s)?),
    };
    let mut params = Vec::with_capacity(raw.params.len());
    for (name, value) in &raw.params {
        let good = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !good {
            return Err(src.at(
                value.span(),
                &format!("{fkey}.params"),
                format!("\"{name}\" is not a parameter name, expected letters, digits and _ (such as APP_ENV)"),
            ));
        }
        params.push((name.clone(), value.get_ref().clone()));
    }
    Ok(Fastcgi {
        root: r.trim_end_matches('/').to_string(),
        index,
        script,
        split_path_info,
        params,
        chunked_body_max: raw
            .chunked_body_max
            .as_ref()
            .map_or(Fastcgi::CHUNKED_BODY_MAX, |v| v.get_ref().0),
    })
}

/// `split_path_info`: a regular expression with two capture groups, the script's name and the
/// path info (nginx's usual `^(.+\.php)(/.+)$`).
fn split_path(src: &Source, fkey: &str, s: &Spanned<String>) -> Result<Pattern> {
    let key = format!("{fkey}.split_path_info");
    let re = compile(src, &key, s, "one such as \"^(.+\\\\.php)(/.+)$\"")?;
    if re.0.captures_len() != 3 {
        return Err(src.at(
            s.span(),
            &key,
            format!(
                "{} capture groups, expected two: the script's name and the path info, as in \"^(.+\\\\.php)(/.+)$\"",
                re.0.captures_len() - 1
            ),
        ));
    }
    Ok(re)
}

/// A warning for a FastCGI upstream whose backends take any number of requests at once:
/// php-fpm binds a worker to each kept connection, so a connection opened while every worker
/// holds one waits in its backlog until the response timeout.
pub(super) fn warn_unbounded(
    key: &str,
    up: &RawUpstream,
    limited: bool,
    warnings: &mut Vec<String>,
) {
    let fastcgi = up.protocol.as_ref().map(|p| *p.get_ref()) == Some(Protocol::Fastcgi);
    if fastcgi && !limited && up.max_conns == 0 {
        warnings.push(format!(
            "{key}: protocol = \"fastcgi\" without max_conns: php-fpm binds a worker to each kept connection, so a request on a connection opened while every worker holds one waits in its backlog; set max_conns to the pool's pm.max_children (and a queue for the requests over it)"
        ));
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, Protocol};

    const UPSTREAM: &str = "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"php\"\n[upstream.php]\nprotocol = \"fastcgi\"\nbackends = [{ address = \"127.0.0.1:9000\" }]\n";

    fn parse(table: &str) -> Result<Config, String> {
        let text = format!("{UPSTREAM}{table}");
        Config::parse("pinlb.toml", &text, &[0]).map_err(|e| e.to_string())
    }

    #[test]
    fn a_fastcgi_upstream_takes_its_script_rules_with_nginxs_defaults() {
        let c = parse("[upstream.php.fastcgi]\nroot = \"/var/www/\"\n").unwrap();
        let u = &c.upstreams[0];
        assert_eq!(u.protocol, Protocol::Fastcgi);
        let f = u.fastcgi.as_deref().unwrap();
        assert_eq!(
            c.warnings,
            [
                "upstream.php: protocol = \"fastcgi\" without max_conns: php-fpm binds a worker to each kept connection, so a request on a connection opened while every worker holds one waits in its backlog; set max_conns to the pool's pm.max_children (and a queue for the requests over it)"
            ]
        );
        assert_eq!(f.root, "/var/www");
        assert_eq!(
            f.summary(),
            "root /var/www, index index.php, chunked bodies read whole up to 1048576 bytes"
        );
        assert_eq!(f.index, "index.php");
        assert_eq!(f.chunked_body_max, 1024 * 1024);
        assert!(f.script.is_none() && f.split_path_info.is_none());
        let c = parse(
            "[upstream.php.fastcgi]\nroot = \"/srv\"\nindex = \"app.php\"\nscript = \"/index.php\"\nsplit_path_info = '^(.+\\.php)(/.+)$'\nchunked_body_max = \"8MiB\"\nparams = { APP_ENV = \"prod\" }\n",
        )
        .unwrap();
        let f = c.upstreams[0].fastcgi.as_deref().unwrap();
        assert_eq!(f.index, "app.php");
        let bounded = format!("{UPSTREAM}[upstream.php.fastcgi]\nroot = \"/w\"\n")
            .replace("backends = [", "max_conns = 8\nbackends = [");
        let bounded = Config::parse("pinlb.toml", &bounded, &[0]).unwrap();
        assert!(bounded.warnings.is_empty(), "{:?}", bounded.warnings);
        assert_eq!(f.script.as_deref(), Some("/index.php"));
        assert_eq!(f.chunked_body_max, 8 * 1024 * 1024);
        assert_eq!(f.params, [("APP_ENV".to_string(), "prod".to_string())]);
        assert!(f.split_path_info.as_ref().unwrap().0.is_match(b"/a.php/b"));
    }

    #[test]
    fn bad_fastcgi_keys_are_refused_at_their_place() {
        let cases = [
            (
                "",
                "pinlb.toml:5:12: upstream.php.fastcgi: missing, expected an [upstream.NAME.fastcgi] table",
            ),
            (
                "[upstream.php.fastcgi]\nindex = \"i.php\"\n",
                "pinlb.toml:7:1: upstream.php.fastcgi.root: missing, expected the document root",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"www\"\n",
                "pinlb.toml:8:8: upstream.php.fastcgi.root: \"www\" is relative, expected an absolute path",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nindex = \"a/b.php\"\n",
                "pinlb.toml:9:9: upstream.php.fastcgi.index: \"a/b.php\" is not a file name",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nscript = \"index.php\"\n",
                "pinlb.toml:9:10: upstream.php.fastcgi.script: \"index.php\" is not a path under root",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nscript = \"/../x.php\"\n",
                "pinlb.toml:9:10: upstream.php.fastcgi.script: \"/../x.php\" is not a path under root",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nsplit_path_info = \"^(.+\"\n",
                "pinlb.toml:9:19: upstream.php.fastcgi.split_path_info: invalid regular expression",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nsplit_path_info = \"^(.+)$\"\n",
                "pinlb.toml:9:19: upstream.php.fastcgi.split_path_info: 1 capture groups, expected two",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nparams = { \"A-B\" = \"1\" }\n",
                "pinlb.toml:9:20: upstream.php.fastcgi.params: \"A-B\" is not a parameter name",
            ),
            (
                "[upstream.php.fastcgi]\nroot = \"/w\"\nsurprise = 1\n",
                "pinlb.toml:9:1: upstream.php.fastcgi.surprise: unknown field `surprise`",
            ),
        ];
        for (table, want) in cases {
            let got = parse(table).expect_err(table);
            assert!(got.starts_with(want), "{table}\ngot:  {got}\nwant: {want}");
        }
        let http = "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"php\"\n[upstream.php]\nbackends = [{ address = \"127.0.0.1:9000\" }]\n[upstream.php.fastcgi]\nroot = \"/w\"\n";
        let got = Config::parse("pinlb.toml", http, &[0])
            .unwrap_err()
            .to_string();
        assert!(
            got.starts_with(
                "pinlb.toml:6:1: upstream.php.fastcgi: set without protocol = \"fastcgi\""
            ),
            "{got}"
        );
    }
}
