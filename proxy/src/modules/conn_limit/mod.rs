//! A listener's `conn_limit` (nginx's `limit_conn`, HAProxy's `tcp-request connection reject
//! if { src_conn_cur gt N }`): open connections per client address, refused past `max`
//! before a byte is read.
//!
//! ```toml
//! [[listener]]
//! conn_limit = { max = 10, keys = 100000 }   # limit_conn addr 10;
//! ```
//!
//! This file has its key, its validated type and its validation. The process keeps each
//! listener's table across the reloads that keep the listener (`edge::tables`); the accept
//! phase takes a place for each connection (`downstream::h1`, `downstream::tcp`).
//!
//! - [`table`]: open connections by client address, shared by every worker.

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::modules::rate_limit::keys;
use crate::syntax::error::{ConfigError, Source};

pub(crate) mod table;

/// `conn_limit = { max, keys }`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConnLimit {
    pub max: Spanned<i64>,
    pub keys: Option<Spanned<i64>>,
}

/// The most connections per client address a `conn_limit` may allow: what the table's
/// counts hold ([`table`]).
pub const MAX_CONNS_PER_CLIENT: u32 = (1 << 24) - 1;

/// `conn_limit`: open connections per client address on one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimit {
    pub max: u32,
    pub keys: usize,
}

type Result<T> = std::result::Result<T, ConfigError>;

/// `conn_limit = { max, keys }` of the listener at `key`.
pub(crate) fn validate(src: &Source, key: &str, raw: &RawConnLimit) -> Result<ConnLimit> {
    let top = MAX_CONNS_PER_CLIENT;
    let max = match u32::try_from(*raw.max.get_ref()) {
        Ok(n) if (1..=top).contains(&n) => n,
        _ => {
            return Err(src.at(
                raw.max.span(),
                &format!("{key}.conn_limit.max"),
                format!(
                    "{} is out of range, expected a number of connections from 1 to {top}",
                    raw.max.get_ref()
                ),
            ));
        }
    };
    Ok(ConnLimit {
        max,
        keys: keys(src, &format!("{key}.conn_limit.keys"), &raw.keys)?,
    })
}
