//! `[log] format = '{remote_addr} {request} {status} {request_time} …'`: the access log's line
//! as a template of named fields, parsed once when the file is validated.
//!
//! Fields take nginx's variable names where nginx has the same value (so that a `log_format`
//! converts by dropping the `$`, and a parser of nginx's lines keeps working), and pinlb's own
//! names for the timing breakdown nginx does not have (`proxy_time`, `queue_time`, and the
//! microsecond spans). A value that does not exist for a request (no backend answered, no such
//! header) is written `-`, as nginx writes it. `{{` and `}}` are literal braces.
//!
//! The times in seconds have millisecond resolution, as nginx's; the `*_us` fields are whole
//! microseconds. See `proxy::timing` for what each span covers.

use std::fmt;

/// A parsed template: text and fields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessTemplate {
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Field(Field),
}

/// One named value of a request's log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// `remote_addr`, `client_ip`: the client's address.
    ClientIp,
    /// `remote_port`.
    ClientPort,
    /// `time_local`: `10/Oct/2000:13:55:36 +0000` (UTC).
    TimeLocal,
    /// `time_iso8601`: `2000-10-10T13:55:36.000Z`.
    TimeIso8601,
    /// `msec`: seconds since the Unix epoch, with milliseconds.
    Msec,
    /// `request`: `GET /path?q HTTP/1.1`.
    Request,
    /// `request_method`, `method`.
    Method,
    /// `request_uri`, `uri`: the target as the client sent it.
    Uri,
    /// `server_protocol`, `protocol`.
    Protocol,
    /// `host`: the Host header (or the absolute target's authority) without its port.
    Host,
    /// `status`.
    Status,
    /// `body_bytes_sent`, `bytes`.
    Bytes,
    /// `http_NAME`: a request header, `_` in the name standing for `-` (lower-case).
    Header(String),
    /// `request_id`: the request's ID (see `[request_id]`).
    RequestId,
    /// `trace_id`: the W3C traceparent's trace id, passed through or started.
    TraceId,
    /// `request_time`: from the request head to the response's last byte, in seconds.
    RequestTime,
    /// `upstream_addr`: the backends the request went to, the answering one last (nginx's list).
    UpstreamAddr,
    /// `upstream_status`: the status each attempt came to, the answer's last (nginx's list).
    UpstreamStatus,
    /// `upstream_connect_time`: the answering attempt's connect, `0.000` when reused.
    UpstreamConnectTime,
    /// `upstream_header_time`: the answering attempt, from its start to the response head
    /// (nginx's: the connect included).
    UpstreamHeaderTime,
    /// `upstream_response_time`: from the first attempt to the response's last byte.
    UpstreamResponseTime,
    /// `upstream_reused`: `1` when the request went on a pooled connection, `0` otherwise.
    UpstreamReused,
    /// `queue_time`: the wait in the upstream's queue, in seconds.
    QueueTime,
    /// `proxy_time`: pinlb's own share, in seconds.
    ProxyTime,
    /// `queue_us`, `connect_us`, `header_us`, `response_us`, `total_us`, `proxy_us`.
    Micros(Span),
    /// `ssl_client_s_dn`, `ssl_client_i_dn`, `ssl_client_verify`, `ssl_client_serial`: the
    /// client certificate's subject and issuer (RFC 4514), `SUCCESS`/`NONE`, and serial, on a
    /// listener with `client_ca` (`-` elsewhere, or without a certificate).
    ClientCert(ClientCertField),
    /// `cache_status`, `upstream_cache_status`: what the route's cache did (`HIT`, `MISS`,
    /// `EXPIRED`, `STALE`, `UPDATING`, `REVALIDATED`, `BYPASS`), `-` for a request no cache
    /// looked up.
    CacheStatus,
}

/// What a `{ssl_client_*}` field reads of the client's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertField {
    Subject,
    Issuer,
    Verify,
    Serial,
}

/// The microsecond spans (see `proxy::timing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    Queue,
    Connect,
    Header,
    Response,
    Total,
    Proxy,
}

/// Every name a template may use, for the error that names an unknown one.
pub const FIELDS: &str = "remote_addr (client_ip), remote_port, time_local, time_iso8601, msec, \
     request, request_method (method), request_uri (uri), server_protocol (protocol), host, \
     status, body_bytes_sent (bytes), http_NAME, request_id, trace_id, request_time, \
     upstream_addr, upstream_status, upstream_connect_time, upstream_header_time, \
     upstream_response_time, upstream_reused, queue_time, proxy_time, queue_us, connect_us, \
     header_us, response_us, total_us, proxy_us, ssl_client_s_dn, ssl_client_i_dn, \
     ssl_client_verify, ssl_client_serial, cache_status (upstream_cache_status)";

