//! `[upstream.NAME.buffering]`: nginx's `proxy_request_buffering` and `proxy_buffering`, so
//! that a slow client does not hold a backend. Off unless the table is written: an upstream
//! without it streams both bodies, as pinlb always did (`pinlb import` writes the table for an
//! nginx config, whose default is to buffer).
//!
//! Its keys are an upstream's, so it sits outside the listener modules' registry: this file
//! owns its keys (read where the upstream's other keys are), their validation and its
//! configuration. What it does to bodies is the proxy's own work around a backend exchange,
//! with the spool of memory and temporary file they share (`proxy::request_buffering`,
//! `proxy::response_buffering`, `proxy::spool`).

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::syntax::error::{ConfigError, Source};
use crate::syntax::values::Size;

type Result<T> = std::result::Result<T, ConfigError>;

/// `[upstream.NAME.buffering]` as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub request: Option<Spanned<bool>>,
    pub response: Option<Spanned<bool>>,
    pub memory: Option<Spanned<Size>>,
    pub temp_dir: Option<Spanned<String>>,
    pub max_temp: Option<Spanned<Size>>,
}

/// How an upstream buffers bodies for slow clients. With the table written, `request` and
/// `response` are on unless set to false.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffering {
    /// `request`: the client's body is read whole (memory, then a temporary file) before a
    /// backend is picked, and goes to it with a Content-Length (nginx's
    /// `proxy_request_buffering on`).
    pub request: bool,
    /// `response`: a backend's HTTP/1.1 response body is read as fast as the backend sends it,
    /// and its connection goes back to the pool at the last byte while the client still reads
    /// (nginx's `proxy_buffering on`). A backend's `X-Accel-Buffering: yes` turns it on for one
    /// response even when this is off; `no` turns it off.
    pub response: bool,
    /// `memory`: bytes of one body kept in memory, per request and direction (nginx's
    /// `client_body_buffer_size`, `proxy_buffers`); past it the body goes to a temporary file.
    pub memory: usize,
    /// `temp_dir`: where the temporary files are made. Each is unlinked as it is made
    /// (`O_TMPFILE`), so nothing is left behind, even by a crash.
    pub temp_dir: PathBuf,
    /// `max_temp`: the largest temporary file of one body (nginx's
    /// `proxy_max_temp_file_size`). A response past it is read from the backend no faster than
    /// the client takes it; a request body past `memory` + this is refused with 413, as one past
    /// `limits.max_body` is. 0 = no file: memory only.
    pub max_temp: u64,
}

impl Buffering {
    /// `memory`'s default: nginx's `proxy_buffers 8 8k`, rounded to one 64 KiB bound.
    pub const MEMORY: usize = 64 * 1024;
    /// `max_temp`'s default: nginx's `proxy_max_temp_file_size 1024m`.
    pub const MAX_TEMP: u64 = 1 << 30;

    /// The defaults of a table that sets only `temp_dir` (and, for `pinlb import`, both
    /// directions on, as nginx's defaults are).
    pub fn on(temp_dir: PathBuf) -> Buffering {
        Buffering {
            request: true,
            response: true,
            memory: Buffering::MEMORY,
            temp_dir,
            max_temp: Buffering::MAX_TEMP,
        }
    }
}

/// An upstream's `[buffering]` table (`table`, of the upstream at `key`), checked: its
/// temporary directory exists and takes a file (made and dropped at once, at each load and
/// reload), and response buffering is not asked of an HTTP/2 upstream (`http2`).
pub(crate) fn validate(
    src: &Source,
    key: &str,
    table: Option<&Spanned<Raw>>,
    http2: bool,
) -> Result<Option<Arc<Buffering>>> {
    let Some(table) = table else {
        return Ok(None);
    };
    let key = format!("{key}.buffering");
    let raw: &Raw = table.get_ref();
    // The table is the opt-in: written, it buffers both ways, as nginx does by default.
    let flag = |v: &Option<Spanned<bool>>| v.as_ref().is_none_or(|v| *v.get_ref());
    let (request, response) = (flag(&raw.request), flag(&raw.response));
    if let (true, Some(v)) = (http2, &raw.response) {
        if *v.get_ref() {
            return Err(src.at(
                v.span(),
                &format!("{key}.response"),
                "not with an HTTP/2 upstream, expected false or no key: its streams (gRPC among them) stream to the client, as nginx's grpc_pass does, and a slow client holds a stream of a shared connection, not a connection",
            ));
        }
    }
    let memory = match &raw.memory {
        None => Buffering::MEMORY,
        Some(m) => usize::try_from(m.get_ref().0).unwrap_or(usize::MAX),
    };
    let max_temp = raw
        .max_temp
        .as_ref()
        .map_or(Buffering::MAX_TEMP, |m| m.get_ref().0);
    let temp_dir = match &raw.temp_dir {
        None => std::env::temp_dir(),
        Some(dir) => {
            let path = PathBuf::from(dir.get_ref());
            if !path.is_absolute() {
                return Err(src.at(
                    dir.span(),
                    &format!("{key}.temp_dir"),
                    format!(
                        "\"{}\" is relative, expected an absolute path to a directory",
                        dir.get_ref()
                    ),
                ));
            }
            path
        }
    };
    if max_temp > 0 {
        // The same call the request path makes: a directory that exists but takes no file
        // (missing, not a directory, not writable) is found now, not at the first large body.
        if let Err(e) = tempfile::tempfile_in(&temp_dir) {
            let at = raw.temp_dir.as_ref().map_or(table.span(), Spanned::span);
            return Err(src.at(
                at,
                &format!("{key}.temp_dir"),
                format!(
                    "cannot make a temporary file in {}: {e}, expected a writable directory (or max_temp = 0 for memory only)",
                    temp_dir.display()
                ),
            ));
        }
    }
    Ok(Some(Arc::new(Buffering {
        request,
        response,
        memory,
        temp_dir,
        max_temp,
    })))
}
