//! The PROXY protocol's keys: `[[listener]] proxy_protocol` and `proxy_protocol_from` (who may
//! name another client), `[upstream.NAME] proxy_protocol` (the header sent to the backends).

use toml::Spanned;

use super::raw::{RawListener, RawUpstream};
use super::{Protocol, ProxyVersion};
use crate::syntax::error::{ConfigError, Source};

type Result<T> = std::result::Result<T, ConfigError>;

/// A listener's `proxy_protocol` and `proxy_protocol_from`: the networks whose connections must
/// begin with a header, or `None` when the listener reads none.
///
/// `proxy_protocol_from` is required with `proxy_protocol = true`: a listener that took the
/// header from anyone would let anyone claim any address (nginx does take it from anyone, and
/// relies on `set_real_ip_from` to limit whom it believes; pinlb does both at once, as HAProxy's
/// `accept-proxy` behind a `tcp-request connection reject` does).
pub(super) fn accept(
    src: &Source,
    key: &str,
    l: &RawListener,
) -> Result<Option<Vec<ipnet::IpNet>>> {
    let on = l.proxy_protocol.as_ref().is_some_and(|v| *v.get_ref());
    match (on, &l.proxy_protocol_from) {
        (false, None) => Ok(None),
        (false, Some(from)) => Err(src.at(
            from.span(),
            &format!("{key}.proxy_protocol_from"),
            "set without proxy_protocol = true, expected both (or neither)",
        )),
        (true, None) => Err(src.at(
            l.proxy_protocol.as_ref().map_or(l.address.span(), Spanned::span),
            &format!("{key}.proxy_protocol_from"),
            "missing, expected the addresses or CIDR blocks allowed to send a PROXY protocol header (the load balancers in front), such as [\"10.0.0.0/8\"]: a header from anyone would let anyone claim any client address",
        )),
        (true, Some(from)) if from.get_ref().is_empty() => Err(src.at(
            from.span(),
            &format!("{key}.proxy_protocol_from"),
            "empty, expected at least one address or CIDR block allowed to send a PROXY protocol header",
        )),
        (true, Some(from)) => {
            let mut nets = Vec::with_capacity(from.get_ref().len());
            for (i, t) in from.get_ref().iter().enumerate() {
                let v = t.get_ref();
                let net = v
                    .parse::<ipnet::IpNet>()
                    .or_else(|_| v.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| {
                        src.at(
                            t.span(),
                            &format!("{key}.proxy_protocol_from[{i}]"),
                            format!("invalid network \"{v}\", expected an address or a CIDR block such as \"10.0.0.0/8\""),
                        )
                    })?;
                nets.push(net.trunc());
            }
            Ok(Some(nets))
        }
    }
}

/// An upstream's `proxy_protocol`: `"v1"`, `"v2"`, or none.
///
/// Not with HTTP/2 to the backends: one HTTP/2 connection multiplexes many clients' requests,
/// and a header names one client.
pub(super) fn send(
    src: &Source,
    key: &str,
    up: &RawUpstream,
    protocol: Protocol,
) -> Result<Option<ProxyVersion>> {
    let Some(v) = &up.proxy_protocol else {
        return Ok(None);
    };
    let version = match v.get_ref().as_str() {
        "v1" => ProxyVersion::V1,
        "v2" => ProxyVersion::V2,
        other => {
            return Err(src.at(
                v.span(),
                &format!("{key}.proxy_protocol"),
                format!("\"{other}\" is not a PROXY protocol version, expected \"v1\" or \"v2\""),
            ));
        }
    };
    if protocol.is_http2() {
        return Err(src.at(
            v.span(),
            &format!("{key}.proxy_protocol"),
            "set with an HTTP/2 protocol, expected protocol = \"http1\": an HTTP/2 backend connection multiplexes many clients' requests, and a PROXY protocol header names one client",
        ));
    }
    Ok(Some(version))
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ProxyVersion};

    fn parse(listener: &str, upstream: &str) -> Result<Config, String> {
        let text = format!(
            "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n{listener}\n[upstream.app]\nbackends = [{{ address = \"127.0.0.1:8881\" }}]\n{upstream}\n"
        );
        Config::parse("pinlb.toml", &text, &[0, 1]).map_err(|e| e.to_string())
    }

    #[test]
    fn a_listener_takes_headers_only_from_the_networks_it_names() {
        let c = parse(
            "proxy_protocol = true\nproxy_protocol_from = [\"10.1.2.3/8\", \"192.0.2.7\", \"::1\"]",
            "",
        )
        .unwrap();
        let nets: Vec<String> = (c.listeners[0].proxy_protocol.as_ref().unwrap().iter())
            .map(|n| n.to_string())
            .collect();
        assert_eq!(nets, ["10.0.0.0/8", "192.0.2.7/32", "::1/128"]);
        assert_eq!(parse("", "").unwrap().listeners[0].proxy_protocol, None);
        assert_eq!(
            parse("proxy_protocol = false", "").unwrap().listeners[0].proxy_protocol,
            None
        );
    }

    #[test]
    fn a_listener_open_to_headers_from_anyone_is_refused() {
        let e = parse("proxy_protocol = true", "").unwrap_err();
        assert!(
            e.starts_with(
                "pinlb.toml:4:18: listener[0].proxy_protocol_from: missing, expected the addresses"
            ),
            "{e}"
        );
        let e = parse("proxy_protocol = true\nproxy_protocol_from = []", "").unwrap_err();
        assert!(e.contains("listener[0].proxy_protocol_from: empty"), "{e}");
        let e = parse("proxy_protocol_from = [\"10.0.0.0/8\"]", "").unwrap_err();
        assert!(e.contains("set without proxy_protocol = true"), "{e}");
        let e = parse(
            "proxy_protocol = true\nproxy_protocol_from = [\"10.0.0.0/33\"]",
            "",
        )
        .unwrap_err();
        assert!(
            e.starts_with("pinlb.toml:5:24: listener[0].proxy_protocol_from[0]: invalid network \"10.0.0.0/33\""),
            "{e}"
        );
    }

    #[test]
    fn an_upstream_sends_v1_or_v2_over_http1_only() {
        let c = parse("", "proxy_protocol = \"v2\"").unwrap();
        assert_eq!(c.upstreams[0].proxy_protocol, Some(ProxyVersion::V2));
        let c = parse("", "proxy_protocol = \"v1\"").unwrap();
        assert_eq!(c.upstreams[0].proxy_protocol, Some(ProxyVersion::V1));
        assert_eq!(parse("", "").unwrap().upstreams[0].proxy_protocol, None);
        let e = parse("", "proxy_protocol = \"v3\"").unwrap_err();
        assert!(
            e.starts_with("pinlb.toml:7:18: upstream.app.proxy_protocol: \"v3\" is not a PROXY protocol version, expected \"v1\" or \"v2\""),
            "{e}"
        );
        let e = parse("", "protocol = \"h2c\"\nproxy_protocol = \"v2\"").unwrap_err();
        assert!(
            e.contains("upstream.app.proxy_protocol: set with an HTTP/2 protocol"),
            "{e}"
        );
    }
}