impl Field {
    /// The field a name stands for.
    pub fn named(name: &str) -> Option<Field> {
        Some(match name {
            "remote_addr" | "client_ip" => Field::ClientIp,
            "remote_port" => Field::ClientPort,
            "time_local" => Field::TimeLocal,
            "time_iso8601" => Field::TimeIso8601,
            "msec" => Field::Msec,
            "request" => Field::Request,
            "request_method" | "method" => Field::Method,
            "request_uri" | "uri" => Field::Uri,
            "server_protocol" | "protocol" => Field::Protocol,
            "host" => Field::Host,
            "status" => Field::Status,
            "body_bytes_sent" | "bytes" => Field::Bytes,
            "request_id" => Field::RequestId,
            "trace_id" => Field::TraceId,
            "request_time" => Field::RequestTime,
            "upstream_addr" => Field::UpstreamAddr,
            "upstream_status" => Field::UpstreamStatus,
            "upstream_connect_time" => Field::UpstreamConnectTime,
            "upstream_header_time" => Field::UpstreamHeaderTime,
            "upstream_response_time" => Field::UpstreamResponseTime,
            "upstream_reused" => Field::UpstreamReused,
            "queue_time" => Field::QueueTime,
            "proxy_time" => Field::ProxyTime,
            "queue_us" => Field::Micros(Span::Queue),
            "connect_us" => Field::Micros(Span::Connect),
            "header_us" => Field::Micros(Span::Header),
            "response_us" => Field::Micros(Span::Response),
            "total_us" => Field::Micros(Span::Total),
            "proxy_us" => Field::Micros(Span::Proxy),
            "ssl_client_s_dn" => Field::ClientCert(ClientCertField::Subject),
            "ssl_client_i_dn" => Field::ClientCert(ClientCertField::Issuer),
            "ssl_client_verify" => Field::ClientCert(ClientCertField::Verify),
            "ssl_client_serial" => Field::ClientCert(ClientCertField::Serial),
            "cache_status" | "upstream_cache_status" => Field::CacheStatus,
            _ => {
                let header = name.strip_prefix("http_")?;
                let valid = !header.is_empty()
                    && header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !valid {
                    return None;
                }
                Field::Header(header.replace('_', "-").to_ascii_lowercase())
            }
        })
    }
}

/// Why a template does not parse, and at which byte of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl AccessTemplate {
    /// Parses `{name}` fields and the text between them.
    pub fn parse(s: &str) -> Result<AccessTemplate, TemplateError> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = s.char_indices().peekable();
        while let Some((i, c)) = rest.next() {
            match c {
                '{' if rest.peek().map(|&(_, c)| c) == Some('{') => {
                    rest.next();
                    text.push('{');
                }
                '}' if rest.peek().map(|&(_, c)| c) == Some('}') => {
                    rest.next();
                    text.push('}');
                }
                '{' => {
                    let Some(len) = s[i + 1..].find('}') else {
                        return Err(TemplateError {
                            at: i,
                            message: "unclosed '{', expected {name} (or {{ for a brace)".into(),
                        });
                    };
                    let name = &s[i + 1..i + 1 + len];
                    let Some(field) = Field::named(name.trim()) else {
                        return Err(TemplateError {
                            at: i,
                            message: format!("unknown field {{{name}}}, expected one of {FIELDS}"),
                        });
                    };
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Field(field));
                    for _ in 0..=len {
                        rest.next();
                    }
                }
                '}' => {
                    return Err(TemplateError {
                        at: i,
                        message: "'}' without its '{', expected }} for a brace".into(),
                    });
                }
                '\n' | '\r' => {
                    return Err(TemplateError {
                        at: i,
                        message: "a line break, expected one line (each entry ends with one)"
                            .into(),
                    });
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        if !parts.iter().any(|p| matches!(p, Part::Field(_))) {
            return Err(TemplateError {
                at: 0,
                message: "no field, expected combined, json, or a template with fields such as {remote_addr} {status} {request_time}".into(),
            });
        }
        Ok(AccessTemplate { parts })
    }

    /// The request headers the template reads (`http_NAME`), lower-case: what each request's
    /// entry takes from its head.
    pub fn headers(&self) -> Vec<String> {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Field(Field::Header(h)) => Some(h.clone()),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_text_alternate_and_braces_double() {
        let t =
            AccessTemplate::parse("{remote_addr} {{x}} \"{request}\" {http_x_real_ip}").unwrap();
        assert_eq!(
            t.parts,
            [
                Part::Field(Field::ClientIp),
                Part::Text(" {x} \"".into()),
                Part::Field(Field::Request),
                Part::Text("\" ".into()),
                Part::Field(Field::Header("x-real-ip".into())),
            ]
        );
        assert_eq!(t.headers(), ["x-real-ip"]);
    }

    #[test]
    fn an_unknown_field_is_named_with_where_it_is_and_what_exists() {
        let e = AccessTemplate::parse("{status} {nope}").unwrap_err();
        assert_eq!(e.at, 9);
        assert!(
            e.message
                .starts_with("unknown field {nope}, expected one of remote_addr")
        );
        assert_eq!(AccessTemplate::parse("{status").unwrap_err().at, 0);
        assert_eq!(AccessTemplate::parse("a } b {status}").unwrap_err().at, 2);
        assert!(AccessTemplate::parse("no fields").is_err());
    }

    #[test]
    fn nginx_names_and_pinlb_aliases_are_the_same_field() {
        for (a, b) in [
            ("remote_addr", "client_ip"),
            ("request_uri", "uri"),
            ("body_bytes_sent", "bytes"),
        ] {
            assert_eq!(Field::named(a), Field::named(b));
        }
        assert_eq!(Field::named("http_"), None);
    }
}
