//! `[upstream.NAME.outlier]`: ejecting a backend by its answers (Envoy's outlier detection,
//! HAProxy's `observe layer7` with `error-limit` and `on-error mark-down`). Off unless the table
//! is written.

use std::time::Duration;

use toml::Spanned;

use super::raw::{RawOutlier, positive};
use crate::syntax::error::{ConfigError, Source};

/// When a backend is ejected for its answers, for how long, and how many may be out at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outlier {
    /// `consecutive_5xx`: this many 5xx answers in a row eject the backend; 0 = off.
    pub consecutive_5xx: u32,
    /// `success_rate`, in thousandths: a backend whose share of answers below 500 over one
    /// `interval` is under this share of the pool's is ejected; 0 = off.
    pub success_rate_per_mille: u32,
    /// `interval`: how long the success rates are counted over.
    pub interval: Duration,
    /// `min_requests`: the answers a backend needs in an interval for its rate to count.
    pub min_requests: u32,
    /// `base_time`: the first ejection's length; the n-th lasts n times as long.
    pub base_time: Duration,
    /// `max_time`: the longest ejection; a backend that stayed in for this long starts again
    /// from `base_time`.
    pub max_time: Duration,
    /// `max_ejected`, in thousandths: the share of the pool that may be out at once (skipped
    /// after failures or ejected); at least one backend may always be.
    pub max_ejected_per_mille: u32,
}

impl Default for Outlier {
    fn default() -> Self {
        Outlier {
            consecutive_5xx: 5,
            success_rate_per_mille: 800,
            interval: Duration::from_secs(1),
            min_requests: 20,
            base_time: Duration::from_secs(30),
            max_time: Duration::from_secs(300),
            max_ejected_per_mille: 100,
        }
    }
}

/// `[upstream.NAME.outlier]`, checked; `None` without the table.
pub(super) fn outlier(
    src: &Source,
    key: &str,
    raw: &Option<Spanned<RawOutlier>>,
) -> Result<Option<Outlier>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let raw = raw.get_ref();
    let d = Outlier::default();
    let key = format!("{key}.outlier");
    let share = |v: &Option<Spanned<f64>>, name: &str, default: u32| match v {
        None => Ok(default),
        Some(v) if (0.0..=1.0).contains(v.get_ref()) => Ok((v.get_ref() * 1000.0).round() as u32),
        Some(v) => Err(src.at(
            v.span(),
            &format!("{key}.{name}"),
            "expected a share from 0.0 to 1.0, such as 0.8",
        )),
    };
    let out = Outlier {
        consecutive_5xx: raw.consecutive_5xx.unwrap_or(d.consecutive_5xx),
        success_rate_per_mille: share(&raw.success_rate, "success_rate", d.success_rate_per_mille)?,
        interval: positive(src, &raw.interval, &format!("{key}.interval"))?.unwrap_or(d.interval),
        min_requests: raw.min_requests.unwrap_or(d.min_requests).max(1),
        base_time: positive(src, &raw.base_time, &format!("{key}.base_time"))?
            .unwrap_or(d.base_time),
        max_time: positive(src, &raw.max_time, &format!("{key}.max_time"))?.unwrap_or(d.max_time),
        max_ejected_per_mille: share(&raw.max_ejected, "max_ejected", d.max_ejected_per_mille)?,
    };
    if out.max_time < out.base_time {
        let at = raw.max_time.as_ref().map_or(0..0, |v| v.span());
        return Err(src.at(
            at,
            &format!("{key}.max_time"),
            format!(
                "{:?} is shorter than base_time ({:?}), expected at least as long",
                out.max_time, out.base_time
            ),
        ));
    }
    Ok(Some(out))
}
