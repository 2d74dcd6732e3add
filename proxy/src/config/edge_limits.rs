//! The listeners' and their routes' `rate_limit` and `conn_limit`, validated by their modules
//! (`modules::rate_limit`, `modules::conn_limit`) and set on the validated listeners, with the
//! one rule that joins them to a listener's mode: a TCP listener's zones are keyed by the
//! client's address.

use super::Listener;
use super::raw::RawListener;
use crate::modules::rate_limit::RateZone;
use crate::modules::{conn_limit, rate_limit};
use crate::syntax::error::{ConfigErrors, Source};

/// The listeners' and their routes' `rate_limit` and `conn_limit`, set on the validated
/// `listeners` (in file order, as their routes are).
pub(super) fn attach(
    src: &Source,
    raw: &[RawListener],
    listeners: &mut [Listener],
    zones: &[RateZone],
) -> std::result::Result<(), ConfigErrors> {
    let mut errors = Vec::new();
    for (i, (r, l)) in raw.iter().zip(listeners.iter_mut()).enumerate() {
        let key = format!("listener[{i}]");
        if let Some(list) = &r.rate_limit {
            match rate_limit::limits(src, &key, list, zones) {
                // A TCP listener counts connections, which have the client's address only.
                Ok(v) if l.mode == super::ListenerMode::Tcp => {
                    let by_other = v.iter().zip(list.get_ref()).find(|(limit, _)| {
                        zones[limit.zone].key != crate::config::HashKey::ClientIp
                    });
                    match by_other {
                        Some((limit, raw)) => errors.push(src.at(
                            raw.get_ref().zone.span(),
                            &format!("{key}.rate_limit"),
                            format!(
                                "zone {} is keyed by {}, expected a zone keyed by client_ip: a TCP listener counts connections, which have no header or cookie",
                                zones[limit.zone].name, zones[limit.zone].key
                            ),
                        )),
                        None => l.rate_limits = v,
                    }
                }
                Ok(v) => l.rate_limits = v,
                Err(e) => errors.push(e),
            }
        }
        if let Some(c) = &r.conn_limit {
            match conn_limit::validate(src, &key, c.get_ref()) {
                Ok(c) => l.conn_limit = Some(c),
                Err(e) => errors.push(e),
            }
        }
        for (j, (rr, route)) in r.route.iter().zip(l.routes.iter_mut()).enumerate() {
            if let Some(list) = &rr.get_ref().rate_limit {
                match rate_limit::limits(src, &format!("{key}.route[{j}]"), list, zones) {
                    Ok(v) => route.rate_limits = Some(v),
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    match ConfigErrors::new(errors) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
