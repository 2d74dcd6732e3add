//! `[upstream.NAME.fastcgi]`: which script a request to a `protocol = "fastcgi"` upstream runs
//! (nginx's `root`, `fastcgi_index`, `fastcgi_split_path_info`, the `SCRIPT_FILENAME
//! $document_root$fastcgi_script_name` line), the PARAMS added to the standard set
//! (`fastcgi_param`), and how much of a chunked request body is read to learn its length.

use toml::Spanned;

use super::Protocol;
use super::error::{ConfigError, Source};
use super::raw::{RawFastcgi, RawUpstream};

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
    pub split_path_info: Option<SplitPath>,
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

/// A compiled `split_path_info`, compared by its pattern.
#[derive(Debug, Clone)]
pub struct SplitPath(pub regex::bytes::Regex);

impl PartialEq for SplitPath {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for SplitPath {}

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
fn split_path(src: &Source, fkey: &str, s: &Spanned<String>) -> Result<SplitPath> {
    let key = format!("{fkey}.split_path_info");
    let re = regex::bytes::Regex::new(s.get_ref()).map_err(|e| {
        let first = e.to_string();
        let first = first.lines().last().unwrap_or_default().to_string();
        src.at(
            s.span(),
            &key,
            format!(
                "invalid regular expression ({first}), expected one such as \"^(.+\\\\.php)(/.+)$\""
            ),
        )
    })?;
    if re.captures_len() != 3 {
        return Err(src.at(
            s.span(),
            &key,
            format!(
                "{} capture groups, expected two: the script's name and the path info, as in \"^(.+\\\\.php)(/.+)$\"",
                re.captures_len() - 1
            ),
        ));
    }
    Ok(SplitPath(re))
}
