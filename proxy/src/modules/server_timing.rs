//! `server_timing`: a proxied response says where its time went, in a `Server-Timing` header
//! that browsers' devtools and `curl -w` show: `server-timing: pinlb;dur=0.052,
//! upstream;dur=20.113` (milliseconds with microsecond resolution), with `queue;dur=…` first
//! when the request waited in the upstream's queue. `pinlb` is the proxy's own share (the
//! access log's `proxy_time`), `upstream` the waits on backends up to the response head
//! (connects, failed attempts, the answer's head). HAProxy and nginx have no such header;
//! Envoy and Caddy users add it by hand.
//!
//! On a listener or a route; a route's `server_timing` replaces the listener's (`false`: off).
//! pinlb's own answers (a route's `respond`, a refusal, a 502 with no backend's time) get
//! none. The request's spans are measured only on a listener where this, the access log or
//! `/metrics` reads them.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::{Module, Place, Response};
use crate::syntax::error::ConfigError;

/// The module.
pub(crate) enum ServerTiming {}

/// Its key as the file writes it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Raw {
    pub server_timing: Option<Spanned<bool>>,
}

/// On: it has nothing to configure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct On;

impl Module for ServerTiming {
    const KEYS: &'static [&'static str] = &["server_timing"];
    type Raw = Raw;
    type Config = On;
    type Local = ();
    type Filter = super::NoFilter;
    const RESPONSE: bool = true;
    const TIMED: bool = true;

    fn validate(
        _: &Place<'_>,
        raw: &Raw,
        inherited: Option<&Arc<On>>,
    ) -> Result<Option<Arc<On>>, ConfigError> {
        Ok(match &raw.server_timing {
            None => inherited.cloned(),
            Some(on) if *on.get_ref() => Some(Arc::new(On)),
            Some(_) => None,
        })
    }

    fn response(_: &Arc<On>, response: &mut Response<'_>) {
        let Some(t) = response.timing else {
            return;
        };
        let out = &mut *response.headers;
        out.extend_from_slice(b"server-timing: ");
        if !t.queue.is_zero() {
            out.extend_from_slice(b"queue;dur=");
            millis_into(out, t.queue);
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(b"pinlb;dur=");
        millis_into(out, t.proxy);
        out.extend_from_slice(b", upstream;dur=");
        millis_into(out, t.upstream);
        out.extend_from_slice(b"\r\n");
    }

    fn describe(_: &On) -> String {
        "server_timing on".into()
    }
}

/// Milliseconds with microsecond resolution: `0.052`, `20.113`.
fn millis_into(out: &mut Vec<u8>, d: Duration) {
    let us = d.as_micros();
    out.extend_from_slice(itoa::Buffer::new().format(us / 1000).as_bytes());
    out.push(b'.');
    let frac = us % 1000;
    if frac < 100 {
        out.push(b'0');
    }
    if frac < 10 {
        out.push(b'0');
    }
    out.extend_from_slice(itoa::Buffer::new().format(frac).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::Timing;

    fn line(timing: Timing) -> Vec<u8> {
        let mut text = bytes::BytesMut::from("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let limits = crate::http1::request::RequestLimits::default();
        let head = crate::http1::request::parse_request(&mut text, &limits)
            .unwrap()
            .unwrap();
        let mut headers = Vec::new();
        let mut response = Response {
            status: http::StatusCode::OK,
            headers: &mut headers,
            request: crate::syntax::template::Request {
                head: &head,
                https: false,
                client: std::net::Ipv4Addr::LOCALHOST.into(),
            },
            length: None,
            proxied: true,
            timing: Some(timing),
        };
        ServerTiming::response(&Arc::new(On), &mut response);
        headers
    }

    #[test]
    fn server_timing_has_milliseconds_with_microsecond_resolution() {
        let us = Duration::from_micros;
        let mut t = Timing {
            queue: Duration::ZERO,
            proxy: us(52),
            upstream: us(20_113),
        };
        assert_eq!(
            line(t),
            b"server-timing: pinlb;dur=0.052, upstream;dur=20.113\r\n"
        );
        t.queue = us(1_500_007);
        assert_eq!(
            line(t),
            b"server-timing: queue;dur=1500.007, pinlb;dur=0.052, upstream;dur=20.113\r\n"
        );
    }
}
