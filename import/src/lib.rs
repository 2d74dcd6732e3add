//! `pinlb import nginx.conf`: an nginx configuration read (its includes followed) and written as
//! a pinlb one, with a note, in file order, for every directive pinlb does not do as nginx does
//! (none for one whose behaviour pinlb already has), and a refusal
//! ([`ImportError::LessStrict`]) where leaving one out would make pinlb less strict than nginx.
//! A location that serves files becomes a route that answers 404 (`files` says why), and its
//! note names the route its requests would take without it.
//!
//! - [`parse`]: nginx's syntax, directives with their `file:line`.
//! - [`values`]: nginx's addresses and durations as pinlb writes them.
//! - [`notes`]: the notes in file order, each said once.
//! - [`error_page`]: `error_page` to a local file and `proxy_intercept_errors`.
//! - [`template`]: nginx variables as pinlb template variables.
//! - [`rewrite`]: `rewrite ... redirect|permanent` as a route redirect, where one is exact.
//! - [`access`]: `allow`/`deny`, `auth_basic` and `satisfy` as a route's access keys.
//! - [`limits`]: `limit_req_zone`, `limit_req` and `limit_req_status` as rate zones.
//! - [`proxy_protocol`]: `listen … proxy_protocol` and the realip module's directives.
//! - [`gzip`]: the gzip module's directives as a route's `compress`.
//! - [`limit_rate`]: `limit_rate` and `limit_rate_after` as a route's keys of those names.
//! - [`cache`]: `proxy_cache_path` as `[cache.NAME]`, the `proxy_cache` directives as a
//!   route's `cache`.
//! - [`mirror`]: `mirror URI` and the internal location it names as a route's `mirror`.
//! - [`client_cert`]: the client certificate directives as `[listener.tls]` keys.
//! - [`buffering`]: `proxy_buffering`, `proxy_request_buffering` and their bounds as an
//!   upstream's `[buffering]`.
//! - [`sticky`]: nginx Plus's `sticky cookie` as an upstream's `sticky`.
//! - [`unix_socket`]: `server unix:` and `proxy_pass http://unix:` as Unix-socket backends.
//! - [`fastcgi`]: `fastcgi_pass` locations as routes to `protocol = "fastcgi"` upstreams, and a
//!   `try_files` front controller as a route to its script.
//! - [`files`]: locations that serve files as routes that answer 404, and where their requests
//!   would go without them.
//! - [`stream`]: the `stream {}` block's servers as TCP and UDP listeners, `ssl_preread` with
//!   a server-name `map` as `[[listener.sni]]`.
//! - [`matched`]: directives whose behaviour pinlb already has, converted to nothing and not
//!   noted.
//! - [`convert`]: directives to pinlb's configuration, built as its own raw types
//!   (`pinlb::config::raw` and each module's `Raw`), which [`import`] writes as TOML.

mod access;
mod buffering;
mod cache;
mod client_cert;
mod convert;
mod error_page;
mod fastcgi;
mod files;
mod gzip;
mod limit_rate;
mod limits;
mod matched;
mod mirror;
mod notes;
mod parse;
mod proxy_protocol;
mod rewrite;
mod sticky;
mod stream;
mod template;
mod unix_socket;
mod values;

use std::path::Path;

pub use parse::ParseError;

/// Why there is no configuration to print.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Every server only serves files: nothing proxies, redirects or answers, so a pinlb
    /// configuration would have no listener. The notes say what each directive was.
    #[error("nothing to proxy: its servers only serve files; pinlb serves no files")]
    NothingToProxy { notes: Vec<String> },
    /// Directives that make nginx refuse, limit or ask for credentials (or serve TLS) were not
    /// converted, so pinlb would answer requests nginx does not. Each is in `refused`, at its
    /// `file:line`; `--allow-less-strict` prints the configuration anyway.
    #[error(
        "{} directive(s) above not converted would make pinlb less strict than nginx; convert them by hand, or pass --allow-less-strict to print the configuration without them",
        refused.len()
    )]
    LessStrict {
        notes: Vec<String>,
        refused: Vec<String>,
    },
}

impl ImportError {
    /// The lines to print before the error's own: the notes, then what was refused.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ImportError::Parse(_) => Vec::new(),
            ImportError::NothingToProxy { notes } => notes.clone(),
            ImportError::LessStrict { notes, refused } => {
                notes.iter().chain(refused).cloned().collect()
            }
        }
    }
}

/// The pinlb configuration as TOML text, and the notes (`file:line: ...`, in file order) on
/// what was not converted. A directive left out that makes pinlb less strict than nginx (an `allow unix:`,
/// a `limit_req`, a regex location pinlb's engine can't compile that returns 403, TLS settings) is an error unless
/// `allow_less_strict`, and then a note.
pub fn import(path: &Path, allow_less_strict: bool) -> Result<(String, Vec<String>), ImportError> {
    let mut notes = Vec::new();
    let directives = parse::parse_file(path, &mut notes)?;
    let files = notes::files(path, &directives);
    // nginx resolves relative file names against its prefix, the main file's directory.
    let conf_dir = path.parent().unwrap_or(Path::new(""));
    let mut converted = convert::convert(&directives, conf_dir);
    notes.extend(converted.notes);
    notes::sort(&mut converted.refused, &files);
    if !converted.anything {
        notes.extend(converted.refused);
        notes::sort(&mut notes, &files);
        return Err(ImportError::NothingToProxy { notes });
    }
    if !converted.refused.is_empty() && !allow_less_strict {
        notes::sort(&mut notes, &files);
        return Err(ImportError::LessStrict {
            notes,
            refused: converted.refused,
        });
    }
    notes.extend(
        converted
            .refused
            .into_iter()
            .map(|r| format!("{r} (accepted: --allow-less-strict)")),
    );
    notes::sort(&mut notes, &files);
    // Through a table, so that each table's keys are written in the order of their names.
    let table = toml::Table::try_from(&converted.config).expect("the configuration is TOML");
    let mut text = toml::to_string(&table).expect("a TOML table is TOML");
    // The serializer ends the last table without a newline; a file (and a terminal, where the
    // notes follow on stderr) wants one.
    if !text.ends_with('\n') {
        text.push('\n');
    }
    Ok((
        format!(
            "# Imported from {} by pinlb import.\n{text}",
            path.display()
        ),
        notes,
    ))
}
