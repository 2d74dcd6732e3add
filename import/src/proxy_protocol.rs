//! nginx's PROXY protocol directives: `listen … proxy_protocol` with `set_real_ip_from` and
//! `real_ip_header proxy_protocol` become a listener's `proxy_protocol = true` and
//! `proxy_protocol_from`; `proxy_protocol on` in a `stream` server is noted (the import reads
//! no `stream` block: pinlb proxies HTTP).
//!
//! nginx takes the header from anyone and believes its address only where `set_real_ip_from`
//! says (for `$remote_addr`); pinlb takes the header only from `proxy_protocol_from` and then
//! believes it everywhere. So the `set_real_ip_from` addresses (the server's own, else
//! `http`'s, as nginx inherits them) are the sources allowed. A `listen … proxy_protocol`
//! without any is refused as less strict: pinlb would have to take the header, and so any
//! client address it claims, from anyone; with `--allow-less-strict` it is written so
//! (`["0.0.0.0/0", "::/0"]`).

use pinlb::config::raw::RawListener;

use super::parse::Directive;
use super::values::spanned;

/// The directives of nginx's realip module, read here.
pub(super) const REAL_IP: [&str; 3] = ["set_real_ip_from", "real_ip_header", "real_ip_recursive"];

/// What one server brings to the listeners it takes the PROXY protocol on.
#[derive(Debug, Clone, Default)]
pub(super) struct Accepting {
    /// The addresses it listens on with `proxy_protocol`, and where each was written.
    pub addresses: Vec<(String, String)>,
    /// Its `set_real_ip_from` values (its own, else `http`'s), with where each was written.
    pub from: Vec<(String, String)>,
}

/// `listen ADDR … proxy_protocol`: whether `flag` is that, recorded for `address`.
pub(super) fn listen_flag(
    accepting: &mut Accepting,
    listen: &Directive,
    address: &str,
    flag: &str,
) -> bool {
    if flag != "proxy_protocol" {
        return false;
    }
    accepting.addresses.push((address.to_string(), listen.at()));
    true
}

/// A realip directive at a level (`http` or `server`) where some server listens with
/// `proxy_protocol`: converted with it, or a note on what differs. `false` when the level
/// takes no PROXY protocol header, so the directive is left to the caller's default.
pub(super) fn real_ip(d: &Directive, proxied: bool, notes: &mut Vec<String>) -> bool {
    if !proxied || !REAL_IP.contains(&d.name.as_str()) {
        return false;
    }
    match (d.name.as_str(), d.args.first().map(String::as_str)) {
        // Read by `from`.
        ("set_real_ip_from", _) => {}
        ("real_ip_header", Some("proxy_protocol")) => {}
        ("real_ip_header", _) => notes.push(format!(
            "{}: real_ip_header {} not converted: on a proxy_protocol listener pinlb takes the client's address from the PROXY protocol header",
            d.at(),
            d.args.join(" ")
        )),
        _ => notes.push(format!(
            "{}: {} not converted: pinlb's client address is the PROXY protocol header's source",
            d.at(),
            d.name
        )),
    }
    true
}

/// The `set_real_ip_from` values of `block`, or `inherited` where it has none (nginx's
/// inheritance of array directives: all of the nearest level that has any).
pub(super) fn from(block: &[Directive], inherited: &[(String, String)]) -> Vec<(String, String)> {
    let own: Vec<(String, String)> = block
        .iter()
        .filter(|d| d.name == "set_real_ip_from" && d.block.is_none())
        .filter_map(|d| Some((d.args.first()?.clone(), d.at())))
        .collect();
    if own.is_empty() {
        inherited.to_vec()
    } else {
        own
    }
}

/// Whether any server of `http` listens with `proxy_protocol`.
pub(super) fn any_server_accepts(http: &[Directive]) -> bool {
    http.iter().filter(|d| d.name == "server").any(|d| {
        d.block
            .iter()
            .flatten()
            .any(|s| s.name == "listen" && s.args.iter().skip(1).any(|a| a == "proxy_protocol"))
    })
}

/// The listener on `address`: `proxy_protocol = true` and `proxy_protocol_from` when one of
/// its servers listens there with `proxy_protocol`. A `set_real_ip_from` pinlb cannot take (a
/// `unix:` socket, a host name) is noted; none at all is refused as less strict, and written
/// as open to all for `--allow-less-strict`.
pub(super) fn listener(
    listener: &mut RawListener,
    address: &str,
    servers: &[&Accepting],
    notes: &mut Vec<String>,
    refused: &mut Vec<String>,
) {
    let Some(at) = servers
        .iter()
        .flat_map(|s| &s.addresses)
        .find(|(a, _)| a == address)
        .map(|(_, at)| at.clone())
    else {
        return;
    };
    let mut nets: Vec<String> = Vec::new();
    for s in servers
        .iter()
        .filter(|s| s.addresses.iter().any(|(a, _)| a == address))
    {
        for (value, written) in &s.from {
            let net = value
                .parse::<ipnet::IpNet>()
                .or_else(|_| value.parse::<std::net::IpAddr>().map(ipnet::IpNet::from));
            match net {
                Ok(_) if !nets.contains(value) => nets.push(value.clone()),
                Ok(_) => {}
                Err(_) => notes.push(format!(
                    "{written}: set_real_ip_from {value} not converted: proxy_protocol_from takes addresses and CIDR blocks"
                )),
            }
        }
    }
    if nets.is_empty() {
        refused.push(format!(
            "{at}: listen {address} proxy_protocol not converted as nginx has it: no set_real_ip_from names the load balancers allowed to send the header, and pinlb takes it only from proxy_protocol_from; without it pinlb takes the header, and the client address it claims, from anyone (proxy_protocol_from = [\"0.0.0.0/0\", \"::/0\"])"
        ));
        nets = vec!["0.0.0.0/0".into(), "::/0".into()];
    }
    listener.proxy_protocol = Some(spanned(true));
    listener.proxy_protocol_from = Some(spanned(nets.into_iter().map(spanned).collect()));
}
