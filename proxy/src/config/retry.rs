//! `[upstream.NAME.retry]`: when a request moves on to the next backend (nginx's
//! `proxy_next_upstream`, HAProxy's `retry-on`), and the budget that bounds retries on a status.

use std::time::Duration;

use super::StatusSet;
use super::raw::{RawRetry, positive};
use crate::syntax::error::{ConfigError, Source};

/// When a failed attempt, or an answer with a listed status, moves on to another backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Most attempts per request, the first included; 0 = every eligible backend once.
    pub tries: usize,
    /// No new attempt starts once this long has passed since the first.
    pub timeout: Duration,
    /// Whether POST, PATCH and other non-idempotent requests may be sent again after the backend
    /// may have seen them.
    pub non_idempotent: bool,
    /// Request bodies up to this many bytes are kept so they can be sent again.
    pub buffer: usize,
    /// `on`'s `error`: a connect refused or reset, or a reset, close or invalid head before the
    /// response head (nginx's `error` and `invalid_header`).
    pub on_error: bool,
    /// `on`'s `timeout`: no connection, or no response head, in time.
    pub on_timeout: bool,
    /// `on`'s `http_NNN`: the backend's answers that are retried as failures; empty on the
    /// plain path.
    pub on_status: StatusSet,
    /// `budget`, in thousandths: the share of requests that retries on a status may add.
    pub budget_per_mille: u32,
    /// `budget_min`: retries on a status a worker may make per second beyond the share.
    pub budget_min: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            tries: 0,
            timeout: Duration::from_secs(10),
            non_idempotent: false,
            buffer: 64 * 1024,
            on_error: true,
            on_timeout: true,
            on_status: StatusSet::default(),
            budget_per_mille: 200,
            budget_min: 10,
        }
    }
}

/// `[upstream.NAME.retry]`, checked.
pub(super) fn retry(src: &Source, key: &str, r: &RawRetry) -> Result<Retry, ConfigError> {
    let d = Retry::default();
    let mut out = Retry {
        tries: r.tries.unwrap_or(d.tries),
        timeout: positive(src, &r.timeout, &format!("{key}.retry.timeout"))?.unwrap_or(d.timeout),
        non_idempotent: r.non_idempotent.unwrap_or(d.non_idempotent),
        buffer: r
            .buffer
            .map_or(d.buffer, |b| usize::try_from(b.0).unwrap_or(usize::MAX)),
        ..d
    };
    if let Some(on) = &r.on {
        (out.on_error, out.on_timeout) = (false, false);
        let mut statuses = Vec::new();
        for cond in on.get_ref() {
            match cond.get_ref().as_str() {
                "error" | "invalid_header" => out.on_error = true,
                "timeout" => out.on_timeout = true,
                "off" if on.get_ref().len() == 1 => out.tries = 1,
                name => match name
                    .strip_prefix("http_")
                    .and_then(|n| n.parse::<u16>().ok())
                {
                    Some(status @ 400..=599) => statuses.push((status, status)),
                    _ => {
                        return Err(src.at(
                            cond.span(),
                            &format!("{key}.retry.on"),
                            format!(
                                "unknown condition {name:?}, expected \"error\", \"timeout\", \
                                 \"invalid_header\", \"http_NNN\" with NNN a status from 400 \
                                 to 599, or \"off\" alone"
                            ),
                        ));
                    }
                },
            }
        }
        out.on_status = StatusSet(statuses);
    }
    if let Some(b) = &r.budget {
        let share = *b.get_ref();
        if !(0.0..=1.0).contains(&share) {
            return Err(src.at(
                b.span(),
                &format!("{key}.retry.budget"),
                "expected a share of requests from 0.0 to 1.0, such as 0.2",
            ));
        }
        out.budget_per_mille = (share * 1000.0).round() as u32;
    }
    if let Some(min) = r.budget_min {
        out.budget_min = min;
    }
    Ok(out)
}
